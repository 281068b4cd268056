"""MONAI Label and MONAI Deploy integrations (optional extras ``monai-vce[label]``, ``monai-vce[deploy]``).

Both extras pull heavy dependencies (MONAI Label downgrades numpy and brings a server stack; MONAI Deploy
brings holoscan and needs pydicom and highdicom), so they live in their own virtual environments; each test
is skipped, saying why, where its package is not installed.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from bundle_helpers import CONFIGS, require_integration, run_in_process, trained_bundle

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


def _label_app(tmp_path: Path, model_pt: Path) -> Path:
    """The bundle's MONAI Label app copied to ``tmp_path/apps/vce`` with the tiny bundle as ``model/bundle``."""
    from bundle_helpers import BUNDLE

    app = tmp_path / "apps" / "vce"
    shutil.copytree(BUNDLE / "monailabel_app", app)
    # named "bundle": MONAI Label's stock app would serve a folder of that name as 3-D segmentation
    _tiny_bundle(app / "model" / "bundle", model_pt)
    return app


def _label_command(app: Path, studies: Path) -> tuple[list[str], dict[str, str]]:
    """``monailabel start_server`` for ``app`` on ``studies`` (no ``--host``, no ``--port``), and its environment."""
    cli = Path(sys.executable).with_name("monailabel")
    # the CLI runs `python -m monailabel.main` with the `python` found first on PATH: this environment's, as when
    # a user has activated it
    path = f"{cli.parent}{os.pathsep}{os.environ.get('PATH', '')}"
    env = dict(os.environ, PATH=path, MONAI_LABEL_DATASTORE_AUTO_RELOAD="false", PYTHONWARNINGS="ignore")
    command = [str(cli), "start_server", "--app", str(app), "--studies", str(studies)]
    return [*command, "--conf", "models", "bundle", "--conf", "preload", "false"], env


@contextlib.contextmanager
def _label_server(app: Path, studies: Path, log_file: Path) -> Iterator[str]:
    """A MONAI Label server of ``app`` on ``studies`` listening on loopback; yields its base URL."""
    from bundle_helpers import free_port

    port = free_port()
    command, env = _label_command(app, studies)
    with log_file.open("w") as log:
        server = subprocess.Popen(
            [*command, "--host", "127.0.0.1", "--port", str(port)], stdout=log, stderr=subprocess.STDOUT, env=env
        )
        try:
            _wait_for(f"http://127.0.0.1:{port}/info/", server, timeout=240, log=log_file)
            yield f"http://127.0.0.1:{port}"
        finally:
            server.terminate()
            try:
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                server.kill()


def _post(url: str, params: str = "{}") -> tuple[int, bytes]:
    """``POST url`` with the form field ``params``: the status and the body, whatever the status."""
    request = urllib.request.Request(url, data=urllib.parse.urlencode({"params": params}).encode(), method="POST")
    try:
        with urllib.request.urlopen(request, timeout=120) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def test_monai_label_server_classifies_a_frame_through_its_rest_api(tmp_path_factory, tmp_path, mini_galar):
    """``monailabel start_server --app <the bundle's app> --studies <frames> --conf models bundle``, then
    ``POST /infer/bundle`` on loopback: the 17 scores equal the network's sigmoid, with the folder named ``bundle``."""
    require_integration("monailabel", "label")
    from monai_vce.labels import LABELS

    run = trained_bundle(tmp_path_factory, mini_galar)
    app = _label_app(tmp_path, run["models"] / "model.pt")
    studies = tmp_path / "studies"
    source = mini_galar / "frames" / "ukdd_navi_00004"  # lower-case .png names, as MONAI Label's datastore lists
    shutil.copytree(source, studies)
    frame = sorted(studies.glob("*.png"))[3]
    with _label_server(app, studies, tmp_path / "server.log") as base:
        with urllib.request.urlopen(f"{base}/info/", timeout=30) as r:
            info = json.loads(r.read())
        assert info["models"]["bundle"]["type"] == "classification" and not info.get("trainers")
        status, body = _post(f"{base}/infer/bundle?image={frame.stem}&output=json")
    assert status == 200, body
    result = json.loads(body)
    scores = {p["label"]: p["score"] for p in result["prediction"]}
    assert list(scores) == list(LABELS)
    expected = _eager_probs(run["models"] / "model.pt", str(frame))
    torch.testing.assert_close(
        torch.tensor([scores[n] for n in LABELS], dtype=torch.float32), expected, rtol=1e-4, atol=1e-5
    )


