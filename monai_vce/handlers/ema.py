"""Exponential moving average of the network weights, as a MONAI-style handler around ignite's ``EMAHandler``."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import torch
from ignite.engine import Engine, Events
from ignite.handlers import EMAHandler

__all__ = ["EMAWeights"]

logger = logging.getLogger(__name__)


class EMAWeights:
    """Keep an exponential moving average (EMA) copy of a network's weights, updated after every optimizer step.

    After each update ``theta_ema <- beta * theta_ema + (1 - beta) * theta``, where ``theta`` are the
    trained weights (ignite's ``EMAHandler`` with ``momentum = 1 - beta``). Buffers (e.g. batch-norm
    statistics) are copied from the trained network (``handle_buffers="copy"``).

    The EMA copy, :attr:`ema_model`, is a separate ``nn.Module`` in ``eval`` mode on the network's device;
    in a bundle it is the network of the validation evaluator (``"$@ema.ema_model"``), of threshold tuning and
    of the saved model file, and it is checkpointed next to the trained network for resuming (this object has
    ``state_dict`` / ``load_state_dict``, so ``"ema": "@ema"`` can go into a ``CheckpointSaver``'s
    ``save_dict`` and a ``CheckpointLoader``'s ``load_dict``). A DDP-wrapped network is averaged through its
    ``module``.

    Args:
        network: the trained network (plain or DDP-wrapped). The EMA starts as a copy of its weights when training
            starts from iteration 0 (so pretrained weights loaded after this object was built are taken too); a
            resumed run keeps the averaged weights of its checkpoint.
        beta: decay of the average (0.999: a horizon of about 1000 steps).
        warmup_iters: if set, the decay grows linearly from ``warmup_beta`` to ``beta`` over this many
            updates, so that a short run's EMA is not stuck near the initial weights.
        warmup_beta: the decay at the first update when ``warmup_iters`` is set (0: the first update copies).
        every: update every ``every`` iterations (match ``accumulation_steps`` of the trainer).
        handle_buffers: ``"copy"``, ``"update"`` (average buffers too) or ``"ema_train"`` (ignite's options).
        name: logger name (``None``: the engine's logger).

    The current momentum ``1 - decay`` is ``engine.state.ema_momentum`` (the name ignite's warm-up scheduler
    writes to).

    Example::

        ema = EMAWeights(network, beta=0.999)
        ema.attach(trainer)
        evaluator = SupervisedEvaluator(..., network=ema.ema_model, ...)
    """

    def __init__(
        self,
        network: torch.nn.Module,
        beta: float = 0.999,
        warmup_iters: int | None = None,
        warmup_beta: float = 0.0,
        every: int = 1,
        handle_buffers: str = "copy",
        name: str | None = None,
    ) -> None:
        if not 0.0 < beta < 1.0:
            raise ValueError(f"EMA beta must be in (0, 1), got {beta}")
        if not 0.0 <= warmup_beta <= beta:
            raise ValueError(f"warmup_beta must be in [0, beta={beta}], got {warmup_beta}")
        if every < 1:
            raise ValueError(f"every must be >= 1, got {every}")
        self.logger = logging.getLogger(name)
        self._name = name
        self.beta = float(beta)
        self.every = int(every)
        self._handler = EMAHandler(
            network,
            momentum=1.0 - self.beta,
            momentum_warmup=(1.0 - float(warmup_beta)) if warmup_iters else None,
            warmup_iters=int(warmup_iters) if warmup_iters else None,
            handle_buffers=handle_buffers,
        )

    @property
    def ema_model(self) -> torch.nn.Module:
        """The averaged copy of the network."""
        return self._handler.ema_model

    def attach(self, engine: Engine) -> None:
        """Update the average at every ``every``-th ``ITERATION_COMPLETED`` of ``engine`` (the trainer)."""
        if self._name is None:
            self.logger = engine.logger
        engine.add_event_handler(Events.STARTED, self._copy_on_fresh_start)
        event = Events.ITERATION_COMPLETED if self.every == 1 else Events.ITERATION_COMPLETED(every=self.every)
        # warn_if_exists=False: a resumed trainer state already holds the momentum attribute
        self._handler.attach(engine, name="ema_momentum", warn_if_exists=False, event=event)

    def _copy_on_fresh_start(self, engine: Engine) -> None:
        """Start the average from the network's current weights, unless the run resumes (iteration > 0)."""
        if engine.state.iteration:
            return
        model, ema = self._handler.model, self.ema_model
        # a sub-module the network dropped after the copy was made (an unavailable contrastive path) goes too
        for name, child in list(ema.named_children()):
            if child is not None and getattr(model, name, child) is None:
                setattr(ema, name, None)
        ema.load_state_dict(model.state_dict())
        self.logger.info(f"EMA of the weights (beta {self.beta}) starts from the network's weights")

    def state_dict(self) -> dict[str, Any]:
        """The EMA model's ``state_dict``."""
        return self.ema_model.state_dict()

    def load_state_dict(self, state_dict: Mapping[str, Any], strict: bool = True) -> Any:
        """Load averaged weights (e.g. when resuming)."""
        return self.ema_model.load_state_dict(state_dict, strict=strict)
