"""Lesion-level metrics of event JSON files: event-level sensitivity at fixed false-alarm rates per exam (FROC) and
reading workload, pooled over exams. Definitions: ``docs/design/metrics.md``; reference: Chakraborty, "Free-response
methodology", Med. Phys. 1989, and the CAMELYON16 FROC score.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from monai_vce.labels import PATHOLOGY

from .temporal_map import _as_event_json, _check_labels, _videos, segment_tiou

__all__ = ["FALSE_ALARM_RATES", "LESION_CRITERIA", "label_runs", "lesion_froc"]

#: False-alarm events per exam at which sensitivity is reported.
FALSE_ALARM_RATES: tuple[float, ...] = (0.5, 1.0, 2.0, 4.0, 8.0)
#: When a predicted segment finds a lesion: ``"overlap"`` (at least one common frame) or ``"tiou0.5"``.
LESION_CRITERIA: tuple[str, ...] = ("overlap", "tiou0.5")


def label_runs(
    events: Sequence[Mapping[str, Any]], label: str, merge_gap: int = 0, score_key: str = "score"
) -> tuple[np.ndarray, np.ndarray]:
    """The maximal runs of one label in a video's events; runs at most ``merge_gap`` frames apart are joined.

    Args:
        events: events ``{"start", "end", "label", ["score"]}`` (inclusive frames), in any order.
        label: the label whose runs are returned.
        merge_gap: largest number of frames between two runs that are joined (0: only touching or overlapping).
        score_key: event key of the confidence score; an event without it scores ``+inf`` (always shown).

    Returns:
        ``(segments (N, 2) int64 [start, end] in time order, scores (N,) float64)``: a joined run scores the
        highest score of its events.
    """
    picked = [e for e in events if label in e["label"]]
    if not picked:
        return np.zeros((0, 2), dtype=np.int64), np.zeros(0)
    seg = np.asarray([(e["start"], e["end"]) for e in picked], dtype=np.int64)
    score = np.asarray([float(e.get(score_key, math.inf)) for e in picked])
    order = np.lexsort((seg[:, 1], seg[:, 0]))
    joined, starts = _join(seg[order], merge_gap)
    return joined, np.maximum.reduceat(score[order], starts)


def _join(seg: np.ndarray, gap: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Join ``(N, 2)`` inclusive segments sorted by start that are at most ``gap`` frames apart.

    Returns:
        ``(joined (M, 2), first)``: the joined segments and the index of each one's first segment.
    """
    # a run starts where the frame after the largest end so far, plus the gap, is still before its start
    reach = np.maximum.accumulate(seg[:, 1])
    starts = np.flatnonzero(np.r_[True, seg[1:, 0] > reach[:-1] + 1 + gap])
    ends = np.r_[starts[1:], len(seg)] - 1
    return np.stack([seg[starts, 0], reach[ends]], axis=1), starts


def _hits(pred: np.ndarray, gt: np.ndarray, criterion: str) -> np.ndarray:
    """(P, G) whether prediction p finds lesion g under ``criterion``."""
    if len(pred) == 0 or len(gt) == 0:
        return np.zeros((len(pred), len(gt)), dtype=bool)
    tiou = segment_tiou(pred, gt)
    return tiou > 0 if criterion == "overlap" else tiou >= 0.5


def _covered_frames(segments: np.ndarray) -> int:
    """Frames in the union of inclusive segments."""
    if len(segments) == 0:
        return 0
    joined, _ = _join(segments[np.argsort(segments[:, 0], kind="stable")])
    return int((joined[:, 1] - joined[:, 0] + 1).sum())


