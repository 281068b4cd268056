"""Reduced inference: strided, coarse-to-fine and near-duplicate skipping (monai_vce.inference)."""

from __future__ import annotations

import numpy as np
import pytest

from monai_vce.inference import (
    DecoderTarget,
    adaptive_inference,
    dilate_frames,
    duplicate_anchors,
    interpolate_probs,
    resolve_budget,
    signature_distance,
    strided_rows,
)
from monai_vce.labels import LABELS, NUM_LABELS, SECTIONS
from monai_vce.postprocessing import DecoderParams, EventDecoder


class Lookup:
    """A network replaced by a table: records every call."""

    def __init__(self, probs: np.ndarray) -> None:
        self.probs = probs
        self.calls: list[np.ndarray] = []

    def __call__(self, rows: np.ndarray) -> np.ndarray:
        assert rows.dtype == np.int64
        self.calls.append(rows.copy())
        return self.probs[rows]

    @property
    def rows(self) -> np.ndarray:
        return np.concatenate(self.calls) if self.calls else np.zeros(0, np.int64)


def noisy_probs(T: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    z = rng.normal(0, 1.5, (T, NUM_LABELS)).cumsum(axis=0) * 0.2 + rng.normal(0, 1, (T, NUM_LABELS))
    return (1 / (1 + np.exp(-z))).astype(np.float32)


def clear_video(T: int = 6000, seed: int = 0) -> np.ndarray:
    """Sections in gut order, one pathology event, a landmark at a boundary; confident, mildly noisy scores."""
    rng = np.random.default_rng(seed)
    truth = np.zeros((T, NUM_LABELS), bool)
    bounds = [0, 150, 300, 900, 4500, T]
    for k, name in enumerate(SECTIONS):
        truth[bounds[k] : bounds[k + 1], LABELS.index(name)] = True
    truth[895:905, LABELS.index("pylorus")] = True
    truth[1200:1260, LABELS.index("ulcer")] = True
    truth[1500:1530, LABELS.index("blood")] = True
    z = np.where(truth, 4.0, -4.0) + rng.normal(0, 0.3, truth.shape)
    return (1 / (1 + np.exp(-z))).astype(np.float32)


CLEAR_DECODER = DecoderParams(
    {
        "anatomy": {"enabled": True, "emission_weight": 0.1, "switch_cost": 2.5, "skip_cost": 2.5, "entry_cost": 0.0},
        "labels": {n: {"median_window": 5, "max_gap": 2, "min_length": 3} for n in LABELS},
    }
)


# -------------------------------------------------------------------------------------------------- contract
def test_stride_one_is_full_inference():
    P = noisy_probs(500)
    look = Lookup(P)
    probs, inferred = adaptive_inference(look, 500, stride=1)
    assert len(look.calls) == 1 and np.array_equal(look.calls[0], np.arange(500))
    assert probs.dtype == np.float32 and np.array_equal(probs, P)
    assert inferred.dtype == bool and inferred.all()


@pytest.mark.parametrize(
    "kwargs",
    [
        {"stride": 4, "refine": False},
        {"stride": 16},
        {"stride": 8, "budget": 0.1},
        {"stride": 3, "budget": 7, "interpolation": "nearest"},
        {"stride": 8, "refine": False, "interpolation": "linear"},
    ],
)
def test_every_frame_gets_probabilities_exact_where_inferred(kwargs):
    T = 997
    P = noisy_probs(T, seed=1)
    look = Lookup(P)
    probs, inferred = adaptive_inference(look, T, CLEAR_DECODER, **kwargs)
    assert probs.shape == (T, NUM_LABELS) and probs.dtype == np.float32
    assert np.isfinite(probs).all() and probs.min() >= 0 and probs.max() <= 1
    # the mask is exactly the rows predict saw, each once, and their probabilities are returned bit for bit
    rows = look.rows
    assert np.unique(rows).size == rows.size
    assert np.array_equal(np.flatnonzero(inferred), np.sort(rows))
    assert np.array_equal(probs[inferred], P[inferred])
    # events cover every frame id: decoded in the video's own ids, each event inside them
    ids = np.arange(T) * 5 + 3
    events = EventDecoder(CLEAR_DECODER)(probs, ids)
    for e in events:
        # the gap rule: an event ends where the next frame begins (or at the video's last frame)
        assert e["start"] in ids and (e["end"] + 1 in ids or e["end"] == ids[-1]) and e["start"] <= e["end"]


def test_strided_rows_and_budget():
    assert strided_rows(10, 4).tolist() == [0, 4, 8, 9]
    assert strided_rows(1, 8).tolist() == [0]
    thinned = strided_rows(1000, 2, budget=10)
    assert thinned.size == 10 and thinned[0] == 0 and thinned[-1] == 999
    assert resolve_budget(None, 50) == 50
    assert resolve_budget(0.1, 1000) == 100
    assert resolve_budget(5000, 1000) == 1000


@pytest.mark.parametrize("budget", [25, 0.05, 130])
def test_budget_is_respected(budget):
    T = 2000
    look = Lookup(noisy_probs(T, seed=2))
    _probs, inferred = adaptive_inference(look, T, CLEAR_DECODER, stride=4, budget=budget)
    limit = budget if isinstance(budget, int) else int(np.ceil(budget * T))
    assert look.rows.size == inferred.sum() <= limit
    # a budget that cuts refinement short still spends itself (noise leaves plenty to refine)
    assert inferred.sum() >= 0.9 * limit


def test_refinement_converges_to_full_inference_events():
    T = 6000
    P = clear_video(T)
    ids = np.arange(T)
    decoder = EventDecoder(CLEAR_DECODER)

    def events(probs):  # the same events; their confidence order may differ where scores nearly tie
        return sorted((e["start"], e["end"], tuple(e["label"])) for e in decoder(probs, ids))

    full = events(P)
    assert len(full) >= 8
    for stride in (8, 16, 32):
        look = Lookup(P)
        probs, inferred = adaptive_inference(look, T, CLEAR_DECODER, stride=stride)
        assert events(probs) == full, f"stride {stride}"
        assert inferred.mean() < 0.2, f"stride {stride}: {inferred.mean():.2f}"
        # strided inference alone misses the event boundaries at these strides
    strided, _ = adaptive_inference(Lookup(P), T, CLEAR_DECODER, stride=32, refine=False)
    assert events(strided) != full


def test_refinement_rounds_and_callback():
    T = 6000
    P = clear_video(T)
    look = Lookup(P)
    seen = []
    _probs, inferred = adaptive_inference(
        look, T, CLEAR_DECODER, stride=16, max_rounds=1, callback=lambda k, n: seen.append((k, n))
    )
    assert len(look.calls) == 2  # the strided pass and one refinement round
    assert seen == [(int(look.calls[0].size), T), (int(inferred.sum()), T)]


def test_empty_and_single_frame_videos():
    probs, inferred = adaptive_inference(Lookup(noisy_probs(1)), 0)
    assert probs.shape == (0, NUM_LABELS) and inferred.shape == (0,)
    P = noisy_probs(1)
    probs, inferred = adaptive_inference(Lookup(P), 1, stride=8)
    assert np.array_equal(probs, P) and inferred.tolist() == [True]


def test_decoder_accepts_paths_and_dicts(tmp_path):
    path = CLEAR_DECODER.save(tmp_path / "decoder.json")
    P = clear_video(1200)
    a = adaptive_inference(Lookup(P), 1200, path, stride=8)
    b = adaptive_inference(Lookup(P), 1200, CLEAR_DECODER.to_dict(), stride=8)
    c = adaptive_inference(Lookup(P), 1200, EventDecoder(CLEAR_DECODER), stride=8)
    assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], c[1])


