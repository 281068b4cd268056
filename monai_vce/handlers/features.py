"""Per-frame features from the frame model's own forward pass (the input of its head, read by a pre-hook), put
into ``engine.state.output["features"]``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from monai.engines.utils import IterationEvents
from monai.utils import IgniteInfo, min_version, optional_import
from torch import nn

Events, _ = optional_import("ignite.engine", IgniteInfo.OPT_IMPORT_VERSION, min_version, "Events")
if TYPE_CHECKING:
    from ignite.engine import Engine
else:
    Engine, _ = optional_import("ignite.engine", IgniteInfo.OPT_IMPORT_VERSION, min_version, "Engine")

__all__ = ["DEFAULT_FEATURE_MODULE", "FrameFeatureCapture", "unwrap_network"]

#: The submodule of :class:`~monai_vce.networks.DiffAttnCLIPClassifier` whose input is the per-frame feature.
DEFAULT_FEATURE_MODULE = "classifier_head"


def unwrap_network(network: nn.Module) -> nn.Module:
    """The module inside ``DataParallel`` / ``DistributedDataParallel`` (``.module``) and ``torch.compile``
    (``._orig_mod``) wrappers."""
    while True:
        inner = getattr(network, "_orig_mod", None)
        if not isinstance(inner, nn.Module):
            inner = (
                network.module if isinstance(network, (nn.DataParallel, nn.parallel.DistributedDataParallel)) else None
            )
        if inner is None:
            return network
        network = inner


class FrameFeatureCapture:
    """Puts the per-frame features the network's head consumes into the engine output (see ``docs/design/training.md``).

    Args:
        module: name of the network's submodule whose first input is the pooled ``(B, D)`` per-frame feature
            (``network.get_submodule(module)``); the default is the classification head of
            :class:`~monai_vce.networks.DiffAttnCLIPClassifier`. For another network, name the head that consumes
            its pooled image feature.
        output_key: key of the ``(B, D)`` float16 features in ``engine.state.output``.
        feature_dim: the width ``D`` the features must have (e.g. the one a temporal refiner was fitted on);
            ``None`` accepts any. Checked at the first batch, before any file is written.

    Raises:
        ValueError: when a run starts, if the network has no such submodule; at the first batch, when the
            features are not ``(B, D)`` or not ``feature_dim`` wide.

    Example (bundle JSON, inside an evaluator's handlers)::

        {"_target_": "monai_vce.handlers.FrameFeatureCapture", "module": "classifier_head"}
    """

    def __init__(
        self, module: str = DEFAULT_FEATURE_MODULE, output_key: str = "features", feature_dim: int | None = None
    ) -> None:
        self.module = str(module)
        self.output_key = str(output_key)
        self.feature_dim = None if feature_dim is None else int(feature_dim)
        self._target: nn.Module | None = None
        self._hook: Any = None
        self._batch: torch.Tensor | None = None

    def find_module(self, network: nn.Module) -> nn.Module:
        """The submodule whose input is the feature, or a one-line ``ValueError`` naming the network."""
        net = unwrap_network(network)
        try:
            return net.get_submodule(self.module)
        except AttributeError:
            raise ValueError(
                f"per-frame features were asked for, but the network {type(net).__name__} has no submodule "
                f"{self.module!r} whose input is the pooled image feature: name the head that consumes it "
                f"(feature_module) or turn the features off (write_features false)"
            ) from None

    def _record(self, module: nn.Module, args: tuple[Any, ...]) -> None:
        self._batch = args[0] if args and isinstance(args[0], torch.Tensor) else None

    def _started(self, engine: Engine) -> None:
        self._remove()
        network = getattr(engine, "network", None)  # MONAI's evaluators hold their network
        if not isinstance(network, nn.Module):
            raise ValueError(f"per-frame features need an engine with a network (a MONAI evaluator), got {engine}")
        self._target = self.find_module(network)
        self._hook = self._target.register_forward_pre_hook(self._record)

    def _remove(self, engine: Engine | None = None) -> None:
        # not on EXCEPTION_RAISED: an ignite handler there would swallow the exception; the next run's start
        # removes a hook left by a failed run
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        self._batch = None

    def _forward_completed(self, engine: Engine) -> None:
        features, self._batch = self._batch, None
        if features is None:
            raise RuntimeError(
                f"the network's forward pass did not call its submodule {self.module!r} with a tensor: no per-frame "
                "features to write"
            )
        if features.ndim != 2:
            raise ValueError(
                f"per-frame features from {self.module!r} must be (B, D), got shape {tuple(features.shape)}; name "
                "the submodule that consumes the pooled image feature (feature_module)"
            )
        if self.feature_dim is not None and features.shape[1] != self.feature_dim:
            raise ValueError(
                f"the network gives {features.shape[1]}-wide features, but {self.feature_dim} are needed (the "
                "temporal refiner was fitted on another frame model's features)"
            )
        # float16 is the file format; converting here also handles bfloat16 autocast, which numpy cannot hold
        engine.state.output[self.output_key] = features.detach().to(torch.float16)  # type: ignore[index]

    def attach(self, engine: Engine) -> None:
        """Record the submodule's input at every forward pass of the engine's runs. The submodule is looked up on
        ``engine.network`` when a run starts (MONAI attaches handlers before the evaluator holds its network), so a
        network without it stops the run before any frame is inferred."""
        if not engine.has_event_handler(self._started, Events.STARTED):
            engine.add_event_handler(Events.STARTED, self._started)
            engine.add_event_handler(IterationEvents.FORWARD_COMPLETED, self._forward_completed)
            engine.add_event_handler(Events.COMPLETED, self._remove)
