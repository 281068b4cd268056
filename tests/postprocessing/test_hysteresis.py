"""The hysteresis chain step: its kernel, its off default, its parameter and its tuning."""

from __future__ import annotations

import json

import numpy as np
import pytest

from monai_vce.events import Video
from monai_vce.labels import LABELS
from monai_vce.postprocessing import CHAIN_STEPS, PAPER_ORDER, DecoderParams, EventDecoder, run_chain, tune_decoder
from monai_vce.postprocessing.chain import hysteresis_probs
from monai_vce.postprocessing.tuning import default_grids

L = {n: i for i, n in enumerate(LABELS)}


def _reference(p: np.ndarray, thr: float, delta: float) -> np.ndarray:
    """Frame by frame: runs of the low mask (p + delta >= thr) that hold a frame of the high mask (p >= thr)."""
    low, high = p + delta >= thr, p >= thr
    out = np.zeros(p.size, dtype=bool)
    t = 0
    while t < p.size:
        if not low[t]:
            t += 1
            continue
        u = t
        while u < p.size and low[u]:
            u += 1
        out[t:u] = high[t:u].any()
        t = u
    return out


def test_kernel_matches_a_frame_by_frame_reference():
    rng = np.random.default_rng(0)
    for _ in range(300):
        T, C = int(rng.integers(0, 80)), 4
        p = rng.integers(0, 17, (T, C)) / 16.0  # exact in binary: p + delta has no rounding
        deltas = rng.integers(0, 6, C) / 16.0
        q = hysteresis_probs(p, deltas)
        assert q.shape == p.shape
        for c in range(C):
            for thr in np.arange(0, 17) / 16.0:
                np.testing.assert_array_equal(q[:, c] >= thr, _reference(p[:, c], thr, deltas[c]))
    # long videos of piecewise-constant runs (the scan cannot stop early) and of smooth noise (it stops early)
    runs = np.repeat(rng.integers(0, 17, (400, 2)) / 16.0, rng.integers(1, 40, 400), axis=0)
    smooth = np.round(np.cumsum(rng.normal(0, 1 / 16, (runs.shape[0], 2)), axis=0) % 1 * 16) / 16
    p = np.concatenate([runs, smooth], axis=1)
    q = hysteresis_probs(p, np.array([1, 3, 1, 3]) / 16.0)
    for c, delta in enumerate(np.array([1, 3, 1, 3]) / 16.0):
        for thr in (0.25, 0.5, 0.75):
            np.testing.assert_array_equal(q[:, c] >= thr, _reference(p[:, c], thr, delta))
    # float32 probabilities of a real chain: the thresholded chain equals the reference too
    p32 = rng.random((500, 3)).astype(np.float32)
    mask = run_chain(p32, {"threshold": 0.6, "hysteresis": 0.25}, ["hysteresis", "threshold"])
    for c in range(3):
        np.testing.assert_array_equal(mask[:, c], _reference(p32[:, c].astype(np.float64), 0.6, 0.25))


def test_off_is_the_identity():
    rng = np.random.default_rng(1)
    p = rng.random((300, 17)).astype(np.float32)
    assert hysteresis_probs(p, 0.0) is p
    q = hysteresis_probs(p, np.r_[0.2, np.zeros(16)])
    np.testing.assert_array_equal(q[:, 1:], p[:, 1:])  # only the column with a margin changes
    with pytest.raises(ValueError, match="hysteresis margins must be finite and >= 0"):
        hysteresis_probs(p, -0.1)
    # the decoder with the step in its order but off gives the same events as without it
    plain = DecoderParams({"anatomy": {"enabled": True}})
    with_step = plain.replace(order=["hysteresis", *PAPER_ORDER])
    assert EventDecoder(with_step)(p, np.arange(300)) == EventDecoder(plain)(p, np.arange(300))
    assert plain["labels"]["ulcer"]["hysteresis"] == 0.0 and "hysteresis" not in plain["order"]


