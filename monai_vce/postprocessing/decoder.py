"""The event decoder: per-frame probabilities of a video -> challenge events, most confident first.

Steps, for a ``(T, 17)`` probability array of one video (any model's scores in ``[0, 1]``):

1. the chain of :mod:`~monai_vce.postprocessing.chain` with per-label parameters and a configurable order;
2. presence gating (:mod:`~monai_vce.postprocessing.gating`): a label whose per-video presence rule fails is
   cleared from the whole video;
3. optionally, anatomy decoding (:mod:`~monai_vce.postprocessing.anatomy`): the five section columns are
   replaced by a Viterbi decode over all sections (with an optional lead-in state for the unannotated
   first frames), of which only the sections found present are emitted; landmarks are kept only near a decoded
   transition across their boundary, and pathologies optionally only inside plausible sections;
4. event composition with :func:`~monai_vce.events.frames_to_events` (label-set runs by
   default, as the ground truth is built; per-label runs as an option), in the caller's frame units;
5. confidence order: events sorted by a confidence score, highest first (ties keep time order).

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

Parameters live in :class:`DecoderParams`, one versioned JSON file keyed by label name.
"""

from __future__ import annotations

import copy
import json
import math
import os
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..events import COMPOSITIONS, event_json, frames_to_events
from ..labels import LABELS, LANDMARKS, NUM_LABELS, SECTIONS
from ..utils import atomic_write_json
from .anatomy import decode_sections, landmark_windows, section_gate
from .chain import CHAIN_STEPS, PAPER_ORDER, PAPER_PARAMS, apply_chain
from .gating import PRESENCE_FEATURES, apply_presence_rules

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

DECODER_PARAMS_VERSION = 1
RANKINGS: tuple[str, ...] = ("mean", "max", "min", "none")
FRAME_UNITS: tuple[str, ...] = ("index", "frame_number")

_SECTION_COLS = np.array([LABELS.index(s) for s in SECTIONS])
_LANDMARK_COLS = {name: LABELS.index(name) for name in LANDMARKS}

DEFAULT_ANATOMY: dict[str, Any] = {
    "enabled": False,
    "emission_weight": 0.1,
    "switch_cost": 20.0,
    "skip_cost": 20.0,
    "backward_cost": 60.0,
    "entry_cost": None,
    "landmark_window": {name: 100 for name in LANDMARKS},
    "gate_landmarks": True,
    "pathology_sections": {},
}


def _default_label() -> dict[str, Any]:
    return {
        "threshold": float(PAPER_PARAMS["threshold"]),
        "median_window": int(PAPER_PARAMS["median_window"]),
        "max_gap": int(PAPER_PARAMS["max_gap"]),
        "min_length": int(PAPER_PARAMS["min_length"]),
        "presence": {"feature": "none"},
    }


