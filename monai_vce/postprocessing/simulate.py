"""Simulated per-frame probabilities from ground-truth timelines, for benchmarks and tests of the decoder.

Logit = separability + calibration offset + false-positive bursts + AR(1) noise, after missed events and flicker;
levels in :data:`NOISE_LEVELS`, reproducible by seed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from scipy.signal import lfilter

from ..events.runs import run_bounds
from ..labels import LABELS

__all__ = ["NOISE_LEVELS", "CLASS_MARGIN", "CLASS_BIAS", "simulate_probabilities"]

#: Noise parameter sets, from easy to hard.
NOISE_LEVELS: dict[str, dict[str, float]] = {
    "low": {
        "margin_scale": 1.3,
        "sigma": 0.8,
        "rho": 0.9,
        "flicker": 0.01,
        "miss_prob": 0.1,
        "miss_length": 10,
        "fp_rate": 1.0,
        "fp_length": 8.0,
    },
    "medium": {
        "margin_scale": 1.0,
        "sigma": 1.2,
        "rho": 0.9,
        "flicker": 0.03,
        "miss_prob": 0.25,
        "miss_length": 10,
        "fp_rate": 3.0,
        "fp_length": 10.0,
    },
    "high": {
        "margin_scale": 0.8,
        "sigma": 1.6,
        "rho": 0.93,
        "flicker": 0.06,
        "miss_prob": 0.4,
        "miss_length": 15,
        "fp_rate": 6.0,
        "fp_length": 12.0,
    },
}

#: Separability (logit half-distance) per label at ``margin_scale`` 1.
CLASS_MARGIN: dict[str, float] = {
    "mouth": 2.0, "esophagus": 2.0, "stomach": 2.5, "small intestine": 2.5, "colon": 2.5,
    "z-line": 1.2, "pylorus": 1.2, "ileocecal valve": 1.2,
    "active bleeding": 2.0, "angiectasia": 1.3, "blood": 2.0, "erosion": 1.0, "erythema": 1.0,
    "hematin": 1.5, "lymphangioectasis": 1.3, "polyp": 1.2, "ulcer": 1.5,
}  # fmt: skip

#: Calibration offset of the logit per label.
CLASS_BIAS: dict[str, float] = {
    "mouth": -0.3, "esophagus": -0.3, "stomach": 0.0, "small intestine": 0.3, "colon": 0.0,
    "z-line": -0.6, "pylorus": -0.6, "ileocecal valve": -0.6,
    "active bleeding": -0.5, "angiectasia": -0.7, "blood": -0.3, "erosion": -0.8, "erythema": -0.8,
    "hematin": -0.5, "lymphangioectasis": -0.7, "polyp": -0.7, "ulcer": -0.6,
}  # fmt: skip


def _cover_runs(T: int, C: int, cls: np.ndarray, start: np.ndarray, stop: np.ndarray) -> np.ndarray:
    """(T, C) bool mask covering half-open intervals [start, stop) of the given classes (overlaps allowed)."""
    delta = np.zeros((C, T + 1), dtype=np.int32)
    np.add.at(delta, (cls, np.clip(start, 0, T)), 1)
    np.add.at(delta, (cls, np.clip(stop, 0, T)), -1)
    return (np.cumsum(delta[:, :T], axis=1) > 0).T


def simulate_probabilities(
    truth: np.ndarray,
    level: str | Mapping[str, float] = "medium",
    seed: int | np.random.Generator | None = 0,
    margin: Mapping[str, float] | None = None,
    bias: Mapping[str, float] | None = None,
) -> np.ndarray:
    """Simulate ``(T, 17)`` float32 frame probabilities from a ground-truth mask (see ``docs/design/decoding.md``).

    Args:
        truth: ``(T, 17)`` boolean ground truth in :data:`~monai_vce.labels.LABELS` order.
        level: a key of :data:`NOISE_LEVELS` or a dict with the same keys (plus, optionally, ``flicker_length``).
        seed: seed or generator of the random draw.
        margin: per-label separability overriding :data:`CLASS_MARGIN`.
        bias: per-label calibration offset overriding :data:`CLASS_BIAS`.
    """
    y = np.asarray(truth).astype(bool)
    if y.ndim != 2 or y.shape[1] != len(LABELS):
        raise ValueError(f"truth: expected a (T, {len(LABELS)}) mask, got shape {y.shape}")
    if isinstance(level, str):
        if level not in NOISE_LEVELS:
            raise ValueError(f"unknown noise level {level!r}; expected one of {list(NOISE_LEVELS)}")
        cfg: dict[str, Any] = dict(NOISE_LEVELS[level])
    else:
        cfg = {**NOISE_LEVELS["medium"], **dict(level)}
    rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
    T, C = y.shape
    m = np.array([(margin or CLASS_MARGIN)[n] for n in LABELS]) * cfg["margin_scale"]
    b = np.array([(bias or CLASS_BIAS)[n] for n in LABELS])

    # missed short events
    cls, start, stop = run_bounds(y, True)
    miss = ((stop - start) < cfg["miss_length"]) & (rng.random(cls.size) < cfg["miss_prob"])
    if miss.any():
        y = y & ~_cover_runs(T, C, cls[miss], start[miss], stop[miss])
    s = np.where(y, 1.0, -1.0)
    # flicker
    flicker_length = float(cfg.get("flicker_length", 1.0))
    if flicker_length > 1.0:
        n_runs = rng.poisson(cfg["flicker"] * T / flicker_length, size=C)
        fcls = np.repeat(np.arange(C), n_runs)
        fstart = rng.integers(0, max(T, 1), size=fcls.size)
        flen = rng.geometric(1.0 / flicker_length, size=fcls.size)
        s[_cover_runs(T, C, fcls, fstart, fstart + flen)] *= -1.0
    else:
        s[rng.random((T, C)) < cfg["flicker"]] *= -1.0
    z = s * m + b
    # false-positive bursts
    n_bursts = rng.poisson(cfg["fp_rate"] * T / 10_000.0, size=C)
    if n_bursts.sum():
        bcls = np.repeat(np.arange(C), n_bursts)
        bstart = rng.integers(0, max(T, 1), size=bcls.size)
        blen = rng.geometric(1.0 / max(cfg["fp_length"], 1.0), size=bcls.size)
        cover = _cover_runs(T, C, bcls, bstart, bstart + blen)
        z += cover * (2.0 * m)[None, :]
    # AR(1) noise with stationary standard deviation sigma
    rho = float(cfg["rho"])
    eps = rng.standard_normal((T, C))
    # initial state drawn from the stationary distribution, so the first frames are as noisy as the rest
    zi = rho * rng.standard_normal((1, C))
    noise, _ = lfilter([np.sqrt(1.0 - rho**2)], [1.0, -rho], eps, axis=0, zi=zi)
    z += cfg["sigma"] * noise
    return (1.0 / (1.0 + np.exp(-z))).astype(np.float32)
