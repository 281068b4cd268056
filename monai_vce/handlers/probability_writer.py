"""The inference writer: one probability file ``<output_dir>/<video_id>.npz`` per video, and nothing more.

Modelled on MONAI's ``ClassificationSaver``; format in :mod:`monai_vce.events.probabilities`. What follows the
files (refine, decode, report, review) is in :mod:`monai_vce.stages`.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from monai.utils import IgniteInfo, min_version, optional_import

from monai_vce.events.probabilities import Video, probability_file, save_video_probs

from .features import DEFAULT_FEATURE_MODULE, FrameFeatureCapture
from .video_collector import VideoFrameCollector

if TYPE_CHECKING:
    from ignite.engine import Engine
else:
    Engine, _ = optional_import("ignite.engine", IgniteInfo.OPT_IMPORT_VERSION, min_version, "Engine")

__all__ = ["ProbabilityWriter"]

PathLike = str | os.PathLike


class ProbabilityWriter:
    """Event handler writing each video's frame probabilities to ``<output_dir>/<video_id>.npz`` atomically.

    Frames are grouped by video (:class:`VideoFrameCollector`); a file is written as soon as its video is complete
    (single process) or on rank 0 after gathering all ranks (distributed). A file written from part of a video's
    frames is removed when more of its frames arrive later.

    Args:
        output_dir: folder of the per-video ``.npz`` files.
        source: what produced the probabilities (e.g. :func:`monai_vce.events.model_fingerprint`), recorded in
            every file so that a resumed run never reuses another model's files.
        features: also write each frame's pooled image feature (float16 ``(T, D)``), captured from the same
            forward pass (:class:`FrameFeatureCapture`).
        feature_module: the network's submodule whose input is that feature.
        feature_dim: the width the features must have (e.g. a temporal refiner's ``feature_dim``); ``None``: any.
            Checked at the first batch, before any file is written.
        pred_key: key of the probabilities in the engine output (apply the sigmoid in ``postprocessing``).
        output_transform: see :class:`VideoFrameCollector`.
        batch_transform: see :class:`VideoFrameCollector`.
        name: logger name (``None``: the engine's logger).
        frame_rates: ``{video_id: frames per second}`` recorded in each file (see :class:`VideoFrameCollector`).

    Example (bundle JSON)::

        {"_target_": "monai_vce.handlers.ProbabilityWriter", "output_dir": "@probs_dir", "source": "@probs_source"}
    """

    def __init__(
        self,
        output_dir: PathLike,
        source: str = "",
        features: bool = False,
        feature_module: str = DEFAULT_FEATURE_MODULE,
        feature_dim: int | None = None,
        pred_key: str = "pred",
        output_transform: Callable[[Any], Any] | None = None,
        batch_transform: Callable[[Any], Any] | None = None,
        name: str | None = None,
        frame_rates: Mapping[str, float | None] | None = None,
    ) -> None:
        self.output_dir = Path(output_dir)
        self.source = str(source)
        self.logger = logging.getLogger(name)
        self._name = name
        self.feature_capture = FrameFeatureCapture(feature_module, feature_dim=feature_dim) if features else None
        self.collector = VideoFrameCollector(
            self._save_video,
            pred_key=pred_key,
            output_transform=output_transform,
            batch_transform=batch_transform,
            on_discard=self._discard_video,
            features_key=None if self.feature_capture is None else self.feature_capture.output_key,
            frame_rates=frame_rates,
        )
        #: ids of the videos written by this run, in the order written
        self.written: list[str] = []

    def _save_video(self, video: Video) -> None:
        path = save_video_probs(probability_file(self.output_dir, video.video_id), video, source=self.source)
        self.written.append(video.video_id)
        self.logger.info(f"saved probabilities of video {video.video_id} ({len(video)} frames): {path}")

    def _discard_video(self, video_id: str) -> None:
        """Remove the file of a video written from part of its frames (see ``VideoFrameCollector.on_discard``)."""
        probability_file(self.output_dir, video_id).unlink(missing_ok=True)
        if video_id in self.written:
            self.written.remove(video_id)

    def attach(self, engine: Engine) -> None:
        """Attach to an evaluator: collect every iteration and write each video's file when it is complete."""
        if self._name is None:
            self.logger = engine.logger
        if self.feature_capture is not None:
            self.feature_capture.attach(engine)
        self.collector.attach(engine)
