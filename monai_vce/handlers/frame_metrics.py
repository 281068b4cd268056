"""Frame-level multi-label average precision as an ignite metric, averaged over present classes, per-class values in
``engine.state.metric_details``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from ignite.engine import Engine
from ignite.exceptions import NotComputableError
from ignite.metrics import Metric
from monai.handlers.utils import from_engine

from monai_vce.labels import LABELS
from monai_vce.metrics.frame_average_precision import multilabel_average_precision

from .video_collector import VideoFrameCollector, all_gather_rows, to_numpy

__all__ = ["multilabel_average_precision", "MultiLabelAveragePrecision"]

logger = logging.getLogger(__name__)


class MultiLabelAveragePrecision(Metric):
    """Mean frame-level average precision over the classes with positive frames (the per-class values go to
    ``engine.state.metric_details[name]``).

    Args:
        output_transform: ``engine.state.output -> (probs (B, C), targets (B, C))``; default
            ``monai.handlers.from_engine(["pred", "label"])`` (works with batched and decollated outputs). Not used
            with ``collector``.
        labels: class names of the per-class details (default: the 17 labels).
        device: ignite metric device (accumulation happens on the CPU in numpy).
        collector: the validation's shared :class:`~monai_vce.handlers.VideoFrameCollector` (its frames, each
            once); ``None`` collects the frames here.
    """

    def __init__(
        self,
        output_transform: Callable | None = None,
        labels: tuple[str, ...] = LABELS,
        device: str | torch.device = "cpu",
        collector: VideoFrameCollector | None = None,
    ) -> None:
        self.labels = tuple(labels)
        self.per_class: dict[str, float] = {}
        self.collector = collector
        super().__init__(output_transform=output_transform or from_engine(["pred", "label"]), device=device)

    def reset(self) -> None:
        self._probs: list[np.ndarray] = []
        self._targets: list[np.ndarray] = []

    def iteration_completed(self, engine: Engine) -> None:
        if self.collector is None:  # the shared collector, attached to the evaluator, collects the frames
            super().iteration_completed(engine)

    def update(self, output: Any) -> None:
        """Add one batch ``(probs, targets)``."""
        probs, targets = output
        p, t = to_numpy(probs, np.float32), to_numpy(targets, np.float32)
        self._probs.append(p.reshape(p.shape[0], -1))
        self._targets.append(t.reshape(t.shape[0], -1))

    def compute(self) -> float:
        if self.collector is not None:
            probs, targets = self.collector.frames()
        else:
            if not self._probs:
                raise NotComputableError("MultiLabelAveragePrecision needs at least one batch")
            probs, targets = all_gather_rows(np.concatenate(self._probs), np.concatenate(self._targets))
        if not len(probs):
            raise NotComputableError("MultiLabelAveragePrecision needs at least one frame")
        ap = multilabel_average_precision(probs, targets)
        names = self.labels if len(self.labels) == ap.shape[0] else tuple(str(i) for i in range(ap.shape[0]))
        self.per_class = {n: float(v) for n, v in zip(names, ap, strict=True)}
        valid = ap[~np.isnan(ap)]
        return float(valid.mean()) if valid.size else float("nan")

    def completed(self, engine: Engine, name: str) -> None:
        super().completed(engine, name)
        details = getattr(engine.state, "metric_details", None)
        if isinstance(details, dict):
            details[name] = dict(self.per_class)
