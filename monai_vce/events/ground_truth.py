"""The ground truth the challenge scores: events of a video built from its label rows.

:func:`ground_truth_events` is the one ground-truth builder of the package. Evaluation, the validation metric,
decoder tuning, :func:`monai_vce.data.build_ground_truth` (label CSVs -> event JSON) and the generated mini-Galar
all build ground truth with it, from the rows of a video's labels CSV (``index`` or ``frame``, and the 0/1 label
columns), not from the frames that survived datalist building, because the challenge builds its ground truth
from those rows.

The rule, that of the challenge's ground-truth script:

1. the rows are ordered by frame id; a frame id listed twice keeps its first row;
2. consecutive rows carrying the same set of labels form one event; a gap in the frame ids does not end it;
3. an event spans from its first row's id to one frame before the next row's id (the last event of a video to
   the last row's id): frames without a row belong to the event before them (the gap rule of
   :mod:`monai_vce.events.runs`);
4. label lists are sorted by name; rows without any label form events with an empty label list, as in the
   challenge's file (they take part in no label's score; ``keep_empty=False`` leaves them out).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from monai_vce.labels import NUM_LABELS

from .composition import compose_runs, runs_to_events

__all__ = ["ground_truth_events"]


def ground_truth_events(
    frame_ids: np.ndarray, labels: np.ndarray, keep_empty: bool = True, video_id: str | None = None
) -> list[dict[str, Any]]:
    """The challenge's ground-truth events of one video, from its label rows (see the module docstring).

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