def test_never_emitted_labels_are_not_refined():
    # with every label "never" emitted and anatomy off, nothing the frames could show changes the events
    params = DecoderParams({"labels": {n: {"presence": {"feature": "never"}} for n in LABELS}})
    look = Lookup(noisy_probs(1000, seed=3))
    _, inferred = adaptive_inference(look, 1000, params, stride=10)
    assert inferred.sum() == strided_rows(1000, 10).size


# ------------------------------------------------------------------------------------------------ pieces
def test_interpolation_is_linear_in_logits():
    known = np.zeros(5, bool)
    known[[0, 4]] = True
    values = np.zeros((5, NUM_LABELS), np.float32)
    values[0], values[4] = 0.1, 0.9
    out = interpolate_probs(known, values)
    np.testing.assert_allclose(out[2], 0.5, atol=1e-6)
    z = np.log(out[1] / (1 - out[1]))
    np.testing.assert_allclose(z, 0.75 * np.log(1 / 9) + 0.25 * np.log(9), atol=1e-5)
    assert out[0, 0] == np.float32(0.1) and out[4, 0] == np.float32(0.9)
    with pytest.raises(ValueError, match="interpolation mode"):
        interpolate_probs(known, values, mode="cubic")


def test_dilate_frames_matches_a_loop():
    rng = np.random.default_rng(0)
    mask = rng.random((60, 3)) < 0.05
    reach = np.array([0, 2, 5])
    out = dilate_frames(mask, reach)
    for c in range(3):
        for t in range(60):
            lo, hi = max(0, t - reach[c]), min(60, t + reach[c] + 1)
            assert out[t, c] == mask[lo:hi, c].any()


def test_open_frames_are_unknown_and_empty_when_all_known():
    P = clear_video(600)
    target = DecoderTarget(CLEAR_DECODER)
    known = np.zeros(600, bool)
    known[strided_rows(600, 16)] = True
    open_rows = target.open_frames(P, known)
    assert open_rows.any() and not (open_rows & known).any()
    assert not target.open_frames(P, np.ones(600, bool)).any()


