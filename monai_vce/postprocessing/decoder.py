"""The event decoder: ``(T, 17)`` probabilities of a video -> challenge events, most confident first.

Chain, optional anatomy decoding, presence gating, composition, confidence order; parameters:
:class:`~monai_vce.postprocessing.DecoderParams`.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..events.composition import RANKINGS, compose_runs, confidence_order, event_json, run_confidence, runs_to_events
from ..events.probabilities import Video
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
    "event_scores",
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
        #: applied to the probabilities before anything else (the parameters' ``calibration``)
        self.calibration = self.params.calibration
        self._at_rate: dict[float, EventDecoder] = {}
        self._warned_rate = False

    def at_rate(self, rows_per_second: float | None, video_id: str | None = None) -> EventDecoder:
        """The decoder of a video recorded at ``rows_per_second``: with windows in seconds (``params["window_seconds"]``)
        converted to its rows (:meth:`DecoderParams.rows_at`); itself without them. A video of unknown rate keeps
        the row windows, with a warning."""
        if "window_seconds" not in self.params:
            return self
        if rows_per_second is None:
            if not self._warned_rate:
                warnings.warn(
                    f"video {video_id!r} has no frame rate: its decoder windows count rows (those of "
                    f"{self.params.source}), not the seconds given; set the bundle's frame_rate or a metadata.csv "
                    "frame_rate column",
                    stacklevel=2,
                )
                self._warned_rate = True
            return self
        key = round(float(rows_per_second), 9)
        if key not in self._at_rate:
            self._at_rate[key] = EventDecoder(self.params.rows_at(key))
        return self._at_rate[key]

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
        return self._masks(self._calibrated(probs))[0]

    def _calibrated(self, probs: np.ndarray) -> np.ndarray:
        return probs if self.calibration is None else self.calibration(probs)

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

    def __call__(
        self,
        probs: np.ndarray,
        frame_ids: np.ndarray,
        video_id: str | None = None,
        rows_per_second: float | None = None,
    ) -> list[dict[str, Any]]:
        """Events of one video in challenge format, most confident first.

        Args:
            probs: ``(T, 17)`` probabilities in LABELS order (finite, in ``[0, 1]``).
            frame_ids: ``(T,)`` strictly increasing frame ids in the units of ``params["frame_units"]``
                (``frame_index`` or ``frame_number`` of the datalist / probability files).
            video_id: named in error messages.
            rows_per_second: the video's row rate (:attr:`monai_vce.events.Video.rows_per_second`), which converts
                windows given in seconds (:meth:`at_rate`); ``None``: unknown.
        """
        decoder = self.at_rate(rows_per_second, video_id)
        if decoder is not self:
            return decoder(probs, frame_ids, video_id)
        probs, frame_ids = check_probabilities(probs, frame_ids, video_id)
        probs = self._calibrated(probs)
        mask, _ = self._masks(probs)
        return self.compose(mask, frame_ids, probs)

    def decode(self, video: Video) -> list[dict[str, Any]]:
        """Events of one :class:`~monai_vce.events.Video` in the frame units of its ground truth
        (:attr:`~monai_vce.events.Video.units`, chosen where it was read), else in the parameters' ``frame_units``."""
        ids = video.frame_ids(video.units or self.params.frame_units)
        return self(video.probs, ids, str(video.video_id), video.rows_per_second)

    def compose(self, mask: np.ndarray, frame_ids: np.ndarray, probs: np.ndarray) -> list[dict[str, Any]]:
        """Compose events from a final mask and order them by confidence; with ``params["scores"]`` each event
        carries its ``score`` (:func:`event_scores`) and the order is by score."""
        p = self.params
        start, stop, member = compose_runs(mask, p["composition"])
        ranking = p["ranking"]
        scored = bool(p.get("scores", False)) and start.size > 0
        if not scored and (ranking == "none" or start.size < 2):
            return runs_to_events(frame_ids, start, stop, member)
        csum = np.zeros((probs.shape[0] + 1, NUM_LABELS))
        np.cumsum(probs, axis=0, out=csum[1:])
        score = event_scores(csum, start, stop, member, p.per_label("threshold")) if scored else None
        if ranking != "none" and start.size >= 2:
            conf = np.asarray(score) if score is not None else run_confidence(csum, start, stop, member, ranking)
            order = confidence_order(conf, start)
            start, stop, member = start[order], stop[order], member[order]
            score = None if score is None else [score[i] for i in order]
        events = runs_to_events(frame_ids, start, stop, member)
        for event, value in zip(events, score or (), strict=False):
            event["score"] = value
        return events


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


def event_scores(
    csum: np.ndarray, start: np.ndarray, stop: np.ndarray, member: np.ndarray, thresholds: np.ndarray
) -> list[float]:
    """Score of each run: over its labels, the highest logit margin of the label's mean probability over the run
    above the label's threshold (``logit(mean) - logit(threshold)``; comparable across labels, 0 at the threshold).

    Args:
        csum: ``(T + 1, 17)`` cumulative sums of the probabilities, ``csum[0] == 0``.
        start: first row of each run.
        stop: one-past-last row of each run.
        member: ``(N, 17)`` bool, the labels of each run.
        thresholds: ``(17,)`` per-label thresholds.
    """
    eps = 1e-6
    mean = np.clip((csum[stop] - csum[start]) / (stop - start)[:, None], eps, 1 - eps)
    th = np.clip(np.asarray(thresholds, dtype=np.float64), eps, 1 - eps)
    margin = np.log(mean / (1 - mean)) - np.log(th / (1 - th))[None, :]
    return [round(float(x), 6) for x in np.where(member, margin, -np.inf).max(axis=1)]


def decode_videos(
    videos: Mapping[str, Video] | Iterable[Video],
    decoder: EventDecoder | DecoderParams | Mapping | str | os.PathLike | None = None,
) -> dict[str, Any]:
    """Decode several videos into one challenge event JSON object.

    Each video's events count in its :attr:`~monai_vce.events.Video.units` (:meth:`EventDecoder.decode`).

    Args:
        videos: :class:`~monai_vce.events.Video` records (or a mapping of them), listed in this order.
        decoder: an :class:`EventDecoder` or anything :class:`EventDecoder` accepts.

    Returns:
        ``{"videos": [{"video_id": str, "events": [...]}]}`` with each video's events most confident first; each
        event carries its ``score`` when the parameters' ``scores`` is on (the screening profile).
    """
    if not isinstance(decoder, EventDecoder):
        decoder = EventDecoder(decoder)
    items = videos.values() if isinstance(videos, Mapping) else videos
    events = {str(v.video_id): decoder.decode(v) for v in items}
    return event_json(events, scores=bool(decoder.params.get("scores", False)))


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
