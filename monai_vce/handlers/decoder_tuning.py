"""An ignite handler that fits the event decoder on the validation videos and saves its parameters.

Attached to the validation evaluator, :class:`DecoderTuningHandler` collects the frame probabilities and
targets of whole validation videos (:class:`~monai_vce.handlers.event_writer.VideoFrameCollector`), and at
the end of a validation run fits every decoder parameter by maximising the temporal mAP of the decoded
events against the videos' ground truth (:func:`monai_vce.postprocessing.tuning.tune_decoder`). By default it
tunes only when the evaluator's key metric improved, so the saved parameters belong to the saved best model,
and writes them next to the checkpoint (``decoder.json``), where inference reads them.
"""

from __future__ import annotations

import inspect
import logging
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from monai.utils import IgniteInfo, min_version, optional_import

from .event_writer import VideoArrays, VideoFrameCollector

Events, _ = optional_import("ignite.engine", IgniteInfo.OPT_IMPORT_VERSION, min_version, "Events")
idist, _ = optional_import("ignite", IgniteInfo.OPT_IMPORT_VERSION, min_version, "distributed")
if TYPE_CHECKING:
    from ignite.engine import Engine
else:
    Engine, _ = optional_import("ignite.engine", IgniteInfo.OPT_IMPORT_VERSION, min_version, "Engine")

__all__ = ["DecoderTuningHandler"]

_WHEN = ("best", "always")


