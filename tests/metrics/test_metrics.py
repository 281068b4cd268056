"""Temporal mAP: every rule of the challenge's scorer on hand-made cases, the vectorised implementation
against the per-pair reference, the command line and the ignite metric."""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

from monai_vce.__main__ import main
from monai_vce.events import Video
from monai_vce.labels import LABELS
from monai_vce.metrics import (
    average_precision,
    segment_tiou,
    temporal_map,
    temporal_map_reference,
    video_average_precision,
)

N = len(LABELS)


def ev(start, end, *labels):
    return {"start": start, "end": end, "label": list(labels)}


def doc(**videos):
    return {"videos": [{"video_id": vid, "events": events} for vid, events in videos.items()]}


def ap_of(gt_events, pred_events, label, t):
    res = temporal_map(doc(v=gt_events), doc(v=pred_events), tiou_thresholds=(t,))
    return res["per_video"]["v"]["AP"][label][f"{t:g}"]


# ---------------------------------------------------------------- hand-made rules


def test_perfect_prediction_scores_one():
    gt = doc(a=[ev(0, 9, "colon"), ev(10, 12, "blood", "colon")])
    res = temporal_map(gt, gt)
    assert res["mAP@0.5"] == 1.0 and res["mAP@0.95"] == 1.0
    assert set(res) >= {"mAP@0.5", "mAP@0.95", "per_video", "per_label"}
    assert res["per_video"]["a"]["AP"]["colon"] == {"0.5": 1.0, "0.95": 1.0}


def test_ap_formula_and_order_effect():
    gt = [ev(0, 9, "blood"), ev(20, 29, "blood")]
    # false positive first: tp = [0, 1, 1]; precision 0, 1/2, 2/3; recall 0, 1/2, 1
    late = [ev(100, 110, "blood"), ev(0, 9, "blood"), ev(20, 29, "blood")]
    expected = 0.0 * 0.0 + (1 / 2) * (1 / 2) + (2 / 3) * (1 / 2)
    assert ap_of(gt, late, "blood", 0.5) == pytest.approx(expected, abs=1e-15)
    # the same three events with the false positive listed last: tp = [1, 1, 0]
    early = [ev(0, 9, "blood"), ev(20, 29, "blood"), ev(100, 110, "blood")]
    assert ap_of(gt, early, "blood", 0.5) == 1.0
    assert expected < 1.0


def test_absent_label_rule():
    gt = doc(v=[ev(0, 99, "colon")])
    empty = temporal_map(gt, doc(v=[]))
    ap = empty["per_video"]["v"]["AP"]
    assert ap["colon"]["0.5"] == 0.0  # present label, nothing predicted
    assert all(ap[name]["0.5"] == 1.0 for name in LABELS if name != "colon")
    assert empty["mAP@0.5"] == pytest.approx((N - 1) / N)
    # predicting an absent label costs its whole AP
    wrong = temporal_map(gt, doc(v=[ev(0, 99, "colon"), ev(5, 6, "polyp")]))
    assert wrong["per_video"]["v"]["AP"]["polyp"]["0.5"] == 0.0
    assert wrong["per_video"]["v"]["AP"]["colon"]["0.5"] == 1.0
    assert wrong["mAP@0.5"] == pytest.approx((N - 1) / N)


@pytest.mark.parametrize(
    "gt_seg, pred_seg, t, hit",
    [
        ((0, 9), (0, 4), 0.5, True),  # 5 / 10 exactly: inclusive counting, >= threshold
        ((0, 9), (0, 3), 0.5, False),  # 4 / 10
        ((0, 9), (5, 14), 0.5, False),  # 5 / 15
        ((0, 99), (0, 94), 0.95, True),  # 95 / 100 exactly
        ((0, 99), (0, 93), 0.95, False),  # 94 / 100
        ((0, 18), (0, 19), 0.95, True),  # 19 / 20
        ((10, 109), (5, 109), 0.95, True),  # 100 / 105
        ((10, 109), (4, 109), 0.95, False),  # 100 / 106
        ((7, 7), (7, 7), 0.95, True),  # one-frame events overlap in one frame
        ((7, 7), (8, 8), 0.5, False),
    ],
)
def test_tiou_inclusive_boundaries(gt_seg, pred_seg, t, hit):
    ap = ap_of([ev(*gt_seg, "erosion")], [ev(*pred_seg, "erosion")], "erosion", t)
    assert ap == (1.0 if hit else 0.0)


