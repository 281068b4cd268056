"""Reduced inference of one video: strided pass, coarse-to-fine refinement, near-duplicate skipping, logit
interpolation of the rest. ``stride=1`` without skipping is full inference.
"""

from __future__ import annotations

import math
import numbers
import os
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from monai_vce.labels import NUM_LABELS
from monai_vce.postprocessing import DecoderParams, EventDecoder

from .duplicates import duplicate_anchors
from .interpolation import interpolate_probs, knot_brackets
from .refinement import DecoderTarget

__all__ = ["adaptive_inference", "resolve_budget", "strided_rows"]

Predict = Callable[[np.ndarray], Any]


def _where(video_id: str | None) -> str:
    return f"video {video_id!r}: " if video_id is not None else ""


def resolve_budget(budget: int | float | None, num_frames: int, video_id: str | None = None) -> int:
    """The largest number of frames ``predict`` may see: ``budget`` frames (an int), a fraction of the video (a
    float in ``(0, 1]``), or every frame (``None``)."""
    if budget is None:
        return num_frames
    if isinstance(budget, bool) or not isinstance(budget, numbers.Real):
        raise ValueError(f"{_where(video_id)}budget must be an int (frames), a float in (0, 1] or None, got {budget!r}")
    if isinstance(budget, numbers.Integral):
        if budget < 1 and num_frames > 0:
            raise ValueError(f"{_where(video_id)}budget must allow at least 1 frame, got {budget}")
        return min(int(budget), num_frames)
    if not (0.0 < float(budget) <= 1.0):
        raise ValueError(f"{_where(video_id)}a fractional budget must be in (0, 1], got {budget!r}")
    return min(num_frames, max(1, math.ceil(float(budget) * num_frames)))


def strided_rows(num_frames: int, stride: int, budget: int | None = None) -> np.ndarray:
    """Rows of the strided pass: ``0, stride, 2 * stride, ...`` and the last row, thinned to an even spread of
    ``budget`` rows when there are more."""
    if num_frames <= 0:
        return np.zeros(0, dtype=np.int64)
    rows = np.unique(np.r_[np.arange(0, num_frames, stride, dtype=np.int64), num_frames - 1])
    if budget is not None and rows.size > budget:
        rows = np.unique(np.round(np.linspace(0, num_frames - 1, max(1, budget))).astype(np.int64))
    return rows