class DecoderTuningHandler:
    """Fit the event decoder on the validation videos at the end of validation and save its parameters.

    Args:
        params_file: the decoder-parameter JSON to write (atomically), e.g. ``<ckpt_dir>/decoder.json``.
        when: ``"best"`` (default): tune only at validations where the evaluator's key metric improved, so
            the parameters match the best checkpoint; ``"always"``: at every validation.
        units: frame ids the tuned decoder will receive: ``"index"`` or ``"frame_number"``; recorded in the
            parameters (``frame_units``) so that inference decodes in the same units.
        thresholds_key: name of the ``engine.state`` attribute holding per-class decision thresholds tuned earlier
            in the same validation (``ThresholdOptimizationHandler``'s ``state_key``); when present, the search
            starts from them (``DecoderParams.from_thresholds``) instead of 0.5 for every class, which matters
            for losses such as the asymmetric focal loss whose probabilities are not centred on 0.5.
            ``None`` always starts from the defaults.
        tune_kwargs: more keyword arguments for ``tune_decoder`` (grids, rounds, ...).
        tune_fn: the fitting function ``({video_id: (probs, frame_ids, gt_events)}, **tune_kwargs) ->
            DecoderParams``; default :func:`monai_vce.postprocessing.tuning.tune_decoder`.
        pred_key: key of the ``(B, 17)`` probabilities in the engine output (apply the sigmoid in
            ``postprocessing``).
        label_key: key of the ``(B, 17)`` targets in the engine output (or the batch).
        name: logger name (``None``: the engine's logger).

    Attributes:
        params: the last fitted parameters (``None`` before the first fit).
    """

    def __init__(
        self,
        params_file: str | os.PathLike,
        when: str = "best",
        units: str = "index",
        thresholds_key: str | None = "thresholds",
        tune_kwargs: Mapping[str, Any] | None = None,
        tune_fn: Callable[..., Any] | None = None,
        pred_key: str = "pred",
        label_key: str = "label",
        name: str | None = None,
    ) -> None:
        if when not in _WHEN:
            raise ValueError(f"when must be one of {_WHEN}, got {when!r}")
        if units not in ("index", "frame_number"):
            raise ValueError(f"units must be 'index' or 'frame_number', got {units!r}")
        self.params_file = Path(params_file)
        self.when = when
        self.units = units
        self.thresholds_key = thresholds_key
        self.tune_kwargs = dict(tune_kwargs or {})
        self.tune_fn = tune_fn
        self.logger = logging.getLogger(name)
        self._name = name
        self._videos: dict[str, VideoArrays] = {}
        # tuning needs every video at once, so no streaming hand-over
        self.collector = VideoFrameCollector(self._keep, pred_key=pred_key, label_key=label_key, streaming=False)
        self.params: Any = None

    def _keep(self, video: VideoArrays) -> None:
        if video.labels is None:
            raise ValueError(
                f"video {video.video_id}: no targets in the validation output; decoder tuning needs labelled frames"
            )
        self._videos[video.video_id] = video

    def _should_tune(self, engine: Engine) -> bool:
        if self.when == "always":
            return True
        best_epoch = getattr(engine.state, "best_metric_epoch", -1)
        return best_epoch == engine.state.epoch

    def _epoch_started(self, engine: Engine) -> None:
        self.collector.reset()
        self._videos = {}

    def _epoch_completed(self, engine: Engine) -> None:
        self._videos = {}
        tune = self._should_tune(engine)
        if not tune:
            # every rank must still take part in the gather of the collector when it runs
            self.collector.reset()
            return
        self.collector.epoch_completed(engine)
        if idist.get_rank() == 0 and self._videos:
            thresholds = getattr(engine.state, self.thresholds_key, None) if self.thresholds_key else None
            self.fit_and_save(thresholds)
        self._videos = {}

    def fit_and_save(self, thresholds: Any = None) -> Any:
        """Fit the decoder on the collected videos and write ``params_file``; returns the parameters.

        Args:
            thresholds: optional per-class starting thresholds, ``(17,)`` in ``LABELS`` order or ``{label: value}``.
        """
        from monai_vce.events import frames_to_events

        tune_fn = self.tune_fn
        if tune_fn is None:
            from monai_vce.postprocessing.tuning import tune_decoder as tune_fn
        # (probs, frame ids, ground-truth events) per video; the ground truth is the label-set runs of the
        # frame targets, exactly how the challenge builds it
        videos: dict[str, tuple[np.ndarray, np.ndarray, list]] = {}
        for vid, v in self._videos.items():
            ids = v.frame_index if self.units == "index" else v.frame_number
            videos[vid] = (v.probs, ids, frames_to_events(v.labels >= 0.5, ids, mode="label_set"))
        kwargs = dict(self.tune_kwargs)
        if thresholds is not None and "base" not in kwargs:
            from monai_vce.labels import LABELS
            from monai_vce.postprocessing.decoder import DecoderParams

            if not isinstance(thresholds, Mapping):
                thresholds = {name: float(t) for name, t in zip(LABELS, np.asarray(thresholds, dtype=float).ravel())}
            kwargs["base"] = DecoderParams.from_thresholds(thresholds)
        if "frame_units" in inspect.signature(tune_fn).parameters:
            kwargs.setdefault("frame_units", self.units)
        result = tune_fn(videos, **kwargs)
        params = result[0] if isinstance(result, tuple) else result
        self.params_file.parent.mkdir(parents=True, exist_ok=True)
        params.save(self.params_file)
        self.params = params
        fit = params.data.get("fit", {}) if isinstance(getattr(params, "data", None), dict) else {}
        score = f", tuned mAP@0.5 {fit['mAP@0.5']:.4f}" if isinstance(fit.get("mAP@0.5"), (int, float)) else ""
        self.logger.info(
            f"decoder tuned on {len(videos)} validation videos{score}, parameters saved: {self.params_file}"
        )
        return params

    def attach(self, engine: Engine) -> None:
        """Attach to the validation evaluator."""
        if self._name is None:
            self.logger = engine.logger
        if not engine.has_event_handler(self.collector.iteration_completed, Events.ITERATION_COMPLETED):
            engine.add_event_handler(Events.ITERATION_COMPLETED, self.collector.iteration_completed)
        if not engine.has_event_handler(self._epoch_started, Events.EPOCH_STARTED):
            engine.add_event_handler(Events.EPOCH_STARTED, self._epoch_started)
        if not engine.has_event_handler(self._epoch_completed, Events.EPOCH_COMPLETED):
            engine.add_event_handler(Events.EPOCH_COMPLETED, self._epoch_completed)
