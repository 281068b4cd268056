"""Differential attention: the three variants, conversion of every block, exact weight transfer, gradients, autocast,
float64, the default variant."""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F

timm = pytest.importorskip("timm")

from timm.layers import Attention  # noqa: E402

from monai_vce.networks.backbone import TINY_TIMM_MODEL_NAME  # noqa: E402
from monai_vce.networks.diff_attention import (  # noqa: E402
    ATTENTION_VARIANTS,
    DifferentialAttention,
    convert_to_diff_attention,
    lambda_init_for_depth,
    resolve_lambda_init,
)

IMPLS = ("sdpa", "explicit")
NEW_PARAMS = {"lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2"}


def _tiny_vit(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return timm.create_model(TINY_TIMM_MODEL_NAME, num_classes=0).eval()


def _reference_maps(attn: Attention, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax maps (B, h, N, N) and values (B, h, N, d) of every head, computed by hand from the original weights."""
    B, N, C = x.shape
    h = attn.num_heads
    d = C // h
    qkv = x @ attn.qkv.weight.t() + attn.qkv.bias
    q, k, v = qkv.split(C, dim=-1)
    q, k, v = (t.reshape(B, N, h, d).transpose(1, 2) for t in (q, k, v))
    maps = torch.softmax((q @ k.transpose(-2, -1)) / math.sqrt(d), dim=-1)
    return maps, v


def test_convert_every_block_keeps_pretrained_modules():
    model = _tiny_vit()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    originals = [(blk.attn.qkv, blk.attn.proj) for blk in model.blocks]
    converted = convert_to_diff_attention(model, variant="diff_transformer")
    assert converted == list(range(len(model.blocks))) == [0, 1]
    for i, blk in enumerate(model.blocks):
        assert isinstance(blk.attn, DifferentialAttention)
        assert blk.attn.qkv is originals[i][0] and blk.attn.proj is originals[i][1]
        assert blk.attn.num_heads == 2 and blk.attn.head_dim == 16
        assert blk.attn.lambda_init == pytest.approx(0.8 - 0.6 * math.exp(-0.3 * i))
    after = model.state_dict()
    for key, value in before.items():
        assert torch.equal(after[key], value), key
    new_keys = set(after) - set(before)
    expected = {f"blocks.{i}.attn.{n}" for i in range(2) for n in NEW_PARAMS | {"sub_norm.weight"}}
    assert new_keys == expected
    for i in range(2):
        assert tuple(after[f"blocks.{i}.attn.lambda_q1"].shape) == (16,)
        assert tuple(after[f"blocks.{i}.attn.sub_norm.weight"].shape) == (32,)


def test_convert_selected_blocks_and_errors():
    model = _tiny_vit()
    assert convert_to_diff_attention(model, blocks=[-1]) == [1]
    assert isinstance(model.blocks[1].attn, DifferentialAttention)
    assert type(model.blocks[0].attn) is Attention
    with pytest.raises(TypeError, match="block 1"):
        convert_to_diff_attention(model, blocks=[1])
    with pytest.raises(ValueError, match="out of range"):
        convert_to_diff_attention(model, blocks=[5])
    with pytest.raises(ValueError, match="odd number"):
        DifferentialAttention.from_attention(Attention(48, num_heads=3, qkv_bias=True))


@pytest.mark.parametrize("impl", IMPLS)
def test_a1_a2_are_the_pretrained_head_maps(impl):
    model = _tiny_vit()
    original = copy.deepcopy(model)
    convert_to_diff_attention(model, variant="diff_transformer", attn_impl=impl)
    torch.manual_seed(1)
    x = torch.randn(2, 17, 64)
    with torch.no_grad():
        for blk, ref_blk in zip(model.blocks, original.blocks, strict=True):
            attn = blk.attn
            attn.sub_norm.weight.uniform_(0.5, 1.5)  # a non-trivial learned norm weight
            ref_maps, ref_v = _reference_maps(ref_blk.attn, x)
            maps, lam = attn.attention_maps(x)
            assert maps.shape == (2, 2, 2, 17, 17)
            for j in range(2):
                torch.testing.assert_close(maps[:, j, 0], ref_maps[:, 2 * j], atol=1e-6, rtol=0)
                torch.testing.assert_close(maps[:, j, 1], ref_maps[:, 2 * j + 1], atol=1e-6, rtol=0)
            # the fused forward is Ye et al.'s formula on these maps and the pretrained values / projection
            heads = []
            for j in range(2):
                value = torch.cat((ref_v[:, 2 * j], ref_v[:, 2 * j + 1]), dim=-1)
                out = (ref_maps[:, 2 * j] - lam * ref_maps[:, 2 * j + 1]) @ value
                out = out * torch.rsqrt(out.pow(2).mean(-1, keepdim=True) + 1e-5) * attn.sub_norm.weight
                heads.append(out * (1 - attn.lambda_init))
            expected = torch.cat(heads, dim=-1) @ ref_blk.attn.proj.weight.t() + ref_blk.attn.proj.bias
            torch.testing.assert_close(attn(x), expected, atol=1e-5, rtol=0)


@pytest.mark.parametrize("impl", IMPLS)
def test_preserving_mode_is_exact_at_init(impl):
    model = _tiny_vit()
    original = copy.deepcopy(model)
    convert_to_diff_attention(model, variant="preserving", attn_impl=impl)
    x = torch.randn(3, 3, 64, 64)
    with torch.no_grad():
        for blk in model.blocks:
            assert blk.attn.lambda_value().item() == 0.0
            assert not any(n.startswith("sub_norm") for n, _ in blk.attn.named_parameters())
        torch.testing.assert_close(model(x), original(x), atol=1e-5, rtol=0)
        # the paired variants do change the function: the check above can fail
        for variant in ("paper", "diff_transformer"):
            paired = copy.deepcopy(original)
            convert_to_diff_attention(paired, variant=variant, attn_impl=impl)
            assert (paired(x) - original(x)).abs().max() > 1e-2


@pytest.mark.parametrize("impl", IMPLS)
def test_preserving_mode_formula_when_lambda_moves(impl):
    attn = Attention(64, num_heads=4, qkv_bias=True).eval()
    diff = DifferentialAttention.from_attention(attn, variant="preserving", attn_impl=impl).eval()
    with torch.no_grad():
        diff.lambda_q1.add_(0.5)
        x = torch.randn(2, 9, 64)
        lam = diff.lambda_value()
        assert abs(lam.item()) > 1e-3
        maps, v = _reference_maps(attn, x)
        partner = maps.view(2, 2, 2, 9, 9).flip(2).reshape(2, 4, 9, 9)
        out = ((maps - lam * partner) @ v).transpose(1, 2).reshape(2, 9, 64)
        torch.testing.assert_close(diff(x), attn.proj(out), atol=1e-5, rtol=0)


@pytest.mark.parametrize("variant", ATTENTION_VARIANTS)
@pytest.mark.parametrize("impl", IMPLS)
def test_gradients_reach_lambda(variant, impl):
    model = _tiny_vit()
    convert_to_diff_attention(model, variant=variant, attn_impl=impl)
    model.train()
    out = model(torch.randn(2, 3, 64, 64))
    (out**2).mean().backward()
    for blk in model.blocks:
        for name in NEW_PARAMS:
            grad = getattr(blk.attn, name).grad
            assert grad is not None and torch.isfinite(grad).all() and grad.abs().sum() > 0, name


@pytest.mark.parametrize("variant", ATTENTION_VARIANTS)
@pytest.mark.parametrize("impl", IMPLS)
def test_bf16_autocast_cpu(variant, impl):
    model = _tiny_vit()
    convert_to_diff_attention(model, variant=variant, attn_impl=impl)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(torch.rand(2, 3, 64, 64))
    assert out.shape == (2, 64) and torch.isfinite(out.float()).all()


@pytest.mark.parametrize("variant", ATTENTION_VARIANTS)
def test_implementations_agree_with_mask_and_dropout_off(variant):
    attn = Attention(64, num_heads=4, qkv_bias=True).eval()
    a = DifferentialAttention.from_attention(attn, variant=variant, attn_impl="sdpa")
    b = copy.deepcopy(a)
    b.attn_impl = "explicit"
    with torch.no_grad():
        a.lambda_q1.add_(0.3)
        b.lambda_q1.copy_(a.lambda_q1)
        x = torch.randn(2, 11, 64)
        torch.testing.assert_close(a(x), b(x), atol=1e-5, rtol=0)
        torch.testing.assert_close(a(x, is_causal=True), b(x, is_causal=True), atol=1e-5, rtol=0)
        mask = torch.rand(11, 11) > 0.3
        mask.fill_diagonal_(True)
        torch.testing.assert_close(a(x, attn_mask=mask), b(x, attn_mask=mask), atol=1e-5, rtol=0)


def test_sub_norm_off_and_schedules():
    attn = Attention(64, num_heads=4, qkv_bias=True).eval()
    diff = DifferentialAttention.from_attention(attn, depth=2, sub_norm=False, lambda_init=0.5).eval()
    assert diff.lambda_init == 0.5 and diff.output_scale == 1.0
    assert not any(n.startswith("sub_norm") for n, _ in diff.named_parameters())
    with torch.no_grad():
        x = torch.randn(2, 5, 64)
        maps, v = _reference_maps(attn, x)
        lam = diff.lambda_value()
        heads = [
            (maps[:, 2 * j] - lam * maps[:, 2 * j + 1]) @ torch.cat((v[:, 2 * j], v[:, 2 * j + 1]), -1)
            for j in range(2)
        ]
        torch.testing.assert_close(diff(x), attn.proj(torch.cat(heads, -1)), atol=1e-5, rtol=0)

    assert resolve_lambda_init("depth", 0) == pytest.approx(0.2)
    assert (
        resolve_lambda_init("depth", 11)
        == pytest.approx(lambda_init_for_depth(11))
        == pytest.approx(0.8 - 0.6 * math.exp(-3.3))
    )
    assert resolve_lambda_init("constant", 7) == 0.8
    assert resolve_lambda_init(lambda d: 0.1 * d, 3) == pytest.approx(0.3)
    with pytest.raises(ValueError, match="unknown"):
        resolve_lambda_init("linear", 1)
    with pytest.raises(ValueError, match=r"\[0, 1\)"):
        resolve_lambda_init(1.2, 1)
    with pytest.raises(ValueError, match="variant"):
        DifferentialAttention(64, 2, variant="ye")


def test_lambda_vectors_initialisation():
    torch.manual_seed(0)
    diff = DifferentialAttention(768, num_heads=6, depth=4, variant="diff_transformer")
    vectors = torch.cat([getattr(diff, n).detach() for n in sorted(NEW_PARAMS)])
    assert vectors.shape == (4 * 64,)
    assert 0.08 < vectors.std().item() < 0.12  # N(0, 0.1)
    expected = math.exp((diff.lambda_q1 * diff.lambda_k1).sum().item()) - math.exp(
        (diff.lambda_q2 * diff.lambda_k2).sum().item()
    )
    assert diff.lambda_value().item() == pytest.approx(expected + lambda_init_for_depth(4), abs=1e-6)
    preserving = DifferentialAttention(768, num_heads=6, depth=4, variant="preserving")
    assert preserving.lambda_value().item() == 0.0 and preserving.lambda_q1.abs().sum() > 0
    assert torch.equal(preserving.lambda_q1, preserving.lambda_q2)
    assert F.mse_loss(diff.lambda_q1, diff.lambda_q2) > 0


def _counting_sdpa(monkeypatch) -> list[tuple[int, int, int]]:
    """Wrap ``F.scaled_dot_product_attention``; record the (q, k, v) head sizes of every call."""
    calls: list[tuple[int, int, int]] = []
    original = F.scaled_dot_product_attention

    def wrapper(q, k, v, *args, **kwargs):
        calls.append((q.shape[-1], k.shape[-1], v.shape[-1]))
        return original(q, k, v, *args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", wrapper)
    return calls


@pytest.mark.parametrize("variant", ATTENTION_VARIANTS)
def test_sdpa_path_calls_sdpa_and_matches_explicit_reference(variant, monkeypatch):
    model = _tiny_vit()
    convert_to_diff_attention(model, variant=variant)  # default attn_impl: SDPA on CPU too
    with torch.no_grad():
        for blk in model.blocks:
            blk.attn.lambda_q1.add_(0.4)  # lambda away from its initial value (0 in preserving mode)
            assert abs(blk.attn.lambda_value().item()) > 1e-3
    reference = copy.deepcopy(model)
    for blk in reference.blocks:
        blk.attn.attn_impl = "explicit"
    x = torch.rand(2, 3, 64, 64)
    calls = _counting_sdpa(monkeypatch)
    with torch.no_grad():
        out = model(x)
        assert len(calls) == len(model.blocks)  # one call per block
        # equal head sizes: the condition of PyTorch's fused CPU kernel (2 * head_dim = 32 for the tiny model's
        # paired heads; the authors' layout keeps the pretrained heads, head_dim 16)
        width = 16 if variant == "authors" else 32
        assert calls == [(width, width, width)] * len(model.blocks)
        expected = reference(x)
        assert len(calls) == len(model.blocks)  # the reference path makes no SDPA call
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=0)
    assert (out - _tiny_vit()(x)).abs().max() > 1e-3  # lambda moved: not the pretrained function


def test_sdpa_path_runs_the_fused_cpu_kernel():
    attn = DifferentialAttention.from_attention(Attention(64, num_heads=4, qkv_bias=True).eval())
    x = torch.randn(2, 9, 64)
    with torch.no_grad(), torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        attn(x)
    names = {event.key for event in prof.key_averages()}
    assert "aten::_scaled_dot_product_flash_attention_for_cpu" in names
    assert "aten::_scaled_dot_product_attention_math" not in names


def test_timm_fused_switch_off_uses_explicit_path(monkeypatch):
    attn = Attention(64, num_heads=4, qkv_bias=True).eval()
    auto = DifferentialAttention.from_attention(attn)
    auto.fused_attn = False  # as with TIMM_FUSED_ATTN=0
    forced = DifferentialAttention.from_attention(attn, attn_impl="sdpa")
    forced.fused_attn = False
    with torch.no_grad():
        forced.lambda_q1.copy_(auto.lambda_q1)
        forced.lambda_k1.copy_(auto.lambda_k1)
        forced.lambda_q2.copy_(auto.lambda_q2)
        forced.lambda_k2.copy_(auto.lambda_k2)
    calls = _counting_sdpa(monkeypatch)
    x = torch.randn(2, 7, 64)
    with torch.no_grad():
        a = auto(x)
        assert calls == []
        b = forced(x)
        assert len(calls) == 1
    torch.testing.assert_close(a, b, atol=1e-5, rtol=0)


@pytest.mark.parametrize("variant", ATTENTION_VARIANTS)
def test_per_head_masks_match_explicit_reference(variant):
    attn = Attention(64, num_heads=4, qkv_bias=True).eval()
    a = DifferentialAttention.from_attention(attn, variant=variant, attn_impl="sdpa")
    b = copy.deepcopy(a)
    b.attn_impl = "explicit"
    torch.manual_seed(3)
    x = torch.randn(2, 6, 64)
    bool_mask = torch.rand(2, 4, 6, 6) > 0.4  # one mask per single head
    bool_mask |= torch.eye(6, dtype=torch.bool)
    additive = torch.randn(1, 4, 6, 6)
    with torch.no_grad():
        for mask in (bool_mask, additive, additive[0, 0]):
            torch.testing.assert_close(a(x, attn_mask=mask), b(x, attn_mask=mask), atol=1e-5, rtol=0)
        with pytest.raises(ValueError, match="attn_mask"):
            a(x, attn_mask=torch.zeros(1, 3, 6, 6))


@pytest.mark.parametrize("impl", IMPLS)
def test_paper_variant_constant_lambda_init_without_sub_norm(impl):
    """The paper's variant: lambda_init 0.8 in every block, no sub-norm, output (A1 - lambda A2) V, lambda =
    exp(lq1 . lk1) - exp(lq2 . lk2) + 0.8."""
    model = _tiny_vit()
    original = copy.deepcopy(model)
    convert_to_diff_attention(model, variant="paper", attn_impl=impl)
    x = torch.randn(2, 13, 64)
    for blk, ref_blk in zip(model.blocks, original.blocks, strict=True):
        attn = blk.attn
        assert attn.variant == "paper" and attn.lambda_init == 0.8 and attn.output_scale == 1.0
        assert not attn.use_sub_norm and isinstance(attn.sub_norm, torch.nn.Identity)
        assert {n for n, _ in attn.named_parameters()} - {n for n, _ in ref_blk.attn.named_parameters()} == NEW_PARAMS
        with torch.no_grad():
            lam = math.exp((attn.lambda_q1 * attn.lambda_k1).sum().item()) - math.exp(
                (attn.lambda_q2 * attn.lambda_k2).sum().item()
            )
            assert attn.lambda_value().item() == pytest.approx(lam + 0.8, abs=1e-6)
            maps, v = _reference_maps(ref_blk.attn, x)
            heads = [
                (maps[:, 2 * j] - (lam + 0.8) * maps[:, 2 * j + 1]) @ torch.cat((v[:, 2 * j], v[:, 2 * j + 1]), -1)
                for j in range(2)
            ]
            torch.testing.assert_close(attn(x), ref_blk.attn.proj(torch.cat(heads, -1)), atol=1e-5, rtol=0)
    # Ye et al.'s variant (the default): depth schedule and sub-norm
    ye = _tiny_vit()
    convert_to_diff_attention(ye)
    assert [b.attn.lambda_init for b in ye.blocks] == pytest.approx([0.2, lambda_init_for_depth(1)])
    assert all(b.attn.use_sub_norm for b in ye.blocks)


def test_the_default_variant_is_diff_transformer():
    torch.manual_seed(0)
    a = _tiny_vit()
    torch.manual_seed(5)
    convert_to_diff_attention(a)
    b = _tiny_vit()
    torch.manual_seed(5)
    convert_to_diff_attention(b, variant="diff_transformer")
    x = torch.rand(2, 3, 64, 64)
    with torch.no_grad():
        torch.testing.assert_close(a(x), b(x), atol=0, rtol=0)
    assert all(blk.attn.variant == "diff_transformer" for blk in a.blocks)
    assert DifferentialAttention(64, 2).variant == "diff_transformer"
    assert DifferentialAttention(64, 2, variant="preserving").variant == "preserving"


@pytest.mark.parametrize("variant", ATTENTION_VARIANTS)
@pytest.mark.parametrize("impl", IMPLS)
def test_float64(variant, impl):
    """Double precision runs (the sub-norm reduces in float64) and agrees with the float32 module."""
    attn = DifferentialAttention.from_attention(Attention(64, num_heads=4, qkv_bias=True).eval(), variant=variant)
    attn.attn_impl = impl
    with torch.no_grad():
        attn.lambda_q1.add_(0.2)
        x = torch.randn(2, 7, 64)
        out32 = attn(x)
        attn64 = copy.deepcopy(attn).double()
        out64 = attn64(x.double())
    assert out64.dtype == torch.float64
    torch.testing.assert_close(out64.float(), out32, atol=1e-5, rtol=0)
    x64 = x.double().requires_grad_(True)
    attn64(x64).square().sum().backward()
    assert x64.grad.dtype == torch.float64 and torch.isfinite(x64.grad).all()
