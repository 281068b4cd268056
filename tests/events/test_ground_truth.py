"""The one ground-truth builder: the challenge's rule on label rows, its gap rule, and every caller using it."""

from __future__ import annotations

import json

import numpy as np
import pytest

from monai_vce.data import build_galar_datalist, build_ground_truth
from monai_vce.events import events_to_frames, frames_to_events, ground_truth_events
from monai_vce.labels import LABELS
from monai_vce.report.evaluation import datalist_ground_truth

N = len(LABELS)


def rows_of(spec: list[tuple[int, tuple[str, ...]]]) -> tuple[np.ndarray, np.ndarray]:
    ids = np.array([i for i, _ in spec])
    labels = np.zeros((len(spec), N), np.float32)
    for r, (_, names) in enumerate(spec):
        for n in names:
            labels[r, LABELS.index(n)] = 1
    return ids, labels


def challenge_rule(ids: np.ndarray, labels: np.ndarray) -> list[dict]:
    """The challenge's ground-truth script re-written here by hand: rows sorted by index, a new event where the
    label set changes, an event ending one frame before the next one starts, names sorted, empty sets kept."""
    events: list[dict] = []
    for i in np.argsort(ids, kind="stable"):
        names = sorted(LABELS[c] for c in np.flatnonzero(labels[i] >= 0.5))
        if events and events[-1]["label"] == names:
            events[-1]["end"] = int(ids[i])
            continue
        if events:
            events[-1]["end"] = int(ids[i]) - 1
        events.append({"start": int(ids[i]), "end": int(ids[i]), "label": names})
    return events


def test_gap_rule_frames_without_a_row_belong_to_the_event_before_them():
    ids, labels = rows_of(
        [(10, ("stomach",)), (11, ("stomach",)), (12, ("blood", "stomach")), (20, ("blood", "stomach")), (21, ()),
         (30, ("colon",))]
    )  # fmt: skip
    assert ground_truth_events(ids, labels) == [
        {"start": 10, "end": 11, "label": ["stomach"]},
        {"start": 12, "end": 20, "label": ["blood", "stomach"]},  # the gap 13..19 does not end the event
        {"start": 21, "end": 29, "label": []},  # rows without labels: an empty event, as the challenge writes
        {"start": 30, "end": 30, "label": ["colon"]},
    ]
    # without the empty events, the others keep their spans
    assert [e for e in ground_truth_events(ids, labels, keep_empty=False)] == [
        e for e in ground_truth_events(ids, labels) if e["label"]
    ]


def test_rows_in_any_order_repeated_ids_and_names_sorted():
    ids, labels = rows_of([(3, ("z-line", "esophagus")), (1, ("mouth",)), (2, ("mouth",)), (2, ("colon",))])
    # sorted by id, the repeated id 2 keeps its first row (mouth), label names sorted as the challenge writes them
    assert ground_truth_events(ids, labels) == [
        {"start": 1, "end": 2, "label": ["mouth"]},
        {"start": 3, "end": 3, "label": ["esophagus", "z-line"]},
    ]
    with pytest.raises(ValueError, match="video 'v': frame ids must be non-negative"):
        ground_truth_events(np.array([-1, 0]), labels[:2], video_id="v")
    with pytest.raises(ValueError, match=r"\(R, 17\) labels"):
        ground_truth_events(np.arange(3), np.zeros((3, 5)))


def test_equals_the_challenge_rule_on_random_rows_with_gaps():
    rng = np.random.default_rng(0)
    for _ in range(30):
        R = int(rng.integers(1, 200))
        labels = np.repeat(rng.random((R, N)) < 0.08, 4, axis=0)[:R].astype(np.float32)
        ids = np.cumsum(rng.integers(1, 4, size=R)) - 1
        perm = rng.permutation(R)  # the rows of a CSV need not be in order
        assert ground_truth_events(ids[perm], labels[perm]) == challenge_rule(ids, labels)
        # predictions composed from the same rows follow the same rule (the decoder's composition)
        assert frames_to_events(labels >= 0.5, ids) == [e for e in challenge_rule(ids, labels) if e["label"]]


