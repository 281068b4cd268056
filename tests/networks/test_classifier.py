"""DiffAttnCLIPClassifier: paths, heads, attention variants, text embeddings computed on first use, equality of the
preserving variant with open_clip, TorchScript, bundle config, freezing."""

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
    ATTENTION_VARIANTS,
    TINY_MODEL_NAME,
    DiffAttnCLIPClassifier,
    DifferentialAttention,
    save_tiny_local_dir,
)
from monai_vce.networks.text_embeddings import save_text_embeddings  # noqa: E402


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
        net(torch.rand(2, 3, 64, 64))
        net.forward_paths(torch.rand(2, 3, 64, 64))
    messages = [str(w.message) for w in caught if "contrastive path is off" in str(w.message)]
    assert len(messages) == 1 and "monai_vce.text_embeddings" in messages[0]
    assert net.contrastive_head is None and net.forward_paths(torch.rand(2, 3, 64, 64))[1] is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        off = _net(tiny, text_embeddings=None, contrastive=False)
    assert off.contrastive_head is None


def test_preserving_variant_equals_open_clip_tower(tiny):
    ref = open_clip.create_model(f"local-dir:{tiny / 'local'}").eval()
    x = torch.rand(4, 3, 64, 64)
    normalised = (x - torch.tensor(open_clip.OPENAI_DATASET_MEAN).view(1, 3, 1, 1)) / torch.tensor(
        open_clip.OPENAI_DATASET_STD
    ).view(1, 3, 1, 1)
    with torch.no_grad():
        expected = ref.encode_image(normalised)
        for impl in ("explicit", "sdpa"):
            net = _net(tiny, attention_variant="preserving", attn_impl=impl).eval()
            torch.testing.assert_close(net.forward_features(x), expected, atol=1e-5, rtol=0)
        for variant in ("paper", "diff_transformer"):
            paired = _net(tiny, attention_variant=variant).eval()
            assert (paired.forward_features(x) - expected).abs().max() > 1e-3
        plain = _net(tiny, attention="plain").eval()
        torch.testing.assert_close(plain.forward_features(x), expected, atol=1e-6, rtol=0)


@pytest.mark.parametrize("variant", ATTENTION_VARIANTS)
def test_gradients_reach_lambda_through_both_paths(tiny, variant):
    net = _net(tiny, attention_variant=variant).train()
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


@pytest.mark.parametrize("variant", ATTENTION_VARIANTS)
def test_torchscript_script_same_logits(tiny, variant):
    net = _net(tiny, attention_variant=variant, fusion="mean").eval()
    with torch.no_grad():
        net.visual.trunk.blocks[1].attn.lambda_k2.add_(0.2)
        scripted = torch.jit.script(net)
        x = torch.rand(2, 3, 64, 64)
        torch.testing.assert_close(scripted(x), net(x), atol=1e-5, rtol=0)
        for got, want in zip(scripted.forward_paths(x), net.forward_paths(x), strict=True):
            torch.testing.assert_close(got, want, atol=1e-5, rtol=0)


@pytest.mark.parametrize("variant", ATTENTION_VARIANTS)
def test_torchscript_trace_same_logits(tiny, variant):
    net = _net(tiny, attention_variant=variant).eval()
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
            "attention_variant": "preserving",
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
    assert net.diff_blocks == [1] and net.attention_variant == "preserving"
    assert type(net.visual.trunk.blocks[0].attn).__name__ == "Attention"
    assert net.classifier_head.dropout.p == 0.2
    optimizer = parser.get_parsed_content("optimizer")
    trainable = {id(p) for p in net.parameters() if p.requires_grad}
    in_groups = [id(p) for g in optimizer.param_groups for p in g["params"]]
    assert sorted(in_groups) == sorted(trainable)
    with pytest.warns(UserWarning, match="contrastive path is off"):
        demo = parser.get_parsed_content("demo_network")
    assert demo.eval()(torch.rand(1, 3, 64, 64)).shape == (1, 17)


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
    with pytest.raises(FileNotFoundError, match=r"absent\.pt"):
        _net(tiny, text_embeddings=str(tmp_path / "absent.pt"))


