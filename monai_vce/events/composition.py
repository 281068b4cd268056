"""Event composition: per-frame label activity <-> events of the challenge's event JSON.

Two compositions are offered by :func:`frames_to_events`:

* ``"label_set"`` (the challenge's own): an event is a maximal run of consecutive frames carrying exactly
  the same non-empty *set* of labels, so a new event starts wherever any label switches on or off. This is
  how the Galar ground truth is built; predictions composed this way can match its fragmented segments.
* ``"per_label"``: one event per maximal run of each label on its own.

"Consecutive" means consecutive positions in the arrays: ``frame_ids`` may have gaps (e.g. every 5th frame
was classified), and an event then spans ``frame_ids[first]`` to ``frame_ids[last]`` of its run, both
inclusive. All steps are vectorised over frames and labels; Python only loops over the events it returns.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from monai_vce.labels import LABELS, NUM_LABELS

from .validation import to_challenge_format

__all__ = ["COMPOSITIONS", "frames_to_events", "events_to_frames", "event_json", "to_challenge_format"]

#: The event compositions of :func:`frames_to_events`.
COMPOSITIONS: tuple[str, ...] = ("label_set", "per_label")

_BITS = np.left_shift(np.int64(1), np.arange(NUM_LABELS, dtype=np.int64))
# label lists are written sorted by name, as the challenge's ground truth lists them
_NAME_ORDER = sorted(range(NUM_LABELS), key=lambda i: LABELS[i])


def _check_frames(active: np.ndarray, frame_ids: np.ndarray, scores: np.ndarray | None):
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


def frames_to_events(
    active: np.ndarray,
    frame_ids: np.ndarray,
    mode: str = "label_set",
    scores: np.ndarray | None = None,
) -> list[dict[str, Any]]:
    """Compose events from per-frame label activity.

    Args:
        active: (T, 17) bool array in :data:`~monai_vce.labels.LABELS` order, the frames of one video in order.
        frame_ids: (T,) strictly increasing non-negative integer frame ids (index or frame-number units) of
            the rows; gaps are allowed and do not split events (runs are over consecutive rows).
        mode: ``"label_set"`` (maximal runs of an identical non-empty label set, a new event wherever any
            label switches; the challenge's composition) or ``"per_label"`` (maximal runs of each label).
        scores: optional (T, 17) per-frame scores (e.g. probabilities). Each event then gets a ``"score"``:
            the mean of ``scores`` over its frames and its labels (for a multi-label event, the mean over
            all its (frame, label) cells). The decoder uses it to order events; :func:`to_challenge_format`
            and :func:`~monai_vce.metrics.save_events` drop it when writing.

    Returns:
        Events ``{"start": int, "end": int, "label": [names]}`` (plus ``"score"``), ordered by start frame
        (ties, only in ``"per_label"`` mode, by label order); label lists are sorted by name, as in the
        challenge's ground truth.
    """
    if mode not in COMPOSITIONS:
        raise ValueError(f"mode must be one of {COMPOSITIONS}, got {mode!r}")
    active, frame_ids, scores = _check_frames(active, frame_ids, scores)
    n = active.shape[0]
    if n == 0:
        return []
    csum = None
    if scores is not None:
        csum = np.zeros((n + 1, NUM_LABELS))
        np.cumsum(scores, axis=0, out=csum[1:])
    if mode == "label_set":
        codes = active.astype(np.int64) @ _BITS  # the label set of each frame as one integer
        first = np.flatnonzero(np.r_[True, codes[1:] != codes[:-1]])
        last = np.r_[first[1:] - 1, n - 1]
        keep = codes[first] != 0
        first, last, run_codes = first[keep], last[keep], codes[first[keep]]
        uniq, inverse = np.unique(run_codes, return_inverse=True)
        names = [_names(int(c)) for c in uniq]
        starts, ends = frame_ids[first].tolist(), frame_ids[last].tolist()
        if csum is None:
            return [{"start": s, "end": e, "label": list(names[u])} for s, e, u in zip(starts, ends, inverse.tolist())]
        mask = ((run_codes[:, None] & _BITS[None, :]) != 0).astype(np.float64)
        sums = ((csum[last + 1] - csum[first]) * mask).sum(axis=1)
        mean = sums / ((last - first + 1) * mask.sum(axis=1))
        return [
            {"start": s, "end": e, "label": list(names[u]), "score": sc}
            for s, e, u, sc in zip(starts, ends, inverse.tolist(), mean.tolist())
        ]
    # per_label: rising and falling edges of every label at once
    padded = np.zeros((n + 2, NUM_LABELS), dtype=np.int8)
    padded[1:-1] = active
    edges = np.diff(padded, axis=0)
    rise_t, rise_l = np.nonzero(edges == 1)
    fall_t, fall_l = np.nonzero(edges == -1)
    # nonzero is row-major; reorder both by (label, time) so that rises and falls pair up
    r = np.lexsort((rise_t, rise_l))
    f = np.lexsort((fall_t, fall_l))
    first, lab, last = rise_t[r], rise_l[r], fall_t[f] - 1
    order = np.lexsort((lab, frame_ids[first]))
    first, lab, last = first[order], lab[order], last[order]
    starts, ends = frame_ids[first].tolist(), frame_ids[last].tolist()
    if csum is None:
        return [{"start": s, "end": e, "label": [LABELS[l]]} for s, e, l in zip(starts, ends, lab.tolist())]
    mean = (csum[last + 1, lab] - csum[first, lab]) / (last - first + 1)
    return [
        {"start": s, "end": e, "label": [LABELS[l]], "score": sc}
        for s, e, l, sc in zip(starts, ends, lab.tolist(), mean.tolist())
    ]


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


def event_json(videos: Mapping[str, Sequence[Mapping[str, Any]]], challenge_format: bool = True) -> dict[str, Any]:
    """Build an event JSON object ``{"videos": [{"video_id", "events"}]}`` from ``{video_id: events}``.

    Args:
        videos: events per video id, in the order the videos are to be listed; each list in the order the
            events are to be listed (the scorer reads them in that order).
        challenge_format: drop keys other than ``start``/``end``/``label`` (e.g. ``score``) with
            :func:`to_challenge_format`; ``False`` keeps the events as they are.
    """
    out = {"videos": [{"video_id": str(vid), "events": list(events)} for vid, events in videos.items()]}
    return to_challenge_format(out) if challenge_format else out
