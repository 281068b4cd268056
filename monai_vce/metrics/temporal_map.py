"""Temporal mAP of event JSON files, computed exactly as the RARE-VISION challenge scores them.

For each ground-truth video and each label, the ground-truth segments are the events that list the label,
in file order, and the predicted segments likewise. Predictions are matched greedily in listed order: each
takes the first still-unmatched ground-truth segment, in listed order, whose temporal IoU with it is at
least the tIoU threshold, where frames count inclusively::

    overlap = min(end_a, end_b) - max(start_a, start_b) + 1      (0 when negative)
    tIoU    = overlap / (len_a + len_b - overlap),   len = end - start + 1

``AP = sum_i precision_i * (recall_i - recall_{i-1})`` over the predictions in listed order (no
interpolation, no confidence sorting: the format has no score). A label without ground truth in a video
scores 1.0 when nothing predicts it there and 0.0 otherwise. A video's mAP is the mean over the labels
(all 17 by default), and the overall mAP the mean over the ground-truth videos.

Video ids: a ground-truth video absent from the prediction is scored as an empty prediction (its absent
labels score 1.0, its present ones 0.0); a predicted video absent from the ground truth is not scored and
is listed under ``"extra_pred_videos"`` (the challenge rejects such files; :func:`validate_events` with
``gt=`` reports both cases). A video listed twice has its events concatenated in file order. The
challenge's scorer iterates only over videos whose ground truth has at least one event; here every
ground-truth video counts, so a video with no ground-truth event scores 1.0 for an empty prediction (this
never happens on the Galar ground truth, where every video has events).

:func:`temporal_map` is the vectorised implementation; :func:`temporal_map_reference` is a plain
per-pair Python implementation of the same rules, kept as the reference for tests and speed comparisons.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from monai_vce.events.validation import DEFAULT_MAX_EVENTS, check_events, load_events
from monai_vce.labels import LABELS
from monai_vce.utils import renamed_arguments

__all__ = [
    "segment_tiou",
    "average_precision",
    "video_average_precision",
    "temporal_map",
    "temporal_map_reference",
    "tiou_key",
]

EventJSON = Mapping[str, Any]
#: Largest number of (prediction, ground truth) pairs whose tIoU is held in memory at once.
_PAIR_BLOCK = 1 << 22


def tiou_key(tiou_threshold: float) -> str:
    """The text form of a tIoU threshold used in result keys: ``0.5 -> "0.5"`` (``mAP@0.5``)."""
    return f"{tiou_threshold:g}"


def __getattr__(name: str) -> Any:
    if name == "threshold_key":
        warnings.warn(
            "monai_vce.metrics.threshold_key is deprecated and will be removed in the next release; use tiou_key",
            DeprecationWarning,
            stacklevel=2,
        )
        return tiou_key
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _check_tiou_thresholds(tiou_thresholds: float | Sequence[float]) -> tuple[float, ...]:
    if isinstance(tiou_thresholds, (int, float)):
        tiou_thresholds = (tiou_thresholds,)
    out: list[float] = []
    for t in tiou_thresholds:
        if (
            isinstance(t, bool)
            or not isinstance(t, (int, float, np.floating, np.integer))
            or not 0.0 <= float(t) <= 1.0
        ):
            raise ValueError(f"tIoU thresholds must be numbers in [0, 1], got {t!r}")
        if float(t) not in out:
            out.append(float(t))
    if not out:
        raise ValueError("at least one tIoU threshold is needed")
    return tuple(out)


def _check_labels(labels: Sequence[str]) -> tuple[str, ...]:
    if isinstance(labels, str):
        labels = (labels,)
    labels = tuple(labels)
    unknown = [n for n in labels if n not in LABELS]
    if unknown or not labels:
        raise ValueError(f"labels must be a non-empty subset of LABELS, got unknown {unknown!r}")
    return labels


def segment_tiou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Temporal IoU of every pair of inclusive segments.

    Args:
        a: (N, 2) integer array of ``[start, end]``.
        b: (M, 2) integer array of ``[start, end]``.

    Returns:
        (N, M) float64 array; 0 for disjoint segments.
    """
    a = np.asarray(a, dtype=np.int64).reshape(-1, 2)
    b = np.asarray(b, dtype=np.int64).reshape(-1, 2)
    inter = np.minimum(a[:, None, 1], b[None, :, 1]) - np.maximum(a[:, None, 0], b[None, :, 0]) + 1
    np.maximum(inter, 0, out=inter)
    union = (a[:, 1] - a[:, 0] + 1)[:, None] + (b[:, 1] - b[:, 0] + 1)[None, :] - inter
    return inter / union


