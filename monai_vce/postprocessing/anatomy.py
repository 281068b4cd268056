"""Anatomy decoding: one section per frame along the gut (a left-to-right Viterbi decode with a lead-in state),
landmarks near section boundaries, pathologies inside plausible sections.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from ..labels import LANDMARK_BOUNDARIES, SECTIONS
from .steps import MAX_COST, MAX_FRAMES, Param

__all__ = [
    "ANATOMY_PARAMS",
    "LANDMARK_WINDOW",
    "DEFAULT_ANATOMY_GRID",
    "LEAD_IN",
    "section_log_emissions",
    "transition_scores",
    "viterbi_sections",
    "decode_sections",
    "landmark_windows",
    "section_gate",
]

#: Section index of frames decoded as lead-in (before the first section).
LEAD_IN = -1
#: Largest ``lead_in_logit`` magnitude (beyond the logit of probabilities clipped at ``1e-6``).
MAX_LOGIT = 20.0

#: The anatomy decoding step's parameters (the ``"anatomy"`` object of the decoder parameters, besides
#: ``landmark_window`` and ``pathology_sections``), in the order they are written.
ANATOMY_PARAMS: dict[str, Param] = {
    p.name: p
    for p in (
        Param("enabled", "boolean", False, doc="replace the section columns by the Viterbi decode"),
        Param("emission_weight", "number", 0.1, 0.0, 1e3, doc="weight of the section logits"),
        Param("switch_cost", "number", 20.0, 0.0, MAX_COST, doc="cost of moving to the next section"),
        Param("skip_cost", "number", 20.0, 0.0, MAX_COST, doc="extra cost per section skipped"),
        Param("backward_cost", "number", 60.0, 0.0, MAX_COST, doc="cost per section moved backward"),
        Param("entry_cost", "number", None, 0.0, MAX_COST, nullable=True, doc="cost of leaving the lead-in"),
        Param("lead_in_logit", "number", 0.0, -MAX_LOGIT, MAX_LOGIT, doc="the lead-in's emission, as a section logit"),
        Param("gate_landmarks", "boolean", True, doc="keep landmarks only near a decoded boundary crossing"),
    )
}
#: Frames allowed on each side of a decoded transition for a landmark (one value per landmark).
LANDMARK_WINDOW = Param("landmark_window", "integer", 100, 0, MAX_FRAMES)

#: Candidate Viterbi settings the decoder's tuning compares by the sections' validation AP (lower transition
#: costs follow the sections more closely; the lead-in keeps unannotated first frames out of events): backward
#: moves at three times the switch cost, or forbidden (``MAX_COST``: the capsule only moves forward, so a burst
#: of an earlier section's probability cannot split a section).
DEFAULT_ANATOMY_GRID: tuple[dict[str, float], ...] = tuple(
    {"emission_weight": 0.1, "switch_cost": c, "skip_cost": c, "backward_cost": 3.0 * c, "entry_cost": 0.0}
    for c in (1.25, 2.5, 5.0, 10.0)
) + tuple(
    {"emission_weight": 0.1, "switch_cost": c, "skip_cost": c, "backward_cost": MAX_COST, "entry_cost": 0.0}
    for c in (0.3, 0.6, 1.25, 2.5)
)

_NEG = -1e30  # "impossible" in the max-plus algebra, finite so that sums never produce NaN
_EPS = 1e-6


def section_log_emissions(section_probs: np.ndarray, weight: float = 1.0) -> np.ndarray:
    """Return ``weight * logit(p)`` of ``(T, S)`` section probabilities (clipped away from 0 and 1)."""
    p = np.clip(np.asarray(section_probs, dtype=np.float64), _EPS, 1.0 - _EPS)
    return weight * (np.log(p) - np.log1p(-p))


def transition_scores(
    num_states: int = len(SECTIONS), switch_cost: float = 20.0, skip_cost: float = 20.0, backward_cost: float = 60.0
) -> np.ndarray:
    """Return the ``(S, S)`` log-transition scores (row: from, column: to) of the left-to-right model."""
    i = np.arange(num_states)[:, None]
    j = np.arange(num_states)[None, :]
    step = j - i
    a = np.zeros((num_states, num_states))
    fwd = step > 0
    a[fwd] = -(switch_cost + (step[fwd] - 1) * skip_cost)
    a[step < 0] = step[step < 0] * backward_cost
    return a


def viterbi_sections(
    emissions: np.ndarray,
    transitions: np.ndarray,
    initial: np.ndarray | None = None,
    allowed: np.ndarray | None = None,
    chunk: int | None = None,
) -> np.ndarray:
    """Most likely state sequence of a small HMM, vectorised over chunks of frames.

    Args:
        emissions: ``(T, S)`` log-emission scores.
        transitions: ``(S, S)`` log-transition scores, row = from state.
        initial: ``(S,)`` log-scores of the first state; zeros when ``None``.
        allowed: ``(S,)`` booleans; states marked ``False`` are never decoded (e.g. a section found absent).
        chunk: frames per chunk; ``ceil(sqrt(T))`` when ``None``.

    Returns:
        ``(T,)`` int64 state indices.
    """
    e = np.asarray(emissions, dtype=np.float64)
    if e.ndim != 2:
        raise ValueError(f"emissions: expected a (T, S) array, got shape {e.shape}")
    T, S = e.shape
    a = np.asarray(transitions, dtype=np.float64)
    if a.shape != (S, S):
        raise ValueError(f"transitions: expected shape {(S, S)}, got {a.shape}")
    init = np.zeros(S) if initial is None else np.asarray(initial, dtype=np.float64)
    if allowed is not None:
        allowed = np.asarray(allowed, dtype=bool)
        if not allowed.any():
            raise ValueError("viterbi_sections: at least one state must be allowed")
        e = np.where(allowed[None, :], e, _NEG)
    if T == 0:
        return np.zeros(0, dtype=np.int64)
    if T == 1:
        return np.array([int(np.argmax(init + e[0]))])

    # steps 1..T-1 are split into C chunks of L steps; padded steps have zero emission: staying there costs
    # nothing and moving never gains, so they leave the optimum of the real steps unchanged
    n = T - 1
    L = int(chunk) if chunk else max(1, int(np.ceil(np.sqrt(n))))
    C = int(np.ceil(n / L))
    pad = C * L - n
    e_steps = np.ascontiguousarray(
        np.concatenate([e[1:], np.zeros((pad, S))], axis=0).reshape(C, L, S).transpose(1, 0, 2)
    )

    # 1) transfer matrix of each chunk: best score from the state before the chunk to its last state;
    #    the max-plus product is unrolled over the S intermediate states (contiguous (C, S, S) operations)
    prod = np.full((C, S, S), _NEG)
    for i in range(S):
        prod[:, i, i] = 0.0
    for t in range(L):
        m = a[None, :, :] + e_steps[t][:, None, :]  # (C, S, S): from k to j at step t
        new = prod[:, :, 0, None] + m[:, None, 0, :]
        for k in range(1, S):
            np.maximum(new, prod[:, :, k, None] + m[:, None, k, :], out=new)
        prod = new

    # 2) entry scores of each chunk, one tiny step per chunk
    entry = np.empty((C, S))
    d = init + e[0]
    for c in range(C):
        entry[c] = d
        d = (d[:, None] + prod[c]).max(axis=0)
    last = int(np.argmax(d))

    # 3) in-chunk recursion for all chunks at once, keeping back-pointers
    back = np.empty((L, C, S), dtype=np.int8)
    d = entry
    for t in range(L):
        best = d[:, 0, None] + a[0][None, :]
        arg = np.zeros((C, S), dtype=np.int8)
        for i in range(1, S):
            cand = d[:, i, None] + a[i][None, :]
            better = cand > best
            best = np.where(better, cand, best)
            arg[better] = i
        back[t] = arg
        d = best + e_steps[t]

    # 4) backtracking: compose each chunk's back-pointers (exit state -> state before the chunk)
    comp = np.broadcast_to(np.arange(S), (C, S)).copy()
    for t in range(L - 1, -1, -1):
        comp = np.take_along_axis(back[t], comp, axis=1)
    exit_state = np.empty(C, dtype=np.int64)
    state = last
    for c in range(C - 1, -1, -1):
        exit_state[c] = state
        state = int(comp[c, state])
    first = state
    path = np.empty((C, L), dtype=np.int64)
    cur = exit_state.copy()
    rows = np.arange(C)
    for t in range(L - 1, -1, -1):
        path[:, t] = cur
        cur = back[t, rows, cur].astype(np.int64)
    return np.concatenate([[first], path.reshape(-1)[:n]])


def decode_sections(
    section_probs: np.ndarray,
    emission_weight: float = 0.1,
    switch_cost: float = 20.0,
    skip_cost: float = 20.0,
    backward_cost: float = 60.0,
    entry_cost: float | None = None,
    allowed: np.ndarray | None = None,
    lead_in_logit: float = 0.0,
) -> np.ndarray:
    """Decode one section per frame from ``(T, S)`` section probabilities, with an optional lead-in.

    Args:
        section_probs: ``(T, S)`` probabilities of the sections in gut order.
        emission_weight, switch_cost, skip_cost, backward_cost: see :func:`section_log_emissions` and
            :func:`transition_scores`.
        entry_cost: cost of leaving the lead-in state into the mouth (plus ``skip_cost`` per section skipped);
            ``None`` for no lead-in state.
        allowed: ``(S,)`` booleans; sections marked ``False`` are never decoded.
        lead_in_logit: the lead-in scores ``emission_weight * lead_in_logit`` per frame, as a section of that
            logit would (0 for calibrated probabilities: "no section" against "only section ``k``").

    Returns:
        ``(T,)`` int64 section indices, :data:`LEAD_IN` (``-1``) for lead-in frames.
    """
    em = section_log_emissions(section_probs, emission_weight)
    trans = transition_scores(em.shape[1], switch_cost, skip_cost, backward_cost)
    if entry_cost is None:
        return viterbi_sections(em, trans, allowed=allowed)
    T, S = em.shape
    em1 = np.concatenate([np.full((T, 1), float(emission_weight) * float(lead_in_logit)), em], axis=1)
    trans1 = np.full((S + 1, S + 1), _NEG)
    trans1[1:, 1:] = trans
    trans1[0, 0] = 0.0
    trans1[0, 1:] = -(float(entry_cost) + np.arange(S) * float(skip_cost))
    allowed1 = None if allowed is None else np.concatenate([[True], np.asarray(allowed, dtype=bool)])
    return viterbi_sections(em1, trans1, allowed=allowed1) - 1


def _cover(T: int, starts: np.ndarray, stops: np.ndarray) -> np.ndarray:
    """Boolean (T,) mask covering the union of half-open intervals, clipped to [0, T)."""
    delta = np.zeros(T + 1, dtype=np.int64)
    np.add.at(delta, np.clip(starts, 0, T), 1)
    np.add.at(delta, np.clip(stops, 0, T), -1)
    return np.cumsum(delta[:T]) > 0


def landmark_windows(
    sections: np.ndarray, windows: Mapping[str, int] | int = 50, section_names: Sequence[str] = SECTIONS
) -> dict[str, np.ndarray]:
    """Frames where each landmark is allowed: within ``window`` frames of a transition crossing its boundary.

    Args:
        sections: ``(T,)`` decoded section indices (positions in ``section_names``).
        windows: frames allowed on each side of the transition, per landmark name or one for all.
        section_names: the section order used by ``sections``.

    Returns:
        ``{landmark: (T,) bool}``; all ``False`` when no decoded transition crosses the landmark's boundary.
        Leaving the lead-in (:data:`LEAD_IN`) crosses no boundary.
    """
    sections = np.asarray(sections, dtype=np.int64)
    T = sections.shape[0]
    t = np.flatnonzero(np.diff(sections) != 0) + 1  # first frame of each new section
    t = t[sections[t - 1] != LEAD_IN]
    lo = np.minimum(sections[t - 1], sections[t]) if t.size else np.zeros(0, np.int64)
    hi = np.maximum(sections[t - 1], sections[t]) if t.size else np.zeros(0, np.int64)
    out = {}
    for name, (before, after) in LANDMARK_BOUNDARIES.items():
        w = int(windows[name] if isinstance(windows, Mapping) else windows)
        b = section_names.index(before)  # the boundary lies between positions b and b + 1
        if section_names.index(after) != b + 1:
            raise ValueError(f"landmark {name!r}: sections {before!r} and {after!r} are not consecutive")
        sel = t[(lo <= b) & (hi >= b + 1)]
        out[name] = _cover(T, sel - w, sel + w)
    return out


def section_gate(
    sections: np.ndarray, allowed_sections: Sequence[str], section_names: Sequence[str] = SECTIONS
) -> np.ndarray:
    """``(T,)`` mask of frames whose decoded section is one of ``allowed_sections``."""
    idx = [section_names.index(s) for s in allowed_sections]
    return np.isin(np.asarray(sections), idx)