def test_real_galar_timelines_round_trip_exactly(galar_events_path):
    gt = json.loads(galar_events_path.read_text())
    for video in gt["videos"]:
        events = video["events"]
        # the label rows the file was built from: one per index from the first event to the last
        ids = np.arange(events[0]["start"], events[-1]["end"] + 1)
        labels = events_to_frames(events, ids).astype(np.float32)
        # every event, including the empty one of video 6 (frame 0), in order
        assert ground_truth_events(ids, labels) == events, video["video_id"]


def _write_csv(path, ids, frames, labels):
    header = ["index", *LABELS, "frame"]
    lines = [",".join(header)]
    for i, f, row in zip(ids, frames, labels, strict=True):
        lines.append(",".join([str(i), *(str(int(v)) for v in row), str(f)]))
    path.write_text("\n".join(lines) + "\n")


def test_built_from_the_label_csv_rows_not_from_the_frames_that_have_an_image(tmp_path):
    ids, labels = rows_of([(i, ("stomach",) if i < 6 else ("small intestine",)) for i in range(12)])
    labels[7, LABELS.index("ulcer")] = 1  # a one-row ulcer
    (tmp_path / "labels").mkdir()
    (tmp_path / "frames" / "v").mkdir(parents=True)
    _write_csv(tmp_path / "labels" / "v.csv", ids, 5 * ids + 1, labels)
    for i in ids:
        if i != 7:  # the ulcer frame's image is missing: that row is not in the datalist
            (tmp_path / "frames" / "v" / f"frame_{5 * i + 1:06d}.PNG").write_bytes(b"")
    gt = build_ground_truth(tmp_path / "labels")
    assert gt["videos"][0]["events"] == challenge_rule(ids, labels)
    assert {"start": 7, "end": 7, "label": ["small intestine", "ulcer"]} in gt["videos"][0]["events"]
    # frame-number units: the same rule on the CSV's frame column
    by_number = build_ground_truth(tmp_path / "labels", frame_units="frame_number")["videos"][0]["events"]
    assert by_number == challenge_rule(5 * ids + 1, labels)
    # the datalist lost the ulcer row; its ground truth (same builder, fewer rows) lacks the ulcer
    with pytest.warns(UserWarning, match="without a frame image"):
        datalist = build_galar_datalist(tmp_path / "frames", tmp_path / "labels")
    partial = datalist_ground_truth(datalist)["videos"][0]["events"]
    assert partial == ground_truth_events(np.delete(ids, 7), np.delete(labels, 7, axis=0))
    assert not any("ulcer" in e["label"] for e in partial)


def test_every_ground_truth_of_the_package_is_the_one_builder(mini_galar):
    """The generated data's ground_truth.json, build_ground_truth, the datalist's ground truth and the ground truth
    the validation collector hands to the metric and the tuner agree."""
    from monai_vce.handlers import VideoFrameCollector

    written = json.loads((mini_galar / "ground_truth.json").read_text())
    assert build_ground_truth(mini_galar / "labels") == written
    datalist = build_galar_datalist(mini_galar / "frames", mini_galar / "labels")
    assert datalist_ground_truth(datalist) == written  # every row of the mini-Galar has its image
    collector = VideoFrameCollector(label_key="label")
    for vid in ("1", "2"):
        items = [d for d in datalist if d["video_id"] == vid]
        collector.update(
            [vid] * len(items),
            np.zeros((len(items), N)),
            np.array([d["frame_index"] for d in items]),
            targets=np.array([d["label"] for d in items]),
        )
    from_targets = {vid: v.events for vid, v in collector.labelled_videos().items()}
    assert from_targets == {v["video_id"]: v["events"] for v in written["videos"] if v["video_id"] in ("1", "2")}
