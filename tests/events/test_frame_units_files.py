"""Frame units never change silently: the sidecar of every event file, the conversion between the two units, the
metric and report refusing or converting, resume refusing to mix units, and reports that own their folder."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from monai_vce.events import (
    FrameUnits,
    Video,
    completed_videos,
    convert_events,
    events_meta_path,
    load_events,
    probability_file,
    read_events_meta,
    read_frame_units,
    save_events,
    save_video_probs,
)
from monai_vce.labels import LABELS, NUM_LABELS
from monai_vce.metrics import temporal_map
from monai_vce.metrics.__main__ import main as metrics_main

# one video of 6 frames whose file numbers are 5 * index + 3 (as in the generated mini-Galar's odd videos)
INDEX = np.arange(6)
NUMBER = 5 * INDEX + 3
GT = {
    "videos": [
        {
            "video_id": "v",
            "events": [{"start": 0, "end": 2, "label": ["stomach"]}, {"start": 3, "end": 5, "label": ["colon"]}],
        }
    ]
}
# the same events in frame_number units: a run ends one frame before the next frame's number
GT_NUMBER = {
    "videos": [
        {
            "video_id": "v",
            "events": [{"start": 3, "end": 17, "label": ["stomach"]}, {"start": 18, "end": 28, "label": ["colon"]}],
        }
    ]
}


def _probs(folder: Path) -> Path:
    probs = np.full((6, NUM_LABELS), 0.01, np.float32)
    save_video_probs(probability_file(folder, "v"), Video("v", probs, INDEX, NUMBER))
    return folder


def test_sidecar_records_the_units_of_exactly_that_file(tmp_path):
    path = save_events(
        tmp_path / "events.json", GT, frame_units="frame_number", videos={"v": {"frames": 6, "first": 3, "last": 28}}
    )
    meta = read_events_meta(path)
    assert events_meta_path(path) == tmp_path / "events.meta.json"
    assert meta["frame_units"] is FrameUnits.FRAME_NUMBER and meta["videos"]["v"]["frames"] == 6
    assert set(json.loads(path.read_text())) == {"videos"}  # the challenge file itself holds nothing else
    # a file written without units, or replaced after its sidecar was written, has unknown units (and says why)
    assert read_frame_units(save_events(tmp_path / "plain.json", GT)) is None
    path.write_text(json.dumps(GT_NUMBER))
    with pytest.warns(UserWarning, match="another version"):
        assert read_frame_units(path) is None


def test_convert_events_both_ways_follows_the_gap_rule():
    ids = {"v": (INDEX, NUMBER)}
    assert convert_events(GT, "frame_index", "frame_number", ids) == GT_NUMBER
    assert convert_events(GT_NUMBER, "frame_number", "frame_index", ids) == GT
    with pytest.raises(ValueError, match="no frame ids of video 'v'"):
        convert_events(GT, "frame_index", "frame_number", {})
    bad = {"videos": [{"video_id": "v", "events": [{"start": 4, "end": 7, "label": ["colon"]}]}]}
    with pytest.raises(ValueError, match="covers none of its 6 frames"):
        convert_events(bad, "frame_number", "frame_index", ids)


def test_metric_refuses_or_converts_files_in_other_units(tmp_path, capsys):
    gt = save_events(tmp_path / "gt.json", GT, frame_units="frame_index")
    pred = save_events(tmp_path / "pred.json", GT_NUMBER, frame_units="frame_number")
    assert metrics_main(["--gt", str(gt), "--events", str(pred)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "frame units differ" in err[0] and "--probs-dir" in err[0]
    assert metrics_main(["--gt", str(gt), "--events", str(pred), "--probs-dir", str(_probs(tmp_path / "probs"))]) == 0
    out = capsys.readouterr()
    result = json.loads(out.out)
    assert result["mAP@0.5"] == 1.0 and result["frame_units"] == "frame_index" and "converted" in out.err
    # a file without recorded units is scored in the other's units, with a note saying so
    plain = save_events(tmp_path / "plain.json", GT)
    assert metrics_main(["--gt", str(gt), "--events", str(plain)]) == 0
    out = capsys.readouterr()
    assert json.loads(out.out)["frame_units"] == "frame_index" and "records no frame units" in out.err


def test_resume_never_reuses_probability_files_of_other_frame_ids(tmp_path):
    probs = _probs(tmp_path / "probs")
    same = [
        {"video_id": "v", "frame_index": int(i), "frame_number": int(n)} for i, n in zip(INDEX, NUMBER, strict=True)
    ]
    assert completed_videos(same, probs) == ["v"]
    # the same frames listed with frame_index = the file-name number (an unlabelled datalist of that folder)
    other = [dict(d, frame_index=d["frame_number"]) for d in same]
    assert completed_videos(other, probs) == []  # inferred again in this run's units, never reused


def test_inference_datalist_takes_frame_index_from_the_label_csvs(mini_galar):
    from monai_vce.workflows import galar_datalist, inference_datalist

    got = inference_datalist(mini_galar)
    want = galar_datalist(mini_galar)
    assert [(d["video_id"], d["frame_index"], d["frame_number"]) for d in got] == [
        (d["video_id"], d["frame_index"], d["frame_number"]) for d in want
    ]
    assert all("label" not in d for d in got)
    # video 2's file numbers are 5 * index + offset: the two ids differ, and frame_index is the CSV's index
    two = [d for d in got if d["video_id"] == "2"]
    assert [d["frame_index"] for d in two[:3]] == [0, 1, 2] and two[1]["frame_number"] != 1


pytest.importorskip("matplotlib")


def test_report_converts_or_refuses_and_owns_its_folder(tmp_path):
    from monai_vce.report import write_report

    gt = save_events(tmp_path / "gt.json", GT, frame_units="frame_index")
    pred = save_events(tmp_path / "pred.json", GT_NUMBER, frame_units="frame_number")
    with pytest.raises(ValueError, match="frame units differ"):
        write_report(pred, tmp_path / "r", gt=gt)
    with pytest.raises(ValueError, match="not in frame_index units"):
        write_report(pred, tmp_path / "r", frame_units="frame_index")
    probs = _probs(tmp_path / "probs")
    res = write_report(pred, tmp_path / "r", gt=gt, probs_dir=probs)
    assert res["frame_units"] == "frame_index" and res["metrics"]["mAP@0.5"] == 1.0
    assert f"Prediction: `{pred}`" in res["summary_md"].read_text()

    # a second report in the same folder, on other videos and without ground truth, leaves nothing stale
    other = {"videos": [{"video_id": "w", "events": [{"start": 0, "end": 3, "label": ["colon"]}]}]}
    res2 = write_report(save_events(tmp_path / "w.json", other, frame_units="frame_index"), tmp_path / "r")
    assert sorted(p.name for p in (tmp_path / "r" / "timelines").iterdir()) == ["w.png"]
    assert not (tmp_path / "r" / "summary.png").exists() and res2["summary_png"] is None


def test_timeline_counts_the_video_frames_not_the_id_span():
    from monai_vce.report import draw_timeline

    probs = np.zeros((300, NUM_LABELS), np.float32)
    numbers = 5 * np.arange(300) + 4
    fig = draw_timeline("2", [], probs=probs, frame_ids=numbers, frame_units="frame_number")
    texts = [t.get_text() for t in fig.texts]
    assert any(t.startswith("300 frames, frame number 4 to 1,499") for t in texts), texts


def test_summary_chart_per_label_axis_runs_from_zero_to_one():
    from monai_vce.report import draw_summary, presence_matrix

    gt = {"videos": [{"video_id": "a", "events": [{"start": 0, "end": 9, "label": [LABELS[0]]}]}]}
    metrics = temporal_map(gt, gt)
    fig = draw_summary(metrics, presence_matrix({"a": gt["videos"][0]["events"]}, {"a": gt["videos"][0]["events"]}))
    ax = next(a for a in fig.axes if a.get_label() == "per_label")
    assert ax.get_xlim() == (0.0, 1.0)


def test_evaluation_report_writes_its_own_folder_and_units(tmp_path, capsys):
    from monai_vce.report.evaluation import evaluation_report

    datalist = [
        {
            "video_id": "v",
            "frame_index": int(i),
            "frame_number": int(n),
            "label": [
                1.0 if (j == LABELS.index("stomach")) == (i < 3) and j in (2, 4) else 0.0 for j in range(NUM_LABELS)
            ],
        }
        for i, n in zip(INDEX, NUMBER, strict=True)
    ]
    events = save_events(tmp_path / "val_events.json", GT, frame_units="frame_index")
    result = evaluation_report(events, datalist, tmp_path, probs_dir=_probs(tmp_path / "val_probs"))
    assert result["frame_units"] == "frame_index" and result["mAP@0.5"] == 1.0
    assert (tmp_path / "val_report" / "summary.md").is_file() and not (tmp_path / "report").exists()
    assert read_frame_units(tmp_path / "ground_truth.json") is FrameUnits.FRAME_INDEX
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["frame_units"] == "frame_index"
    # an event file recorded in other units than those asked for is refused, not scored
    wrong = save_events(tmp_path / "n.json", GT_NUMBER, frame_units="frame_number")
    with pytest.raises(ValueError, match="frame_number units"):
        evaluation_report(wrong, datalist, tmp_path / "x", frame_units="frame_index")
    # without frame_units, the units are those of the event file's sidecar, and the ground truth follows them
    by_number = evaluation_report(wrong, datalist, tmp_path / "y", draw=False)
    assert by_number["frame_units"] == "frame_number" and by_number["mAP@0.5"] == 1.0
    assert read_frame_units(tmp_path / "y" / "ground_truth.json") is FrameUnits.FRAME_NUMBER
    assert load_events(events) == GT


def test_frame_units_are_the_datalist_keys():
    from monai_vce.events import as_frame_units

    item = {"frame_index": 20, "frame_number": 100}
    assert [item[u] for u in FrameUnits] == [20, 100]
    assert FrameUnits.FRAME_INDEX == "frame_index" and str(FrameUnits.FRAME_NUMBER) == "frame_number"
    assert json.dumps({"u": FrameUnits.FRAME_INDEX}) == '{"u": "frame_index"}'
    assert as_frame_units("frame_number") is FrameUnits.FRAME_NUMBER
    assert as_frame_units(FrameUnits.FRAME_INDEX) is FrameUnits.FRAME_INDEX
    for bad in ("idx", "index", None):
        with pytest.raises(
            ValueError, match=rf"frame_units must be one of \['frame_index', 'frame_number'\], got {bad!r}"
        ):
            as_frame_units(bad)
    video = Video("v", np.zeros((2, NUM_LABELS)), np.array([3, 4]), np.array([15, 20]))
    assert video.frame_ids("frame_number").tolist() == [15, 20] and video.frame_ids().tolist() == [3, 4]
    with pytest.raises(ValueError, match="got 'index'"):
        video.frame_ids("index")
