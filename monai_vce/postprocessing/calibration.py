"""Per-label recalibration of frame probabilities on the logit scale: ``p' = sigmoid(a_c * logit(p) + b_c)``.

:meth:`ProbabilityCalibration.fit` fits temperature (``b_c = 0``) or Platt scaling per label by minimising the
binary cross-entropy on validation frames; the result is a small JSON file (:meth:`~ProbabilityCalibration.save`,
:func:`load_calibration`). Every map is increasing, so frame rankings and AUCs are unchanged.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from scipy.optimize import minimize
from scipy.special import expit

from monai_vce.labels import LABELS, NUM_LABELS
from monai_vce.utils import atomic_write_json, read_json_file, short_repr

__all__ = ["CALIBRATION_METHODS", "ProbabilityCalibration", "load_calibration"]

#: Calibration maps: ``"temperature"`` (``p' = sigmoid(logit(p) / T_c)``) and ``"platt"`` (scale and shift).
CALIBRATION_METHODS: tuple[str, ...] = ("temperature", "platt")

_FORMAT = "monai-vce probability calibration"
_VERSION = 1
_MAX_FILE_BYTES = 16 * 1024**2
#: Probabilities are clipped to [_EPS, 1 - _EPS] before the logit (|logit| <= 13.8).
_EPS = 1e-6
_Z_MAX = math.log((1.0 - _EPS) / _EPS)
#: The fit works on per-label histograms of the logits (exact statistics per bin; bins 0.007 logits wide).
_BINS = 4096
#: Bounds of the fitted scale and shift (reached only by (nearly) separable labels).
_SCALE_BOUNDS = (1e-3, 1e3)
_SHIFT_BOUNDS = (-1e3, 1e3)
#: Rows per chunk of the passes over the frames: bounded memory, and blocks that stay in the CPU's cache.
_CHUNK = 2048
#: Rows per chunk of the histogram pass (each chunk adds a histogram of all bins).
_HIST_CHUNK = 16384
_FIT_KEYS = ("method", "frames", "positives", "identity", "nll_before", "nll_after")


def _check_method(method: Any) -> None:
    if not isinstance(method, str) or method not in CALIBRATION_METHODS:
        raise ValueError(f"method must be one of {', '.join(map(repr, CALIBRATION_METHODS))}, got {short_repr(method)}")


def _per_label(values: Sequence[float] | None, key: str, default: float) -> np.ndarray:
    """``(17,)`` finite float64 values of ``key`` in :data:`LABELS` order (``default`` when ``None``)."""
    if values is None:
        return np.full(NUM_LABELS, default, dtype=np.float64)
    if isinstance(values, (str, bytes, Mapping)):
        raise ValueError(f"{key} must be {NUM_LABELS} numbers in LABELS order, got {short_repr(values)}")
    try:
        arr = np.array(values, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(f"{key} must be {NUM_LABELS} numbers in LABELS order, got {short_repr(values)}") from None
    if arr.shape != (NUM_LABELS,):
        raise ValueError(f"{key} must be {NUM_LABELS} numbers in LABELS order, got shape {arr.shape}")
    bad = np.flatnonzero(~np.isfinite(arr))
    if bad.size:
        raise ValueError(f"{key} of label {LABELS[bad[0]]!r} must be finite, got {arr[bad[0]]}")
    return arr


def _number(value: Any, key: str, minimum: float | None = None) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{key} must be a finite number, got {short_repr(value)}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{key} must be >= {minimum:g}, got {value!r}")
    return float(value)


def _count(value: Any, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{key} must be a non-negative integer, got {short_repr(value)}")
    return int(value)


def _check_keys(obj: Any, key: str, required: Sequence[str], optional: Sequence[str] = ()) -> None:
    if not isinstance(obj, Mapping):
        raise ValueError(f"{key} must be an object, got {type(obj).__name__}")
    unknown = [k for k in obj if k not in required and k not in optional]
    if unknown:
        raise ValueError(f"{key}: unknown key {short_repr(unknown[0])} (expected {', '.join(required)})")
    missing = [k for k in required if k not in obj]
    if missing:
        raise ValueError(f"{key}: missing key {missing[0]!r}")


def _per_label_mapping(obj: Any, key: str) -> Mapping[str, Any]:
    """A mapping of ``key`` with exactly the 17 labels as keys."""
    if not isinstance(obj, Mapping):
        raise ValueError(f"{key} must be an object keyed by label name, got {type(obj).__name__}")
    unknown = [k for k in obj if k not in LABELS]
    if unknown:
        raise ValueError(f"{key}: unknown label {short_repr(unknown[0])}")
    missing = [name for name in LABELS if name not in obj]
    if missing:
        raise ValueError(f"{key}: missing label {missing[0]!r}")
    return obj


def _check_fit(fit: Any, method: str) -> dict[str, Any]:
    """A plain copy of a fit record (see :meth:`ProbabilityCalibration.fit`); errors name the key."""
    _check_keys(fit, "fit", _FIT_KEYS)
    if fit["method"] != method:
        raise ValueError(f"fit.method must be the calibration's method {method!r}, got {short_repr(fit['method'])}")
    identity = fit["identity"]
    if not isinstance(identity, (list, tuple)):
        raise ValueError(f"fit.identity must be a list of labels, got {type(identity).__name__}")
    for name in identity:
        if name not in LABELS:
            raise ValueError(f"fit.identity: unknown label {short_repr(name)}")
    if len(set(identity)) != len(identity):
        raise ValueError("fit.identity names a label twice")
    positives = _per_label_mapping(fit["positives"], "fit.positives")
    out: dict[str, Any] = {
        "method": method,
        "frames": _count(fit["frames"], "fit.frames"),
        "positives": {name: _count(positives[name], f"fit.positives.{name}") for name in LABELS},
        "identity": [name for name in LABELS if name in identity],
    }
    for key in ("nll_before", "nll_after"):
        values = _per_label_mapping(fit[key], f"fit.{key}")
        out[key] = {name: _number(values[name], f"fit.{key}.{name}", minimum=0.0) for name in LABELS}
    return out


def _rounded(x: float) -> float:
    return float(f"{x:.6g}")


def _logits(block: np.ndarray, dtype: type[np.floating]) -> tuple[np.ndarray, np.ndarray]:
    """``(logit(q), log(1 - q))`` of ``q`` = the probabilities clipped to ``[_EPS, 1 - _EPS]``."""
    q = block.astype(dtype)  # a copy: the caller's array is never written
    np.clip(q, dtype(_EPS), dtype(1.0 - _EPS), out=q)
    log_neg = np.log1p(-q)
    z = np.log(q, out=q)
    z -= log_neg
    return z, log_neg


def _check_fit_inputs(probs: Any, targets: Any) -> tuple[np.ndarray, np.ndarray]:
    p = np.asarray(probs)
    y = np.asarray(targets)
    if p.ndim != 2 or p.shape[1] != NUM_LABELS or p.shape != y.shape:
        raise ValueError(
            f"probs and targets must both have shape (T, {NUM_LABELS}), got shapes {p.shape} and {y.shape}"
        )
    if p.shape[0] == 0:
        raise ValueError("probs hold no frame: calibration needs validation frames")
    for name, arr in (("probs", p), ("targets", y)):
        if not (np.issubdtype(arr.dtype, np.number) or arr.dtype == bool):
            raise ValueError(f"{name} must be a numeric array, got dtype {arr.dtype}")
    if not np.issubdtype(p.dtype, np.floating):
        p = p.astype(np.float64)
    bad = ~np.isfinite(p) | (p < 0.0) | (p > 1.0)
    if bad.any():
        t, c = np.argwhere(bad)[0]
        raise ValueError(
            f"probs: {p[t, c]} is not a probability in [0, 1] at frame {t} (row), label {LABELS[c]!r}; "
            "pass sigmoid outputs, not logits"
        )
    if y.dtype != bool:
        if np.issubdtype(y.dtype, np.floating) and not np.isfinite(y).all():
            t, c = np.argwhere(~np.isfinite(y))[0]
            raise ValueError(f"targets: non-finite target {y[t, c]} at frame {t} (row), label {LABELS[c]!r}")
        y = y >= 0.5
    return p, y


def _fit_label(counts: np.ndarray, positives: np.ndarray, zsum: np.ndarray, platt: bool) -> tuple[float, float] | None:
    """Scale and shift minimising the cross-entropy of one label's logit histogram; ``None`` if it failed."""
    keep = counts > 0
    n, pos = counts[keep].astype(np.float64), positives[keep].astype(np.float64)
    z = zsum[keep] / n
    norm = float(np.logaddexp(0.0, z) @ n - pos @ z)  # the identity's loss: the objective starts at 1

    def loss(x: np.ndarray) -> tuple[float, np.ndarray]:
        u = x[0] * z + (x[1] if platt else 0.0)
        value = float(np.logaddexp(0.0, u) @ n - pos @ u) / norm
        g = (n * expit(u) - pos) / norm  # d loss / d u per bin
        grad = np.array([g @ z, g.sum()]) if platt else np.array([g @ z])
        return value, grad

    x0 = np.array([1.0, 0.0]) if platt else np.array([1.0])
    bounds = [_SCALE_BOUNDS, _SHIFT_BOUNDS] if platt else [_SCALE_BOUNDS]
    res = minimize(
        loss, x0, jac=True, method="L-BFGS-B", bounds=bounds, options={"maxiter": 500, "ftol": 1e-13, "gtol": 1e-10}
    )
    if not np.all(np.isfinite(res.x)):
        return None
    return float(res.x[0]), float(res.x[1]) if platt else 0.0


