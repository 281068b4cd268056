"""VCEAsymmetricFocalLoss and BinaryCrossEntropyLoss: a float64 reference, timm's ASL, calibration, positive weights."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from monai_vce.losses import BinaryCrossEntropyLoss, VCEAsymmetricFocalLoss, class_positive_weights


def reference_asl(x, y, gamma_pos, gamma_neg, clip, eps, pos_weight=None, weight=None, detach=True):
    """The formula written out directly in float64 (sigmoid, max, pow, log), independent of the module's code.

    ``1 - p`` is evaluated as ``1 / (1 + exp(x))`` (the same number) so that float64 does not round it to 0
    at |x| = 100, where the formula itself is finite.
    """
    x = x.double()
    y = y.double()
    t = y * (1 - 2 * eps) + eps
    p = 1.0 / (1.0 + torch.exp(-x))
    q = 1.0 / (1.0 + torch.exp(x))  # 1 - p
    p_m = torch.clamp(p - clip, min=0.0)
    one_minus_pm = torch.where(p_m > 0, q + clip, torch.ones_like(q))
    pd, omd = (p.detach(), one_minus_pm.detach()) if detach else (p, one_minus_pm)
    p_t = t * pd + (1 - t) * omd
    gamma = t * gamma_pos + (1 - t) * gamma_neg
    focus = (1 - p_t).clamp(min=0) ** gamma
    loss = -focus * (t * torch.log(p) + (1 - t) * torch.log(one_minus_pm))
    if pos_weight is not None:
        loss = loss * (1 + (torch.as_tensor(pos_weight, dtype=torch.float64)[None, :] - 1) * y)
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
    pw = torch.linspace(1.0, 100.0, 17, dtype=torch.float64)
    x1 = x.clone().requires_grad_(True)
    x2 = x.clone().requires_grad_(True)
    loss = VCEAsymmetricFocalLoss(gp, gn, clip, eps, pos_weight=pw, detach_focusing=detach, reduction="none")
    ours = loss(x1, y)
    ref = reference_asl(x2, y, gp, gn, clip, eps, pos_weight=pw, detach=detach)
    assert ours.shape == (6, 17) and ours.dtype == torch.float64
    torch.testing.assert_close(ours, ref, rtol=1e-10, atol=1e-12)
    g = torch.randn(6, 17, dtype=torch.float64)
    (ours * g).sum().backward()
    (ref * g).sum().backward()
    torch.testing.assert_close(x1.grad, x2.grad, rtol=1e-9, atol=1e-12)


def test_float32_input_matches_reference():
    x, y = _data(seed=3)
    ours = VCEAsymmetricFocalLoss(reduction="none")(x.float(), y.float())
    assert ours.dtype == torch.float32
    torch.testing.assert_close(ours.double(), reference_asl(x, y, 1.0, 4.0, 0.05, 0.05), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("soft", [False, True])
@pytest.mark.parametrize("detach", [True, False])
@pytest.mark.parametrize("clip", [0.0, 0.05])
def test_equals_timm_asl_where_the_formulas_coincide(soft, detach, clip):
    """timm's AsymmetricLossMultiLabel: same focusing; its smoothing moves targets to [eps/2, 1 - eps/2] and its
    pos_weight multiplies the (smoothed) positive term, so the two agree on 0/1 targets with positive weights and
    without smoothing, and on soft targets with timm's smoothing 2 eps against ours eps without positive weights."""
    timm_loss = pytest.importorskip("timm.loss")
    x, y = _data(seed=13, b=16, scale=3.0, soft=soft)
    x, y = x.float(), y.float()
    w = torch.linspace(0.5, 2.0, 17)
    if soft:
        ours = VCEAsymmetricFocalLoss(1.0, 4.0, clip, 0.05, weight=w, detach_focusing=detach, reduction="none")
        theirs = timm_loss.AsymmetricLossMultiLabel(
            gamma_neg=4, gamma_pos=1, clip=clip, disable_torch_grad_focal_loss=detach, smoothing=0.1,
            reduction="none", weight=w,
        )  # fmt: skip
    else:
        pw = torch.linspace(1.0, 100.0, 17)
        ours = VCEAsymmetricFocalLoss(1.0, 4.0, clip, 0.0, pos_weight=pw, weight=w, detach_focusing=detach)
        theirs = timm_loss.AsymmetricLossMultiLabel(
            gamma_neg=4, gamma_pos=1, clip=clip, disable_torch_grad_focal_loss=detach, reduction="mean",
            weight=w, pos_weight=pw,
        )  # fmt: skip
    xa, xb = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    a, b = ours(xa, y), theirs(xb, y)
    torch.testing.assert_close(a, b, rtol=2e-5, atol=1e-6)
    a.sum().backward()
    b.sum().backward()
    torch.testing.assert_close(xa.grad, xb.grad, rtol=2e-4, atol=1e-6)