def _candidate_pairs(gt: np.ndarray, pred: np.ndarray, min_tiou: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(pred row, gt column, tIoU) of the pairs with tIoU >= min_tiou > 0, sorted by (row, column).

    Only ground-truth segments that can reach ``min_tiou`` are compared: a pair needs overlap, and
    ``tIoU <= len_pred / len_gt``, so a candidate starts within ``[start_p - len_p / min_tiou, end_p]``,
    a contiguous range of the ground truth sorted by start (one ``searchsorted`` per side).
    """
    order = np.argsort(gt[:, 0], kind="stable")
    g_start, g_end = gt[order, 0], gt[order, 1]
    p_len = pred[:, 1] - pred[:, 0] + 1
    reach = np.ceil(p_len / min_tiou).astype(np.int64)
    lo = np.searchsorted(g_start, pred[:, 0] - reach, side="left")
    hi = np.searchsorted(g_start, pred[:, 1], side="right")
    counts = hi - lo
    rows, cols, vals = [], [], []
    # blocks of consecutive predictions with about _PAIR_BLOCK candidate pairs each (bounds memory)
    block = np.cumsum(counts) // _PAIR_BLOCK
    edges = np.concatenate(([0], np.flatnonzero(np.diff(block)) + 1, [len(pred)]))
    for first, last in zip(edges[:-1].tolist(), edges[1:].tolist(), strict=False):
        c = counts[first:last]
        total = int(c.sum())
        if total == 0:
            continue
        r = np.repeat(np.arange(first, last), c)
        j = np.repeat(lo[first:last], c) + np.arange(total) - np.repeat(np.cumsum(c) - c, c)
        inter = np.minimum(pred[r, 1], g_end[j]) - np.maximum(pred[r, 0], g_start[j]) + 1
        np.maximum(inter, 0, out=inter)
        iou = inter / (p_len[r] + (g_end[j] - g_start[j] + 1) - inter)
        ok = iou >= min_tiou
        rows.append(r[ok])
        cols.append(order[j[ok]])
        vals.append(iou[ok])
    if not rows:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty, np.zeros(0)
    rows_a, cols_a, vals_a = np.concatenate(rows), np.concatenate(cols), np.concatenate(vals)
    srt = np.lexsort((cols_a, rows_a))
    return rows_a[srt], cols_a[srt], vals_a[srt]


def _greedy_tp(rows: np.ndarray, cols: np.ndarray, n_pred: int, n_gt: int) -> np.ndarray:
    """True positives of the listed-order greedy match, given the qualifying pairs sorted by (row, col)."""
    tp = np.zeros(n_pred, dtype=bool)
    if len(rows) == 0:
        return tp
    new_row = np.ones(len(rows), dtype=bool)
    new_row[1:] = rows[1:] != rows[:-1]
    starts = np.flatnonzero(new_row)
    ends = np.append(starts[1:], len(rows))
    first_col = cols[starts]
    wanted = np.bincount(cols, minlength=n_gt)
    # a prediction whose first candidate no other prediction qualifies for takes it whatever the order
    easy = wanted[first_col] == 1
    tp[rows[starts[easy]]] = True
    free = np.ones(n_gt, dtype=bool)
    free[first_col[easy]] = False
    # the contested rest, sequentially in listed order; per row a vectorised first-free lookup
    for s, e in zip(starts[~easy].tolist(), ends[~easy].tolist(), strict=False):
        cand = cols[s:e]
        avail = free[cand]
        k = int(avail.argmax())
        if avail[k]:
            free[cand[k]] = False
            tp[rows[s]] = True
    return tp


@renamed_arguments(thresholds="tiou_thresholds")
def average_precision(
    gt: np.ndarray, pred: np.ndarray, tiou_thresholds: float | Sequence[float] = (0.5, 0.95)
) -> np.ndarray:
    """Challenge AP of one (video, label): segments in listed order, greedy first match.

    Args:
        gt: (G, 2) integer ``[start, end]`` ground-truth segments in listed order.
        pred: (P, 2) integer ``[start, end]`` predicted segments in listed order.
        tiou_thresholds: tIoU thresholds (formerly ``thresholds``).

    Returns:
        (K,) float64 AP per tIoU threshold.
    """
    ths = _check_tiou_thresholds(tiou_thresholds)
    gt = np.asarray(gt, dtype=np.int64).reshape(-1, 2)
    pred = np.asarray(pred, dtype=np.int64).reshape(-1, 2)
    return _average_precision(gt, pred, ths)


def _average_precision(gt: np.ndarray, pred: np.ndarray, ths: tuple[float, ...]) -> np.ndarray:
    n_gt, n_pred = len(gt), len(pred)
    if n_gt == 0:
        return np.full(len(ths), 0.0 if n_pred else 1.0)
    if n_pred == 0:
        return np.zeros(len(ths))
    positive = [t for t in ths if t > 0]
    pairs = _candidate_pairs(gt, pred, min(positive)) if positive else None
    rank = np.arange(1, n_pred + 1, dtype=np.float64)
    out = np.empty(len(ths))
    for k, t in enumerate(ths):
        if t <= 0:
            # every pair qualifies (tIoU >= 0): prediction i takes ground truth i
            tp = np.arange(n_pred) < n_gt
        else:
            assert pairs is not None  # computed above whenever a tIoU threshold is positive
            rows, cols, vals = pairs
            keep = vals >= t
            tp = _greedy_tp(rows[keep], cols[keep], n_pred, n_gt)
        # only true positives raise recall; the same float operations in the same order as the reference
        hits = np.cumsum(tp)[tp].astype(np.float64)
        if len(hits) == 0:
            out[k] = 0.0
            continue
        recall = hits / n_gt
        prev = np.zeros_like(recall)
        prev[1:] = recall[:-1]
        terms = hits / rank[tp] * (recall - prev)
        out[k] = float(np.cumsum(terms)[-1])
    return out


def _segments_by_label(events: Sequence[Mapping[str, Any]], index: Mapping[str, int], n: int) -> list[np.ndarray]:
    starts: list[list[int]] = [[] for _ in range(n)]
    ends: list[list[int]] = [[] for _ in range(n)]
    for e in events:
        s, t = e["start"], e["end"]
        for name in e["label"]:
            i = index.get(name)
            if i is not None:
                starts[i].append(s)
                ends[i].append(t)
    return [
        np.stack([np.asarray(a, dtype=np.int64), np.asarray(b, dtype=np.int64)], axis=1)
        for a, b in zip(starts, ends, strict=False)
    ]


@renamed_arguments(thresholds="tiou_thresholds")
def video_average_precision(
    gt_events: Sequence[Mapping[str, Any]],
    pred_events: Sequence[Mapping[str, Any]],
    tiou_thresholds: float | Sequence[float] = (0.5, 0.95),
    labels: Sequence[str] = LABELS,
) -> np.ndarray:
    """Challenge AP of one video for every label and tIoU threshold.

    Args:
        gt_events: the video's ground-truth events (``start``, ``end``, ``label`` list), in listed order.
        pred_events: the video's predicted events, in listed order (extra keys such as ``score`` are ignored).
        tiou_thresholds: tIoU thresholds (formerly ``thresholds``).
        labels: the labels to score.

    Returns:
        (L, K) float64 AP; the video's mAP at tIoU threshold k is ``ap[:, k].mean()``.
    """
    ths = _check_tiou_thresholds(tiou_thresholds)
    labels = _check_labels(labels)
    index = {name: i for i, name in enumerate(labels)}
    gt_segs = _segments_by_label(gt_events, index, len(labels))
    pred_segs = _segments_by_label(pred_events, index, len(labels))
    return np.stack([_average_precision(g, p, ths) for g, p in zip(gt_segs, pred_segs, strict=False)])


def _as_event_json(obj: EventJSON | str | os.PathLike, role: str, validate: bool) -> tuple[EventJSON, str]:
    if isinstance(obj, (str, os.PathLike)):
        return load_events(obj, max_events=DEFAULT_MAX_EVENTS, validate=validate), str(obj)
    if validate:
        check_events(obj, source=role, max_events=None, strict=False)
    return obj, role


def _videos(obj: EventJSON) -> dict[str, list[Mapping[str, Any]]]:
    """Events per video id in file order; a video listed twice has its events concatenated."""
    out: dict[str, list[Mapping[str, Any]]] = {}
    for v in obj["videos"]:
        out.setdefault(v["video_id"], []).extend(v["events"])
    return out


def _assemble(
    vids: list[str],
    aps: list[np.ndarray],
    ths: tuple[float, ...],
    labels: tuple[str, ...],
    extra: list[str],
    missing: list[str],
) -> dict[str, Any]:
    keys = [tiou_key(t) for t in ths]
    stack = np.stack(aps) if aps else np.zeros((0, len(labels), len(ths)))  # (V, L, K)
    video_map = stack.mean(axis=1)  # (V, K)
    result: dict[str, Any] = {f"mAP@{k}": float(video_map[:, i].mean()) for i, k in enumerate(keys)}
    result["tiou_thresholds"] = list(ths)
    result["num_videos"] = len(vids)
    result["per_label"] = {
        name: {k: float(stack[:, j, i].mean()) for i, k in enumerate(keys)} for j, name in enumerate(labels)
    }
    result["per_video"] = {
        vid: {
            **{f"mAP@{k}": float(video_map[v, i]) for i, k in enumerate(keys)},
            "AP": {name: {k: float(stack[v, j, i]) for i, k in enumerate(keys)} for j, name in enumerate(labels)},
        }
        for v, vid in enumerate(vids)
    }
    result["missing_pred_videos"] = missing
    result["extra_pred_videos"] = extra
    return result


@renamed_arguments(thresholds="tiou_thresholds")
def temporal_map(
    gt: EventJSON | str | os.PathLike,
    pred: EventJSON | str | os.PathLike,
    tiou_thresholds: float | Sequence[float] = (0.5, 0.95),
    labels: Sequence[str] = LABELS,
    validate: bool = True,
) -> dict[str, Any]:
    """Temporal mAP of a prediction against a ground truth, with the challenge's semantics.

    Vectorised per (video, label): the tIoU of all prediction/ground-truth pairs is one numpy computation
    (in blocks), and the sequential greedy match touches only the predictions that compete for the same
    ground-truth segment, each with one vectorised first-free lookup.

    Args:
        gt: ground-truth event JSON (dict) or the path of its file.
        pred: predicted event JSON (dict) or the path of its file. Extra event keys (``score``) are ignored.
        tiou_thresholds: tIoU thresholds in [0, 1] (formerly ``thresholds``).
        labels: labels averaged in each video's mAP (the 17 :data:`~monai_vce.labels.LABELS` by default).
        validate: check both inputs with :func:`~monai_vce.metrics.check_events` first (extra event keys
            tolerated); turn off only for inputs known to be valid (e.g. in a tuning loop).

    Returns:
        ``{"mAP@0.5": float, "mAP@0.95": float, "tiou_thresholds": [...], "num_videos": int,
        "per_label": {label: {"0.5": mean AP over videos, ...}},
        "per_video": {video_id: {"mAP@0.5": .., "mAP@0.95": .., "AP": {label: {"0.5": .., "0.95": ..}}}},
        "missing_pred_videos": [...], "extra_pred_videos": [...]}``; one ``mAP@{t:g}`` key per tIoU threshold.

    Raises:
        ValueError: invalid inputs, tIoU thresholds or labels, or a ground truth without videos.
    """
    ths = _check_tiou_thresholds(tiou_thresholds)
    labels = _check_labels(labels)
    gt_obj, gt_name = _as_event_json(gt, "ground truth", validate)
    pred_obj, _ = _as_event_json(pred, "prediction", validate)
    gt_videos, pred_videos = _videos(gt_obj), _videos(pred_obj)
    if not gt_videos:
        raise ValueError(f"{gt_name}: the ground truth has no videos to score")
    index = {name: i for i, name in enumerate(labels)}
    vids, aps = [], []
    for vid, gt_events in gt_videos.items():
        gt_segs = _segments_by_label(gt_events, index, len(labels))
        pred_segs = _segments_by_label(pred_videos.get(vid, ()), index, len(labels))
        aps.append(np.stack([_average_precision(g, p, ths) for g, p in zip(gt_segs, pred_segs, strict=False)]))
        vids.append(vid)
    extra = [v for v in pred_videos if v not in gt_videos]
    missing = [v for v in gt_videos if v not in pred_videos]
    return _assemble(vids, aps, ths, labels, extra, missing)


def _tiou_reference(a: tuple[int, int], b: tuple[int, int]) -> float:
    inter = max(0, min(a[1], b[1]) - max(a[0], b[0]) + 1)
    union = (a[1] - a[0] + 1) + (b[1] - b[0] + 1) - inter
    return inter / union


def _ap_reference(gt: list[tuple[int, int]], pred: list[tuple[int, int]], tiou_threshold: float) -> float:
    if not gt:
        return 0.0 if pred else 1.0
    matched = [False] * len(gt)
    tp = []
    for p in pred:
        hit = 0
        for j, g in enumerate(gt):
            if not matched[j] and _tiou_reference(p, g) >= tiou_threshold:
                matched[j] = True
                hit = 1
                break
        tp.append(hit)
    ap, cum, prev_recall = 0.0, 0, 0.0
    for i, hit in enumerate(tp):
        cum += hit
        recall = cum / len(gt)
        ap += cum / (i + 1) * (recall - prev_recall)
        prev_recall = recall
    return ap


@renamed_arguments(thresholds="tiou_thresholds")
def temporal_map_reference(
    gt: EventJSON | str | os.PathLike,
    pred: EventJSON | str | os.PathLike,
    tiou_thresholds: float | Sequence[float] = (0.5, 0.95),
    labels: Sequence[str] = LABELS,
    validate: bool = True,
) -> dict[str, Any]:
    """Reference implementation of :func:`temporal_map`: straightforward Python loops over every pair.

    Same arguments, rules and result as :func:`temporal_map`; it exists to check the vectorised version in
    tests and to measure its speed-up. Its cost is O(P x G) Python steps per (video, label).
    """
    ths = _check_tiou_thresholds(tiou_thresholds)
    labels = _check_labels(labels)
    gt_obj, gt_name = _as_event_json(gt, "ground truth", validate)
    pred_obj, _ = _as_event_json(pred, "prediction", validate)
    gt_videos, pred_videos = _videos(gt_obj), _videos(pred_obj)
    if not gt_videos:
        raise ValueError(f"{gt_name}: the ground truth has no videos to score")
    vids, aps = [], []
    for vid, gt_events in gt_videos.items():
        table = np.zeros((len(labels), len(ths)))
        for j, name in enumerate(labels):
            g = [(e["start"], e["end"]) for e in gt_events if name in e["label"]]
            p = [(e["start"], e["end"]) for e in pred_videos.get(vid, ()) if name in e["label"]]
            for k, t in enumerate(ths):
                table[j, k] = _ap_reference(g, p, t)
        vids.append(vid)
        aps.append(table)
    extra = [v for v in pred_videos if v not in gt_videos]
    missing = [v for v in gt_videos if v not in pred_videos]
    return _assemble(vids, aps, ths, labels, extra, missing)
