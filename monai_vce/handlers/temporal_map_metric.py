"""An ignite metric reporting the challenge's temporal mAP on whole validation videos during training."""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch
from ignite.engine import Engine
from ignite.exceptions import NotComputableError
from ignite.metrics import Metric
from monai.handlers.utils import from_engine

from monai_vce.events import event_json, frames_to_events
from monai_vce.events.probabilities import Video
from monai_vce.events.units import FrameUnits, as_frame_units
from monai_vce.metrics.temporal_map import temporal_map, tiou_key
from monai_vce.postprocessing.decoder import EventDecoder
from monai_vce.postprocessing.tuning import cross_fitted_events
from monai_vce.utils import natural_key

from .video_collector import VideoFrameCollector, _ids, to_numpy

__all__ = ["TemporalMAPMetric", "HeldOutDecoder", "threshold_decoder"]

logger = logging.getLogger(__name__)

Decoder = Callable[[np.ndarray, np.ndarray], list]


@runtime_checkable
class HeldOutDecoder(Protocol):
    """Decodes a whole set of validation videos, each with parameters not fitted on it (e.g. by cross-fitting).

    :class:`~monai_vce.handlers.DecoderTuningHandler` is one: the metric then scores the decoder the tuner
    fits, from the tuner's own fits.
    """

    def held_out_events(self, inputs: Mapping[str, Video]) -> Mapping[str, list[dict[str, Any]]] | None:
        """``{video_id: events}``, or ``None`` when the videos are too few to hold any out."""
        ...


def threshold_decoder(probs: np.ndarray, frame_ids: np.ndarray, threshold: float = 0.5) -> list[dict[str, Any]]:
    """The simplest decoder: ``probs >= threshold`` then label-set runs, in time order.

    Args:
        probs: (T, 17) per-frame probabilities of one video.
        frame_ids: (T,) increasing frame ids.
        threshold: one probability threshold for every label.
    """
    return frames_to_events(np.asarray(probs) >= threshold, frame_ids, mode="label_set")


class _CrossFitted:
    """``decoder="cross_fitted"``: :func:`~monai_vce.postprocessing.tuning.cross_fitted_events` with defaults."""

    def __init__(self, folds: int, tune_kwargs: Mapping[str, Any]) -> None:
        self.folds = folds
        self.tune_kwargs = dict(tune_kwargs)

    def held_out_events(self, inputs: Mapping[str, Video]) -> Mapping[str, list[dict[str, Any]]] | None:
        return cross_fitted_events(inputs, folds=self.folds, **self.tune_kwargs)


