"""Tests of VCETrainer (mixup, dual-path loss, finite-loss guard, clipping, AMP), MultiLabelMixUp and EMAWeights."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from ignite.engine import Events
from monai.data import DataLoader, Dataset
from monai.engines import SupervisedTrainer
from monai.utils import set_determinism

from monai_vce.data import SqrtFrequencySampler
from monai_vce.engines import MultiLabelMixUp, VCETrainer
from monai_vce.handlers import EMAWeights
from monai_vce.losses import BinaryCrossEntropyLoss, VCEAsymmetricFocalLoss

C = 5


class TinyNet(torch.nn.Module):
    """A small conv net with an optional second ("contrastive") head, like DiffAttnCLIPClassifier's contract."""

    def __init__(self, paths: bool = True):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.head = torch.nn.Linear(8 * 8 * 8, C)
        self.con = torch.nn.Linear(8 * 8 * 8, C)
        self.paths = paths
        self.path_calls = 0

    def features(self, x):
        return torch.relu(self.conv(x)).flatten(1)

    def forward(self, x):
        return self.head(self.features(x))

    def forward_paths(self, x):
        self.path_calls += 1
        f = self.features(x)
        return self.head(f), (self.con(f) if self.paths else None)


def _datalist(n=32, seed=0):
    rng = np.random.default_rng(seed)
    items = []
    for i in range(n):
        label = (rng.random(C) < 0.3).astype(np.float32)
        img = rng.integers(0, 256, size=(3, 8, 8), dtype=np.uint8)
        img[0, :C] = (label[:, None] * 255).astype(np.uint8)  # row c of the red channel shows class c
        items.append(
            {"image": torch.from_numpy(img), "label": torch.from_numpy(label), "video_id": "v", "frame_index": i}
        )
    return items


def _trainer(net, loader, max_epochs=1, lr=0.05, **kw):
    opt = torch.optim.SGD(net.parameters(), lr=lr)
    return VCETrainer(
        device=torch.device("cpu"),
        max_epochs=max_epochs,
        train_data_loader=loader,
        network=net,
        optimizer=opt,
        loss_function=kw.pop("loss_function", VCEAsymmetricFocalLoss()),
        decollate=kw.pop("decollate", False),
        **kw,
    )


def _loader(items, batch_size=8, shuffle=False, sampler=None):
    return DataLoader(Dataset(items), batch_size=batch_size, shuffle=shuffle, sampler=sampler, num_workers=0)


def test_is_a_supervised_trainer_and_loss_decreases():
    set_determinism(0)
    net = TinyNet()
    items = _datalist()
    x = torch.stack([i["image"] for i in items]).float() / 255
    y = torch.stack([i["label"] for i in items])
    loss_fn = VCEAsymmetricFocalLoss(label_smoothing=0.0)  # no smoothing: a perfect fit has a loss near 0
    with torch.no_grad():
        before = float(loss_fn(net(x), y))
    # default mixup (Beta(0.3, 0.3)) and the dual path
    trainer = _trainer(net, _loader(items), max_epochs=8, lr=1.0, loss_function=loss_fn)
    assert isinstance(trainer, SupervisedTrainer)
    losses = []
    trainer.add_event_handler(Events.ITERATION_COMPLETED, lambda e: losses.append(float(e.state.output["loss"])))
    trainer.run()
    with torch.no_grad():
        after = float(loss_fn(net(x), y))
    assert len(losses) == 8 * 4
    assert after < 0.4 * before, (before, after)
    assert np.mean(losses[-4:]) < np.mean(losses[:4])
    assert net.path_calls == 8 * 4  # the dual path ran
    set_determinism(None)


