"""Per-system appearance of the generated mini-Galar (``capsules``): default unchanged, round robin, distinct
devices, determinism, errors and the command-line flag."""

from __future__ import annotations

import csv
import warnings
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from monai_vce.data import generate_mini_galar
from monai_vce.data.galar import read_frame_rates
from monai_vce.data.render import CAPSULES, DEVICES, UNSEEN_DEVICE, capsule_device, iter_render_video
from monai_vce.data.synthetic import builtin_timeline, main

SMALL = {"videos": 3, "frames_per_video": 20, "size": 32, "use_real_timelines": False}


def all_files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def read_rows(path: Path) -> tuple[list[str], list[list[str]]]:
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    return rows[0], rows[1:]


def frames_of(root: Path, vid: str) -> np.ndarray:
    files = sorted((root / "frames" / vid).iterdir())
    return np.stack([np.asarray(Image.open(f).convert("RGB"), dtype=np.float64) / 255 for f in files])


def test_table():
    assert set(DEVICES) == {"PillCam SB3", "PillCam SB2", "PillCam COLON2", "Olympus", "NaviCam"}
    assert UNSEEN_DEVICE == "NaviCam" and UNSEEN_DEVICE not in CAPSULES
    assert list(CAPSULES) == ["PillCam SB3", "PillCam SB2", "PillCam COLON2", "Olympus"]
    assert {DEVICES[n].resolution for n in ("Olympus", "NaviCam", "PillCam SB3")} == {336, 480, 512}
    assert all(DEVICES[n].white_balance == CAPSULES[n][0] for n in CAPSULES)


def test_default_unchanged(tmp_path):
    a = generate_mini_galar(tmp_path / "a", **SMALL)
    b = generate_mini_galar(tmp_path / "b", **SMALL, capsules=None)
    assert all_files(a) == all_files(b)
    header, rows = read_rows(a / "metadata.csv")
    assert header == ["video_id", "capsule", "source_video", "frame_rule"]
    assert {r[1] for r in rows} <= set(CAPSULES)


def test_round_robin_and_fps(tmp_path):
    names = ["Olympus", "NaviCam"]
    out = generate_mini_galar(tmp_path / "d", **SMALL, capsules=names)
    header, rows = read_rows(out / "metadata.csv")
    assert header == ["video_id", "capsule", "source_video", "frame_rule", "fps"]
    assert [r[1] for r in rows] == ["Olympus", "NaviCam", "Olympus"]
    assert [float(r[4]) for r in rows] == [DEVICES[r[1]].fps for r in rows]
    assert set(read_frame_rates(out / "metadata.csv").values()) == {DEVICES[n].fps for n in names}
    # the labels do not depend on the rendering
    plain = generate_mini_galar(tmp_path / "p", **SMALL)
    for vid in ("1", "2", "ukdd_navi_00003"):
        assert (out / "labels" / f"{vid}.csv").read_bytes() == (plain / "labels" / f"{vid}.csv").read_bytes()
    assert (out / "ground_truth.json").read_bytes() == (plain / "ground_truth.json").read_bytes()


def test_deterministic(tmp_path):
    a = generate_mini_galar(tmp_path / "a", **SMALL, capsules=["PillCam SB3", "NaviCam"])
    b = generate_mini_galar(tmp_path / "b", **SMALL, capsules=("PillCam SB3", "NaviCam"))
    assert all_files(a) == all_files(b)
    c = generate_mini_galar(tmp_path / "c", **SMALL, capsules=["NaviCam", "PillCam SB3"])
    assert all_files(a)["frames/1/frame_000000.PNG"] != all_files(c)["frames/1/frame_000000.PNG"]


def test_devices_differ():
    """Same labels and seed: NaviCam is yellower (less blue) and more vignetted than Olympus."""
    size = 48
    lab = builtin_timeline(24, np.random.default_rng(0))
    g = (np.arange(size) + 0.5) * 2 / size - 1
    yy, xx = np.meshgrid(g, g, indexing="ij")
    r = np.sqrt(xx**2 + yy**2)
    stats = {}
    for name in ("Olympus", "NaviCam"):
        ims = np.concatenate([im for _, im in iter_render_video(lab, size, np.random.default_rng(5), device=name)])
        f = ims.astype(np.float64) / 255
        assert ims.shape == (24, size, size, 3) and ims.dtype == np.uint8
        mean = f[:, r < 0.8].mean(axis=(0, 1))
        rim_ratio = f[:, (r > 0.55) & (r < 0.8)].mean() / f[:, r < 0.3].mean()
        stats[name] = (mean[2] / mean[0], rim_ratio)
    assert stats["NaviCam"][0] < 0.8 * stats["Olympus"][0]  # warmer
    assert stats["NaviCam"][1] < stats["Olympus"][1] - 0.05  # stronger vignetting
    # the device appearance differs from the default appearance of the same system
    default = np.concatenate([im for _, im in iter_render_video(lab, size, np.random.default_rng(5), "Olympus")])
    device = np.concatenate([im for _, im in iter_render_video(lab, size, np.random.default_rng(5), device="Olympus")])
    assert not np.array_equal(default, device)


def test_overlay_and_fov(tmp_path):
    out = generate_mini_galar(tmp_path / "o", 1, 4, 64, use_real_timelines=False, capsules=["NaviCam"])
    f = frames_of(out, "1")
    assert f[:, 0, 0].max() < 0.05  # round field of view: dark top-left corner
    assert f[:, 56:62, 1:8].max() > 0.7  # bright overlay cell in the bottom-left corner
    assert f[:, 56:62, 56:63].max() < 0.05  # nothing in the bottom-right corner


def test_unknown_device(tmp_path):
    with pytest.raises(ValueError, match=r"'Endo X'.*known: PillCam SB3, .*NaviCam"):
        generate_mini_galar(tmp_path / "x", **SMALL, capsules=["Olympus", "Endo X"])
    with pytest.raises(ValueError, match="at least one"):
        generate_mini_galar(tmp_path / "y", **SMALL, capsules=[])
    with pytest.raises(ValueError, match="'Endo X'"):
        capsule_device("Endo X")
    assert not (tmp_path / "x").exists()


def test_cli_unknown_device(tmp_path, capsys):
    args = [
        "--out",
        str(tmp_path / "bad"),
        "--frames-per-video",
        "4",
        "--builtin-timelines",
        "--capsules",
        "Olympus,Foo",
    ]
    assert main(args) != 0
    assert "'Foo'" in capsys.readouterr().err
    assert not (tmp_path / "bad").exists()


def test_cli(tmp_path, capsys):
    out = tmp_path / "cli"
    args = ["--out", str(out), "--num-videos", "2", "--frames-per-video", "10", "--size", "32", "--builtin-timelines"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert main([*args, "--capsules", "PillCam SB3, Olympus"]) == 0
    _, rows = read_rows(out / "metadata.csv")
    assert [r[1] for r in rows] == ["PillCam SB3", "Olympus"]
    assert "capsules:" in capsys.readouterr().out
    assert main([*args[:1], str(tmp_path / "navi"), *args[2:], "--capsules", "NaviCam"]) == 0
    _, rows = read_rows(tmp_path / "navi" / "metadata.csv")
    assert [r[1] for r in rows] == ["NaviCam", "NaviCam"]
    direct = generate_mini_galar(tmp_path / "direct", 2, 10, 32, use_real_timelines=False, capsules=["NaviCam"])
    assert all_files(direct) == all_files(tmp_path / "navi")
