"""Per-class positive weights of a multi-label loss, computed from the training datalist."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from monai_vce.data.samplers import _label_matrix

__all__ = ["class_positive_weights"]


def class_positive_weights(
    data: Sequence[Mapping[str, Any]] | np.ndarray | torch.Tensor,
    min_weight: float = 1.0,
    max_weight: float = 100.0,
    label_key: str = "label",
) -> torch.Tensor:
    """The negative/positive frame ratio of each class, clipped: ``clip(n_neg_c / n_pos_c, min_weight, max_weight)``.

    Built from the training datalist, so that it can be a ``_target_`` in a bundle config::

        "pos_weight": {"_target_": "monai_vce.losses.class_positive_weights", "data": "@train#dataset#data"}

    A class without any positive frame gets ``max_weight`` (its ratio is infinite); it has no positive element
    to weight until one appears (e.g. through mixup).

    Args:
        data: the datalist (items with ``label_key``: C per-class values, positive where ``>= 0.5``) or an
            ``(N, C)`` label array.
        min_weight: lower clip (1: a frequent class is never down-weighted below its negatives).
        max_weight: upper clip.
        label_key: key of the label vector in the datalist items.

    Returns:
        A float32 tensor of shape ``(C,)``.

    Raises:
        ValueError: an empty datalist, an item without labels (named by video and frame), ragged label vectors,
            or ``0 < min_weight <= max_weight`` violated.
    """
    if not 0.0 < min_weight <= max_weight:
        raise ValueError(f"need 0 < min_weight <= max_weight, got {min_weight} and {max_weight}")
    if isinstance(data, (np.ndarray, torch.Tensor)):
        labels = np.asarray(data) >= 0.5
        if labels.ndim != 2 or labels.shape[0] == 0:
            raise ValueError(f"expected a non-empty (N, C) label array, got shape {labels.shape}")
    else:
        labels = _label_matrix(data, label_key)
    pos = labels.sum(axis=0, dtype=np.float64)
    neg = labels.shape[0] - pos
    with np.errstate(divide="ignore"):
        ratio = np.where(pos > 0, neg / np.maximum(pos, 1.0), np.inf)
    return torch.as_tensor(np.clip(ratio, min_weight, max_weight), dtype=torch.float32)