def test_mixup_mixes_images_and_targets_exactly():
    set_determinism(1)
    items = _datalist(16)
    trainer = _trainer(TinyNet(), _loader(items), mixup_alpha=0.3, lr=0.0).set_random_state(3)
    seen = []

    def grab(engine):
        batch = engine.state.batch
        out = engine.state.output
        seen.append((batch["image"].float() / 255, batch["label"], {k: v.detach().clone() for k, v in out.items()}))

    trainer.add_event_handler(Events.ITERATION_COMPLETED, grab)
    trainer.run()
    assert len(seen) == 2
    for x, y, out in seen:
        lam, idx = out["mixup_lambda"], out["mixup_index"]
        assert lam.shape == (8,) and sorted(idx.tolist()) == list(range(8))
        assert torch.all((lam >= 0) & (lam <= 1))
        torch.testing.assert_close(out["label"], lam[:, None] * y + (1 - lam[:, None]) * y[idx])
        torch.testing.assert_close(out["image"], lam[:, None, None, None] * x + (1 - lam[:, None, None, None]) * x[idx])
        assert not torch.equal(out["label"], y)  # soft targets now
    # Beta(0.3, 0.3) is U-shaped: most weights near 0 or 1
    lam_all = torch.cat([o["mixup_lambda"] for _, _, o in seen])
    assert ((lam_all < 0.2) | (lam_all > 0.8)).float().mean() > 0.4
    set_determinism(None)


def test_mixup_per_batch_lambda_is_shared_and_at_least_half():
    set_determinism(1)
    items = _datalist(16)
    trainer = _trainer(TinyNet(), _loader(items), mixup_alpha=0.3, mixup_per_batch=True, lr=0.0).set_random_state(3)
    assert trainer.mixup.per_batch
    seen = []
    trainer.add_event_handler(
        Events.ITERATION_COMPLETED,
        lambda e: seen.append((e.state.batch["image"].float() / 255, e.state.batch["label"], dict(e.state.output))),
    )
    trainer.run()
    assert len(seen) == 2
    for x, y, out in seen:
        lam, idx = out["mixup_lambda"], out["mixup_index"]
        assert lam.shape == (8,) and torch.all(lam == lam[0]) and 0.5 <= float(lam[0]) <= 1.0
        w = float(lam[0])  # the authors' form: lam * x + (1 - lam) * x[perm] with one scalar lam
        torch.testing.assert_close(out["label"], w * y + (1 - w) * y[idx])
        torch.testing.assert_close(out["image"].detach(), w * x + (1 - w) * x[idx])
    set_determinism(None)

    # the draws are max(Beta(a, a), 1 - Beta(a, a)): over many batches, >= 0.5 and spread like the folded Beta
    m = MultiLabelMixUp(alpha=0.3, per_batch=True).set_random_state(0)
    x, y = torch.rand(4, 3), torch.rand(4, C)
    lams = []
    for _ in range(2000):
        _, _, lam, _ = m(x, y)
        assert torch.all(lam == lam[0])
        lams.append(float(lam[0]))
    ref = np.random.default_rng(0).beta(0.3, 0.3, size=200_000)
    ref = np.maximum(ref, 1 - ref)
    assert min(lams) >= 0.5
    assert abs(np.mean(lams) - ref.mean()) < 0.015
    assert abs(np.mean(np.array(lams) > 0.9) - np.mean(ref > 0.9)) < 0.04


def test_mixup_off_and_prob():
    x, y = torch.rand(6, 3, 4, 4), torch.rand(6, C)
    for m in (MultiLabelMixUp(alpha=0.0), MultiLabelMixUp(alpha=0.3, prob=0.0)):
        xo, yo, lam, idx = m(x, y)
        assert xo is x and yo is y and lam is None and idx is None
    m = MultiLabelMixUp(alpha=0.3, prob=0.5)
    m.set_random_state(0)
    mixed = sum(m(x, y)[2] is not None for _ in range(400))
    assert 160 < mixed < 240
    # any batch size, any image rank
    xo, yo, lam, idx = MultiLabelMixUp(alpha=1.0).set_random_state(0)(torch.rand(3, 7), torch.rand(3, C))
    assert xo.shape == (3, 7) and yo.shape == (3, C)
    with pytest.raises(ValueError, match="as many targets"):
        MultiLabelMixUp()(torch.rand(3, 2), torch.rand(4, C))


