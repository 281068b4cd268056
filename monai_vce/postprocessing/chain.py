"""The paper's post-processing chain (threshold, median, fill_gaps, min_length), vectorised over frames and
classes, and its step registry :data:`CHAIN_STEPS`. Reference: Chary & Ganapathy (2026).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from scipy.ndimage import median_filter

from monai_vce.events.runs import run_bounds

from .anatomy import viterbi_sections
from .steps import MAX_COST, MAX_FRAMES, ChainStep, Param

__all__ = [
    "CHAIN_STEPS",
    "PAPER_ORDER",
    "PAPER_PARAMS",
    "as_per_class",
    "threshold_mask",
    "median_probs",
    "median_mask",
    "hysteresis_probs",
    "duration_viterbi",
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


def _clamp_prefix(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """``a[t] = clip(a[t - 1], lo[t], hi[t])`` along axis 0 from ``a[-1] = -inf``, for ``lo <= hi``.

    A composition of clamps is a clamp, so the recursion is an associative scan: at most ``log2(T)`` doubling
    steps of whole-array operations instead of a loop over frames. A composed clamp with ``low == high`` is
    constant, so the scan stops once every window that does not reach the first frame is one.
    """
    low, high = lo.copy(), hi.copy()
    T = low.shape[0]
    d = 1
    while d < T:
        # the clamp of frames t-2d+1..t-d, then that of frames t-d+1..t
        new_low = np.clip(low[:-d], low[d:], high[d:])
        new_high = np.clip(high[:-d], low[d:], high[d:])
        low[d:], high[d:] = new_low, new_high
        d *= 2
        # rows before d now hold their whole prefix; the others are final once constant
        if d < T and not np.any(high[d:] > low[d:]):
            break
    return low


def hysteresis_probs(probs: np.ndarray, deltas: float | Sequence[float] | np.ndarray) -> np.ndarray:
    """Probabilities whose thresholding is a hysteresis threshold, one margin ``deltas[c]`` per class.

    ``q[t] = max_s min(p[s], deltas[c] + min(p[s..t]))`` (the reconstruction by dilation of ``p`` under
    ``p + deltas[c]``), so that ``q >= thr`` holds exactly on the runs of ``p + deltas[c] >= thr`` (the low
    mask) that contain a frame with ``p >= thr`` (the high mask), whatever the threshold ``thr``: an event is
    seeded at the threshold and extends while the probability stays above ``thr - deltas[c]``. A class with
    margin ``0`` is returned unchanged.

    Args:
        probs: ``(T, C)`` probabilities, frames along axis 0.
        deltas: how far below the threshold an event may extend, per class (``0``: off).

    Returns:
        ``(T, C)`` array; ``probs`` itself when every margin is 0, else float64.
    """
    probs = _check_2d(probs, "probs")
    deltas = as_per_class(deltas, probs.shape[1], "hysteresis margins")
    if np.any(~np.isfinite(deltas)) or np.any(deltas < 0):
        raise ValueError(f"hysteresis margins must be finite and >= 0, got {deltas.tolist()}")
    cols = np.flatnonzero(deltas > 0)
    if cols.size == 0 or probs.shape[0] == 0:
        return probs
    p = probs[:, cols].astype(np.float64)
    g = p + deltas[cols][None, :]
    forward = _clamp_prefix(p, g)  # paths from a frame s <= t
    backward = _clamp_prefix(p[::-1], g[::-1])[::-1]  # paths from a frame s >= t
    out = probs.astype(np.float64)
    out[:, cols] = np.maximum(forward, backward)
    return out


def duration_viterbi(
    mask: np.ndarray, costs: np.ndarray, probs: np.ndarray | None = None, thresholds: np.ndarray | None = None
) -> np.ndarray:
    """Two-state (absent / present) Viterbi decode per class, with a cost per switch: a duration prior.

    The present state scores ``logit(p) - logit(threshold)`` per frame (the absent state 0), and each change of
    state costs ``costs[c]`` nats, so the decode is the threshold's mask with every run or gap that does not pay for
    its two switches removed, globally. A column with cost 0 keeps ``mask``; a column with a positive cost is
    replaced by its decode. All columns are decoded at once, as one sequence with a forced separator state between
    columns (:func:`~monai_vce.postprocessing.anatomy.viterbi_sections`).

    Args:
        mask: ``(T, C)`` mask (kept for the columns of cost 0).
        costs: ``(C,)`` switch costs in nats (``0``: off).
        probs: ``(T, C)`` probabilities that entered ``"threshold"``.
        thresholds: ``(C,)`` their thresholds.
    """
    mask = np.asarray(_check_2d(mask, "mask"), dtype=bool)
    T, C = mask.shape
    costs = as_per_class(costs, C, "duration costs")
    if np.any(~np.isfinite(costs)) or np.any(costs < 0):
        raise ValueError(f"duration costs must be finite and >= 0, got {costs.tolist()}")
    cols = np.flatnonzero(costs > 0)
    if cols.size == 0 or T == 0:
        return mask
    if probs is None or thresholds is None:
        raise ValueError("duration_viterbi needs the probabilities and thresholds of the 'threshold' step")
    eps = 1e-6
    p = np.clip(np.asarray(probs, dtype=np.float64)[:, cols], eps, 1 - eps)
    thr = np.clip(as_per_class(thresholds, C, "thresholds")[cols], eps, 1 - eps)
    z = np.log(p / (1 - p)) - np.log(thr / (1 - thr))[None, :]
    # states: absent, present, separator; each column is followed by one separator frame, where only the
    # separator may be decoded and from which either state starts free, so that the columns do not interact
    neg = -1e18
    K = cols.size
    em = np.full((K, T + 1, 3), neg)
    em[:, :T, 0] = 0.0
    em[:, :T, 1] = z.T
    em[:, T, 2] = 0.0
    out = mask.copy()
    for c in np.unique(costs[cols]):
        sel = np.flatnonzero(costs[cols] == c)
        trans = np.array([[0.0, -c, 0.0], [-c, 0.0, 0.0], [0.0, 0.0, 0.0]])
        path = viterbi_sections(em[sel].reshape(-1, 3), trans).reshape(sel.size, T + 1)[:, :T]
        out[:, cols[sel]] = (path == 1).T
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


#: The registry of chain steps, in the paper's order (which is also the tuner's order of search); the steps the
#: paper lacks (``"hysteresis"``) are off by default and outside :data:`PAPER_ORDER`.
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
            "hysteresis",
            Param("hysteresis", "number", 0.0, 0.0, 1.0, grid=(0.0, 0.05, 0.1, 0.2, 0.3)),
            hysteresis_probs,
            needs_probs=True,
            searched=False,
            doc="hysteresis: events seeded at p >= threshold extend while p >= threshold - hysteresis (0: off)",
        ),
        ChainStep(
            "duration",
            Param("duration_cost", "number", 0.0, 0.0, MAX_COST, grid=(0.0, 2.0, 5.0, 10.0, 20.0)),
            duration_viterbi,
            needs_mask=True,
            searched=False,
            context=True,
            doc="two-state Viterbi per label, duration_cost nats per switch, replacing the thresholded mask (0: off)",
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
    context: dict[str, np.ndarray] = {}
    for name in order:
        step = CHAIN_STEPS[name]
        if step.needs_mask and x.dtype != bool:
            raise ValueError(f"{name!r} needs a binary mask: put it after 'threshold' in the order")
        if step.needs_probs and x.dtype == bool:
            raise ValueError(f"{name!r} needs the probabilities: put it before 'threshold' in the order")
        param = step.param
        per_class = as_per_class(values.get(param.name, param.default), C, param.name, dtype=param.dtype)
        if name == "threshold":
            context = {"probs": x, "thresholds": per_class}
        x = step.kernel(x, per_class, **context) if step.context else step.kernel(x, per_class)
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
