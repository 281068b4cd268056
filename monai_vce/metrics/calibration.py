"""Reliability of frame probabilities: the expected calibration error per label (Naeini et al., AAAI 2015; Guo et
al., ICML 2017), vectorised over labels.
"""

from __future__ import annotations

import numpy as np

__all__ = ["expected_calibration_error"]


def expected_calibration_error(probs: np.ndarray, targets: np.ndarray, bins: int = 15) -> np.ndarray:
    """Per-class ECE of ``(N, C)`` probabilities against ``(N, C)`` binary targets.

    Equal-width bins over [0, 1]; ECE is the frame-weighted mean of ``|mean probability - positive rate|`` over the
    bins of each class (positives and negatives alike: a rare label's well-placed zeros count too).

    Returns:
        ``(C,)`` float64; NaN for an empty input.
    """
    probs = np.asarray(probs, dtype=np.float64)
    targets = (np.asarray(targets) >= 0.5).astype(np.float64)
    if probs.shape != targets.shape or probs.ndim != 2:
        raise ValueError(f"probs and targets must be (N, C) arrays of one shape, got {probs.shape} and {targets.shape}")
    if isinstance(bins, bool) or not isinstance(bins, int) or bins < 1:
        raise ValueError(f"bins must be a positive integer, got {bins!r}")
    n, c = probs.shape
    if n == 0:
        return np.full(c, np.nan)
    which = np.minimum((np.clip(probs, 0.0, 1.0) * bins).astype(np.int64), bins - 1)  # (N, C)
    flat = which + bins * np.arange(c)[None, :]
    p_sum = np.bincount(flat.ravel(), weights=probs.ravel(), minlength=bins * c).reshape(c, bins)
    t_sum = np.bincount(flat.ravel(), weights=targets.ravel(), minlength=bins * c).reshape(c, bins)
    return np.abs(p_sum - t_sum).sum(axis=1) / n