class TemporalMAPMetric(Metric):
    """Temporal mAP (the RARE-VISION challenge's) of whole validation videos, as an ignite metric.

    Videos come from a :class:`~monai_vce.handlers.VideoFrameCollector` (the validation's shared one, or its
    own), their events from ``decoder`` (a fixed decoder, a :class:`HeldOutDecoder` or ``"cross_fitted"``, so
    that no video is scored by parameters fitted on it), and :func:`~monai_vce.metrics.temporal_map` scores them.
    Works with MONAI's ``SupervisedEvaluator`` as ``key_val_metric``. Rationale: ``docs/design/metrics.md``.

    Args:
        decoder: callable ``(probs (T, 17), frame_ids (T,)) -> events`` (e.g. an
            :class:`~monai_vce.postprocessing.EventDecoder`), a :class:`HeldOutDecoder`, ``"cross_fitted"``, or
            ``None`` for :func:`threshold_decoder` at 0.5.
        folds: number of folds of ``"cross_fitted"``.
        tune_kwargs: keyword arguments of :func:`~monai_vce.postprocessing.tune_decoder` for ``"cross_fitted"``
            (default: one round).
        tiou_threshold: the tIoU threshold of the value returned by :meth:`compute` (and stored under the
            metric's name in ``engine.state.metrics``).
        tiou_thresholds: further tIoU thresholds, each stored as ``"<name>_tiou<t>"`` in ``engine.state.metrics``
            (no ``@``: MLflow and TensorBoard accept only plain metric names).
        sigmoid: apply a sigmoid to ``pred`` (when it holds logits rather than probabilities).
        output_transform: ``engine.state.output -> (pred, label)`` or ``(pred, label, video_ids, frame_ids)``;
            default ``monai.handlers.from_engine(["pred", "label"])``. Not used with ``collector``.
        batch_transform: ``engine.state.batch -> (video_ids, frame_ids)``; default
            ``monai.handlers.from_engine([video_key, frame_units])``. Not used with ``collector``.
        video_key: batch key of the video id.
        frame_units: the frame ids events count in, ``"frame_index"`` or ``"frame_number"`` (also the batch key
            of the frame ids); with ``collector``, the collector's units.
        save_details: also store the full :func:`~monai_vce.metrics.temporal_map` result in
            ``engine.state.metric_details[name]`` (MONAI's convention).
        device: ignite metric device (accumulation is on the CPU in numpy whatever it is).
        collector: the validation's :class:`~monai_vce.handlers.VideoFrameCollector` (attached to the evaluator
            as a handler); ``None``: the metric collects on its own.

    Attributes:
        result: the full result of the last :meth:`compute` (``per_video``, ``per_label``, ...).
    """

    def __init__(
        self,
        decoder: Decoder | HeldOutDecoder | str | None = None,
        folds: int = 2,
        tune_kwargs: dict[str, Any] | None = None,
        tiou_threshold: float = 0.5,
        tiou_thresholds: Sequence[float] = (0.5, 0.95),
        sigmoid: bool = False,
        output_transform: Callable | None = None,
        batch_transform: Callable | None = None,
        video_key: str = "video_id",
        frame_units: FrameUnits | str = FrameUnits.FRAME_INDEX,
        save_details: bool = True,
        device: str | torch.device = "cpu",
        collector: VideoFrameCollector | None = None,
    ) -> None:
        if isinstance(decoder, str) and decoder != "cross_fitted":
            raise ValueError(f"decoder must be a callable, 'cross_fitted' or None, got {decoder!r}")
        self.folds = int(folds)
        self.tune_kwargs = {"rounds": 1, **(tune_kwargs or {})}
        if decoder == "cross_fitted":
            decoder = _CrossFitted(self.folds, self.tune_kwargs)
        self.decoder: Any = decoder if decoder is not None else threshold_decoder
        self.tiou_threshold = float(tiou_threshold)
        self.tiou_thresholds = tuple(dict.fromkeys([self.tiou_threshold, *map(float, tiou_thresholds)]))
        self.sigmoid = sigmoid
        units = as_frame_units(frame_units)
        self.batch_transform = batch_transform if batch_transform is not None else from_engine([video_key, units.value])
        self.save_details = save_details
        self.result: dict[str, Any] | None = None
        #: the events the last :meth:`compute` scored, ``{video_id: events}`` in natural video id order (written by
        #: :func:`monai_vce.stages.write_events`)
        self.events: dict[str, list[dict[str, Any]]] | None = None
        #: how the last :meth:`compute` decoded the videos: held out (cross-fitted, or the untuned default decoder when
        #: too few videos), or with the given decoder
        self.protocol: str | None = None
        self._owns_collector = collector is None
        self.collector = (
            collector
            if collector is not None
            else VideoFrameCollector(label_key="label", sigmoid=sigmoid, frame_units=units)
        )
        super().__init__(
            output_transform=output_transform if output_transform is not None else from_engine(["pred", "label"]),
            device=device,
        )

    def reset(self) -> None:
        if getattr(self, "_owns_collector", False):
            self.collector.reset()

    def iteration_completed(self, engine: Engine) -> None:
        if not self._owns_collector:
            return  # the shared collector, attached to the evaluator, collects the frames
        out = self._output_transform(engine.state.output)
        if len(out) == 2:
            video_ids, frames = self.batch_transform(engine.state.batch)
            out = (out[0], out[1], video_ids, frames)
        self.update(out)

    def update(self, output: Sequence[Any]) -> None:
        """Add one batch: ``(pred (B, 17), label (B, 17), video_ids (B,), frame_ids (B,))``."""
        if len(output) != 4:
            raise ValueError(
                f"{type(self).__name__} expects (pred, label, video_ids, frame_ids), got {len(output)} items"
            )
        pred, label, video_ids, frames = output
        self.collector.update(
            _ids(video_ids), to_numpy(pred, np.float32), to_numpy(frames, np.int64), targets=to_numpy(label, np.float32)
        )

    def compute(self) -> float:
        inputs = self.collector.labelled_videos()
        if not inputs:
            raise NotComputableError(f"{type(self).__name__} must have at least one frame before it can be computed")
        gt = {vid: v.events or [] for vid, v in inputs.items()}
        if isinstance(self.decoder, HeldOutDecoder):
            pred = self._held_out(inputs)
        else:
            # an EventDecoder converts windows given in seconds at each video's row rate (decode); the videos'
            # frame ids are those of their ground truth (the collector's units)
            dec = self.decoder
            pred = {
                vid: list(dec.decode(v) if isinstance(dec, EventDecoder) else dec(v.probs, v.frame_ids()))
                for vid, v in inputs.items()
            }
            self.protocol = (
                f"decoded with the given decoder ({getattr(self.decoder, 'source', type(self.decoder).__name__)})"
            )
        self.result = temporal_map(event_json(gt), event_json(pred), tiou_thresholds=self.tiou_thresholds)
        self.events = {vid: pred[vid] for vid in sorted(pred, key=natural_key)}
        return float(self.result[f"mAP@{tiou_key(self.tiou_threshold)}"])

    def _held_out(self, inputs: Mapping[str, Video]) -> dict[str, list]:
        events = self.decoder.held_out_events(inputs)
        folds = getattr(self.decoder, "folds", self.folds)
        if events is None:
            warnings.warn(
                f"{type(self).__name__}: {len(inputs)} validation video(s) cannot be cross-fitted in "
                f"{getattr(self.decoder, 'folds', self.folds)} folds; scoring with the default threshold decoder",
                stacklevel=2,
            )
            self.protocol = (
                f"held out: {len(inputs)} video(s), too few to cross-fit in {folds} folds, decoded by the untuned "
                "default threshold decoder (0.5); nothing was fitted on them"
            )
            return {vid: list(threshold_decoder(v.probs, v.frame_ids())) for vid, v in inputs.items()}
        self.protocol = (
            f"held out: each video decoded by a decoder tuned on the other folds of {folds} folds of the scored videos "
            "(cross-fitting); no parameter was fitted on the video it decodes"
        )
        return {vid: list(events[vid]) for vid in inputs}

    def completed(self, engine: Engine, name: str) -> None:
        value = self.compute()
        engine.state.metrics[name] = value
        assert self.result is not None
        for t in self.tiou_thresholds:
            if t != self.tiou_threshold:
                engine.state.metrics[f"{name}_tiou{tiou_key(t)}"] = float(self.result[f"mAP@{tiou_key(t)}"])
        if self.save_details:
            # MONAI's convention: the details of each metric under its name in engine.state.metric_details
            vars(engine.state).setdefault("metric_details", {})[name] = self.result
