"""The temporal stage: a refiner over a whole video's per-frame outputs, between the frame model and the decoder.

A capsule passes the gut in a fixed order, sections last thousands of frames and findings persist over runs
of frames; a network that sees thousands of frames at once can use all of that, where thresholds and median
filters only smooth. :class:`TemporalRefiner` (a multi-stage temporal convolutional network by default, see
:mod:`~monai_vce.temporal.networks`) maps a video's ``(T, 17)`` frame probabilities and/or ``(T, D)`` frame
features to refined ``(T, 17)`` probabilities, which the usual decoder turns into events.

Typical use (the leakage-free protocol of :mod:`~monai_vce.temporal.protocol`), on the validation videos' frame
outputs (honest: the frame model never trained on them)::

    from monai_vce.postprocessing import tune_decoder
    from monai_vce.temporal import cross_fit_refiner, select_pipeline

    # val = {video_id: (probs, frame_ids, gt_events)}; train_ids = the frame model's training videos
    fit = cross_fit_refiner(val, folds=2, trained_on=train_ids)  # out-of-fold refined probs + fold ensemble
    plain = tune_decoder(val)                                     # the decoder on the frame outputs alone
    temporal = tune_decoder(fit.tuning_videos(val))               # the decoder on out-of-fold refined probs
    if select_pipeline({"frame": plain, "temporal": temporal}, baseline="frame") == "temporal":
        fit.refiner.save("refiner.pt")
        refined = fit.refiner.refine(test_probs)                  # then EventDecoder(temporal)(refined, frame_ids)

Command line: ``python -m monai_vce.temporal fit|refine ...`` (see :mod:`~monai_vce.temporal.__main__`). In the
bundle: ``bundle/configs/temporal_train.json`` (:func:`fit_temporal_stage`) and ``temporal_inference.json``.
"""

from __future__ import annotations

from .losses import FRAME_LOSS_DEFAULTS, REFINER_LOSS_DEFAULTS, TemporalRefinementLoss
from .networks import (
    DilatedResidualLayer,
    LabelwiseTCN,
    MultiStageTCN,
    SingleStageTCN,
    change_point_states,
    network_context,
)
from .protocol import (
    FINAL_REFINERS,
    CrossFitResult,
    LeakageError,
    check_no_leakage,
    cross_fit_refiner,
    fold_provenance,
    kfold_videos,
    select_pipeline,
)
from .refiner import (
    ENSEMBLE_FORMAT,
    INPUTS,
    POSITION_CHANNELS,
    RefinerEnsemble,
    TemporalRefiner,
    input_channels,
    load_refiner_file,
    position_channels,
)
from .stage import fit_temporal_stage, load_refiner, refiner_fingerprint, refiner_inputs
from .training import CROP_SAMPLING, CropSampler, fit_refiner, prepare_videos, refiner_loss

__all__ = [
    "INPUTS",
    "TemporalRefiner",
    "RefinerEnsemble",
    "ENSEMBLE_FORMAT",
    "load_refiner_file",
    "input_channels",
    "POSITION_CHANNELS",
    "position_channels",
    "fit_refiner",
    "CROP_SAMPLING",
    "CropSampler",
    "prepare_videos",
    "refiner_loss",
    "MultiStageTCN",
    "LabelwiseTCN",
    "change_point_states",
    "SingleStageTCN",
    "DilatedResidualLayer",
    "network_context",
    "TemporalRefinementLoss",
    "FRAME_LOSS_DEFAULTS",
    "REFINER_LOSS_DEFAULTS",
    "LeakageError",
    "check_no_leakage",
    "kfold_videos",
    "fold_provenance",
    "CrossFitResult",
    "FINAL_REFINERS",
    "cross_fit_refiner",
    "select_pipeline",
    "fit_temporal_stage",
    "load_refiner",
    "refiner_fingerprint",
    "refiner_inputs",
]