def _settled_probability(loss: Callable, target: float = 0.0, steps: int = 600) -> torch.Tensor:
    """A free per-class bias trained with Adam on constant targets: where the loss puts a frame's p."""
    bias = torch.zeros(1, 17, requires_grad=True)
    opt = torch.optim.Adam([bias], lr=0.1, betas=(0.9, 0.99))
    y = torch.full((1, 17), target)
    for _ in range(steps):
        opt.zero_grad()
        loss(bias, y).backward()
        opt.step()
    return torch.sigmoid(bias.detach()[0])


@pytest.mark.parametrize("pos_weight", [None, 100.0])
def test_easy_negatives_settle_near_zero_with_smoothing(pos_weight):
    """One focusing weight per element: with smoothing 0.05 (and positive weights up to 100) a negative's
    probability settles near eps; focusing the smoothed terms separately settled near 0.43."""
    pw = None if pos_weight is None else [pos_weight] * 17
    p = _settled_probability(VCEAsymmetricFocalLoss(label_smoothing=0.05, pos_weight=pw))
    assert float(p.max()) < 0.1
    p_bce = _settled_probability(BinaryCrossEntropyLoss(label_smoothing=0.05, pos_weight=pw), steps=300)
    torch.testing.assert_close(p_bce, torch.full((17,), 0.05), atol=5e-3, rtol=0)


def test_positive_weight_on_the_smoothed_term_would_miscalibrate():
    """The alternative the loss avoids: torch's pos_weight applied to smoothed targets moves negatives to 0.84."""
    torch_bce = torch.nn.BCEWithLogitsLoss(pos_weight=torch.full((17,), 100.0))
    p = _settled_probability(lambda x, y: torch_bce(x, y * 0.9 + 0.05), steps=300)
    assert float(p.min()) > 0.8


@pytest.mark.parametrize("soft", [False, True])
@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-12), (torch.float32, 1e-6)])
def test_limits_give_bce_with_logits_exactly(soft, dtype, tol):
    x, y = _data(seed=7, soft=soft)
    x, y = x.to(dtype), y.to(dtype)
    for reduction in ("mean", "sum", "none"):
        ours = VCEAsymmetricFocalLoss(gamma_pos=0, gamma_neg=0, clip=0, label_smoothing=0, reduction=reduction)(x, y)
        bce = F.binary_cross_entropy_with_logits(x, y, reduction=reduction)
        torch.testing.assert_close(ours, bce, rtol=tol, atol=tol)
        torch.testing.assert_close(BinaryCrossEntropyLoss(0.0, reduction=reduction)(x, y), bce, rtol=tol, atol=tol)
    xa, xb = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    VCEAsymmetricFocalLoss(0, 0, 0, 0)(xa, y).backward()
    F.binary_cross_entropy_with_logits(xb, y).backward()
    torch.testing.assert_close(xa.grad, xb.grad, rtol=tol, atol=tol)


def test_bce_positive_weights_equal_torch_on_hard_targets():
    x, y = _data(seed=8)
    pw = torch.linspace(1.0, 50.0, 17, dtype=torch.float64)
    ours = BinaryCrossEntropyLoss(label_smoothing=0.0, pos_weight=pw, reduction="none")(x, y)
    torch.testing.assert_close(ours, F.binary_cross_entropy_with_logits(x, y, pos_weight=pw, reduction="none"))


def test_label_smoothing_maps_targets_to_eps_one_minus_eps():
    x, y = _data(seed=9)
    eps = 0.2
    a = VCEAsymmetricFocalLoss(0, 0, 0, eps, reduction="none")(x, y)
    b = F.binary_cross_entropy_with_logits(x, y * (1 - 2 * eps) + eps, reduction="none")
    torch.testing.assert_close(a, b)
    # 0 -> eps and 1 -> 1 - eps: the BCE minimum of each is at p = t
    t = torch.tensor([[0.0, 1.0]], dtype=torch.float64)
    logit = torch.logit(torch.tensor([[eps, 1 - eps]], dtype=torch.float64)).requires_grad_(True)
    BinaryCrossEntropyLoss(eps, reduction="sum")(logit, t).backward()
    torch.testing.assert_close(logit.grad, torch.zeros_like(logit), atol=1e-12, rtol=0)


