"""DiffAttnCLIPClassifier: paths, preserving-mode equality with open_clip, TorchScript, bundle config, freezing."""

from __future__ import annotations

import io
import math
import warnings

import pytest
import torch
import torch.nn.functional as F

open_clip = pytest.importorskip("open_clip")

from monai_vce.labels import LABELS  # noqa: E402
from monai_vce.networks import (  # noqa: E402
    TINY_MODEL_NAME,
    DiffAttnCLIPClassifier,
    DifferentialAttention,
    save_tiny_local_dir,
)
from monai_vce.text_embeddings import save_text_embeddings  # noqa: E402


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny_classifier")
    save_tiny_local_dir(root / "local")
    torch.manual_seed(3)
    embeddings = F.normalize(torch.randn(17, 32), dim=-1)
    save_text_embeddings({"labels": list(LABELS), "embeddings": embeddings}, root / "text.pt")
    return root


def _net(tiny, **kwargs) -> DiffAttnCLIPClassifier:
    kwargs.setdefault("backbone", f"local-dir:{tiny / 'local'}")
    kwargs.setdefault("text_embeddings", str(tiny / "text.pt"))
    return DiffAttnCLIPClassifier(**kwargs)


def test_forward_and_paths(tiny):
    net = _net(tiny, dropout=0.0)
    x = torch.rand(3, 3, 64, 64)
    assert net.diff_blocks == [0, 1]
    assert all(isinstance(b.attn, DifferentialAttention) for b in net.visual.trunk.blocks)
    for train in (True, False):
        net.train(train)
        out = net(x)
        assert out.shape == (3, 17) and out.dtype == torch.float32
    net.eval()
    with torch.no_grad():
        cls_logits, con_logits = net.forward_paths(x)
        torch.testing.assert_close(net(x), cls_logits)
        features = net.visual((x - net.mean) / net.std)
        text = torch.load(tiny / "text.pt", weights_only=True)["embeddings"]
        expected = net.contrastive_head.logit_scale.exp() * F.normalize(features, dim=-1) @ text.t()
        torch.testing.assert_close(con_logits, expected, atol=1e-5, rtol=0)
    # the checkpoint's logit scale initialises the contrastive path
    ref = open_clip.create_model(f"local-dir:{tiny / 'local'}")
    assert net.contrastive_head.logit_scale.item() == pytest.approx(ref.logit_scale.item())
    mean_net = _net(tiny, fusion="mean").eval()
    mean_net.load_state_dict(net.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(mean_net(x), 0.5 * (cls_logits + con_logits))


def test_no_text_embeddings_warns_once_and_path_off(tiny):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        net = _net(tiny, text_embeddings=None)
        net(torch.rand(1, 3, 64, 64))
        net.forward_paths(torch.rand(1, 3, 64, 64))
    messages = [str(w.message) for w in caught if "contrastive path is off" in str(w.message)]
    assert len(messages) == 1 and "monai_vce.text_embeddings" in messages[0]
    assert net.contrastive_head is None and net.forward_paths(torch.rand(1, 3, 64, 64))[1] is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        off = _net(tiny, text_embeddings=None, contrastive=False)
    assert off.contrastive_head is None


def test_preserving_mode_equals_open_clip_tower(tiny):
    ref = open_clip.create_model(f"local-dir:{tiny / 'local'}").eval()
    x = torch.rand(4, 3, 64, 64)
    normalised = (x - torch.tensor(open_clip.OPENAI_DATASET_MEAN).view(1, 3, 1, 1)) / torch.tensor(
        open_clip.OPENAI_DATASET_STD
    ).view(1, 3, 1, 1)
    with torch.no_grad():
        expected = ref.encode_image(normalised)
        for impl in ("explicit", "sdpa"):
            net = _net(tiny, conversion_mode="preserving", attn_impl=impl).eval()
            torch.testing.assert_close(net.forward_features(x), expected, atol=1e-5, rtol=0)
        paper = _net(tiny, conversion_mode="paper").eval()
        assert (paper.forward_features(x) - expected).abs().max() > 1e-3
        plain = _net(tiny, attention="plain").eval()
        torch.testing.assert_close(plain.forward_features(x), expected, atol=1e-6, rtol=0)


@pytest.mark.parametrize("mode", ("paper", "preserving"))
def test_gradients_reach_lambda_through_both_paths(tiny, mode):
    net = _net(tiny, conversion_mode=mode).train()
    cls_logits, con_logits = net.forward_paths(torch.rand(2, 3, 64, 64))
    target = torch.zeros_like(cls_logits)
    target[:, 3] = 1
    loss = F.binary_cross_entropy_with_logits(cls_logits, target) + F.binary_cross_entropy_with_logits(
        con_logits, target
    )
    loss.backward()
    for block in net.visual.trunk.blocks:
        for name in ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2"):
            grad = getattr(block.attn, name).grad
            assert grad is not None and grad.abs().sum() > 0
    assert net.contrastive_head.logit_scale.grad is not None
    assert net.contrastive_head.text_embeddings.requires_grad is False
    assert set(net.differential_lambdas()) == {0, 1}


@pytest.mark.parametrize("mode", ("paper", "preserving"))
def test_torchscript_script_same_logits(tiny, mode):
    net = _net(tiny, conversion_mode=mode, fusion="mean").eval()
    with torch.no_grad():
        net.visual.trunk.blocks[1].attn.lambda_k2.add_(0.2)
        scripted = torch.jit.script(net)
        x = torch.rand(2, 3, 64, 64)
        torch.testing.assert_close(scripted(x), net(x), atol=1e-5, rtol=0)
        for got, want in zip(scripted.forward_paths(x), net.forward_paths(x), strict=False):
            torch.testing.assert_close(got, want, atol=1e-5, rtol=0)


@pytest.mark.parametrize("mode", ("paper", "preserving"))
def test_torchscript_trace_same_logits(tiny, mode):
    net = _net(tiny, conversion_mode=mode).eval()
    with torch.no_grad():
        net.visual.trunk.blocks[0].attn.lambda_q1.add_(0.2)
    x = torch.rand(2, 3, 64, 64)
    with torch.no_grad():
        traced = torch.jit.trace(net, x)
        buffer = io.BytesIO()
        torch.jit.save(traced, buffer)
        buffer.seek(0)
        loaded = torch.jit.load(buffer)
        other = torch.rand(3, 3, 64, 64)
        torch.testing.assert_close(loaded(other), net(other), atol=1e-5, rtol=0)


def test_bf16_autocast(tiny):
    net = _net(tiny).eval()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        out = net(torch.rand(2, 3, 64, 64))
        _, con_logits = net.forward_paths(torch.rand(2, 3, 64, 64))
    assert out.dtype == torch.float32 and torch.isfinite(out).all()
    assert con_logits.dtype == torch.float32 and torch.isfinite(con_logits).all()


def test_bundle_config_parser(tiny):
    from monai.bundle import ConfigParser

    config = {
        "lr": 0.001,
        "network_def": {
            "_target_": "monai_vce.networks.DiffAttnCLIPClassifier",
            "backbone": f"local-dir:{tiny / 'local'}",
            "conversion_mode": "preserving",
            "lambda_init_schedule": "constant",
            "diff_blocks": [1],
            "subln": False,
            "dropout": 0.2,
            "text_embeddings": str(tiny / "text.pt"),
            "freeze_blocks": 1,
        },
        "optimizer": {
            "_target_": "torch.optim.AdamW",
            "params": "$@network_def.param_groups(@lr, layer_decay=0.5)",
            "lr": "@lr",
        },
        "demo_network": {"_target_": "DiffAttnCLIPClassifier", "backbone": TINY_MODEL_NAME, "pretrained": False},
    }
    parser = ConfigParser(config)
    net = parser.get_parsed_content("network_def")
    assert isinstance(net, DiffAttnCLIPClassifier)
    assert net.diff_blocks == [1] and net.conversion_mode == "preserving"
    assert type(net.visual.trunk.blocks[0].attn).__name__ == "Attention"
    assert net.classifier_head.dropout.p == 0.2
    optimizer = parser.get_parsed_content("optimizer")
    trainable = {id(p) for p in net.parameters() if p.requires_grad}
    in_groups = [id(p) for g in optimizer.param_groups for p in g["params"]]
    assert sorted(in_groups) == sorted(trainable)
    with pytest.warns(UserWarning, match="contrastive path is off"):
        demo = parser.get_parsed_content("demo_network")
    assert demo(torch.rand(1, 3, 64, 64)).shape == (1, 17)


def test_freezing_and_layer_decay(tiny):
    net = _net(tiny, freeze_blocks=1)
    frozen = {n for n, p in net.named_parameters() if not p.requires_grad}
    assert "visual.trunk.patch_embed.proj.weight" in frozen and "visual.trunk.pos_embed" in frozen
    assert "visual.trunk.blocks.0.attn.qkv.weight" in frozen and "visual.trunk.blocks.0.mlp.fc1.weight" in frozen
    assert "visual.trunk.blocks.0.attn.lambda_q1" not in frozen  # new parameters stay trainable
    assert "visual.trunk.blocks.1.attn.qkv.weight" not in frozen and "visual.head.proj.weight" not in frozen

    lr, mult, decay = 1e-3, 0.1, 0.5
    groups = net.param_groups(lr, backbone_lr_mult=mult, layer_decay=decay, weight_decay=0.05)
    lr_of = {id(p): (g["lr"], g["weight_decay"]) for g in groups for p in g["params"]}
    params = dict(net.named_parameters())
    assert lr_of[id(params["visual.trunk.blocks.1.attn.qkv.weight"])] == (pytest.approx(lr * mult * decay), 0.05)
    assert lr_of[id(params["visual.trunk.blocks.1.attn.qkv.bias"])] == (pytest.approx(lr * mult * decay), 0.0)
    assert lr_of[id(params["visual.head.proj.weight"])] == (pytest.approx(lr * mult), 0.05)
    assert lr_of[id(params["visual.trunk.blocks.0.attn.lambda_q1"])] == (lr, 0.0)
    assert lr_of[id(params["classifier_head.fc.weight"])] == (lr, 0.05)
    assert lr_of[id(params["contrastive_head.logit_scale"])] == (lr, 0.0)
    assert all(id(params[n]) not in lr_of for n in frozen)

    linear_probe = _net(tiny, freeze_backbone=True)
    trainable = {n for n, p in linear_probe.named_parameters() if p.requires_grad}
    assert all(not n.startswith("visual.") or ".lambda_" in n or ".sub_norm." in n for n in trainable)
    assert "classifier_head.fc.weight" in trainable
    # layer decay over the embeddings of an unfrozen network
    full = _net(tiny)
    groups = full.param_groups(lr, backbone_lr_mult=mult, layer_decay=decay)
    lr_of = {id(p): g["lr"] for g in groups for p in g["params"]}
    assert lr_of[id(dict(full.named_parameters())["visual.trunk.patch_embed.proj.weight"])] == pytest.approx(
        lr * mult * decay**3
    )


def test_text_embedding_file_errors(tiny, tmp_path):
    bad_shape = tmp_path / "bad_shape.pt"
    torch.save(torch.randn(17, 16), bad_shape)
    with pytest.raises(ValueError, match=r"bad_shape\.pt.*\(17, 32\)"):
        _net(tiny, text_embeddings=str(bad_shape))
    reordered = tmp_path / "reordered.pt"
    torch.save({"labels": list(reversed(LABELS)), "embeddings": torch.randn(17, 32)}, reordered)
    with pytest.raises(ValueError, match=r"reordered\.pt.*different order"):
        _net(tiny, text_embeddings=str(reordered))
    with pytest.raises(FileNotFoundError, match=r"absent.pt"):
        _net(tiny, text_embeddings=str(tmp_path / "absent.pt"))


def test_argument_validation(tiny):
    with pytest.raises(ValueError, match="attention"):
        _net(tiny, attention="linear")
    with pytest.raises(ValueError, match="conversion_mode"):
        _net(tiny, conversion_mode="exact")
    with pytest.raises(ValueError, match="fusion"):
        _net(tiny, fusion="max")
    with pytest.raises(ValueError, match="freeze_blocks"):
        _net(tiny, freeze_blocks=5)


@pytest.mark.slow
def test_full_size_biomedclip_random_weights_offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    net = DiffAttnCLIPClassifier(pretrained=False, contrastive=False).eval()
    assert net.image_size == (224, 224) and net.embed_dim == 512
    assert len(net.diff_blocks) == 12
    blocks = net.visual.trunk.blocks
    assert blocks[0].attn.num_heads == 6 and blocks[0].attn.head_dim == 64
    assert blocks[11].attn.lambda_init == pytest.approx(0.8 - 0.6 * math.exp(-0.3 * 11))
    with torch.no_grad():
        out = net(torch.rand(2, 3, 224, 224))
    assert out.shape == (2, 17) and torch.isfinite(out).all()