def reference_anchors(sig: np.ndarray, tol: float, max_reuse: int) -> np.ndarray:
    """The greedy walk, one frame at a time."""
    anchors = np.arange(len(sig))
    last, run = 0, 0
    for t in range(1, len(sig)):
        if run < max_reuse and signature_distance(sig[t], sig[last]) <= tol:
            anchors[t] = last
            run += 1
        else:
            last, run = t, 0
    return anchors


@pytest.mark.parametrize("tol,max_reuse", [(0.0, 8), (3.0, 4), (6.0, 64), (1000.0, 5)])
def test_duplicate_anchors_follow_the_greedy_walk(tol, max_reuse):
    rng = np.random.default_rng(7)
    # a lingering capsule: a slowly drifting scene with jumps
    sig = np.cumsum(rng.normal(0, 2.0, (300, 16)), axis=0) + np.repeat(rng.normal(0, 40, (10, 16)), 30, axis=0)
    sig = np.clip(sig + 128, 0, 255).astype(np.uint8)
    got = duplicate_anchors(sig, tol, max_reuse)
    assert np.array_equal(got, reference_anchors(sig, tol, max_reuse))
    if tol == 0:
        assert np.array_equal(got, np.arange(300))


def test_duplicates_reuse_the_last_inferred_frame():
    T = 200
    P = noisy_probs(T, seed=4)
    sig = np.zeros((T, 4), np.uint8)
    sig[:, 0] = np.repeat(np.arange(20) * 10, 10)  # 20 scenes of 10 identical frames
    look = Lookup(P)
    probs, inferred = adaptive_inference(look, T, stride=1, signatures=sig, duplicate_tolerance=1.0)
    assert np.array_equal(np.flatnonzero(inferred), np.arange(0, T, 10))
    assert np.array_equal(probs, P[np.repeat(np.arange(0, T, 10), 10)])
    # tolerance 0 turns skipping off
    probs0, inferred0 = adaptive_inference(Lookup(P), T, stride=1, signatures=sig, duplicate_tolerance=0.0)
    assert inferred0.all() and np.array_equal(probs0, P)


# ------------------------------------------------------------------------------------------------ errors
@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"num_frames": -1}, "num_frames must be an integer >= 0"),
        ({"num_frames": 10.5}, "num_frames must be an integer"),
        ({"stride": 0}, "stride must be an integer >= 1"),
        ({"budget": 0}, "budget must allow at least 1 frame"),
        ({"budget": 1.5}, r"fractional budget must be in \(0, 1\]"),
        ({"budget": "all"}, "budget must be an int"),
        ({"duplicate_tolerance": 2.0}, "needs the frames' signatures"),
        ({"signatures": np.zeros((3, 4))}, r"signatures must have shape \(10, D\)"),
        ({"duplicate_tolerance": -1.0}, "duplicate_tolerance must be a finite number >= 0"),
        ({"interpolation": "cubic"}, "interpolation must be"),
        ({"predict": "model"}, "predict must be callable"),
    ],
)
def test_bad_arguments_fail_in_one_line(kwargs, match):
    args = {"predict": Lookup(noisy_probs(10)), "num_frames": 10, "video_id": "v1", **kwargs}
    with pytest.raises(ValueError, match=match) as err:
        adaptive_inference(**args)
    assert "\n" not in str(err.value) and "video 'v1'" in str(err.value)


@pytest.mark.parametrize(
    "output,match",
    [
        (lambda r: np.zeros((len(r), 5)), r"predict returned shape \(\d+, 5\)"),
        (lambda r: np.full((len(r), NUM_LABELS), 3.0), "predict returned 3.0 for row 0"),
        (lambda r: np.full((len(r), NUM_LABELS), np.nan), "apply the sigmoid"),
    ],
)
def test_bad_predict_output_fails_in_one_line(output, match):
    with pytest.raises(ValueError, match=match) as err:
        adaptive_inference(output, 20, stride=4, video_id="v2")
    assert "\n" not in str(err.value) and "video 'v2'" in str(err.value)


def test_simulated_flicker_in_runs_keeps_the_default_draw():
    from monai_vce.postprocessing import NOISE_LEVELS, simulate_probabilities
    from monai_vce.postprocessing.chain import run_bounds

    truth = np.zeros((20000, NUM_LABELS), bool)
    truth[:, 0] = True
    quiet = {**NOISE_LEVELS["medium"], "sigma": 0.01, "fp_rate": 0.0, "flicker": 0.05}
    default = simulate_probabilities(truth, quiet, seed=3)
    assert np.array_equal(default, simulate_probabilities(truth, {**quiet, "flicker_length": 1}, seed=3))
    runs = simulate_probabilities(truth, {**quiet, "flicker_length": 8}, seed=3)
    for probs, mean_length in ((default, (1.0, 1.2)), (runs, (5.0, 12.0))):
        flipped = (probs > 0.5) != truth
        _, start, stop = run_bounds(flipped, True)
        assert 0.02 < flipped.mean() < 0.08
        assert mean_length[0] <= (stop - start).mean() <= mean_length[1]
