"""Validation, reading and writing of event JSON files (the RARE-VISION challenge format).

``{"videos": [{"video_id": "1", "events": [{"start": 20, "end": 164, "label": ["mouth"]}]}]}``, inclusive frames.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from monai_vce.labels import LABELS
from monai_vce.utils import atomic_write_json, loads_json, read_regular_file, short_repr

from .metadata import write_events_meta
from .units import MAX_FRAME_ID, FrameUnits

__all__ = [
    "DEFAULT_MAX_BYTES",
    "DEFAULT_MAX_EVENTS",
    "EVENT_KEYS",
    "SCORE_KEY",
    "validate_events",
    "check_events",
    "load_events",
    "save_events",
    "to_challenge_format",
]

#: Largest event file :func:`load_events` reads by default (bytes); bigger files are refused before parsing.
DEFAULT_MAX_BYTES: int = 512 * 1024**2
#: Largest total number of events accepted by default (the 80 Galar videos have about 25 thousand).
DEFAULT_MAX_EVENTS: int = 2_000_000
#: The keys of one event in the challenge format.
EVENT_KEYS: tuple[str, ...] = ("start", "end", "label")
#: The one optional event key: a finite confidence score (higher = more suspicious); the challenge scorer ignores it.
SCORE_KEY: str = "score"
#: How many problems :func:`check_events` spells out before summarising the rest as a count.
_SHOWN_PROBLEMS = 20

_LABEL_SET = frozenset(LABELS)


def _describe(value: Any) -> str:
    """Type and short repr of a bad value, for messages."""
    return f"{type(value).__name__} {short_repr(value, 60)}"


def _is_frame(value: Any) -> bool:
    # bool is an int subclass but never a frame; numpy integers are not JSON-serialisable as they are
    return isinstance(value, int) and not isinstance(value, bool)


def _video_ids(obj: Any) -> list[Any] | None:
    if not isinstance(obj, Mapping) or not isinstance(obj.get("videos"), list):
        return None
    return [v.get("video_id") for v in obj["videos"] if isinstance(v, Mapping)]


def validate_events(
    obj: Any,
    gt: Mapping[str, Any] | None = None,
    max_events: int | None = DEFAULT_MAX_EVENTS,
    max_problems: int | None = 1000,
    strict: bool = True,
) -> list[str]:
    """List the problems of an event JSON object; an empty list means it is valid.

    Checks: the top level is a dict with a ``"videos"`` list; each video is a dict with a non-empty string
    ``video_id`` (unique in the file) and an ``"events"`` list; each event is a dict with the keys ``start``,
    ``end`` and ``label`` and optionally a finite number ``score`` (other keys are reported); ``start``
    and ``end`` are integers in ``[0, 2**31 - 1]`` (not bool, float or str; the bound keeps every frame exact in the
    metric's arithmetic) with ``start <= end``; ``label`` is a
    list of distinct names from :data:`~monai_vce.labels.LABELS` (exact spelling, as the challenge's scorer
    compares them). An empty ``label`` list is accepted: such an event takes part in no label's score (the
    Galar ground truth has one). With ``gt``, video ids missing from ``obj`` or absent from ``gt``
    are reported too (the challenge rejects a submission whose video ids differ from its ground truth).

    Args:
        obj: the parsed JSON object.
        gt: optional ground-truth event JSON whose video ids ``obj`` must match exactly.
        max_events: largest accepted total number of events; ``None`` for no limit.
        max_problems: stop listing after this many problems and append one line counting the rest;
            ``None`` lists all.
        strict: report keys other than the three and ``score``, and a ``score`` that is not a finite number;
            with ``False`` they are tolerated (in-memory decoder output that :func:`to_challenge_format` strips at write time).

    Returns:
        One message per problem, e.g. ``"video '3' (videos[2]) event 7: start 120 > end 80"``.
    """
    problems: list[str] = []
    extra = 0

    def report(msg: str) -> None:
        nonlocal extra
        if max_problems is None or len(problems) < max_problems:
            problems.append(msg)
        else:
            extra += 1

    if not isinstance(obj, Mapping):
        return [f"top level must be a dict with a 'videos' list, got {type(obj).__name__}"]
    if "videos" not in obj:
        return ["top level has no 'videos' key (expected {'videos': [...]})"]
    videos = obj["videos"]
    if not isinstance(videos, list):
        return [f"'videos' must be a list, got {_describe(videos)}"]
    for key in obj if strict else ():
        if key != "videos":
            report(f"unexpected top-level key {key!r} (the format has only 'videos')")

    seen: dict[str, int] = {}
    total = 0
    for i, video in enumerate(videos):
        where = f"videos[{i}]"
        if not isinstance(video, Mapping):
            report(f"{where}: must be a dict with 'video_id' and 'events', got {_describe(video)}")
            continue
        vid = video.get("video_id")
        if "video_id" not in video:
            report(f"{where}: missing key 'video_id'")
        elif not isinstance(vid, str) or not vid:
            report(f"{where}: 'video_id' must be a non-empty string, got {_describe(vid)}")
        else:
            where = f"video {short_repr(vid, 60)} ({where})"
            if vid in seen:
                report(f"{where}: duplicate video id (first listed at videos[{seen[vid]}])")
            else:
                seen[vid] = i
        for key in video if strict else ():
            if key not in ("video_id", "events"):
                report(f"{where}: unexpected key {short_repr(key, 60)} (a video has only 'video_id' and 'events')")
        if "events" not in video:
            report(f"{where}: missing key 'events'")
            continue
        events = video["events"]
        if not isinstance(events, list):
            report(f"{where}: 'events' must be a list, got {_describe(events)}")
            continue
        total += len(events)
        for j, event in enumerate(events):
            at = f"{where} event {j}"
            if not isinstance(event, Mapping):
                report(f"{at}: must be a dict with 'start', 'end', 'label', got {_describe(event)}")
                continue
            missing = [k for k in EVENT_KEYS if k not in event]
            if missing:
                report(f"{at}: missing key{'s' if len(missing) > 1 else ''} {', '.join(map(repr, missing))}")
            for key in event if strict else ():
                if key == SCORE_KEY:
                    if not _is_score(event[key]):
                        report(f"{at}: 'score' must be a finite number, got {_describe(event[key])}")
                elif key not in EVENT_KEYS:
                    report(
                        f"{at}: unexpected key {short_repr(key, 60)} "
                        "(an event has only 'start', 'end', 'label' and an optional 'score')"
                    )
            frames_ok = True
            for key in ("start", "end"):
                if key not in event:
                    frames_ok = False
                    continue
                value = event[key]
                if not _is_frame(value):
                    report(f"{at}: '{key}' must be an integer frame, got {_describe(value)}")
                    frames_ok = False
                elif value < 0:
                    report(f"{at}: '{key}' must be non-negative, got {short_repr(value, 40)}")
                    frames_ok = False
                elif value > MAX_FRAME_ID:
                    report(f"{at}: '{key}' must be at most {MAX_FRAME_ID} (2**31 - 1), got {short_repr(value, 40)}")
                    frames_ok = False
            if frames_ok and event["start"] > event["end"]:
                report(f"{at}: start {event['start']} > end {event['end']}")
            if "label" in event:
                labels = event["label"]
                if not isinstance(labels, list):
                    report(f"{at}: 'label' must be a list of label names, got {_describe(labels)}")
                else:
                    for name in labels:
                        if not isinstance(name, str) or name not in _LABEL_SET:
                            report(f"{at}: unknown label {short_repr(name, 60)}")
                    hashable = [n for n in labels if isinstance(n, str)]
                    if len(set(hashable)) != len(hashable):
                        dup = sorted({n for n in hashable if hashable.count(n) > 1})
                        report(f"{at}: label listed twice: {', '.join(map(short_repr, dup))}")
    if max_events is not None and total > max_events:
        report(f"{total} events in all, more than the limit of {max_events}")
    if gt is not None:
        gt_ids = _video_ids(gt)
        if gt_ids is None:
            report("the ground truth given for comparison is not an event JSON object")
        else:
            gt_set = {g for g in gt_ids if isinstance(g, str)}
            for g in gt_ids:
                if isinstance(g, str) and g not in seen:
                    report(f"video {short_repr(g, 60)}: in the ground truth but missing from the prediction")
            for vid, i in seen.items():
                if vid not in gt_set:
                    report(f"video {short_repr(vid, 60)} (videos[{i}]): not in the ground truth")
    if extra:
        problems.append(f"... and {extra} more problems not listed")
    return problems


def check_events(
    obj: Any,
    gt: Mapping[str, Any] | None = None,
    source: str = "event JSON",
    max_events: int | None = DEFAULT_MAX_EVENTS,
    strict: bool = True,
) -> Any:
    """Raise ``ValueError`` listing the problems of an event JSON object (see :func:`validate_events`).

    Args:
        obj: the parsed JSON object.
        gt: optional ground truth whose video ids ``obj`` must match.
        source: the file name or role of ``obj``, named in the message.
        max_events: largest accepted total number of events; ``None`` for no limit.
        strict: report keys the challenge format does not have (see :func:`validate_events`).

    Returns:
        ``obj`` unchanged when valid, so the call can be chained.

    Raises:
        ValueError: one line per problem (the first 20, then a count of the rest).
    """
    problems = validate_events(obj, gt=gt, max_events=max_events, max_problems=None, strict=strict)
    if problems:
        shown = problems[:_SHOWN_PROBLEMS]
        more = len(problems) - len(shown)
        lines = [f"{source}: {len(problems)} problem{'s' if len(problems) > 1 else ''} in the event JSON:"]
        lines += [f"  {p}" for p in shown]
        if more:
            lines.append(f"  ... and {more} more")
        raise ValueError("\n".join(lines))
    return obj


def load_events(
    path: str | os.PathLike,
    max_bytes: int | None = DEFAULT_MAX_BYTES,
    max_events: int | None = DEFAULT_MAX_EVENTS,
    validate: bool = True,
) -> dict[str, Any]:
    """Read an event JSON file.

    Args:
        path: the file.
        max_bytes: refuse files larger than this before reading them (bounds memory); ``None`` for no limit.
        max_events: refuse files with more events in all; ``None`` for no limit.
        validate: also run :func:`check_events` on the content.

    Raises:
        FileNotFoundError: the file does not exist.
        ValueError: the file is not a regular file (a device, a pipe, a folder), too large, unreadable, not UTF-8,
            not valid JSON (the message names the line and column), holds a key twice in one object, is nested too
            deeply, or (with ``validate``) is not a valid event JSON.
    """
    path = Path(path)
    # a regular file only (a device such as /dev/zero or a named pipe would be read forever or wait forever), at
    # most max_bytes read; strict JSON: a key repeated in one object (two "videos" lists) is refused
    obj = loads_json(read_regular_file(path, max_bytes, "event file"), f"event file {path}")
    if max_events is not None and isinstance(obj, Mapping) and isinstance(obj.get("videos"), list):
        total = sum(
            len(v["events"]) for v in obj["videos"] if isinstance(v, Mapping) and isinstance(v.get("events"), list)
        )
        if total > max_events:
            raise ValueError(
                f"event file {path} has {total} events, more than the limit of {max_events} (raise max_events to read it)"
            )
    if validate:
        check_events(obj, source=str(path), max_events=max_events)
    return obj


def _is_score(value: Any) -> bool:
    return (
        isinstance(value, (int, float, np.integer, np.floating))
        and not isinstance(value, (bool, np.bool_))
        and math.isfinite(float(value))
    )


def _plain_event(event: Any, scores: bool = False) -> Any:
    if not isinstance(event, Mapping):
        return event
    out = {}
    for key in EVENT_KEYS:
        if key not in event:
            continue
        value = event[key]
        if key == "label":
            if isinstance(value, (tuple, np.ndarray)):
                value = [str(v) if isinstance(v, np.str_) else v for v in list(value)]
        elif isinstance(value, np.integer):
            value = int(value)
        out[key] = value
    if scores and SCORE_KEY in event:
        value = event[SCORE_KEY]
        out[SCORE_KEY] = float(value) if _is_score(value) else value
    return out


def to_challenge_format(obj: Mapping[str, Any] | Iterable[Mapping[str, Any]], scores: bool = False) -> Any:
    """Return a copy in the challenge format: only ``start``, ``end``, ``label`` per event (and ``score`` if asked).

    Extra keys (the decoder's ``score`` unless ``scores``) are dropped, numpy integers and floats become
    Python ints and label tuples or arrays become lists, so that the result serialises to JSON. Values of the
    wrong kind (a float frame, a string label) are kept as they are for :func:`validate_events` to report.

    Args:
        obj: an event JSON object (``{"videos": [...]}``) or a list of events of one video.
        scores: keep each event's ``score`` (the screening events).

    Returns:
        The converted copy, of the same kind as ``obj``.
    """
    if isinstance(obj, Mapping):
        if not isinstance(obj.get("videos"), list):
            return obj
        videos = []
        for v in obj["videos"]:
            if isinstance(v, Mapping) and isinstance(v.get("events"), Sequence):
                vid = v.get("video_id")
                v = {
                    "video_id": str(vid) if isinstance(vid, (np.str_, np.integer)) else vid,
                    "events": [_plain_event(e, scores) for e in v["events"]],
                }
            videos.append(v)
        return {"videos": videos}
    return [_plain_event(e, scores) for e in obj]


def save_events(
    path: str | os.PathLike,
    obj: Mapping[str, Any],
    gt: Mapping[str, Any] | None = None,
    indent: int | None = 2,
    frame_units: FrameUnits | str | None = None,
    videos: Mapping[str, Mapping[str, int]] | None = None,
    scores: bool = False,
) -> Path:
    """Write an event JSON file atomically after converting it with :func:`to_challenge_format` and validating it.

    Args:
        path: destination file.
        obj: the event JSON object (extra event keys such as ``score`` are dropped).
        gt: optional ground truth whose video ids the file must match.
        indent: JSON indentation; ``None`` for the most compact form.
        frame_units: the units of the frames; recorded in the sidecar ``<name>.meta.json``
            (:mod:`monai_vce.events.metadata`), which every writer of the package gives.
        videos: optional per-video ``{"frames", "first", "last"}`` recorded in the sidecar.
        scores: keep each event's ``score`` (a finite number; the screening events).

    Returns:
        The destination path.

    Raises:
        ValueError: the content is invalid; nothing is written then.
    """
    data = to_challenge_format(obj, scores=scores)
    out = atomic_write_json(
        path, data, indent=indent, validate=lambda o: check_events(o, gt=gt, source=str(path), max_events=None)
    )
    if frame_units is not None:
        write_events_meta(out, frame_units, videos)
    return out
