"""Event composition: per-frame label activity <-> events of the challenge's event JSON, and the confidence of runs.

``"label_set"`` (the challenge's) or ``"per_label"`` runs; events span frame ids by the gap rule of
:mod:`monai_vce.events.runs`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from monai_vce.labels import LABELS, NUM_LABELS

from .runs import run_bounds, run_spans, value_runs
from .validation import to_challenge_format

__all__ = [
    "COMPOSITIONS",
    "RANKINGS",
    "label_codes",
    "compose_runs",
    "run_confidence",
    "confidence_order",
    "runs_to_events",
    "frames_to_events",
    "events_to_frames",
    "event_json",
    "to_challenge_format",
]

#: The event compositions of :func:`frames_to_events`.
COMPOSITIONS: tuple[str, ...] = ("label_set", "per_label")
#: How :func:`run_confidence` combines the per-label means of a multi-label run (``"none"``: time order).
RANKINGS: tuple[str, ...] = ("mean", "max", "min", "none")

_BITS = np.left_shift(np.int64(1), np.arange(NUM_LABELS, dtype=np.int64))
# label lists are written sorted by name, as the challenge's ground truth lists them
_NAME_ORDER = sorted(range(NUM_LABELS), key=lambda i: LABELS[i])


def _check_frames(
    active: np.ndarray, frame_ids: np.ndarray, scores: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    active = np.asarray(active)
    if active.ndim != 2 or active.shape[1] != NUM_LABELS:
        raise ValueError(f"active must be a (T, {NUM_LABELS}) array in LABELS order, got shape {active.shape}")
    active = active.astype(bool, copy=False)
    frame_ids = np.asarray(frame_ids)
    if frame_ids.shape != (active.shape[0],):
        raise ValueError(
            f"frame_ids must be a ({active.shape[0]},) array, one id per row of active, got shape {frame_ids.shape}"
        )
    if frame_ids.size and not np.issubdtype(frame_ids.dtype, np.integer):
        raise ValueError(f"frame_ids must be integers, got dtype {frame_ids.dtype}")
    frame_ids = frame_ids.astype(np.int64, copy=False)
    if frame_ids.size > 1 and np.any(np.diff(frame_ids) <= 0):
        bad = int(np.flatnonzero(np.diff(frame_ids) <= 0)[0])
        raise ValueError(
            f"frame_ids must be strictly increasing; position {bad + 1} has {frame_ids[bad + 1]} after {frame_ids[bad]}"
        )
    if frame_ids.size and frame_ids[0] < 0:
        raise ValueError(f"frame_ids must be non-negative, got {frame_ids[0]}")
    if scores is not None:
        scores = np.asarray(scores, dtype=np.float64)
        if scores.shape != active.shape:
            raise ValueError(f"scores must have the shape of active {active.shape}, got {scores.shape}")
    return active, frame_ids, scores


def _names(code: int) -> list[str]:
    return [LABELS[i] for i in _NAME_ORDER if code >> i & 1]


def label_codes(active: np.ndarray) -> np.ndarray:
    """The label set of every row of a ``(T, 17)`` mask as one int64 code (bit ``i`` for ``LABELS[i]``)."""
    return np.asarray(active, dtype=bool).astype(np.int64) @ _BITS


def compose_runs(
    active: np.ndarray, mode: str = "label_set", keep_empty: bool = False
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The runs of rows that become events, before frame ids are attached.

    Args:
        active: ``(T, 17)`` bool array in :data:`~monai_vce.labels.LABELS` order.
        mode: ``"label_set"`` or ``"per_label"`` (see ``docs/design/events.md``).
        keep_empty: in ``"label_set"`` mode, also return the runs of rows without any label (the challenge's
            ground truth lists them as events with an empty label list).

    Returns:
        ``(start, stop, member)``: first row, one-past-last row and ``(N, 17)`` bool labels of each run, in time
        order (ties, only in ``"per_label"`` mode, in label order).
    """
    if mode not in COMPOSITIONS:
        raise ValueError(f"mode must be one of {COMPOSITIONS}, got {mode!r}")
    active = np.asarray(active, dtype=bool)
    if mode == "label_set":
        start, stop, codes = value_runs(label_codes(active))
        if not keep_empty:
            keep = codes != 0
            start, stop, codes = start[keep], stop[keep], codes[keep]
        member = (codes[:, None] & _BITS[None, :]) != 0
        return start, stop, member
    # per_label: the runs of every label at once, ordered by (start row, label)
    lab, start, stop = run_bounds(active)
    order = np.lexsort((lab, start))
    lab, start, stop = lab[order], start[order], stop[order]
    member = np.zeros((lab.size, NUM_LABELS), dtype=bool)
    member[np.arange(lab.size), lab] = True
    return start, stop, member


