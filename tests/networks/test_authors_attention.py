"""The ``authors`` attention variant (the layout of the paper authors' code): exact against a float64 reference of
``proj(concat(A1 V1 - lambda A2 V2, A2 V2))``, the pretrained function at lambda = 0, ``lambda_value()``, one SDPA
call per block, the bundle config key, state-dict compatibility with the pretrained tower."""

from __future__ import annotations

import copy
import json
import math

import pytest
import torch
import torch.nn.functional as F

timm = pytest.importorskip("timm")
pytest.importorskip("open_clip")

from bundle_helpers import TRAIN  # noqa: E402
from timm.layers import Attention  # noqa: E402

from monai_vce.networks import (  # noqa: E402
    ATTENTION_VARIANTS,
    DiffAttnCLIPClassifier,
    DifferentialAttention,
    convert_to_diff_attention,
    save_tiny_local_dir,
)
from monai_vce.networks.backbone import TINY_TIMM_MODEL_NAME  # noqa: E402

IMPLS = ("sdpa", "explicit")
LAMBDAS = ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2")


def _tiny_vit(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return timm.create_model(TINY_TIMM_MODEL_NAME, num_classes=0).eval()


def _reference_lambda(attn: DifferentialAttention) -> torch.Tensor:
    """``mean_j(exp(min(lq1_j . lk1_j, 5)) - exp(min(lq2_j . lk2_j, 5)) + lambda_init)`` in float64, from the formula."""
    q1, k1, q2, k2 = (getattr(attn, n).detach().double() for n in LAMBDAS)
    heads = q1.shape[0]
    terms = []
    for j in range(heads):
        dot1 = float((q1[j].flatten() * k1[j].flatten()).sum())
        dot2 = float((q2[j].flatten() * k2[j].flatten()).sum())
        terms.append(math.exp(min(dot1, 5.0)) - math.exp(min(dot2, 5.0)) + attn.lambda_init)
    return torch.tensor(sum(terms) / heads, dtype=torch.float64)


def _reference_output(pretrained: Attention, attn: DifferentialAttention, x: torch.Tensor) -> torch.Tensor:
    """``proj(concat(A1 V1 - lambda A2 V2, A2 V2))`` in float64 from the pretrained weights: group 1 = heads
    0 .. h/2-1, group 2 = heads h/2 .. h-1, each head with its own value, A = softmax(Q K^T / sqrt(d_h))."""
    x = x.double()
    B, N, C = x.shape
    h = pretrained.num_heads
    d = C // h
    w, b = pretrained.qkv.weight.detach().double(), pretrained.qkv.bias.detach().double()
    q, k, v = (x @ w.t() + b).split(C, dim=-1)
    q, k, v = (t.reshape(B, N, h, d).transpose(1, 2) for t in (q, k, v))
    heads = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(d), dim=-1) @ v  # (B, h, N, d): A_i V_i
    lam = _reference_lambda(attn)
    group1, group2 = heads[:, : h // 2], heads[:, h // 2 :]
    out = torch.cat((group1 - lam * group2, group2), dim=1).transpose(1, 2).reshape(B, N, C)
    return out @ pretrained.proj.weight.detach().double().t() + pretrained.proj.bias.detach().double()


def _force_lambda_zero(model: torch.nn.Module) -> None:
    """lambda_init 0 and the second pair of lambda vectors equal to the first: lambda = 0 exactly."""
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, DifferentialAttention):
                module.lambda_init = 0.0
                module.lambda_q2.copy_(module.lambda_q1)
                module.lambda_k2.copy_(module.lambda_k1)
                assert module.lambda_value().item() == 0.0


def test_authors_is_an_attention_variant():
    assert "authors" in ATTENTION_VARIANTS
    attn = DifferentialAttention(64, num_heads=2, variant="authors")
    assert attn.variant == "authors" and attn.lambda_init == 0.8 and not attn.use_sub_norm
    with pytest.raises(ValueError, match="sub-norm"):
        DifferentialAttention(64, num_heads=2, variant="authors", sub_norm=True)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("heads", [4, 6])
def test_matches_float64_reference(impl, heads):
    torch.manual_seed(heads)
    pretrained = Attention(96, num_heads=heads, qkv_bias=True).eval()
    attn = DifferentialAttention.from_attention(pretrained, variant="authors", attn_impl=impl).eval()
    with torch.no_grad():
        for name in LAMBDAS:  # lambda well away from lambda_init, each differential head different
            getattr(attn, name).normal_(0.0, 0.4)
        lam = attn.lambda_value()
        assert abs(lam.item() - 0.8) > 1e-2
        x = torch.randn(2, 19, 96)
        expected = _reference_output(pretrained, attn, x)
        torch.testing.assert_close(attn(x).double(), expected, atol=1e-5, rtol=0)
        # the 'paper' variant (pairs 2j, 2j+1, shared value) is a different function: the check above can fail
        paper = DifferentialAttention.from_attention(pretrained, variant="paper", attn_impl=impl).eval()
        assert (paper(x).double() - expected).abs().max() > 1e-2