def test_argument_validation(tiny):
    with pytest.raises(ValueError, match="attention"):
        _net(tiny, attention="linear")
    with pytest.raises(ValueError, match="variant"):
        _net(tiny, attention_variant="exact")
    with pytest.raises(ValueError, match="reduction"):
        _net(tiny, se_reduction=64)
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
    # the default network (the bundle's default recipe): Ye et al.'s schedule and sub-norm, head r = 4
    assert blocks[11].attn.lambda_init == pytest.approx(0.8 - 0.6 * math.exp(-0.3 * 11))
    assert all(b.attn.use_sub_norm for b in blocks) and net.classifier_head.gate.fc[0].out_features == 128
    # the paper's network: constant lambda_init 0.8 and no sub-norm in all 12 blocks, heads on the 512-d feature
    paper = DiffAttnCLIPClassifier(
        pretrained=False, contrastive=False, attention_variant="paper", se_reduction=16, head_batch_norm=True
    )
    assert all(b.attn.lambda_init == 0.8 and not b.attn.use_sub_norm for b in paper.visual.trunk.blocks)
    assert paper.classifier_head.fc.in_features == 512 and paper.classifier_head.gate.fc[0].out_features == 32
    with torch.no_grad():
        out = net(torch.rand(2, 3, 224, 224))
    assert out.shape == (2, 17) and torch.isfinite(out).all()


def test_paper_head_excitation_batchnorm_dropout(tiny):
    """The paper's head: SE gate x sigmoid(W2 ReLU(W1 x)) with r = 16, then BatchNorm, dropout 0.4, linear to 17."""
    from monai_vce.networks import SEGatedClassifierHead

    head = SEGatedClassifierHead(512, reduction=16, dropout=0.4, batch_norm=True)
    assert head.gate.fc[0].in_features == 512 and head.gate.fc[0].out_features == 32  # 512 / 16
    assert isinstance(head.norm, torch.nn.BatchNorm1d) and head.dropout.p == 0.4 and head.fc.out_features == 17
    torch.manual_seed(0)
    x = torch.randn(8, 512) * 2 + 1
    head.eval()
    with torch.no_grad():
        head.norm.running_mean.uniform_(-1, 1)
        head.norm.running_var.uniform_(0.5, 2)
        w1, w2 = head.gate.fc[0], head.gate.fc[2]
        gated = x * torch.sigmoid(w2(torch.relu(w1(x))))
        normed = (gated - head.norm.running_mean) / torch.sqrt(head.norm.running_var + head.norm.eps)
        expected = head.fc(normed * head.norm.weight + head.norm.bias)
        torch.testing.assert_close(head(x), expected, atol=1e-5, rtol=1e-5)
    head.train()
    out = torch.stack([head(x) for _ in range(2)])
    assert not torch.allclose(out[0], out[1])  # dropout is active in training
    # BatchNorm normalises the gated features with the batch's statistics in training
    no_drop = SEGatedClassifierHead(512, reduction=16, batch_norm=True).train()
    feats = no_drop.norm(no_drop.gate(x.unsqueeze(-1)).squeeze(-1))
    torch.testing.assert_close(feats.mean(0), torch.zeros(512), atol=1e-5, rtol=0)
    # the default (project) head: r = 4, no BatchNorm, dropout 0.1
    project = _net(tiny).classifier_head
    assert project.gate.fc[0].out_features == 8 and isinstance(project.norm, torch.nn.Identity)
    assert project.dropout.p == 0.1


def test_contrastive_logit_scale_clamped_at_100(tiny):
    net = _net(tiny).eval()
    x = torch.rand(2, 3, 64, 64)
    with torch.no_grad():
        net.contrastive_head.logit_scale.fill_(math.log(1000.0))
        features = net.forward_features(x)
        cos = F.normalize(features, dim=-1) @ net.contrastive_head.text_embeddings.t()
        torch.testing.assert_close(net.forward_paths(x)[1], 100.0 * cos, atol=1e-4, rtol=1e-5)
        net.contrastive_head.logit_scale.fill_(math.log(20.0))
        torch.testing.assert_close(net.forward_paths(x)[1], 20.0 * cos, atol=1e-4, rtol=1e-5)
    assert _net(tiny, max_logit_scale=30.0).contrastive_head.max_logit_scale == 30.0


def test_diff_transformer_variant(tiny):
    """``attention_variant="diff_transformer"`` builds Ye et al.'s layout: depth schedule and sub-norm."""
    net = _net(tiny, attention_variant="diff_transformer")
    assert net.attention_variant == "diff_transformer"
    assert all(b.attn.use_sub_norm for b in net.visual.trunk.blocks)
    assert [b.attn.lambda_init for b in net.visual.trunk.blocks] == pytest.approx([0.2, 0.8 - 0.6 * math.exp(-0.3)])


