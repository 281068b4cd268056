"""The ground truth the challenge scores: :func:`ground_truth_events`, the one builder of a video's events from its
label rows (the rule of the challenge's ground-truth script).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from monai_vce.labels import NUM_LABELS

from .composition import compose_runs, events_to_frames, runs_to_events
from .probabilities import Video
from .units import FrameUnits, as_frame_units

__all__ = ["ground_truth_events", "with_ground_truth"]


def ground_truth_events(
    frame_ids: np.ndarray, labels: np.ndarray, keep_empty: bool = True, video_id: str | None = None
) -> list[dict[str, Any]]:
    """The challenge's ground-truth events of one video, from its label rows (see ``docs/design/events.md``).

    Args:
        frame_ids: ``(R,)`` integer frame id of each row (``index`` for frame-index units, ``frame`` for
            frame-number units), in any order.
        labels: ``(R, 17)`` label values in :data:`~monai_vce.labels.LABELS` order; a label is present where its
            value is at least 0.5.
        keep_empty: keep events of rows without any label (with an empty label list), as the challenge does.
        video_id: named in error messages.

    Returns:
        Events ``{"start", "end", "label"}`` in time order.

    Raises:
        ValueError: the arrays do not have one frame id and 17 values per row, or an id is negative.
    """
    where = f"video {video_id!r}: " if video_id is not None else ""
    ids = np.asarray(frame_ids)
    lab = np.asarray(labels, dtype=np.float64)
    if ids.ndim != 1 or lab.shape != (ids.shape[0], NUM_LABELS):
        raise ValueError(
            f"{where}expected (R,) frame ids and (R, {NUM_LABELS}) labels, got shapes {ids.shape} and {lab.shape}"
        )
    if ids.size == 0:
        return []
    if not np.issubdtype(ids.dtype, np.integer):
        raise ValueError(f"{where}frame ids must be integers, got dtype {ids.dtype}")
    order = np.argsort(ids, kind="stable")
    first = np.r_[True, ids[order][1:] != ids[order][:-1]]  # a repeated id: its first row counts
    order = order[first]
    ids = ids[order].astype(np.int64)
    if ids[0] < 0:
        raise ValueError(f"{where}frame ids must be non-negative, got {int(ids[0])}")
    start, stop, member = compose_runs(lab[order] >= 0.5, "label_set", keep_empty=keep_empty)
    return runs_to_events(ids, start, stop, member)


def with_ground_truth(video: Video, events: Sequence[Mapping[str, Any]], frame_units: FrameUnits | str) -> Video:
    """A copy of ``video`` with its ground-truth ``events`` (in ``frame_units``, its :attr:`~Video.units` from here
    on) and the ``targets`` they mark.

    This is where ground truth meets rows: the frame units are chosen once, and every consumer (decoder tuning,
    refiner fitting, scoring) reads ``events`` with ``video.frame_ids()`` and ``targets`` by row.

    Raises:
        ValueError: an event that is not a valid event (the message names the video).
    """
    units = as_frame_units(frame_units)
    try:
        targets = events_to_frames(events, video.frame_ids(units)).astype(np.float32)
    except ValueError as e:
        raise ValueError(f"video {video.video_id!r}: {e}") from None
    return video.replace(events=list(events), targets=targets, units=units)