def run_confidence(
    csum: np.ndarray, start: np.ndarray, stop: np.ndarray, member: np.ndarray, ranking: str = "mean"
) -> np.ndarray:
    """Confidence of runs: each member label's mean score over the run's rows, combined by ``ranking``.

    Args:
        csum: ``(T + 1, C)`` cumulative sums of the per-row scores along time, ``csum[0] == 0``.
        start: first row of each run.
        stop: one-past-last row of each run.
        member: ``(N, C)`` bool, the labels of each run (at least one per run).
        ranking: ``"mean"``, ``"max"`` or ``"min"`` over the member labels' means (see :data:`RANKINGS`);
            ``"none"`` returns ``-start`` (time order).

    Returns:
        ``(N,)`` float64 confidence; a higher value is listed first.
    """
    if ranking == "none":
        return -np.asarray(start, dtype=np.float64)
    mean = (csum[stop] - csum[start]) / (stop - start)[:, None]
    if ranking == "mean":
        return (mean * member).sum(axis=1) / np.maximum(member.sum(axis=1), 1)
    if ranking == "max":
        return np.where(member, mean, -np.inf).max(axis=1)
    if ranking == "min":
        return np.where(member, mean, np.inf).min(axis=1)
    raise ValueError(f"ranking must be one of {list(RANKINGS)}, got {ranking!r}")


def confidence_order(confidence: np.ndarray, start: np.ndarray, group: np.ndarray | None = None) -> np.ndarray:
    """Positions of runs sorted most confident first (ties in time order), within each ``group`` when given."""
    keys = (np.asarray(start), -np.asarray(confidence)) + (() if group is None else (np.asarray(group),))
    return np.lexsort(keys)


def runs_to_events(
    frame_ids: np.ndarray, start: np.ndarray, stop: np.ndarray, member: np.ndarray, score: np.ndarray | None = None
) -> list[dict[str, Any]]:
    """Events ``{"start", "end", "label"}`` (plus ``"score"``) of runs, spanning frame ids by the gap rule."""
    first, last = run_spans(frame_ids, start, stop)
    codes = label_codes(member)
    uniq, inverse = np.unique(codes, return_inverse=True)
    names = [_names(int(c)) for c in uniq]
    starts, ends, inv = first.tolist(), last.tolist(), inverse.reshape(-1).tolist()
    if score is None:
        return [{"start": s, "end": e, "label": list(names[u])} for s, e, u in zip(starts, ends, inv, strict=True)]
    return [
        {"start": s, "end": e, "label": list(names[u]), "score": sc}
        for s, e, u, sc in zip(starts, ends, inv, np.asarray(score).tolist(), strict=True)
    ]


def frames_to_events(
    active: np.ndarray,
    frame_ids: np.ndarray,
    mode: str = "label_set",
    scores: np.ndarray | None = None,
) -> list[dict[str, Any]]:
    """Compose events from per-frame label activity.

    Args:
        active: (T, 17) bool array in :data:`~monai_vce.labels.LABELS` order, the frames of one video in order.
        frame_ids: (T,) strictly increasing non-negative integer frame ids (frame-index or frame-number units)
            of the rows; gaps are allowed, never end an event, and belong to the event before them (the gap
            rule of :mod:`monai_vce.events.runs`).
        mode: ``"label_set"`` (maximal runs of an identical non-empty label set, a new event wherever any
            label switches; the challenge's composition) or ``"per_label"`` (maximal runs of each label).
        scores: optional (T, 17) per-frame scores (e.g. probabilities). Each event then gets a ``"score"``:
            the mean over its labels of each label's mean score over its frames (:func:`run_confidence` with
            ranking ``"mean"``). :func:`to_challenge_format` and :func:`~monai_vce.events.save_events` drop it
            when writing.

    Returns:
        Events ``{"start": int, "end": int, "label": [names]}`` (plus ``"score"``), ordered by start frame
        (ties, only in ``"per_label"`` mode, by label order); label lists are sorted by name, as in the
        challenge's ground truth.
    """
    if mode not in COMPOSITIONS:
        raise ValueError(f"mode must be one of {COMPOSITIONS}, got {mode!r}")
    active, frame_ids, scores = _check_frames(active, frame_ids, scores)
    if active.shape[0] == 0:
        return []
    start, stop, member = compose_runs(active, mode)
    score = None
    if scores is not None:
        csum = np.zeros((active.shape[0] + 1, NUM_LABELS))
        np.cumsum(scores, axis=0, out=csum[1:])
        score = run_confidence(csum, start, stop, member, "mean")
    return runs_to_events(frame_ids, start, stop, member, score)