def test_text_embeddings_computed_on_first_use_then_read(tiny, tmp_path, monkeypatch):
    """A missing file is computed once with the text model's text tower (here the tiny model's random one, a code
    path check, not clinical embeddings) and saved; the next network reads the file."""
    from monai_vce.networks.text_embeddings import compute_text_embeddings, load_text_embeddings

    target = tmp_path / "models" / "text_embeddings.pt"
    text_model = f"local-dir:{tiny / 'local'}"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        net = _net(tiny, text_embeddings=str(target), text_model=text_model)
    assert target.is_file() and net.contrastive_head is not None
    expected = compute_text_embeddings(text_model)["embeddings"]
    torch.testing.assert_close(load_text_embeddings(target, embed_dim=32), expected, atol=1e-6, rtol=0)
    torch.testing.assert_close(net.contrastive_head.text_embeddings, expected, atol=1e-6, rtol=0)

    import monai_vce.networks.classifier as classifier

    calls: list[str] = []

    def counting(*args, **kwargs):
        calls.append(str(args[0]))
        return compute_text_embeddings(*args, **kwargs)

    # the name the classifier calls (it imports the function into its own namespace)
    monkeypatch.setattr(classifier, "compute_text_embeddings", counting)
    again = _net(tiny, text_embeddings=str(target), text_model=text_model)
    torch.testing.assert_close(again.contrastive_head.text_embeddings, expected, atol=1e-6, rtol=0)
    assert calls == []  # read from the file, not recomputed
    _net(tiny, text_embeddings=str(tmp_path / "other.pt"), text_model=text_model)
    assert calls == [text_model]  # the patch is the one the classifier calls: a missing file is computed


def test_text_model_unreachable_one_warning_and_path_off(tiny, tmp_path):
    target = tmp_path / "text_embeddings.pt"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        net = _net(tiny, text_embeddings=str(target), text_model=str(tmp_path / "no_such_model.bin"))
    messages = [str(w.message) for w in caught if "contrastive path is off" in str(w.message)]
    assert len(messages) == 1 and "no_such_model.bin" in messages[0] and str(target) in messages[0]
    assert net.contrastive_head is None and not target.exists()


def test_checkpoint_with_contrastive_head_loads_without_it(tiny):
    """Inference builds no contrastive path; a checkpoint trained with one loads strictly all the same."""
    trained = _net(tiny).eval()
    assert any(k.startswith("contrastive_head.") for k in trained.state_dict())
    inference = _net(tiny, text_embeddings=None, contrastive=False).eval()
    inference.load_state_dict(trained.state_dict())
    x = torch.rand(2, 3, 64, 64)
    with torch.no_grad():
        torch.testing.assert_close(inference(x), trained(x))
    with pytest.raises(RuntimeError, match="classifier_head"):
        inference.load_state_dict({k: v for k, v in trained.state_dict().items() if "classifier_head" not in k})


def test_prompt_templates_computed_and_mismatch_refused(tiny, tmp_path):
    """prompt_templates are embedded when the classifier computes the file; a file recording other prompts is
    refused with the command that rebuilds it; a file without recorded prompts is read as before."""
    from monai_vce.networks.text_embeddings import compute_text_embeddings

    text_model = f"local-dir:{tiny / 'local'}"
    templates = ["a video capsule endoscopy image showing {name}"]
    target = tmp_path / "custom.pt"
    net = _net(tiny, text_embeddings=str(target), text_model=text_model, prompt_templates=templates)
    saved = torch.load(target, weights_only=True)
    assert saved["prompts"]["polyp"] == ["a video capsule endoscopy image showing polyp"]
    reference = {lb: [f"a video capsule endoscopy image showing {lb}"] for lb in LABELS}
    expected = compute_text_embeddings(text_model, prompts=reference)["embeddings"]
    torch.testing.assert_close(net.contrastive_head.text_embeddings, expected, atol=1e-6, rtol=0)
    assert _net(tiny, text_embeddings=str(target), prompt_templates=templates).contrastive_head is not None

    with pytest.raises(ValueError) as err:  # default templates against the custom file
        _net(tiny, text_embeddings=str(target))
    msg = str(err.value)
    assert "\n" not in msg and str(target) in msg and f"--model {text_model} --out {target}" in msg
    with pytest.raises(ValueError) as err:  # other templates: the command carries them
        _net(tiny, text_embeddings=str(target), prompt_templates=["{label} seen by a capsule"])
    assert "--templates '{label} seen by a capsule'" in str(err.value)
    # the fixture's file records no prompts: any templates read it
    assert _net(tiny, prompt_templates=templates).contrastive_head is not None
    with pytest.raises(ValueError, match="neither"):
        _net(tiny, prompt_templates=["no placeholder"])
