"""The helpers that the bundle's JSON configs call as ``$monai_vce.workflows.<name>``: re-exports of helpers that
live in the package of their concern, and :func:`check_settings`.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import monai.handlers
import torch

from monai_vce.data.dataset_folder import check_folder, galar_datalist, galar_ground_truth, inference_datalist
from monai_vce.data.frames import check_image_size
from monai_vce.data.splits import video_ids
from monai_vce.data.synthetic import ensure_mini_galar
from monai_vce.events.probabilities import completed_videos, model_fingerprint, pending_frames
from monai_vce.inference.driver import REDUCTION_KEYS, check_reduction
from monai_vce.networks.backbone import check_backbone
from monai_vce.postprocessing.decoder import load_decoder as decoder_params
from monai_vce.postprocessing.screening import load_screening_decoder as screening_decoder
from monai_vce.report.evaluation import datalist_ground_truth as ground_truth
from monai_vce.report.evaluation import evaluation_report
from monai_vce.stages import main_process
from monai_vce.temporal.stage import fit_temporal_stage, refiner_fingerprint, refiner_inputs
from monai_vce.utils import check_setting, report_errors_last

__all__ = [
    "config_bundle_root",
    "report_errors_last",
    "galar_datalist",
    "galar_ground_truth",
    "inference_datalist",
    "video_ids",
    "model_fingerprint",
    "pending_frames",
    "completed_videos",
    "ensure_mini_galar",
    "decoder_params",
    "screening_decoder",
    "check_folder",
    "check_backbone",
    "ground_truth",
    "evaluation_report",
    "fit_temporal_stage",
    "refiner_fingerprint",
    "refiner_inputs",
    "SETTINGS",
    "check_settings",
    "logging_on_rank_zero",
    "run_inference",
    "main_process",
]

_PATH: tuple[str, dict[str, Any]] = ("path", {})
_BOOL: tuple[str, dict[str, Any]] = ("bool", {})
_COUNT: tuple[str, dict[str, Any]] = ("int", {"minimum": 1, "maximum": 1 << 20})

#: the bundle's settings that :func:`check_settings` knows: ``name -> (kind, keyword arguments)`` of
#: :func:`monai_vce.utils.check_setting`
SETTINGS: dict[str, tuple[str, dict[str, Any]]] = {
    "bundle_root": _PATH,
    "dataset_dir": _PATH,
    "ckpt_dir": _PATH,
    "output_dir": _PATH,
    "probs_dir": _PATH,
    "events_file": _PATH,
    "model_file": _PATH,
    "decoder_params": ("path", {"optional": True}),
    "screening_decoder_params": ("path", {"optional": True}),
    "screening_events_file": _PATH,
    "screening": _BOOL,
    "review_events": ("str", {"choices": ("screening", "challenge")}),
    "false_alarms_per_exam": ("number", {"minimum": 0, "maximum": 1e6, "optional": True}),
    "screening_calibration": ("str", {"choices": ("platt", "temperature"), "optional": True}),
    "frame_rate": ("number", {"minimum": 1e-3, "maximum": 10_000, "optional": True}),
    "video_cache_dir": ("path", {"optional": True}),
    "batch_size": _COUNT,
    "val_batch_size": _COUNT,
    "num_workers": ("int", {"minimum": 0, "maximum": 1024}),
    "resume": _BOOL,
    "progress": _BOOL,
    "report": _BOOL,
    "review": _BOOL,
    "write_features": _BOOL,
    "check_images": _BOOL,
    "amp": _BOOL,
    "cpu_amp": _BOOL,
    "compile": _BOOL,
    "amp_dtype": ("str", {"choices": ("bfloat16", "float16", "float32")}),
    "bad_frames": ("str", {"choices": ("error", "skip")}),
    "max_epochs": ("int", {"minimum": 1, "maximum": 1 << 20}),
    "samples_per_epoch": ("int", {"minimum": 1, "maximum": 1 << 40}),
    "train_frame_stride": ("int", {"minimum": 1, "maximum": 1 << 20}),
    "val_interval": ("int", {"minimum": 1, "maximum": 1 << 20}),
    "learning_rate": ("number", {"minimum": 0, "maximum": math.inf}),
    "seed": ("int", {"minimum": 0, "maximum": 2**32 - 1}),
}


def config_bundle_root() -> str:
    """The bundle folder whose configs are being run: the parent of ``configs/`` of the running
    ``monai.bundle.ConfigWorkflow`` (``python -m monai.bundle run``, ``monai.bundle.load``), else ``"."``, the
    model zoo's ``bundle_root`` (a ``ConfigParser`` read without a workflow). ``--bundle_root PATH`` overrides it.

    Never another copy of the bundle: ``cd model-zoo && python -m monai.bundle run --config_file
    models/vce/configs/inference.json`` reads ``models/vce/models/model.pt``.

    Example (bundle JSON)::

        "bundle_root": "$monai_vce.workflows.config_bundle_root()"
    """
    from monai.bundle import ConfigWorkflow

    # the workflow parsing the configs is a caller of this expression: MONAI passes the config files' folder to
    # nothing the configs can reference, so it is read from the workflow that evaluates them
    frame = inspect.currentframe()
    try:
        while frame is not None:
            workflow = frame.f_locals.get("self")
            if isinstance(workflow, ConfigWorkflow) and getattr(workflow, "config_root_path", None) is not None:
                return str(Path(workflow.config_root_path).parent)
            frame = frame.f_back
    finally:
        del frame
    return "."


def check_settings(**settings: Any) -> bool:
    """Check the bundle's settings where they enter, before the network is built or a frame is read.

    The configs call it first in ``initialize``, on the settings a user overrides (``--image_size 100000``,
    ``--output_dir 3``, ``--reduction#stride 1.9``), so that a wrong type or range ends in one line naming the
    key instead of a ``TypeError`` deep inside, a 10 GB allocation or a silent fallback to full inference.

    Args:
        settings: ``name=value`` of settings of :data:`SETTINGS`, and ``reduction`` (the mapping of
            :func:`monai_vce.inference.check_reduction`).

    Returns:
        ``True`` (for a config expression).

    Raises:
        ValueError: one line naming the first bad setting; also for a name this function does not know.

    Example (bundle JSON)::

        "initialize": ["$monai_vce.workflows.check_settings(image_size=@image_size, reduction=@reduction)"]
    """
    for name, value in settings.items():
        if name == "reduction":
            if not isinstance(value, Mapping):
                raise ValueError(f"setting 'reduction' must be a mapping, got {type(value).__name__}")
            unknown = sorted(set(value) - set(REDUCTION_KEYS))
            if unknown:
                raise ValueError(f"setting 'reduction' has an unknown key {unknown[0]!r}")
            check_reduction(**value)
        elif name == "image_size":
            # above 8192 one frame alone, or the network's position embedding, takes gigabytes
            check_image_size(value)
        elif name in SETTINGS:
            kind, kwargs = SETTINGS[name]
            check_setting(name, value, kind, **kwargs)
        else:
            raise ValueError(f"check_settings: unknown setting {name!r}; known: {', '.join(SETTINGS)}, reduction")
    return True


def run_inference(evaluator: Any, reduced_inference: Any, cpu_amp: bool = False, amp_dtype: str = "bfloat16") -> Any:
    """Write the run's probability files: with ``reduced_inference`` when its settings reduce, else with the
    evaluator (full inference, under ``torch.inference_mode``, CPU autocast with ``cpu_amp``).

    Example (bundle JSON)::

        "infer": {"_target_": "monai_vce.workflows.run_inference", "evaluator": "@evaluator",
                  "reduced_inference": "@reduced_inference"}
    """
    if reduced_inference.reduced:
        return reduced_inference.run()
    with torch.autocast("cpu", dtype=getattr(torch, amp_dtype), enabled=bool(cpu_amp)), torch.inference_mode():
        return evaluator.run()


def logging_on_rank_zero(handlers: Sequence[Any]) -> list[Any]:
    """``handlers`` without MONAI's ``StatsHandler`` and ``TensorBoardStatsHandler`` on ranks other than 0, so that
    a distributed run logs once (``torch.distributed`` must be initialised).

    Example (bundle JSON)::

        "train#trainer#train_handlers": "$monai_vce.workflows.logging_on_rank_zero(@train#handlers)"
    """
    if torch.distributed.get_rank() == 0:
        return list(handlers)
    logging = (monai.handlers.StatsHandler, monai.handlers.TensorBoardStatsHandler)
    return [h for h in handlers if not isinstance(h, logging)]