def _check_int(value: Any, name: str, minimum: int, video_id: str | None) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ValueError(f"{_where(video_id)}{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def _check_tolerance(value: Any, name: str, video_id: str | None) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 <= float(value) < math.inf:  # NaN too
        raise ValueError(f"{_where(video_id)}{name} must be a finite number >= 0, got {value!r}")
    return float(value)


class _Runner:
    """One video's inference state: which rows are known, their probabilities, what ``predict`` has seen."""

    def __init__(self, predict: Predict, num_frames: int, anchors: np.ndarray | None, video_id: str | None,
                 callback: Callable[[int, int], Any] | None) -> None:  # fmt: skip
        self.predict = predict
        self.T = num_frames
        self.anchors = anchors
        self.video_id = video_id
        self.callback = callback
        self.values = np.zeros((num_frames, NUM_LABELS), dtype=np.float32)
        self.known = np.zeros(num_frames, dtype=bool)
        self.inferred = np.zeros(num_frames, dtype=bool)
        self.calls = 0

    def _call(self, rows: np.ndarray) -> np.ndarray:
        out = self.predict(rows)
        if hasattr(out, "detach"):  # a torch tensor
            out = out.detach().float().cpu().numpy()
        out = np.asarray(out)
        where = _where(self.video_id)
        if out.shape != (rows.size, NUM_LABELS):
            raise ValueError(
                f"{where}predict returned shape {out.shape} for {rows.size} rows; expected ({rows.size}, {NUM_LABELS})"
            )
        if not np.issubdtype(out.dtype, np.floating):
            out = out.astype(np.float32)
        bad = ~np.isfinite(out) | (out < 0) | (out > 1)
        if bad.any():
            r, c = np.argwhere(bad)[0]
            raise ValueError(
                f"{where}predict returned {out[r, c]} for row {int(rows[r])}, label {c}; "
                f"expected probabilities in [0, 1] (apply the sigmoid)"
            )
        self.calls += 1
        return out.astype(np.float32, copy=False)

    def take(self, rows: np.ndarray) -> int:
        """Make ``rows`` known: infer those (or their anchors) not inferred yet. Returns the frames inferred."""
        rows = np.unique(np.asarray(rows, dtype=np.int64))
        rows = rows[~self.known[rows]]
        if rows.size == 0:
            return 0
        src = rows if self.anchors is None else self.anchors[rows]
        need = np.unique(src[~self.inferred[src]])
        if need.size:
            self.values[need] = self._call(need)
            self.inferred[need] = True
            self.known[need] = True
        self.values[rows] = self.values[src]
        self.known[rows] = True
        if self.callback is not None and need.size:
            self.callback(int(self.inferred.sum()), self.T)
        return int(need.size)

    def cost(self, rows: np.ndarray) -> np.ndarray:
        """Frames each row would send to ``predict`` (0 when it or its anchor is inferred already)."""
        src = rows if self.anchors is None else self.anchors[rows]
        return (~self.inferred[src]).astype(np.int64)


def _most_novel(
    sig: np.ndarray, known: np.ndarray, active: np.ndarray, tolerance: float
) -> tuple[np.ndarray, np.ndarray]:
    """Per gap between known frames holding an ``active`` frame whose novelty (mean absolute difference of its
    signature from the linear interpolation of its brackets' signatures) exceeds ``tolerance``: the most novel
    frame (the first of ties). Returns ``(rows, novelty)``, sorted by row."""
    left, right = knot_brackets(known)
    rows = np.flatnonzero(active & (left < right))
    if rows.size == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float32)
    lo, hi = left[rows], right[rows]
    w = ((rows - lo) / (hi - lo)).astype(np.float32)[:, None]
    interp = (1.0 - w) * sig[lo] + w * sig[hi]
    novelty = np.abs(sig[rows] - interp).mean(axis=1)
    keep = novelty > tolerance
    rows, lo, novelty = rows[keep], lo[keep], novelty[keep]
    order = np.lexsort((rows, -novelty, lo))  # by gap, most novel first, then by position
    _, first = np.unique(lo[order], return_index=True)
    pick = order[first]
    return rows[pick], novelty[pick]


def _novelty_rounds(run: _Runner, sig: np.ndarray, tolerance: float, limit: int) -> None:
    """The novelty guard of :func:`adaptive_inference`: one most novel frame per qualifying gap and round."""
    active = ~run.known  # frames whose gap changed since their novelty was last found below the tolerance
    while active.any():
        spent = int(run.inferred.sum())
        if spent >= limit:
            break
        picks, novelty = _most_novel(sig, run.known, active, tolerance)
        if picks.size == 0:
            break
        cost = run.cost(picks)
        untaken = picks[:0]
        if int(cost.sum()) > limit - spent:
            order = np.lexsort((picks, -novelty))  # most novel first, then by position
            fits = np.cumsum(cost[order]) <= limit - spent
            picks, untaken = picks[order][fits], picks[order][~fits]
            if picks.size == 0:
                break
        run.take(picks)
        # only the gaps split by a new frame (or left out for the budget) can hold a frame above the tolerance
        left, right = knot_brackets(run.known)
        new = np.zeros(run.T, dtype=bool)
        new[picks] = True
        stay = np.zeros(run.T, dtype=bool)
        stay[left[untaken]] = True
        active = ~run.known & (new[left] | new[right] | stay[left])


