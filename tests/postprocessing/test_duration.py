"""The two-state duration Viterbi chain step: its kernel, its off default, its parameter and its tuning."""

from __future__ import annotations

import json

import numpy as np
import pytest

from monai_vce.events import Video
from monai_vce.labels import LABELS
from monai_vce.postprocessing import CHAIN_STEPS, PAPER_ORDER, DecoderParams, EventDecoder, run_chain, tune_decoder
from monai_vce.postprocessing.chain import duration_viterbi
from monai_vce.postprocessing.tuning import default_grids

L = {n: i for i, n in enumerate(LABELS)}
ORDER = ["threshold", "duration"]


def _reference(p: np.ndarray, thr: float, cost: float) -> np.ndarray:
    """Frame-by-frame Viterbi over absent / present, ``logit(p) - logit(thr)`` for present, ``cost`` per switch."""
    z = np.log(p / (1 - p)) - np.log(thr / (1 - thr))
    score, back = np.array([0.0, z[0]]), np.zeros((p.size, 2), dtype=int)
    for t in range(1, p.size):
        new = np.empty(2)
        for j in range(2):
            cand = [score[k] - (cost if k != j else 0.0) for k in range(2)]
            back[t, j] = int(np.argmax(cand))
            new[j] = cand[back[t, j]] + (z[t] if j else 0.0)
        score = new
    path = np.empty(p.size, dtype=int)
    path[-1] = int(np.argmax(score))
    for t in range(p.size - 1, 0, -1):
        path[t - 1] = back[t, path[t]]
    return path == 1


def test_kernel_matches_a_frame_by_frame_viterbi():
    rng = np.random.default_rng(0)
    for _ in range(200):
        T, C = int(rng.integers(1, 120)), 3
        p = rng.uniform(0.01, 0.99, (T, C))
        thr = rng.uniform(0.1, 0.9, C)
        costs = rng.choice([0.0, 1.0, 3.0, 8.0], C)
        mask = run_chain(p, {"threshold": thr, "duration_cost": costs}, ORDER)
        for c in range(C):
            want = p[:, c] >= thr[c] if costs[c] == 0 else _reference(p[:, c], thr[c], costs[c])
            np.testing.assert_array_equal(mask[:, c], want)


def test_off_is_the_identity_and_the_step_needs_the_threshold():
    rng = np.random.default_rng(1)
    p = rng.random((300, 17)).astype(np.float32)
    mask = p >= 0.5
    assert duration_viterbi(mask, np.zeros(17)) is mask
    plain = DecoderParams({"anatomy": {"enabled": True}})
    order = list(PAPER_ORDER)
    with_step = plain.replace(order=[*order[:1], "duration", *order[1:]])
    assert EventDecoder(with_step)(p, np.arange(300)) == EventDecoder(plain)(p, np.arange(300))
    assert plain["labels"]["ulcer"]["duration_cost"] == 0.0 and "duration" not in plain["order"]
    with pytest.raises(ValueError, match="'duration' works on the binary mask and must come after 'threshold'"):
        DecoderParams({"order": ["duration", "threshold"]})
    with pytest.raises(ValueError, match="needs the probabilities and thresholds"):
        duration_viterbi(mask, np.ones(17))
    with pytest.raises(ValueError, match="duration costs must be finite and >= 0"):
        duration_viterbi(mask, -np.ones(17))
    assert CHAIN_STEPS["duration"].context and "duration_cost" not in default_grids()
    assert default_grids(optional=True)["duration_cost"][0] == 0.0


def test_parameter_round_trips_and_is_validated(tmp_path):
    params = DecoderParams({"order": ORDER, "labels": {"polyp": {"duration_cost": 5.0}}})
    path = params.save(tmp_path / "decoder.json")
    assert DecoderParams.load(path) == params
    for bad in (-1.0, 1e7, float("inf"), "5"):
        d = params.to_dict()
        d["labels"]["polyp"]["duration_cost"] = bad
        path.write_text(json.dumps(d))
        with pytest.raises(ValueError, match=r"labels.polyp.duration_cost: must be a finite number in \[0, 1000000\]"):
            DecoderParams.load(path)


def _videos(helps: bool) -> list[Video]:
    """Polyp events whose probability dips below the threshold; where the prior helps, also confident spikes."""
    rng = np.random.default_rng(2)
    out = []
    for k in range(4):
        p = np.full((300, 17), 0.01)
        s = 150 + 5 * k
        p[s : s + 40, L["polyp"]] = 0.9 if not helps else 0.7
        if helps:
            p[s + rng.choice(np.arange(2, 38), 6, replace=False), L["polyp"]] = 0.3  # dips cut the event
            p[[30 + k, 60 + k, 90 + k], L["polyp"]] = 0.95  # isolated false frames, more confident
        gt = [{"start": s, "end": s + 39, "label": ["polyp"]}]
        out.append(Video(f"v{k}", p, np.arange(300), np.arange(300), events=gt))
    return out


@pytest.mark.parametrize("helps", [True, False])
def test_the_tuner_turns_it_on_only_where_it_helps(helps):
    grids = {"duration_cost": (0.0, 5.0), "threshold": (0.5,)}
    base = {"labels": {"polyp": {"median_window": 1, "max_gap": 0, "min_length": 0}}}
    videos = _videos(helps)
    tuned = tune_decoder(videos, base=base, grids=grids, anatomy=False, rounds=1, presence_folds=0)
    polyp = tuned["labels"]["polyp"]
    if helps:
        assert polyp["duration_cost"] == 5.0 and tuned["order"][:2] == ("threshold", "duration")
        events = EventDecoder(tuned).decode(videos[0])
        assert [e for e in events if "polyp" in e["label"]] == [{"start": 150, "end": 189, "label": ["polyp"]}]
    else:
        assert polyp["duration_cost"] == 0.0 and "duration" not in tuned["order"]
