"""Tests of monai_vce.report: timelines, summary page, command line, optional matplotlib."""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("matplotlib")
from conftest import GALAR_EVENTS as GALAR
from conftest import GALAR_MISSING
from PIL import Image

from monai_vce.labels import LABELS, SECTIONS
from monai_vce.metrics import lesion_froc, metrics_by_group, temporal_map
from monai_vce.report import (
    draw_summary,
    draw_timeline,
    figure_to_png,
    label_cuts,
    label_intervals,
    max_pool_trace,
    presence_matrix,
    write_report,
)
from monai_vce.report.__main__ import main


def _ev(start, end, *labels):
    return {"start": start, "end": end, "label": list(labels)}


# two small videos; the prediction differs from the ground truth in its boundaries, misses a landmark and a
# pathology (FN) and predicts a pathology the video lacks (FP)
GT = {
    "videos": [
        {
            "video_id": "a",
            "events": [
                _ev(0, 99, "mouth"),
                _ev(100, 149, "esophagus"),
                _ev(150, 154, "esophagus", "z-line"),
                _ev(155, 899, "stomach"),
                _ev(900, 2999, "small intestine"),
                _ev(3000, 3049, "small intestine", "angiectasia"),
                _ev(3050, 3499, "small intestine"),
                _ev(3500, 3999, "colon"),
            ],
        },
        {
            "video_id": "b",
            "events": [
                _ev(0, 1999, "stomach"),
                _ev(2000, 2999, "small intestine"),
                _ev(3000, 3010, "small intestine", "ulcer"),
                _ev(3011, 3999, "small intestine"),
            ],
        },
    ]
}
PRED = {
    "videos": [
        {
            "video_id": "a",
            "events": [
                _ev(0, 110, "mouth"),
                _ev(111, 160, "esophagus"),
                _ev(161, 880, "stomach"),
                _ev(881, 3010, "small intestine"),
                _ev(3011, 3040, "small intestine", "angiectasia"),
                _ev(3041, 3520, "small intestine"),
                _ev(3521, 3999, "colon"),
            ],
        },
        {
            "video_id": "b",
            "events": [
                _ev(0, 2100, "stomach"),
                _ev(2101, 2600, "small intestine"),
                _ev(2601, 2700, "small intestine", "polyp"),
                _ev(2701, 3999, "small intestine"),
            ],
        },
    ]
}
FRAMES = 4000


def _write_probs(folder: Path, video_id: str, n: int, seed: int = 0, frame_number_offset: int = 0) -> Path:
    from monai_vce.utils import atomic_save_npz

    rng = np.random.default_rng(seed)
    return atomic_save_npz(
        folder / f"{video_id}.npz",
        probs=rng.random((n, len(LABELS)), dtype=np.float32),
        frame_index=np.arange(n, dtype=np.int64),
        frame_number=np.arange(n, dtype=np.int64) * 2 + frame_number_offset,
        labels=np.array(LABELS),
        video_id=np.asarray(video_id),
        source=np.asarray(""),
    )


@pytest.fixture()
def files(tmp_path):
    gt, pred, probs = tmp_path / "gt.json", tmp_path / "pred.json", tmp_path / "probs"
    gt.write_text(json.dumps(GT))
    pred.write_text(json.dumps(PRED))
    for i, v in enumerate(("a", "b")):
        _write_probs(probs, v, FRAMES, seed=i)
    return gt, pred, probs


def _by_id(obj):
    return {v["video_id"]: v["events"] for v in obj["videos"]}


def _png_size(path) -> tuple[int, int]:
    with Image.open(path) as im:
        return im.size


def _lanes(fig):
    return next(a for a in fig.axes if a.get_label() == "lanes")


def test_label_intervals_merge_and_order():
    iv = label_intervals(
        [_ev(10, 20, "blood", "stomach"), _ev(21, 30, "stomach"), _ev(5, 6, "stomach"), _ev(40, 40, "blood")]
    )
    assert list(iv) == list(LABELS)
    np.testing.assert_array_equal(iv["stomach"], [[5, 6], [10, 30]])
    np.testing.assert_array_equal(iv["blood"], [[10, 20], [40, 40]])
    assert iv["colon"].shape == (0, 2)