def test_dual_path_loss_is_sum_with_weight():
    items = _datalist(8)
    for w in (0.0, 0.5):
        net = TinyNet()
        trainer = _trainer(net, _loader(items), mixup_alpha=0.0, lr=0.0, contrastive_weight=w)
        trainer.run()
        out = trainer.state.output
        loss_fn = VCEAsymmetricFocalLoss()
        with torch.no_grad():
            cls, con = net.forward_paths(out["image"])
            expected = loss_fn(cls, out["label"]) + (w * loss_fn(con, out["label"]) if w else 0.0)
        torch.testing.assert_close(out["loss"].detach(), expected)
        torch.testing.assert_close(out["pred"], cls)
        torch.testing.assert_close(out["loss_cls"], loss_fn(cls, out["label"]))
        if w == 0:
            assert net.path_calls == 1  # only the check above: training used forward()
    # a network without forward_paths, and a contrastive head that returns None
    for net in (torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 8 * 8, C)), TinyNet(paths=False)):
        trainer = _trainer(net, _loader(items), mixup_alpha=0.0)
        trainer.run()
        assert float(trainer.state.output["loss_con"]) == 0.0


def test_paper_loss_focal_plus_weighted_bce_on_the_contrastive_path():
    """L = ASL(cls) + 0.4 x BCE(con), both with the same positive weights (the paper's loss; 0.4 is the default)."""
    items = _datalist(8)
    pw = torch.linspace(1.0, 20.0, C)
    focal, bce = VCEAsymmetricFocalLoss(pos_weight=pw), BinaryCrossEntropyLoss(pos_weight=pw)
    net = TinyNet()
    trainer = _trainer(net, _loader(items), mixup_alpha=0.0, lr=0.0, loss_function=focal, contrastive_loss_function=bce)
    assert trainer.contrastive_weight == 0.4
    trainer.run()
    out = trainer.state.output
    with torch.no_grad():
        cls, con = net.forward_paths(out["image"])
    torch.testing.assert_close(out["loss_cls"], focal(cls, out["label"]))
    torch.testing.assert_close(out["loss_con"], bce(con, out["label"]))
    torch.testing.assert_close(out["loss"].detach(), focal(cls, out["label"]) + 0.4 * bce(con, out["label"]))
    assert not torch.allclose(bce(con, out["label"]), focal(con, out["label"]))  # the two losses differ


def test_swappable_loss_bce():
    trainer = _trainer(TinyNet(), _loader(_datalist(8)), loss_function=torch.nn.BCEWithLogitsLoss(), mixup_alpha=0.0)
    trainer.run()
    assert torch.isfinite(trainer.state.output["loss"])


def test_non_finite_loss_raises_before_the_step():
    net = TinyNet()
    trainer = _trainer(net, _loader(_datalist(16)), max_epochs=2)
    before = {k: v.clone() for k, v in net.state_dict().items()}

    def poison(engine):
        if engine.state.epoch == 2 and engine.state.iteration == 4:
            with torch.no_grad():
                net.head.bias.fill_(float("nan"))

    trainer.add_event_handler(Events.ITERATION_STARTED, poison)
    with pytest.raises(
        FloatingPointError,
        match=r"non-finite training loss \(nan\) at epoch 2, iteration 4 \(iteration 2 of the epoch\)",
    ):
        trainer.run()
    assert not torch.equal(net.conv.weight, before["conv.weight"])  # earlier steps happened
    # the poisoned step did not: the other weights are not NaN
    assert torch.isfinite(net.conv.weight).all() and torch.isfinite(net.head.weight).all()


def test_gradient_clipping_bounds_the_update():
    items = _datalist(8)
    net = TinyNet(paths=False)
    trainer = _trainer(net, _loader(items), lr=1.0, mixup_alpha=0.0, grad_clip_norm=1e-3)
    before = torch.cat([p.detach().flatten().clone() for p in net.parameters()])
    trainer.run()
    after = torch.cat([p.detach().flatten() for p in net.parameters()])
    # one SGD step with lr 1: the update is the clipped gradient, of norm exactly 1e-3
    assert float((after - before).norm()) == pytest.approx(1e-3, rel=1e-4)


