"""The temporal stage: a refiner over a whole video's frame outputs, between the frame model and the decoder, with
its leakage-free fitting protocol. Reference: MS-TCN (Farha and Gall, CVPR 2019).
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