def test_label_cuts_mark_boundaries_between_touching_events():
    events = [_ev(0, 9, "stomach"), _ev(10, 19, "stomach", "blood"), _ev(20, 29, "stomach"), _ev(40, 50, "stomach")]
    cuts = label_cuts(events)
    np.testing.assert_array_equal(cuts["stomach"], [10, 20])  # 40 starts a new bar, not a boundary inside one
    assert cuts["blood"].size == 0 and cuts["colon"].size == 0


def test_max_pool_keeps_single_frame_peak_and_bounds_bins():
    n = 134_000
    probs = np.zeros((n, 2), np.float32)
    probs[76_543, 1] = 0.9
    edges, values = max_pool_trace(np.arange(n), probs, max_bins=2000)
    assert len(edges) == len(values) <= 2001
    assert values[:, 1].max() == pytest.approx(0.9) and values[:, 0].max() == 0
    # the bin holding the peak covers frame 76,543
    k = int(np.argmax(values[:-1, 1]))
    assert edges[k] <= 76_543 < edges[k + 1]
    assert edges[0] == 0 and edges[-1] == n
    # short videos are drawn frame by frame
    edges, values = max_pool_trace(np.arange(10), probs[:10], max_bins=2000)
    assert len(edges) == 11


def test_presence_matrix_codes():
    pres = presence_matrix(_by_id(PRED), _by_id(GT))
    assert list(pres) == ["a", "b"] and list(pres["a"]) == list(LABELS)
    assert pres["a"]["z-line"] == "FN" and pres["a"]["angiectasia"] == "TP" and pres["a"]["ulcer"] == "TN"
    assert pres["b"]["polyp"] == "FP" and pres["b"]["ulcer"] == "FN" and pres["b"]["stomach"] == "TP"


def test_draw_timeline_one_lane_per_label_in_order():
    rng = np.random.default_rng(0)
    scores = temporal_map(GT, PRED)["per_video"]["a"]
    fig = draw_timeline(
        "a",
        PRED["videos"][0]["events"],
        GT["videos"][0]["events"],
        rng.random((FRAMES, 17)),
        np.arange(FRAMES),
        scores=scores,
    )
    ax = _lanes(fig)
    assert [t.get_text() for t in ax.get_yticklabels()] == list(LABELS)
    assert ax.get_ylim() == (16.5, -0.5)  # LABELS[0] on top
    # one predicted-bar collection per label with events + one ground-truth collection per label with events
    bars = [c for c in ax.collections if type(c).__name__ == "PolyCollection" and c.get_zorder() == 3]
    n_pred = sum(len(v) > 0 for v in label_intervals(PRED["videos"][0]["events"]).values())
    n_gt = sum(len(v) > 0 for v in label_intervals(GT["videos"][0]["events"]).values())
    assert len(bars) == n_pred + n_gt
    texts = " ".join(t.get_text() for t in fig.texts)
    assert "video a" in texts and f"{scores['mAP@0.5']:.3f}" in texts and f"{scores['mAP@0.95']:.3f}" in texts
    right = next(a for a in fig.axes if a.get_label() == "ap")
    ap = scores["AP"]["stomach"]
    assert right.get_yticklabels()[LABELS.index("stomach")].get_text() == f"{ap['0.5']:.2f} / {ap['0.95']:.2f}"
    band = next(a for a in fig.axes if a.get_label() == "sections")
    assert len(band.collections) == len([s for s in SECTIONS if label_intervals(GT["videos"][0]["events"])[s].size])
    assert ax.get_xlabel() == "frame index"
    png = figure_to_png(fig)
    with Image.open(__import__("io").BytesIO(png)) as im:
        assert im.size == (1600, 700)


