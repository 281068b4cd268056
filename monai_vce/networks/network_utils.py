"""Optimizer groups and deferred weights of whatever network ``network_def`` builds.

A network offering ``param_groups(...)`` / ``load_pretrained()`` gets them used; any other ``torch.nn.Module`` gets
one optimizer group and no weight loading.
"""

from __future__ import annotations

import logging
from typing import Any

import torch.nn as nn

__all__ = ["unwrap_network", "param_groups", "load_pretrained"]

logger = logging.getLogger(__name__)


def unwrap_network(network: nn.Module) -> nn.Module:
    """The module inside ``DistributedDataParallel`` / ``DataParallel`` (or ``network`` itself)."""
    inner = getattr(network, "module", None)
    return inner if isinstance(inner, nn.Module) else network


def param_groups(
    network: nn.Module,
    lr: float,
    backbone_lr_mult: float = 0.1,
    layer_decay: float = 1.0,
    weight_decay: float = 0.05,
) -> list[dict[str, Any]]:
    """Optimizer parameter groups of any network.

    A network with a ``param_groups(lr=..., backbone_lr_mult=..., layer_decay=..., weight_decay=...)`` method
    (:meth:`DiffAttnCLIPClassifier.param_groups`: per-layer learning rates, no weight decay on norms and biases)
    gets its own groups; any other network gets one group of all its trainable parameters at ``lr`` and
    ``weight_decay`` (``backbone_lr_mult`` and ``layer_decay`` do not apply: it has no known backbone).

    Args:
        network: the network (a DDP / DataParallel wrapper is looked through).
        lr: base learning rate.
        backbone_lr_mult: learning-rate factor of a pretrained backbone (networks with ``param_groups`` only).
        layer_decay: layer-wise learning-rate decay of a backbone (networks with ``param_groups`` only).
        weight_decay: weight decay.

    Returns:
        A list of ``{"params", "lr", "weight_decay", "name"}`` dicts for any ``torch.optim`` optimizer, e.g. in a
        bundle: ``"params": "$monai_vce.networks.param_groups(@network_def, lr=@learning_rate)"``.

    Raises:
        ValueError: the network has no trainable parameter.
    """
    net = unwrap_network(network)
    own = getattr(net, "param_groups", None)
    if callable(own):
        groups = own(lr=lr, backbone_lr_mult=backbone_lr_mult, layer_decay=layer_decay, weight_decay=weight_decay)
        return list(groups)
    params = [p for p in net.parameters() if p.requires_grad]
    if not params:
        raise ValueError(f"{type(net).__name__} has no trainable parameter")
    logger.info(
        "%s has no param_groups(): one optimizer group of %d parameters at lr %g, weight decay %g",
        type(net).__name__,
        len(params),
        lr,
        weight_decay,
    )
    return [{"params": params, "lr": lr, "weight_decay": weight_decay, "name": "all"}]


def load_pretrained(network: nn.Module) -> nn.Module:
    """Load a network's deferred pretrained weights, if it has any; any other network is returned unchanged.

    :class:`~monai_vce.networks.DiffAttnCLIPClassifier` built with ``defer_pretrained=True`` (the bundle's training
    config) builds its architecture without touching the hub or the disk; this loads the backbone's weights (and
    computes its text embeddings) when the training workflow runs. Networks without a ``load_pretrained()`` method
    load nothing here, so a replaced ``network_def`` never touches the default backbone.

    Args:
        network: the network (a DDP / DataParallel wrapper is looked through).

    Returns:
        ``network``.
    """
    load = getattr(unwrap_network(network), "load_pretrained", None)
    if callable(load):
        load()
    return network