def test_the_step_needs_probabilities():
    with pytest.raises(ValueError, match="'hysteresis' works on the probabilities and must come before 'threshold'"):
        DecoderParams({"order": ["threshold", "hysteresis"]})
    with pytest.raises(ValueError, match="'hysteresis' needs the probabilities"):
        run_chain(np.zeros((5, 2)), {}, ["threshold", "hysteresis"])
    assert CHAIN_STEPS["hysteresis"].needs_probs
    # searched on request only (it won nothing on the development runs)
    assert "hysteresis" not in default_grids() and default_grids(optional=True)["hysteresis"][0] == 0.0


def test_parameter_round_trips_and_is_validated(tmp_path):
    params = DecoderParams({"order": ["hysteresis", *PAPER_ORDER], "labels": {"polyp": {"hysteresis": 0.2}}})
    path = params.save(tmp_path / "decoder.json")
    assert DecoderParams.load(path) == params
    assert DecoderParams.load(path)["labels"]["polyp"]["hysteresis"] == 0.2
    for bad in (-0.1, 1.5, float("nan"), "0.2", True):
        d = params.to_dict()
        d["labels"]["polyp"]["hysteresis"] = bad
        path.write_text(json.dumps(d))
        with pytest.raises(ValueError, match=r"labels.polyp.hysteresis: must be a finite number in \[0, 1\]") as err:
            DecoderParams.load(path)
        assert str(err.value).startswith(f"{path}: ") and "\n" not in str(err.value)


def _videos(helps: bool) -> list[Video]:
    """Polyp events of 0.6 with a few 0.9 seeds; where hysteresis helps, false bursts of 0.75 outrank them."""
    out = []
    for k in range(4):
        p = np.full((300, 17), 0.01)
        s = 150 + 5 * k
        if helps:
            p[s : s + 40, L["polyp"]] = 0.6
            p[[s + 5, s + 20, s + 35], L["polyp"]] = 0.9
            p[40 + k : 50 + k, L["polyp"]] = 0.75  # a false burst, more confident than the true event
        else:
            p[s : s + 40, L["polyp"]] = 0.9
        gt = [{"start": s, "end": s + 39, "label": ["polyp"]}]
        out.append(Video(f"v{k}", p, np.arange(300), np.arange(300), events=gt))
    return out


@pytest.mark.parametrize("helps", [True, False])
def test_the_tuner_turns_it_on_only_where_it_helps(helps):
    grids = {"hysteresis": (0.0, 0.3), "threshold": (0.5, 0.7, 0.8)}
    base = {"labels": {"polyp": {"threshold": 0.8, "median_window": 1, "max_gap": 0, "min_length": 0}}}
    videos = _videos(helps)
    tuned = tune_decoder(videos, base=base, grids=grids, anatomy=False, rounds=1, presence_folds=0)
    polyp = tuned["labels"]["polyp"]
    if helps:
        assert polyp["hysteresis"] == 0.3 and polyp["threshold"] == 0.8
        assert tuned["order"][: tuned["order"].index("threshold")] == ("hysteresis",)
        events = EventDecoder(tuned).decode(videos[0])
        assert [e for e in events if "polyp" in e["label"]] == [{"start": 150, "end": 189, "label": ["polyp"]}]
    else:
        assert polyp["hysteresis"] == 0.0 and "hysteresis" not in tuned["order"]
        assert all(tuned["labels"][n]["hysteresis"] == 0.0 for n in LABELS)


def test_reduced_inference_refuses_a_decoder_with_hysteresis_on():
    from monai_vce.inference.refinement import DecoderTarget
    from monai_vce.postprocessing import DecoderParams

    data = DecoderParams().to_dict()
    DecoderTarget(DecoderParams(data))  # the default chain is refined
    data["order"] = ["hysteresis", *data["order"]]
    DecoderTarget(DecoderParams(data))  # in the order but off for every label: nothing changes
    data["labels"]["polyp"]["hysteresis"] = 0.1
    with pytest.raises(ValueError, match=r"cannot refine a decoder with the chain step\(s\) \['hysteresis'\] on"):
        DecoderTarget(DecoderParams(data))