def test_segment_tiou_values():
    iou = segment_tiou(np.array([[0, 4], [0, 9], [20, 29]]), np.array([[0, 9]]))
    np.testing.assert_array_equal(iou[:, 0], [0.5, 1.0, 0.0])


def test_greedy_takes_first_listed_match_not_best():
    # g0 = [0, 10], g1 = [0, 9]; p0 = [0, 9] qualifies for both (10/11 and 1.0) and takes g0, the first listed;
    # p1 = [0, 11] qualifies only for g0 (11/12; 10/12 < 0.9 with g1), now taken: a false positive.
    gt = [ev(0, 10, "ulcer"), ev(0, 9, "ulcer")]
    pred = [ev(0, 9, "ulcer"), ev(0, 11, "ulcer")]
    assert ap_of(gt, pred, "ulcer", 0.9) == pytest.approx(1.0 * 0.5)  # tp = [1, 0]
    # an optimal assignment would have scored 1.0: listing the ground truth the other way round does
    assert ap_of(gt[::-1], pred, "ulcer", 0.9) == 1.0


def test_duplicates_are_false_positives():
    gt = [ev(0, 9, "polyp"), ev(20, 29, "polyp")]
    pred = [ev(0, 9, "polyp"), ev(0, 9, "polyp"), ev(20, 29, "polyp")]  # tp = [1, 0, 1]
    assert ap_of(gt, pred, "polyp", 0.5) == pytest.approx(1 * 0.5 + (2 / 3) * 0.5)
    assert ap_of(gt[:1], pred[:2], "polyp", 0.5) == 1.0  # after full recall a duplicate costs nothing


def test_multi_label_events_count_for_each_label():
    gt = doc(v=[ev(0, 9, "colon"), ev(10, 19, "blood", "colon")])
    pred = doc(v=[ev(0, 19, "colon"), ev(10, 19, "blood")])
    ap = temporal_map(gt, pred, tiou_thresholds=(0.5,))["per_video"]["v"]["AP"]
    # colon: gt [0,9], [10,19]; pred [0,19] has tIoU 10/20 = 0.5 with [0,9]: tp [1], recall 1/2
    assert ap["colon"]["0.5"] == pytest.approx(0.5)
    assert ap["blood"]["0.5"] == 1.0


def test_mean_over_labels_then_videos_and_per_label():
    gt = doc(a=[ev(0, 9, "colon")], b=[ev(0, 9, "colon"), ev(3, 5, "blood", "colon")])
    pred = doc(a=[ev(0, 9, "colon")], b=[ev(0, 9, "colon")])
    res = temporal_map(gt, pred)
    assert res["per_video"]["a"]["mAP@0.5"] == 1.0
    # video b: colon gt [0,9], [3,5]; pred [0,9] matches the first -> AP 1/2; blood AP 0; 15 absent labels 1
    vb = (15 + 0.5 + 0.0) / N
    assert res["per_video"]["b"]["mAP@0.5"] == pytest.approx(vb)
    assert res["mAP@0.5"] == pytest.approx((1.0 + vb) / 2)
    assert res["per_label"]["blood"]["0.5"] == pytest.approx(0.5)
    assert res["per_label"]["colon"]["0.5"] == pytest.approx(0.75)
    assert res["num_videos"] == 2


def test_missing_and_extra_prediction_videos():
    gt = doc(a=[ev(0, 9, "colon")], b=[ev(0, 9, "stomach")])
    pred = doc(a=[ev(0, 9, "colon")], z=[ev(0, 9, "stomach")])
    res = temporal_map(gt, pred)
    assert res["missing_pred_videos"] == ["b"] and res["extra_pred_videos"] == ["z"]
    assert set(res["per_video"]) == {"a", "b"}
    assert res["per_video"]["b"]["mAP@0.5"] == pytest.approx((N - 1) / N)  # scored as empty


def test_any_threshold_key_and_labels_subset():
    gt = doc(v=[ev(0, 9, "colon"), ev(0, 3, "blood")])
    pred = doc(v=[ev(0, 6, "colon")])  # tIoU 0.7
    res = temporal_map(gt, pred, tiou_thresholds=(0.3, 0.75), labels=("colon", "blood"))
    assert res["mAP@0.3"] == pytest.approx(0.5) and res["mAP@0.75"] == 0.0
    assert set(res["per_video"]["v"]["AP"]) == {"colon", "blood"}
    with pytest.raises(ValueError, match="thresholds"):
        temporal_map(gt, pred, tiou_thresholds=(1.5,))
    with pytest.raises(ValueError, match="LABELS"):
        temporal_map(gt, pred, labels=("tumour",))