def test_reductions_and_class_weights():
    x, y = _data(seed=11)
    w = torch.linspace(0.0, 2.0, 17, dtype=torch.float64)
    elem = VCEAsymmetricFocalLoss(weight=w, reduction="none")(x, y)
    ref = reference_asl(x, y, 1.0, 4.0, 0.05, 0.05, weight=w)
    torch.testing.assert_close(elem, ref)
    assert elem.shape == (6, 17)
    torch.testing.assert_close(VCEAsymmetricFocalLoss(weight=w, reduction="sum")(x, y), ref.sum())
    # mean is over all B x C elements, not a sum over classes averaged over the batch
    torch.testing.assert_close(VCEAsymmetricFocalLoss(weight=w, reduction="mean")(x, y), ref.sum() / ref.numel())
    assert torch.all(elem[:, 0] == 0)  # weight 0 switches a class off
    with pytest.raises(ValueError, match="weight has 17 values"):
        VCEAsymmetricFocalLoss(weight=w)(x[:, :5], y[:, :5])
    with pytest.raises(ValueError, match="pos_weight has 17 values"):
        VCEAsymmetricFocalLoss(pos_weight=w + 1)(x[:, :5], y[:, :5])
    with pytest.raises(ValueError, match="same shape"):
        VCEAsymmetricFocalLoss()(x, y[:, :5])
    with pytest.raises(ValueError):
        VCEAsymmetricFocalLoss(reduction="batchmean")


def test_positive_weights_scale_positive_elements_only():
    x, y = _data(seed=12)
    pw = torch.full((17,), 7.0, dtype=torch.float64)
    plain = VCEAsymmetricFocalLoss(reduction="none")(x, y)
    weighted = VCEAsymmetricFocalLoss(pos_weight=pw, reduction="none")(x, y)
    torch.testing.assert_close(weighted[y == 1], 7.0 * plain[y == 1])
    torch.testing.assert_close(weighted[y == 0], plain[y == 0])
    # a soft (mixup) target interpolates the weight
    soft = torch.full((1, 17), 0.25, dtype=torch.float64)
    ratio = VCEAsymmetricFocalLoss(pos_weight=pw, reduction="none")(x[:1], soft) / VCEAsymmetricFocalLoss(
        reduction="none"
    )(x[:1], soft)
    torch.testing.assert_close(ratio, torch.full_like(ratio, 1 + 6 * 0.25))


def test_class_positive_weights_from_a_datalist():
    labels = np.zeros((200, 17), dtype=np.float32)
    labels[:100, 0] = 1  # 100 / 100 -> 1
    labels[:10, 1] = 1  # 190 / 10 -> 19
    labels[:1, 2] = 1  # 199 / 1 -> clipped to 100
    labels[:, 3] = 1  # 0 / 200 -> clipped up to 1
    # class 4..16: no positive -> max_weight
    data = [
        {"image": f"f{i}.png", "label": row.tolist(), "video_id": "v", "frame_index": i} for i, row in enumerate(labels)
    ]
    w = class_positive_weights(data)
    assert w.dtype == torch.float32 and w.shape == (17,)
    assert w[:5].tolist() == [1.0, 19.0, 100.0, 1.0, 100.0]
    torch.testing.assert_close(class_positive_weights(labels, max_weight=50.0)[1:3], torch.tensor([19.0, 50.0]))
    with pytest.raises(ValueError, match="no 'label'"):
        class_positive_weights([{"image": "x", "video_id": "v7", "frame_index": 3}])
    with pytest.raises(ValueError, match="min_weight"):
        class_positive_weights(labels, min_weight=10.0, max_weight=5.0)


