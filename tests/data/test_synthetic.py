"""Generated mini-Galar: layout, frame/index rules, ground truth, determinism, real timelines, rendering."""

from __future__ import annotations

import csv
import json
import warnings
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from monai_vce.data import build_galar_datalist, generate_mini_galar, synthetic
from monai_vce.data.render import iter_render_video
from monai_vce.data.synthetic import (
    builtin_timeline,
    events_to_matrix,
    load_timelines,
    main,
    resample_timeline,
    select_source_videos,
)
from monai_vce.labels import LABELS, PATHOLOGY, SECTIONS, label_index


def read_rows(path: Path) -> tuple[list[str], list[list[str]]]:
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    return rows[0], rows[1:]


def events_by_hand(path: Path) -> list[dict]:
    """The challenge's ground-truth rule on one label CSV, written independently of the package code: rows in
    index order, a new event where the label set changes, each event ending one frame before the next starts,
    names sorted, rows without labels kept as events with an empty label list."""
    header, rows = read_rows(path)
    rows = sorted(rows, key=lambda r: int(r[header.index("index")]))
    events: list[dict] = []
    for r in rows:
        index = int(r[header.index("index")])
        names = sorted(n for n in LABELS if r[header.index(n)] == "1")
        if events and events[-1]["label"] == names:
            events[-1]["end"] = index
        else:
            if events:
                events[-1]["end"] = index - 1
            events.append({"start": index, "end": index, "label": names})
    return events


def all_files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_layout(mini_galar):
    meta_header, meta = read_rows(mini_galar / "metadata.csv")
    assert meta_header[:2] == ["video_id", "capsule"]
    ids = [r[0] for r in meta]
    assert ids == ["1", "2", "3", "ukdd_navi_00004"]
    assert sorted(p.name for p in (mini_galar / "frames").iterdir()) == sorted(ids)
    for vid in ids:
        header, rows = read_rows(mini_galar / "labels" / f"{vid}.csv")
        assert header[0] == "index" and header[-1] == "frame"
        assert set(LABELS) < set(header) and {"bubbles", "dirt"} < set(header)
        index = np.array([int(r[0]) for r in rows])
        frame = np.array([int(r[-1]) for r in rows])
        assert index.tolist() == list(range(60))
        files = sorted(p.name for p in (mini_galar / "frames" / vid).iterdir())
        if vid.startswith("ukdd_navi"):
            assert files == sorted(f"frame_{n:07d}.png" for n in frame)
        else:
            assert files == sorted(f"frame_{n:06d}.PNG" for n in frame)
        offset = frame - 5 * index
        if ids.index(vid) % 2:  # odd videos: every 5th frame annotated
            assert (offset == offset[0]).all() and 0 <= offset[0] < 5
        else:
            assert (frame == index).all()
    im = Image.open(next((mini_galar / "frames" / "1").iterdir()))
    assert im.size == (32, 32) and im.mode == "RGB"


def test_ground_truth_equals_events_of_label_csvs(mini_galar):
    gt = json.loads((mini_galar / "ground_truth.json").read_text())
    assert [v["video_id"] for v in gt["videos"]] == ["1", "2", "3", "ukdd_navi_00004"]
    for v in gt["videos"]:
        assert v["events"] == events_by_hand(mini_galar / "labels" / f"{v['video_id']}.csv")
        assert all(e["start"] <= e["end"] < 60 for e in v["events"])


def test_datalist_labels_match_images(mini_galar):
    """Each item's label is the CSV row whose frame number is in its file name."""
    dl = build_galar_datalist(mini_galar / "frames", mini_galar / "labels", mini_galar / "metadata.csv")
    header, rows = read_rows(mini_galar / "labels" / "2.csv")
    by_frame = {int(r[-1]): r for r in rows}
    for d in (d for d in dl if d["video_id"] == "2"):
        assert Path(d["image"]).name == f"frame_{d['frame_number']:06d}.PNG"
        r = by_frame[d["frame_number"]]
        assert d["frame_index"] == int(r[0])
        assert d["label"] == [float(r[header.index(n)]) for n in LABELS]