def events_to_frames(events: Iterable[Mapping[str, Any]], frame_ids: np.ndarray) -> np.ndarray:
    """Per-frame label activity of a list of events (the inverse of :func:`frames_to_events`).

    Args:
        events: events with inclusive ``start``/``end`` and a ``label`` list of names from ``LABELS``.
        frame_ids: (T,) strictly increasing frame ids of the rows to fill; a row is active for a label when
            its frame id lies inside an event listing the label (events may cover ids absent from
            ``frame_ids``: only the listed ids are marked).

    Returns:
        (T, 17) bool array in :data:`~monai_vce.labels.LABELS` order.
    """
    frame_ids = np.asarray(frame_ids, dtype=np.int64)
    if frame_ids.ndim != 1:
        raise ValueError(f"frame_ids must be a 1-D array, got shape {frame_ids.shape}")
    if frame_ids.size > 1 and np.any(np.diff(frame_ids) <= 0):
        raise ValueError("frame_ids must be strictly increasing")
    index = {name: i for i, name in enumerate(LABELS)}
    starts, ends, labs = [], [], []
    for j, e in enumerate(events):
        try:
            s, t, names = e["start"], e["end"], e["label"]
        except (KeyError, TypeError):
            raise ValueError(f"event {j} must be a dict with 'start', 'end' and 'label', got {e!r}") from None
        if isinstance(names, str):
            raise ValueError(f"event {j}: 'label' must be a list of label names, got the string {names!r}")
        for name in names:
            if name not in index:
                raise ValueError(f"event {j}: unknown label {name!r}")
            starts.append(s)
            ends.append(t)
            labs.append(index[name])
    n = frame_ids.size
    out = np.zeros((n, NUM_LABELS), dtype=bool)
    if not labs:
        return out
    lo = np.searchsorted(frame_ids, np.asarray(starts, dtype=np.int64), side="left")
    hi = np.searchsorted(frame_ids, np.asarray(ends, dtype=np.int64), side="right")
    labs_arr = np.asarray(labs, dtype=np.int64)
    # +1 at the first covered row, -1 after the last: a running sum > 0 marks the covered rows
    delta = np.zeros((n + 1, NUM_LABELS), dtype=np.int64)
    np.add.at(delta, (lo, labs_arr), 1)
    np.add.at(delta, (hi, labs_arr), -1)
    np.greater(np.cumsum(delta[:-1], axis=0), 0, out=out)
    return out


def event_json(
    videos: Mapping[str, Sequence[Mapping[str, Any]]], challenge_format: bool = True, scores: bool = False
) -> dict[str, Any]:
    """Build an event JSON object ``{"videos": [{"video_id", "events"}]}`` from ``{video_id: events}``.

    Args:
        videos: events per video id, in the order the videos are to be listed; each list in the order the
            events are to be listed (the scorer reads them in that order).
        challenge_format: drop keys other than ``start``/``end``/``label`` (e.g. ``score``) with
            :func:`to_challenge_format`; ``False`` keeps the events as they are.
        scores: with ``challenge_format``, keep each event's ``score`` (the screening events).
    """
    out = {"videos": [{"video_id": str(vid), "events": list(events)} for vid, events in videos.items()]}
    return to_challenge_format(out, scores=scores) if challenge_format else out
