"""The event-file validator: one clear message per problem; reading and writing event files."""

from __future__ import annotations

import json

import numpy as np
import pytest

from monai_vce.metrics import check_events, load_events, save_events, validate_events


def one(events, video_id="7"):
    return {"videos": [{"video_id": video_id, "events": events}]}


GOOD = one([{"start": 0, "end": 4, "label": ["colon"]}, {"start": 5, "end": 5, "label": ["blood", "colon"]}])


def test_valid_file_has_no_problems():
    assert validate_events(GOOD) == []
    assert validate_events(GOOD, gt=GOOD) == []
    assert validate_events(one([])) == []
    assert validate_events({"videos": []}) == []
    # an empty label list scores nothing; the Galar ground truth has one
    assert validate_events(one([{"start": 0, "end": 0, "label": []}])) == []
    assert check_events(GOOD) is GOOD


@pytest.mark.parametrize(
    "obj, message",
    [
        ([], "top level must be a dict with a 'videos' list, got list"),
        ({"video": []}, "top level has no 'videos' key (expected {'videos': [...]})"),
        ({"videos": {}}, "'videos' must be a list, got dict {}"),
        ({"videos": [3]}, "videos[0]: must be a dict with 'video_id' and 'events', got int 3"),
        ({"videos": [{"events": []}]}, "videos[0]: missing key 'video_id'"),
        ({"videos": [{"video_id": 7, "events": []}]}, "videos[0]: 'video_id' must be a non-empty string, got int 7"),
        ({"videos": [{"video_id": "7"}]}, "video '7' (videos[0]): missing key 'events'"),
        (one("x"), "video '7' (videos[0]): 'events' must be a list, got str 'x'"),
    ],
)
def test_structure_messages(obj, message):
    assert validate_events(obj) == [message]


@pytest.mark.parametrize(
    "event, message",
    [
        ({"start": 0, "end": 4, "label": "colon"}, "'label' must be a list of label names, got str 'colon'"),
        ({"start": 0, "end": 4, "label": ["Colon"]}, "unknown label 'Colon'"),
        ({"start": 0, "end": 4, "label": ["tumour"]}, "unknown label 'tumour'"),
        ({"start": 0, "end": 4, "label": [3]}, "unknown label 3"),
        ({"start": 0, "end": 4, "label": ["colon", "colon"]}, "label listed twice: 'colon'"),
        ({"start": 9, "end": 4, "label": ["colon"]}, "start 9 > end 4"),
        ({"start": 1.0, "end": 4, "label": ["colon"]}, "'start' must be an integer frame, got float 1.0"),
        ({"start": 0, "end": "4", "label": ["colon"]}, "'end' must be an integer frame, got str '4'"),
        ({"start": True, "end": 4, "label": ["colon"]}, "'start' must be an integer frame, got bool True"),
        ({"start": 0, "end": None, "label": ["colon"]}, "'end' must be an integer frame, got NoneType None"),
        ({"start": -1, "end": 4, "label": ["colon"]}, "'start' must be non-negative, got -1"),
        ({"start": 0, "label": ["colon"]}, "missing key 'end'"),
        ({"label": ["colon"]}, "missing keys 'start', 'end'"),
        (
            {"start": 0, "end": 4, "label": ["colon"], "confidence": 0.5},
            "unexpected key 'confidence' (an event has only 'start', 'end', 'label' and an optional 'score')",
        ),
        (
            {"start": 0, "end": 4, "label": ["colon"], "score": "high"},
            "'score' must be a finite number, got str 'high'",
        ),
        ({"start": 0, "end": 4, "label": ["colon"], "score": True}, "'score' must be a finite number, got bool True"),
        (
            {"start": 0, "end": 4, "label": ["colon"], "score": float("nan")},
            "'score' must be a finite number, got float nan",
        ),
        ("colon", "must be a dict with 'start', 'end', 'label', got str 'colon'"),
    ],
)
def test_event_messages_name_video_and_position(event, message):
    obj = one([{"start": 0, "end": 1, "label": ["colon"]}, event])
    assert validate_events(obj) == [f"video '7' (videos[0]) event 1: {message}"]


def test_numpy_integers_are_reported_but_converted_on_save(tmp_path):
    obj = one([{"start": np.int64(0), "end": np.int64(3), "label": ["colon"]}])
    assert validate_events(obj) == [
        "video '7' (videos[0]) event 0: 'start' must be an integer frame, got int64 np.int64(0)",
        "video '7' (videos[0]) event 0: 'end' must be an integer frame, got int64 np.int64(3)",
    ]
    save_events(tmp_path / "e.json", obj)
    assert json.loads((tmp_path / "e.json").read_text()) == one([{"start": 0, "end": 3, "label": ["colon"]}])


def test_extra_keys_tolerated_when_not_strict():
    obj = one([{"start": 0, "end": 4, "label": ["colon"], "score": 0.5}])
    assert validate_events(obj, strict=False) == []
    assert validate_events({**GOOD, "version": 1}) == [
        "unexpected top-level key 'version' (the format has only 'videos')"
    ]