class ProbabilityCalibration:
    """Per-label calibration map ``p' = sigmoid(scale_c * logit(p) + shift_c)`` of ``(T, 17)`` frame probabilities.

    A label with scale 1 and shift 0 is the identity: its column is returned unchanged. ``scale > 0`` keeps every
    map increasing. Fit with :meth:`fit`; save and load with :meth:`save` and :meth:`load`.

    Args:
        scale: 17 positive scales in :data:`LABELS` order (``1 / T_c`` for temperature scaling); ``None``: all 1.
        shift: 17 shifts; ``None``: all 0 (must all be 0 for ``method="temperature"``).
        method: one of :data:`CALIBRATION_METHODS`.
        fit: the record of how the map was fitted (see :meth:`fit`), or ``None``.

    Raises:
        ValueError: a wrong length, a non-finite value, a scale <= 0, an unknown method, a temperature shift other
            than 0, or an invalid fit record; one line naming the key.
    """

    def __init__(
        self,
        scale: Sequence[float] | None = None,
        shift: Sequence[float] | None = None,
        method: str = "platt",
        fit: Mapping[str, Any] | None = None,
    ) -> None:
        _check_method(method)
        self._scale = _per_label(scale, "scale", 1.0)
        self._shift = _per_label(shift, "shift", 0.0)
        bad = np.flatnonzero(self._scale <= 0.0)
        if bad.size:
            raise ValueError(f"scale of label {LABELS[bad[0]]!r} must be > 0, got {self._scale[bad[0]]}")
        bad = np.flatnonzero(self._shift != 0.0)
        if method == "temperature" and bad.size:
            raise ValueError(
                f"shift of label {LABELS[bad[0]]!r} must be 0 for method 'temperature', got {self._shift[bad[0]]}"
            )
        self._method = method
        self._fit = None if fit is None else _check_fit(fit, method)
        self._identity = (self._scale == 1.0) & (self._shift == 0.0)
        if self._fit is not None:
            wrong = [name for name in self._fit["identity"] if not self._identity[LABELS.index(name)]]
            if wrong:
                raise ValueError(f"fit.identity names label {wrong[0]!r}, whose scale is not 1 or shift not 0")

    @property
    def method(self) -> str:
        """The map's kind, one of :data:`CALIBRATION_METHODS`."""
        return self._method

    @property
    def scale(self) -> np.ndarray:
        """``(17,)`` float64 scales ``a_c`` (a copy)."""
        return self._scale.copy()

    @property
    def shift(self) -> np.ndarray:
        """``(17,)`` float64 shifts ``b_c`` (a copy)."""
        return self._shift.copy()

    @property
    def fit_info(self) -> dict[str, Any] | None:
        """A copy of the fit record (see :meth:`fit`), ``None`` for a map that was not fitted."""
        return None if self._fit is None else _check_fit(self._fit, self._method)

    @property
    def is_identity(self) -> bool:
        """Whether every label keeps its probabilities unchanged."""
        return bool(self._identity.all())

    def __repr__(self) -> str:
        changed = int((~self._identity).sum())
        return f"ProbabilityCalibration(method={self._method!r}, {changed} of {NUM_LABELS} labels rescaled)"

    def __call__(self, probs: np.ndarray) -> np.ndarray:
        """Calibrate ``(T, 17)`` probabilities.

        Probabilities are clipped to ``[1e-6, 1 - 1e-6]`` before the logit; the columns of identity labels are
        returned as they are, cast to float32 (bit for bit for a float32 input).

        Returns:
            ``(T, 17)`` float32 calibrated probabilities.

        Raises:
            ValueError: ``probs`` is not a numeric ``(T, 17)`` array (its shape named).
        """
        p = np.asarray(probs)
        if p.ndim != 2 or p.shape[1] != NUM_LABELS:
            raise ValueError(f"probs must have shape (T, {NUM_LABELS}), got shape {p.shape}")
        if not (np.issubdtype(p.dtype, np.number) or p.dtype == bool):
            raise ValueError(f"probs must be a numeric array, got dtype {p.dtype}")
        out = p.astype(np.float32, copy=True)
        cols = np.flatnonzero(~self._identity)
        if cols.size == 0:
            return out
        a, b = self._scale[cols], self._shift[cols]
        for start in range(0, p.shape[0], _CHUNK):
            z, _ = _logits(p[start : start + _CHUNK, cols], np.float64)
            z *= a
            z += b
            out[start : start + _CHUNK, cols] = expit(z, out=z)
        return out

    @classmethod
    def fit(
        cls,
        probs: np.ndarray,
        targets: np.ndarray,
        method: str = "platt",
        min_positives: int = 1,
        max_frames: int | None = None,
        seed: int = 0,
    ) -> ProbabilityCalibration:
        """Fit the map per label by minimising the mean binary cross-entropy against ``targets``.

        The fit runs L-BFGS-B on a fine histogram of each label's logits (a few thousand bins); the cross-entropy
        before and after is then computed exactly on the frames, and a label whose fitted map is not better than
        the identity keeps the identity. So is a label with fewer than ``min_positives`` positives or no negative.

        Args:
            probs: ``(T, 17)`` validation probabilities in [0, 1].
            targets: ``(T, 17)`` targets, positive where ``>= 0.5``.
            method: one of :data:`CALIBRATION_METHODS`.
            min_positives: fewest positive frames a label needs to be fitted (at least 1).
            max_frames: fit on a random subsample of this many frames (deterministic given ``seed``); ``None``: all.
            seed: seed of the subsample.

        Returns:
            the fitted map; its :attr:`fit_info` is ``{"method", "frames", "positives": {label: n}, "identity":
            [labels kept identity], "nll_before": {label: x}, "nll_after": {label: x}}`` (mean cross-entropy of
            the clipped probabilities before and after, 6 significant digits; never larger after).

        Raises:
            ValueError: mismatched shapes, no frame, a probability outside [0, 1] or non-finite, or an invalid
                setting; one line naming it.
        """
        _check_method(method)
        if isinstance(min_positives, bool) or not isinstance(min_positives, (int, np.integer)) or min_positives < 1:
            raise ValueError(f"min_positives must be an integer >= 1, got {short_repr(min_positives)}")
        if max_frames is not None and (
            isinstance(max_frames, bool) or not isinstance(max_frames, (int, np.integer)) or max_frames < 1
        ):
            raise ValueError(f"max_frames must be None or an integer >= 1, got {short_repr(max_frames)}")
        p, y = _check_fit_inputs(probs, targets)
        if max_frames is not None and max_frames < p.shape[0]:
            rows = np.sort(np.random.default_rng(seed).choice(p.shape[0], size=int(max_frames), replace=False))
            p, y = p[rows], y[rows]
        frames = p.shape[0]

        # pass 1 (float32 suffices): per label and logit bin, the frames, positives and sum of logits
        offset = (np.arange(NUM_LABELS) * _BINS)[None, :]
        size = NUM_LABELS * _BINS
        flat_counts = np.zeros(2 * size, dtype=np.int64)  # negatives, then positives
        flat_zsum = np.zeros(size, dtype=np.float64)
        for start in range(0, frames, _HIST_CHUNK):
            z, _ = _logits(p[start : start + _HIST_CHUNK], np.float32)
            k = ((z + np.float32(_Z_MAX)) * np.float32(_BINS / (2 * _Z_MAX))).astype(np.intp)
            np.clip(k, 0, _BINS - 1, out=k)
            k += offset
            flat_zsum += np.bincount(k.ravel(), weights=z.ravel(), minlength=size)
            k += size * y[start : start + _HIST_CHUNK]
            flat_counts += np.bincount(k.ravel(), minlength=2 * size)
        counts = flat_counts.reshape(2, NUM_LABELS, _BINS)
        pos_bins, all_bins = counts[1], counts.sum(axis=0)
        positives = pos_bins.sum(axis=1)
        negatives = frames - positives
        zsum = flat_zsum.reshape(NUM_LABELS, _BINS)

        scale, shift = np.ones(NUM_LABELS), np.zeros(NUM_LABELS)
        fitted = np.flatnonzero((positives >= min_positives) & (negatives > 0))
        for c in fitted:
            params = _fit_label(all_bins[c], pos_bins[c], zsum[c], platt=method == "platt")
            if params is not None:
                scale[c], shift[c] = params
        fitted = fitted[(scale[fitted] != 1.0) | (shift[fitted] != 0.0)]

        # pass 2 (float64): the exact mean cross-entropy before (all labels) and after (fitted labels)
        before, after = np.zeros(NUM_LABELS), np.zeros(fitted.size)
        a, b = scale[fitted], shift[fitted]
        ones = np.ones(_CHUNK)
        for start in range(0, frames, _CHUNK):
            z, log_neg = _logits(p[start : start + _CHUNK], np.float64)
            yc = y[start : start + _CHUNK].astype(np.float64)
            summing = ones[: z.shape[0]]  # column sums as products with ones (BLAS)
            before -= summing @ log_neg + np.einsum("ij,ij->j", z, yc)  # -log(1 - q) - y * z
            u = z if fitted.size == NUM_LABELS else z[:, fitted]
            yc = yc if fitted.size == NUM_LABELS else yc[:, fitted]
            u *= a
            u += b
            # softplus(u) - y * u, as log1p(exp(-|u|)) + max(u, 0) - y * u
            loss = np.abs(u)
            np.negative(loss, out=loss)
            np.exp(loss, out=loss)
            np.log1p(loss, out=loss)
            loss += np.maximum(u, 0.0)
            yc *= u
            loss -= yc
            after += summing @ loss
        before /= frames
        nll_after = before.copy()
        nll_after[fitted] = after / frames
        worse = ~(nll_after <= before)
        scale[worse], shift[worse], nll_after[worse] = 1.0, 0.0, before[worse]

        identity = [name for c, name in enumerate(LABELS) if scale[c] == 1.0 and shift[c] == 0.0]
        record = {
            "method": method,
            "frames": int(frames),
            "positives": {name: int(positives[c]) for c, name in enumerate(LABELS)},
            "identity": identity,
            "nll_before": {name: _rounded(before[c]) for c, name in enumerate(LABELS)},
            "nll_after": {name: _rounded(nll_after[c]) for c, name in enumerate(LABELS)},
        }
        return cls(scale.tolist(), shift.tolist(), method=method, fit=record)

    def to_dict(self) -> dict[str, Any]:
        """The JSON object of :meth:`save`: ``{"format", "version", "method", "labels": {label: {"scale",
        "shift"}}, "fit"}`` (``fit`` is ``null`` for a map that was not fitted)."""
        return {
            "format": _FORMAT,
            "version": _VERSION,
            "method": self._method,
            "labels": {
                name: {"scale": float(self._scale[c]), "shift": float(self._shift[c])} for c, name in enumerate(LABELS)
            },
            "fit": self.fit_info,
        }

    def save(self, path: str | os.PathLike) -> Path:
        """Write :meth:`to_dict` as JSON to ``path`` atomically; returns the path."""
        return atomic_write_json(path, self.to_dict())

    @classmethod
    def from_dict(cls, data: Any) -> ProbabilityCalibration:
        """The map of a :meth:`to_dict` object, every key checked.

        Raises:
            ValueError: a wrong format or version, an unknown or missing key or label, a non-finite number, a scale
                <= 0; one line naming the key.
        """
        _check_keys(data, "calibration", ("format", "version", "method", "labels"), ("fit",))
        if data["format"] != _FORMAT:
            raise ValueError(f"format must be {_FORMAT!r}, got {short_repr(data['format'])}")
        version = data["version"]
        if isinstance(version, bool) or version != _VERSION:
            raise ValueError(f"version must be {_VERSION}, got {short_repr(version)}")
        method = data["method"]
        _check_method(method)
        labels = _per_label_mapping(data["labels"], "labels")
        scale, shift = [], []
        for name in LABELS:
            _check_keys(labels[name], f"labels.{name}", ("scale", "shift"))
            a = _number(labels[name]["scale"], f"labels.{name}.scale")
            if a <= 0.0:
                raise ValueError(f"labels.{name}.scale must be > 0, got {a!r}")
            b = _number(labels[name]["shift"], f"labels.{name}.shift")
            if method == "temperature" and b != 0.0:
                raise ValueError(f"labels.{name}.shift must be 0 for method 'temperature', got {b!r}")
            scale.append(a)
            shift.append(b)
        return cls(scale, shift, method=method, fit=data.get("fit"))

    @classmethod
    def load(cls, path: str | os.PathLike) -> ProbabilityCalibration:
        """Read a file written by :meth:`save` (plain JSON; nothing in it is run or imported).

        Raises:
            FileNotFoundError: the file does not exist (named).
            ValueError: not a calibration file or an invalid key (see :meth:`from_dict`); one line naming the file
                and the key.
        """
        data = read_json_file(path, max_bytes=_MAX_FILE_BYTES, what="calibration file")
        try:
            return cls.from_dict(data)
        except ValueError as e:
            raise ValueError(f"calibration file {path}: {e}") from None


def load_calibration(path: str | os.PathLike | None, required: bool = False) -> ProbabilityCalibration | None:
    """The calibration map of ``path``, or ``None`` when no path is given or (unless ``required``) the file is missing.

    Raises:
        FileNotFoundError: ``required`` and no path is given or the file is missing; one line naming it.
        ValueError: the file exists but is invalid (see :meth:`ProbabilityCalibration.load`).
    """
    if path is None or (isinstance(path, str) and path == ""):
        if required:
            raise FileNotFoundError("a calibration file is required, but no path was given")
        return None
    try:
        return ProbabilityCalibration.load(path)
    except FileNotFoundError:
        if required:
            raise
        return None
