"""Tune per-class decision thresholds at the end of each validation run."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import ignite.distributed as idist
import numpy as np
import torch
from ignite.engine import Engine, Events
from monai.handlers import from_engine

from monai_vce.postprocessing.thresholds import optimize_thresholds, save_thresholds

from .video_collector import VideoFrameCollector, all_gather_rows

__all__ = ["ThresholdOptimizationHandler"]

logger = logging.getLogger(__name__)

_WRITE_ON = ("always", "best")


def _stack(values: Any) -> torch.Tensor:
    """A batch tensor from a batched tensor or from decollated per-item tensors."""
    if isinstance(values, torch.Tensor):
        return values
    return torch.stack([torch.as_tensor(v) for v in values])


class ThresholdOptimizationHandler:
    """Fit the F1-optimal decision threshold of each class on the validation frames.

    Attach it to the validation evaluator. At ``EPOCH_COMPLETED`` it runs
    :func:`monai_vce.postprocessing.optimize_thresholds` on every validation frame and rank 0 writes the result
    with :func:`monai_vce.postprocessing.save_thresholds` (JSON keyed by label name, atomic). The thresholds are
    computed once per validation, when first asked for (:meth:`thresholds`), so the decoder tuner that starts from
    them (:class:`~monai_vce.handlers.DecoderTuningHandler`, given this handler as ``thresholds``) does not
    depend on the order of the handlers. They are also left in ``engine.state.<state_key>`` (and their F1 values
    in ``engine.state.<state_key>_f1``) for logging.

    The frames come from ``collector``, the validation's shared :class:`~monai_vce.handlers.VideoFrameCollector`
    (the bundle's), or, without it, from ``engine.state.output`` through ``output_transform`` at every iteration.

    With ``write_on="best"`` the file is written only when this validation is the best so far
    (``engine.state.best_metric_epoch == engine.state.epoch``, which MONAI sets after computing the key metric),
    so it matches the best checkpoint; ``"always"`` writes after every validation.

    Args:
        output_path: the thresholds JSON to write (e.g. ``models/thresholds.json``); ``None`` writes nothing.
        min_threshold: lowest allowed threshold.
        max_threshold: highest allowed threshold.
        default_threshold: threshold of classes without any usable positive; ``None``: 0.5 clipped into the range
            (:data:`monai_vce.postprocessing.thresholds.DEFAULT_THRESHOLD`).
        output_transform: maps ``engine.state.output`` to ``(probs, targets)``, batched tensors or lists of
            per-item tensors (decollated output); default ``from_engine(["pred", "label"])``. Not used with
            ``collector``.
        sigmoid: the output holds logits: apply a sigmoid. Not used with ``collector`` (the collector's own
            ``sigmoid`` applies).
        write_on: ``"always"`` or ``"best"`` (see above).
        state_key: name of the ``engine.state`` attribute receiving the thresholds.
        metric_name: if set, the mean F1 over classes at the tuned thresholds goes to ``engine.state.metrics``
            under this name.
        collector: the validation's shared collector; ``None`` collects the frames here.
        name: logger name (``None``: the engine's logger).
        search: ``(probs, targets) -> (thresholds, f1)`` run on the validation frames instead of the built-in
            search (then the range and ``default_threshold`` are unused); e.g. in a bundle
            ``{"_target_": "monai_vce.postprocessing.grid_thresholds", "_mode_": "callable"}``.
    """

    def __init__(
        self,
        output_path: str | os.PathLike | None = None,
        min_threshold: float = 0.05,
        max_threshold: float = 0.95,
        default_threshold: float | None = None,
        output_transform: Callable | None = None,
        sigmoid: bool = False,
        write_on: str = "always",
        state_key: str = "thresholds",
        metric_name: str | None = None,
        collector: VideoFrameCollector | None = None,
        name: str | None = None,
        search: Callable[[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]] | None = None,
    ) -> None:
        if write_on not in _WRITE_ON:
            raise ValueError(f"write_on must be one of {_WRITE_ON}, got {write_on!r}")
        if not 0.0 <= min_threshold <= max_threshold <= 1.0:
            raise ValueError(f"need 0 <= min_threshold <= max_threshold <= 1, got {min_threshold}, {max_threshold}")
        self.output_path = Path(output_path) if output_path is not None else None
        self.min_threshold = float(min_threshold)
        self.max_threshold = float(max_threshold)
        self.default_threshold = default_threshold
        self.output_transform = output_transform if output_transform is not None else from_engine(["pred", "label"])
        self.sigmoid = bool(sigmoid)
        self.write_on = write_on
        self.state_key = state_key
        self.metric_name = metric_name
        self.collector = collector
        self._probs: list[torch.Tensor] = []
        self._targets: list[torch.Tensor] = []
        self._result: tuple[Any, np.ndarray, np.ndarray] | None = None  # (generation, thresholds, f1)
        self.logger = logging.getLogger(name)
        self._name = name
        self.search = search

    def attach(self, engine: Engine) -> None:
        if self._name is None:
            self.logger = engine.logger
        engine.add_event_handler(Events.EPOCH_STARTED, self.reset)
        if self.collector is None:
            engine.add_event_handler(Events.ITERATION_COMPLETED, self.collect)
        else:
            self.collector.attach(engine)
        engine.add_event_handler(Events.EPOCH_COMPLETED, self.compute)

    def reset(self, engine: Engine | None = None) -> None:
        self._probs = []
        self._targets = []
        self._result = None

    def collect(self, engine: Engine) -> None:
        probs, targets = self.output_transform(engine.state.output)
        if targets is None or (isinstance(targets, Sequence) and any(t is None for t in targets)):
            raise ValueError("ThresholdOptimizationHandler needs targets ('label') in the validation output")
        p = _stack(probs).detach().float()
        y = _stack(targets).detach().float()
        if self.sigmoid:
            p = torch.sigmoid(p)
        if p.shape != y.shape or p.ndim != 2:
            raise ValueError(
                f"expected (B, C) probabilities and targets of one shape, got {tuple(p.shape)} and {tuple(y.shape)}"
            )
        self._probs.append(p.cpu())
        self._targets.append(y.cpu())

    def fit(self, probs: np.ndarray, targets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(thresholds, f1)`` of :func:`~monai_vce.postprocessing.optimize_thresholds` with this handler's range."""
        if probs.size and (probs.min() < 0.0 or probs.max() > 1.0):
            raise ValueError(
                f"ThresholdOptimizationHandler received values outside [0, 1] (min {probs.min():.3g}, max "
                f"{probs.max():.3g}); pass sigmoid=True when the output holds logits"
            )
        if self.search is not None:
            t, f1 = self.search(probs, targets)
            return np.asarray(t, dtype=np.float64), np.asarray(f1, dtype=np.float64)
        out = optimize_thresholds(
            probs, targets, self.min_threshold, self.max_threshold, self.default_threshold, return_f1=True
        )
        return out  # type: ignore[return-value]

    def _frames(self) -> tuple[np.ndarray, np.ndarray] | None:
        if self.collector is not None:
            return self.collector.frames()
        if not self._probs:
            return None
        probs = torch.cat(self._probs).numpy()
        targets = torch.cat(self._targets).numpy()
        return all_gather_rows(probs, targets)  # type: ignore[return-value]

    def thresholds(self) -> np.ndarray | None:
        """The validation's thresholds ``(C,)``, computed on the first request of the validation (every rank)."""
        generation = self.collector.generation if self.collector is not None else None
        if self._result is None or self._result[0] != generation:
            frames = self._frames()
            if frames is None:
                return None
            self._result = (generation, *self.fit(*frames))
        return self._result[1]

    def compute(self, engine: Engine) -> None:
        thresholds = self.thresholds()
        if thresholds is None:
            return
        assert self._result is not None
        f1 = self._result[2]
        setattr(engine.state, self.state_key, thresholds)
        setattr(engine.state, f"{self.state_key}_f1", f1)
        if self.metric_name is not None:
            engine.state.metrics[self.metric_name] = float(np.mean(f1))
        best = getattr(engine.state, "best_metric_epoch", None) == engine.state.epoch
        if self.output_path is not None and idist.get_rank() == 0 and (self.write_on == "always" or best):
            save_thresholds(self.output_path, thresholds)
            self.logger.info(f"per-label F1-optimal thresholds saved: {self.output_path}")
        self._probs, self._targets = [], []
