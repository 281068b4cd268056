"""Tune per-class decision thresholds at the end of each validation run."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import ignite.distributed as idist
import numpy as np
import torch
from ignite.engine import Engine, Events
from monai.handlers import from_engine
from monai.utils import evenly_divisible_all_gather

from monai_vce.postprocessing.thresholds import optimize_thresholds, save_thresholds

__all__ = ["ThresholdOptimizationHandler"]

_WRITE_ON = ("always", "best")


def _stack(values: Any) -> torch.Tensor:
    """A batch tensor from a batched tensor or from decollated per-item tensors."""
    if isinstance(values, torch.Tensor):
        return values
    return torch.stack([torch.as_tensor(v) for v in values])


class ThresholdOptimizationHandler:
    """Collect the validation probabilities and targets, then fit the F1-optimal threshold of each class.

    Attach it to the validation evaluator. Every iteration it takes ``(probabilities, targets)`` from
    ``engine.state.output`` through ``output_transform``; at ``EPOCH_COMPLETED`` it gathers them from all ranks,
    runs :func:`monai_vce.postprocessing.optimize_thresholds`, stores the thresholds (a (C,) numpy array) as
    ``engine.state.<state_key>`` and their F1 values as ``engine.state.<state_key>_f1`` on every rank, and rank 0
    writes them with :func:`monai_vce.postprocessing.save_thresholds` (JSON keyed by label name, atomic).

    With ``write_on="best"`` the file is written only when this validation is the best so far
    (``engine.state.best_metric_epoch == engine.state.epoch``), so it matches the best checkpoint; attach the
    handler after the key metric is computed. ``"always"`` writes after every validation.

    Args:
        output_path: the thresholds JSON to write (e.g. ``models/thresholds.json``); ``None`` writes nothing.
        min_threshold: lowest allowed threshold.
        max_threshold: highest allowed threshold.
        default_threshold: threshold of classes without any usable positive; ``None``: 0.5 clipped into the range
            (:data:`monai_vce.postprocessing.thresholds.DEFAULT_THRESHOLD`).
        output_transform: maps ``engine.state.output`` to ``(probs, targets)``, batched tensors or lists of
            per-item tensors (decollated output); default ``from_engine(["pred", "label"])``.
        activation: ``None`` when the output holds probabilities, ``"sigmoid"`` when it holds logits.
        write_on: ``"always"`` or ``"best"`` (see above).
        state_key: name of the ``engine.state`` attribute receiving the thresholds.
        metric_name: if set, the mean F1 over classes at the tuned thresholds goes to ``engine.state.metrics``
            under this name.
    """

    def __init__(
        self,
        output_path: str | os.PathLike | None = None,
        min_threshold: float = 0.05,
        max_threshold: float = 0.95,
        default_threshold: float | None = None,
        output_transform: Callable = from_engine(["pred", "label"]),
        activation: str | None = None,
        write_on: str = "always",
        state_key: str = "thresholds",
        metric_name: str | None = None,
    ) -> None:
        if activation not in (None, "sigmoid"):
            raise ValueError(f"activation must be None or 'sigmoid', got {activation!r}")
        if write_on not in _WRITE_ON:
            raise ValueError(f"write_on must be one of {_WRITE_ON}, got {write_on!r}")
        if not 0.0 <= min_threshold <= max_threshold <= 1.0:
            raise ValueError(f"need 0 <= min_threshold <= max_threshold <= 1, got {min_threshold}, {max_threshold}")
        self.output_path = Path(output_path) if output_path is not None else None
        self.min_threshold = float(min_threshold)
        self.max_threshold = float(max_threshold)
        self.default_threshold = default_threshold
        self.output_transform = output_transform
        self.activation = activation
        self.write_on = write_on
        self.state_key = state_key
        self.metric_name = metric_name
        self._probs: list[torch.Tensor] = []
        self._targets: list[torch.Tensor] = []

    def attach(self, engine: Engine) -> None:
        engine.add_event_handler(Events.EPOCH_STARTED, self.reset)
        engine.add_event_handler(Events.ITERATION_COMPLETED, self.collect)
        engine.add_event_handler(Events.EPOCH_COMPLETED, self.compute)

    def reset(self, engine: Engine | None = None) -> None:
        self._probs = []
        self._targets = []

    def collect(self, engine: Engine) -> None:
        probs, targets = self.output_transform(engine.state.output)
        if targets is None or (isinstance(targets, Sequence) and any(t is None for t in targets)):
            raise ValueError("ThresholdOptimizationHandler needs targets ('label') in the validation output")
        p = _stack(probs).detach().float()
        y = _stack(targets).detach().float()
        if self.activation == "sigmoid":
            p = torch.sigmoid(p)
        if p.shape != y.shape or p.ndim != 2:
            raise ValueError(
                f"expected (B, C) probabilities and targets of one shape, got {tuple(p.shape)} and {tuple(y.shape)}"
            )
        self._probs.append(p.cpu())
        self._targets.append(y.cpu())

    def compute(self, engine: Engine) -> None:
        if not self._probs:
            return
        probs = torch.cat(self._probs)
        targets = torch.cat(self._targets)
        probs = evenly_divisible_all_gather(probs, concat=True)
        targets = evenly_divisible_all_gather(targets, concat=True)
        p, y = probs.cpu().numpy(), targets.cpu().numpy()
        if self.activation is None and (p.min() < 0.0 or p.max() > 1.0):
            raise ValueError(
                f"ThresholdOptimizationHandler received values outside [0, 1] (min {p.min():.3g}, max {p.max():.3g}); "
                "pass activation='sigmoid' when the output holds logits"
            )
        thresholds, f1 = optimize_thresholds(
            p, y, self.min_threshold, self.max_threshold, self.default_threshold, return_f1=True
        )
        setattr(engine.state, self.state_key, thresholds)
        setattr(engine.state, f"{self.state_key}_f1", f1)
        if self.metric_name is not None:
            engine.state.metrics[self.metric_name] = float(np.mean(f1))
        best = getattr(engine.state, "best_metric_epoch", None) == engine.state.epoch
        if self.output_path is not None and idist.get_rank() == 0 and (self.write_on == "always" or best):
            save_thresholds(self.output_path, thresholds)
        self.reset()