def test_bf16_autocast_on_cpu_without_scaler():
    trainer = _trainer(TinyNet(), _loader(_datalist(8)), amp=True, amp_dtype="bfloat16", mixup_alpha=0.0)
    trainer.run()
    assert trainer.scaler is None
    assert trainer.state.output["pred"].dtype == torch.bfloat16
    assert torch.isfinite(trainer.state.output["loss"]) and trainer.state.output["loss"].dtype == torch.float32
    with pytest.raises(ValueError, match="amp_dtype"):
        _trainer(TinyNet(), _loader(_datalist(8)), amp_dtype="float8")


def test_sampler_epoch_is_set_each_epoch():
    items = _datalist(16)
    sampler = SqrtFrequencySampler(items, num_samples=16, seed=0)
    epochs = []
    orig = sampler.set_epoch
    sampler.set_epoch = lambda e: (epochs.append(e), orig(e))  # type: ignore[method-assign]
    trainer = _trainer(TinyNet(), _loader(items, sampler=sampler), max_epochs=3)
    trainer.run()
    assert epochs == [1, 2, 3]


def test_decollated_output_works_with_monai_handlers():
    from monai.handlers import StatsHandler, from_engine

    trainer = _trainer(
        TinyNet(),
        _loader(_datalist(8)),
        decollate=True,
        train_handlers=[StatsHandler(output_transform=from_engine(["loss"], first=True))],
    )
    trainer.run()
    assert isinstance(trainer.state.output, list) and len(trainer.state.output) == 8
    assert trainer.state.output[0]["pred"].shape == (C,)


@pytest.mark.parametrize("warmup", [None, 3])
def test_ema_equals_analytic_average(warmup):
    set_determinism(2)
    net = TinyNet(paths=False)
    beta = 0.8
    trainer = _trainer(net, _loader(_datalist(24)), max_epochs=2, lr=0.1, mixup_alpha=0.0)
    ema = EMAWeights(net, beta=beta, warmup_iters=warmup, warmup_beta=0.0)
    theta0 = [p.detach().clone() for p in net.parameters()]
    trajectory = []
    trainer.add_event_handler(
        Events.ITERATION_COMPLETED, lambda e: trajectory.append([p.detach().clone() for p in net.parameters()])
    )
    ema.attach(trainer)
    trainer.run()
    assert len(trajectory) == 6
    e = theta0
    for t, theta in enumerate(trajectory, start=1):
        # ignite's linear warm-up of the momentum 1 - beta, from 1 - warmup_beta = 1
        m = min(1.0, max(1 - beta, 1.0 + ((1 - beta) - 1.0) * (t - 1) / (warmup - 1))) if warmup else 1 - beta
        e = [(1 - m) * a + m * b for a, b in zip(e, theta, strict=True)]
    for a, b in zip(ema.ema_model.parameters(), e, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert not torch.allclose(next(ema.ema_model.parameters()), next(net.parameters()))
    assert trainer.state.ema_momentum == pytest.approx(1 - beta)
    # state dict round trip for checkpoints
    ema2 = EMAWeights(TinyNet(paths=False), beta=beta)
    ema2.load_state_dict(ema.state_dict())
    for a, b in zip(ema2.ema_model.parameters(), ema.ema_model.parameters(), strict=True):
        assert torch.equal(a, b)
    with pytest.raises(ValueError):
        EMAWeights(net, beta=1.0)
    set_determinism(None)


def test_dual_path_through_ddp(tmp_path):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        net = TinyNet()
        ddp = torch.nn.parallel.DistributedDataParallel(net)
        before = net.con.weight.detach().clone()
        trainer = _trainer(ddp, _loader(_datalist(8)), mixup_alpha=0.0, lr=0.5)
        trainer.run()
        assert net.path_calls == 1
        assert "forward" not in vars(net)  # the temporary redirection is undone
        assert not torch.equal(net.con.weight, before)  # the contrastive head trained through DDP
        torch.testing.assert_close(
            ddp(_datalist(2)[0]["image"][None].float() / 255), net(_datalist(2)[0]["image"][None].float() / 255)
        )
    finally:
        dist.destroy_process_group()
