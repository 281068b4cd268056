"""Filling in the probabilities of frames not inferred: linear in logit space between the nearest known frames;
known frames keep theirs bit for bit.
"""

from __future__ import annotations

import numpy as np

__all__ = ["EPS", "logit", "sigmoid", "knot_brackets", "interpolate_probs"]

#: Probabilities are clipped to ``[EPS, 1 - EPS]`` before taking logits (a 0 or 1 output stays finite).
EPS = 1e-6


def logit(p: np.ndarray) -> np.ndarray:
    """``log(p / (1 - p))`` of probabilities clipped to ``[EPS, 1 - EPS]``, in float64."""
    q = np.clip(np.asarray(p, dtype=np.float64), EPS, 1.0 - EPS)
    return np.log(q) - np.log1p(-q)


def sigmoid(z: np.ndarray) -> np.ndarray:
    """The logistic function, in float64."""
    return 0.5 * (1.0 + np.tanh(0.5 * np.asarray(z, dtype=np.float64)))


def knot_brackets(known: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For every frame, the nearest known frame at or before it and at or after it.

    Args:
        known: ``(T,)`` booleans, at least one ``True``.

    Returns:
        ``(left, right)`` int64 ``(T,)`` rows; a frame before the first known frame has ``left == right ==``
        the first known frame, after the last one both are the last known frame, and a known frame is its
        own bracket.
    """
    known = np.asarray(known, dtype=bool)
    T = known.shape[0]
    rows = np.arange(T, dtype=np.int64)
    idx = np.flatnonzero(known)
    if idx.size == 0:
        raise ValueError("knot_brackets: at least one frame must be known")
    left = np.maximum.accumulate(np.where(known, rows, -1))
    right = np.minimum.accumulate(np.where(known, rows, T)[::-1])[::-1]
    left = np.where(left < 0, idx[0], left)
    right = np.where(right >= T, idx[-1], right)
    return left, right


def interpolate_probs(known: np.ndarray, values: np.ndarray, mode: str = "logit") -> np.ndarray:
    """Interpolate ``(T, C)`` probabilities from the rows marked ``known``.

    Args:
        known: ``(T,)`` booleans, at least one ``True``.
        values: ``(T, C)`` array whose known rows hold probabilities in ``[0, 1]`` (other rows are ignored).
        mode: ``"logit"`` (linear in logit space), ``"linear"`` (linear in probability) or ``"nearest"``
            (the nearer known frame; ties take the earlier one).

    Returns:
        ``(T, C)`` float32 probabilities, equal to ``values`` on the known rows.
    """
    if mode not in ("logit", "linear", "nearest"):
        raise ValueError(f"interpolation mode must be 'logit', 'linear' or 'nearest', got {mode!r}")
    known = np.asarray(known, dtype=bool)
    values = np.asarray(values)
    left, right = knot_brackets(known)
    rows = np.arange(known.shape[0])
    span = right - left
    w = np.where(span > 0, (rows - left) / np.maximum(span, 1), 0.0)[:, None]
    if mode == "nearest":
        out = np.where(w > 0.5, values[right], values[left]).astype(np.float32)
    elif mode == "linear":
        out = ((1.0 - w) * values[left] + w * values[right]).astype(np.float32)
    else:
        out = sigmoid((1.0 - w) * logit(values[left]) + w * logit(values[right])).astype(np.float32)
    out[known] = values[known]
    return out