def test_large_video_renders_fast_with_bounded_artists():
    n = 134_000
    rng = np.random.default_rng(1)
    starts = np.sort(rng.choice(n - 50, size=3000, replace=False))
    events = [_ev(int(s), int(s) + int(rng.integers(0, 40)), LABELS[8 + i % 9]) for i, s in enumerate(starts)]
    events += [_ev(0, 60_000, "small intestine"), _ev(60_001, n - 1, "colon")]
    probs = rng.random((n, 17), dtype=np.float32)
    t0 = time.process_time()  # this process's CPU time: the machine's load does not inflate it
    fig = draw_timeline(
        "long",
        events,
        events,
        probs,
        np.arange(n),
        scores=temporal_map(
            {"videos": [{"video_id": "long", "events": events}]}, {"videos": [{"video_id": "long", "events": events}]}
        )["per_video"]["long"],
    )
    png = figure_to_png(fig)
    elapsed = time.process_time() - t0
    assert elapsed < 5.0, f"134,000-frame timeline took {elapsed:.1f} s of CPU"
    artists = sum(len(a.collections) + len(a.patches) + len(a.lines) for a in fig.axes)
    assert artists <= 3 * 17 + 10  # per lane: trace, predicted bars, ground-truth bars; never per frame
    ax = _lanes(fig)
    traces = [c for c in ax.collections if c.get_zorder() == 2]
    assert len(traces) == 17
    # a step outline: two vertices per bin on the top and on the baseline
    assert all(len(p.vertices) <= 4 * 2001 + 8 for c in traces for p in c.get_paths())
    assert ax.get_xlim() == (0.0, float(n))
    with Image.open(__import__("io").BytesIO(png)) as im:
        assert im.size == (1600, 700)


def test_write_report_numbers_equal_temporal_map(files, tmp_path):
    gt, pred, probs = files
    out = tmp_path / "report"
    res = write_report(pred, out, gt=gt, probs_dir=probs)
    expected = temporal_map(gt, pred)
    expected["lesions"] = lesion_froc(gt, pred)
    assert res["metrics"] == expected
    assert set(res["timelines"]) == {"a", "b"}
    for vid, path in res["timelines"].items():
        assert path == out / "timelines" / f"{vid}.png" and _png_size(path) == (1600, 700)
    assert _png_size(res["summary_png"]) == (1600, 900)
    summary = json.loads(res["summary_json"].read_text())
    assert summary["metrics"] == expected
    assert summary["presence"]["b"]["polyp"] == "FP"
    md = res["summary_md"].read_text()
    row = re.search(r"\| all videos \| ([0-9.]+) \| ([0-9.]+) \|", md)
    assert row and row.groups() == (f"{expected['mAP@0.5']:.3f}", f"{expected['mAP@0.95']:.3f}")
    for vid in ("a", "b"):
        pv = expected["per_video"][vid]
        assert re.search(rf"\| {vid} \| {pv['mAP@0.5']:.3f} \| {pv['mAP@0.95']:.3f} \|", md), vid
        assert f"(timelines/{vid}.png)" in md
    for name in LABELS:
        pl = expected["per_label"][name]
        assert f"| {name} | {pl['0.5']:.3f} | {pl['0.95']:.3f} |" in md, name
    assert "| b |" in md and re.search(r"\| b( \| (TP|FP|FN|\.)){17} \|", md)
    assert "![summary](summary.png)" in md
    assert not list(out.rglob(".*.tmp"))  # atomic writes leave no temporary file


def test_summary_figure_axes(files):
    gt, pred, _ = files
    metrics = temporal_map(gt, pred)
    pres = presence_matrix(_by_id(PRED), _by_id(GT))
    fig = draw_summary(metrics, pres)
    per_label = next(a for a in fig.axes if a.get_label() == "per_label")
    assert [t.get_text() for t in per_label.get_yticklabels()] == list(LABELS)
    widths = [p.get_width() for p in per_label.patches]
    np.testing.assert_allclose(widths[:17], [metrics["per_label"][n]["0.5"] for n in LABELS])
    np.testing.assert_allclose(widths[17:34], [metrics["per_label"][n]["0.95"] for n in LABELS])
    per_video = next(a for a in fig.axes if a.get_label() == "per_video")
    heights = [p.get_height() for p in per_video.patches]
    np.testing.assert_allclose(heights[:2], [metrics["per_video"][v]["mAP@0.5"] for v in ("a", "b")])
    presence = next(a for a in fig.axes if a.get_label() == "presence")
    codes = presence.images[0].get_array()
    assert codes.shape == (17, 2) and codes[LABELS.index("polyp"), 1] == 1  # FP


def test_subset_of_videos(files, tmp_path):
    gt, pred, probs = files
    res = write_report(pred, tmp_path / "r", gt=gt, probs_dir=probs, videos=["b"])
    only_b = {"videos": [v for v in GT["videos"] if v["video_id"] == "b"]}
    pred_b = {"videos": [v for v in PRED["videos"] if v["video_id"] == "b"]}
    assert res["metrics"] == {**temporal_map(only_b, pred_b), "lesions": lesion_froc(only_b, pred_b)}
    assert list(res["timelines"]) == ["b"]
    with pytest.raises(ValueError, match="'zz'"):
        write_report(pred, tmp_path / "r2", gt=gt, videos=["zz"])


