"""No silent loss of the contrastive term: ``contrastive_weight > 0`` without text embeddings stops training before
its first iteration with one line saying how to compute them; inference and ``contrastive_weight 0`` need none."""

from __future__ import annotations

import json
import warnings

import pytest
import torch
from bundle_helpers import (
    CONFIGS,
    DEMO,
    INFERENCE,
    TRAIN,
    config_list,
    run_in_process,
    tiny_config_parser,
    tiny_overrides,
)
from ignite.engine import Events

from monai_vce.engines.trainer import VCETrainer, check_contrastive_path
from monai_vce.labels import LABELS
from monai_vce.networks import TINY_MODEL_NAME, DiffAttnCLIPClassifier, save_tiny_checkpoint
from monai_vce.networks.backbone import BIOMEDCLIP_CONFIG, TINY_CONFIG
from monai_vce.networks.text_embeddings import save_text_embeddings

PAPER = str(CONFIGS / "paper.json")


@pytest.fixture
def offline(monkeypatch):
    """No hub: a Hugging Face text tower that is not on this disk cannot be had."""
    try:
        import huggingface_hub.constants as hub
    except ImportError:  # without huggingface_hub nothing reaches the hub anyway
        return
    monkeypatch.setattr(hub, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(hub, "HF_HUB_CACHE", "/nonexistent/hf_cache")


@pytest.fixture
def bert_unreachable(tmp_path) -> str:
    """A CLIP folder like a BiomedCLIP snapshot: its text tower is the BiomedBERT hub repo, not on this disk."""
    folder = tmp_path / "biomedclip"
    save_tiny_checkpoint(folder / "open_clip_pytorch_model.bin", seed=0)
    model_cfg = {**TINY_CONFIG["model_cfg"], "text_cfg": BIOMEDCLIP_CONFIG["model_cfg"]["text_cfg"]}
    (folder / "open_clip_config.json").write_text(
        json.dumps({"model_cfg": model_cfg, "preprocess_cfg": TINY_CONFIG["preprocess_cfg"]})
    )
    return f"local-dir:{folder}"


def _quiet_net(**kwargs) -> DiffAttnCLIPClassifier:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return DiffAttnCLIPClassifier(backbone=TINY_MODEL_NAME, pretrained=False, image_size=64, **kwargs)


def _loader(n=4):
    items = [{"image": torch.randint(0, 256, (3, 64, 64), dtype=torch.uint8), "label": torch.zeros(17)}] * n
    return torch.utils.data.DataLoader(items, batch_size=2)


def _trainer(net, weight, **kw):
    return VCETrainer(
        device=torch.device("cpu"),
        max_epochs=1,
        train_data_loader=_loader(),
        network=net,
        optimizer=torch.optim.SGD(net.parameters(), lr=0.0),
        loss_function=torch.nn.BCEWithLogitsLoss(),
        mixup_alpha=0.0,
        contrastive_weight=weight,
        decollate=False,
        **kw,
    )


def _assert_one_line_with_the_command(message: str, out: str) -> None:
    assert "\n" not in message, message
    assert "contrastive_weight is 0.4" in message
    assert "python -m monai_vce text-embeddings --model" in message and f"--out {out}" in message
    assert "BiomedBERT config and tokenizer" in message and "--text-config" in message
    assert "contrastive_weight 0" in message


def test_trainer_refuses_a_network_without_its_contrastive_path(tmp_path, offline, bert_unreachable):
    target = tmp_path / "models" / "text_embeddings.pt"
    net = _quiet_net(text_embeddings=str(target), text_model=bert_unreachable)
    assert net.contrastive_head is None and not target.exists()
    with pytest.raises(ValueError) as caught:
        _trainer(net, 0.4)
    message = str(caught.value)
    _assert_one_line_with_the_command(message, str(target))
    assert "microsoft/BiomedNLP-BiomedBERT-base-uncased-abstract" in message and bert_unreachable in message
    # no file given at all
    with pytest.raises(ValueError, match="no text_embeddings file given") as caught:
        _trainer(_quiet_net(text_embeddings=None), 0.4)
    _assert_one_line_with_the_command(str(caught.value), "bundle/models/text_embeddings.pt")
    # built without the path on purpose
    with pytest.raises(ValueError, match="built with contrastive=False"):
        check_contrastive_path(_quiet_net(text_embeddings=None, contrastive=False), 0.4)
    # contrastive_weight 0 trains the classification path without embeddings
    trainer = _trainer(net, 0.0)
    trainer.run()
    assert trainer.state.iteration == 2 and float(trainer.state.output["loss_con"]) == 0.0


def test_with_embeddings_the_contrastive_term_trains(tmp_path):
    path = save_text_embeddings({"labels": list(LABELS), "embeddings": torch.randn(17, 32)}, tmp_path / "text.pt")
    net = _quiet_net(text_embeddings=str(path))
    assert net.contrastive_head is not None and net.contrastive_off_reason is None
    trainer = _trainer(net, 0.4)
    trainer.run()
    assert float(trainer.state.output["loss_con"]) > 0.0


def test_deferred_network_stops_before_the_first_iteration(tmp_path, offline, bert_unreachable):
    """A trainer built before ``load_pretrained`` (which finds no embeddings) refuses to run: no iteration starts."""
    target = tmp_path / "text_embeddings.pt"
    net = DiffAttnCLIPClassifier(
        backbone=TINY_MODEL_NAME,
        pretrained=False,
        image_size=64,
        text_embeddings=str(target),
        text_model=bert_unreachable,
        defer_pretrained=True,
    )
    trainer = _trainer(net, 0.4)  # the placeholder path exists until the embeddings are looked for
    started = []
    trainer.add_event_handler(Events.ITERATION_STARTED, lambda engine: started.append(engine.state.iteration))
    with pytest.warns(UserWarning, match="contrastive path is off"):
        net.load_pretrained()
    with pytest.raises(ValueError, match="python -m monai_vce text-embeddings") as caught:
        trainer.run()
    _assert_one_line_with_the_command(str(caught.value), str(target))
    assert started == []


def test_paper_preset_without_embeddings_stops_before_training(mini_galar, tmp_path):
    """``python -m monai.bundle run training`` with the paper preset and no embeddings: one error line, no iteration."""
    args = ["run", "training", "--config_file", config_list(TRAIN, DEMO, PAPER)]
    proc = run_in_process([*args, *tiny_overrides(mini_galar, tmp_path), "--log_iterations", "True"], check=False)
    assert proc.returncode == 1
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, proc.stderr[-3000:]
    _assert_one_line_with_the_command(errors[0], "bundle/models/text_embeddings.pt")
    assert errors[0].startswith("error: ValueError: contrastive_weight is 0.4")
    log = proc.stdout + proc.stderr
    assert "Iter: 1/" not in log and "Epoch[1]" not in log  # no iteration ran (log_iterations logs each one)
    assert not list((tmp_path / "models").glob("*.pt"))


def test_inference_needs_no_embeddings(mini_galar, tmp_path):
    """Inference builds no contrastive path: no embeddings file, no warning about it, the network runs."""
    parser = tiny_config_parser([INFERENCE, PAPER], mini_galar, tmp_path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        net = parser.get_parsed_content("network_def")
    assert not [w for w in caught if "contrastive" in str(w.message)]
    assert net.contrastive_head is None
    with torch.no_grad():
        assert net.eval()(torch.rand(2, 3, 64, 64)).shape == (2, 17)