def test_several_problems_each_reported():
    obj = {
        "videos": [
            {"video_id": "a", "events": [{"start": 5, "end": 2, "label": "colon"}]},
            {"video_id": "a", "events": [{"start": 0, "end": 1, "label": ["ulcer", "cancer"]}]},
        ]
    }
    assert validate_events(obj) == [
        "video 'a' (videos[0]) event 0: start 5 > end 2",
        "video 'a' (videos[0]) event 0: 'label' must be a list of label names, got str 'colon'",
        "video 'a' (videos[1]): duplicate video id (first listed at videos[0])",
        "video 'a' (videos[1]) event 0: unknown label 'cancer'",
    ]


def test_video_ids_against_ground_truth():
    gt = {"videos": [{"video_id": "1", "events": []}, {"video_id": "2", "events": []}]}
    pred = {"videos": [{"video_id": "1", "events": []}, {"video_id": "3", "events": []}]}
    assert validate_events(pred, gt=gt) == [
        "video '2': in the ground truth but missing from the prediction",
        "video '3' (videos[1]): not in the ground truth",
    ]


def test_event_cap_and_problem_cap():
    many = one([{"start": i, "end": i, "label": ["colon"]} for i in range(30)])
    assert validate_events(many, max_events=29) == ["30 events in all, more than the limit of 29"]
    assert validate_events(many, max_events=None) == []
    bad = one([{"start": -1, "end": 0, "label": ["colon"]} for _ in range(30)])
    problems = validate_events(bad, max_problems=5)
    assert len(problems) == 6 and problems[-1] == "... and 25 more problems not listed"


def test_check_events_lists_first_problems_and_count():
    bad = one([{"start": -1, "end": 0, "label": ["colon"]} for _ in range(25)])
    with pytest.raises(ValueError) as err:
        check_events(bad, source="pred.json")
    lines = str(err.value).splitlines()
    assert lines[0] == "pred.json: 25 problems in the event JSON:"
    assert lines[1] == "  video '7' (videos[0]) event 0: 'start' must be non-negative, got -1"
    assert len(lines) == 1 + 20 + 1 and lines[-1] == "  ... and 5 more"


def test_load_events_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"missing.json not found"):
        load_events(tmp_path / "missing.json")
    broken = tmp_path / "broken.json"
    broken.write_text('{"videos": [\n  {"video_id": "1", "events": [}\n]}')
    with pytest.raises(ValueError, match=r"broken.json is not valid JSON: .* at line 2 column"):
        load_events(broken)
    binary = tmp_path / "binary.json"
    binary.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(ValueError, match="not UTF-8"):
        load_events(binary)
    with pytest.raises(ValueError, match="is a folder"):
        load_events(tmp_path)
    big = tmp_path / "big.json"
    big.write_text(json.dumps(GOOD))
    with pytest.raises(ValueError, match="more than the limit"):
        load_events(big, max_bytes=10)
    with pytest.raises(ValueError, match="has 2 events, more than the limit of 1"):
        load_events(big, max_events=1)
    assert load_events(big) == GOOD
    invalid = tmp_path / "invalid.json"
    invalid.write_text(json.dumps(one([{"start": 0, "end": 1, "label": "colon"}])))
    with pytest.raises(ValueError, match=r"invalid.json: 1 problem"):
        load_events(invalid)
    assert load_events(invalid, validate=False)["videos"][0]["events"][0]["label"] == "colon"


def test_save_events_validates_before_writing(tmp_path):
    path = tmp_path / "sub" / "pred.json"
    decoded = one([{"start": 0, "end": 4, "label": ("colon",), "score": 0.9}])
    save_events(path, decoded)
    assert json.loads(path.read_text()) == one([{"start": 0, "end": 4, "label": ["colon"]}])
    before = path.read_text()
    with pytest.raises(ValueError, match="start 9 > end 4"):
        save_events(path, one([{"start": 9, "end": 4, "label": ["colon"]}]))
    assert path.read_text() == before  # the valid file was not replaced
    with pytest.raises(ValueError, match="missing from the prediction"):
        save_events(tmp_path / "x.json", GOOD, gt={"videos": [{"video_id": "8", "events": []}]})
    assert not (tmp_path / "x.json").exists()
    assert [p.name for p in path.parent.iterdir()] == ["pred.json"]  # no temporary files left behind


def test_a_finite_score_is_the_one_optional_key_and_survives_only_when_asked(tmp_path):
    obj = one([{"start": 0, "end": 4, "label": ["colon"], "score": np.float32(0.25)}])
    assert validate_events(obj) == []
    plain = save_events(tmp_path / "plain.json", obj)
    assert json.loads(plain.read_text())["videos"][0]["events"][0] == {"start": 0, "end": 4, "label": ["colon"]}
    scored = save_events(tmp_path / "scored.json", obj, scores=True)
    assert json.loads(scored.read_text())["videos"][0]["events"][0]["score"] == 0.25