def test_monai_label_server_lists_and_classifies_galar_upper_case_frames(tmp_path_factory, tmp_path, mini_galar):
    """A studies folder of Galar's frames, named ``frame_000003.PNG`` (MONAI Label's default patterns are lower-case
    and its matching is case-sensitive on Linux: it listed none), plus a ``.JPG`` and a ``.jpeg`` frame: the datastore
    lists every frame under its name without extension, and ``POST /infer`` on a ``.PNG`` frame returns the 17
    scores of the network's sigmoid (on the JPEG frames, 17 scores)."""
    require_integration("monailabel", "label")
    from PIL import Image

    from monai_vce.labels import LABELS

    run = trained_bundle(tmp_path_factory, mini_galar)
    app = _label_app(tmp_path, run["models"] / "model.pt")
    studies = tmp_path / "studies"
    shutil.copytree(mini_galar / "frames" / "1", studies)  # Galar's names: frame_000000.PNG, ...
    pngs = sorted(studies.glob("*.PNG"))
    assert len(pngs) > 3 and not list(studies.glob("*.png"))  # upper case only (the glob is case-sensitive here)
    frame = studies / "frame_000003.PNG"
    assert frame in pngs
    with Image.open(pngs[0]) as im:
        im.convert("RGB").save(studies / "frame_100000.JPG", quality=95)
        im.convert("RGB").save(studies / "frame_100001.jpeg", quality=95)
    expected_ids = {p.stem for p in pngs} | {"frame_100000", "frame_100001"}
    with _label_server(app, studies, tmp_path / "server.log") as base:
        with urllib.request.urlopen(f"{base}/datastore/?output=all", timeout=30) as r:
            listed = json.loads(r.read())["objects"]
        answers = {
            image: _post(f"{base}/infer/bundle?image={image}&output=json")
            for image in (frame.stem, "frame_100000", "frame_100001")
        }
    assert set(listed) == expected_ids
    assert listed[frame.stem]["image"]["ext"] == ".PNG" and listed["frame_100000"]["image"]["ext"] == ".JPG"
    for image, (status, body) in answers.items():
        assert status == 200, (image, body)
        prediction = json.loads(body)["prediction"]
        assert [p["label"] for p in prediction] == list(LABELS), image
        assert all(0.0 <= p["score"] <= 1.0 for p in prediction), image
    scores = {p["label"]: p["score"] for p in json.loads(answers[frame.stem][1])["prediction"]}
    expected = _eager_probs(run["models"] / "model.pt", str(frame))
    torch.testing.assert_close(
        torch.tensor([scores[n] for n in LABELS], dtype=torch.float32), expected, rtol=1e-4, atol=1e-5
    )