class DecoderParams:
    """All parameters of :class:`EventDecoder`, as one versioned JSON object.

    JSON schema (version 1)::

        {"version": 1,
         "labels": {"<label>": {"threshold": float in [0, 1], "median_window": odd int >= 1,
                                "max_gap": int >= 0, "min_length": int >= 0,
                                "presence": {"feature": "none" | "never" | "peak" | "quantile" | "support",
                                             "cutoff": float, "window": int, "q": float}}, ...},   # all 17
         "order": ["threshold", "median", "fill_gaps", "min_length"],   # any order, steps may be left out
         "composition": "label_set" | "per_label",
         "ranking": "mean" | "max" | "min" | "none",
         "frame_units": "index" | "frame_number",
         "anatomy": {"enabled": bool, "emission_weight": float, "switch_cost": float, "skip_cost": float,
                     "backward_cost": float, "entry_cost": float | null, "landmark_window": {"<landmark>": int},
                     "gate_landmarks": bool, "pathology_sections": {"<pathology>": ["<section>", ...]}},
         "fit": {...}}   # optional, free-form record of how the parameters were fitted

    Args:
        data: a dict in the schema above; missing keys take the paper's defaults (thresholds 0.5, median 7,
            gaps 5, minimum length 3, no gating, no anatomy decoding).
        source: where the dict came from, used in error messages.
    """

    def __init__(self, data: Mapping[str, Any] | None = None, source: str = "decoder parameters") -> None:
        self.source = source
        self.data = self._complete(dict(data or {}))
        self.validate()

    # construction -----------------------------------------------------------------------------------
    @staticmethod
    def _complete(data: dict[str, Any]) -> dict[str, Any]:
        out = copy.deepcopy(data)
        out.setdefault("version", DECODER_PARAMS_VERSION)
        labels = out.get("labels", {})
        if isinstance(labels, Mapping):
            out["labels"] = {name: {**_default_label(), **dict(labels.get(name, {}))} for name in LABELS} | {
                k: v for k, v in labels.items() if k not in LABELS
            }
        out.setdefault("order", list(PAPER_ORDER))
        out.setdefault("composition", "label_set")
        out.setdefault("ranking", "mean")
        out.setdefault("frame_units", "index")
        anatomy = out.get("anatomy", {})
        if isinstance(anatomy, Mapping):
            merged = {**copy.deepcopy(DEFAULT_ANATOMY), **dict(anatomy)}
            if isinstance(merged.get("landmark_window"), (int, float)):
                merged["landmark_window"] = {name: merged["landmark_window"] for name in LANDMARKS}
            elif isinstance(merged.get("landmark_window"), Mapping):
                merged["landmark_window"] = {**DEFAULT_ANATOMY["landmark_window"], **merged["landmark_window"]}
            out["anatomy"] = merged
        return out

    @classmethod
    def paper(cls, **overrides: Any) -> DecoderParams:
        """The paper's chain: thresholds 0.5, median 7, gaps <= 5 filled, events < 3 frames removed."""
        return cls(overrides, source="paper parameters")

    @classmethod
    def from_thresholds(cls, thresholds: Mapping[str, float] | str | os.PathLike, **overrides: Any) -> DecoderParams:
        """Parameters from a plain ``{label: threshold}`` JSON (or dict); everything else as in :meth:`paper`."""
        source = "thresholds"
        if not isinstance(thresholds, Mapping):
            source = str(thresholds)
            thresholds = cls._read_json(thresholds)
        if not isinstance(thresholds, Mapping):
            raise ValueError(f"{source}: expected a JSON object {{label: threshold}}, got {type(thresholds).__name__}")
        labels = {}
        for name, value in thresholds.items():
            if name not in LABELS:
                raise ValueError(f"{source}: unknown label {name!r}; expected names from {list(LABELS)}")
            labels[name] = {"threshold": value}
        return cls({**overrides, "labels": labels}, source=source)

    @staticmethod
    def _read_json(path: str | os.PathLike) -> Any:
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"decoder parameter file {path} does not exist")
        try:
            return json.loads(path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise ValueError(f"{path}: not valid JSON ({err})") from None

    @classmethod
    def load(cls, path: str | os.PathLike) -> DecoderParams:
        """Read and validate a parameter file; errors name the file and the key."""
        data = cls._read_json(path)
        if not isinstance(data, Mapping):
            raise ValueError(f"{path}: expected a JSON object, got {type(data).__name__}")
        if data.get("version") != DECODER_PARAMS_VERSION:
            raise ValueError(f"{path}: 'version' must be {DECODER_PARAMS_VERSION}, got {data.get('version')!r}")
        return cls(data, source=str(path))

    def save(self, path: str | os.PathLike) -> Path:
        """Validate and write the parameters atomically as JSON."""
        self.validate()
        return atomic_write_json(path, self.to_dict())

    def to_dict(self) -> dict[str, Any]:
        """A deep copy of the JSON object."""
        return copy.deepcopy(self.data)

    def copy(self) -> DecoderParams:
        return DecoderParams(self.to_dict(), source=self.source)

    # validation -------------------------------------------------------------------------------------
    def _fail(self, key: str, msg: str) -> None:
        raise ValueError(f"{self.source}: {key}: {msg}")

    def validate(self) -> None:
        """Raise ``ValueError`` naming the source and the key of the first invalid entry."""
        d = self.data
        if d.get("version") != DECODER_PARAMS_VERSION:
            self._fail("version", f"must be {DECODER_PARAMS_VERSION}, got {d.get('version')!r}")
        known = {"version", "labels", "order", "composition", "ranking", "frame_units", "anatomy", "fit"}
        for key in d:
            if key not in known:
                self._fail(key, f"unknown key; expected keys from {sorted(known)}")
        labels = d["labels"]
        if not isinstance(labels, Mapping):
            self._fail("labels", f"must be an object keyed by label name, got {type(labels).__name__}")
        for name in labels:
            if name not in LABELS:
                self._fail(f"labels.{name}", f"unknown label; expected names from {list(LABELS)}")
        for name in LABELS:
            self._check_label(name, labels[name])
        order = d["order"]
        if not isinstance(order, list) or any(s not in CHAIN_STEPS for s in order) or len(set(order)) != len(order):
            self._fail("order", f"must be a list of distinct steps from {list(CHAIN_STEPS)}, got {order!r}")
        if "threshold" not in order:
            self._fail("order", "must contain 'threshold'")
        th = order.index("threshold")
        for step in ("fill_gaps", "min_length"):
            if step in order and order.index(step) < th:
                self._fail("order", f"{step!r} works on the binary mask and must come after 'threshold'")
        for key, allowed in (("composition", COMPOSITIONS), ("ranking", RANKINGS), ("frame_units", FRAME_UNITS)):
            if d[key] not in allowed:
                self._fail(key, f"must be one of {list(allowed)}, got {d[key]!r}")
        self._check_anatomy(d["anatomy"])
        if "fit" in d and not isinstance(d["fit"], Mapping):
            self._fail("fit", "must be an object")

    def _check_label(self, name: str, p: Any) -> None:
        key = f"labels.{name}"
        if not isinstance(p, Mapping):
            self._fail(key, f"must be an object, got {type(p).__name__}")
        for k in p:
            if k not in ("threshold", "median_window", "max_gap", "min_length", "presence"):
                self._fail(
                    f"{key}.{k}", "unknown key; expected threshold, median_window, max_gap, min_length, presence"
                )
        t = p["threshold"]
        if not _is_number(t) or not 0.0 <= float(t) <= 1.0:
            self._fail(f"{key}.threshold", f"must be a number in [0, 1], got {t!r}")
        w = p["median_window"]
        if not _is_int(w) or w < 1 or w % 2 == 0:
            self._fail(f"{key}.median_window", f"must be an odd integer >= 1, got {w!r}")
        for k in ("max_gap", "min_length"):
            if not _is_int(p[k]) or p[k] < 0:
                self._fail(f"{key}.{k}", f"must be an integer >= 0, got {p[k]!r}")
        rule = p["presence"]
        if not isinstance(rule, Mapping) or rule.get("feature") not in PRESENCE_FEATURES:
            self._fail(
                f"{key}.presence", f"must be an object with 'feature' in {list(PRESENCE_FEATURES)}, got {rule!r}"
            )
        if rule["feature"] not in ("none", "never"):
            if not _is_number(rule.get("cutoff")) or not math.isfinite(float(rule["cutoff"])):
                self._fail(f"{key}.presence.cutoff", f"must be a finite number, got {rule.get('cutoff')!r}")
        if rule["feature"] == "peak" and not (_is_int(rule.get("window", 1)) and rule.get("window", 1) >= 1):
            self._fail(f"{key}.presence.window", f"must be an integer >= 1, got {rule.get('window')!r}")
        if rule["feature"] == "quantile" and not (_is_number(rule.get("q", 0.99)) and 0 <= rule.get("q", 0.99) <= 1):
            self._fail(f"{key}.presence.q", f"must be a number in [0, 1], got {rule.get('q')!r}")

    def _check_anatomy(self, a: Any) -> None:
        if not isinstance(a, Mapping):
            self._fail("anatomy", f"must be an object, got {type(a).__name__}")
        for k in a:
            if k not in DEFAULT_ANATOMY:
                self._fail(f"anatomy.{k}", f"unknown key; expected keys from {sorted(DEFAULT_ANATOMY)}")
        for k in ("enabled", "gate_landmarks"):
            if not isinstance(a[k], bool):
                self._fail(f"anatomy.{k}", f"must be true or false, got {a[k]!r}")
        for k in ("emission_weight", "switch_cost", "skip_cost", "backward_cost", "entry_cost"):
            if k == "entry_cost" and a[k] is None:
                continue
            if not _is_number(a[k]) or float(a[k]) < 0 or not math.isfinite(float(a[k])):
                self._fail(f"anatomy.{k}", f"must be a finite number >= 0, got {a[k]!r}")
        lw = a["landmark_window"]
        if not isinstance(lw, Mapping):
            self._fail("anatomy.landmark_window", f"must be an object keyed by landmark, got {lw!r}")
        for name, w in lw.items():
            if name not in LANDMARKS:
                self._fail(f"anatomy.landmark_window.{name}", f"unknown landmark; expected one of {list(LANDMARKS)}")
            if not _is_int(w) or w < 0:
                self._fail(f"anatomy.landmark_window.{name}", f"must be an integer >= 0, got {w!r}")
        ps = a["pathology_sections"]
        if not isinstance(ps, Mapping):
            self._fail("anatomy.pathology_sections", f"must be an object {{label: [sections]}}, got {ps!r}")
        for name, secs in ps.items():
            if name not in LABELS or name in SECTIONS:
                self._fail(f"anatomy.pathology_sections.{name}", "must be a non-section label")
            if not isinstance(secs, list) or any(s not in SECTIONS for s in secs):
                self._fail(
                    f"anatomy.pathology_sections.{name}",
                    f"must be a list of sections from {list(SECTIONS)}, got {secs!r}",
                )

    # per-label arrays -------------------------------------------------------------------------------
    def per_label(self, key: str) -> np.ndarray:
        """``(17,)`` array of one per-label parameter (``threshold``, ``median_window``, ...) in LABELS order."""
        dtype = np.float64 if key == "threshold" else np.int64
        return np.array([self.data["labels"][n][key] for n in LABELS], dtype=dtype)

    def presence_rules(self) -> list[dict[str, Any]]:
        return [dict(self.data["labels"][n]["presence"]) for n in LABELS]

    def __getitem__(self, key: str) -> Any:
        return self.data[key]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, DecoderParams) and self.data == other.data

    def __repr__(self) -> str:
        return f"DecoderParams(composition={self.data['composition']!r}, anatomy={self.data['anatomy']['enabled']}, source={self.source!r})"


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, bool)


