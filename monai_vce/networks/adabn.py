"""AdaBN test-time adaptation: re-estimate the BatchNorm statistics of a network on one exam's frames (e.g. from a
capsule never seen in training), with the stored statistics restored afterwards.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn as nn
from torch.nn.modules.batchnorm import _BatchNorm

from .network_utils import unwrap_network

__all__ = [
    "batchnorm_layers",
    "batchnorm_state",
    "restore_batchnorm",
    "adapt_batchnorm",
    "exam_batchnorm",
]

logger = logging.getLogger(__name__)

#: Frames a BatchNorm layer needs per batch in training mode (one value per channel has no variance).
_MIN_BATCH = 2


def batchnorm_layers(network: nn.Module, modules: Sequence[str] | None = None) -> list[tuple[str, _BatchNorm]]:
    """The ``(name, layer)`` of the BatchNorm layers that track running statistics, in module order.

    Args:
        network: the network (a DDP / DataParallel wrapper is looked through).
        modules: names of submodules (as in ``named_modules()``, e.g. ``["head"]``) whose BatchNorm layers, the
            submodule itself included, are selected; ``None``: every BatchNorm layer.

    Raises:
        ValueError: a name in ``modules`` is not a submodule of the network.
    """
    net = unwrap_network(network)
    named = dict(net.named_modules())
    if modules is None:
        prefixes: list[str] | None = None
    else:
        if isinstance(modules, str):
            modules = [modules]
        unknown = [m for m in modules if m not in named]
        if unknown:
            raise ValueError(f"{type(net).__name__} has no submodule {unknown[0]!r}")
        prefixes = list(modules)
    out = []
    for name, layer in named.items():
        if not isinstance(layer, _BatchNorm) or not layer.track_running_stats or layer.running_mean is None:
            continue
        if prefixes is None or any(p == "" or name == p or name.startswith(p + ".") for p in prefixes):
            out.append((name, layer))
    return out


def batchnorm_state(network: nn.Module, modules: Sequence[str] | None = None) -> dict[str, dict[str, torch.Tensor]]:
    """Copies of the running statistics (``running_mean``, ``running_var``, ``num_batches_tracked``) and momentum of
    the selected BatchNorm layers, keyed by layer name (see :func:`batchnorm_layers`), for :func:`restore_batchnorm`.
    """
    state: dict[str, dict[str, Any]] = {}
    for name, bn in batchnorm_layers(network, modules):
        entry: dict[str, Any] = {"momentum": bn.momentum}
        for key in ("running_mean", "running_var", "num_batches_tracked"):
            buf = getattr(bn, key)
            entry[key] = None if buf is None else buf.detach().clone()
        state[name] = entry
    return state


def restore_batchnorm(network: nn.Module, state: dict[str, dict[str, Any]]) -> nn.Module:
    """Write back statistics saved by :func:`batchnorm_state` (in place, bit for bit).

    Returns:
        ``network``.

    Raises:
        KeyError: ``state`` names a layer that is not a BatchNorm layer of the network.
    """
    layers = dict(batchnorm_layers(network))
    with torch.no_grad():
        for name, entry in state.items():
            if name not in layers:
                raise KeyError(f"{name!r} is not a BatchNorm layer of {type(unwrap_network(network)).__name__}")
            bn = layers[name]
            bn.momentum = entry["momentum"]
            for key in ("running_mean", "running_var", "num_batches_tracked"):
                buf, saved = getattr(bn, key), entry[key]
                if buf is not None and saved is not None:
                    buf.copy_(saved)
    return network


class _PooledStats:
    """Exact per-channel mean and variance of every input a BatchNorm layer sees (Chan's pooled update, float64)."""

    def __init__(self) -> None:
        self.count = 0
        self.batches = 0
        self.mean: torch.Tensor | None = None
        self.m2: torch.Tensor | None = None

    def __call__(self, module: nn.Module, args: tuple[Any, ...]) -> None:
        x = args[0].detach()
        dims = [d for d in range(x.ndim) if d != 1]
        n = x.numel() // max(x.shape[1], 1) if x.ndim > 1 else 0
        if n == 0:
            return
        var_b, mean_b = torch.var_mean(x.float(), dim=dims, correction=0)
        mean_b, m2_b = mean_b.double(), var_b.double() * n
        if self.mean is None or self.m2 is None:
            self.mean, self.m2 = mean_b, m2_b
        else:
            total = self.count + n
            delta = mean_b - self.mean
            self.mean = self.mean + delta * (n / total)
            self.m2 = self.m2 + m2_b + delta.square() * (self.count * n / total)
        self.count += n
        self.batches += 1


def _batches_of_at_least(batches: Iterable[torch.Tensor], size: int) -> Iterator[torch.Tensor]:
    """The batches, with batches smaller than ``size`` joined to their neighbours (one batch is held back)."""
    pending: list[torch.Tensor] = []
    count = 0
    ready: torch.Tensor | None = None
    for batch in batches:
        if not isinstance(batch, torch.Tensor):
            raise TypeError(f"batches must be tensors of frames (B, ...), got {type(batch).__name__}")
        if batch.shape[0] == 0:
            continue
        pending.append(batch)
        count += int(batch.shape[0])
        if count >= size:
            if ready is not None:
                yield ready
            ready = pending[0] if len(pending) == 1 else torch.cat(pending)
            pending, count = [], 0
    if pending:
        ready = torch.cat(pending if ready is None else [ready, *pending])
    if ready is not None:
        yield ready


def _device_of(network: nn.Module) -> torch.device | None:
    for tensor in (*network.parameters(), *network.buffers()):
        return tensor.device
    return None


def adapt_batchnorm(
    network: nn.Module,
    batches: torch.Tensor | Iterable[torch.Tensor],
    momentum: float | None = None,
    modules: Sequence[str] | None = None,
    device: torch.device | str | None = None,
) -> nn.Module:
    """AdaBN: replace the running statistics of the network's BatchNorm layers by those of ``batches`` (in place).

    The network runs once over the batches without gradients, every module in eval mode (dropout off) except the
    selected BatchNorm layers, which normalise with their batch's statistics as in training. Each selected layer's
    statistics become the exact per-channel mean and (unbiased) variance of all the inputs it saw, whatever the batch
    sizes; batches of one frame are joined to a neighbour. Parameters and every other buffer are left untouched,
    and the network is left in eval mode. A network without a selected BatchNorm layer is returned as it is (with
    a warning, and ``batches`` not read).

    Args:
        network: the network (a DDP / DataParallel wrapper is looked through; SyncBatchNorm layers would gather
            statistics across processes: adapt a plain copy).
        batches: the exam's frames, as one ``(T, ...)`` tensor or an iterable of ``(B, ...)`` network inputs.
        momentum: weight of the exam's statistics: ``None`` (or 1) replaces the stored statistics, ``m`` in
            ``[0, 1)`` gives ``(1 - m) * stored + m * exam`` (as one update of PyTorch's running average).
        modules: restrict the adaptation to the BatchNorm layers under these submodules (see
            :func:`batchnorm_layers`); the others keep their statistics.
        device: device the batches are moved to; ``None``: that of the network's first parameter or buffer.

    Returns:
        ``network``, in eval mode, with the adapted statistics.

    Raises:
        ValueError: ``momentum`` is outside ``[0, 1]``, or the batches hold fewer than 2 frames.
    """
    if momentum is not None and not 0.0 <= float(momentum) <= 1.0:
        raise ValueError(f"momentum must be None or in [0, 1], got {momentum!r}")
    net = unwrap_network(network)
    layers = batchnorm_layers(net, modules)
    if not layers:
        warnings.warn(
            f"{type(net).__name__} has no BatchNorm layer with running statistics"
            + ("" if modules is None else f" under {list(modules)}")
            + ": nothing to adapt, the network is unchanged",
            stacklevel=2,
        )
        return network
    if isinstance(batches, torch.Tensor):
        batches = (batches,)
    device = _device_of(net) if device is None else torch.device(device)
    modes = {m: m.training for m in net.modules()}
    saved = batchnorm_state(net, modules)
    stats = {name: _PooledStats() for name, _ in layers}
    hooks = [bn.register_forward_pre_hook(stats[name]) for name, bn in layers]
    done = False
    try:
        net.eval()
        for _, bn in layers:
            bn.train()
        with torch.no_grad():
            frames = 0
            for batch in _batches_of_at_least(batches, _MIN_BATCH):
                if batch.shape[0] < _MIN_BATCH:
                    raise ValueError(f"AdaBN needs at least {_MIN_BATCH} frames, got {batch.shape[0]}")
                net(batch if device is None else batch.to(device, non_blocking=True))
                frames += int(batch.shape[0])
        if frames == 0:
            raise ValueError("AdaBN needs at least 2 frames, got none")
        for name, _ in layers:
            if stats[name].count < 2:
                raise ValueError(f"BatchNorm layer {name!r} saw fewer than 2 values per channel: nothing to estimate")
        done = True
    finally:
        for hook in hooks:
            hook.remove()
        if not done:  # the partial pass moved the running statistics: put everything back
            restore_batchnorm(net, saved)
            for m, training in modes.items():
                m.training = training
    weight = 1.0 if momentum is None else float(momentum)
    with torch.no_grad():
        for name, bn in layers:
            s, old = stats[name], saved[name]
            assert s.mean is not None and s.m2 is not None
            assert bn.running_mean is not None and bn.running_var is not None
            mean, var = s.mean, s.m2 / (s.count - 1)
            if weight < 1.0:  # mixed with the statistics stored before the pass (which moved the buffers)
                mean = (1.0 - weight) * old["running_mean"].double() + weight * mean.to(old["running_mean"].device)
                var = (1.0 - weight) * old["running_var"].double() + weight * var.to(old["running_var"].device)
            bn.running_mean.copy_(mean)
            bn.running_var.copy_(var)
            if bn.num_batches_tracked is not None:
                bn.num_batches_tracked.fill_(s.batches)
    net.eval()
    logger.debug("AdaBN: adapted %d BatchNorm layers of %s", len(layers), type(net).__name__)
    return network


@contextmanager
def exam_batchnorm(
    network: nn.Module,
    frames: torch.Tensor | Iterable[torch.Tensor],
    momentum: float | None = None,
    modules: Sequence[str] | None = None,
    device: torch.device | str | None = None,
) -> Iterator[nn.Module]:
    """Adapt the BatchNorm statistics to one exam for the ``with`` block, then restore the stored ones.

    On exit, even on an error, the running statistics are restored bit for bit and every module gets back its
    train / eval mode. See :func:`adapt_batchnorm` for the arguments.

    Example::

        with exam_batchnorm(network, frame_batches(video)) as net:
            logits = torch.cat([net(b) for b in frame_batches(video)])

    Yields:
        ``network`` in eval mode with the exam's statistics.
    """
    net = unwrap_network(network)
    modes = {m: m.training for m in net.modules()}
    state = batchnorm_state(net, modules)
    try:
        adapt_batchnorm(network, frames, momentum=momentum, modules=modules, device=device)
        yield network
    finally:
        restore_batchnorm(net, state)
        for m, training in modes.items():
            m.training = training
