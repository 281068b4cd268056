"""The event decoder: per-frame probabilities of a video -> challenge events, most confident first.

Steps, for a ``(T, 17)`` probability array of one video (any model's scores in ``[0, 1]``):

1. the chain of :mod:`~monai_vce.postprocessing.chain` with per-label parameters and a configurable order;
2. optionally, anatomy decoding (:mod:`~monai_vce.postprocessing.anatomy`): the five section columns are
   replaced by a Viterbi decode over all sections (with an optional lead-in state for the unannotated
   first frames); landmarks are kept only near a decoded transition across their boundary, and pathologies
   optionally only inside plausible sections;
3. presence gating (:mod:`~monai_vce.postprocessing.gating`): a label whose per-video presence rule fails is
   cleared from the whole video (a section gated out still claims its frames in the Viterbi decode; the
   ``"support"`` feature counts the frames the label would be emitted on, after step 2);
4. event composition (:mod:`monai_vce.events.composition`: label-set runs by default, as the ground truth is
   built; per-label runs as an option), in the caller's frame units, with the gap rule of the ground truth;
5. confidence order: events sorted by a confidence score, highest first (ties keep time order).

Steps 1-3 are the kernels of :mod:`~monai_vce.postprocessing.core`, which the tuning calls too.

Ranking multi-label events. The scorer matches each label separately, reading that label's events in listed
order, so only the relative order of the events carrying a label matters for that label's AP. One global
list cannot follow every label's own preference; the ``ranking`` choice says how an event's labels are
combined, each label contributing the mean of its probability over the event's frames:

- ``"mean"`` (default): the mean over the event's labels (the ``score`` of ``frames_to_events``). A
  pathology event inside the small intestine ranks by its pathology confidence shifted by a near-constant
  section term, so the pathology keeps its own order;
- ``"max"``: the maximum over its labels (favours the order of the dominant, usually anatomical, label);
- ``"min"``: the minimum over its labels (favours the order of the weakest, usually pathological, label).

The label-set composition is never broken up: an event is listed once, with all its labels.

Parameters live in :class:`~monai_vce.postprocessing.DecoderParams`, one versioned JSON file keyed by label name.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..events.composition import RANKINGS, compose_runs, confidence_order, event_json, run_confidence, runs_to_events
from ..labels import LABELS, NUM_LABELS
from .chain import CHAIN_STEPS
from .core import SECTION_COLUMNS, column_sections, decode_columns, gate_landmark_columns, section_sequence
from .gating import column_presence
from .params import DECODER_PARAMS_VERSION, FRAME_UNITS, DecoderParams

__all__ = [
    "DECODER_PARAMS_VERSION",
    "RANKINGS",
    "FRAME_UNITS",
    "DecoderParams",
    "EventDecoder",
    "check_probabilities",
    "event_confidence",
    "decode_videos",
    "load_decoder",
]

_ALL_LABELS = np.arange(NUM_LABELS)


def _as_params(params: DecoderParams | Mapping[str, Any] | str | os.PathLike | None) -> DecoderParams:
    if params is None:
        return DecoderParams()
    if isinstance(params, DecoderParams):
        return params
    if isinstance(params, Mapping):
        return DecoderParams(params)
    return DecoderParams.load(params)


def check_probabilities(probs: Any, frame_ids: Any, video_id: str | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Validate one video's ``(T, 17)`` probabilities and ``(T,)`` frame ids; errors name the video and frame."""
    where = f"video {video_id!r}" if video_id is not None else "probabilities"
    probs = np.asarray(probs)
    if probs.ndim != 2 or probs.shape[1] != NUM_LABELS:
        raise ValueError(f"{where}: expected probabilities of shape (T, {NUM_LABELS}), got {probs.shape}")
    if not np.issubdtype(probs.dtype, np.floating):
        probs = probs.astype(np.float64)
    bad = ~np.isfinite(probs)
    if bad.any():
        t, c = np.argwhere(bad)[0]
        raise ValueError(f"{where}: non-finite probability {probs[t, c]} at frame {t} (row), label {LABELS[c]!r}")
    if probs.size and (probs.min() < 0.0 or probs.max() > 1.0):
        t, c = np.argwhere((probs < 0) | (probs > 1))[0]
        raise ValueError(
            f"{where}: probability {probs[t, c]} outside [0, 1] at frame {t} (row), label {LABELS[c]!r}; "
            f"pass sigmoid outputs, not logits"
        )
    frame_ids = np.asarray(frame_ids)
    if frame_ids.shape != (probs.shape[0],):
        raise ValueError(f"{where}: expected {probs.shape[0]} frame ids, got shape {frame_ids.shape}")
    if frame_ids.size and not np.issubdtype(frame_ids.dtype, np.integer):
        raise ValueError(f"{where}: frame ids must be integers, got dtype {frame_ids.dtype}")
    frame_ids = frame_ids.astype(np.int64)
    if frame_ids.size > 1:
        d = np.diff(frame_ids)
        if np.any(d <= 0):
            t = int(np.flatnonzero(d <= 0)[0]) + 1
            raise ValueError(
                f"{where}: frame ids must be strictly increasing; row {t} has {frame_ids[t]} after {frame_ids[t - 1]}"
            )
    return probs, frame_ids


