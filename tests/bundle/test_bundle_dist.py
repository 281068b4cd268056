"""The distributable bundle: ``scripts/bundle_dist.py`` output installed into a clean environment and run from the
unpacked bundle folder alone, offline.

The clean environment is a new ``python -m venv``; ``monai-vce`` is installed there from the bundle's wheel with
``pip install --no-index --find-links <bundle>/wheels monai-vce`` (no index: nothing is downloaded). Its dependencies
(torch, MONAI, open_clip, ...) are not downloaded either: the environment sees this test run's installed packages
read-only, through a ``.pth`` file naming a folder of links to them from which every ``monai-vce`` / ``monai_vce``
entry is left out, so ``monai_vce`` can only come from the wheel (checked); the venv's own setuptools is removed so
that the view's (the version torch asks for) counts. Commands run in the unpacked folder
with no ``PYTHONPATH``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest
import torch
from bundle_helpers import REPO, SCHEMA
from doc_commands import RESULT


def _dependency_view(folder: Path) -> Path:
    """Links to this interpreter's installed packages, without monai-vce (any form: wheel, editable, path)."""
    folder.mkdir()
    site = Path(sysconfig.get_paths()["purelib"])
    for entry in site.iterdir():
        lowered = entry.name.lower()
        if "monai_vce" in lowered or "monai-vce" in lowered or entry.suffix == ".pth":
            continue
        (folder / entry.name).symlink_to(entry)
    return folder


def _run(cmd: list[str], cwd: Path, env: dict[str, str], timeout: float = 300) -> str:
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{' '.join(cmd)} failed:\n{(proc.stdout + proc.stderr)[-4000:]}"
    return proc.stdout + proc.stderr


def _run_commands(python: str, cmds: list[str], cwd: Path, env: dict[str, str]) -> list[str]:
    """Run ``python -m MODULE ...`` commands one after another in one process of ``python``, each through
    :func:`runpy.run_module` as ``python -m`` runs it (tests/doc_commands.py's runner: one import of torch and
    MONAI for all); returns each command's output."""
    runner = cwd.parent / "run_commands.py"
    shutil.copy(REPO / "tests" / "doc_commands.py", runner)  # standard library only, outside any package folder
    (cwd.parent / "commands.json").write_text(json.dumps(cmds))
    argv = [python, str(runner), str(cwd.parent / "commands.json")]
    # one stream: a command's output, whatever it writes to, comes before its result line
    proc = subprocess.run(
        argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600
    )
    outputs, lines = [], []
    for line in proc.stdout.splitlines():
        if not line.startswith(RESULT):
            lines.append(line)
            continue
        result = json.loads(line[len(RESULT) :])
        assert result["rc"] == 0, f"{result['cmd']} failed:\n{result['error']}\n" + "\n".join(lines)[-3000:]
        outputs.append("\n".join(lines))
        lines = []
    assert proc.returncode == 0 and len(outputs) == len(cmds), proc.stdout[-4000:]
    return outputs


@pytest.mark.background
@pytest.mark.skipif(sys.platform == "win32", reason="symlinked dependency view")
def test_distributable_bundle_installs_offline_and_runs_from_its_folder(tmp_path):
    out = tmp_path / "dist"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(PYTHONWARNINGS="ignore", OMP_NUM_THREADS="2", HF_HUB_OFFLINE="1", PIP_NO_INDEX="1")
    _run([sys.executable, str(REPO / "scripts" / "bundle_dist.py"), "--out", str(out)], cwd=tmp_path, env=env)
    wheel = next((out / "vce_event_detection" / "wheels").glob("monai_vce-*.whl"))
    # unpack the zip somewhere else: the folder must stand on its own
    unpacked = tmp_path / "unpacked"
    with zipfile.ZipFile(out / "vce_event_detection.zip") as z:
        z.extractall(unpacked)
    bundle = unpacked / "vce_event_detection"
    meta = json.loads((bundle / "configs" / "metadata.json").read_text())
    assert (bundle / "wheels" / wheel.name).is_file()
    assert meta["required_packages_version"]["monai-vce"] == wheel.name.split("-")[1]
    assert not list((bundle / "models").iterdir())  # no weights are shipped

    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", str(venv)], cwd=tmp_path, env=env)
    python = str(venv / "bin" / "python")
    site = _run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], tmp_path, env).strip()
    view = _dependency_view(tmp_path / "deps")
    Path(site.splitlines()[-1], "_dependencies.pth").write_text(f"{view}\n")
    # the venv's own setuptools may be older than torch asks for: use the dependency view's
    _run([python, "-m", "pip", "uninstall", "-q", "-y", "setuptools"], cwd=tmp_path, env=env)
    _run([python, "-m", "pip", "install", "-q", "--no-index", "--find-links", str(bundle / "wheels"), "monai-vce"],
         cwd=tmp_path, env=env)  # fmt: skip
    where = _run([python, "-c", "import monai_vce; print(monai_vce.__file__)"], bundle, env).strip().splitlines()[-1]
    assert where.startswith(str(venv)), where

    check = (
        "from monai.bundle import ConfigWorkflow\n"
        "for files, kind in [(['configs/inference.json'], 'infer'), (['configs/train.json'], 'train'),"
        " (['configs/train.json', 'configs/evaluate.json'], 'infer')]:\n"
        "    wf = ConfigWorkflow(config_file=files, meta_file='configs/metadata.json', logging_file=False,"
        " workflow_type=kind)\n"
        "    wf.initialize()\n"
        "    print(kind, wf.check_properties())\n"
    )
    lines = _run([python, "-c", check], cwd=bundle, env=env).strip().splitlines()
    assert [line for line in lines if line.startswith(("infer ", "train "))] == ["infer []", "train []", "infer []"]
    # the bundle's commands from the folder: checks of the metadata and of the shipped network (BiomedCLIP's
    # architecture, random weights: pretrained is off in inference.json), then inference with a tiny network file
    # made here (the test's, not shipped) on generated frames
    from monai_vce.networks import DiffAttnCLIPClassifier

    torch.manual_seed(0)
    net = DiffAttnCLIPClassifier(backbone="vce-tiny-vit-64", pretrained=False, image_size=64, contrastive=False)
    torch.save(net.state_dict(), bundle / "models" / "model.pt")
    data = tmp_path / "frames"
    outputs = _run_commands(
        python,
        [
            f"python -m monai.bundle verify_metadata --meta_file configs/metadata.json --filepath {SCHEMA}",
            "python -m monai.bundle verify_net_in_out network_def --meta_file configs/metadata.json "
            "--config_file configs/inference.json",
            f"python -m monai_vce.data.synthetic --out {data} --num-videos 2 --frames-per-video 30 --size 32 --seed 4",
            f"python -m monai.bundle run --config_file configs/inference.json --dataset_dir {data / 'frames'} "
            "--backbone vce-tiny-vit-64 --image_size 64 --num_workers 0 --progress False --report False",
        ],
        bundle,
        env,
    )
    assert "verified with no error" in outputs[0] and "verified with no error" in outputs[1]
    events = json.loads((bundle / "eval" / "events.json").read_text())
    assert len(events["videos"]) == 2
