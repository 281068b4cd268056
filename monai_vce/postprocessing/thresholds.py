"""Per-class decision thresholds maximising F1 (an exact sweep over the sorted scores), and their JSON file keyed
by label name.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from monai_vce.labels import LABELS, label_index
from monai_vce.utils import atomic_write_json, read_json_file

__all__ = [
    "DEFAULT_THRESHOLD",
    "optimize_thresholds",
    "grid_thresholds",
    "f1_at_thresholds",
    "save_thresholds",
    "load_thresholds",
]

#: Threshold of a class without any usable validation positive (see ``docs/design/decoding.md``).
DEFAULT_THRESHOLD: float = 0.5


def _check_inputs(probs: Any, targets: Any) -> tuple[np.ndarray, np.ndarray]:
    p = np.asarray(probs, dtype=np.float64)
    y = np.asarray(targets)
    if p.ndim != 2 or p.shape != y.shape:
        raise ValueError(f"probs and targets must both be (N, C) arrays of the same shape, got {p.shape} and {y.shape}")
    if not np.isfinite(p).all():
        raise ValueError(f"probs contain {int((~np.isfinite(p)).sum())} non-finite values")
    return p, (y >= 0.5) if y.dtype != bool else y


def optimize_thresholds(
    probs: Any,
    targets: Any,
    min_threshold: float = 0.05,
    max_threshold: float = 0.95,
    default_threshold: float | None = None,
    return_f1: bool = False,
) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
    """The F1-maximising threshold of each class (exact sweep over the sorted scores; see ``docs/design/decoding.md``).

    Args:
        probs: (N, C) probabilities (or any scores).
        targets: (N, C) targets, positive where ``>= 0.5``.
        min_threshold: lowest allowed threshold.
        max_threshold: highest allowed threshold.
        default_threshold: threshold of classes where no threshold in range has F1 > 0; ``None``:
            :data:`DEFAULT_THRESHOLD` clipped into ``[min_threshold, max_threshold]``.
        return_f1: also return the F1 reached by each class's threshold (0 for defaulted classes).

    Returns:
        ``thresholds`` (C,) float64, or ``(thresholds, f1)`` with ``return_f1=True``.
    """
    if not min_threshold <= max_threshold:
        raise ValueError(f"min_threshold {min_threshold} must not exceed max_threshold {max_threshold}")
    default = (
        min(max(DEFAULT_THRESHOLD, min_threshold), max_threshold) if default_threshold is None else default_threshold
    )
    default = float(default)
    p, y = _check_inputs(probs, targets)
    n, c = p.shape
    thresholds = np.full(c, default, dtype=np.float64)
    best_f1 = np.zeros(c, dtype=np.float64)
    if n == 0:
        return (thresholds, best_f1) if return_f1 else thresholds
    k = np.arange(1, n + 1, dtype=np.float64)
    # one class at a time keeps memory O(N) for a whole validation set; each pass is vectorised over frames
    for j in range(c):
        order = np.argsort(-p[:, j], kind="stable")
        s = p[order, j]
        n_pos = int(y[:, j].sum())
        if n_pos == 0:
            continue
        tp = np.cumsum(y[order, j], dtype=np.float64)
        f1 = 2.0 * tp / (k + n_pos)  # 2TP / (2TP + FP + FN) with TP + FP = k, TP + FN = n_pos
        nxt = np.empty_like(s)
        nxt[:-1] = s[1:]
        nxt[-1] = -np.inf
        # a cut is realisable when it separates distinct scores and its interval (nxt, s] meets the range
        valid = (s > nxt) & (s >= min_threshold) & (nxt < max_threshold)
        f1 = np.where(valid, f1, -1.0)
        best = int(np.argmax(f1))
        if f1[best] <= 0:
            continue
        t = (s[best] + nxt[best]) / 2.0 if best < n - 1 else s[best] / 2.0
        thresholds[j] = min(max(t, min_threshold), max_threshold)
        best_f1[j] = f1[best]
    return (thresholds, best_f1) if return_f1 else thresholds


def grid_thresholds(
    probs: Any,
    targets: Any,
    start: float = 0.15,
    rare_start: float = 0.05,
    rare_fraction: float = 0.01,
    stop: float = 0.85,
    step: float = 0.02,
    no_support_threshold: float = 0.2,
    default_threshold: float = 0.5,
) -> tuple[np.ndarray, np.ndarray]:
    """The authors' grid search: per class, the first threshold of ``np.arange(lo, stop, step)`` with the best F1.

    Args:
        probs: (N, C) probabilities.
        targets: (N, C) targets, positive where ``>= 0.5``.
        start: grid start of common classes.
        rare_start: grid start of rare classes (fewer than ``rare_fraction * N`` positives).
        rare_fraction: support fraction below which a class is rare.
        stop: grid end (exclusive, as ``np.arange``).
        step: grid step.
        no_support_threshold: threshold of classes without positives.
        default_threshold: threshold of classes where no grid point has F1 > 0.

    Returns:
        ``(thresholds, f1)``, both (C,) float64 (f1 is 0 for classes without positives or without F1 > 0).
    """
    p, y = _check_inputs(probs, targets)
    if p.shape[0] == 0 or p.shape[1] == 0:
        raise ValueError(f"probs and targets must be non-empty, got shape {p.shape}")
    n, c = p.shape
    support = y.sum(axis=0)
    rare = support < n * rare_fraction
    thresholds = np.full(c, float(default_threshold), dtype=np.float64)
    best_f1 = np.zeros(c, dtype=np.float64)
    for lo, cols in ((rare_start, rare & (support > 0)), (start, ~rare & (support > 0))):
        if not cols.any():
            continue
        pc, yc = p[:, cols], y[:, cols]
        bt = np.full(pc.shape[1], float(default_threshold))
        bf = np.zeros(pc.shape[1])
        # strict > over the grid in order: the first best grid point wins, as in the reference
        for t in np.arange(lo, stop, step):
            pred = pc >= t
            tp = (pred & yc).sum(axis=0)
            denom = pred.sum(axis=0) + yc.sum(axis=0)
            f = np.where(denom > 0, 2.0 * tp / np.maximum(denom, 1), 0.0)
            better = f > bf
            bf = np.where(better, f, bf)
            bt = np.where(better, t, bt)
        thresholds[cols], best_f1[cols] = bt, bf
    thresholds[support == 0] = float(no_support_threshold)
    return thresholds, best_f1


def f1_at_thresholds(probs: Any, targets: Any, thresholds: Any) -> np.ndarray:
    """Per-class F1 of the rule ``prob >= threshold`` (0 for a class with no positive and no prediction).

    Args:
        probs: (N, C) probabilities.
        targets: (N, C) targets, positive where ``>= 0.5``.
        thresholds: (C,) thresholds.
    """
    p, y = _check_inputs(probs, targets)
    pred = p >= np.asarray(thresholds, dtype=np.float64)[None, :]
    tp = (pred & y).sum(axis=0)
    denom = pred.sum(axis=0) + y.sum(axis=0)
    return np.where(denom > 0, 2.0 * tp / np.maximum(denom, 1), 0.0)


def _as_label_dict(thresholds: Any, labels: Sequence[str]) -> dict[str, float]:
    if isinstance(thresholds, Mapping):
        values = {LABELS[label_index(k)]: v for k, v in thresholds.items()}
    else:
        arr = np.asarray(thresholds, dtype=np.float64).reshape(-1)
        if arr.shape[0] != len(labels):
            raise ValueError(f"expected {len(labels)} thresholds in LABELS order, got {arr.shape[0]}")
        values = dict(zip(labels, arr.tolist(), strict=False))
    return values


def _validate(values: Mapping[str, Any], source: str) -> dict[str, float]:
    problems = []
    unknown = [k for k in values if k not in LABELS]
    if unknown:
        problems.append(f"unknown labels {unknown}")
    missing = [name for name in LABELS if name not in values]
    if missing:
        problems.append(f"missing labels {missing}")
    out = {}
    for name in LABELS:
        if name not in values:
            continue
        v = values[name]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not 0.0 <= v <= 1.0:
            problems.append(f"{name!r}: {v!r} is not a number in [0, 1]")
        else:
            out[name] = float(v)
    if problems:
        raise ValueError(f"invalid thresholds in {source}: " + "; ".join(problems))
    return out


def save_thresholds(path: str | os.PathLike, thresholds: Any) -> Path:
    """Write per-class thresholds as JSON keyed by label name, atomically.

    Args:
        path: destination file (e.g. ``models/thresholds.json`` next to the checkpoint).
        thresholds: (17,) values in :data:`LABELS` order, or a mapping label name -> value.

    Returns:
        The path written.
    """
    values = _validate(_as_label_dict(thresholds, LABELS), source=f"thresholds to write to {path}")
    return atomic_write_json(path, {name: values[name] for name in LABELS})


def load_thresholds(path: str | os.PathLike) -> np.ndarray:
    """Read a thresholds file written by :func:`save_thresholds`.

    Returns:
        (17,) float64 thresholds in :data:`LABELS` order.

    Raises:
        FileNotFoundError: the file does not exist (named).
        ValueError: the file is not JSON, not an object, lacks or adds labels, or holds values outside [0, 1]
            (the message names the file and the offending labels).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"thresholds file not found: {path}")
    obj = read_json_file(path, max_bytes=16 * 1024**2, what="thresholds file")  # strict: no label given twice
    if not isinstance(obj, dict):
        raise ValueError(
            f"thresholds file {path} must hold a JSON object keyed by label name, got {type(obj).__name__}"
        )
    values = _validate(obj, source=str(path))
    return np.asarray([values[name] for name in LABELS], dtype=np.float64)