class EventDecoder:
    """Decode one video's per-frame probabilities into challenge events, most confident first.

    Args:
        params: a :class:`DecoderParams`, its dict, the path of its JSON file, or ``None`` for the paper's chain.

    Example::

        decoder = EventDecoder("decoder_params.json")
        events = decoder(probs, frame_index)          # [{"start", "end", "label"}], most confident first
    """

    def __init__(self, params: DecoderParams | Mapping[str, Any] | str | os.PathLike | None = None) -> None:
        self.params = _as_params(params)

    def sections(self, probs: np.ndarray, present: np.ndarray | None = None) -> np.ndarray | None:
        """Viterbi-decoded ``(T,)`` section indices (positions in ``SECTIONS``, ``-1`` for lead-in frames), or
        ``None`` when no section is present."""
        allowed = None if present is None else np.asarray(present)[SECTION_COLUMNS]
        return section_sequence(probs, self.params["anatomy"], allowed)

    def masks(self, probs: np.ndarray, frame_ids: np.ndarray | None = None, video_id: str | None = None) -> np.ndarray:
        """The ``(T, 17)`` activity mask after the chain, anatomy decoding and presence gating."""
        if frame_ids is None:
            frame_ids = np.arange(np.asarray(probs).shape[0])
        probs, frame_ids = check_probabilities(probs, frame_ids, video_id)
        return self._masks(probs)[0]

    def _masks(self, probs: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        p = self.params
        anatomy = p["anatomy"] if p["anatomy"]["enabled"] else None
        sections = self.sections(probs) if anatomy is not None and probs.shape[0] else None
        values = {step.param.name: p.per_label(step.param.name) for step in CHAIN_STEPS.values()}
        mask = decode_columns(probs, _ALL_LABELS, values, p["order"], anatomy, sections)
        rules = p.presence_rules()
        if anatomy is None and p["anatomy"]["gate_landmarks"]:
            # landmarks near the boundaries of the sections as emitted (after their presence gating), as tuned
            sec_rules = [rules[c] for c in SECTION_COLUMNS]
            sec_present = column_presence(probs, mask[:, SECTION_COLUMNS], SECTION_COLUMNS, sec_rules)
            sections = column_sections(probs, mask[:, SECTION_COLUMNS] & sec_present)
            gate_landmark_columns(mask, _ALL_LABELS, sections, p["anatomy"])
        present = column_presence(probs, mask, _ALL_LABELS, rules)
        mask[:, ~present] = False
        return mask, sections

    def __call__(self, probs: np.ndarray, frame_ids: np.ndarray, video_id: str | None = None) -> list[dict[str, Any]]:
        """Events of one video in challenge format, most confident first.

        Args:
            probs: ``(T, 17)`` probabilities in LABELS order (finite, in ``[0, 1]``).
            frame_ids: ``(T,)`` strictly increasing frame ids in the units of ``params["frame_units"]``
                (``frame_index`` or ``frame_number`` of the datalist / probability files).
            video_id: named in error messages.
        """
        probs, frame_ids = check_probabilities(probs, frame_ids, video_id)
        mask, _ = self._masks(probs)
        return self.compose(mask, frame_ids, probs)

    def compose(self, mask: np.ndarray, frame_ids: np.ndarray, probs: np.ndarray) -> list[dict[str, Any]]:
        """Compose events from a final mask and order them by confidence."""
        p = self.params
        start, stop, member = compose_runs(mask, p["composition"])
        ranking = p["ranking"]
        if ranking != "none" and start.size >= 2:
            csum = np.zeros((probs.shape[0] + 1, NUM_LABELS))
            np.cumsum(probs, axis=0, out=csum[1:])
            order = confidence_order(run_confidence(csum, start, stop, member, ranking), start)
            start, stop, member = start[order], stop[order], member[order]
        return runs_to_events(frame_ids, start, stop, member)


def event_confidence(
    events: Sequence[Mapping[str, Any]], frame_ids: np.ndarray, probs: np.ndarray, ranking: str = "mean"
) -> np.ndarray:
    """Confidence of each event (:func:`~monai_vce.events.composition.run_confidence` of the rows it covers)."""
    n = len(events)
    if n == 0:
        return np.zeros(0)
    csum = np.zeros((probs.shape[0] + 1, NUM_LABELS))
    np.cumsum(probs, axis=0, out=csum[1:])
    start = np.searchsorted(frame_ids, np.fromiter((e["start"] for e in events), np.int64, n))
    stop = np.searchsorted(frame_ids, np.fromiter((e["end"] for e in events), np.int64, n), side="right")
    member = np.zeros((n, NUM_LABELS), dtype=bool)
    index = {name: i for i, name in enumerate(LABELS)}
    rows = np.repeat(np.arange(n), [len(e["label"]) for e in events])
    cols = np.fromiter((index[name] for e in events for name in e["label"]), np.int64, rows.size)
    member[rows, cols] = True
    return run_confidence(csum, start, stop, member, ranking)


def decode_videos(
    videos: Mapping[str, tuple[np.ndarray, np.ndarray]],
    decoder: EventDecoder | DecoderParams | Mapping | str | os.PathLike | None = None,
) -> dict[str, Any]:
    """Decode several videos into one challenge event JSON object.

    Args:
        videos: ``{video_id: (probs (T, 17), frame_ids (T,))}``, listed in this order in the output.
        decoder: an :class:`EventDecoder` or anything :class:`EventDecoder` accepts.

    Returns:
        ``{"videos": [{"video_id": str, "events": [...]}]}`` with each video's events most confident first.
    """
    if not isinstance(decoder, EventDecoder):
        decoder = EventDecoder(decoder)
    out = {}
    for vid, item in videos.items():
        try:
            probs, frame_ids = item
        except (TypeError, ValueError):
            raise ValueError(f"video {vid!r}: expected a (probs, frame_ids) pair") from None
        out[str(vid)] = decoder(probs, frame_ids, video_id=str(vid))
    return event_json(out)


def load_decoder(path: str | os.PathLike | None, untuned: str | os.PathLike | None = None) -> EventDecoder:
    """An ``EventDecoder`` with the tuned parameters of ``path``.

    Args:
        path: the parameter file; ``None``, ``""`` or ``"default"``: the default chain, asked for explicitly.
        untuned: the bundle's own location of the tuned file (``models/decoder.json``): when ``path`` is it and it
            does not exist yet (the model was not trained or validated with decoder tuning), the default chain is
            used with a warning. Any other missing file is an error: a file the user named must be used.

    Raises:
        FileNotFoundError: ``path`` does not exist (and is not ``untuned``); one line naming it.
    """
    if path is None or str(path) in ("", "default"):
        return EventDecoder()
    if not Path(path).is_file():
        if untuned is None or Path(path).absolute() != Path(untuned).absolute():
            raise FileNotFoundError(
                f"decoder parameters {path} not found; give an existing file, or --decoder_params default for "
                "the default chain"
            )
        warnings.warn(
            f"decoder parameters {path} not found: decoding with the default parameters; train or evaluate "
            f"the bundle to tune them, or pass --decoder_params PATH",
            stacklevel=2,
        )
        return EventDecoder()
    return EventDecoder(path)