def test_in_memory_prediction_with_scores(files, tmp_path):
    gt, _, _ = files
    pred = {
        "videos": [
            {"video_id": v["video_id"], "events": [{**e, "score": 0.5} for e in v["events"]]} for v in PRED["videos"]
        ]
    }
    res = write_report(pred, tmp_path / "mem", gt=gt)
    assert res["metrics"] == {**temporal_map(gt, PRED), "lesions": lesion_froc(gt, pred)}
    assert "- Prediction: `prediction`" in res["summary_md"].read_text()


def test_inference_mode_without_ground_truth(files, tmp_path):
    _, pred, probs = files
    out = tmp_path / "infer"
    res = write_report(pred, out, probs_dir=probs)
    assert res["metrics"] is None and res["summary_png"] is None and not (out / "summary.png").exists()
    assert all(_png_size(p) == (1600, 700) for p in res["timelines"].values())
    md = res["summary_md"].read_text()
    assert "mAP" not in md and "# Inference report" in md
    assert "| b | 4 | stomach, small intestine, polyp | [timeline](timelines/b.png) |" in md
    summary = json.loads(res["summary_json"].read_text())
    assert summary["metrics"] is None and summary["predicted_labels"]["a"] == [
        "mouth",
        "esophagus",
        "stomach",
        "small intestine",
        "colon",
        "angiectasia",
    ]
    fig = draw_timeline("b", PRED["videos"][1]["events"])
    band = next(a for a in fig.axes if a.get_label() == "sections")
    assert band.get_yticklabels()[0].get_text() == "sections (pred.)"
    assert not [a for a in fig.axes if a.get_label() == "ap"]


def test_frame_number_units(tmp_path):
    probs = tmp_path / "probs"
    _write_probs(probs, "a", 1000, frame_number_offset=100)  # frame_number = 2 * index + 100
    pred = {"videos": [{"video_id": "a", "events": [_ev(100, 1500, "stomach"), _ev(1502, 2098, "colon")]}]}
    res = write_report(pred, tmp_path / "r", probs_dir=probs, frame_units="frame_number")
    assert _png_size(res["timelines"]["a"]) == (1600, 700)
    # in frame-index units these events lie outside the 1,000 frames of the file: a clear mismatch error
    with pytest.raises(ValueError, match=r"video 'a'.*a\.npz.*--frame-units") as e:
        write_report(pred, tmp_path / "r2", probs_dir=probs, frame_units="frame_index")
    assert "cover frame_index 0 to 999" in str(e.value)
    with pytest.raises(ValueError, match=r"frame_units must be one of \['frame_index', 'frame_number'\], got 'index'"):
        write_report(pred, tmp_path / "r3", probs_dir=probs, frame_units="index")


def test_bad_inputs_name_the_file_or_video(files, tmp_path):
    gt, pred, probs = files
    bad = tmp_path / "bad.json"
    bad.write_text('{"videos": [')
    with pytest.raises(ValueError, match=r"bad.json"):
        write_report(bad, tmp_path / "o1", gt=gt)
    wrong_label = tmp_path / "wrong.json"
    wrong_label.write_text(json.dumps({"videos": [{"video_id": "a", "events": [_ev(0, 5, "stomac")]}]}))
    with pytest.raises(ValueError, match="stomac"):
        write_report(wrong_label, tmp_path / "o2")
    # a prediction lacking a ground-truth video
    with pytest.raises(ValueError, match="'b'"):
        write_report({"videos": PRED["videos"][:1]}, tmp_path / "o3", gt=gt)
    # a probability file of a video that is not in the prediction
    _write_probs(probs, "c", 10)
    with pytest.raises(ValueError, match=r"c\.npz"):
        write_report(pred, tmp_path / "o4", gt=gt, probs_dir=probs)
    (probs / "c.npz").unlink()
    # mismatched lengths inside a probability file
    from monai_vce.utils import atomic_save_npz

    atomic_save_npz(
        probs / "b.npz",
        probs=np.zeros((FRAMES, 17), np.float32),
        frame_index=np.arange(FRAMES - 1),
        frame_number=np.arange(FRAMES),
        labels=np.array(LABELS),
        video_id=np.asarray("b"),
        source=np.asarray(""),
    )
    with pytest.raises(ValueError, match=r"b\.npz.*frame_index"):
        write_report(pred, tmp_path / "o5", gt=gt, probs_dir=probs)
    (probs / "b.npz").unlink()
    with pytest.raises(FileNotFoundError, match=r"b\.npz.*'b'"):
        write_report(pred, tmp_path / "o6", gt=gt, probs_dir=probs)
    with pytest.raises(FileNotFoundError, match=r"missing.json"):
        write_report(tmp_path / "missing.json", tmp_path / "o7")


