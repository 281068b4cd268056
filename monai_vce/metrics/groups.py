"""Metrics split by a grouping of the videos (e.g. by capsule system): temporal mAP and lesion sensitivity per
group, from :func:`~monai_vce.metrics.temporal_map` and :func:`~monai_vce.metrics.lesion_froc`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from .lesions import lesion_froc
from .temporal_map import _as_event_json, temporal_map

__all__ = ["metrics_by_group"]


def metrics_by_group(
    gt: Mapping[str, Any] | str | os.PathLike,
    pred: Mapping[str, Any] | str | os.PathLike,
    groups: Mapping[str, str],
    validate: bool = True,
) -> dict[str, dict[str, Any]]:
    """Temporal mAP and lesion-level sensitivity of each group of ground-truth videos.

    Args:
        gt: ground-truth event JSON (dict) or its file.
        pred: predicted event JSON (dict) or its file.
        groups: ``{video_id: group}``, e.g. :func:`monai_vce.data.video_capsules`; a ground-truth video without
            one is in group ``"unknown"``.
        validate: check both inputs first.

    Returns:
        ``{group: {"videos", "mAP@0.5", "mAP@0.95", "lesions", "lesion_sensitivity" ({rate: value}, pathology
        labels pooled, by overlap), "false_alarms_per_exam_all_events"}}`` in sorted group order.
    """
    gt_obj, _ = _as_event_json(gt, "ground truth", validate)
    pred_obj, _ = _as_event_json(pred, "prediction", validate)
    members: dict[str, list[Mapping[str, Any]]] = {}
    for v in gt_obj["videos"]:
        members.setdefault(str(groups.get(str(v["video_id"]), "unknown")), []).append(v)
    out: dict[str, dict[str, Any]] = {}
    for name in sorted(members):
        sub_gt = {"videos": members[name]}
        ids = {str(v["video_id"]) for v in members[name]}
        sub_pred = {"videos": [v for v in pred_obj["videos"] if str(v["video_id"]) in ids]}
        m = temporal_map(sub_gt, sub_pred, validate=False)
        les = lesion_froc(sub_gt, sub_pred, validate=False)["overall"]["overlap"]
        out[name] = {
            "videos": m["num_videos"],
            "mAP@0.5": m["mAP@0.5"],
            "mAP@0.95": m["mAP@0.95"],
            "lesions": les["lesions"],
            "lesion_sensitivity": les["sensitivity"],
            "false_alarms_per_exam_all_events": les["all_events"]["false_alarms_per_exam"],
        }
    return out
