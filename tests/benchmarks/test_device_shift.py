"""``benchmarks/device_shift.py``: the leave-one-device-out protocol on a Galar-layout folder, and its summary."""

from __future__ import annotations

import json
import math

import pytest
from benchmark_scripts import load_benchmark


@pytest.fixture(scope="module")
def device_shift():
    return load_benchmark("device_shift")


def _row(arm: str, test: str, value: float, seconds: float = 1.0) -> dict:
    return {"arm": arm, "test": test, "mAP@0.5": value, "mAP@0.95": value, "frame_mAP": value,
            "sensitivity@1FA": None, "seconds_per_exam": seconds}  # fmt: skip


def test_summary_states_the_gap_recovered_and_the_in_device_change(device_shift):
    rows = [_row("none", "in-device", 0.50), _row("none", "unseen", 0.30), _row("TTA", "in-device", 0.49, 6.0)]
    rows += [_row("TTA", "unseen", 0.40, 6.0)]
    table, summary = device_shift.summarise(rows, ["none", "TTA"])
    assert math.isclose(summary["TTA"]["recovered"], 0.5) and math.isclose(summary["TTA"]["in_change"], -0.01)
    assert summary["none"]["recovered"] == 0.0
    assert "| TTA | 0.4900 | 0.4000 | 50 % | -0.0100 |" in table and table.rstrip().endswith("| 6.0 |")


def test_galar_layout_folder_leaves_its_capsule_out(device_shift, tmp_path, capsys):
    from monai_vce.data import galar_datalist, generate_mini_galar, video_capsules

    data = tmp_path / "galar"
    generate_mini_galar(data, videos=6, frames_per_video=60, size=64, seed=0, use_real_timelines=False,
                        capsules=["PillCam SB3", "Olympus"], progress=False)  # fmt: skip
    out = tmp_path / "out"
    args = ["--dataset_dir", str(data), "--holdout", "Olympus", "--seeds", "0", "--epochs", "1", "--arms", "none"]
    device_shift.main([*args, "--out", str(out), "--set", "samples_per_epoch=32"])
    printed = capsys.readouterr().out
    assert printed.strip().splitlines()[-1].startswith("unseen-device gap recovered: ")
    results = {p.parent.name: json.loads(p.read_text()) for p in (out / "Olympus").rglob("result.json")}
    assert set(results) == {"in-device", "unseen"}
    unseen = json.loads((out / "Olympus" / "seed0" / "arms" / "none" / "unseen" / "events.json").read_text())
    olympus = [v for v, c in video_capsules(galar_datalist(data)).items() if c == "Olympus"]
    assert len(olympus) == 3 and sorted(v["video_id"] for v in unseen["videos"]) == sorted(olympus)
