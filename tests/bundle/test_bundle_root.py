"""``bundle_root``: the folder of the configs being run (model zoo layout, ``models/<bundle>/configs``), never another
copy of the bundle; a missing weights file stops the run with one line naming it."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest
import torch
from bundle_helpers import BUNDLE, METADATA, TINY_NETWORK, run_in_process


@pytest.fixture
def zoo(tmp_path, monkeypatch):
    """A model-zoo checkout holding a copy of the bundle's configs (``models/vce/configs``), as the working folder."""
    root = tmp_path / "model-zoo"
    shutil.copytree(BUNDLE / "configs", root / "models" / "vce" / "configs")
    monkeypatch.chdir(root)
    monkeypatch.setattr(sys, "excepthook", sys.excepthook)  # the configs' initialize sets its own
    return root


def _workflow(config_file: str, workflow_type: str = "inference", **override):
    """A bundle workflow as ``python -m monai.bundle run`` makes it; its properties resolve in the workflow."""
    from monai.bundle import ConfigWorkflow

    wf = ConfigWorkflow(
        config_file=config_file, meta_file=METADATA, logging_file=False, workflow_type=workflow_type, **override
    )
    wf.initialize()
    return wf


@pytest.mark.parametrize(("config", "workflow_type"), [("inference.json", "inference"), ("train.json", "train")])
def test_bundle_root_is_the_folder_the_configs_are_read_from(zoo, config, workflow_type):
    wf = _workflow(f"models/vce/configs/{config}", workflow_type)
    # initialize resolved it inside the workflow (check_settings reads it): what every later item sees
    assert wf.bundle_root == "models/vce" and wf.parser.get_parsed_content("ckpt_dir") == "models/vce/models"
    # an absolute config path, from anywhere
    bundle = zoo / "models" / "vce"
    assert _workflow(str(bundle / "configs" / config), workflow_type).bundle_root == str(bundle)


def test_bundle_root_override_and_plain_config_parser(zoo):
    from monai.bundle import ConfigParser

    wf = _workflow("models/vce/configs/inference.json", bundle_root="elsewhere")
    assert wf.parser.get_parsed_content("ckpt_dir") == "elsewhere/models"
    parser = ConfigParser()  # no workflow: the configs' folder is unknown, "." as in the model zoo
    parser.read_config("models/vce/configs/inference.json")
    assert parser.get_parsed_content("bundle_root") == "."


def test_run_without_weights_names_the_missing_file_and_never_uses_another_copy(zoo, tmp_path):
    # the repository's bundle/ (another copy) may hold weights: the run must not find them
    frames = tmp_path / "frames" / "v1"
    frames.mkdir(parents=True)
    args = ["run", "--config_file", "models/vce/configs/inference.json", "--meta_file", METADATA]
    args += ["--dataset_dir", str(tmp_path / "frames"), "--num_workers", "0", "--progress", "False"]
    for key, value in TINY_NETWORK.items():
        args += [f"--{key}", str(value)]
    proc = run_in_process(args, check=False, cwd=zoo)
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert last == "error: FileNotFoundError: checkpoint models/vce/models/model.pt not found", last
    eval_dir = zoo / "models" / "vce" / "eval"
    assert not list(eval_dir.rglob("*.npz")) and not list(eval_dir.rglob("*.json"))  # stopped before writing


def test_run_from_the_zoo_root_uses_its_copys_weights(zoo, tmp_path):
    from monai_vce.data.synthetic import main as synthetic
    from monai_vce.networks import DiffAttnCLIPClassifier

    synthetic(["--out", str(tmp_path / "data"), "--num-videos", "1", "--frames-per-video", "12", "--size", "32"])
    torch.manual_seed(0)
    net = DiffAttnCLIPClassifier(backbone="vce-tiny-vit-64", pretrained=False, image_size=64, contrastive=False)
    (zoo / "models" / "vce" / "models").mkdir()
    torch.save(net.state_dict(), zoo / "models" / "vce" / "models" / "model.pt")
    args = ["run", "--config_file", "models/vce/configs/inference.json", "--meta_file", METADATA]
    args += ["--dataset_dir", str(tmp_path / "data" / "frames"), "--num_workers", "0", "--progress", "False"]
    args += ["--report", "False"]
    for key, value in TINY_NETWORK.items():
        args += [f"--{key}", str(value)]
    run_in_process(args, cwd=zoo)
    assert (Path("models/vce/eval/events.json")).is_file()
