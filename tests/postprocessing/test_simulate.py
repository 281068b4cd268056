"""The simulator's noise families each change the structure they name, and leave the levels' draws alone."""

from __future__ import annotations

import numpy as np
import pytest

from monai_vce.inference.interpolation import logit
from monai_vce.labels import LABELS, NUM_LABELS, PATHOLOGY
from monai_vce.postprocessing import NOISE_FAMILIES, NOISE_LEVELS, noise_settings, simulate_probabilities
from monai_vce.postprocessing.simulate import RED_LABELS

QUIET = {"sigma": 0.0, "flicker": 0.0, "fp_rate": 0.0, "miss_prob": 0.0}


def _truth() -> np.ndarray:
    truth = np.zeros((4000, NUM_LABELS), bool)
    truth[:2000, 2] = truth[2000:, 3] = True
    for start in range(100, 4000, 200):  # 2-frame lesions and 40-frame ones
        truth[start : start + 2, LABELS.index("ulcer")] = True
        truth[start + 50 : start + 90, LABELS.index("blood")] = True
    return truth


def test_families_are_medium_with_their_keys():
    for name, keys in NOISE_FAMILIES.items():
        assert noise_settings(name) == {**NOISE_LEVELS["medium"], **keys}
    assert noise_settings("low") == NOISE_LEVELS["low"]
    with pytest.raises(ValueError, match="unknown noise level or family 'extreme'"):
        noise_settings("extreme")


def test_family_keys_switched_off_give_the_medium_draw():
    off = {"ramp_max": 0, "group_sigma": 0.0, "group_fp_rate": 0.0, "video_miss_prob": 0.0, "scale": 1.0, "shift": 0.0}
    np.testing.assert_array_equal(
        simulate_probabilities(_truth(), off, seed=4), simulate_probabilities(_truth(), "medium", seed=4)
    )


def test_ramp_spreads_each_boundary_over_several_frames():
    truth = _truth()
    step = logit(simulate_probabilities(truth, QUIET, seed=0))[:, 2]
    ramp = logit(simulate_probabilities(truth, {**noise_settings("ramp"), **QUIET}, seed=0))[:, 2]
    levels = lambda z: np.unique(np.round(z[1980:2020], 4)).size  # noqa: E731
    assert levels(step) == 2 and 3 <= levels(ramp) - 1 <= 15


def test_white_and_correlated_noise_have_their_autocorrelation():
    truth = np.zeros((20_000, NUM_LABELS), bool)
    lag1 = {}
    for name in ("white", "correlated"):
        z = logit(simulate_probabilities(truth, {**noise_settings(name), "flicker": 0.0, "fp_rate": 0.0}, seed=1))
        lag1[name] = np.mean([np.corrcoef(z[:-1, c], z[1:, c])[0, 1] for c in range(NUM_LABELS)])
    assert abs(lag1["white"]) < 0.05 and lag1["correlated"] > 0.95


def test_red_family_correlates_the_red_labels_only():
    truth = np.zeros((20_000, NUM_LABELS), bool)
    z = logit(simulate_probabilities(truth, {**noise_settings("red"), "flicker": 0.0, "fp_rate": 0.0}, seed=2))
    r = np.corrcoef(z.T)
    red = [LABELS.index(n) for n in RED_LABELS]
    assert min(r[a, b] for a in red for b in red if a < b) > 0.3
    assert abs(r[LABELS.index("ulcer"), LABELS.index("polyp")]) < 0.1
    assert abs(r[red[0], LABELS.index("ulcer")]) < 0.1


def test_blind_videos_miss_every_short_lesion_and_keep_the_long_ones():
    truth = _truth()
    blind = {**noise_settings("blind"), **QUIET, "video_miss_prob": 1.0}
    p = simulate_probabilities(truth, blind, seed=3)
    ulcer, blood = LABELS.index("ulcer"), LABELS.index("blood")
    assert p[truth[:, ulcer], ulcer].max() < 0.5 < p[truth[:, blood], blood].min()
    assert "ulcer" in PATHOLOGY and "stomach" not in PATHOLOGY
    assert p[truth[:, 2], 2].min() > 0.5  # anatomy is never missed


def test_bursts_add_false_positive_stretches():
    truth = _truth()
    quiet = {"sigma": 0.0, "flicker": 0.0, "miss_prob": 0.0}

    def fp(name: str) -> float:
        return float((simulate_probabilities(truth, {**noise_settings(name), **quiet}, seed=5)[~truth] > 0.5).mean())

    assert fp("bursts") > 3 * fp("medium") > 0


def test_miscalibrated_rescales_the_medium_logits():
    truth = _truth()
    medium = logit(simulate_probabilities(truth, "medium", seed=6).astype(np.float64))
    miscal = logit(simulate_probabilities(truth, "miscalibrated", seed=6).astype(np.float64))
    np.testing.assert_allclose(miscal, 0.5 * medium - 1.0, atol=2e-3)