def _froc(
    lesion_scores: np.ndarray,
    fa_scores: np.ndarray,
    shown: list[tuple[np.ndarray, np.ndarray]],
    num_exams: int,
    exam_frames: int,
    rates: tuple[float, ...],
) -> dict[str, Any]:
    """One FROC block: sensitivity, operating threshold and workload at each false-alarm rate.

    Args:
        lesion_scores: per ground-truth lesion, the highest score of a prediction that finds it (``-inf``: none).
        fa_scores: the scores of the predictions that find no lesion.
        shown: per exam, (segments, scores) of every prediction, for the workload.
        num_exams: exams pooled.
        exam_frames: frames of all exams together.
        rates: false-alarm rates per exam.
    """
    n_lesions = len(lesion_scores)
    all_scores = np.concatenate([s for _, s in shown]) if shown else np.zeros(0)
    # operating points: keep every prediction scoring at least t, for each distinct t (highest first)
    thresholds = np.unique(all_scores)[::-1]
    fa_sorted = np.sort(fa_scores)
    fa = len(fa_sorted) - np.searchsorted(fa_sorted, thresholds, side="left")
    les_sorted = np.sort(lesion_scores)
    found = len(les_sorted) - np.searchsorted(les_sorted, thresholds, side="left")
    out: dict[str, Any] = {"lesions": n_lesions, "sensitivity": {}, "score_threshold": {}, "events_shown": {}}
    out["workload_frames_per_exam"], out["workload_share"] = {}, {}
    for rate in rates:
        key = f"{rate:g}"
        ok = np.flatnonzero(fa <= rate * num_exams)  # fa grows as t falls: the last admissible point shows most
        t = thresholds[ok[-1]] if len(ok) else None
        sens = found[ok[-1]] / n_lesions if len(ok) and n_lesions else (0.0 if n_lesions else None)
        out["sensitivity"][key] = None if sens is None else float(sens)
        out["score_threshold"][key] = float(t) if t is not None and math.isfinite(t) else None
        frames = 0
        count = 0
        if t is not None:
            for seg, score in shown:
                keep = score >= t
                count += int(keep.sum())
                frames += _covered_frames(seg[keep])
        out["events_shown"][key] = count
        out["workload_frames_per_exam"][key] = frames / num_exams
        out["workload_share"][key] = frames / exam_frames if exam_frames else 0.0
    sens = [out["sensitivity"][f"{r:g}"] for r in rates]
    out["froc_score"] = None if n_lesions == 0 else float(np.mean(sens))
    total_frames = sum(_covered_frames(seg) for seg, _ in shown)
    out["all_events"] = {
        "sensitivity": float((lesion_scores > -np.inf).mean()) if n_lesions else None,
        "false_alarms_per_exam": len(fa_scores) / num_exams,
        "events_shown": len(all_scores),
        "workload_frames_per_exam": total_frames / num_exams,
        "workload_share": total_frames / exam_frames if exam_frames else 0.0,
    }
    return out


