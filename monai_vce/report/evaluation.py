"""Scoring an evaluation run: its event JSON against the ground truth, written next to a report."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from monai_vce.data.splits import group_by_video, video_capsules
from monai_vce.events import load_events, save_events
from monai_vce.events.ground_truth import ground_truth_events
from monai_vce.events.metadata import recorded_frame_units
from monai_vce.events.probabilities import load_video_probs, probability_file
from monai_vce.events.units import FrameUnits, as_frame_units
from monai_vce.labels import LABELS
from monai_vce.metrics import lesion_froc, metrics_by_group, temporal_map
from monai_vce.metrics.calibration import expected_calibration_error
from monai_vce.metrics.frame_average_precision import multilabel_average_precision
from monai_vce.report.summary import write_report
from monai_vce.utils import atomic_write_json

__all__ = ["datalist_ground_truth", "evaluation_report"]

PathLike = str | os.PathLike
logger = logging.getLogger(__name__)


def datalist_ground_truth(
    datalist: Sequence[Mapping[str, Any]], frame_units: FrameUnits | str = FrameUnits.FRAME_INDEX
) -> dict[str, Any]:
    """The challenge event JSON of a labelled frame datalist (:func:`monai_vce.events.ground_truth_events` of
    each video's rows).

    The datalist holds only the label rows whose frame image exists; the ground truth the challenge scores is
    that of all the rows of the labels CSVs (:func:`monai_vce.data.build_ground_truth`), which the bundle uses.

    Args:
        datalist: labelled frame dicts (``label``, ``video_id``, ``frame_index``, ``frame_number``).
        frame_units: ``"frame_index"`` or ``"frame_number"``.
    """
    key = as_frame_units(frame_units).value
    unlabelled = next((d for d in datalist if "label" not in d), None)
    if unlabelled is not None:
        raise ValueError(
            f"datalist item of video {unlabelled.get('video_id')} frame {unlabelled.get(key)} has no 'label': "
            "no ground truth"
        )
    videos = [
        {
            "video_id": vid,
            "events": ground_truth_events(
                np.array([int(d[key]) for d in items], dtype=np.int64),
                np.asarray([d["label"] for d in items], dtype=np.float32),
                video_id=vid,
            ),
        }
        for vid, items in group_by_video(datalist).items()
    ]
    return {"videos": videos}


def _frame_metrics(datalist: Sequence[Mapping[str, Any]], probs_dir: PathLike) -> dict[str, dict[str, float | None]]:
    """Frame-level average precision and calibration error per label of the probability files against the
    datalist's labels: ``{"frame_AP": {label: AP}, "frame_ECE": {label: ECE}}``."""
    probs, targets = [], []
    for vid, items in group_by_video(datalist).items():
        rows = {int(d["frame_index"]): d["label"] for d in items}
        v = load_video_probs(probability_file(probs_dir, vid))
        probs.append(v.probs)
        targets.append(np.asarray([rows[int(i)] for i in v.frame_index], dtype=np.float32))
    p, t = np.concatenate(probs), np.concatenate(targets)
    out = {}
    for key, values in (
        ("frame_AP", multilabel_average_precision(p, t)),
        ("frame_ECE", expected_calibration_error(p, t)),
    ):
        out[key] = {name: (None if np.isnan(a) else float(a)) for name, a in zip(LABELS, values, strict=True)}
    return out


def evaluation_report(
    events_file: PathLike,
    datalist: Sequence[Mapping[str, Any]],
    output_dir: PathLike,
    probs_dir: PathLike | None = None,
    frame_units: FrameUnits | str | None = None,
    draw: bool = True,
    ground_truth: Mapping[str, Any] | None = None,
    protocol: str | None = None,
    report_dir: PathLike | None = None,
) -> dict[str, Any] | None:
    """Score an evaluation's event JSON against the ground truth; print and save the result.

    Writes ``<output_dir>/ground_truth.json`` (with its frame units beside it, ``ground_truth.meta.json``) and
    ``<output_dir>/metrics.json`` (the :func:`monai_vce.metrics.temporal_map` result, plus ``lesions``: the
    :func:`monai_vce.metrics.lesion_froc` result of the pathology labels, ``per_capsule``: the
    :func:`monai_vce.metrics.metrics_by_group` of the datalist's capsules, ``frame_ECE``: the expected calibration
    error of each label's frame probabilities, and ``frame_AP``: the
    frame-level average precision of each label, ``None`` for a label without positive frames, when ``probs_dir``
    is given; and ``frame_units``), and the report of :func:`monai_vce.report.write_report` under ``report_dir``
    (default ``<output_dir>/val_report``, apart from the ``report`` folder of an inference run in the same
    ``output_dir``) when matplotlib is installed. Runs on rank 0 only in distributed runs.

    Args:
        events_file: the evaluation's event JSON.
        datalist: the evaluated frames (their labels give the frame-level AP).
        output_dir: where the files go.
        probs_dir: the evaluation's probability files, for the frame-level AP and the report's traces.
        frame_units: the units of the event files; ``None``: those recorded beside ``events_file`` (its units
            sidecar, :mod:`monai_vce.events.metadata`), else ``"frame_index"``.
        draw: draw the report.
        ground_truth: the ground truth the challenge scores, from the labels CSVs
            (:func:`monai_vce.data.build_ground_truth`); ``None`` builds it from ``datalist``
            (:func:`datalist_ground_truth`).
        protocol: how the events were decoded (e.g. whether the decoder was tuned on the scored videos), stored as
            ``protocol`` in ``metrics.json`` and printed with the scores.
        report_dir: the report's folder; ``None`` for ``<output_dir>/val_report``.

    Returns:
        The metric result (``None`` on other ranks).

    Raises:
        ValueError: the event file records other frame units than ``frame_units``.
    """
    try:
        import torch.distributed as dist  # here, not at the top: the report package does not need torch

        if dist.is_available() and dist.is_initialized() and dist.get_rank() != 0:
            return None
    except ImportError:  # pragma: no cover
        pass
    recorded = recorded_frame_units(events_file, frame_units, "evaluation's prediction")
    units = as_frame_units(frame_units or recorded or FrameUnits.FRAME_INDEX)
    out = Path(output_dir)
    if ground_truth is None:
        gt = datalist_ground_truth(datalist, frame_units=units)
    else:
        wanted = {str(d["video_id"]) for d in datalist}
        gt = {"videos": [v for v in ground_truth["videos"] if str(v["video_id"]) in wanted]}
    pred = load_events(events_file)
    result = temporal_map(gt, pred)
    result["lesions"] = lesion_froc(gt, pred, validate=False)
    result["per_capsule"] = metrics_by_group(gt, pred, video_capsules(datalist), validate=False)
    if protocol is not None:
        result["protocol"] = protocol
    if probs_dir is not None:
        result.update(_frame_metrics(datalist, probs_dir))
    result["frame_units"] = units.value
    save_events(out / "ground_truth.json", gt, frame_units=units)
    atomic_write_json(out / "metrics.json", result)
    summary: dict[str, Any] = {k: result[k] for k in ("mAP@0.5", "mAP@0.95", "protocol") if k in result}
    overlap = result["lesions"]["overall"]["overlap"]
    summary["lesion_sensitivity@4FA"] = overlap["sensitivity"]["4"]
    summary["lesion_sensitivity_all_events"] = overlap["all_events"]["sensitivity"]
    summary["false_alarms_per_exam_all_events"] = overlap["all_events"]["false_alarms_per_exam"]
    print(
        json.dumps(
            {"events_file": str(events_file), "frame_units": units.value, "videos": len(gt["videos"]), **summary}
        ),
        flush=True,
    )
    if draw:
        try:
            report = Path(report_dir) if report_dir is not None else out / "val_report"
            # the report reads the units from the sidecars of the two event files
            write_report(
                events_file, report, gt=out / "ground_truth.json", probs_dir=probs_dir, groups=video_capsules(datalist)
            )
        except ImportError as e:  # matplotlib is an optional extra
            logger.warning(f"report not drawn ({e}); install monai-vce[report] for timelines")
    return result
