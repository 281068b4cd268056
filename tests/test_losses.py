"""Exact tests of AsymmetricFocalLoss against a direct float64 evaluation of the formula."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from monai_vce.losses import AsymmetricFocalLoss


def reference_asl(x, y, gamma_pos, gamma_neg, clip, eps, weight=None, detach=True):
    """The formula written out directly in float64 (sigmoid, max, pow, log).

    ``1 - p`` is evaluated as ``1 / (1 + exp(x))`` (the same number) so that float64 does not round it to 0
    at |x| = 100, where the formula itself is finite.
    """
    x = x.double()
    y = y.double() * (1 - eps) + eps / 2
    p = 1.0 / (1.0 + torch.exp(-x))
    q = 1.0 / (1.0 + torch.exp(x))  # 1 - p
    p_m = torch.clamp(p - clip, min=0.0)
    one_minus_pm = torch.where(p_m > 0, q + clip, torch.ones_like(q))
    qd, pmd = (q.detach(), p_m.detach()) if detach else (q, p_m)
    pos = y * qd**gamma_pos * torch.log(p)
    neg = (1 - y) * pmd**gamma_neg * torch.log(one_minus_pm)
    loss = -(pos + neg)
    if weight is not None:
        loss = loss * torch.as_tensor(weight, dtype=torch.float64)[None, :]
    return loss


def _data(seed=0, b=6, c=17, scale=4.0, soft=False):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(b, c, generator=g, dtype=torch.float64) * scale
    y = torch.rand(b, c, generator=g, dtype=torch.float64) if soft else (torch.rand(b, c, generator=g) < 0.3).double()
    return x, y


@pytest.mark.parametrize("detach", [True, False])
@pytest.mark.parametrize(
    "gp,gn,clip,eps", [(1.0, 4.0, 0.05, 0.05), (2.0, 3.0, 0.2, 0.0), (0.0, 4.0, 0.0, 0.1), (1.0, 0.0, 0.1, 0.05)]
)
@pytest.mark.parametrize("soft", [False, True])
def test_matches_float64_formula_values_and_gradients(detach, gp, gn, clip, eps, soft):
    x, y = _data(seed=int(gp * 10 + gn), soft=soft)
    x1 = x.clone().requires_grad_(True)
    x2 = x.clone().requires_grad_(True)
    ours = AsymmetricFocalLoss(gp, gn, clip, eps, detach_focusing=detach, reduction="none")(x1, y)
    ref = reference_asl(x2, y, gp, gn, clip, eps, detach=detach)
    assert ours.shape == (6, 17) and ours.dtype == torch.float64
    torch.testing.assert_close(ours, ref, rtol=1e-10, atol=1e-12)
    g = torch.randn(6, 17, dtype=torch.float64)
    (ours * g).sum().backward()
    (ref * g).sum().backward()
    torch.testing.assert_close(x1.grad, x2.grad, rtol=1e-9, atol=1e-12)


def test_float32_input_matches_reference():
    x, y = _data(seed=3)
    ours = AsymmetricFocalLoss(reduction="none")(x.float(), y.float())
    assert ours.dtype == torch.float32
    torch.testing.assert_close(ours.double(), reference_asl(x, y, 1.0, 4.0, 0.05, 0.05), rtol=1e-5, atol=1e-6)


def test_detach_changes_gradient_only():
    x, y = _data(seed=5)
    xa, xb = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    la = AsymmetricFocalLoss(detach_focusing=True)(xa, y)
    lb = AsymmetricFocalLoss(detach_focusing=False)(xb, y)
    torch.testing.assert_close(la, lb)
    la.backward()
    lb.backward()
    assert not torch.allclose(xa.grad, xb.grad)


@pytest.mark.parametrize("soft", [False, True])
@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-12), (torch.float32, 1e-6)])
def test_limits_give_bce_with_logits_exactly(soft, dtype, tol):
    x, y = _data(seed=7, soft=soft)
    x, y = x.to(dtype), y.to(dtype)
    for reduction in ("mean", "sum", "none"):
        ours = AsymmetricFocalLoss(gamma_pos=0, gamma_neg=0, clip=0, label_smoothing=0, reduction=reduction)(x, y)
        bce = F.binary_cross_entropy_with_logits(x, y, reduction=reduction)
        torch.testing.assert_close(ours, bce, rtol=tol, atol=tol)
    xa, xb = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    AsymmetricFocalLoss(0, 0, 0, 0)(xa, y).backward()
    F.binary_cross_entropy_with_logits(xb, y).backward()
    torch.testing.assert_close(xa.grad, xb.grad, rtol=tol, atol=tol)


def test_label_smoothing_formula():
    x, y = _data(seed=9)
    eps = 0.2
    smoothed = y * (1 - eps) + eps / 2
    a = AsymmetricFocalLoss(0, 0, 0, eps, reduction="none")(x, y)
    b = F.binary_cross_entropy_with_logits(x, smoothed, reduction="none")
    torch.testing.assert_close(a, b)


def test_reductions_and_class_weights():
    x, y = _data(seed=11)
    w = torch.linspace(0.0, 2.0, 17, dtype=torch.float64)
    elem = AsymmetricFocalLoss(weight=w, reduction="none")(x, y)
    ref = reference_asl(x, y, 1.0, 4.0, 0.05, 0.05, weight=w)
    torch.testing.assert_close(elem, ref)
    assert elem.shape == (6, 17)
    torch.testing.assert_close(AsymmetricFocalLoss(weight=w, reduction="sum")(x, y), ref.sum())
    # mean is over all B x C elements, not a sum over classes averaged over the batch
    torch.testing.assert_close(AsymmetricFocalLoss(weight=w, reduction="mean")(x, y), ref.sum() / ref.numel())
    assert torch.all(elem[:, 0] == 0)  # weight 0 switches a class off
    with pytest.raises(ValueError, match="weight has 17 values"):
        AsymmetricFocalLoss(weight=w)(x[:, :5], y[:, :5])
    with pytest.raises(ValueError, match="same shape"):
        AsymmetricFocalLoss()(x, y[:, :5])
    with pytest.raises(ValueError):
        AsymmetricFocalLoss(reduction="batchmean")


def test_higher_dims_none_keeps_shape():
    x = torch.randn(2, 3, 4, 5)
    y = (torch.rand(2, 3, 4, 5) > 0.5).float()
    out = AsymmetricFocalLoss(weight=[1.0, 2.0, 3.0], reduction="none")(x, y)
    assert out.shape == x.shape


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("detach", [True, False])
@pytest.mark.parametrize("clip", [0.0, 0.05])
def test_extreme_logits_low_precision_finite(dtype, detach, clip):
    x = torch.tensor([[-100.0, 100.0, -100.0, 100.0, 0.0, 60000.0, -60000.0]], dtype=dtype, requires_grad=True)
    y = torch.tensor([[1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 1.0]])
    loss = AsymmetricFocalLoss(clip=clip, detach_focusing=detach, reduction="none")
    out = loss(x, y)
    assert out.dtype == torch.float32
    assert torch.isfinite(out).all()
    out.sum().backward()
    assert torch.isfinite(x.grad.float()).all()
    # a confident wrong positive costs |x| * (1 - eps/2) (+ the smoothed negative part, about 0 here)
    assert out[0, 0].item() == pytest.approx(100.0 * 0.975, rel=1e-3)
    # against the float64 formula evaluated at the same (rounded) logits
    ref = reference_asl(x.detach().double()[:, :5], y.double()[:, :5], 1.0, 4.0, clip, 0.05)
    torch.testing.assert_close(out[:, :5].double(), ref, rtol=1e-4, atol=1e-5)


def test_invalid_arguments():
    with pytest.raises(ValueError):
        AsymmetricFocalLoss(gamma_neg=-1)
    with pytest.raises(ValueError):
        AsymmetricFocalLoss(clip=1.0)
    with pytest.raises(ValueError):
        AsymmetricFocalLoss(weight=[-1.0, 1.0])