@pytest.mark.parametrize("impl", IMPLS)
def test_equals_the_pretrained_network_at_lambda_zero(impl):
    model = _tiny_vit()
    original = copy.deepcopy(model)
    convert_to_diff_attention(model, variant="authors", attn_impl=impl)
    x = torch.rand(3, 3, 64, 64)
    with torch.no_grad():
        assert (model(x) - original(x)).abs().max() > 1e-3  # lambda ~ 0.8 at initialisation: not the pretrained
        _force_lambda_zero(model)
        torch.testing.assert_close(model(x), original(x), atol=1e-6, rtol=0)
    # also through the constructor's lambda_init, with equal vector pairs
    again = copy.deepcopy(original)
    convert_to_diff_attention(again, variant="authors", lambda_init=0.0, attn_impl=impl)
    with torch.no_grad():
        for blk in again.blocks:
            assert blk.attn.lambda_init == 0.0
            blk.attn.lambda_q2.copy_(blk.attn.lambda_q1)
            blk.attn.lambda_k2.copy_(blk.attn.lambda_k1)
        torch.testing.assert_close(again(x), original(x), atol=1e-6, rtol=0)


def test_lambda_value_vectors_and_clamp():
    torch.manual_seed(0)
    attn = DifferentialAttention(768, num_heads=6, depth=7, variant="authors")
    for name in LAMBDAS:
        assert tuple(getattr(attn, name).shape) == (6, 1, 64) and getattr(attn, name).dtype == torch.float32
    vectors = torch.cat([getattr(attn, n).detach().flatten() for n in LAMBDAS])
    assert 0.017 < vectors.std().item() < 0.023  # N(0, 0.02^2)
    assert attn.lambda_init == 0.8  # constant in every block
    lam = attn.lambda_value()
    assert lam.shape == () and lam.dtype == torch.float32
    assert lam.item() == pytest.approx(_reference_lambda(attn).item(), abs=1e-6)
    assert lam.item() == pytest.approx(0.8, abs=0.02)  # the dot products are ~1e-2 at initialisation
    with torch.no_grad():
        attn.lambda_q1[0].fill_(1.0)
        attn.lambda_k1[0].fill_(1.0)  # head 0: lq1 . lk1 = 64, clamped at 5
    lam = attn.lambda_value()
    assert lam.item() == pytest.approx(_reference_lambda(attn).item(), abs=1e-5)
    assert lam.item() > 0.8 + (math.exp(5.0) - 2) / 6
    lam.backward()
    assert torch.count_nonzero(attn.lambda_q1.grad[0]) == 0  # clamped head: no gradient
    assert all(torch.count_nonzero(getattr(attn, n).grad[1:]) > 0 for n in LAMBDAS)


@pytest.mark.parametrize("impl", IMPLS)
def test_attention_maps_are_the_head_groups(impl):
    torch.manual_seed(1)
    pretrained = Attention(64, num_heads=4, qkv_bias=True).eval()
    attn = DifferentialAttention.from_attention(pretrained, variant="authors", attn_impl=impl).eval()
    x = torch.randn(2, 7, 64)
    with torch.no_grad():
        q, k, _ = (pretrained.qkv(x)).reshape(2, 7, 3, 4, 16).permute(2, 0, 3, 1, 4).unbind(0)
        reference = torch.softmax(q @ k.transpose(-2, -1) * 16**-0.5, dim=-1)
        maps, lam = attn.attention_maps(x)
    assert maps.shape == (2, 2, 2, 7, 7)
    for j in range(2):
        torch.testing.assert_close(maps[:, j, 0], reference[:, j], atol=1e-6, rtol=0)
        torch.testing.assert_close(maps[:, j, 1], reference[:, j + 2], atol=1e-6, rtol=0)
    assert lam.item() == pytest.approx(attn.lambda_value().item())


def test_one_sdpa_call_per_block_with_the_pretrained_head_width(monkeypatch):
    model = _tiny_vit()
    convert_to_diff_attention(model, variant="authors")
    reference = copy.deepcopy(model)
    for blk in reference.blocks:
        blk.attn.attn_impl = "explicit"
    calls: list[tuple[int, ...]] = []
    original_sdpa = F.scaled_dot_product_attention

    def counting(q, k, v, *args, **kwargs):
        calls.append((q.shape[1], q.shape[-1], k.shape[-1], v.shape[-1]))
        return original_sdpa(q, k, v, *args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", counting)
    x = torch.rand(2, 3, 64, 64)
    with torch.no_grad():
        out = model(x)
        assert calls == [(4, 16, 16, 16)] * len(model.blocks)  # the 4 pretrained heads of width 16, one call
        expected = reference(x)
        assert len(calls) == len(model.blocks)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=0)


