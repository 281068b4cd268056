"""Temporal mAP of event JSON files, computed exactly as the RARE-VISION challenge scores them.

Greedy matching in listed order at each tIoU threshold, inclusive frames, no confidence sorting; every ground-truth
video counts. :func:`temporal_map_reference` is the per-pair reference.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from monai_vce.events.validation import DEFAULT_MAX_EVENTS, check_events, load_events
from monai_vce.labels import LABELS

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
_PAIR_BLOCK = 1 << 20
#: Ground-truth segments matched at a time (see :func:`_greedy_tp`); bounds the work per match.
_GT_CHUNK = 256


def tiou_key(tiou_threshold: float) -> str:
    """The text form of a tIoU threshold used in result keys: ``0.5 -> "0.5"`` (``mAP@0.5``)."""
    return f"{tiou_threshold:g}"


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


def _first_free(rows: np.ndarray, cols: np.ndarray, free: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The listed-order greedy match of one block of predictions against ``free`` ground truth (updated in place).

    Args:
        rows: prediction of each qualifying pair, non-decreasing (rows in listed order).
        cols: ground-truth index of each pair (any order within a row); only free ones are used.
        free: which ground-truth segments are still unmatched.

    Returns:
        (matched rows, the ground truth each took).
    """
    keep = free[cols]
    rows, cols = rows[keep], cols[keep]
    if len(rows) == 0:
        return rows, cols
    new_row = np.ones(len(rows), dtype=bool)
    new_row[1:] = rows[1:] != rows[:-1]
    starts = np.flatnonzero(new_row)
    ends = np.append(starts[1:], len(rows))
    first_col = np.minimum.reduceat(cols, starts)
    wanted = np.bincount(cols, minlength=len(free))
    # a prediction whose first candidate no other prediction of the block qualifies for takes it whatever the order
    easy = wanted[first_col] == 1
    got_rows, got_cols = [rows[starts[easy]]], [first_col[easy]]
    free[first_col[easy]] = False
    # the contested rest, sequentially in listed order; per row a vectorised first-free lookup
    left = int(free.sum())
    for s, e in zip(starts[~easy].tolist(), ends[~easy].tolist(), strict=False):
        if left == 0:
            break
        cand = cols[s:e]
        cand = cand[free[cand]]
        if len(cand):
            k = cand.min()
            free[k] = False
            left -= 1
            got_rows.append(rows[s : s + 1])
            got_cols.append(np.array([k]))
    return np.concatenate(got_rows), np.concatenate(got_cols)


