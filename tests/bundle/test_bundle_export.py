"""Export of the trained bundle model: ``ckpt_export`` to TorchScript (traced and scripted) with ``inference.json``
embedded, as bundle/docs/details.md shows both commands."""

from __future__ import annotations

import json

import pytest
import torch
from bundle_helpers import DEMO, INFERENCE, METADATA, config_list, run_in_process, trained_bundle


@pytest.fixture(scope="module", params=["trace", "script"])
def exported(request, tmp_path_factory, mini_galar):
    run = trained_bundle(tmp_path_factory, mini_galar)
    ts = run["out"] / f"model_{request.param}.ts"
    trace = ["--use_trace", "True", "--input_shape", "[1, 3, 64, 64]"] if request.param == "trace" else []
    run_in_process(
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
            config_list(INFERENCE, DEMO),
            *trace,
        ]
    )
    return run, ts


def test_torchscript_matches_eager(exported):
    from monai_vce.networks import DiffAttnCLIPClassifier

    run, ts = exported
    scripted = torch.jit.load(str(ts), map_location="cpu")
    net = DiffAttnCLIPClassifier(backbone="vce-tiny-vit-64", pretrained=False, image_size=64).eval()
    net.load_state_dict(torch.load(run["models"] / "model.pt", map_location="cpu", weights_only=True))
    x = torch.rand(3, 3, 64, 64, generator=torch.Generator().manual_seed(0))  # another batch size than traced
    with torch.no_grad():
        eager, traced = net(x), scripted(x)
    assert traced.shape == (3, 17) and traced.dtype == torch.float32
    torch.testing.assert_close(traced, eager, rtol=1e-5, atol=1e-5)
    if "script" in ts.name:  # a trace records the float path only; the scripted network also takes uint8 frames
        frames = (x * 255).round().to(torch.uint8)
        with torch.no_grad():
            torch.testing.assert_close(scripted(frames), net(frames.float() / 255), rtol=1e-5, atol=1e-5)


def test_torchscript_embeds_metadata_and_inference_config(exported):
    from monai.data import load_net_with_metadata

    _, ts = exported
    _, meta, extra = load_net_with_metadata(str(ts), more_extra_files=("inference.json", "demo.json"))
    assert meta["network_data_format"]["outputs"]["pred"]["num_channels"] == 17
    inference = json.loads(extra["inference.json"])
    assert inference["network_def"]["_target_"] == "monai_vce.networks.DiffAttnCLIPClassifier"
    assert "evaluator" in inference and "handlers" in inference