def test_masks_dropout_and_gradients():
    pretrained = Attention(64, num_heads=4, qkv_bias=True).eval()
    a = DifferentialAttention.from_attention(pretrained, variant="authors", attn_impl="sdpa")
    b = copy.deepcopy(a)
    b.attn_impl = "explicit"
    torch.manual_seed(2)
    x = torch.randn(2, 6, 64)
    per_head = (torch.rand(2, 4, 6, 6) > 0.4) | torch.eye(6, dtype=torch.bool)
    with torch.no_grad():
        for kwargs in ({"is_causal": True}, {"attn_mask": per_head}, {"attn_mask": torch.randn(6, 6)}):
            torch.testing.assert_close(a(x, **kwargs), b(x, **kwargs), atol=1e-5, rtol=0)
        with pytest.raises(ValueError, match=r"diff_attention\.py: attn_mask"):
            a(x, attn_mask=torch.zeros(1, 3, 6, 6))
    a.train()
    a(x).square().mean().backward()
    for name in LAMBDAS:
        grad = getattr(a, name).grad
        assert grad is not None and torch.isfinite(grad).all() and grad.abs().sum() > 0, name


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    folder = tmp_path_factory.mktemp("authors_tiny") / "local"
    save_tiny_local_dir(folder)
    return folder


def test_bundle_config_key_selects_the_variant(tiny, tmp_path):
    from monai.bundle import ConfigParser

    parser = ConfigParser()
    parser.read_config(TRAIN)
    with open(TRAIN) as f:
        assert "attention_variant" in json.load(f)["network_def"]  # the key the override below sets
    parser.update(
        {
            "attention_variant": "authors",
            "backbone": f"local-dir:{tiny}",
            "image_size": 64,
            "ckpt_dir": str(tmp_path),
        }
    )
    net = parser.get_parsed_content("network_def")
    assert isinstance(net, DiffAttnCLIPClassifier) and net.attention_variant == "authors"
    blocks = net.visual.trunk.blocks
    assert net.diff_blocks == list(range(len(blocks)))
    for blk in blocks:
        assert isinstance(blk.attn, DifferentialAttention)
        assert blk.attn.variant == "authors" and blk.attn.lambda_init == 0.8 and not blk.attn.use_sub_norm
    parser.update({"attention_variant": "autors"})
    with pytest.raises(RuntimeError, match="DiffAttnCLIPClassifier") as info:
        ConfigParser(parser.get()).get_parsed_content("network_def")
    assert "attention variant must be one of" in str(info.value.__cause__)  # MONAI chains the network's error


def test_converted_backbone_loads_the_pretrained_tower(tiny):
    plain = DiffAttnCLIPClassifier(backbone=f"local-dir:{tiny}", attention="plain", contrastive=False).eval()
    net = DiffAttnCLIPClassifier(
        backbone=f"local-dir:{tiny}", attention_variant="authors", contrastive=False, defer_pretrained=True
    ).eval()
    tower, converted = plain.visual.state_dict(), net.visual.state_dict()
    added = set(converted) - set(tower)
    assert set(tower) <= set(converted)
    assert added == {f"trunk.blocks.{i}.attn.{n}" for i in range(2) for n in LAMBDAS}
    assert all(tuple(converted[k].shape) == (2, 1, 16) for k in added)
    assert all(converted[k].shape == tower[k].shape for k in tower)
    assert net.load_pretrained()  # the pretrained tower's keys load into the converted one (lambda vectors new)
    for key, value in tower.items():
        assert torch.equal(net.visual.state_dict()[key], value), key
    x = torch.rand(2, 3, 64, 64)
    # a converted checkpoint loads back strictly
    other = DiffAttnCLIPClassifier(backbone=f"local-dir:{tiny}", attention_variant="authors", contrastive=False)
    other.load_state_dict(net.state_dict(), strict=True)
    with torch.no_grad():
        torch.testing.assert_close(other.eval().forward_features(x), net.forward_features(x), atol=0, rtol=0)
        assert (net.forward_features(x) - plain.forward_features(x)).abs().max() > 1e-4
        _force_lambda_zero(net)
        torch.testing.assert_close(net.forward_features(x), plain.forward_features(x), atol=1e-5, rtol=0)


def test_torchscript_and_bf16_autocast():
    model = _tiny_vit()
    convert_to_diff_attention(model, variant="authors")
    x = torch.rand(2, 3, 64, 64)
    with torch.no_grad():
        scripted = torch.jit.script(model.blocks[0].attn)
        tokens = torch.randn(2, 17, 64)
        torch.testing.assert_close(scripted(tokens), model.blocks[0].attn(tokens), atol=1e-6, rtol=0)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = model(x)
    assert torch.isfinite(out.float()).all()
