"""The paper's post-processing chain (threshold, median, fill_gaps, min_length), vectorised over frames and
classes, and its step registry :data:`CHAIN_STEPS`. Reference: Chary & Ganapathy (2026).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from scipy.ndimage import median_filter

from monai_vce.events.runs import run_bounds

from .steps import MAX_FRAMES, ChainStep, Param

__all__ = [
    "CHAIN_STEPS",
    "PAPER_ORDER",
    "PAPER_PARAMS",
    "as_per_class",
    "threshold_mask",
    "median_probs",
    "median_mask",
    "fill_gaps",
    "remove_short_runs",
    "run_chain",
    "apply_chain",
    "run_bounds",
]


def as_per_class(
    value: float | int | Sequence | np.ndarray, num_classes: int, name: str, dtype: Any = float
) -> np.ndarray:
    """Broadcast a scalar or a per-class sequence to a ``(num_classes,)`` array, checking its length."""
    arr = np.asarray(value, dtype=dtype)
    if arr.ndim == 0:
        return np.full(num_classes, arr, dtype=dtype)
    if arr.shape != (num_classes,):
        raise ValueError(f"{name}: expected a scalar or {num_classes} per-class values, got shape {arr.shape}")
    return arr


def _check_2d(x: np.ndarray, name: str) -> np.ndarray:
    x = np.asarray(x)
    if x.ndim != 2:
        raise ValueError(f"{name}: expected a (T, C) array, got shape {x.shape}")
    return x


def threshold_mask(probs: np.ndarray, thresholds: float | Sequence[float] | np.ndarray) -> np.ndarray:
    """Return ``probs >= thresholds`` with one threshold per class (column)."""
    probs = _check_2d(probs, "probs")
    thr = as_per_class(thresholds, probs.shape[1], "thresholds")
    return probs >= thr[None, :]


def _check_windows(windows: np.ndarray) -> np.ndarray:
    windows = windows.astype(np.int64)
    if np.any(windows < 1) or np.any(windows % 2 == 0):
        raise ValueError(f"median windows must be odd and >= 1, got {windows.tolist()}")
    return windows


def median_probs(probs: np.ndarray, windows: int | Sequence[int] | np.ndarray) -> np.ndarray:
    """Running median of the probabilities along time, one odd window per class; edges repeat the end value.

    Classes sharing a window are filtered in one ``scipy.ndimage.median_filter`` call.
    """
    probs = _check_2d(probs, "probs")
    win = _check_windows(as_per_class(windows, probs.shape[1], "median windows", dtype=np.int64))
    out = np.array(probs, dtype=np.float32 if probs.dtype == np.float32 else np.float64, copy=True)
    for w in np.unique(win):
        if w <= 1:
            continue
        cols = np.flatnonzero(win == w)
        out[:, cols] = median_filter(out[:, cols], size=(int(w), 1), mode="nearest")
    return out


def median_mask(mask: np.ndarray, windows: int | Sequence[int] | np.ndarray) -> np.ndarray:
    """Running median of a binary mask along time (a majority vote over an odd window per class).

    Equal to ``scipy.ndimage.median_filter(mask, size=(w, 1), mode="nearest")`` per class, computed with
    one cumulative sum for all classes. Windows longer than the video are counted, not padded: memory stays
    ``O(T x C)`` whatever the window.
    """
    mask = _check_2d(mask, "mask").astype(bool)
    T, C = mask.shape
    win = _check_windows(as_per_class(windows, C, "median windows", dtype=np.int64))
    if T == 0 or np.all(win <= 1):
        return mask.copy()
    half = win // 2
    out = np.empty((T, C), dtype=bool)
    short = half < T
    if short.any():
        hmax = int(half[short].max())
        # edge mode "nearest": repeat the first / last frame
        padded = np.concatenate([np.repeat(mask[:1], hmax, 0), mask, np.repeat(mask[-1:], hmax, 0)], axis=0)
        csum = np.zeros((T + 2 * hmax + 1, C), dtype=np.int32)
        np.cumsum(padded, axis=0, out=csum[1:])
        for w in np.unique(win[short]):
            cols = np.flatnonzero(win == w)
            h = int(w) // 2
            # window sum over frames t-h..t+h = csum[t+hmax+h+1] - csum[t+hmax-h]
            hi = csum[hmax + h + 1 : hmax + h + 1 + T, cols]
            lo = csum[hmax - h : hmax - h + T, cols]
            out[:, cols] = (hi - lo) > h
    if not short.all():
        # a window reaching past both ends at every frame: the whole video plus h - t copies of the first frame
        # and h - (T - 1 - t) copies of the last
        t = np.arange(T, dtype=np.int64)[:, None]
        total = mask.sum(axis=0, dtype=np.int64)
        first, last = mask[0].astype(np.int64), mask[-1].astype(np.int64)
        for w in np.unique(win[~short]):
            cols = np.flatnonzero(win == w)
            h = int(w) // 2
            votes = total[cols] + (h - t) * first[cols] + (h - (T - 1) + t) * last[cols]
            out[:, cols] = votes > h
    keep = win <= 1
    if keep.any():
        out[:, keep] = mask[:, keep]
    return out


def _set_runs(mask: np.ndarray, cls: np.ndarray, start: np.ndarray, stop: np.ndarray, value: bool) -> np.ndarray:
    """Set the given runs of a (T, C) mask to ``value`` without a loop over runs."""
    T, C = mask.shape
    out = mask.copy()
    if cls.size == 0:
        return out
    delta = np.zeros((C, T + 1), dtype=np.int32)
    # runs of one value never touch, so the (class, frame) positions below are unique
    delta[cls, start] += 1
    delta[cls, stop] -= 1
    cover = np.cumsum(delta[:, :T], axis=1).T > 0
    out[cover] = value
    return out


def fill_gaps(mask: np.ndarray, max_gaps: int | Sequence[int] | np.ndarray) -> np.ndarray:
    """Activate inactive runs of at most ``max_gaps[c]`` frames lying between two active runs of class ``c``."""
    mask = _check_2d(mask, "mask").astype(bool)
    T, C = mask.shape
    gaps = as_per_class(max_gaps, C, "max gaps", dtype=np.int64)
    if np.any(gaps < 0):
        raise ValueError(f"max gaps must be >= 0, got {gaps.tolist()}")
    cls, start, stop = run_bounds(mask, value=False)
    interior = (start > 0) & (stop < T)
    sel = interior & ((stop - start) <= gaps[cls])
    return _set_runs(mask, cls[sel], start[sel], stop[sel], True)


def remove_short_runs(mask: np.ndarray, min_lengths: int | Sequence[int] | np.ndarray) -> np.ndarray:
    """Deactivate active runs shorter than ``min_lengths[c]`` frames."""
    mask = _check_2d(mask, "mask").astype(bool)
    C = mask.shape[1]
    lens = as_per_class(min_lengths, C, "min lengths", dtype=np.int64)
    if np.any(lens < 0):
        raise ValueError(f"min lengths must be >= 0, got {lens.tolist()}")
    cls, start, stop = run_bounds(mask, value=True)
    sel = (stop - start) < lens[cls]
    return _set_runs(mask, cls[sel], start[sel], stop[sel], False)


def _median(x: np.ndarray, windows: np.ndarray) -> np.ndarray:
    # after "threshold" the median filters the binary mask, before it the probabilities
    return median_mask(x, windows) if x.dtype == bool else median_probs(x, windows)


#: The registry of chain steps, in the paper's order (which is also the tuner's order of search).
CHAIN_STEPS: dict[str, ChainStep] = {
    step.name: step
    for step in (
        ChainStep(
            "threshold",
            Param("threshold", "number", 0.5, 0.0, 1.0, grid=(0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)),
            threshold_mask,
            doc="p >= threshold",
        ),
        ChainStep(
            "median",
            Param("median_window", "odd_integer", 7, 1, MAX_FRAMES, grid=(1, 5, 9, 15, 25, 51)),
            _median,
            doc="running median over an odd window (1: off)",
        ),
        ChainStep(
            "fill_gaps",
            Param("max_gap", "integer", 5, 0, MAX_FRAMES, grid=(0, 2, 5, 10, 20, 50)),
            fill_gaps,
            needs_mask=True,
            doc="inactive runs of at most max_gap frames between active runs become active (0: off)",
        ),
        ChainStep(
            "min_length",
            Param("min_length", "integer", 3, 0, MAX_FRAMES, grid=(0, 3, 5, 10, 20, 50)),
            remove_short_runs,
            needs_mask=True,
            doc="active runs shorter than min_length frames are removed (0 or 1: off)",
        ),
    )
}
#: The order in which the paper describes its chain.
PAPER_ORDER: tuple[str, ...] = ("threshold", "median", "fill_gaps", "min_length")
#: The paper's parameters, the same for every class (the defaults of :data:`CHAIN_STEPS`).
PAPER_PARAMS: dict[str, float | int] = {step.param.name: step.param.default for step in CHAIN_STEPS.values()}


def _check_order(order: Sequence[str]) -> tuple[str, ...]:
    order = tuple(order)
    unknown = [s for s in order if s not in CHAIN_STEPS]
    if unknown:
        raise ValueError(f"unknown chain step(s) {unknown}; expected names from {list(CHAIN_STEPS)}")
    if len(set(order)) != len(order):
        raise ValueError(f"chain order repeats a step: {list(order)}")
    if "threshold" not in order:
        raise ValueError(f"chain order must contain 'threshold': {list(order)}")
    return order


def run_chain(probs: np.ndarray, values: Mapping[str, Any], order: Sequence[str] = PAPER_ORDER) -> np.ndarray:
    """Run the chain on ``(T, C)`` probabilities and return the ``(T, C)`` boolean activity mask.

    Args:
        probs: per-frame probabilities, frames along axis 0.
        values: per-class values of each step's parameter, keyed by parameter name (``"threshold"``,
            ``"median_window"``, ...; see :data:`CHAIN_STEPS`): a scalar for all classes or one per class. A step
            whose parameter is missing takes its default.
        order: the steps to run, in order (see ``docs/design/decoding.md``); a step left out is skipped.
    """
    probs = _check_2d(probs, "probs")
    order = _check_order(order)
    C = probs.shape[1]
    x: np.ndarray = probs
    for name in order:
        step = CHAIN_STEPS[name]
        if step.needs_mask and x.dtype != bool:
            raise ValueError(f"{name!r} needs a binary mask: put it after 'threshold' in the order")
        param = step.param
        per_class = as_per_class(values.get(param.name, param.default), C, param.name, dtype=param.dtype)
        x = step.kernel(x, per_class)
    return x


def apply_chain(
    probs: np.ndarray,
    thresholds: float | Sequence[float] | np.ndarray = 0.5,
    median_windows: int | Sequence[int] | np.ndarray = 7,
    max_gaps: int | Sequence[int] | np.ndarray = 5,
    min_lengths: int | Sequence[int] | np.ndarray = 3,
    order: Sequence[str] = PAPER_ORDER,
) -> np.ndarray:
    """Run the paper's four steps on ``(T, C)`` probabilities (:func:`run_chain` with named parameters).

    Args:
        probs: per-frame probabilities, frames along axis 0.
        thresholds: one threshold per class, or one for all.
        median_windows: odd median window per class (``1`` disables the step for that class).
        max_gaps: longest gap filled per class (``0`` disables).
        min_lengths: shortest run kept per class (``0``/``1`` disable).
        order: the steps to run, in order (see ``docs/design/decoding.md``); a step left out is skipped.
    """
    values = {"threshold": thresholds, "median_window": median_windows, "max_gap": max_gaps, "min_length": min_lengths}
    return run_chain(probs, values, order)