def _greedy_tp(gt: np.ndarray, pred: np.ndarray, tiou_threshold: float) -> np.ndarray:
    """True positives of the listed-order greedy match at a positive tIoU threshold, in bounded memory.

    Each prediction, in listed order, takes the first still-unmatched ground-truth segment (in listed order)
    whose tIoU with it reaches the threshold. The ground truth is taken in chunks of :data:`_GT_CHUNK`
    segments, in listed order: whether a prediction matches in chunk ``c`` depends only on the predictions
    before it that matched in chunk ``c``, so running the greedy match chunk after chunk with the predictions
    still unmatched gives exactly the whole-set result. Within a chunk, only ground truth that can reach the
    threshold is compared (``tIoU >= t`` needs ``|start_g - start_p| <= len_p (1 - t) / t``, one
    ``searchsorted`` per side), in blocks of about
    :data:`_PAIR_BLOCK` pairs. Memory is O(_PAIR_BLOCK + P + G) whatever the overlap (10^5 identical events
    per side would be 10^10 qualifying pairs at once).
    """
    n_pred = len(pred)
    tp = np.zeros(n_pred, dtype=bool)
    p_len = pred[:, 1] - pred[:, 0] + 1
    # a qualifying pair has |start_g - start_p| <= d = union - inter <= inter (1 - t) / t <= len_p (1 - t) / t;
    # one frame more absorbs rounding (the window only has to hold every candidate)
    reach = np.ceil(np.minimum(p_len * ((1.0 - tiou_threshold) / tiou_threshold), 2.0**52)).astype(np.int64) + 1
    for c0 in range(0, len(gt), _GT_CHUNK):
        pending = np.flatnonzero(~tp)
        if len(pending) == 0:
            break
        chunk = gt[c0 : c0 + _GT_CHUNK]
        order = np.argsort(chunk[:, 0], kind="stable")
        g_start, g_end = chunk[order, 0], chunk[order, 1]
        free = np.ones(len(chunk), dtype=bool)
        lo = np.searchsorted(g_start, pred[pending, 0] - reach[pending], side="left")
        hi = np.searchsorted(g_start, np.minimum(pred[pending, 1], pred[pending, 0] + reach[pending]), side="right")
        counts = hi - lo
        # blocks of consecutive pending predictions with about _PAIR_BLOCK candidate pairs each, and at most
        # _GT_CHUNK of them (with that many matches the chunk is used up)
        block = np.maximum(np.cumsum(counts) // _PAIR_BLOCK, np.arange(len(pending)) // _GT_CHUNK)
        edges = np.concatenate(([0], np.flatnonzero(np.diff(block)) + 1, [len(pending)]))
        for first, last in zip(edges[:-1].tolist(), edges[1:].tolist(), strict=False):
            c = counts[first:last]
            total = int(c.sum())
            if total == 0:
                continue
            q = np.repeat(np.arange(first, last), c)
            j = np.repeat(lo[first:last], c) + np.arange(total) - np.repeat(np.cumsum(c) - c, c)
            r = pending[q]
            inter = np.minimum(pred[r, 1], g_end[j]) - np.maximum(pred[r, 0], g_start[j]) + 1
            np.maximum(inter, 0, out=inter)
            iou = inter / (p_len[r] + (g_end[j] - g_start[j] + 1) - inter)
            ok = iou >= tiou_threshold
            got, _ = _first_free(r[ok], order[j[ok]], free)
            tp[got] = True
            if not free.any():
                break  # the chunk is used up: later predictions look in the next one
    return tp


def average_precision(
    gt: np.ndarray, pred: np.ndarray, tiou_thresholds: float | Sequence[float] = (0.5, 0.95)
) -> np.ndarray:
    """Challenge AP of one (video, label): segments in listed order, greedy first match.

    Args:
        gt: (G, 2) integer ``[start, end]`` ground-truth segments in listed order.
        pred: (P, 2) integer ``[start, end]`` predicted segments in listed order.
        tiou_thresholds: tIoU thresholds.

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
    rank = np.arange(1, n_pred + 1, dtype=np.float64)
    out = np.empty(len(ths))
    for k, t in enumerate(ths):
        # at t <= 0 every pair qualifies (tIoU >= 0): prediction i takes ground truth i
        tp = np.arange(n_pred) < n_gt if t <= 0 else _greedy_tp(gt, pred, t)
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
        tiou_thresholds: tIoU thresholds.
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


def temporal_map(
    gt: EventJSON | str | os.PathLike,
    pred: EventJSON | str | os.PathLike,
    tiou_thresholds: float | Sequence[float] = (0.5, 0.95),
    labels: Sequence[str] = LABELS,
    validate: bool = True,
) -> dict[str, Any]:
    """Temporal mAP of a prediction against a ground truth, with the challenge's semantics.

    Vectorised per (video, label): the tIoU of the candidate pairs is computed with numpy in bounded blocks
    (see :func:`_greedy_tp`), and the sequential greedy match touches only the predictions that compete for the
    same ground-truth segment, each with one vectorised first-free lookup.

    Args:
        gt: ground-truth event JSON (dict) or the path of its file.
        pred: predicted event JSON (dict) or the path of its file. Extra event keys (``score``) are ignored.
        tiou_thresholds: tIoU thresholds in [0, 1].
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