def test_monai_label_server_answers_bad_requests_with_a_one_line_reason(tmp_path_factory, tmp_path, mini_galar):
    """Through the REST API: a text file named as a frame (422), an unknown id or model (404), markup in the id, a
    path as the id (in the query or in ``params``) and ``params`` that are not a JSON object (400) are each answered
    with a one-line ``detail`` and no traceback; no PNG outside the studies folder is classified, markup is never
    echoed, and the server still classifies a frame afterwards."""
    require_integration("monailabel", "label")
    run = trained_bundle(tmp_path_factory, mini_galar)
    app = _label_app(tmp_path, run["models"] / "model.pt")
    studies = tmp_path / "studies"
    frames = sorted((mini_galar / "frames" / "ukdd_navi_00004").iterdir())
    studies.mkdir()
    shutil.copy(frames[0], studies / "good.png")
    (studies / "text.png").write_text("not a png\n")
    (studies / "cut.png").write_bytes(frames[1].read_bytes()[:200])  # a truncated PNG
    outside = tmp_path / "secret" / "outside.png"  # a readable PNG the server must not classify
    outside.parent.mkdir()
    shutil.copy(frames[2], outside)
    markup = "<script>alert(1)</script>"
    cases = {
        "text frame": ("bundle", "text", "{}", 422),
        "truncated frame": ("bundle", "cut", "{}", 422),
        "missing frame": ("bundle", "absent", "{}", 404),
        "unknown model": ("nothere", "good", "{}", 404),
        "markup in the id": ("bundle", markup, "{}", 400),
        "markup in the model": (markup, "good", "{}", 404),
        "path as the id": ("bundle", str(outside), "{}", 400),
        "relative path as the id": ("bundle", "../secret/outside", "{}", 400),
        "path in params": ("bundle", "good", json.dumps({"image": str(outside)}), 400),
        "params not JSON": ("bundle", "good", "{not json", 400),
        "params not an object": ("bundle", "good", "[1, 2]", 400),
    }
    answers = {}
    with _label_server(app, studies, tmp_path / "server.log") as base:
        for name, (model, image, params, _) in cases.items():
            query = urllib.parse.urlencode({"image": image, "output": "json"})
            answers[name] = _post(f"{base}/infer/{urllib.parse.quote(model, safe='')}?{query}", params)
        good = _post(f"{base}/infer/bundle?image=good&output=json")
    for name, (_, _, _, expected) in cases.items():
        status, body = answers[name]
        assert status == expected, (name, status, body)
        detail = json.loads(body)["detail"]
        assert isinstance(detail, str) and detail and "\n" not in detail, (name, detail)
        assert "Traceback" not in detail and "<script" not in body.decode(), (name, detail)
    assert "text" in json.loads(answers["text frame"][1])["detail"]
    assert good[0] == 200 and len(json.loads(good[1])["prediction"]) == 17


def test_monai_label_server_does_not_listen_on_all_interfaces_by_default(tmp_path_factory, tmp_path, mini_galar):
    """The documented start command without ``--host`` (MONAI Label's default: 0.0.0.0) exits with one line
    naming ``--host 127.0.0.1`` before it listens; ``--host`` given explicitly is the user's choice."""
    require_integration("monailabel", "label")
    run = trained_bundle(tmp_path_factory, mini_galar)
    app = _label_app(tmp_path, run["models"] / "model.pt")
    studies = tmp_path / "studies"
    studies.mkdir()
    shutil.copy(sorted((mini_galar / "frames" / "ukdd_navi_00004").iterdir())[0], studies / "good.png")
    from bundle_helpers import free_port

    command, env = _label_command(app, studies)
    port = free_port()
    log_file = tmp_path / "server.log"
    with log_file.open("w") as log:
        server = subprocess.Popen([*command, "--port", str(port)], stdout=log, stderr=subprocess.STDOUT, env=env)
        try:
            with pytest.raises(AssertionError, match="the server exited with status"):
                # listening (an answer from /info/) fails the test at once, without waiting for a timeout
                _wait_for(f"http://127.0.0.1:{port}/info/", server, timeout=240, log=log_file)
        finally:
            if server.poll() is None:
                server.kill()
            server.wait(timeout=30)
    out = log_file.read_text()
    assert server.returncode != 0, out[-4000:]
    lines = [line for line in out.splitlines() if "all interfaces" in line]
    assert len(lines) == 1 and "--host 127.0.0.1" in lines[0] and "Traceback" not in out, out[-4000:]


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
    run_in_process(
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
    # the units sidecar, as the bundle writes it (readers need the frame units of the file)
    from monai_vce.events import read_events_meta

    meta, own_meta = read_events_meta(out / "events.json"), read_events_meta(own / "events.json")
    assert meta is not None and own_meta is not None
    assert meta["frame_units"] is own_meta["frame_units"] and meta["videos"] == own_meta["videos"]
