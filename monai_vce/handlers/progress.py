"""A progress bar counting frames and videos (frames/s) for ignite engines: inference, evaluation, training."""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from monai.utils import IgniteInfo, min_version, optional_import

Events, _ = optional_import("ignite.engine", IgniteInfo.OPT_IMPORT_VERSION, min_version, "Events")
if TYPE_CHECKING:
    from ignite.engine import Engine
else:
    Engine, _ = optional_import("ignite.engine", IgniteInfo.OPT_IMPORT_VERSION, min_version, "Engine")

__all__ = ["FrameProgressHandler"]

logger = logging.getLogger(__name__)


class FrameProgressHandler:
    """Shows frames done / total, frames/s, videos started / total and the current video while an engine runs.

    ignite's ``ProgressBar`` counts iterations; a frame count is what matters here (frames/s is comparable
    across batch sizes and the last batch of a run is short), so this handler drives ``tqdm`` itself. The bar
    is drawn only when ``enabled`` and ``stderr`` is a terminal (logs and CI stay clean); a one-line summary
    (frames, videos, seconds, frames/s) is logged at the end of every epoch either way.

    Totals come from the engine's DataLoader: frames from its sampler length, videos from the distinct
    ``video_id`` values of ``dataloader.dataset.data`` when the sampler is sequential (inference order).

    Args:
        enabled: draw the bar (on a terminal); ``False`` keeps only the summary line.
        video_key: batch key holding each frame's video id.
        image_key: batch key of the frames, used to count frames when ``video_key`` is absent.
        desc: label in front of the bar.
        name: logger name for the summary; defaults to ``engine.logger``.
        log_summary: log the summary line at the end of each epoch.
        count_videos: count videos (frames of a video arrive together, as in inference and validation); set
            ``False`` for training, whose sampler draws frames of any video in any order.

    Example::

        FrameProgressHandler(desc="inference").attach(evaluator)
    """

    def __init__(
        self,
        enabled: bool = True,
        video_key: str = "video_id",
        image_key: str = "image",
        desc: str = "frames",
        name: str | None = None,
        log_summary: bool = True,
        count_videos: bool = True,
    ) -> None:
        self.enabled = enabled
        self.video_key = video_key
        self.image_key = image_key
        self.desc = desc
        self.logger = logging.getLogger(name) if name is not None else None
        self.log_summary = log_summary
        self.count_videos = count_videos
        self._bar: Any = None
        self.frames = 0
        self.videos = 0
        self.total_videos: int | None = None
        self._last_video: Any = None
        self._t0 = 0.0

    def attach(self, engine: Engine) -> None:
        """Register the handler's events on ``engine``."""
        if self.logger is None:
            self.logger = engine.logger
        engine.add_event_handler(Events.EPOCH_STARTED, self.epoch_started)
        engine.add_event_handler(Events.ITERATION_COMPLETED, self.iteration_completed)
        engine.add_event_handler(Events.EPOCH_COMPLETED, self.epoch_completed)
        engine.add_event_handler(Events.EXCEPTION_RAISED, self.exception_raised)
        engine.add_event_handler(Events.TERMINATE, self.close)

    @property
    def show(self) -> bool:
        """Whether a bar is drawn: enabled and writing to a terminal."""
        return bool(self.enabled) and sys.stderr.isatty()

    def _totals(self, engine: Engine) -> tuple[int | None, int | None]:
        import torch

        loader = getattr(engine.state, "dataloader", None)
        sampler = getattr(loader, "sampler", None)
        try:
            frames = len(sampler) if sampler is not None else None
        except TypeError:
            frames = None
        videos = None
        data = getattr(getattr(loader, "dataset", None), "data", None)
        if isinstance(sampler, torch.utils.data.SequentialSampler) and isinstance(data, Sequence):
            try:
                videos = len({item[self.video_key] for item in data})
            except (KeyError, TypeError):
                videos = None
        return frames, videos

    def epoch_started(self, engine: Engine) -> None:
        """Reset the counters and open a bar."""
        from tqdm.auto import tqdm

        self.close()
        total, self.total_videos = self._totals(engine)
        self.frames = self.videos = 0
        self._last_video = None
        self._t0 = time.perf_counter()
        self._bar = tqdm(
            total=total, unit="frame", desc=self.desc, disable=not self.show, dynamic_ncols=True, leave=True
        )

    def _count(self, batch: Any) -> tuple[int, list]:
        if isinstance(batch, (list, tuple)) and batch and isinstance(batch[0], dict):
            # a decollated batch (MONAI engines with decollate=True): one dict per frame
            ids = [item.get(self.video_key) for item in batch]
            return len(batch), ([] if any(i is None for i in ids) or not self.count_videos else ids)
        found = batch.get(self.video_key) if isinstance(batch, dict) and self.count_videos else None
        if found is not None:
            ids = found.tolist() if hasattr(found, "tolist") else list(found)
            return len(ids), ids
        image: Any = batch.get(self.image_key) if isinstance(batch, dict) else batch
        return (int(image.shape[0]) if hasattr(image, "shape") else 0), []

    def iteration_completed(self, engine: Engine) -> None:
        """Count the batch's frames and the videos that start in it."""
        n, ids = self._count(engine.state.batch)
        for vid in ids:  # at most batch-size string comparisons; frames of a video arrive in order
            if vid != self._last_video:
                self.videos += 1
                self._last_video = vid
        self.frames += n
        if self._bar is not None:
            self._bar.update(n)
            if ids and self.count_videos:
                videos = f"{self.videos}/{self.total_videos}" if self.total_videos else str(self.videos)
                self._bar.set_postfix(videos=videos, video=str(self._last_video), refresh=False)

    def epoch_completed(self, engine: Engine) -> None:
        """Close the bar and log the summary line."""
        self.close()
        if self.log_summary and self.logger is not None:
            secs = max(time.perf_counter() - self._t0, 1e-9)
            videos = f", {self.videos} videos" if self.count_videos else ""
            self.logger.info(
                f"{self.desc}: {self.frames} frames{videos} in {secs:.1f} s ({self.frames / secs:.1f} frames/s)"
            )

    @property
    def frames_per_second(self) -> float:
        """Frames per second since the epoch started."""
        return self.frames / max(time.perf_counter() - self._t0, 1e-9)

    def exception_raised(self, engine: Engine, e: Exception) -> None:
        """Close the bar and re-raise: ignite swallows exceptions once any handler listens for them."""
        self.close()
        raise e

    def close(self, *args: Any) -> None:
        """Close the bar if open (also on exceptions and termination)."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None
