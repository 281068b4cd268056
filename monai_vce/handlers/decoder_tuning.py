"""An ignite handler that fits the event decoder on the validation videos: held-out (cross-fitted) decoding for the
metric, and ``decoder.json`` fitted on all of them.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from monai.utils import IgniteInfo, min_version, optional_import

from monai_vce.events.probabilities import Video
from monai_vce.events.units import FrameUnits, as_frame_units
from monai_vce.labels import LABELS
from monai_vce.postprocessing.decoder import DecoderParams
from monai_vce.postprocessing.recalibration import ReferenceQuantiles
from monai_vce.postprocessing.tuning import cross_fitted_events, tune_decoder

from .thresholds import ThresholdOptimizationHandler
from .video_collector import VideoFrameCollector

Events, _ = optional_import("ignite.engine", IgniteInfo.OPT_IMPORT_VERSION, min_version, "Events")
idist, _ = optional_import("ignite", IgniteInfo.OPT_IMPORT_VERSION, min_version, "distributed")
if TYPE_CHECKING:
    from ignite.engine import Engine
else:
    Engine, _ = optional_import("ignite.engine", IgniteInfo.OPT_IMPORT_VERSION, min_version, "Engine")

__all__ = ["DecoderTuningHandler"]

logger = logging.getLogger(__name__)

_WRITE_ON = ("best", "always")


class DecoderTuningHandler:
    """Fit the event decoder on the validation videos: held out for the metric, on all videos for inference.

    Args:
        params_file: the decoder-parameter JSON to write (atomically), e.g. ``<ckpt_dir>/decoder.json``.
        write_on: ``"best"`` (default): fit and write the parameters only at validations where the evaluator's
            key metric improved, so they match the best checkpoint; ``"always"``: at every validation.
        frame_units: frame ids the tuned decoder will receive, ``"frame_index"`` or ``"frame_number"``; recorded
            in the parameters (``frame_units``) so that inference decodes in the same units. ``None``: the
            collector's.
        thresholds: the validation's :class:`~monai_vce.handlers.ThresholdOptimizationHandler`; every fit then
            starts from F1-optimal per-class thresholds (``DecoderParams.from_thresholds``) instead of 0.5, which
            matters for losses such as the asymmetric focal loss whose probabilities are not centred on 0.5.
            ``None`` starts from the defaults.
        tune_kwargs: more keyword arguments for ``tune_fn`` (grids, rounds, ...).
        tune_fn: the fitting function ``({video_id: Video}, **tune_kwargs) -> DecoderParams`` (the videos carry
            their ground-truth ``events`` and its ``units``, ``frame_units``); default :func:`monai_vce.postprocessing.tune_decoder`.
        folds: folds of the held-out decoding (:meth:`held_out_events`).
        seed: seed of the fold assignment.
        collector: the validation's shared :class:`~monai_vce.handlers.VideoFrameCollector`; ``None`` creates
            one (with ``pred_key``, ``label_key``) and attaches it with this handler.
        pred_key: key of the ``(B, 17)`` probabilities in the engine output, for an own collector.
        label_key: key of the ``(B, 17)`` targets in the engine output (or the batch), for an own collector.
        name: logger name (``None``: the engine's logger).
        screening_file: also fit the screening profile (``tune_decoder(profile="screening")``, from the fitted
            challenge parameters) on all videos and write it here, e.g. ``<ckpt_dir>/screening_decoder.json``;
            ``None``: not fitted.
        screening_kwargs: more keyword arguments of the screening fit (``false_alarms_per_exam``, ...).
        reference_file: also write the validation videos' score distribution (``ReferenceQuantiles`` JSON) here,
            e.g. ``<ckpt_dir>/reference_quantiles.json``, for per-exam recalibration at inference; ``None``: not.

    Attributes:
        params: the last parameters fitted on all videos (``None`` before the first fit).
        fits: number of fits of the current validation (one per fold of the held-out decoding, one more when
            the parameters are written).
    """

    def __init__(
        self,
        params_file: str | os.PathLike,
        write_on: str = "best",
        frame_units: FrameUnits | str | None = None,
        thresholds: ThresholdOptimizationHandler | None = None,
        tune_kwargs: Mapping[str, Any] | None = None,
        tune_fn: Callable[..., Any] | None = None,
        folds: int = 2,
        seed: int = 0,
        collector: VideoFrameCollector | None = None,
        pred_key: str = "pred",
        label_key: str = "label",
        name: str | None = None,
        screening_file: str | os.PathLike | None = None,
        screening_kwargs: Mapping[str, Any] | None = None,
        reference_file: str | os.PathLike | None = None,
    ) -> None:
        if write_on not in _WRITE_ON:
            raise ValueError(f"write_on must be one of {_WRITE_ON}, got {write_on!r}")
        units = None if frame_units is None else as_frame_units(frame_units)
        if collector is None:
            collector = VideoFrameCollector(
                pred_key=pred_key, label_key=label_key, frame_units=units or FrameUnits.FRAME_INDEX
            )
        elif units is not None and units is not collector.frame_units:
            raise ValueError(
                f"frame_units {units.value!r} differs from the collector's {collector.frame_units.value!r}: the "
                "decoder would be fitted in other units than the ground truth it is scored against"
            )
        self.params_file = Path(params_file)
        self.screening_file = None if screening_file in (None, "") else Path(screening_file)  # type: ignore[arg-type]
        self.screening_kwargs = dict(screening_kwargs or {})
        self.reference_file = None if reference_file in (None, "") else Path(reference_file)  # type: ignore[arg-type]
        self.write_on = write_on
        self.collector = collector
        self.frame_units = collector.frame_units
        self.thresholds = thresholds
        self.tune_kwargs = dict(tune_kwargs or {})
        self.tune_fn = tune_fn if tune_fn is not None else tune_decoder
        self.folds = int(folds)
        self.seed = int(seed)
        self.logger = logging.getLogger(name)
        self._name = name
        self._held_out: tuple[int, dict[str, list[dict[str, Any]]] | None] | None = None
        self._generation = -1
        self.fits = 0
        self.params: Any = None

    # --- fitting -----------------------------------------------------------------------------------------------
    def _count(self) -> None:
        if self._generation != self.collector.generation:
            self._generation, self.fits = self.collector.generation, 0
        self.fits += 1

    def _base(self, thresholds: Any) -> DecoderParams | None:
        if thresholds is None or "base" in self.tune_kwargs:
            return None
        if not isinstance(thresholds, Mapping):
            values = np.asarray(thresholds, dtype=float).ravel()
            thresholds = {name: float(t) for name, t in zip(LABELS, values, strict=True)}
        return DecoderParams.from_thresholds(thresholds)

    def fit(self, videos: Mapping[str, Video], thresholds: Any = None) -> DecoderParams:
        """Fit the decoder on ``videos`` (``{video_id: Video}`` with ground-truth events, as the collector's
        :meth:`~monai_vce.handlers.VideoFrameCollector.labelled_videos`).

        Args:
            videos: the videos to fit on.
            thresholds: optional per-class starting thresholds, ``(17,)`` in ``LABELS`` order or ``{label: value}``.
        """
        kwargs = dict(self.tune_kwargs)
        base = self._base(thresholds)
        if base is not None:
            kwargs["base"] = base
        self._count()
        result = self.tune_fn(dict(videos), **kwargs)
        params = result[0] if isinstance(result, tuple) else result
        return params if isinstance(params, DecoderParams) else DecoderParams(params)

    def _fold_fit(self, train: dict[str, Video]) -> DecoderParams:
        thresholds = None
        if self.thresholds is not None:
            videos = self.collector.videos()
            probs = np.concatenate([videos[v].probs for v in train])
            targets = np.concatenate([_targets(videos[v]) for v in train])
            thresholds = self.thresholds.fit(probs, targets)[0]
        return self.fit(train, thresholds)

    def held_out_events(self, inputs: Mapping[str, Video]) -> dict[str, list[dict[str, Any]]] | None:
        """Every validation video decoded with the decoder fitted on the other folds (``None``: too few videos).

        Computed once per validation (the collector's epoch), whoever asks first.
        """
        generation = self.collector.generation
        if self._held_out is None or self._held_out[0] != generation:
            events = cross_fitted_events(inputs, folds=self.folds, seed=self.seed, fit=self._fold_fit)
            self._held_out = (generation, events)
        return self._held_out[1]

    # --- events ------------------------------------------------------------------------------------------------
    def _should_write(self, engine: Engine) -> bool:
        if self.write_on == "always":
            return True
        return getattr(engine.state, "best_metric_epoch", -1) == engine.state.epoch

    def _epoch_completed(self, engine: Engine) -> None:
        if not self._should_write(engine):
            return
        # on every rank: the first request of an epoch gathers the ranks' frames
        inputs = self.collector.labelled_videos()
        thresholds = self.thresholds.thresholds() if self.thresholds is not None else None
        if idist.get_rank() == 0 and inputs:
            self.fit_and_save(inputs, thresholds)

    def fit_and_save(self, inputs: Mapping[str, Video], thresholds: Any = None) -> DecoderParams:
        """Fit the decoder on every video of ``inputs`` and write ``params_file``; returns the parameters."""
        params = self.fit(inputs, thresholds)
        self.params_file.parent.mkdir(parents=True, exist_ok=True)
        params.save(self.params_file)
        self.params = params
        fit = params.get("fit", {})
        score = f", tuned mAP@0.5 {fit['mAP@0.5']:.4f}" if isinstance(fit.get("mAP@0.5"), (int, float)) else ""
        self.logger.info(
            f"decoder tuned on {len(inputs)} validation videos{score}, parameters saved: {self.params_file}"
        )
        if self.reference_file is not None:
            reference = ReferenceQuantiles.from_probabilities(v.probs for v in inputs.values())
            reference.save(self.reference_file)
            self.logger.info(f"validation score distribution (per-exam recalibration) saved: {self.reference_file}")
        if self.screening_file is not None:
            screening = tune_decoder(dict(inputs), base=params, profile="screening", **self.screening_kwargs)
            screening.save(self.screening_file)
            expected = screening["fit"]["screening"]["expected"]
            self.logger.info(
                f"screening decoder fitted at {screening['fit']['false_alarms_per_exam']:g} false alarms per exam "
                f"(validation: {expected['false_alarms_per_exam']:.2f} per exam, lesion sensitivity "
                f"{expected['sensitivity']:.3f}), saved: {self.screening_file}"
            )
        return params

    def attach(self, engine: Engine) -> None:
        """Attach to the validation evaluator (and the collector with it)."""
        if self._name is None:
            self.logger = engine.logger
        self.collector.attach(engine)
        if not engine.has_event_handler(self._epoch_completed, Events.EPOCH_COMPLETED):
            engine.add_event_handler(Events.EPOCH_COMPLETED, self._epoch_completed)


def _targets(video: Video) -> np.ndarray:
    if video.targets is None:
        raise ValueError(f"video {video.video_id}: no targets collected; the F1 thresholds need them")
    return video.targets
