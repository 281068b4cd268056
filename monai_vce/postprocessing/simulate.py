"""Simulated per-frame probabilities from ground-truth timelines, for benchmarks and tests of the decoder.

Logit = separability + calibration offset + false-positive bursts + AR(1) noise, after missed events and flicker;
levels in :data:`NOISE_LEVELS`, structurally different families in :data:`NOISE_FAMILIES`, reproducible by seed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from scipy.ndimage import uniform_filter1d
from scipy.signal import lfilter

from ..events.runs import run_bounds
from ..labels import LABELS, PATHOLOGY

__all__ = ["NOISE_LEVELS", "NOISE_FAMILIES", "RED_LABELS", "CLASS_MARGIN", "CLASS_BIAS", "noise_settings"]
__all__ += ["simulate_probabilities"]

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

#: Noise families: ``medium`` with one structural change each, unlike the step-at-the-boundary model of the levels
#: (``docs/design/decoding.md``). Keys beyond the levels': ``ramp_min`` / ``ramp_max`` (boundaries ramped over that
#: many frames), ``group_sigma`` / ``group_fp_rate`` (noise and bursts shared by :data:`RED_LABELS`),
#: ``video_miss_prob`` (a video misses all its short lesions), ``scale`` / ``shift`` (logit ``z * scale + shift``).
NOISE_FAMILIES: dict[str, dict[str, float]] = {
    "ramp": {"ramp_min": 3, "ramp_max": 15},
    "white": {"rho": 0.0},
    "correlated": {"rho": 0.99},
    "red": {"group_sigma": 1.2, "group_fp_rate": 6.0},
    "blind": {"video_miss_prob": 0.3},
    "bursts": {"fp_rate": 12.0, "fp_length": 15.0},
    "miscalibrated": {"scale": 0.5, "shift": -1.0},
}

#: Labels whose errors the ``red`` family correlates: a frame that looks red raises them together.
RED_LABELS: tuple[str, ...] = ("active bleeding", "blood", "erythema", "hematin")

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


def noise_settings(name: str) -> dict[str, float]:
    """The settings of a noise level or family by name (a family is ``medium`` with its keys overridden)."""
    if name in NOISE_LEVELS:
        return dict(NOISE_LEVELS[name])
    if name in NOISE_FAMILIES:
        return {**NOISE_LEVELS["medium"], **NOISE_FAMILIES[name]}
    raise ValueError(f"unknown noise level or family {name!r}; expected one of {[*NOISE_LEVELS, *NOISE_FAMILIES]}")


def _ramp(s: np.ndarray, widths: np.ndarray) -> np.ndarray:
    """Moving average of each column of ``s`` over its width: a step becomes a linear ramp of that many frames."""
    out = s.copy()
    for w in np.unique(widths):
        cols = np.flatnonzero(widths == w)
        out[:, cols] = uniform_filter1d(s[:, cols], size=int(w), axis=0, mode="nearest")
    return out


def _ar1(rng: np.random.Generator, rho: float, shape: tuple[int, int]) -> np.ndarray:
    """AR(1) noise of unit stationary variance along axis 0, started from the stationary distribution."""
    eps = rng.standard_normal(shape)
    # initial state drawn from the stationary distribution, so the first frames are as noisy as the rest
    zi = rho * rng.standard_normal((1, shape[1]))
    noise, _ = lfilter([np.sqrt(1.0 - rho**2)], [1.0, -rho], eps, axis=0, zi=zi)
    return noise


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
        level: a key of :data:`NOISE_LEVELS` or :data:`NOISE_FAMILIES`, or a dict of settings over ``medium``'s
            (the levels' keys, ``flicker_length`` and the families' keys).
        seed: seed or generator of the random draw.
        margin: per-label separability overriding :data:`CLASS_MARGIN`.
        bias: per-label calibration offset overriding :data:`CLASS_BIAS`.
    """
    y = np.asarray(truth).astype(bool)
    if y.ndim != 2 or y.shape[1] != len(LABELS):
        raise ValueError(f"truth: expected a (T, {len(LABELS)}) mask, got shape {y.shape}")
    if isinstance(level, str):
        cfg: dict[str, Any] = noise_settings(level)
    else:
        cfg = {**NOISE_LEVELS["medium"], **dict(level)}
    rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
    T, C = y.shape
    m = np.array([(margin or CLASS_MARGIN)[n] for n in LABELS]) * cfg["margin_scale"]
    b = np.array([(bias or CLASS_BIAS)[n] for n in LABELS])

    # missed short events
    cls, start, stop = run_bounds(y, True)
    miss = ((stop - start) < cfg["miss_length"]) & (rng.random(cls.size) < cfg["miss_prob"])
    video_miss = float(cfg.get("video_miss_prob", 0.0))
    if video_miss > 0.0 and rng.random() < video_miss:  # this video misses every short lesion
        pathology = np.isin(cls, [LABELS.index(n) for n in PATHOLOGY])
        miss |= pathology & ((stop - start) < cfg["miss_length"])
    if miss.any():
        y = y & ~_cover_runs(T, C, cls[miss], start[miss], stop[miss])
    s = np.where(y, 1.0, -1.0)
    if cfg.get("ramp_max", 0) > 1:
        s = _ramp(s, np.asarray(rng.integers(int(cfg["ramp_min"]), int(cfg["ramp_max"]) + 1, size=C)))
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
    z += cfg["sigma"] * _ar1(rng, rho, (T, C))
    red = [LABELS.index(n) for n in RED_LABELS]
    if cfg.get("group_sigma", 0.0) > 0.0:  # one latent "redness" shared by the red labels
        z[:, red] += cfg["group_sigma"] * _ar1(rng, rho, (T, 1))
    n_red = rng.poisson(cfg["group_fp_rate"] * T / 10_000.0) if cfg.get("group_fp_rate", 0.0) > 0.0 else 0
    if n_red:  # red-looking stretches raise every red label at once
        rstart = rng.integers(0, max(T, 1), size=n_red)
        rlen = rng.geometric(1.0 / max(cfg["fp_length"], 1.0), size=n_red)
        cover = _cover_runs(T, 1, np.zeros(n_red, dtype=np.int64), rstart, rstart + rlen)
        z[:, red] += cover * (2.0 * m[red])[None, :]
    z = z * float(cfg.get("scale", 1.0)) + float(cfg.get("shift", 0.0))
    return (1.0 / (1.0 + np.exp(-z))).astype(np.float32)