def adaptive_inference(
    predict: Predict,
    num_frames: int,
    decoder: EventDecoder | DecoderParams | Mapping[str, Any] | str | os.PathLike | None = None,
    stride: int = 8,
    budget: int | float | None = None,
    *,
    refine: bool = True,
    margin: float = 0.3,
    presence_margin: float | None = None,
    score_tolerance: float | None = 0.2,
    transition_window: int | None = None,
    max_rounds: int | None = None,
    signatures: np.ndarray | None = None,
    duplicate_tolerance: float = 0.0,
    max_reuse: int = 64,
    novelty_tolerance: float = 0.0,
    probs_transform: Callable[[np.ndarray], np.ndarray] | None = None,
    interpolation: str = "logit",
    callback: Callable[[int, int], Any] | None = None,
    video_id: str | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Infer a subset of a video's frames and fill in the others (see ``docs/design/inference.md``).

    Args:
        predict: ``predict(rows)`` gets a sorted int64 array of row positions (``0 .. num_frames - 1``) and
            returns their ``(len(rows), 17)`` probabilities (numpy or torch). Each call carries all the rows of
            one round; batch them inside ``predict``.
        num_frames: frames of the video.
        decoder: the event decoder the refinement aims at: an :class:`~monai_vce.postprocessing.EventDecoder`,
            ``DecoderParams``, a parameter dict, the path of a ``decoder.json``, or ``None`` (default chain).
        stride: every ``stride``-th frame (and the last) is inferred first; ``1`` infers every frame.
        budget: most frames passed to ``predict``: an int (frames), a float in ``(0, 1]`` (fraction of the
            video) or ``None`` (no limit). A strided pass larger than the budget is thinned to fit.
        refine: refine coarse-to-fine after the strided pass; ``False`` interpolates the strided pass only.
        margin: logit margin of the refinement's envelope: how far an unknown frame's logit may stray beyond
            those of its two known neighbours (:class:`~monai_vce.inference.refinement.DecoderTarget`); larger
            infers more frames and misses fewer events.
        presence_margin: the same for the presence rules' decisions (``None``: ``margin``).
        score_tolerance: an emitted event whose confidence (its mean probability) is still uncertain by more than
            this, given the envelope, has its unknown frames inferred, so that events keep their confidence order;
            ``None`` leaves the order to the interpolated probabilities.
        transition_window: frames around a decoded section transition that are refined; ``stride`` when ``None``.
        max_rounds: most refinement rounds (``predict`` calls after the strided pass); ``None``: until done.
        signatures: ``(num_frames, D)`` per-frame signatures (:class:`~monai_vce.inference.duplicates.FrameSignatured`)
            for near-duplicate skipping.
        duplicate_tolerance: a frame within this signature distance (mean absolute grey-level difference) of
            the last inferred frame before it reuses that frame's probabilities; ``0`` turns skipping off.
        max_reuse: most consecutive frames that reuse one inferred frame.
        novelty_tolerance: novelty guard (needs ``signatures``; ``0`` turns it off): after the strided pass, in
            every gap between inferred frames where some frame's novelty (mean absolute difference of its
            signature from the linear interpolation, by position, of the two bracketing inferred frames'
            signatures) exceeds this, the most novel frame is inferred; repeated, one frame per gap per round,
            until no gap qualifies or the budget is spent, before (and whether or not) ``refine`` runs. The rounds
            do not count against ``max_rounds``.
        probs_transform: applied to the filled-in probabilities before the refinement decodes them (e.g. a
            temporal refiner); the returned probabilities are not transformed.
        interpolation: ``"logit"`` (default), ``"linear"`` or ``"nearest"``
            (:func:`~monai_vce.inference.interpolation.interpolate_probs`).
        callback: called after every ``predict`` call with ``(frames inferred so far, num_frames)``.
        video_id: named in error messages.

    Returns:
        ``(probs, inferred)``: ``(num_frames, 17)`` float32 probabilities of every frame and the ``(num_frames,)``
        boolean mask of the rows passed to ``predict``.

    Raises:
        ValueError: a bad argument or a bad ``predict`` output (one line, naming the video and the row).
    """
    where = _where(video_id)
    if not callable(predict):
        raise ValueError(f"{where}predict must be callable (rows -> (len(rows), 17) probabilities), got {predict!r}")
    T = _check_int(num_frames, "num_frames", 0, video_id)
    stride = _check_int(stride, "stride", 1, video_id)
    limit = resolve_budget(budget, T, video_id)
    if max_rounds is not None:
        max_rounds = _check_int(max_rounds, "max_rounds", 0, video_id)
    window = stride if transition_window is None else _check_int(transition_window, "transition_window", 0, video_id)
    max_reuse = _check_int(max_reuse, "max_reuse", 1, video_id)
    duplicate_tolerance = _check_tolerance(duplicate_tolerance, "duplicate_tolerance", video_id)
    novelty_tolerance = _check_tolerance(novelty_tolerance, "novelty_tolerance", video_id)
    if not isinstance(refine, (bool, np.bool_)):
        raise ValueError(f"{where}refine must be True or False, got {refine!r}")
    anchors = None
    sig = None
    if signatures is not None:
        sig = np.asarray(signatures)
        if sig.ndim != 2 or sig.shape[0] != T:
            raise ValueError(f"{where}signatures must have shape ({T}, D), one row per frame, got {sig.shape}")
        if duplicate_tolerance > 0:
            anchors = duplicate_anchors(sig, duplicate_tolerance, max_reuse)
    elif duplicate_tolerance > 0:
        raise ValueError(f"{where}duplicate_tolerance > 0 needs the frames' signatures (signatures=...)")
    elif novelty_tolerance > 0:
        raise ValueError(f"{where}novelty_tolerance > 0 needs the frames' signatures (signatures=...)")
    target = DecoderTarget(
        decoder,
        margin=margin,
        transition_window=window,
        presence_margin=presence_margin,
        score_tolerance=score_tolerance,
        probs_transform=probs_transform,
    )
    if interpolation not in ("logit", "linear", "nearest"):
        raise ValueError(f"{where}interpolation must be 'logit', 'linear' or 'nearest', got {interpolation!r}")

    if T == 0:
        return np.zeros((0, NUM_LABELS), dtype=np.float32), np.zeros(0, dtype=bool)
    run = _Runner(predict, T, anchors, video_id, callback)
    if stride == 1 and anchors is None and limit >= T:
        rows = np.arange(T, dtype=np.int64)
        probs = run._call(rows)
        if callback is not None:
            callback(T, T)
        return probs, np.ones(T, dtype=bool)

    run.take(strided_rows(T, stride, limit))
    if novelty_tolerance > 0 and sig is not None:
        _novelty_rounds(run, sig.astype(np.float32), novelty_tolerance, limit)
    rounds = 0
    while refine and not run.known.all() and (max_rounds is None or rounds < max_rounds):
        spent = int(run.inferred.sum())
        if spent >= limit:
            break
        probs = interpolate_probs(run.known, run.values, interpolation)
        open_rows = target.open_frames(run.values, run.known, probs)
        if not open_rows.any():
            break
        left, right = knot_brackets(run.known)
        # one new row per open gap: its middle frame
        gap_left = np.unique(left[open_rows])
        gap_right = right[gap_left + 1]
        mids = (gap_left + gap_right) // 2
        cost = run.cost(mids)
        if int(cost.sum()) > limit - spent:
            # widest gaps first (they hold the most unknown frames), then by position
            order = np.lexsort((mids, -(gap_right - gap_left)))
            mids, cost = mids[order], cost[order]
            mids = mids[np.cumsum(cost) <= limit - spent]
            if mids.size == 0:
                break
        run.take(mids)
        rounds += 1
    probs = interpolate_probs(run.known, run.values, interpolation)
    return probs, run.inferred.copy()