def test_invalid_input_raises_clear_error():
    gt = doc(v=[ev(0, 9, "colon")])
    with pytest.raises(ValueError, match=r"(?s)prediction: .*'label' must be a list"):
        temporal_map(gt, {"videos": [{"video_id": "v", "events": [{"start": 0, "end": 9, "label": "colon"}]}]})
    with pytest.raises(ValueError, match="no videos"):
        temporal_map({"videos": []}, gt)
    # extra keys (the decoder's "score") are tolerated by the metric
    scored = doc(v=[{"start": 0, "end": 9, "label": ["colon"], "score": 0.9}])
    assert temporal_map(gt, scored)["mAP@0.5"] == 1.0


def test_file_paths_accepted(tmp_path):
    gt = doc(v=[ev(0, 9, "colon")])
    (tmp_path / "gt.json").write_text(json.dumps(gt))
    (tmp_path / "pred.json").write_text(json.dumps(gt))
    assert temporal_map(tmp_path / "gt.json", str(tmp_path / "pred.json"))["mAP@0.95"] == 1.0


# ---------------------------------------------------------------- vectorised == reference


def _random_doc(rng, n_videos, max_events, span, labels=LABELS[:5]):
    videos = []
    for v in range(n_videos):
        events = []
        for _ in range(int(rng.integers(0, max_events + 1))):
            s = int(rng.integers(0, span))
            e = s + int(rng.integers(0, span // 3 + 1))
            k = int(rng.integers(1, 3))
            events.append(ev(s, e, *rng.choice(labels, size=k, replace=False).tolist()))
        videos.append({"video_id": str(v), "events": events})
    return {"videos": videos}


def _close(a, b):
    assert a["mAP@0.5"] == pytest.approx(b["mAP@0.5"], abs=1e-12)
    for vid in b["per_video"]:
        for name, aps in b["per_video"][vid]["AP"].items():
            for key, value in aps.items():
                assert a["per_video"][vid]["AP"][name][key] == pytest.approx(value, abs=1e-12), (vid, name, key)


def test_vectorised_equals_reference_on_random_event_sets():
    rng = np.random.default_rng(0)
    thresholds = (0.0, 0.1, 0.3, 0.5, 0.7, 0.95, 1.0)
    for case in range(150):
        # small spans make many overlapping, competing and duplicate segments
        span = int(rng.integers(5, 60))
        gt = _random_doc(rng, 3, 12, span)
        pred = _random_doc(rng, 3, 15, span)
        if case % 5 == 0:  # duplicate a few predictions and shuffle
            for v in pred["videos"]:
                v["events"] = v["events"] + v["events"][: len(v["events"]) // 2]
                rng.shuffle(v["events"])
        _close(
            temporal_map(gt, pred, tiou_thresholds=thresholds),
            temporal_map_reference(gt, pred, tiou_thresholds=thresholds),
        )


def test_vectorised_blocks_equal_whole(monkeypatch):
    import importlib

    # the package attribute temporal_map is the function; the module is reached by its full name
    tmm = importlib.import_module("monai_vce.metrics.temporal_map")

    rng = np.random.default_rng(1)
    gt = _random_doc(rng, 2, 40, 200)
    pred = _random_doc(rng, 2, 60, 200)
    whole = temporal_map(gt, pred)
    monkeypatch.setattr(tmm, "_PAIR_BLOCK", 7)  # many small blocks of predictions
    _close(temporal_map(gt, pred), whole)
    _close(whole, temporal_map_reference(gt, pred))


def test_low_level_functions_agree():
    gt_events = [ev(0, 9, "blood"), ev(20, 29, "blood", "colon")]
    pred_events = [ev(100, 110, "blood"), ev(0, 9, "blood"), ev(20, 29, "blood")]
    table = video_average_precision(gt_events, pred_events, tiou_thresholds=(0.5, 0.95))
    assert table.shape == (N, 2)
    assert table[LABELS.index("blood"), 0] == pytest.approx(0.25 + 1 / 3)
    assert table[LABELS.index("colon"), 0] == 0.0
    np.testing.assert_allclose(
        average_precision([[0, 9], [20, 29]], [[100, 110], [0, 9], [20, 29]], 0.5), [0.25 + 1 / 3]
    )


# ---------------------------------------------------------------- command line


def _cli(*args):
    """``python -m monai_vce metrics ...`` in this process (an interpreter per call would cost seconds of imports)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["metrics", *map(str, args)])
    return subprocess.CompletedProcess(args, code, out.getvalue(), err.getvalue())


def test_cli_prints_result_and_writes_out(tmp_path):
    gt = doc(a=[ev(0, 9, "colon")], b=[ev(0, 9, "stomach"), ev(10, 19, "blood")])
    pred = doc(a=[ev(0, 9, "colon")], b=[ev(0, 9, "stomach")])
    (tmp_path / "gt.json").write_text(json.dumps(gt))
    (tmp_path / "pred.json").write_text(json.dumps(pred))
    proc = _cli("--gt", tmp_path / "gt.json", "--events", tmp_path / "pred.json", "--out", tmp_path / "r.json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    expected = temporal_map(gt, pred)
    assert out["mAP@0.5"] == pytest.approx(expected["mAP@0.5"]) and out["mAP@0.5"] < 1.0
    assert out["mAP@0.95"] == pytest.approx(expected["mAP@0.95"])
    assert set(out["per_video"]) == {"a", "b"}
    assert json.loads((tmp_path / "r.json").read_text()) == out
    proc = _cli("--gt", tmp_path / "gt.json", "--events", tmp_path / "pred.json", "--tiou-thresholds", "0.3", "0.7")
    assert set(json.loads(proc.stdout)) >= {"mAP@0.3", "mAP@0.7"}


def test_cli_invalid_files_exit_2_without_traceback(tmp_path):
    gt = doc(a=[ev(0, 9, "colon")], b=[ev(0, 9, "stomach")])
    (tmp_path / "gt.json").write_text(json.dumps(gt))
    bad = {"videos": [{"video_id": "a", "events": [{"start": 9, "end": 3, "label": "colon"}, ev(0, 1, "tumour")]}]}
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    proc = _cli("--gt", tmp_path / "gt.json", "--events", tmp_path / "bad.json")
    assert proc.returncode == 2 and proc.stdout == ""
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 4 and all(line.startswith("error: ") for line in lines), lines
    assert any("video 'a' (videos[0]) event 0: start 9 > end 3" in line for line in lines)
    assert any("event 0: 'label' must be a list" in line for line in lines)
    assert any("event 1: unknown label 'tumour'" in line for line in lines)
    assert any("video 'b': in the ground truth but missing from the prediction" in line for line in lines)

    (tmp_path / "broken.json").write_text('{"videos": [\n  {"video_id": "a",}\n]}')
    proc = _cli("--gt", tmp_path / "gt.json", "--events", tmp_path / "broken.json")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "not valid JSON" in proc.stderr and "line 2" in proc.stderr

    proc = _cli("--gt", tmp_path / "gt.json", "--events", tmp_path / "nope.json")
    assert proc.returncode == 2 and "not found" in proc.stderr and "Traceback" not in proc.stderr


def test_cli_missing_videos_refused_unless_allowed(tmp_path):
    gt = doc(a=[ev(0, 9, "colon")], b=[ev(0, 9, "stomach")])
    pred = doc(a=[ev(0, 9, "colon")])
    (tmp_path / "gt.json").write_text(json.dumps(gt))
    (tmp_path / "pred.json").write_text(json.dumps(pred))
    assert _cli("--gt", tmp_path / "gt.json", "--events", tmp_path / "pred.json").returncode == 2
    proc = _cli("--gt", tmp_path / "gt.json", "--events", tmp_path / "pred.json", "--allow-missing-videos")
    assert proc.returncode == 0
    assert json.loads(proc.stdout)["per_video"]["b"]["mAP@0.5"] == pytest.approx((N - 1) / N)


# ---------------------------------------------------------------- ignite metric


def _video_targets(T, spans):
    y = np.zeros((T, N), dtype=np.float32)
    for name, s, e in spans:
        y[s : e + 1, LABELS.index(name)] = 1.0
    return y


def _run_engine(metric, batches, decollate=False):
    import torch
    from ignite.engine import Engine

    def step(engine, batch):
        if decollate:
            engine.state.batch = [
                {"video_id": v, "frame_index": torch.tensor(f)}
                for v, f in zip(batch["video_id"], batch["frame_index"].tolist(), strict=False)
            ]
            return [{"pred": p, "label": y} for p, y in zip(batch["pred"], batch["label"], strict=False)]
        return {"pred": batch["pred"], "label": batch["label"]}

    engine = Engine(step)
    metric.attach(engine, "tmap")
    engine.run(batches, max_epochs=1)
    return engine


def _batches(videos, batch_size, rng):
    import torch

    rows = [
        (vid, i, p, y)
        for vid, (probs, targets) in videos.items()
        for i, (p, y) in enumerate(zip(probs, targets, strict=False))
    ]
    order = rng.permutation(len(rows))  # frames arrive shuffled across videos and batches
    out = []
    for lo in range(0, len(rows), batch_size):
        chunk = [rows[k] for k in order[lo : lo + batch_size]]
        out.append(
            {
                "video_id": [c[0] for c in chunk],
                "frame_index": torch.tensor([c[1] for c in chunk]),
                "pred": torch.tensor(np.stack([c[2] for c in chunk])),
                "label": torch.tensor(np.stack([c[3] for c in chunk])),
            }
        )
    return out


@pytest.mark.parametrize("decollate", [False, True])
def test_ignite_metric_on_synthetic_videos(decollate):
    from monai_vce.handlers import TemporalMAPMetric
    from monai_vce.postprocessing import event_json, frames_to_events

    rng = np.random.default_rng(0)
    y1 = _video_targets(60, [("stomach", 0, 29), ("small intestine", 30, 59), ("blood", 40, 44)])
    y2 = _video_targets(40, [("colon", 0, 39), ("polyp", 10, 12)])
    p1 = y1 * 0.9 + 0.05
    p2 = y2 * 0.9 + 0.05
    p2[:, LABELS.index("polyp")] = 0.05  # the polyp is missed
    videos = {"v1": (p1, y1), "v2": (p2, y2)}
    metric = TemporalMAPMetric(tiou_thresholds=(0.5, 0.95))
    engine = _run_engine(metric, _batches(videos, 7, rng), decollate=decollate)

    ids1, ids2 = np.arange(60), np.arange(40)
    gt = event_json({"v1": frames_to_events(y1 > 0.5, ids1), "v2": frames_to_events(y2 > 0.5, ids2)})
    pred = event_json({"v1": frames_to_events(p1 >= 0.5, ids1), "v2": frames_to_events(p2 >= 0.5, ids2)})
    expected = temporal_map(gt, pred)
    assert expected["mAP@0.5"] < 1.0
    assert engine.state.metrics["tmap"] == pytest.approx(expected["mAP@0.5"])
    assert engine.state.metrics["tmap_tiou0.95"] == pytest.approx(expected["mAP@0.95"])
    assert engine.state.metric_details["tmap"]["per_video"]["v1"]["mAP@0.5"] == 1.0
    assert set(engine.state.metric_details["tmap"]["per_video"]) == {"v1", "v2"}


def test_ignite_metric_custom_decoder_sigmoid_and_four_item_transform():
    import torch
    from ignite.engine import Engine

    from monai_vce.handlers import TemporalMAPMetric

    y = _video_targets(30, [("colon", 0, 29)])
    logits = np.where(y > 0.5, 4.0, -4.0).astype(np.float32)
    calls = []

    def decoder(probs, frame_ids):
        calls.append((probs.copy(), frame_ids.copy()))
        return [{"start": int(frame_ids[0]), "end": int(frame_ids[-1]), "label": ["colon"], "score": 1.0}]

    metric = TemporalMAPMetric(
        decoder=decoder,
        sigmoid=True,
        output_transform=lambda out: (out["y_pred"], out["y"], out["vid"], out["idx"]),
    )
    # frame ids with gaps (every 5th frame), listed twice (as a padded distributed sampler does)
    idx = np.arange(30) * 5
    data = [
        {
            "y_pred": torch.tensor(logits[lo : lo + 10]),
            "y": torch.tensor(y[lo : lo + 10]),
            "vid": ["x"] * 10,
            "idx": torch.tensor(idx[lo : lo + 10]),
        }
        for lo in (20, 0, 10, 0)
    ]
    engine = Engine(lambda e, b: b)
    metric.attach(engine, "m")
    engine.run(data, max_epochs=1)
    assert engine.state.metrics["m"] == 1.0
    probs, frame_ids = calls[0]
    np.testing.assert_array_equal(frame_ids, idx)
    assert probs.min() > 0.0 and probs.max() < 1.0 and probs[0, LABELS.index("colon")] > 0.98


def test_ignite_metric_without_frames_is_not_computable():
    from ignite.exceptions import NotComputableError

    from monai_vce.handlers import TemporalMAPMetric

    with pytest.raises(NotComputableError):
        TemporalMAPMetric().compute()


def _distributed_worker(local_rank, out_dir):
    import ignite.distributed as idist
    import torch
    from ignite.engine import Engine

    from monai_vce.handlers import TemporalMAPMetric

    rank = idist.get_rank()
    y = {
        "v1": _video_targets(20, [("stomach", 0, 9), ("small intestine", 10, 19)]),
        "v2": _video_targets(10, [("colon", 0, 9)]),
    }
    p = {k: v.copy() for k, v in y.items()}
    p["v1"][15, LABELS.index("small intestine")] = 0.0  # splits the predicted run only once frames are combined
    # rank 0 holds v1's even frames and all of v2, rank 1 v1's odd frames (among them frame 15) and a
    # duplicate of v1's frame 0 (as a padded distributed sampler produces)
    if rank == 0:
        rows = [("v1", i) for i in range(0, 20, 2)] + [("v2", i) for i in range(10)]
    else:
        rows = [("v1", i) for i in range(1, 20, 2)] + [("v1", 0)]
    batch = {
        "video_id": [v for v, _ in rows],
        "frame_index": torch.tensor([i for _, i in rows]),
        "pred": torch.tensor(np.stack([p[v][i] for v, i in rows])),
        "label": torch.tensor(np.stack([y[v][i] for v, i in rows])),
    }
    metric = TemporalMAPMetric()
    engine = Engine(lambda e, b: {"pred": b["pred"], "label": b["label"]})
    metric.attach(engine, "m")
    engine.run([batch], max_epochs=1)
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(engine.state.metric_details["m"]))


@pytest.mark.background
@pytest.mark.slow
def test_ignite_metric_gathers_across_ranks(tmp_path):
    import ignite.distributed as idist

    with idist.Parallel(backend="gloo", nproc_per_node=2) as parallel:
        parallel.run(_distributed_worker, str(tmp_path))
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert results[0] == results[1]
    assert set(results[0]["per_video"]) == {"v1", "v2"}
    # combined, small intestine is predicted as [10, 14] and [16, 19] against [10, 19]: tIoU 0.5 and 0.4
    si = results[0]["per_video"]["v1"]["AP"]["small intestine"]
    assert si == {"0.5": 1.0, "0.95": 0.0}
    assert results[0]["per_video"]["v2"]["mAP@0.5"] == 1.0


def test_ignite_metric_cross_fitted_decoder_scores_each_video_with_a_decoder_tuned_on_the_others():
    from monai_vce.handlers import TemporalMAPMetric
    from monai_vce.postprocessing import EventDecoder, event_json, frames_to_events, tune_decoder, video_folds

    rng = np.random.default_rng(1)
    videos = {}
    for k in range(4):
        y = _video_targets(
            80, [("stomach", 0, 19), ("small intestine", 20, 59), ("colon", 60, 79), ("blood", 30 + k, 36 + k)]
        )
        # a confident but biased model: a fixed 0.5 threshold emits every label everywhere
        p = np.clip(0.55 + 0.4 * y + rng.normal(0, 0.02, y.shape), 0, 1).astype(np.float32)
        videos[f"v{k}"] = (p, y)
    kwargs = {"grids": {"threshold": (0.5, 0.8)}, "anatomy": False, "rounds": 1}
    cross = TemporalMAPMetric(decoder="cross_fitted", folds=2, tune_kwargs=kwargs)
    fixed = TemporalMAPMetric()
    e_cross = _run_engine(cross, _batches(videos, 16, rng))
    e_fixed = _run_engine(fixed, _batches(videos, 16, rng))

    # the same computation by hand: folds over the sorted video ids, tune on the other fold, decode this one
    vids = sorted(videos)
    ids = np.arange(80)
    gt = {v: frames_to_events(videos[v][1] > 0.5, ids) for v in vids}
    fold = video_folds(len(vids), 2, seed=0)
    pred = {}
    for k in (0, 1):
        fit = [Video(v, videos[v][0], ids, ids, events=gt[v]) for v, f in zip(vids, fold, strict=False) if f != k]
        dec = EventDecoder(tune_decoder(fit, **kwargs))
        pred.update({v: dec(videos[v][0], ids) for v, f in zip(vids, fold, strict=False) if f == k})
    expected = temporal_map(event_json(gt), event_json(pred))
    assert e_cross.state.metrics["tmap"] == pytest.approx(expected["mAP@0.5"])
    # the fixed 0.5 threshold is fooled by the bias, the tuned decoder is not
    assert e_cross.state.metrics["tmap"] > e_fixed.state.metrics["tmap"] + 0.3

    few = TemporalMAPMetric(decoder="cross_fitted", folds=2)
    with pytest.warns(UserWarning, match="cannot be cross-fitted"):
        e_few = _run_engine(few, _batches({"v0": videos["v0"]}, 16, rng))
    assert 0.0 <= e_few.state.metrics["tmap"] <= 1.0
    with pytest.raises(ValueError, match="cross_fitted"):
        TemporalMAPMetric(decoder="tuned")


def test_tiou_thresholds_name_the_result_keys():
    from monai_vce.metrics import tiou_key
    from monai_vce.postprocessing import DecoderParams, tune_decoder

    gt = {"videos": [{"video_id": "v", "events": [ev(0, 9, "colon")]}]}
    pred = {"videos": [{"video_id": "v", "events": [ev(0, 7, "colon")]}]}
    res = temporal_map(gt, pred, tiou_thresholds=(0.5, 0.9))
    assert res["tiou_thresholds"] == [0.5, 0.9] and res["mAP@0.5"] == 1.0 and "mAP@0.9" in res
    assert res["per_label"]["colon"] == {"0.5": 1.0, "0.9": 0.0}  # tIoU 0.8
    assert tiou_key(0.95) == "0.95" and tiou_key(0.5) == "0.5"
    p = np.zeros((20, N))
    p[:10, LABELS.index("colon")] = 0.9
    ids = np.arange(20)
    videos = [Video("v", p, ids, ids, events=gt["videos"][0]["events"])]
    kwargs = {"grids": {"threshold": (0.5,)}, "anatomy": False, "rounds": 1, "presence_folds": 0}
    assert isinstance(tune_decoder(videos, tiou_thresholds=(0.5,), **kwargs), DecoderParams)


def test_ignite_metric_scores_its_tiou_threshold_first_in_the_given_units():
    from monai_vce.events import FrameUnits
    from monai_vce.handlers import TemporalMAPMetric

    metric = TemporalMAPMetric(tiou_threshold=0.95, tiou_thresholds=(0.5, 0.95), frame_units="frame_number")
    assert metric.tiou_threshold == 0.95 and metric.tiou_thresholds == (0.95, 0.5)
    assert metric.collector.frame_units is FrameUnits.FRAME_NUMBER
    with pytest.raises(ValueError, match="frame_units must be one of"):
        TemporalMAPMetric(frame_units="frames")


def test_expected_calibration_error_by_hand():
    from monai_vce.metrics import expected_calibration_error

    # class 0: bin [0.2, 0.4) holds 0.3, 0.3 with one positive -> |0.6 - 1| = 0.4; bin [0.8, 1] holds 0.9, 0.9 with
    # two positives -> |1.8 - 2| = 0.2; ECE = (0.4 + 0.2) / 4. Class 1: perfectly calibrated 0 / 1.
    probs = np.array([[0.3, 0.0], [0.3, 1.0], [0.9, 0.0], [0.9, 1.0]])
    targets = np.array([[1, 0], [0, 1], [1, 0], [1, 1]])
    ece = expected_calibration_error(probs, targets, bins=5)
    assert ece == pytest.approx([0.15, 0.0])
    # a reference loop over bins with the same edges
    rng = np.random.default_rng(0)
    p, t = rng.random((500, 3)), rng.random((500, 3)) < 0.3
    ref = []
    for c in range(3):
        b = np.minimum((p[:, c] * 10).astype(int), 9)
        ref.append(sum(abs(p[b == k, c].sum() - t[b == k, c].sum()) for k in range(10)) / 500)
    assert expected_calibration_error(p, t, bins=10) == pytest.approx(ref)
    assert np.isnan(expected_calibration_error(np.zeros((0, 2)), np.zeros((0, 2)))).all()
    with pytest.raises(ValueError, match="bins"):
        expected_calibration_error(probs, targets, bins=0)
