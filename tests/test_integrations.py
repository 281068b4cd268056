"""MONAI Label and MONAI Deploy integrations (optional extras ``monai-vce[label]``, ``monai-vce[deploy]``).

Both extras pull heavy dependencies (MONAI Label downgrades numpy and brings a server stack; MONAI Deploy
brings holoscan and needs pydicom and highdicom), so they live in their own virtual environments; each test
is skipped, saying why, where its package is not installed.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from bundle_helpers import CONFIGS, METADATA, run_bundle, trained_bundle

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


def _tiny_bundle(tmp_path: Path, model_pt: Path) -> Path:
    """A bundle folder: the shipped configs with the tiny backbone merged into inference.json, and a model.pt."""
    root = tmp_path / "vce_bundle"
    shutil.copytree(CONFIGS, root / "configs")
    inference = json.loads((root / "configs" / "inference.json").read_text())
    inference.update({**TINY, "bundle_root": str(root), "amp": False, "num_workers": 0})
    (root / "configs" / "inference.json").write_text(json.dumps(inference, indent=2))
    (root / "models").mkdir()
    shutil.copy(model_pt, root / "models" / "model.pt")
    return root


def test_monai_label_bundle_infer_task(tmp_path_factory, tmp_path, mini_galar):
    pytest.importorskip(
        "monailabel", reason="MONAI Label is not installed (pip install monai-vce[label], in its own venv)"
    )
    from monailabel.tasks.infer.bundle import BundleInferTask

    run = trained_bundle(tmp_path_factory, mini_galar)
    root = _tiny_bundle(tmp_path, run["models"] / "model.pt")
    task = BundleInferTask(str(root), {"preload": "false"}, add_post_restore=False, type="classification")
    frame = _frame(mini_galar)
    result = task({"image": frame, "device": "cpu", "result_extension": ".json"})
    expected = _eager_probs(run["models"] / "model.pt", frame)
    # classification result: one score per label, named by the metadata's channel_def
    _, out = result
    scores = {p["label"]: p["score"] for p in out["prediction"]}
    from monai_vce.labels import LABELS

    assert list(scores) == list(LABELS)
    torch.testing.assert_close(
        torch.tensor([scores[n] for n in LABELS], dtype=torch.float32), expected, rtol=1e-4, atol=1e-5
    )


def test_monai_deploy_bundle_inference_operator(tmp_path_factory, tmp_path, mini_galar):
    pytest.importorskip(
        "monai.deploy.operators.monai_bundle_inference_operator",
        reason="MONAI Deploy App SDK is not installed (pip install monai-vce[deploy], in its own venv)",
    )
    from monai.deploy.core import AppContext, Fragment, IOType
    from monai.deploy.operators.monai_bundle_inference_operator import IOMapping, MonaiBundleInferenceOperator

    run = trained_bundle(tmp_path_factory, mini_galar)
    root = _tiny_bundle(tmp_path, run["models"] / "model.pt")
    ts = tmp_path / "model.ts"
    run_bundle(
        [
            "ckpt_export",
            "network_def",
            "--filepath",
            str(ts),
            "--ckpt_file",
            str(run["models"] / "model.pt"),
            "--meta_file",
            METADATA,
            "--config_file",
            str(root / "configs" / "inference.json"),
            "--use_trace",
            "True",
            "--input_shape",
            "[1, 3, 64, 64]",
        ]
    )
    op = MonaiBundleInferenceOperator(
        Fragment(),
        app_context=AppContext({}),
        input_mapping=[IOMapping("image", torch.Tensor, IOType.IN_MEMORY)],
        output_mapping=[IOMapping("pred", torch.Tensor, IOType.IN_MEMORY)],
        bundle_path=ts,
    )
    # the operator reads the configs and metadata embedded in model.ts (no holoscan graph is run here)
    op._init_config(op._bundle_config_names.config_names)
    assert op._outputs["pred"]["num_channels"] == 17
    op._model_network = torch.jit.load(str(ts), map_location="cpu").eval()
    frame = _frame(mini_galar)
    from monai_vce.data import load_vce_frame

    x = load_vce_frame(frame, 64).float().div(255)[None]
    with torch.no_grad():
        logits = op.predict(data=x)
        probs = op.post_process(logits)
    probs = probs["pred"] if isinstance(probs, dict) else probs
    torch.testing.assert_close(
        torch.as_tensor(probs).reshape(-1), _eager_probs(run["models"] / "model.pt", frame), rtol=1e-4, atol=1e-5
    )
