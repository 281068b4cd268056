"""Event composition: frames <-> events, label-set and per-label runs, and the ground-truth round trip."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import GALAR_EVENTS as GALAR
from conftest import GALAR_MISSING

from monai_vce.labels import LABELS
from monai_vce.metrics import temporal_map
from monai_vce.postprocessing import event_json, events_to_frames, frames_to_events, to_challenge_format

N = len(LABELS)


def active_from(T, spans):
    a = np.zeros((T, N), dtype=bool)
    for name, s, e in spans:
        a[s : e + 1, LABELS.index(name)] = True
    return a


def test_label_set_runs_split_wherever_a_label_switches():
    a = active_from(12, [("stomach", 0, 5), ("small intestine", 6, 11), ("blood", 4, 7)])
    events = frames_to_events(a, np.arange(12))
    assert events == [
        {"start": 0, "end": 3, "label": ["stomach"]},
        {"start": 4, "end": 5, "label": ["blood", "stomach"]},  # names sorted, as in the ground truth
        {"start": 6, "end": 7, "label": ["blood", "small intestine"]},
        {"start": 8, "end": 11, "label": ["small intestine"]},
    ]


def test_empty_frames_belong_to_no_event_and_runs_are_maximal():
    a = active_from(10, [("colon", 2, 3), ("colon", 6, 9)])
    assert frames_to_events(a, np.arange(10)) == [
        {"start": 2, "end": 3, "label": ["colon"]},
        {"start": 6, "end": 9, "label": ["colon"]},
    ]
    assert frames_to_events(np.zeros((5, N), bool), np.arange(5)) == []
    assert frames_to_events(np.zeros((0, N), bool), np.zeros(0, np.int64)) == []


def test_per_label_runs():
    a = active_from(12, [("stomach", 0, 5), ("small intestine", 6, 11), ("blood", 4, 7)])
    events = frames_to_events(a, np.arange(12), mode="per_label")
    assert events == [
        {"start": 0, "end": 5, "label": ["stomach"]},
        {"start": 4, "end": 7, "label": ["blood"]},
        {"start": 6, "end": 11, "label": ["small intestine"]},
    ]
    # ties on the start frame follow LABELS order
    b = active_from(4, [("blood", 0, 1), ("colon", 0, 3)])
    assert [e["label"] for e in frames_to_events(b, np.arange(4), mode="per_label")] == [["colon"], ["blood"]]


def test_frame_id_gaps_do_not_split_events_and_belong_to_the_event_before_them():
    ids = np.array([0, 5, 10, 15, 20, 25])
    a = active_from(6, [("colon", 1, 4)])
    # the gap rule of the challenge's ground truth: an event ends one frame before the next row's id
    assert frames_to_events(a, ids) == [{"start": 5, "end": 24, "label": ["colon"]}]
    assert frames_to_events(a, ids, mode="per_label") == [{"start": 5, "end": 24, "label": ["colon"]}]
    back = events_to_frames([{"start": 5, "end": 24, "label": ["colon"]}], ids)
    np.testing.assert_array_equal(back, a)
    # the last run of a video ends at the id of the last row
    b = active_from(6, [("colon", 3, 5)])
    assert frames_to_events(b, ids) == [{"start": 15, "end": 25, "label": ["colon"]}]


def test_scores_are_mean_over_frames_and_labels():
    a = active_from(4, [("colon", 0, 3), ("blood", 2, 3)])
    s = np.zeros((4, N))
    s[:, LABELS.index("colon")] = [0.6, 0.8, 0.9, 0.7]
    s[:, LABELS.index("blood")] = [0.1, 0.2, 0.5, 0.3]
    events = frames_to_events(a, np.arange(4), scores=s)
    assert events[0]["score"] == pytest.approx((0.6 + 0.8) / 2)
    assert events[1]["score"] == pytest.approx((0.9 + 0.7 + 0.5 + 0.3) / 4)
    per = frames_to_events(a, np.arange(4), mode="per_label", scores=s)
    assert [(e["label"], round(e["score"], 6)) for e in per] == [(["colon"], 0.75), (["blood"], 0.4)]


def test_events_to_frames_with_overlaps_and_uncovered_ids():
    ids = np.arange(10, 20)
    events = [
        {"start": 0, "end": 12, "label": ["colon"]},  # starts before the first id
        {"start": 11, "end": 14, "label": ["colon", "blood"]},  # overlaps the first
        {"start": 30, "end": 40, "label": ["polyp"]},  # after the last id: marks nothing
    ]
    out = events_to_frames(events, ids)
    assert out.shape == (10, N) and out.dtype == bool
    np.testing.assert_array_equal(np.flatnonzero(out[:, LABELS.index("colon")]), [0, 1, 2, 3, 4])
    np.testing.assert_array_equal(np.flatnonzero(out[:, LABELS.index("blood")]), [1, 2, 3, 4])
    assert out.sum() == 9


def test_random_round_trip():
    rng = np.random.default_rng(0)
    for _ in range(20):
        T = int(rng.integers(1, 300))
        a = rng.random((T, N)) < 0.1
        a = np.repeat(a, 3, axis=0)[:T]  # runs longer than one frame
        ids = np.cumsum(rng.integers(1, 4, size=T))
        for mode in ("label_set", "per_label"):
            np.testing.assert_array_equal(events_to_frames(frames_to_events(a, ids, mode=mode), ids), a)


def test_bad_inputs_raise_clear_errors():
    with pytest.raises(ValueError, match="active must be"):
        frames_to_events(np.zeros((4, 3), bool), np.arange(4))
    with pytest.raises(ValueError, match="strictly increasing"):
        frames_to_events(np.zeros((3, N), bool), np.array([0, 2, 2]))
    with pytest.raises(ValueError, match="mode"):
        frames_to_events(np.zeros((3, N), bool), np.arange(3), mode="runs")
    with pytest.raises(ValueError, match="scores"):
        frames_to_events(np.zeros((3, N), bool), np.arange(3), scores=np.zeros((3, 2)))
    with pytest.raises(ValueError, match="unknown label 'tumour'"):
        events_to_frames([{"start": 0, "end": 1, "label": ["tumour"]}], np.arange(3))
    with pytest.raises(ValueError, match="must be a list"):
        events_to_frames([{"start": 0, "end": 1, "label": "colon"}], np.arange(3))


def test_event_json_and_challenge_format():
    a = active_from(6, [("colon", 0, 5)])
    events = frames_to_events(a, np.arange(6, dtype=np.int32), scores=a.astype(float))
    assert "score" in events[0]
    doc = event_json({1: events, "b": []})
    assert doc == {
        "videos": [
            {"video_id": "1", "events": [{"start": 0, "end": 5, "label": ["colon"]}]},
            {"video_id": "b", "events": []},
        ]
    }
    assert isinstance(doc["videos"][0]["events"][0]["start"], int)
    json.dumps(doc)
    kept = event_json({"a": events}, challenge_format=False)
    assert kept["videos"][0]["events"][0]["score"] == 1.0
    raw = [{"start": np.int64(3), "end": np.int64(4), "label": ("blood",), "score": 0.2}]
    assert to_challenge_format(raw) == [{"start": 3, "end": 4, "label": ["blood"]}]


@pytest.mark.skipif(not GALAR.exists(), reason=GALAR_MISSING)
def test_galar_ground_truth_round_trip_scores_one():
    gt = json.loads(GALAR.read_text())
    assert len(gt["videos"]) == 80
    rebuilt = {}
    for video in gt["videos"]:
        events = video["events"]
        ids = np.arange(max(e["end"] for e in events) + 1)
        rebuilt[video["video_id"]] = frames_to_events(events_to_frames(events, ids), ids, mode="label_set")
        # the ground truth holds one event with an empty label list (video 6, frame 0): it has no frames
        assert rebuilt[video["video_id"]] == [e for e in events if e["label"]], video["video_id"]
    res = temporal_map(gt, event_json(rebuilt))
    assert res["mAP@0.5"] == 1.0 and res["mAP@0.95"] == 1.0
