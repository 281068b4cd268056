"""Which frames to infer next: :class:`DecoderTarget` returns the unknown frames whose probabilities can still
change the decoded events.
"""

from __future__ import annotations

import math
import numbers
import os
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from monai_vce.events.runs import run_bounds
from monai_vce.labels import LABELS, LANDMARKS, NUM_LABELS, SECTIONS
from monai_vce.postprocessing import (
    DecoderParams,
    EventDecoder,
    apply_chain,
    apply_presence_rules,
    landmark_windows,
    section_gate,
)
from monai_vce.postprocessing.chain import CHAIN_STEPS

from .interpolation import interpolate_probs, knot_brackets, logit, sigmoid

__all__ = ["DecoderTarget", "dilate_frames"]

_SECTION_COLS = np.array([LABELS.index(s) for s in SECTIONS])
_LANDMARK_COLS = {name: LABELS.index(name) for name in LANDMARKS}
_STOMACH = SECTIONS.index("stomach")


def _check_margin(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 <= float(value) < math.inf:
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")


def dilate_frames(mask: np.ndarray, reach: np.ndarray | int) -> np.ndarray:
    """Dilate each column of a ``(T, C)`` mask along time by its own reach (frames on each side).

    Args:
        mask: ``(T, C)`` booleans.
        reach: ``(C,)`` non-negative ints, or one for all columns.

    Returns:
        ``(T, C)`` booleans: ``True`` within ``reach[c]`` frames of a ``True`` of column ``c``.
    """
    mask = np.asarray(mask, dtype=bool)
    T, C = mask.shape
    r = np.broadcast_to(np.asarray(reach, dtype=np.int64), (C,))
    if T == 0 or not mask.any():
        return mask.copy()
    csum = np.zeros((T + 1, C), dtype=np.int64)
    np.cumsum(mask, axis=0, out=csum[1:])
    rows = np.arange(T)
    out = np.empty_like(mask)
    for w in np.unique(r):
        cols = np.flatnonzero(r == w)
        hi = np.minimum(rows + int(w) + 1, T)
        lo = np.maximum(rows - int(w), 0)
        out[:, cols] = (csum[hi][:, cols] - csum[lo][:, cols]) > 0
    return out


def _window_any(flags: np.ndarray, window: int, num_frames: int) -> np.ndarray:
    """``(T, C)``: frame lies in a window of ``window`` frames whose start is flagged (``flags``: ``(T - w + 1, C)``,
    one row per window start, as :func:`_running_mean` gives)."""
    T = num_frames
    w = int(max(1, min(window, T)))
    # a frame belongs to the windows starting in [t - w + 1, t]
    starts = np.zeros((T, flags.shape[1]), dtype=bool)
    starts[: T - w + 1] = flags
    csum = np.zeros((T + 1, flags.shape[1]), dtype=np.int64)
    np.cumsum(starts, axis=0, out=csum[1:])
    rows = np.arange(T)
    return (csum[rows + 1] - csum[np.maximum(rows - w + 1, 0)]) > 0


def _running_mean(p: np.ndarray, window: int) -> np.ndarray:
    """``(T - w + 1, C)`` means over every window of ``w`` frames (``w`` capped at ``T``), as presence rules use."""
    T = p.shape[0]
    w = int(max(1, min(window, T)))
    csum = np.zeros((T + 1, p.shape[1]))
    np.cumsum(p, axis=0, out=csum[1:])
    return (csum[w:] - csum[:-w]) / w


def _step_on(params: DecoderParams, step: str) -> bool:
    """Whether chain step ``step`` changes anything for some label (its parameter is not 0)."""
    return bool(np.any(params.per_label(CHAIN_STEPS[step].param.name) != 0))


class DecoderTarget:
    """The decisions of one event decoder, as a guide to which frames are worth inferring.

    Args:
        decoder: an :class:`~monai_vce.postprocessing.EventDecoder` or anything it accepts (``DecoderParams``,
            a parameter dict, the path of a ``decoder.json``, ``None`` for the default chain).
        margin: logit half-width added to the envelope of an unknown frame (how far a frame's logit may stray
            beyond the range of its two known neighbours); larger infers more and misses less.
        transition_window: unknown frames within this many frames of a decoded section transition are open.
        presence_margin: the envelope's margin for the presence rules (``None``: ``margin``).
        score_tolerance: largest uncertainty of an emitted event's confidence (mean probability of a label over
            the event's frames, between the envelope's bounds) left open; ``None`` ignores the confidence order.
        probs_transform: applied to the filled-in probabilities (and to the envelope bounds) before decoding,
            e.g. a temporal refiner's ``refine``; ``None`` decodes them as they are.

    Example::

        target = DecoderTarget("decoder.json", margin=0.3)
        open_rows = target.open_frames(values, known)      # (T,) bool: unknown frames worth inferring
    """

    def __init__(
        self,
        decoder: EventDecoder | DecoderParams | Mapping[str, Any] | str | os.PathLike | None = None,
        margin: float = 0.3,
        transition_window: int = 8,
        presence_margin: float | None = None,
        score_tolerance: float | None = 0.2,
        probs_transform: Callable[[np.ndarray], np.ndarray] | None = None,
    ) -> None:
        self.decoder = decoder if isinstance(decoder, EventDecoder) else EventDecoder(decoder)
        _check_margin("margin", margin)
        for name, optional in (("presence_margin", presence_margin), ("score_tolerance", score_tolerance)):
            if optional is not None:
                _check_margin(name, optional)
        if (
            isinstance(transition_window, bool)
            or not isinstance(transition_window, (int, np.integer))
            or transition_window < 0
        ):
            raise ValueError(f"transition_window must be an integer >= 0, got {transition_window!r}")
        self.margin = float(margin)
        self.score_tolerance = score_tolerance
        self.presence_margin = self.margin if presence_margin is None else float(presence_margin)
        self.transition_window = int(transition_window)
        self.probs_transform = probs_transform
        p = self.decoder.params
        self.thresholds = p.per_label("threshold")
        self.order = list(p["order"])
        unsupported = [
            s for s in self.order if s not in ("threshold", "median", "fill_gaps", "min_length") and _step_on(p, s)
        ]
        if unsupported:  # their reach is unbounded: the envelope could not say which frames can change an event
            raise ValueError(f"reduced inference cannot refine a decoder with the chain step(s) {unsupported} on")
        self.rules = p.presence_rules()
        self.anatomy = dict(p["anatomy"])
        self.never = np.array([r["feature"] == "never" for r in self.rules])
        # frames of the chain's input that can reach one output frame
        half = p.per_label("median_window") // 2 if "median" in self.order else np.zeros(NUM_LABELS, np.int64)
        gaps = p.per_label("max_gap") if "fill_gaps" in self.order else np.zeros(NUM_LABELS, np.int64)
        lens = p.per_label("min_length") if "min_length" in self.order else np.zeros(NUM_LABELS, np.int64)
        self.reach = (half + gaps + lens + 1).astype(np.int64)

    # -------------------------------------------------------------------------------------------- pieces
    def _chain(self, probs: np.ndarray) -> np.ndarray:
        p = self.decoder.params
        return apply_chain(
            probs,
            thresholds=self.thresholds,
            median_windows=p.per_label("median_window"),
            max_gaps=p.per_label("max_gap"),
            min_lengths=p.per_label("min_length"),
            order=self.order,
        )

    def _transform(self, probs: np.ndarray) -> np.ndarray:
        if self.probs_transform is not None:
            probs = np.asarray(self.probs_transform(probs), dtype=np.float32)
        # the decoder's own calibration (increasing: bounds stay bounds) comes last, as in EventDecoder
        calibration = getattr(self.decoder, "calibration", None)
        return probs if calibration is None else calibration(probs)

    def envelope(
        self, values: np.ndarray, known: np.ndarray, margin: float | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Lower and upper ``(T, 17)`` probability bounds of every frame (known frames: their values)."""
        margin = self.margin if margin is None else float(margin)
        known = np.asarray(known, dtype=bool)
        left, right = knot_brackets(known)
        zl, zr = logit(values[left]), logit(values[right])
        unknown = ~known
        z = logit(values)
        width = margin
        lo = np.where(unknown[:, None], np.minimum(zl, zr) - width, z)
        hi = np.where(unknown[:, None], np.maximum(zl, zr) + width, z)
        return sigmoid(lo).astype(np.float32), sigmoid(hi).astype(np.float32)

    def _presence_open(
        self, lo: np.ndarray, hi: np.ndarray, m_lo: np.ndarray, m_hi: np.ndarray, cols: np.ndarray
    ) -> np.ndarray:
        """``(T, 17)``: frames that can decide the presence of the labels ``cols`` (presence still open)."""
        out = np.zeros(lo.shape, dtype=bool)
        for c in cols.tolist():
            rule = self.rules[c]
            feature = rule["feature"]
            cut = float(rule.get("cutoff", 0.0))
            if feature == "peak":
                w = int(rule.get("window", 1))
                reach_cut = _running_mean(hi[:, c : c + 1].astype(np.float64), w) >= cut
                below = _running_mean(lo[:, c : c + 1].astype(np.float64), w) < cut
                out[:, c] = _window_any(reach_cut & below, w, lo.shape[0])[:, 0]
            elif feature == "quantile":
                out[:, c] = (lo[:, c] < cut) & (hi[:, c] >= cut)
            elif feature == "support":
                out[:, c] = m_lo[:, c] != m_hi[:, c]
        return out

    # ----------------------------------------------------------------------------------------- the query
    def open_frames(self, values: np.ndarray, known: np.ndarray, probs: np.ndarray | None = None) -> np.ndarray:
        """Unknown frames whose probabilities can still change the decoded events.

        Args:
            values: ``(T, 17)`` probabilities, read on the known rows only.
            known: ``(T,)`` booleans, at least one ``True``.
            probs: the filled-in ``(T, 17)`` probabilities (what the decoder will see, before
                ``probs_transform``); interpolated from ``values`` when ``None``.

        Returns:
            ``(T,)`` booleans, ``False`` on every known frame.
        """
        known = np.asarray(known, dtype=bool)
        if known.all():
            return np.zeros(known.shape[0], dtype=bool)
        parts = self.open_parts(values, known, probs)
        return np.logical_or.reduce(list(parts.values())).any(axis=1) & ~known

    def open_parts(
        self, values: np.ndarray, known: np.ndarray, probs: np.ndarray | None = None
    ) -> dict[str, np.ndarray]:
        """The open frames of :meth:`open_frames` per reason and label: ``{"chain", "presence", "transitions"}``,
        each ``(T, 17)`` booleans (known frames included; the caller masks them)."""

        known = np.asarray(known, dtype=bool)
        T = known.shape[0]
        if probs is None:
            probs = interpolate_probs(known, values)
        lo, hi = self.envelope(values, known)
        lo, hi, mid = self._transform(lo), self._transform(hi), self._transform(probs)
        m_lo, m_hi = self._chain(lo), self._chain(hi)
        if self.presence_margin == self.margin:
            plo, phi, pm_lo, pm_hi = lo, hi, m_lo, m_hi
        else:
            plo, phi = self.envelope(values, known, self.presence_margin)
            plo, phi = self._transform(plo), self._transform(phi)
            pm_lo, pm_hi = self._chain(plo), self._chain(phi)
        pr_lo = apply_presence_rules(plo, pm_lo, self.rules) & ~self.never
        pr_hi = apply_presence_rules(phi, pm_hi, self.rules) & ~self.never
        # a label's frames matter once it is surely present; while its presence is open, only the frames that
        # can decide the presence do
        f_lo = m_lo & pr_lo[None, :]
        f_hi = m_hi & pr_lo[None, :]

        transitions = np.zeros((T, NUM_LABELS), dtype=bool)
        a = self.anatomy
        if a["enabled"] and T:
            # the sections of the interpolated probabilities gate landmarks and pathologies; the sections'
            # own columns are decided by the path, handled here
            sections = self.decoder.sections(mid)
            f_lo[:, _SECTION_COLS] = False
            f_hi[:, _SECTION_COLS] = False
            if sections is not None:
                if a["gate_landmarks"]:
                    allowed = landmark_windows(sections, a["landmark_window"])
                    for name, col in _LANDMARK_COLS.items():
                        f_lo[:, col] &= allowed[name]
                        f_hi[:, col] &= allowed[name]
                for name, secs in a["pathology_sections"].items():
                    gate = section_gate(sections, secs)
                    f_lo[:, LABELS.index(name)] &= gate
                    f_hi[:, LABELS.index(name)] &= gate
                switch = np.flatnonzero(np.diff(sections) != 0) + 1
                near = np.zeros((T, 1), dtype=bool)
                near[switch] = True
                # the lead-in, mouth and esophagus are short (tens to hundreds of frames): whether the path visits
                # them at all depends on a few frames, so everything before the stomach is open
                later = np.flatnonzero(sections >= _STOMACH)
                near[: (later[0] if later.size else T) + 8 * self.transition_window, 0] = True
                near = dilate_frames(near, self.transition_window)[:, 0]
                transitions[:, _SECTION_COLS] = near[:, None] & pr_hi[_SECTION_COLS][None, :]
        # chain outputs still open, and the inputs within the chain's reach of them whose threshold side is open
        thr = self.thresholds[None, :]
        side_open = (lo < thr) & (hi >= thr)
        chain = dilate_frames(f_lo != f_hi, self.reach) & side_open
        presence = np.zeros((T, NUM_LABELS), dtype=bool)
        presence_open = np.flatnonzero(pr_lo != pr_hi)
        if presence_open.size:
            presence = self._presence_open(plo, phi, pm_lo, pm_hi, presence_open)
        ranking = np.zeros((T, NUM_LABELS), dtype=bool)
        if self.score_tolerance is not None:
            # events whose confidence (mean probability over their frames) is still uncertain by more than the
            # tolerance: their unknown frames are open, so that the confidence order matches full inference
            f_mid = self._chain(mid) & pr_lo[None, :]
            f_mid[:, _SECTION_COLS] = False
            cls, start, stop = run_bounds(f_mid, True)
            if cls.size:
                width = np.zeros((T + 1, NUM_LABELS))
                np.cumsum(hi.astype(np.float64) - lo, axis=0, out=width[1:])
                uncertain = (width[stop, cls] - width[start, cls]) / (stop - start) > self.score_tolerance
                if uncertain.any():
                    delta = np.zeros((T + 1, NUM_LABELS), dtype=np.int64)
                    np.add.at(delta, (start[uncertain], cls[uncertain]), 1)
                    np.add.at(delta, (stop[uncertain], cls[uncertain]), -1)
                    ranking = np.cumsum(delta[:T], axis=0) > 0
        return {"chain": chain, "presence": presence, "transitions": transitions, "ranking": ranking}
