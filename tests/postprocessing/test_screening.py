"""The screening profile of the decoder (``tune_decoder(profile="screening")``) and scored events."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest

from monai_vce.events import Video
from monai_vce.labels import LABELS, PATHOLOGY
from monai_vce.metrics import lesion_froc
from monai_vce.postprocessing import (
    DecoderParams,
    EventDecoder,
    decode_videos,
    event_scores,
    screening_operating_point,
    tune_decoder,
    tune_screening,
)
from monai_vce.postprocessing.screening import _allocate

ULCER, BLOOD = LABELS.index("ulcer"), LABELS.index("blood")


def _videos(n=4, T=400, seed=0):
    """Videos with two ulcer lesions (strong evidence) and a weak false-positive bump each."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        probs = rng.uniform(0.0, 0.04, size=(T, len(LABELS))).astype(np.float32)
        probs[:, LABELS.index("stomach")] = 0.9
        events = [{"start": 0, "end": T - 1, "label": ["stomach"]}]
        for s in (50 + 10 * i, 250):
            probs[s : s + 20, ULCER] = 0.7
            events.append({"start": s, "end": s + 19, "label": ["ulcer"]})
        probs[150:160, ULCER] = 0.3  # a false alarm at thresholds below 0.3
        probs[320:330, BLOOD] = 0.2  # a false alarm of another label
        ids = np.arange(T)
        out.append(Video(f"v{i}", probs, ids, ids, events=events))
    return out


def test_screening_fits_a_budget_scores_events_and_silences_no_label():
    videos = _videos()
    # 400-frame videos: the lesions are 10 % of the frames; the workload cap is the next test's subject
    params = tune_screening(videos, false_alarms_per_exam=0.0, max_frames_share=1.0)
    assert params["composition"] == "per_label" and params["scores"] is True
    assert all(params["labels"][n]["presence"]["feature"] == "none" for n in LABELS)
    # zero false alarms: the ulcer threshold above the 0.3 bump, blood above 0.2
    assert 0.3 < params["labels"]["ulcer"]["threshold"] <= 0.7
    assert params["labels"]["blood"]["threshold"] > 0.2
    fit = params["fit"]
    assert fit["profile"] == "screening" and fit["videos"] == 4
    assert fit["screening"]["expected"] == {"false_alarms_per_exam": 0.0, "sensitivity": 1.0}
    pred = decode_videos(videos, EventDecoder(params))
    events = [e for v in pred["videos"] for e in v["events"]]
    assert events and all(isinstance(e["score"], float) for e in events)
    for v in pred["videos"]:  # listed most suspicious first
        scores = [e["score"] for e in v["events"]]
        assert scores == sorted(scores, reverse=True)
    froc = lesion_froc({"videos": [{"video_id": v.video_id, "events": v.events} for v in videos]}, pred)
    assert froc["overall"]["overlap"]["sensitivity"]["0.5"] == 1.0

    # a budget of one false alarm per exam lets the ulcer threshold fall below the bump: still every lesion
    loose = tune_screening(videos, false_alarms_per_exam=1.0, max_frames_share=1.0)
    assert loose["fit"]["screening"]["expected"]["sensitivity"] == 1.0
    assert loose["fit"]["screening"]["expected"]["false_alarms_per_exam"] <= 1.0
    # the contract's entry point is tune_decoder(profile="screening")
    via = tune_decoder(videos, profile="screening", false_alarms_per_exam=1.0)
    assert via["labels"] == tune_screening(videos, false_alarms_per_exam=1.0)["labels"]


def test_operating_point_moves_with_the_budget_from_the_recorded_curves(tmp_path):
    videos = _videos()
    params = tune_screening(videos, false_alarms_per_exam=0.0, max_frames_share=1.0)
    path = params.save(tmp_path / "screening.json")
    moved = screening_operating_point(DecoderParams.load(path), 2.0)
    assert moved["fit"]["false_alarms_per_exam"] == 2.0
    assert moved["labels"]["ulcer"]["threshold"] <= params["labels"]["ulcer"]["threshold"]
    assert moved["fit"]["screening"]["expected"]["false_alarms_per_exam"] <= 2.0
    refit = tune_screening(videos, false_alarms_per_exam=2.0, max_frames_share=1.0)
    assert moved["labels"] == refit["labels"]
    with pytest.raises(ValueError, match="not screening parameters"):
        screening_operating_point(DecoderParams(), 1.0)
    with pytest.raises(ValueError, match="false_alarms_per_exam"):
        screening_operating_point(params, -1.0)


