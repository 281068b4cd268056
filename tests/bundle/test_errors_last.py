"""A failing bundle run ends with the project's one-line message: the root cause of MONAI's wrapped errors is the
last line printed, after the traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from monai_vce.utils import error_summary

ROOT = Path(__file__).resolve().parents[2]


def test_error_summary_is_the_innermost_cause():
    try:
        try:
            raise FileNotFoundError("dataset folder /data/galar not found; pass --dataset_dir")
        except FileNotFoundError as e:
            raise RuntimeError("Failed to evaluate ConfigExpression") from e
    except RuntimeError as outer:
        assert error_summary(outer) == "FileNotFoundError: dataset folder /data/galar not found; pass --dataset_dir"
    assert error_summary(ValueError()) == "ValueError"


@pytest.mark.background
def test_bundle_run_prints_the_message_last(tmp_path):
    # a real bundle run whose input folder is missing: MONAI wraps the project's FileNotFoundError. The run gets a
    # checkpoint of its own, so that the missing folder is the first problem whether or not the demo has run here.
    import torch
    from monai.bundle import ConfigParser

    parser = ConfigParser()
    parser.read_config([ROOT / "bundle/configs/inference.json", ROOT / "bundle/configs/demo.json"])
    parser["bundle_root"] = str(ROOT / "bundle")
    (tmp_path / "models").mkdir()
    torch.save(parser.get_parsed_content("network_def").state_dict(), tmp_path / "models" / "model.pt")
    cmd = [
        sys.executable,
        "-m",
        "monai.bundle",
        "run",
        "--config_file",
        "['bundle/configs/inference.json','bundle/configs/demo.json']",
        "--dataset_dir",
        str(tmp_path / "missing"),
        "--output_dir",
        str(tmp_path / "out"),
        "--ckpt_dir",
        str(tmp_path / "models"),
    ]
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert res.returncode != 0
    last = res.stderr.strip().splitlines()[-1]
    assert last.startswith("error: FileNotFoundError: input folder ") and "missing not found" in last, last


def test_failing_demo_ends_with_the_message_and_keeps_the_traceback_in_its_log(tmp_path, capsys):
    from monai_vce.demo import main

    bundle = tmp_path / "bundle"
    (bundle / "configs").mkdir(parents=True)  # a bundle folder without its configs
    assert main(["--bundle-root", str(bundle), "--quiet"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: ") and "train.json" in err[-1], err
    assert "Traceback" in (bundle / "demo" / "demo.log").read_text()