def test_deterministic_for_a_seed(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        a = generate_mini_galar(tmp_path / "a", videos=2, frames_per_video=20, size=16, seed=3)
        b = generate_mini_galar(tmp_path / "b", videos=2, frames_per_video=20, size=16, seed=3)
        c = generate_mini_galar(tmp_path / "c", videos=2, frames_per_video=20, size=16, seed=4)
    fa, fb, fc = all_files(a), all_files(b), all_files(c)
    assert len(fa) == 2 * 20 + 2 + 4  # frames, label CSVs, metadata + ground truth (+ its frame units) + marker
    assert fa == fb
    assert fa != fc


def test_regenerate_replaces_and_refuses_foreign_folder(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = generate_mini_galar(tmp_path / "d", videos=3, frames_per_video=10, size=8, seed=0)
        assert (out / "frames" / "ukdd_navi_00003").is_dir()
        generate_mini_galar(out, videos=2, frames_per_video=5, size=8, seed=0, naming="galar")
        assert sorted(p.name for p in (out / "frames").iterdir()) == ["1", "2"]
        assert len(list((out / "frames" / "1").iterdir())) == 5
        foreign = tmp_path / "mine"
        foreign.mkdir()
        (foreign / "important.txt").write_text("keep")
        with pytest.raises(FileExistsError, match="not empty"):
            generate_mini_galar(foreign, videos=1, frames_per_video=5, size=8)
    assert (foreign / "important.txt").read_text() == "keep"


def test_naming_challenge(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = generate_mini_galar(tmp_path / "e", videos=2, frames_per_video=4, size=8, naming="challenge")
    assert sorted(p.name for p in (out / "frames").iterdir()) == ["ukdd_navi_00001", "ukdd_navi_00002"]
    assert sorted(p.name for p in (out / "frames" / "ukdd_navi_00001").iterdir())[0] == "frame_0000000.png"


# ------------------------------------------------------------------------------------------- timelines
def synthetic_real_timeline() -> np.ndarray:
    """A 'real' 10,000-frame timeline with short landmarks and short lesions."""
    t = np.zeros((10000, 17), dtype=bool)
    bounds = {
        "mouth": (0, 30),
        "esophagus": (30, 45),
        "stomach": (45, 1500),
        "small intestine": (1500, 7000),
        "colon": (7000, 10000),
    }
    for name, (a, b) in bounds.items():
        t[a:b, label_index(name)] = True
    t[44:46, label_index("z-line")] = True
    t[1490:1510, label_index("pylorus")] = True
    t[3000:3003, label_index("ulcer")] = True
    t[5000:5600, label_index("blood")] = True
    t[8000:8002, label_index("polyp")] = True
    return t


def test_resample_keeps_order_short_events_and_proportions():
    out = resample_timeline(synthetic_real_timeline(), 100, min_event_frames=2)
    assert out.shape == (100, 17)
    assert (out[:, : len(SECTIONS)].sum(1) == 1).all()  # one section per frame
    sec = out[:, : len(SECTIONS)].argmax(1)
    assert (np.diff(sec) >= 0).all() and set(sec.tolist()) == set(range(5))  # gut order, all present
    assert out[:, label_index("mouth")].sum() >= 2 and out[:, label_index("esophagus")].sum() >= 2
    for name in ("z-line", "ulcer", "polyp"):
        assert 1 <= out[:, label_index(name)].sum() <= 4, name
    assert abs(int(out[:, label_index("blood")].sum()) - 6) <= 1  # 600 of 10,000 frames
    assert abs(int(out[:, label_index("colon")].sum()) - 30) <= 2
    # the pylorus sits at the stomach / small intestine boundary
    p = np.flatnonzero(out[:, label_index("pylorus")])
    boundary = np.flatnonzero(sec == 3)[0]
    assert p.min() <= boundary <= p.max() + 1
    # the polyp is in the colon, the ulcer in the small intestine
    assert (sec[out[:, label_index("polyp")]] == 4).all() and (sec[out[:, label_index("ulcer")]] == 3).all()


def test_resample_upsampling_is_nearest():
    real = np.zeros((4, 17), dtype=bool)
    real[:2, 0] = True
    real[2:, 2] = True
    out = resample_timeline(real, 8)
    assert out[:, 0].tolist() == [True] * 4 + [False] * 4 and out[:, 2].tolist() == [False] * 4 + [True] * 4


def test_real_timelines_resampled_keep_every_label(galar_events_path):
    timelines = load_timelines(galar_events_path)
    assert len(timelines) == 80
    for vid in list(timelines)[::8]:
        real = events_to_matrix(timelines[vid])
        out = resample_timeline(real, 120)
        assert (out.any(0) == real.any(0)).all(), vid


def test_real_selection_covers_pathologies(galar_events_path):
    timelines = load_timelines(galar_events_path)
    chosen = select_source_videos(timelines, 4, seed=0)
    assert len(set(chosen)) == 4 and chosen == select_source_videos(timelines, 4, seed=0)
    covered = {n for v in chosen for e in timelines[v] for n in e["label"]} & set(PATHOLOGY)
    assert len(covered) >= 6


def test_mini_galar_uses_real_timelines(galar_events_path, mini_galar):
    _, meta = read_rows(mini_galar / "metadata.csv")
    timelines = load_timelines(galar_events_path)
    assert all(r[2] in timelines for r in meta)  # source_video column names real Galar videos
    gt = json.loads((mini_galar / "ground_truth.json").read_text())
    labels = {n for v in gt["videos"] for e in v["events"] for n in e["label"]}
    assert len(labels & set(PATHOLOGY)) >= 5


def test_builtin_fallback_warns(tmp_path, monkeypatch):
    monkeypatch.setattr(synthetic, "find_galar_events", lambda path=None: None)
    with pytest.warns(UserWarning, match="built-in timeline generator"):
        out = generate_mini_galar(tmp_path / "f", videos=2, frames_per_video=40, size=8, seed=1)
    _, meta = read_rows(out / "metadata.csv")
    assert [r[2] for r in meta] == ["builtin", "builtin"]
    tl = builtin_timeline(200, np.random.default_rng(0))
    assert (tl[:, :5].sum(1) == 1).all() and (np.diff(tl[:, :5].argmax(1)) >= 0).all()
    assert tl[:, 5:8].any(0).all() and tl[:, 8:].any()


def test_missing_explicit_events_file(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"nope.json"):
        generate_mini_galar(tmp_path / "g", videos=1, frames_per_video=5, size=8, events_path=tmp_path / "nope.json")


def test_cli(tmp_path, capsys):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        args = ["--num-videos", "2", "--frames-per-video", "6", "--size", "8", "--seed", "2"]
        rc = main(["--out", str(tmp_path / "cli"), *args])
    assert rc == 0
    text = capsys.readouterr().out
    assert str((tmp_path / "cli" / "ground_truth.json").resolve()) in text
    assert str((tmp_path / "cli" / "frames").resolve()) in text
    assert main(["--out", str(tmp_path / "cli"), "--num-videos", "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "must be positive" in err[0], err


# ------------------------------------------------------------------------------------------- rendering
def render(labels: list[str], n: int = 24, size: int = 32, seed: int = 0) -> np.ndarray:
    lab = np.zeros((n, 17), dtype=bool)
    for name in labels:
        lab[:, label_index(name)] = True
    return np.concatenate([im for _, im in iter_render_video(lab, size, np.random.default_rng(seed), "Olympus")])


def test_rendering_is_label_dependent():
    """Lesions change the pixels in the expected direction (same nuisances, same seed)."""
    base = render(["small intestine"]).astype(np.float32) / 255
    bleed = render(["small intestine", "active bleeding"]).astype(np.float32) / 255

    def bright_red(x):
        return ((x[..., 0] > 0.55) & (x[..., 1] < 0.2)).mean()

    assert bright_red(bleed) > bright_red(base) + 0.01
    hem = render(["small intestine", "hematin"]).astype(np.float32) / 255
    assert hem.mean() < base.mean()
    lymph = render(["small intestine", "lymphangioectasis"]).astype(np.float32) / 255
    # white dots: pixels bright in all three channels
    assert (lymph.min(-1) > 0.5).mean() > 3 * (base.min(-1) > 0.5).mean() + 0.003
    # sections differ in colour: the small intestine is yellower than the stomach
    stomach = render(["stomach"]).astype(np.float32) / 255
    assert (base[..., 1] / (base[..., 0] + 1e-3)).mean() > (stomach[..., 1] / (stomach[..., 0] + 1e-3)).mean()


def test_render_rejects_bad_shapes():
    with pytest.raises(ValueError, match=r"\(T, 17\)"):
        next(iter_render_video(np.zeros((3, 5), bool), 16, np.random.default_rng(0)))
    with pytest.raises(ValueError, match="at least 8"):
        next(iter_render_video(np.zeros((3, 17), bool), 4, np.random.default_rng(0)))