def test_a_segment_over_the_whole_exam_does_not_buy_the_lesions():
    T, videos = 4000, []
    for i in range(3):
        probs = np.full((T, len(LABELS)), 0.001, dtype=np.float32)
        probs[:, ULCER] = 0.04  # below every threshold from 0.05 up, above those to 0.03: one exam-long run
        events = [{"start": 0, "end": T - 1, "label": ["stomach"]}]
        for s in (500, 2500):
            probs[s : s + 20, ULCER] = 0.1
            events.append({"start": s, "end": s + 19, "label": ["ulcer"]})
        probs[3500:3510, ULCER] = 0.3
        videos.append(Video(f"w{i}", probs, np.arange(T), np.arange(T), events=events))
    # without a cap, the exam-long run finds both lesions for no false alarm
    free = tune_screening(videos, false_alarms_per_exam=0.0, max_frames_share=1.0)
    assert free["labels"]["ulcer"]["threshold"] <= 0.03
    capped = tune_screening(videos, false_alarms_per_exam=0.0, max_frames_share=0.02)
    assert capped["labels"]["ulcer"]["threshold"] > 0.3  # the lesions cost the bump's false alarm: none fits
    one = tune_screening(videos, false_alarms_per_exam=1.0, max_frames_share=0.02)
    assert 0.03 < one["labels"]["ulcer"]["threshold"] <= 0.1
    assert one["fit"]["screening"]["expected"] == {"false_alarms_per_exam": 1.0, "sensitivity": 1.0}
    with pytest.raises(ValueError, match="max_frames_share"):
        tune_screening(videos, max_frames_share=0.0)


def test_allocation_is_the_best_choice_within_the_budget():
    rng = np.random.default_rng(3)
    for _ in range(20):
        curves = {}
        for name in PATHOLOGY[:3]:
            fa = np.sort(rng.integers(0, 6, size=4))[::-1]  # falls as the threshold rises
            found = np.sort(rng.integers(0, 5, size=4))[::-1]
            curves[name] = {"thresholds": [0.1, 0.3, 0.5, 0.7], "false_alarms": fa.tolist(),
                            "lesions_found": found.tolist(), "lesions": 5}  # fmt: skip
        budget = int(rng.integers(0, 10))
        chosen = _allocate(curves, budget)
        got = sum(curves[n]["lesions_found"][curves[n]["thresholds"].index(t)] for n, t in chosen.items())
        best = -1
        for combo in itertools.product(range(4), repeat=3):
            fa = sum(curves[n]["false_alarms"][g] for n, g in zip(curves, combo, strict=True))
            if fa <= budget:
                best = max(best, sum(curves[n]["lesions_found"][g] for n, g in zip(curves, combo, strict=True)))
        spent = sum(curves[n]["false_alarms"][curves[n]["thresholds"].index(t)] for n, t in chosen.items())
        if best >= 0:
            assert got == best and spent <= budget
        else:  # nothing fits: every label at its fewest false alarms
            assert spent == sum(min(c["false_alarms"]) for c in curves.values())


def test_event_scores_are_logit_margins_over_the_threshold():
    probs = np.zeros((10, len(LABELS)))
    probs[2:6, ULCER] = 0.5
    csum = np.vstack([np.zeros(len(LABELS)), np.cumsum(probs, axis=0)])
    member = np.zeros((1, len(LABELS)), dtype=bool)
    member[0, ULCER] = True
    th = np.full(len(LABELS), 0.5)
    assert event_scores(csum, np.array([2]), np.array([6]), member, th) == [0.0]
    th[ULCER] = 0.2
    assert event_scores(csum, np.array([2]), np.array([6]), member, th)[0] == pytest.approx(np.log(4.0), abs=1e-6)


def test_scores_key_is_validated_and_off_by_default(tmp_path):
    assert "scores" not in DecoderParams().to_dict()
    probs = np.zeros((20, len(LABELS)), dtype=np.float32)
    probs[3:10, ULCER] = 0.9
    assert all("score" not in e for e in EventDecoder()(probs, np.arange(20)))
    with pytest.raises(ValueError, match="scores"):
        DecoderParams({"scores": "yes"})
    p = DecoderParams({"scores": True}).save(tmp_path / "d.json")
    assert json.loads(p.read_text())["scores"] is True


def test_load_screening_decoder(tmp_path):
    from monai_vce.postprocessing import load_screening_decoder

    missing = tmp_path / "screening_decoder.json"
    with pytest.warns(UserWarning, match="no screening events are written"):
        assert load_screening_decoder(missing) is None
    with pytest.raises(FileNotFoundError, match=r"screening_decoder\.json not found"):
        load_screening_decoder(missing, required=True)
    assert load_screening_decoder(None) is None and load_screening_decoder("") is None
    DecoderParams().save(tmp_path / "challenge.json")
    with pytest.raises(ValueError, match="not screening parameters"):
        load_screening_decoder(tmp_path / "challenge.json")
    params = tune_screening(_videos(), false_alarms_per_exam=0.0, max_frames_share=1.0)
    params.save(missing)
    assert load_screening_decoder(missing).params == DecoderParams.load(missing)
    moved = load_screening_decoder(missing, false_alarms_per_exam=2.0).params
    assert moved["fit"]["false_alarms_per_exam"] == 2.0
