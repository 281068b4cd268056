"""Near-duplicate frames: the frames whose signature is within a tolerance of the last inferred one reuse its
probabilities (:func:`duplicate_anchors`, vectorised).
"""

from __future__ import annotations

import numpy as np

__all__ = ["signature_distance", "duplicate_anchors"]


def signature_distance(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Mean absolute grey-level difference of signatures (rows of ``a`` against rows of ``b``, broadcast)."""
    return np.abs(np.asarray(a, dtype=np.float32) - np.asarray(b, dtype=np.float32)).mean(axis=-1)


def duplicate_anchors(signatures: np.ndarray, tolerance: float, max_reuse: int = 64) -> np.ndarray:
    """For every frame, the frame whose probabilities it takes under near-duplicate skipping.

    Args:
        signatures: ``(T, D)`` per-frame signatures in frame order.
        tolerance: largest :func:`signature_distance` to the last inferred frame for a frame to reuse it;
            ``0`` turns skipping off (every frame is its own anchor).
        max_reuse: most consecutive frames reusing one inferred frame.

    Returns:
        ``(T,)`` int64: ``anchors[t] == t`` for frames to infer, else the inferred frame ``t`` reuses.
    """
    sig = np.asarray(signatures, dtype=np.float32)
    if sig.ndim != 2:
        raise ValueError(f"signatures must be a (T, D) array, got shape {sig.shape}")
    T = sig.shape[0]
    rows = np.arange(T, dtype=np.int64)
    if T == 0 or tolerance <= 0:
        return rows
    L = int(max(1, max_reuse))
    # nxt[a]: the first frame after a that is not within the tolerance of a (or a + L + 1: reuse is capped)
    nxt = np.minimum(rows + L + 1, T)
    todo = rows[:-1]  # frames whose next inferred frame is not found yet
    for j in range(1, L + 1):
        todo = todo[todo + j < T]
        if todo.size == 0:
            break
        far = signature_distance(sig[todo + j], sig[todo]) > tolerance
        nxt[todo[far]] = todo[far] + j
        todo = todo[~far]
    # the inferred frames are the orbit of frame 0 under nxt (T is the end); pointer doubling finds it
    jump = np.r_[nxt, T]  # jump[T] = T
    on = np.zeros(T + 1, dtype=bool)
    on[0] = True
    jumps = [jump]
    while (1 << len(jumps)) <= T:
        jumps.append(jumps[-1][jumps[-1]])
    for j in reversed(jumps):
        on[j[np.flatnonzero(on)]] = True
    on = on[:T]
    return np.maximum.accumulate(np.where(on, rows, 0))
