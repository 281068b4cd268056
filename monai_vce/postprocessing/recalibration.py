"""Per-exam recalibration by quantile matching to a reference (validation) score distribution: the decoder's
thresholds mapped to the exam (``t_exam = F_exam^-1(F_ref(t))``), or the exam's probabilities mapped to the reference.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from scipy.special import expit, logit

from monai_vce.events.probabilities import load_video_probs, probability_files
from monai_vce.labels import LABELS, NUM_LABELS
from monai_vce.utils import atomic_write_json, read_json_file, short_repr

from .params import DecoderParams

__all__ = [
    "DEFAULT_LEVELS",
    "ReferenceQuantiles",
    "load_reference_quantiles",
    "recalibrate_thresholds",
    "recalibrate_decoder",
    "quantile_match",
]

_FORMAT = "monai-vce reference quantiles"
_VERSION = 1
_MAX_FILE_BYTES = 64 * 1024**2
#: Thresholds and scores are clipped to ``[_EPS, 1 - _EPS]`` before a logit (``|logit| <= 13.8``).
_EPS = 1e-6
#: Score ranges at or below this are constant (no quantile is defined).
_FLAT = 1e-12


def _default_levels(n: int = 2001) -> np.ndarray:
    """``n`` levels from 0 to 1, evenly spaced on the logit scale in between (dense in both tails, where the
    thresholds of rare findings sit)."""
    inner = expit(np.linspace(logit(_EPS), logit(1.0 - _EPS), n - 2))
    return np.concatenate([[0.0], inner, [1.0]])


#: Quantile levels a reference stores by default: 0, 1999 levels from 1e-6 to 1 - 1e-6 even on the logit scale, 1.
DEFAULT_LEVELS: np.ndarray = _default_levels()
DEFAULT_LEVELS.setflags(write=False)


def _check_levels(levels: Any) -> np.ndarray:
    try:
        lv = np.array(levels, dtype=np.float64).reshape(-1)
    except (TypeError, ValueError):
        raise ValueError(f"levels must be numbers in [0, 1], got {short_repr(levels)}") from None
    if lv.size < 2 or lv[0] != 0.0 or lv[-1] != 1.0 or not np.all(np.diff(lv) > 0):
        raise ValueError("levels must increase strictly from 0 to 1 (at least 2 of them)")
    return lv


def _check_probs(probs: Any, what: str) -> np.ndarray:
    p = np.asarray(probs)
    if p.ndim != 2 or p.shape[1] != NUM_LABELS:
        raise ValueError(f"{what} must be a (T, {NUM_LABELS}) array, got shape {p.shape}")
    p = p.astype(np.float64, copy=False)
    if not np.isfinite(p).all():
        raise ValueError(f"{what} hold {int((~np.isfinite(p)).sum())} non-finite values")
    if p.size and (p.min() < 0.0 or p.max() > 1.0):
        raise ValueError(f"{what} must be probabilities in [0, 1], got values in [{p.min():g}, {p.max():g}]")
    return p


class ReferenceQuantiles:
    """Per-class quantile functions of reference (validation) scores, stored at fixed levels.

    ``values[k, c]`` is the level-``levels[k]`` quantile (numpy's linear rule) of class ``c``'s reference scores;
    ``levels`` run from 0 (the minimum) to 1 (the maximum). Build with :meth:`from_probabilities` from the
    probabilities in the probability files (:func:`recalibrate_decoder` applies a decoder's calibration to both).

    Args:
        levels: (Q,) levels, strictly increasing from 0 to 1.
        values: (Q, 17) quantiles in :data:`LABELS` order, non-decreasing down each column, in [0, 1].
        counts: (17,) number of reference scores of each class.
    """

    def __init__(self, levels: Any, values: Any, counts: Any) -> None:
        lv = _check_levels(levels)
        v = np.array(values, dtype=np.float64)
        if v.shape != (lv.size, NUM_LABELS):
            raise ValueError(f"values must be ({lv.size}, {NUM_LABELS}) (levels x labels), got shape {v.shape}")
        if not np.isfinite(v).all() or v.min() < 0.0 or v.max() > 1.0:
            raise ValueError("values must be finite probabilities in [0, 1]")
        bad = np.flatnonzero((np.diff(v, axis=0) < 0).any(axis=0))
        if bad.size:
            raise ValueError(f"values of label {LABELS[bad[0]]!r} decrease: a quantile function never does")
        c = np.array(counts)
        if c.shape != (NUM_LABELS,) or c.dtype.kind not in "iu" or (c < 0).any():
            raise ValueError(f"counts must be {NUM_LABELS} non-negative integers, got {short_repr(counts)}")
        self.levels, self.values, self.counts = lv, v, c.astype(np.int64)
        for arr in (self.levels, self.values, self.counts):
            arr.setflags(write=False)

    def __repr__(self) -> str:
        return f"ReferenceQuantiles(levels={self.levels.size}, frames={int(self.counts.max(initial=0))})"

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, ReferenceQuantiles)
            and np.array_equal(self.levels, other.levels)
            and np.array_equal(self.values, other.values)
            and np.array_equal(self.counts, other.counts)
        )

    __hash__ = None  # type: ignore[assignment]

    # building ---------------------------------------------------------------------------------------
    @classmethod
    def from_probabilities(cls, probs: Any | Iterable[Any], levels: Any | None = None) -> ReferenceQuantiles:
        """The reference of validation probabilities.

        Args:
            probs: one (N, 17) array, or an iterable of per-video (T, 17) arrays (pooled).
            levels: levels to store (strictly increasing from 0 to 1); ``None``: :data:`DEFAULT_LEVELS`.

        Raises:
            ValueError: no frame, a wrong shape, or values that are not finite probabilities.
        """
        lv = DEFAULT_LEVELS if levels is None else _check_levels(levels)
        arrays = [probs] if isinstance(probs, np.ndarray) else list(probs)
        blocks = [_check_probs(p, "reference probabilities") for p in arrays]
        pooled = np.concatenate(blocks) if blocks else np.zeros((0, NUM_LABELS))
        if pooled.shape[0] == 0:
            raise ValueError("a reference needs at least one frame, got none")
        values = np.quantile(pooled, lv, axis=0)
        values = np.maximum.accumulate(np.clip(values, 0.0, 1.0), axis=0)  # rounding never makes it decrease
        return cls(lv, values, np.full(NUM_LABELS, pooled.shape[0], dtype=np.int64))

    @classmethod
    def from_probs_dir(cls, probs_dir: str | os.PathLike, levels: Any | None = None) -> ReferenceQuantiles:
        """The reference of every ``<probs_dir>/<video_id>.npz`` probability file (e.g. validation inference)."""
        files = probability_files(probs_dir)
        if not files:
            raise FileNotFoundError(f"no probability files (*.npz) in {probs_dir}")
        return cls.from_probabilities((load_video_probs(path).probs for path in files.values()), levels=levels)

    # the quantile function and its inverse -----------------------------------------------------------
    def cdf(self, scores: Any) -> np.ndarray:
        """``F_ref(t) = P(score < t)`` per class (linear between stored levels): ``scores`` (17,) or (T, 17)."""
        t = np.asarray(scores, dtype=np.float64)
        flat = t.reshape(-1, NUM_LABELS)
        v = self.values
        # first stored quantile >= t, per class: v[i-1] < t <= v[i]
        i = np.stack([np.searchsorted(v[:, j], flat[:, j], side="left") for j in range(NUM_LABELS)], axis=1)
        lo = np.clip(i - 1, 0, v.shape[0] - 1)
        hi = np.clip(i, 0, v.shape[0] - 1)
        cols = np.arange(NUM_LABELS)[None, :]
        v_lo, v_hi = v[lo, cols], v[hi, cols]
        span = v_hi - v_lo
        frac = np.divide(flat - v_lo, span, out=np.zeros_like(flat), where=span > 0)
        q = self.levels[lo] + np.clip(frac, 0.0, 1.0) * (self.levels[hi] - self.levels[lo])
        q = np.where(i == 0, 0.0, np.where(i >= v.shape[0], 1.0, q))
        return q.reshape(t.shape)

    def quantile(self, q: Any) -> np.ndarray:
        """``F_ref^-1(q)`` per class (linear between stored levels): ``q`` (17,) or (T, 17) in [0, 1]."""
        u = np.clip(np.asarray(q, dtype=np.float64), 0.0, 1.0)
        flat = u.reshape(-1, NUM_LABELS)
        hi = np.clip(np.searchsorted(self.levels, flat, side="left"), 1, self.levels.size - 1)
        lo = hi - 1
        frac = (flat - self.levels[lo]) / (self.levels[hi] - self.levels[lo])
        cols = np.arange(NUM_LABELS)[None, :]
        out = self.values[lo, cols] + frac * (self.values[hi, cols] - self.values[lo, cols])
        return out.reshape(u.shape)

    # file -------------------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """The JSON object of :meth:`save` (floats written exactly)."""
        return {
            "format": _FORMAT,
            "version": _VERSION,
            "levels": self.levels.tolist(),
            "labels": {
                name: {"count": int(self.counts[j]), "values": self.values[:, j].tolist()}
                for j, name in enumerate(LABELS)
            },
        }

    @classmethod
    def from_dict(cls, data: Any, source: str = "reference quantiles") -> ReferenceQuantiles:
        """Rebuild from :meth:`to_dict`; every field is checked (errors name ``source`` and the field)."""
        try:
            if not isinstance(data, Mapping):
                raise ValueError(f"must be a JSON object, got {type(data).__name__}")
            if data.get("format") != _FORMAT or data.get("version") != _VERSION:
                raise ValueError(f"not a {_FORMAT!r} file of version {_VERSION}")
            unknown = sorted(set(data) - {"format", "version", "levels", "labels"})
            if unknown:
                raise ValueError(f"unknown key {short_repr(unknown[0])}")
            labels = data.get("labels")
            if not isinstance(labels, Mapping) or set(labels) != set(LABELS):
                raise ValueError(f"labels must be an object keyed by exactly the {NUM_LABELS} label names")
            values, counts = [], []
            for name in LABELS:
                entry = labels[name]
                if not isinstance(entry, Mapping) or set(entry) != {"count", "values"}:
                    raise ValueError(f"labels.{name} must be an object with 'count' and 'values'")
                count, vals = entry["count"], entry["values"]
                if isinstance(count, bool) or not isinstance(count, int):
                    raise ValueError(f"labels.{name}.count must be an integer, got {short_repr(count)}")
                if not isinstance(vals, list) or not all(
                    isinstance(x, (int, float)) and not isinstance(x, bool) for x in vals
                ):
                    raise ValueError(f"labels.{name}.values must be a list of numbers")
                counts.append(count)
                values.append(vals)
            levels = data.get("levels")
            if not isinstance(levels, list) or not all(
                isinstance(x, (int, float)) and not isinstance(x, bool) for x in levels
            ):
                raise ValueError("levels must be a list of numbers")
            if any(len(v) != len(levels) for v in values):
                raise ValueError("every label must hold one value per level")
            return cls(levels, np.array(values, dtype=np.float64).T, np.array(counts, dtype=np.int64))
        except ValueError as e:
            raise ValueError(f"{source}: {e}") from None

    def save(self, path: str | os.PathLike) -> Path:
        """Write the reference as JSON, atomically; returns the path."""
        return atomic_write_json(path, self.to_dict(), indent=None)

    @classmethod
    def load(cls, path: str | os.PathLike) -> ReferenceQuantiles:
        """Read a file written by :meth:`save` (plain JSON, parsed strictly: nothing in it is executed).

        Raises:
            FileNotFoundError: the file does not exist.
            ValueError: not such a file (the message names it and the offending field).
        """
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"reference quantiles file not found: {path}")
        obj = read_json_file(path, max_bytes=_MAX_FILE_BYTES, what="reference quantiles file")
        return cls.from_dict(obj, source=str(path))


def load_reference_quantiles(path: str | os.PathLike) -> ReferenceQuantiles:
    """:meth:`ReferenceQuantiles.load`."""
    return ReferenceQuantiles.load(path)


def _as_thresholds(thresholds: Any) -> np.ndarray:
    if isinstance(thresholds, Mapping):
        unknown = [k for k in thresholds if k not in LABELS]
        missing = [n for n in LABELS if n not in thresholds]
        if unknown or missing:
            raise ValueError(
                f"thresholds must be keyed by exactly the label names (unknown {unknown}, missing {missing})"
            )
        thresholds = [thresholds[n] for n in LABELS]
    t = np.array(thresholds, dtype=np.float64).reshape(-1)
    if t.shape != (NUM_LABELS,) or not np.isfinite(t).all() or t.min() < 0.0 or t.max() > 1.0:
        raise ValueError(f"thresholds must be {NUM_LABELS} numbers in [0, 1] in LABELS order, got {short_repr(t)}")
    return t


def _logit(p: np.ndarray) -> np.ndarray:
    return np.asarray(logit(np.clip(p, _EPS, 1.0 - _EPS)))


def _bounded(new: np.ndarray, old: np.ndarray, max_shift: float | None) -> np.ndarray:
    """``new``, moved at most ``max_shift`` logits away from ``old``."""
    if max_shift is None:
        return new
    z_old = _logit(old)
    z = np.clip(_logit(new), z_old - max_shift, z_old + max_shift)
    out = np.asarray(expit(z), dtype=np.float64)
    # inside the bound the value is kept as it is (no logit round trip)
    return np.where(np.abs(_logit(new) - z_old) <= max_shift, new, out)


def _check_safeguards(max_shift: float | None, min_frames: int, min_tail: float) -> None:
    if max_shift is not None and not (math.isfinite(max_shift) and max_shift >= 0):
        raise ValueError(f"max_shift must be None or a non-negative number of logits, got {max_shift!r}")
    if isinstance(min_frames, bool) or not isinstance(min_frames, int) or min_frames < 2:
        raise ValueError(f"min_frames must be an integer >= 2, got {min_frames!r}")
    if not (math.isfinite(min_tail) and min_tail >= 0):
        raise ValueError(f"min_tail must be a non-negative number of frames, got {min_tail!r}")


def recalibrate_thresholds(
    thresholds: Any,
    exam_probs: Any,
    reference: ReferenceQuantiles,
    max_shift: float | None = 2.0,
    min_frames: int = 100,
    min_tail: float = 5.0,
    return_reasons: bool = False,
) -> np.ndarray | tuple[np.ndarray, dict[str, str]]:
    """Map each class's threshold to the exam's score at the quantile it had in the reference.

    With ``q = F_ref(t)`` the reference fraction of scores below ``t``, the threshold becomes the exam's
    ``q``-quantile, so the exam flags (``prob >= threshold``) the fraction of frames the reference flagged.
    A class keeps its reference threshold when the exam has fewer than ``min_frames`` frames, when its exam or
    reference scores are constant, or when fewer than ``min_tail`` frames (expected, of the exam or of the
    reference) lie on the thin side of ``q`` (a threshold outside the reference's scores, or a quantile the exam
    cannot resolve).

    Args:
        thresholds: (17,) thresholds in :data:`LABELS` order, or a mapping label name -> threshold.
        exam_probs: (T, 17) probabilities of one exam, on the reference's scale.
        reference: the reference score distributions.
        max_shift: the largest move of a threshold, in logits; ``None``: unbounded.
        min_frames: fewest exam frames for any recalibration.
        min_tail: fewest frames, ``min(q, 1 - q) * frames``, in the exam and in the reference.
        return_reasons: also return ``{label: why it kept its threshold}`` of the classes left unchanged.

    Returns:
        (17,) float64 thresholds in [0, 1], or ``(thresholds, reasons)`` with ``return_reasons=True``.
    """
    _check_safeguards(max_shift, min_frames, min_tail)
    t_ref = _as_thresholds(thresholds)
    p = _check_probs(exam_probs, "exam probabilities")
    n = p.shape[0]
    reasons: dict[str, str] = {}
    if n < min_frames:
        reasons = {name: f"exam has {n} frames (fewer than {min_frames})" for name in LABELS}
        return (t_ref.copy(), reasons) if return_reasons else t_ref.copy()
    q = reference.cdf(t_ref)
    s = np.sort(p, axis=0)
    # the exam's q-quantile, numpy's linear rule, per class
    h = q * (n - 1)
    lo = np.clip(np.floor(h).astype(np.int64), 0, n - 1)
    hi = np.minimum(lo + 1, n - 1)
    cols = np.arange(NUM_LABELS)
    t_exam = s[lo, cols] + (h - lo) * (s[hi, cols] - s[lo, cols])
    tail = np.minimum(q, 1.0 - q)
    ref_flat = (reference.values[-1] - reference.values[0]) <= _FLAT
    exam_flat = (s[-1] - s[0]) <= _FLAT
    checks = [
        (ref_flat, "constant reference scores"),
        (exam_flat, "constant exam scores"),
        (tail * reference.counts < min_tail, f"fewer than {min_tail:g} reference frames beyond its quantile"),
        (tail * n < min_tail, f"fewer than {min_tail:g} exam frames beyond its quantile"),
    ]
    keep = np.zeros(NUM_LABELS, dtype=bool)
    for mask, why in checks:
        for j in np.flatnonzero(mask & ~keep):
            reasons[LABELS[j]] = f"{why} (quantile {q[j]:.6g})"
        keep |= mask
    out = np.clip(_bounded(t_exam, t_ref, max_shift), 0.0, 1.0)
    out = np.where(keep, t_ref, out)
    return (out, reasons) if return_reasons else out


def _calibrated(reference: ReferenceQuantiles, calibration: Any) -> ReferenceQuantiles:
    """The reference of the calibrated scores: the calibration is increasing per class, so it maps quantiles."""
    values = np.clip(np.asarray(calibration(reference.values), dtype=np.float64), 0.0, 1.0)
    return ReferenceQuantiles(reference.levels, np.maximum.accumulate(values, axis=0), reference.counts)


def recalibrate_decoder(
    params: DecoderParams,
    exam_probs: Any,
    reference: ReferenceQuantiles,
    max_shift: float | None = 2.0,
    min_frames: int = 100,
    min_tail: float = 5.0,
    presence: bool = True,
) -> DecoderParams:
    """The decoder parameters recalibrated to one exam (:func:`recalibrate_thresholds`): the thresholds and, with
    ``presence``, the cut-offs of the presence rules on probabilities (``peak`` and ``quantile``).

    ``exam_probs`` and ``reference`` are of raw probabilities (as in the probability files); the parameters'
    ``calibration`` (increasing per class) is applied to both first, as the decoder applies it.

    Args:
        params: the decoder's parameters.
        exam_probs: (T, 17) raw probabilities of one exam.
        reference: the reference score distributions of raw (validation) probabilities.
        max_shift: see :func:`recalibrate_thresholds`.
        min_frames: see :func:`recalibrate_thresholds`.
        min_tail: see :func:`recalibrate_thresholds`.
        presence: also map the presence cut-offs.
    """
    probs = _check_probs(exam_probs, "exam probabilities")
    calibration = params.calibration
    if calibration is not None:
        probs = np.asarray(calibration(probs), dtype=np.float64)
        reference = _calibrated(reference, calibration)

    def recalibrated(values: np.ndarray) -> np.ndarray:
        out = recalibrate_thresholds(values, probs, reference, max_shift, min_frames, min_tail)
        return np.asarray(out)

    new = recalibrated(params.per_label("threshold"))
    d = params.to_dict()
    for name, value in zip(LABELS, np.asarray(new).tolist(), strict=True):
        d["labels"][name]["threshold"] = float(value)
    rules = params.presence_rules()
    mapped = [j for j, r in enumerate(rules) if r.get("feature") in ("peak", "quantile") and 0 <= r["cutoff"] <= 1]
    if presence and mapped:
        cutoffs = np.asarray(new, dtype=np.float64).copy()  # placeholders for the labels without such a rule
        cutoffs[mapped] = [rules[j]["cutoff"] for j in mapped]
        moved = recalibrated(cutoffs)
        for j in mapped:
            d["labels"][LABELS[j]]["presence"]["cutoff"] = float(moved[j])
    return DecoderParams(d, source=params.source)


def quantile_match(
    exam_probs: Any,
    reference: ReferenceQuantiles,
    max_shift: float | None = None,
    min_frames: int = 100,
    classes: Sequence[str] | None = None,
) -> np.ndarray:
    """Quantile-normalise an exam's probabilities to the reference, class by class, for the unchanged decoder.

    Each frame's score becomes the reference quantile at the frame's (tie-averaged) rank in the exam,
    ``F_ref^-1(rank / (T - 1))``: the order of frames within a class is kept, tied scores stay tied, and the
    exam's distribution becomes the reference's. The exam is returned unchanged below ``min_frames`` frames, and
    so are the classes whose exam or reference scores are constant.

    Args:
        exam_probs: (T, 17) probabilities of one exam, on the reference's scale.
        reference: the reference score distributions.
        max_shift: the largest move of a score, in logits; ``None``: unbounded.
        min_frames: fewest exam frames for any change.
        classes: label names to match; ``None``: all.

    Returns:
        (T, 17) float32 probabilities (a new array).
    """
    _check_safeguards(max_shift, min_frames, 0.0)
    p = _check_probs(exam_probs, "exam probabilities")
    n = p.shape[0]
    if n < min_frames:
        return p.astype(np.float32)
    order = np.argsort(p, axis=0, kind="stable")
    s = np.take_along_axis(p, order, axis=0)
    # tie-averaged ranks of the sorted scores: the mean of the first and last position of each run of equal scores
    pos = np.broadcast_to(np.arange(n)[:, None], s.shape)
    new_run = np.ones_like(s, dtype=bool)
    new_run[1:] = s[1:] != s[:-1]
    first = np.maximum.accumulate(np.where(new_run, pos, 0), axis=0)
    end_run = np.ones_like(s, dtype=bool)
    end_run[:-1] = new_run[1:]
    last = np.minimum.accumulate(np.where(end_run, pos, n - 1)[::-1], axis=0)[::-1]
    u_sorted = (first + last) / (2.0 * (n - 1))
    u = np.empty_like(u_sorted)
    np.put_along_axis(u, order, u_sorted, axis=0)
    out = np.clip(reference.quantile(u), 0.0, 1.0)
    if max_shift is not None:
        out = _bounded(out, p, max_shift)
    keep = ((reference.values[-1] - reference.values[0]) <= _FLAT) | ((s[-1] - s[0]) <= _FLAT)
    if classes is not None:
        unknown = [c for c in classes if c not in LABELS]
        if unknown:
            raise ValueError(f"unknown label {short_repr(unknown[0])}; expected names from {list(LABELS)}")
        keep |= ~np.isin(np.asarray(LABELS), list(classes))
    out = np.where(keep[None, :], p, out)
    return out.astype(np.float32)
