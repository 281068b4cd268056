"""MONAI Label and MONAI Deploy integrations (optional extras ``monai-vce[label]``, ``monai-vce[deploy]``).

Both extras pull heavy dependencies (MONAI Label downgrades numpy and brings a server stack; MONAI Deploy
brings holoscan and needs pydicom and highdicom), so they live in their own virtual environments; each test
is skipped, saying why, where its package is not installed.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import torch
from bundle_helpers import CONFIGS, require_integration, run_bundle, trained_bundle

pytestmark = pytest.mark.integration

TINY = {"backbone": "vce-tiny-vit-64", "pretrained": False, "image_size": 64}


def _frame(mini_galar: Path) -> str:
    return str(sorted((mini_galar / "frames" / "1").iterdir())[0])


def _eager_probs(model_pt: Path, frame: str) -> torch.Tensor:
    from monai_vce.data import load_vce_frame
    from monai_vce.networks import DiffAttnCLIPClassifier

    net = DiffAttnCLIPClassifier(**TINY).eval()
    net.load_state_dict(torch.load(model_pt, map_location="cpu", weights_only=True))
    x = load_vce_frame(frame, 64).float().div(255)[None]
    with torch.no_grad():
        return torch.sigmoid(net(x))[0]


def _tiny_bundle(root: Path, model_pt: Path) -> Path:
    """A bundle folder ``root``: the shipped configs with the tiny backbone merged into inference.json, a model.pt."""
    shutil.copytree(CONFIGS, root / "configs")
    inference = json.loads((root / "configs" / "inference.json").read_text())
    inference.update({**TINY, "bundle_root": str(root), "amp": False, "num_workers": 0})
    (root / "configs" / "inference.json").write_text(json.dumps(inference, indent=2))
    (root / "models").mkdir()
    shutil.copy(model_pt, root / "models" / "model.pt")
    return root


def _wait_for(url: str, proc: subprocess.Popen, timeout: float, log: Path) -> None:
    """Poll ``url`` until it answers 200, the server process dies, or ``timeout`` seconds pass."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"the server exited with status {proc.returncode}:\n{log.read_text()[-4000:]}")
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(1)
    raise AssertionError(f"{url} did not answer within {timeout} s:\n{log.read_text()[-4000:]}")


def test_monai_label_server_classifies_a_frame_through_its_rest_api(tmp_path_factory, tmp_path, mini_galar):
    """``monailabel start_server --app <the bundle's app> --studies <frames> --conf models bundle``, then
    ``POST /infer/bundle`` on loopback: the 17 scores equal the network's sigmoid, with the folder named ``bundle``."""
    require_integration("monailabel", "label")
    from bundle_helpers import BUNDLE, free_port

    from monai_vce.labels import LABELS

    run = trained_bundle(tmp_path_factory, mini_galar)
    app = tmp_path / "apps" / "vce"
    shutil.copytree(BUNDLE / "monailabel_app", app)
    # named "bundle": MONAI Label's stock app would serve a folder of that name as 3-D segmentation
    _tiny_bundle(app / "model" / "bundle", run["models"] / "model.pt")
    studies = tmp_path / "studies"
    source = mini_galar / "frames" / "ukdd_navi_00004"  # lower-case .png names, as MONAI Label's datastore lists
    shutil.copytree(source, studies)
    frame = sorted(studies.glob("*.png"))[3]
    port = free_port()
    log_file = tmp_path / "server.log"
    log = log_file.open("w")
    cli = Path(sys.executable).with_name("monailabel")
    # the CLI runs `python -m monailabel.main` with the `python` found first on PATH: this environment's, as when
    # a user has activated it
    path = f"{cli.parent}{os.pathsep}{os.environ.get('PATH', '')}"
    env = dict(os.environ, PATH=path, MONAI_LABEL_DATASTORE_AUTO_RELOAD="false", PYTHONWARNINGS="ignore")
    command = [str(cli), "start_server", "--app", str(app), "--studies", str(studies)]
    command += ["--conf", "models", "bundle", "--conf", "preload", "false", "--host", "127.0.0.1"]
    server = subprocess.Popen([*command, "--port", str(port)], stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        _wait_for(f"http://127.0.0.1:{port}/info/", server, timeout=240, log=log_file)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/info/", timeout=30) as r:
            info = json.loads(r.read())
        assert info["models"]["bundle"]["type"] == "classification" and not info.get("trainers")
        url = f"http://127.0.0.1:{port}/infer/bundle?image={frame.stem}&output=json"
        request = urllib.request.Request(url, data=urllib.parse.urlencode({"params": "{}"}).encode(), method="POST")
        with urllib.request.urlopen(request, timeout=120) as r:
            result = json.loads(r.read())
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()
    scores = {p["label"]: p["score"] for p in result["prediction"]}
    assert list(scores) == list(LABELS)
    expected = _eager_probs(run["models"] / "model.pt", str(frame))
    torch.testing.assert_close(
        torch.tensor([scores[n] for n in LABELS], dtype=torch.float32), expected, rtol=1e-4, atol=1e-5
    )


def test_monai_deploy_application_writes_the_bundles_events(tmp_path_factory, tmp_path, mini_galar):
    """The bundle's MONAI Deploy application (frame-folder loader -> MonaiBundleInferenceOperator -> event writer),
    run end to end as a program on a generated video, writes the events of the bundle's own inference."""
    require_integration("monai.deploy.operators.monai_bundle_inference_operator", "deploy")
    from bundle_helpers import BUNDLE

    run = trained_bundle(tmp_path_factory, mini_galar)
    root = _tiny_bundle(tmp_path / "vce_bundle", run["models"] / "model.pt")
    shutil.copy(run["models"] / "decoder.json", root / "models" / "decoder.json")
    shutil.copytree(BUNDLE / "deploy_app", root / "deploy_app")
    video = mini_galar / "frames" / "ukdd_navi_00004"
    # the bundle's own inference on the same video folder
    own = tmp_path / "own"
    run_bundle(
        [
            "run",
            "--config_file",
            str(root / "configs" / "inference.json"),
            "--dataset_dir",
            str(video),
            "--output_dir",
            str(own),
            "--report",
            "False",
            "--progress",
            "False",
            "--bundle_root",
            str(root),
        ]
    )
    out = tmp_path / "deploy"
    env = dict(os.environ, PYTHONWARNINGS="ignore", OMP_NUM_THREADS="2")
    proc = subprocess.run(
        [sys.executable, str(root / "deploy_app" / "app.py"), "--frames", str(video), "--output", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    deployed = json.loads((out / "events.json").read_text())
    expected = json.loads((own / "events.json").read_text())
    assert deployed["videos"][0]["video_id"] == "ukdd_navi_00004"
    assert deployed == expected and expected["videos"][0]["events"]