def test_class_positive_weights_pseudo_count_matches_authors_formula():
    rng = np.random.default_rng(5)
    labels = (rng.random((40, 6)) < np.array([0.5, 0.2, 0.05, 0.0, 1.0, 0.1])).astype(np.float32)

    def compute_class_weights(y):  # the authors' compute_class_weights, transcribed
        pos = y.sum(axis=0) + 1
        neg = y.shape[0] - pos + 1
        return neg / pos

    expected = np.clip(compute_class_weights(labels), 1.0, 100.0)
    w = class_positive_weights(labels, positive_pseudo_count=1.0)
    torch.testing.assert_close(w, torch.as_tensor(expected, dtype=torch.float32))
    assert w[3].item() == 40.0  # no positive: 40 / (0 + 1), finite with the pseudo count
    # a fractional pseudo count, unclipped, and the default (0) unchanged: a class without positives gets max_weight
    n_pos = labels.sum(axis=0)
    w_half = class_positive_weights(labels, min_weight=1e-6, max_weight=1e6, positive_pseudo_count=0.5)
    torch.testing.assert_close(w_half, torch.as_tensor((40 - n_pos) / (n_pos + 0.5), dtype=torch.float32))
    assert class_positive_weights(labels, max_weight=30.0)[3].item() == 30.0
    for bad in (-0.5, float("nan")):
        with pytest.raises(ValueError, match="positive_pseudo_count"):
            class_positive_weights(labels, positive_pseudo_count=bad)


def authors_asl(logits, targets, gp, gn, clip, ls, pw):
    """The authors' ASL with positive weights, transcribed as they wrote it (smoothing, clamps and all)."""
    if ls > 0:
        targets = targets * (1 - ls) + (1 - targets) * ls
    probs = torch.sigmoid(logits).clamp(1e-6, 1 - 1e-6)
    xs_pos = probs
    xs_neg = (1 - probs).clamp(1e-6)
    if clip > 0:
        xs_neg = (xs_neg + clip).clamp(max=1)
    loss = targets * torch.log(xs_pos) + (1 - targets) * torch.log(xs_neg)
    pt = xs_pos * targets + xs_neg * (1 - targets)
    gamma = gp * targets + gn * (1 - targets)
    loss *= torch.pow(1 - pt, gamma)
    loss = loss * (targets * pw + (1 - targets))
    return -loss.mean()


@pytest.mark.parametrize("soft", [False, True])
@pytest.mark.parametrize("gp,gn,clip,ls", [(1.0, 4.0, 0.05, 0.05), (0.0, 2.0, 0.0, 0.1), (2.0, 0.0, 0.2, 0.0)])
def test_smoothed_pos_weight_mode_matches_authors_asl(soft, gp, gn, clip, ls):
    x, y = _data(seed=21, b=32, scale=3.0, soft=soft)  # moderate logits: the authors' 1e-6 clamps stay inactive
    pw = torch.linspace(1.0, 60.0, 17, dtype=torch.float64)
    ours = VCEAsymmetricFocalLoss(gp, gn, clip, ls, pos_weight=pw, pos_weight_mode="smoothed")(x, y)
    torch.testing.assert_close(ours, authors_asl(x, y, gp, gn, clip, ls, pw[None, :]), rtol=1e-5, atol=1e-6)
    ours32 = VCEAsymmetricFocalLoss(gp, gn, clip, ls, pos_weight=pw, pos_weight_mode="smoothed")(x.float(), y.float())
    ref32 = authors_asl(x.float(), y.float(), gp, gn, clip, ls, pw.float()[None, :])
    torch.testing.assert_close(ours32, ref32, rtol=1e-5, atol=1e-6)
    if ls > 0:  # with smoothing the modes differ on negatives (t = eps there)
        target_mode = VCEAsymmetricFocalLoss(gp, gn, clip, ls, pos_weight=pw)(x, y)
        assert not torch.allclose(ours, target_mode, rtol=1e-3)


