"""AdaBN: BatchNorm statistics re-estimated on an exam's frames, everything else untouched, restored afterwards."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from monai_vce.networks import (
    SEGatedClassifierHead,
    adapt_batchnorm,
    batchnorm_layers,
    batchnorm_state,
    exam_batchnorm,
    restore_batchnorm,
)


def _net() -> nn.Module:
    torch.manual_seed(0)
    net = nn.Sequential(
        nn.Conv2d(3, 4, 3, padding=1),
        nn.BatchNorm2d(4),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(4, 6),
        nn.BatchNorm1d(6),
        nn.Dropout(0.5),
        nn.Linear(6, 17),
    )
    # stored statistics far from the new data's, as after training on another device
    with torch.no_grad():
        for m in net:
            if isinstance(m, nn.modules.batchnorm._BatchNorm):
                m.running_mean.fill_(3.0)
                m.running_var.fill_(9.0)
                m.num_batches_tracked.fill_(1000)
    return net.eval()


def _batches(sizes=(5, 7, 1, 6), shift: float = 2.0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return [torch.randn(n, 3, 8, 8, generator=g) * 1.5 + shift for n in sizes]


def _record_inputs(net: nn.Module) -> tuple[dict[str, list[torch.Tensor]], list]:
    seen: dict[str, list[torch.Tensor]] = {}
    hooks = []
    for name, bn in batchnorm_layers(net):
        seen[name] = []
        hooks.append(bn.register_forward_pre_hook(lambda m, a, name=name: seen[name].append(a[0].detach().clone())))
    return seen, hooks


def _channel_stats(xs: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.cat(xs).double()
    dims = [d for d in range(x.ndim) if d != 1]
    return x.mean(dim=dims), x.var(dim=dims, unbiased=True)


def _other_tensors(net: nn.Module) -> dict[str, torch.Tensor]:
    out = {k: v.detach().clone() for k, v in net.named_parameters()}
    out.update({k: v.detach().clone() for k, v in net.named_buffers() if "running" not in k and "batches" not in k})
    return out


def test_running_stats_are_the_adaptation_data_statistics():
    net = _net()
    before = _other_tensors(net)
    seen, hooks = _record_inputs(net)
    batches = _batches()
    adapt_batchnorm(net, batches)
    for h in hooks:
        h.remove()
    assert not net.training and not any(m.training for m in net.modules())
    for name, bn in batchnorm_layers(net):
        # one pass; the 1-frame batch was joined to the next one
        assert [x.shape[0] for x in seen[name]] == [5, 7, 7]
        mean, var = _channel_stats(seen[name])
        torch.testing.assert_close(bn.running_mean.double(), mean, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(bn.running_var.double(), var, rtol=1e-5, atol=1e-6)
        assert int(bn.num_batches_tracked) == 3
    # the first layer's inputs do not depend on any normalisation: check them from the data directly
    conv_out = torch.cat([net[0](b) for b in batches]).double()
    torch.testing.assert_close(net[1].running_mean.double(), conv_out.mean(dim=(0, 2, 3)), rtol=1e-5, atol=1e-6)
    after = _other_tensors(net)
    assert before.keys() == after.keys()
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_a_single_tensor_and_momentum_mix():
    net = _net()
    frames = torch.cat(_batches())
    seen, hooks = _record_inputs(net)
    adapt_batchnorm(net, frames, momentum=0.25)
    for h in hooks:
        h.remove()
    mean, var = _channel_stats(seen["1"])
    torch.testing.assert_close(net[1].running_mean.double(), 0.75 * 3.0 + 0.25 * mean, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(net[1].running_var.double(), 0.75 * 9.0 + 0.25 * var, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="momentum"):
        adapt_batchnorm(net, frames, momentum=1.5)


def test_exam_context_restores_statistics_and_modes():
    net = _net()
    net[7].train()  # a module left in training mode gets it back
    state = {k: v.clone() for k, v in net.state_dict().items()}
    x = torch.randn(4, 3, 8, 8) + 2.0
    net.eval()
    ref = net(x)
    net[7].train()
    with exam_batchnorm(net, _batches()) as adapted:
        assert adapted is net and not any(m.training for m in net.modules())
        out = net(x)
        assert not torch.allclose(out, ref)
    assert net[7].training and not net[1].training
    assert all(torch.equal(state[k], v) for k, v in net.state_dict().items())
    net.eval()
    torch.testing.assert_close(net(x), ref, rtol=0, atol=0)


def test_error_leaves_the_network_as_it_was():
    net = _net()
    state = {k: v.clone() for k, v in net.state_dict().items()}

    def broken():
        yield from _batches((4, 4))
        raise RuntimeError("reader failed")

    with pytest.raises(RuntimeError, match="reader failed"), exam_batchnorm(net, broken()):
        pass
    assert all(torch.equal(state[k], v) for k, v in net.state_dict().items())
    with pytest.raises(ValueError, match="at least 2 frames"):
        adapt_batchnorm(net, [torch.randn(1, 3, 8, 8)])
    with pytest.raises(ValueError, match="got none"):
        adapt_batchnorm(net, [])
    assert all(torch.equal(state[k], v) for k, v in net.state_dict().items())
    assert not any(m.training for m in net.modules())


def test_selected_modules_only():
    net = _net()
    adapt_batchnorm(net, _batches(), modules=["6"])
    assert torch.all(net[1].running_mean == 3.0)
    assert not torch.all(net[6].running_mean == 3.0)
    with pytest.raises(ValueError, match="no submodule"):
        batchnorm_layers(net, ["head"])
    saved = batchnorm_state(net)
    adapt_batchnorm(net, _batches(shift=-1.0))
    restore_batchnorm(net, saved)
    assert torch.equal(net[6].running_mean, saved["6"]["running_mean"])


def test_network_without_batchnorm_is_untouched():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 4, 3), nn.GroupNorm(2, 4), nn.Flatten(), nn.LazyLinear(17)).train()
    net(torch.randn(2, 3, 8, 8))
    state = {k: v.clone() for k, v in net.state_dict().items()}

    def never_read():
        raise AssertionError("batches were read")
        yield

    with pytest.warns(UserWarning, match="no BatchNorm"):
        assert adapt_batchnorm(net, never_read()) is net
    assert net.training
    assert all(torch.equal(state[k], v) for k, v in net.state_dict().items())


def test_se_head_batchnorm_of_the_classifier():
    torch.manual_seed(0)
    head = SEGatedClassifierHead(16, batch_norm=True, dropout=0.4).eval()
    feats = [torch.randn(9, 16) * 2 + 1, torch.randn(3, 16) * 2 + 1]
    gated = [head.gate(f.unsqueeze(-1)).squeeze(-1) for f in feats]
    with exam_batchnorm(head, feats):
        mean, var = _channel_stats(gated)
        torch.testing.assert_close(head.norm.running_mean.double(), mean, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(head.norm.running_var.double(), var, rtol=1e-5, atol=1e-6)
    assert torch.all(head.norm.running_mean == 0) and torch.all(head.norm.running_var == 1)
