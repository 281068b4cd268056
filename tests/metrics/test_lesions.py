"""Lesion-level FROC and reading workload (``monai_vce.metrics.lesion_froc``) on cases computed by hand."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from monai_vce.labels import PATHOLOGY
from monai_vce.metrics import label_runs, lesion_froc
from monai_vce.metrics.__main__ import main as metrics_main


def _video(vid, events):
    return {"video_id": vid, "events": events}


def _ev(start, end, labels, score=None):
    e = {"start": start, "end": end, "label": list(labels)}
    if score is not None:
        e["score"] = score
    return e


# two exams of 100 frames; exam a has two ulcer lesions (10-19, 50-59), exam b none
GT = {
    "videos": [
        _video("a", [_ev(0, 9, []), _ev(10, 19, ["ulcer"]), _ev(20, 49, []), _ev(50, 59, ["ulcer"]), _ev(60, 99, [])]),
        _video("b", [_ev(0, 99, [])]),
    ]
}
PRED = {
    "videos": [
        _video("a", [_ev(12, 14, ["ulcer"], 0.9), _ev(70, 79, ["ulcer"], 0.8)]),
        _video("b", [_ev(5, 9, ["ulcer"], 0.95)]),
    ]
}


def test_hand_computed_froc_by_overlap():
    r = lesion_froc(GT, PRED, labels=["ulcer"])
    o = r["overall"]["overlap"]
    assert r["num_exams"] == 2 and o["lesions"] == 2
    # thresholds 0.95 (1 false alarm, 0 found), 0.9 (1 FA, lesion 10-19 found), 0.8 (2 FA, 1 found)
    assert o["sensitivity"] == {"0.5": 0.5, "1": 0.5, "2": 0.5, "4": 0.5, "8": 0.5}
    assert o["score_threshold"] == {"0.5": 0.9, "1": 0.8, "2": 0.8, "4": 0.8, "8": 0.8}
    assert o["events_shown"]["0.5"] == 2 and o["events_shown"]["1"] == 3
    # at 0.9: frames 12-14 (3) + 5-9 (5) over 2 exams; at 0.8 also 70-79 (10); 200 frames in all
    assert o["workload_frames_per_exam"]["0.5"] == 4.0 and o["workload_frames_per_exam"]["1"] == 9.0
    assert o["workload_share"]["1"] == pytest.approx(18 / 200)
    assert o["froc_score"] == 0.5
    assert o["all_events"] == {
        "sensitivity": 0.5,
        "false_alarms_per_exam": 1.0,
        "events_shown": 3,
        "workload_frames_per_exam": 9.0,
        "workload_share": 0.09,
    }
    assert r["per_label"]["ulcer"] == r["overall"]


def test_hand_computed_froc_at_tiou_half():
    # 12-14 against 10-19 has tIoU 3/10: not a find, a false alarm
    t = lesion_froc(GT, PRED, labels=["ulcer"])["overall"]["tiou0.5"]
    assert t["sensitivity"] == dict.fromkeys(("0.5", "1", "2", "4", "8"), 0.0)
    assert t["score_threshold"] == {"0.5": 0.95, "1": 0.9, "2": 0.8, "4": 0.8, "8": 0.8}
    assert t["all_events"]["false_alarms_per_exam"] == 1.5
    better = json.loads(json.dumps(PRED))
    better["videos"][0]["events"][0].update(start=11, end=18)  # tIoU 8/10
    t = lesion_froc(GT, better, labels=["ulcer"])["overall"]["tiou0.5"]
    assert t["sensitivity"]["0.5"] == 0.5 and t["score_threshold"]["0.5"] == 0.9


def test_nothing_fits_a_budget_and_labels_without_lesions():
    pred = {"videos": [_video("a", [_ev(70, 79, ["ulcer"], 0.9), _ev(85, 89, ["ulcer"], 0.7)]), _video("b", [])]}
    o = lesion_froc(GT, pred, labels=["ulcer"], false_alarm_rates=[0.5, 1])["overall"]["overlap"]
    # one false alarm in two exams is 0.5 per exam: fits 0.5, two fit 1
    assert o["score_threshold"] == {"0.5": 0.9, "1": 0.7} and o["sensitivity"] == {"0.5": 0.0, "1": 0.0}
    o = lesion_froc(GT, pred, labels=["ulcer"], false_alarm_rates=[0.0])["overall"]["overlap"]
    assert o["score_threshold"] == {"0": None} and o["events_shown"] == {"0": 0}
    assert o["workload_frames_per_exam"] == {"0": 0.0}
    polyp = lesion_froc(GT, pred, labels=["polyp"])["per_label"]["polyp"]["overlap"]
    assert polyp["lesions"] == 0 and polyp["sensitivity"]["1"] is None and polyp["froc_score"] is None


def test_overall_pools_labels_and_reads_a_frame_once():
    gt = {"videos": [_video("a", [_ev(0, 9, []), _ev(10, 19, ["blood", "hematin"]), _ev(20, 99, [])])]}
    pred = {"videos": [_video("a", [_ev(10, 14, ["blood", "hematin"], 0.6), _ev(40, 44, ["blood"], 0.5)])]}
    r = lesion_froc(gt, pred)
    o = r["overall"]["overlap"]
    assert r["labels"] == list(PATHOLOGY) and o["lesions"] == 2
    assert o["sensitivity"]["1"] == 1.0 and o["score_threshold"]["1"] == 0.5
    # two labels on frames 10-14 are read once: 5 + 5 frames
    assert o["workload_frames_per_exam"]["1"] == 10.0 and o["events_shown"]["1"] == 3
    assert r["per_label"]["hematin"]["overlap"]["all_events"]["false_alarms_per_exam"] == 0.0
    assert r["per_label"]["blood"]["overlap"]["all_events"]["false_alarms_per_exam"] == 1.0


def test_label_runs_join_by_gap_and_keep_the_highest_score():
    events = [_ev(20, 25, ["ulcer"], 0.2), _ev(0, 4, ["ulcer", "blood"], 0.3), _ev(5, 9, ["ulcer"], 0.7)]
    seg, score = label_runs(events, "ulcer")
    assert seg.tolist() == [[0, 9], [20, 25]] and score.tolist() == [0.7, 0.2]
    seg, score = label_runs(events, "ulcer", merge_gap=10)
    assert seg.tolist() == [[0, 25]] and score.tolist() == [0.7]
    seg, score = label_runs([_ev(0, 50, ["ulcer"]), _ev(3, 5, ["ulcer"], 0.1)], "ulcer")
    assert seg.tolist() == [[0, 50]] and score.tolist() == [math.inf]  # an unscored event is always shown
    seg, _ = label_runs(events, "polyp")
    assert seg.shape == (0, 2)


def test_merge_gap_joins_ground_truth_lesions():
    # the two ulcers of exam a are 30 frames apart: one lesion with merge_gap 30
    o = lesion_froc(GT, PRED, labels=["ulcer"], merge_gap=30)["overall"]["overlap"]
    assert o["lesions"] == 1 and o["sensitivity"]["0.5"] == 1.0


def test_unscored_events_form_one_operating_point():
    pred = {"videos": [_video("a", [_ev(12, 14, ["ulcer"]), _ev(70, 79, ["ulcer"])]), _video("b", [])]}
    o = lesion_froc(GT, pred, labels=["ulcer"])["overall"]["overlap"]
    assert o["sensitivity"] == {"0.5": 0.5, "1": 0.5, "2": 0.5, "4": 0.5, "8": 0.5}
    assert o["score_threshold"]["0.5"] is None and o["events_shown"]["0.5"] == 2
    assert o["all_events"]["sensitivity"] == 0.5 and o["all_events"]["false_alarms_per_exam"] == 0.5


def _reference(gt, pred, label, rate):
    """Loop-by-loop sensitivity at one rate: try every threshold, keep the lowest that fits the budget."""
    exams = [v["video_id"] for v in gt["videos"]]
    # the predicted segments are joined first and ranked by their best event
    segments = {
        v["video_id"]: list(zip(*(a.tolist() for a in label_runs(v["events"], label)), strict=True))
        for v in pred["videos"]
    }
    lesions = {v["video_id"]: label_runs(v["events"], label)[0].tolist() for v in gt["videos"]}
    n = sum(len(x) for x in lesions.values())
    best = 0.0
    for t in sorted({score for segs in segments.values() for _, score in segs}):
        fa, found = 0, set()
        for vid in exams:
            for (s, e), score in segments.get(vid, []):
                if score < t:
                    continue
                hit = [j for j, (gs, ge) in enumerate(lesions[vid]) if min(e, ge) >= max(s, gs)]
                fa += not hit
                found |= {(vid, j) for j in hit}
        if fa <= rate * len(exams):
            best = max(best, len(found) / n)
    return best


@pytest.mark.parametrize("seed", range(6))
def test_matches_a_loop_reference_on_random_cases(seed):
    rng = np.random.default_rng(seed)
    gt, pred = {"videos": []}, {"videos": []}
    for v in range(4):
        starts = np.sort(rng.choice(np.arange(0, 400, 20), size=5, replace=False))
        g = [_ev(int(s), int(s + rng.integers(1, 15)), ["erosion"]) for s in starts]
        g.append(_ev(0, 419, []))
        gt["videos"].append(_video(f"v{v}", g))
        p = []
        for _ in range(int(rng.integers(0, 12))):
            s = int(rng.integers(0, 400))
            p.append(_ev(s, s + int(rng.integers(0, 10)), ["erosion"], float(rng.integers(1, 20)) / 20))
        pred["videos"].append(_video(f"v{v}", p))
    r = lesion_froc(gt, pred, labels=["erosion"], false_alarm_rates=[0.5, 1, 2, 4])
    for rate in (0.5, 1, 2, 4):
        got = r["per_label"]["erosion"]["overlap"]["sensitivity"][f"{rate:g}"]
        assert got == pytest.approx(_reference(gt, pred, "erosion", rate))


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="false_alarm_rates"):
        lesion_froc(GT, PRED, false_alarm_rates=[-1])
    with pytest.raises(ValueError, match="merge_gap"):
        lesion_froc(GT, PRED, merge_gap=-2)
    with pytest.raises(ValueError, match="labels"):
        lesion_froc(GT, PRED, labels=["tumour"])


def test_command_line_adds_the_lesion_block(tmp_path, capsys):
    gt, pred = tmp_path / "gt.json", tmp_path / "pred.json"
    gt.write_text(json.dumps(GT))
    pred.write_text(json.dumps(PRED))
    out = tmp_path / "m.json"
    assert metrics_main(["--gt", str(gt), "--events", str(pred), "--lesions", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["lesions"]["per_label"]["ulcer"]["overlap"]["sensitivity"]["1"] == 0.5
    assert "mAP@0.5" in result
    capsys.readouterr()
    assert metrics_main(["--gt", str(gt), "--events", str(pred), "--lesions", "--merge-gap", "-1"]) == 2
    assert "merge_gap" in capsys.readouterr().err
    assert metrics_main(["--gt", str(gt), "--events", str(pred)]) == 0
    assert "lesions" not in json.loads(capsys.readouterr().out)


def test_metrics_by_group_split_by_capsule():
    from monai_vce.metrics import metrics_by_group, temporal_map

    by = metrics_by_group(GT, PRED, {"a": "PillCam SB3", "b": "NaviCam"})
    assert list(by) == ["NaviCam", "PillCam SB3"]
    a = temporal_map({"videos": [GT["videos"][0]]}, {"videos": [PRED["videos"][0]]})
    assert by["PillCam SB3"]["mAP@0.5"] == a["mAP@0.5"] and by["PillCam SB3"]["videos"] == 1
    # exam a alone: lesion 10-19 found at 0.9, the 0.8 segment one false alarm (1 per exam)
    assert by["PillCam SB3"]["lesions"] == 2 and by["PillCam SB3"]["lesion_sensitivity"]["1"] == 0.5
    assert by["NaviCam"]["lesions"] == 0 and by["NaviCam"]["false_alarms_per_exam_all_events"] == 1.0
    assert set(metrics_by_group(GT, PRED, {})) == {"unknown"}


def test_command_line_scores_per_capsule(tmp_path, capsys):
    from monai_vce.metrics import metrics_by_group

    gt, pred, meta = tmp_path / "gt.json", tmp_path / "pred.json", tmp_path / "metadata.csv"
    gt.write_text(json.dumps(GT))
    pred.write_text(json.dumps(PRED))
    ids = [str(v["video_id"]) for v in GT["videos"]]
    meta.write_text(
        "video_id,capsule\n" + "".join(f"{v},{'NaviCam' if i else 'PillCam SB3'}\n" for i, v in enumerate(ids))
    )
    assert metrics_main(["--gt", str(gt), "--events", str(pred), "--metadata", str(meta)]) == 0
    result = json.loads(capsys.readouterr().out)
    groups = {v: "NaviCam" if i else "PillCam SB3" for i, v in enumerate(ids)}
    assert result["per_capsule"] == json.loads(json.dumps(metrics_by_group(GT, PRED, groups)))
    meta.write_text("video_id,capsule\nnot-a-video,NaviCam\n")
    assert metrics_main(["--gt", str(gt), "--events", str(pred), "--metadata", str(meta)]) == 2
    assert "names the capsule of none" in capsys.readouterr().err
    assert metrics_main(["--gt", str(gt), "--events", str(pred), "--metadata", str(tmp_path / "no.csv")]) == 2
    assert "--metadata: metadata file not found" in capsys.readouterr().err