def lesion_froc(
    gt: Mapping[str, Any] | str | os.PathLike,
    pred: Mapping[str, Any] | str | os.PathLike,
    labels: Sequence[str] = PATHOLOGY,
    false_alarm_rates: Sequence[float] = FALSE_ALARM_RATES,
    merge_gap: int = 0,
    num_frames: Mapping[str, int] | None = None,
    score_key: str = "score",
    validate: bool = True,
) -> dict[str, Any]:
    """Lesion-level FROC and reading workload of a prediction, pooled over the ground truth's exams.

    A lesion is a maximal run of one label in an exam's ground truth (runs at most ``merge_gap`` frames apart
    joined); predicted events of the label are joined by the same rule into segments scored by their highest
    ``score``. A segment finds a lesion of its label by overlap (a common frame) or, in the second criterion,
    at tIoU >= 0.5; a segment that finds none is a false alarm. At each false-alarm rate F the operating point
    keeps the segments scoring at least the lowest threshold with at most ``F x exams`` false alarms;
    sensitivity is the share of lesions found there, and the workload is the frames those segments cover.

    Args:
        gt: ground-truth event JSON (dict) or its file.
        pred: predicted event JSON (dict) or its file; events may carry ``score`` (higher = more suspicious;
            an event without one is always shown).
        labels: labels scored (the 9 pathology labels by default); ``"overall"`` pools them.
        false_alarm_rates: false-alarm events per exam at which sensitivity is read.
        merge_gap: largest gap, in frames, between runs joined into one lesion or one predicted segment.
        num_frames: frames per exam for the workload share; by default each exam's ground-truth extent
            (last end - first start + 1).
        score_key: event key of the score.
        validate: check both inputs first.

    Returns:
        ``{"num_exams", "false_alarm_rates", "merge_gap", "criteria": [...], "overall": {criterion: block},
        "per_label": {label: {criterion: block}}}``; a block holds ``lesions``, ``sensitivity``,
        ``score_threshold``, ``events_shown``, ``workload_frames_per_exam`` and ``workload_share`` keyed by rate
        (``"0.5"``, ``"1"``, ...), ``froc_score`` (their mean sensitivity) and ``all_events`` (every
        prediction shown). Sensitivity is ``None`` for a label without lesions; a threshold is ``None`` when no
        scored event fits the budget.

    Raises:
        ValueError: invalid inputs, labels, rates or gap, or a ground truth without videos.
    """
    labels = _check_labels(labels)
    rates = tuple(float(r) for r in false_alarm_rates)
    if not rates or any(not math.isfinite(r) or r < 0 for r in rates):
        raise ValueError(f"false_alarm_rates must be non-negative numbers, got {list(false_alarm_rates)!r}")
    if isinstance(merge_gap, bool) or not isinstance(merge_gap, int) or merge_gap < 0:
        raise ValueError(f"merge_gap must be a non-negative integer, got {merge_gap!r}")
    gt_obj, gt_name = _as_event_json(gt, "ground truth", validate)
    pred_obj, _ = _as_event_json(pred, "prediction", validate)
    gt_videos, pred_videos = _videos(gt_obj), _videos(pred_obj)
    if not gt_videos:
        raise ValueError(f"{gt_name}: the ground truth has no videos to score")
    exam_frames = 0
    for vid, events in gt_videos.items():
        if num_frames is not None and vid in num_frames:
            exam_frames += int(num_frames[vid])
        elif events:
            exam_frames += max(e["end"] for e in events) - min(e["start"] for e in events) + 1
    num_exams = len(gt_videos)
    # per (criterion, label): lesion scores, false-alarm scores and every shown segment per exam
    parts: dict[str, dict[str, tuple[list, list, list]]] = {c: {} for c in LESION_CRITERIA}
    for name in labels:
        for c in LESION_CRITERIA:
            parts[c][name] = ([], [], [])
        for vid, gt_events in gt_videos.items():
            lesions, _ = label_runs(gt_events, name, merge_gap)
            seg, score = label_runs(pred_videos.get(vid, ()), name, merge_gap, score_key)
            for c in LESION_CRITERIA:
                hit = _hits(seg, lesions, c)
                found = np.where(hit, score[:, None], -np.inf).max(axis=0, initial=-np.inf)
                les, fa, shown = parts[c][name]
                les.append(found)
                fa.append(score[~hit.any(axis=1)])
                shown.append((seg, score))

    def block(items: list[tuple[list, list, list]]) -> dict[str, Any]:
        les = np.concatenate([a for it in items for a in it[0]])
        fa = np.concatenate([a for it in items for a in it[1]])
        # per exam, every label's segments together (a frame flagged for two labels is read once)
        shown = [
            (
                np.concatenate([it[2][v][0] for it in items]).reshape(-1, 2),
                np.concatenate([it[2][v][1] for it in items]),
            )
            for v in range(num_exams)
        ]
        return _froc(les, fa, shown, num_exams, exam_frames, rates)

    return {
        "num_exams": num_exams,
        "false_alarm_rates": list(rates),
        "merge_gap": merge_gap,
        "criteria": list(LESION_CRITERIA),
        "labels": list(labels),
        "overall": {c: block(list(parts[c].values())) for c in LESION_CRITERIA},
        "per_label": {name: {c: block([parts[c][name]]) for c in LESION_CRITERIA} for name in labels},
    }
