"""Runs along time: the one run-finding kernel of the package, and the gap rule that turns runs into events.

Every step that works on runs of frames (the decoder's gap filling and minimum length, event composition,
ground-truth building, decoder tuning, timeline resampling) finds them here:

- :func:`run_bounds`: the runs of ``True`` (or ``False``) in every column of a ``(T, C)`` mask, optionally split
  where ``breaks`` says a new run starts;
- :func:`value_runs`: the runs of equal values of a 1-D array (e.g. one integer code per frame);
- :func:`run_spans`: the gap rule, the inclusive frame ids ``[start, end]`` an event spans when its run covers
  rows ``start`` to ``stop - 1``.

The gap rule, as the challenge builds its ground truth from the label rows of a video: rows are the frames in
increasing frame-id order; an event starts at the id of its first row and ends one frame before the id of the
next row (the row after its run, whatever labels that row carries); the last run of a video ends at the id of
the video's last row. So frames missing from the rows (a gap in the frame ids) belong to the event before them,
and a gap never ends an event. On gap-free ids (``frame_ids[i + 1] == frame_ids[i] + 1``) an event simply
spans the ids of its first and last rows.
"""

from __future__ import annotations

import numpy as np

__all__ = ["run_bounds", "value_runs", "run_spans"]


def run_bounds(
    mask: np.ndarray, value: bool = True, breaks: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Return the runs of ``value`` in every column of a ``(T, C)`` mask.

    Args:
        mask: ``(T, C)`` boolean mask, frames along axis 0.
        value: which value the runs are made of.
        breaks: optional ``(T,)`` booleans, ``True`` where a new run starts even if the frame before has the same
            value (e.g. where the set of other labels changes, in label-set composition).

    Returns:
        ``(column, start, stop)``: int64 arrays of the column, first row and one-past-last row of each run,
        ordered by column then time.
    """
    m = np.asarray(mask, dtype=bool)
    if m.ndim != 2:
        raise ValueError(f"mask: expected a (T, C) array, got shape {m.shape}")
    T, C = m.shape
    # pad one False frame on both sides of each column so that every run has a rising and a falling edge
    padded = np.zeros((C, T + 2), dtype=np.int8)
    padded[:, 1:-1] = m.T if value else ~m.T
    d = np.diff(padded, axis=1)  # d[:, t] = m[t] - m[t - 1], t = 0..T
    rise, fall = d == 1, d == -1
    if breaks is not None:
        b = np.asarray(breaks, dtype=bool)
        if b.shape != (T,):
            raise ValueError(f"breaks: expected shape ({T},), got {b.shape}")
        if T > 1:
            # a break at row t splits a run covering rows t - 1 and t: one run stops and the next starts at t
            split = (padded[:, 1:T] & padded[:, 2 : T + 1]).astype(bool) & b[None, 1:]
            rise[:, 1:T] |= split
            fall[:, 1:T] |= split
    column, start = np.nonzero(rise)
    _, stop = np.nonzero(fall)
    return column, start, stop


def value_runs(values: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Return the runs of equal values of a 1-D array.

    Returns:
        ``(start, stop, value)``: first row, one-past-last row and value of each run, in time order.
    """
    x = np.asarray(values)
    if x.ndim != 1:
        raise ValueError(f"values: expected a 1-D array, got shape {x.shape}")
    if x.size == 0:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty, x[:0]
    start = np.flatnonzero(np.r_[True, x[1:] != x[:-1]])
    stop = np.r_[start[1:], x.size]
    return start, stop, x[start]


def run_spans(frame_ids: np.ndarray, start: np.ndarray, stop: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Inclusive frame ids spanned by runs of rows under the gap rule (see the module docstring).

    Args:
        frame_ids: ``(T,)`` strictly increasing frame ids of the rows.
        start: first row of each run.
        stop: one-past-last row of each run.

    Returns:
        ``(first_id, last_id)``: int64 arrays; ``last_id`` is ``frame_ids[stop] - 1`` when a row follows the run,
        else the id of the video's last row.
    """
    ids = np.asarray(frame_ids, dtype=np.int64)
    start = np.asarray(start, dtype=np.int64)
    stop = np.asarray(stop, dtype=np.int64)
    if start.size == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    last = ids[np.minimum(stop, ids.size - 1)] - (stop < ids.size)
    return ids[start], last
