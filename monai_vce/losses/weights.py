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
    positive_pseudo_count: float = 0.0,
) -> torch.Tensor:
    """The negative/positive frame ratio of each class, clipped: ``clip(n_neg_c / (n_pos_c + k), min_weight, max_weight)``
    with ``k = positive_pseudo_count``.

    Built from the training datalist, so that it can be a ``_target_`` in a bundle config::

        "pos_weight": {"_target_": "monai_vce.losses.class_positive_weights", "data": "@train#dataset#data"}

    With ``k = 0`` a class without any positive frame gets ``max_weight`` (its ratio is infinite); it has no
    positive element to weight until one appears (e.g. through mixup). The authors' ``compute_class_weights``
    (``(n_neg + 1) / (n_pos + 1)`` with ``n_neg = N - n_pos``, i.e. ``n_neg / (n_pos + 1)``) is ``k = 1``.

    Args:
        data: the datalist (items with ``label_key``: C per-class values, positive where ``>= 0.5``) or an
            ``(N, C)`` label array.
        min_weight: lower clip (1: a frequent class is never down-weighted below its negatives).
        max_weight: upper clip.
        label_key: key of the label vector in the datalist items.
        positive_pseudo_count: ``k >= 0`` added to each class's positive count (``1``: the authors' weights).

    Returns:
        A float32 tensor of shape ``(C,)``.

    Raises:
        ValueError: an empty datalist, an item without labels (named by video and frame), ragged label vectors,
            ``0 < min_weight <= max_weight`` violated, or a negative ``positive_pseudo_count``.
    """
    if not 0.0 < min_weight <= max_weight:
        raise ValueError(f"need 0 < min_weight <= max_weight, got {min_weight} and {max_weight}")
    if not positive_pseudo_count >= 0:  # also refuses NaN
        raise ValueError(f"positive_pseudo_count must be >= 0, got {positive_pseudo_count}")
    if isinstance(data, (np.ndarray, torch.Tensor)):
        labels = np.asarray(data) >= 0.5
        if labels.ndim != 2 or labels.shape[0] == 0:
            raise ValueError(f"expected a non-empty (N, C) label array, got shape {labels.shape}")
    else:
        labels = _label_matrix(data, label_key)
    pos = labels.sum(axis=0, dtype=np.float64)
    neg = labels.shape[0] - pos
    denom = pos + float(positive_pseudo_count)
    with np.errstate(divide="ignore"):
        ratio = np.where(denom > 0, neg / np.where(denom > 0, denom, 1.0), np.inf)
    return torch.as_tensor(np.clip(ratio, min_weight, max_weight), dtype=torch.float32)