def test_missing_matplotlib_gives_install_hint(files, tmp_path, monkeypatch):
    _, pred, _ = files
    for mod in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.setitem(sys.modules, mod, None)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(ImportError, match=r"monai-vce\[report\]"):
        draw_timeline("a", PRED["videos"][0]["events"])
    out = tmp_path / "nothing"
    with pytest.raises(ImportError, match=r"monai-vce\[report\]"):
        write_report(pred, out)
    assert not out.exists()  # refused before writing anything
    assert main(["--events", str(pred), "--out", str(out)]) == 2


def test_command_line(files, tmp_path, capsys):
    gt, pred, probs = files
    out = tmp_path / "cli"
    assert main(["--events", str(pred), "--gt", str(gt), "--probs-dir", str(probs), "--out", str(out)]) == 0
    printed = json.loads(capsys.readouterr().out)
    expected = temporal_map(gt, pred)
    assert printed["mAP@0.5"] == expected["mAP@0.5"] and printed["mAP@0.95"] == expected["mAP@0.95"]
    assert Path(printed["summary_png"]).is_file() and set(printed["timelines"]) == {"a", "b"}
    assert main(["--events", str(tmp_path / "nope.json"), "--out", str(out)]) == 2
    assert "nope.json" in capsys.readouterr().err


@pytest.mark.skipif(not GALAR.is_file(), reason=GALAR_MISSING)
def test_real_galar_longest_video_timeline():
    data = json.loads(GALAR.read_text())
    video = max(data["videos"], key=lambda v: v["events"][-1]["end"])
    events = video["events"]
    fig = draw_timeline(video["video_id"], events, events)
    ax = _lanes(fig)
    assert ax.get_xlim()[1] == events[-1]["end"] + 1 > 100_000
    assert len(ax.collections) <= 2 * 17


def test_report_rows_per_capsule_lesions_and_seconds(files, tmp_path):
    from monai_vce.events import load_video_probs, save_video_probs

    gt, pred, probs = files
    rated = tmp_path / "rated"
    # video a at 4 frames/s, every 2nd frame a row: 2 rows per second; video b has no frame rate
    save_video_probs(rated / "a.npz", load_video_probs(probs / "a.npz").replace(frame_rate=4.0))
    save_video_probs(rated / "b.npz", load_video_probs(probs / "b.npz"))
    groups = {"a": "PillCam SB3", "b": "NaviCam"}
    res = write_report(pred, tmp_path / "report", gt=gt, probs_dir=rated, groups=groups)
    by_group = metrics_by_group(gt, pred, groups)
    assert res["metrics"]["per_capsule"] == by_group
    md = res["summary_md"].read_text()
    assert "## Per capsule" in md and "## Lesions (pathology events)" in md
    for name, g in by_group.items():
        assert f"| {name} | 1 | {g['mAP@0.5']:.3f} | {g['mAP@0.95']:.3f} | {g['lesions']} |" in md
    les = lesion_froc(gt, pred)["overall"]["overlap"]
    assert f"| all pathology | {les['lesions']} |" in md
    # a: frame numbers 0..7998 at 4 frames/s = 33:20; its one pathology event (angiectasia) covers 30 rows = 15 s
    pv = res["metrics"]["per_video"]["a"]
    assert f"| a | 33:20 | 0:15 | {pv['mAP@0.5']:.3f} |" in md
    assert re.search(r"\| b \| - \| - \| [0-9.]+ \|", md)
    summary = json.loads(res["summary_json"].read_text())
    assert summary["durations_seconds"]["a"] == {"duration": 1999.75, "flagged": 15.0}
    assert summary["durations_seconds"]["b"] == {"duration": None, "flagged": None}