def _is_int(x: Any) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, bool)


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
        a = self.params["anatomy"]
        allowed = np.ones(len(SECTIONS), bool) if present is None else np.asarray(present)[_SECTION_COLS]
        if not allowed.any():
            return None
        return decode_sections(
            probs[:, _SECTION_COLS],
            a["emission_weight"],
            a["switch_cost"],
            a["skip_cost"],
            a["backward_cost"],
            a["entry_cost"],
            allowed=allowed,
        )

    def masks(self, probs: np.ndarray, frame_ids: np.ndarray | None = None, video_id: str | None = None) -> np.ndarray:
        """The ``(T, 17)`` activity mask after the chain, presence gating and anatomy decoding."""
        if frame_ids is None:
            frame_ids = np.arange(np.asarray(probs).shape[0])
        probs, frame_ids = check_probabilities(probs, frame_ids, video_id)
        return self._masks(probs)[0]

    def _masks(self, probs: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        p = self.params
        mask = apply_chain(
            probs,
            thresholds=p.per_label("threshold"),
            median_windows=p.per_label("median_window"),
            max_gaps=p.per_label("max_gap"),
            min_lengths=p.per_label("min_length"),
            order=p["order"],
        )
        present = apply_presence_rules(probs, mask, p.presence_rules())
        mask[:, ~present] = False
        sections = None
        a = p["anatomy"]
        if a["enabled"] and probs.shape[0]:
            # the Viterbi decodes all sections (a section gated out still claims its frames, which then carry
            # no section), exactly as the tuning scores them
            sections = self.sections(probs)
            mask[:, _SECTION_COLS] = False
            if sections is not None:
                rows = np.flatnonzero(sections >= 0)
                mask[rows, _SECTION_COLS[sections[rows]]] = True
                mask[:, _SECTION_COLS[~present[_SECTION_COLS]]] = False
                if a["gate_landmarks"]:
                    allowed = landmark_windows(sections, a["landmark_window"])
                    for name, col in _LANDMARK_COLS.items():
                        mask[:, col] &= allowed[name]
                for name, secs in a["pathology_sections"].items():
                    mask[:, LABELS.index(name)] &= section_gate(sections, secs)
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
        events = frames_to_events(mask, frame_ids, mode=p["composition"])
        ranking = p["ranking"]
        if ranking == "none" or len(events) < 2:
            return events
        scores = event_confidence(events, frame_ids, probs, ranking)
        order = np.argsort(-scores, kind="stable")
        return [events[i] for i in order.tolist()]


def event_confidence(
    events: Sequence[Mapping[str, Any]], frame_ids: np.ndarray, probs: np.ndarray, ranking: str = "mean"
) -> np.ndarray:
    """Confidence of each event: its labels' mean probabilities over its frames, combined by ``ranking``."""
    n = len(events)
    if n == 0:
        return np.zeros(0)
    T = probs.shape[0]
    csum = np.zeros((T + 1, NUM_LABELS))
    np.cumsum(probs, axis=0, out=csum[1:])
    first = np.searchsorted(frame_ids, np.fromiter((e["start"] for e in events), np.int64, n))
    last = np.searchsorted(frame_ids, np.fromiter((e["end"] for e in events), np.int64, n))
    member = np.zeros((n, NUM_LABELS), dtype=bool)
    index = {name: i for i, name in enumerate(LABELS)}
    rows = np.repeat(np.arange(n), [len(e["label"]) for e in events])
    cols = np.fromiter((index[name] for e in events for name in e["label"]), np.int64, rows.size)
    member[rows, cols] = True
    mean = (csum[last + 1] - csum[first]) / (last - first + 1)[:, None]
    if ranking == "mean":
        return (mean * member).sum(axis=1) / np.maximum(member.sum(axis=1), 1)
    if ranking == "max":
        return np.where(member, mean, -np.inf).max(axis=1)
    if ranking == "min":
        return np.where(member, mean, np.inf).min(axis=1)
    raise ValueError(f"ranking must be one of {list(RANKINGS)}, got {ranking!r}")


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


def load_decoder(path: str | os.PathLike | None) -> EventDecoder:
    """An ``EventDecoder`` with the tuned parameters of ``path``, or the default chain with a warning when the
    file does not exist (the model was not trained or validated with decoder tuning yet)."""
    if path is None:
        return EventDecoder()
    if not Path(path).is_file():
        warnings.warn(
            f"decoder parameters {path} not found: decoding with the default parameters; train or evaluate "
            f"the bundle to tune them, or pass --decoder_params PATH",
            stacklevel=2,
        )
        return EventDecoder()
    return EventDecoder(path)
