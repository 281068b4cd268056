"""The helpers that the bundle's JSON configs call through ``$monai_vce.workflows...`` expressions.

Each helper lives in the package of its concern; this module re-exports them so that existing configs and
``$monai_vce.workflows.x`` expressions keep working:

========================================================  ==============================================
helper                                                    home
========================================================  ==============================================
``default_bundle_root``                                   :mod:`monai_vce.utils`
``check_folder``, ``galar_datalist``,                     :mod:`monai_vce.data.dataset_folder`
``galar_ground_truth``, ``inference_datalist``
``video_ids``                                             :mod:`monai_vce.data.splits`
``model_fingerprint``, ``completed_videos``,              :mod:`monai_vce.events.probabilities`
``pending_frames``                                        (resumable inference)
``ensure_mini_galar``                                     :mod:`monai_vce.data.synthetic`
``decoder_params``                                        :func:`monai_vce.postprocessing.load_decoder`
``check_backbone``                                        :mod:`monai_vce.networks.backbone`
``ground_truth`` (``datalist_ground_truth``),             :mod:`monai_vce.report.evaluation`
``evaluation_report``
``FrameInferer``                                          :mod:`monai_vce.engines.inferer`
``fit_temporal_stage``, ``refiner_fingerprint``,          :mod:`monai_vce.temporal.stage`
``refiner_inputs``
========================================================  ==============================================
"""

from __future__ import annotations

from monai_vce.data.dataset_folder import check_folder, galar_datalist, galar_ground_truth, inference_datalist
from monai_vce.data.splits import video_ids
from monai_vce.data.synthetic import ensure_mini_galar
from monai_vce.engines.inferer import FrameInferer
from monai_vce.events.probabilities import completed_videos, model_fingerprint, pending_frames
from monai_vce.networks.backbone import check_backbone
from monai_vce.postprocessing.decoder import load_decoder as decoder_params
from monai_vce.report.evaluation import datalist_ground_truth as ground_truth
from monai_vce.report.evaluation import evaluation_report
from monai_vce.temporal.stage import fit_temporal_stage, refiner_fingerprint, refiner_inputs
from monai_vce.utils import default_bundle_root

__all__ = [
    "default_bundle_root",
    "galar_datalist",
    "galar_ground_truth",
    "inference_datalist",
    "video_ids",
    "model_fingerprint",
    "pending_frames",
    "completed_videos",
    "ensure_mini_galar",
    "decoder_params",
    "check_folder",
    "check_backbone",
    "ground_truth",
    "evaluation_report",
    "FrameInferer",
    "fit_temporal_stage",
    "refiner_fingerprint",
    "refiner_inputs",
]
