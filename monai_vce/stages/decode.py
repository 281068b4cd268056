"""Decode a folder of per-video probability files into the event JSON: the product's one writer of event JSON.

Reference: :class:`monai_vce.postprocessing.EventDecoder`; file formats in :mod:`monai_vce.events`.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from monai_vce.events.composition import event_json
from monai_vce.events.metadata import describe_events_file
from monai_vce.events.probabilities import load_video_probs, probability_file
from monai_vce.events.units import FrameUnits, as_frame_units
from monai_vce.events.validation import save_events
from monai_vce.postprocessing.decoder import DecoderParams, EventDecoder
from monai_vce.postprocessing.recalibration import ReferenceQuantiles, load_reference_quantiles, recalibrate_decoder

from ._common import main_process, require_files, stage_videos

__all__ = ["as_decoder", "events_units", "write_events", "decode"]

logger = logging.getLogger(__name__)

PathLike = str | os.PathLike


def as_decoder(decoder: Any = None) -> Callable[..., Any]:
    """The decoder a stage decodes with: an ``EventDecoder`` or another callable as it is, else
    ``EventDecoder(decoder)`` (``DecoderParams``, dict, JSON path or ``None`` for the defaults)."""
    if isinstance(decoder, EventDecoder):
        return decoder
    if callable(decoder) and not isinstance(decoder, (str, os.PathLike, Mapping)):
        return decoder
    return EventDecoder(decoder)


def events_units(decoder: Any = None, frame_units: FrameUnits | str | None = None) -> FrameUnits:
    """The frame units events are written in: ``frame_units``, checked against the decoder's fitted parameters.

    Only fitted parameters (a ``fit`` record) state their units; ``None`` takes theirs, else ``"frame_index"``.

    Raises:
        ValueError: parameters fitted in other units than ``frame_units`` (their windows count other frames).
    """
    params = getattr(as_decoder(decoder), "params", None)
    fitted = params.frame_units if isinstance(params, DecoderParams) and "fit" in params else None
    if frame_units is None:
        return fitted or FrameUnits.FRAME_INDEX
    units = as_frame_units(frame_units)
    if fitted is not None and fitted is not units:
        raise ValueError(
            f"the decoder parameters ({getattr(params, 'source', 'decoder')}) were fitted in {fitted.value} units, "
            f"but the run decodes in {units.value} units (their windows and gaps count other frames); "
            f"pass frame_units={fitted.value!r} or parameters fitted in {units.value} units"
        )
    return units


def write_events(
    events: Mapping[str, Sequence[Mapping[str, Any]]],
    events_file: PathLike,
    frame_units: FrameUnits | str | None = None,
    videos: Mapping[str, Mapping[str, int]] | None = None,
    scores: bool = False,
) -> Path | None:
    """Write decoded events ``{video_id: events}`` (in listing order) as an event JSON, atomically (rank 0 only).

    Args:
        events: the events of each video.
        events_file: the JSON path.
        frame_units: recorded in the units sidecar ``<name>.meta.json`` (``None``: no sidecar).
        videos: per-video ``{"frames", "first", "last"}`` recorded in the sidecar.
        scores: keep each event's ``score`` (the screening events); otherwise the challenge's three keys.

    Returns:
        The JSON path, or ``None`` on other ranks.

    Raises:
        ValueError: invalid events (nothing is written).
    """
    if not main_process():
        return None
    obj = event_json(events, challenge_format=False)
    return save_events(events_file, obj, frame_units=frame_units, videos=videos, scores=scores)


def decode(
    probs_dir: PathLike,
    events_file: PathLike,
    decoder: Any = None,
    videos: Iterable[str] | None = None,
    frame_units: FrameUnits | str | None = None,
    log: Callable[[str], Any] | None = None,
    recalibration: ReferenceQuantiles | PathLike | None = None,
) -> Path | None:
    """Decode every ``<probs_dir>/<video_id>.npz`` and write the event JSON with its units sidecar (rank 0 only).

    Events keep their ``score`` when the decoder parameters' ``scores`` is on (the screening profile).

    Reads one video at a time (memory bounded by the longest video); a video without frames gets no events.

    Args:
        probs_dir: folder of the per-video probability files.
        events_file: the event JSON path.
        decoder: an ``EventDecoder`` (or callable ``(probs, frame_ids, video_id=...) -> events``), decoder
            parameters (``DecoderParams``, dict, JSON path) or ``None`` for the defaults.
        videos: the videos the JSON lists, in order; ``None``: every file of ``probs_dir`` in natural order.
        frame_units: frame ids of the events; ``None``: the fitted decoder parameters' (:func:`events_units`).
        log: receives the summary line (default: this module's logger).
        recalibration: the reference score distribution of validation (``ReferenceQuantiles`` or its JSON): each
            exam is decoded with the thresholds and presence cut-offs mapped to its own score distribution
            (:func:`~monai_vce.postprocessing.recalibrate_decoder`); ``None``: the parameters as fitted.

    Returns:
        The JSON path, or ``None`` on other ranks.

    Raises:
        FileNotFoundError: a video of ``videos`` has no probability file (one line naming them).
        ValueError: decoder parameters fitted in other units, or a malformed file (naming it).
    """
    if not main_process():
        return None
    decoder = as_decoder(decoder)
    if recalibration is not None and not isinstance(decoder, EventDecoder):
        raise ValueError(f"recalibration needs an EventDecoder (decoder parameters), got {type(decoder).__name__}")
    if recalibration is not None and not isinstance(recalibration, ReferenceQuantiles):
        recalibration = load_reference_quantiles(recalibration)
    units = events_units(decoder, frame_units)
    ids = stage_videos(probs_dir, videos)
    require_files(probs_dir, ids)
    events: dict[str, list] = {}
    frames: dict[str, dict[str, int]] = {}
    for vid in ids:
        video = load_video_probs(probability_file(probs_dir, vid), video_id=vid)
        frame_ids = video.frame_ids(units)
        # an EventDecoder converts windows given in seconds at the video's row rate
        rate = {"rows_per_second": video.rows_per_second} if isinstance(decoder, EventDecoder) else {}
        exam_decoder = decoder
        if recalibration is not None and len(video):
            exam_decoder = EventDecoder(recalibrate_decoder(decoder.params, video.probs, recalibration))
        events[vid] = list(exam_decoder(video.probs, frame_ids, video_id=vid, **rate)) if len(video) else []
        if len(video):
            frames[vid] = {"frames": len(video), "first": int(frame_ids[0]), "last": int(frame_ids[-1])}
    params = getattr(decoder, "params", None)
    scores = isinstance(params, DecoderParams) and bool(params.get("scores", False))
    path = write_events(events, events_file, frame_units=units, videos=frames, scores=scores)
    assert path is not None  # the main process, checked above
    n_events = sum(len(v) for v in events.values())
    (log or logger.info)(f"wrote {n_events} events of {len(events)} videos: {describe_events_file(path, units)}")
    return path
