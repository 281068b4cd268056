"""Runs along time: the one run-finding kernel (:func:`run_bounds`, :func:`value_runs`) and the challenge's gap rule
(:func:`run_spans`): an event ends one frame before the next row's id.
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
    """Inclusive frame ids spanned by runs of rows under the gap rule (see ``docs/design/events.md``).

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