@pytest.mark.parametrize("soft", [False, True])
@pytest.mark.parametrize("eps", [0.0, 0.1])
def test_positive_term_pos_weight_mode_equals_torch_bce(soft, eps):
    x, y = _data(seed=22, soft=soft)
    pw = torch.linspace(0.5, 50.0, 17, dtype=torch.float64)
    t = y * (1 - 2 * eps) + eps
    for dtype in (torch.float64, torch.float32):
        xd, yd, td, pwd = x.to(dtype), y.to(dtype), t.to(dtype), pw.to(dtype)
        for loss in (
            VCEAsymmetricFocalLoss(0, 0, 0, eps, pos_weight=pw, pos_weight_mode="positive_term", reduction="none"),
            BinaryCrossEntropyLoss(eps, pos_weight=pw, pos_weight_mode="positive_term", reduction="none"),
        ):
            ref = F.binary_cross_entropy_with_logits(xd, td, pos_weight=pwd, reduction="none")
            torch.testing.assert_close(loss(xd, yd), ref)
    # with focusing the weight still multiplies the positive log term only, before the focusing factor
    gp, gn, clip = 1.0, 4.0, 0.05
    weighted = VCEAsymmetricFocalLoss(
        gp, gn, clip, eps, pos_weight=pw, pos_weight_mode="positive_term", reduction="none"
    )
    p = torch.sigmoid(x)
    p_m = (p - clip).clamp(min=0)
    focus = (t * (1 - p) + (1 - t) * p_m) ** (t * gp + (1 - t) * gn)
    ref = -focus * (pw * t * torch.log(p) + (1 - t) * torch.log(torch.clamp(1 - p + clip, max=1)))
    torch.testing.assert_close(weighted(x, y), ref)


def test_invalid_pos_weight_mode():
    for cls in (VCEAsymmetricFocalLoss, BinaryCrossEntropyLoss):
        with pytest.raises(ValueError, match="pos_weight_mode must be one of"):
            cls(pos_weight_mode="positive")


def test_positive_weights_built_by_config_parser():
    from monai.bundle import ConfigParser

    labels = [[1.0] + [0.0] * 16, [0.0] * 17, [0.0] * 17, [0.0] * 17]
    parser = ConfigParser(
        {
            "data": [{"label": row} for row in labels],
            "pos_weight": {"_target_": "monai_vce.losses.class_positive_weights", "data": "@data", "max_weight": 10},
            "loss": {"_target_": "monai_vce.losses.VCEAsymmetricFocalLoss", "pos_weight": "@pos_weight"},
        }
    )
    loss = parser.get_parsed_content("loss")
    assert loss.pos_weight[0].item() == 3.0 and loss.pos_weight[1].item() == 10.0


def test_higher_dims_none_keeps_shape():
    x = torch.randn(2, 3, 4, 5)
    y = (torch.rand(2, 3, 4, 5) > 0.5).float()
    out = VCEAsymmetricFocalLoss(weight=[1.0, 2.0, 3.0], pos_weight=[2.0, 2.0, 2.0], reduction="none")(x, y)
    assert out.shape == x.shape


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("detach", [True, False])
@pytest.mark.parametrize("clip", [0.0, 0.05])
def test_extreme_logits_low_precision_finite(dtype, detach, clip):
    x = torch.tensor([[-100.0, 100.0, -100.0, 100.0, 0.0, 60000.0, -60000.0]], dtype=dtype, requires_grad=True)
    y = torch.tensor([[1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 1.0]])
    loss = VCEAsymmetricFocalLoss(clip=clip, detach_focusing=detach, reduction="none")
    out = loss(x, y)
    assert out.dtype == torch.float32
    assert torch.isfinite(out).all()
    out.sum().backward()
    assert torch.isfinite(x.grad.float()).all()
    # a confident wrong positive costs |x| (1 - eps) times its focusing weight (1 - eps)^(gamma at t = 1 - eps)
    assert out[0, 0].item() == pytest.approx(100.0 * 0.95 * 0.95 ** (0.95 + 0.05 * 4.0), rel=1e-3)
    # against the float64 formula evaluated at the same (rounded) logits
    ref = reference_asl(x.detach().double()[:, :5], y.double()[:, :5], 1.0, 4.0, clip, 0.05)
    torch.testing.assert_close(out[:, :5].double(), ref, rtol=1e-4, atol=1e-5)


def test_invalid_arguments():
    with pytest.raises(ValueError):
        VCEAsymmetricFocalLoss(gamma_neg=-1)
    with pytest.raises(ValueError):
        VCEAsymmetricFocalLoss(clip=1.0)
    with pytest.raises(ValueError, match="label_smoothing"):
        VCEAsymmetricFocalLoss(label_smoothing=0.5)
    with pytest.raises(ValueError):
        VCEAsymmetricFocalLoss(weight=[-1.0, 1.0])
    with pytest.raises(ValueError, match="pos_weight"):
        VCEAsymmetricFocalLoss(pos_weight=[float("nan"), 1.0])
