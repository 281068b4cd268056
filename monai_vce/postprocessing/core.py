"""The decoder's kernels (decode, gate, compose, rank), written once and called by both
:class:`~monai_vce.postprocessing.EventDecoder` and :func:`~monai_vce.postprocessing.tune_decoder`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from monai_vce.labels import LABELS, LANDMARKS, SECTIONS

from .anatomy import LEAD_IN, decode_sections, landmark_windows, section_gate
from .chain import run_chain

__all__ = [
    "SECTION_COLUMNS",
    "LANDMARK_COLUMNS",
    "section_sequence",
    "section_mask",
    "column_sections",
    "gate_landmark_columns",
    "decode_columns",
]

#: Columns of the sections in :data:`~monai_vce.labels.LABELS`, in gut order.
SECTION_COLUMNS: np.ndarray = np.array([LABELS.index(s) for s in SECTIONS])
#: Columns of the landmarks (z-line, pylorus, ileocecal valve) in :data:`~monai_vce.labels.LABELS`.
LANDMARK_COLUMNS: np.ndarray = np.array([LABELS.index(n) for n in LANDMARKS])
_SECTION_OF_LABEL = {LABELS.index(s): k for k, s in enumerate(SECTIONS)}


def section_sequence(
    probs: np.ndarray, anatomy: Mapping[str, Any], allowed: np.ndarray | None = None
) -> np.ndarray | None:
    """Viterbi-decoded ``(T,)`` section indices of a video (positions in ``SECTIONS``, ``-1`` for lead-in frames).

    Args:
        probs: ``(T, 17)`` probabilities.
        anatomy: the ``anatomy`` parameters (emission weight and costs).
        allowed: ``(5,)`` booleans, the sections that may be decoded; all when ``None``.

    Returns:
        The sections, or ``None`` when no section is allowed.
    """
    allowed = np.ones(len(SECTIONS), bool) if allowed is None else np.asarray(allowed, dtype=bool)
    if not allowed.any():
        return None
    return decode_sections(
        probs[:, SECTION_COLUMNS],
        anatomy["emission_weight"],
        anatomy["switch_cost"],
        anatomy["skip_cost"],
        anatomy["backward_cost"],
        anatomy["entry_cost"],
        allowed=allowed,
        lead_in_logit=anatomy["lead_in_logit"],
    )


def section_mask(sections: np.ndarray | None, num_frames: int) -> np.ndarray:
    """``(T, 5)`` one-hot mask of decoded sections (lead-in frames and ``None`` carry no section)."""
    out = np.zeros((num_frames, len(SECTIONS)), dtype=bool)
    if sections is not None:
        rows = np.flatnonzero(sections >= 0)
        out[rows, sections[rows]] = True
    return out


def column_sections(probs: np.ndarray, columns: np.ndarray) -> np.ndarray:
    """``(T,)`` section indices of the sections decoded as columns (without anatomy decoding).

    A frame takes the decoded section of highest probability; a frame without any takes the section of the
    last frame before it that has one (a gap in the sections is no boundary); frames before the first decoded
    section are lead-in (``-1``). The boundaries of this sequence are where the landmark gate of
    :func:`decode_columns` allows landmarks.

    Args:
        probs: ``(T, 17)`` probabilities.
        columns: ``(T, 5)`` decoded section columns, in gut order (after their presence gating).
    """
    columns = np.asarray(columns, dtype=bool)
    T = columns.shape[0]
    best = np.where(columns, probs[:, SECTION_COLUMNS], -1.0).argmax(axis=1)
    last = np.where(columns.any(axis=1), np.arange(T), -1)
    np.maximum.accumulate(last, out=last)
    return np.where(last >= 0, best[np.maximum(last, 0)], LEAD_IN).astype(np.int64)


def gate_landmark_columns(
    out: np.ndarray, labels: np.ndarray, sections: np.ndarray, anatomy: Mapping[str, Any]
) -> np.ndarray:
    """Keep the landmark columns of ``out`` (in place) only within ``landmark_window`` frames of a transition of
    ``sections`` across their boundary (:func:`~monai_vce.postprocessing.anatomy.landmark_windows`), when the
    ``anatomy`` parameters' ``gate_landmarks`` is on.

    Args:
        out: ``(T, K)`` decoded columns.
        labels: ``(K,)`` the label of each column.
        sections: ``(T,)`` section indices (``-1`` lead-in).
        anatomy: the ``anatomy`` parameters (``gate_landmarks``, ``landmark_window``).

    Returns:
        ``out``.
    """
    if not anatomy["gate_landmarks"]:
        return out
    cols = np.flatnonzero(np.isin(labels, LANDMARK_COLUMNS))
    if cols.size:
        windows = landmark_windows(sections, anatomy["landmark_window"])
        for col in cols:
            out[:, col] &= windows[LABELS[int(labels[col])]]
    return out


def decode_columns(
    probs: np.ndarray,
    labels: Sequence[int] | np.ndarray,
    values: Mapping[str, np.ndarray],
    order: Sequence[str],
    anatomy: Mapping[str, Any] | None = None,
    sections: np.ndarray | None = None,
    gate: Mapping[str, Any] | None = None,
) -> np.ndarray:
    """Decode ``K`` columns: the chain, then the anatomy step (presence gating is :func:`column_presence`).

    Args:
        probs: ``(T, 17)`` probabilities of one video.
        labels: ``(K,)`` the label (column of ``probs``) each decoded column belongs to.
        values: per-column values (``(K,)`` arrays) of the chain parameters, keyed by parameter name.
        order: the chain's steps in order.
        anatomy: the ``anatomy`` parameters when anatomy decoding is on, else ``None``.
        sections: the video's decoded sections: the Viterbi decode (:func:`section_sequence`) with ``anatomy``,
            else those of the decoded section columns (:func:`column_sections`) for ``gate``.
        gate: without anatomy decoding, the ``anatomy`` parameters whose ``gate_landmarks`` and
            ``landmark_window`` keep the landmark columns near the boundaries of ``sections``; ``None`` (or no
            ``sections``) gates nothing.

    Returns:
        ``(T, K)`` boolean columns.
    """
    labels = np.asarray(labels, dtype=np.int64)
    T, K = probs.shape[0], labels.size
    out = np.zeros((T, K), dtype=bool)
    is_section = np.zeros(K, dtype=bool)
    if anatomy is not None:
        is_section = np.isin(labels, SECTION_COLUMNS)
    chained = np.flatnonzero(~is_section)
    if chained.size:
        per = {name: np.asarray(v)[chained] for name, v in values.items()}
        out[:, chained] = run_chain(probs[:, labels[chained]], per, order)
    if anatomy is None:
        if gate is not None and sections is not None:
            gate_landmark_columns(out, labels, sections, gate)
        return out
    # sections: the Viterbi decode claims every frame (a section gated out later still claims its frames)
    if is_section.any() and sections is not None:
        for k in np.flatnonzero(is_section):
            out[:, k] = sections == _SECTION_OF_LABEL[int(labels[k])]
    if sections is None:
        return out
    names = [LABELS[int(c)] for c in labels]
    windows = None
    for col, name in enumerate(names):
        if anatomy["gate_landmarks"] and name in anatomy["landmark_window"]:
            if windows is None:
                windows = landmark_windows(sections, anatomy["landmark_window"])
            out[:, col] &= windows[name]
        if name in anatomy["pathology_sections"]:
            out[:, col] &= section_gate(sections, anatomy["pathology_sections"][name])
    return out
