"""Frame-level multi-label average precision (per class, vectorised over classes)."""

from __future__ import annotations

import numpy as np

__all__ = ["multilabel_average_precision"]


def multilabel_average_precision(probs: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """Per-class average precision of ``(N, C)`` scores against ``(N, C)`` binary targets (vectorised over classes).

    AP is the mean of the precision at the rank of each positive (ties broken by the stable order). A class
    without positives gets NaN.
    """
    probs = np.asarray(probs, dtype=np.float64)
    targets = np.asarray(targets) >= 0.5
    if probs.shape != targets.shape or probs.ndim != 2:
        raise ValueError(f"probs and targets must be (N, C) arrays of one shape, got {probs.shape} and {targets.shape}")
    order = np.argsort(-probs, axis=0, kind="stable")
    hits = np.take_along_axis(targets, order, axis=0)
    tp = np.cumsum(hits, axis=0)
    precision = tp / np.arange(1, probs.shape[0] + 1)[:, None]
    n_pos = hits.sum(axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(n_pos > 0, (precision * hits).sum(axis=0) / n_pos, np.nan)
