"""The frame units of an event file, in a sidecar ``<name>.meta.json`` tied to it by SHA-256, and the conversion of
events between the two units.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from monai_vce.utils import atomic_write_json

from .probabilities import load_video_probs, probability_file
from .runs import run_spans
from .units import FrameUnits, as_frame_units

__all__ = [
    "EVENTS_META_SUFFIX",
    "events_meta_path",
    "write_events_meta",
    "read_events_meta",
    "read_frame_units",
    "describe_events_file",
    "convert_events",
    "recorded_frame_units",
    "frame_id_maps",
    "events_in_common_units",
]

logger = logging.getLogger(__name__)

PathLike = str | os.PathLike

#: Suffix of the sidecar of an event file (replacing a ``.json`` suffix).
EVENTS_META_SUFFIX = ".meta.json"
_FORMAT = "monai-vce event file metadata"
_VERSION = 1


def events_meta_path(events_file: PathLike) -> Path:
    """The sidecar of an event file: ``events.json`` -> ``events.meta.json`` (other names get the suffix appended)."""
    path = Path(events_file)
    stem = path.name[: -len(".json")] if path.name.lower().endswith(".json") else path.name
    return path.with_name(stem + EVENTS_META_SUFFIX)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def write_events_meta(
    events_file: PathLike,
    frame_units: FrameUnits | str,
    videos: Mapping[str, Mapping[str, int]] | None = None,
) -> Path:
    """Record the frame units of an (already written) event file in its sidecar, atomically.

    Args:
        events_file: the event file; it must exist (its hash is recorded).
        frame_units: the units its frames count in.
        videos: optional ``{video_id: {"frames": n, "first": id, "last": id}}`` in those units.

    Returns:
        The sidecar's path.
    """
    path = Path(events_file)
    meta: dict[str, Any] = {
        "format": _FORMAT,
        "version": _VERSION,
        "events_file": path.name,
        "sha256": _sha256(path),
        "frame_units": as_frame_units(frame_units).value,
    }
    if videos is not None:
        meta["videos"] = {str(k): {f: int(x) for f, x in v.items()} for k, v in videos.items()}
    return atomic_write_json(events_meta_path(path), meta)


def read_events_meta(events_file: PathLike) -> dict[str, Any] | None:
    """The sidecar of an event file, or ``None`` when it has none or the sidecar describes another file.

    A sidecar that cannot be read, or whose hash is not the event file's, is ignored with a warning naming it.
    """
    path = Path(events_file)
    meta_path = events_meta_path(path)
    if not meta_path.is_file():
        return None
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
        units = as_frame_units(meta["frame_units"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        warnings.warn(f"{meta_path}: not a readable event file sidecar ({e}); ignored", stacklevel=2)
        return None
    if path.is_file() and meta.get("sha256") != _sha256(path):
        warnings.warn(
            f"{meta_path} describes another version of {path.name} (the file was replaced since); its frame units "
            "are unknown",
            stacklevel=2,
        )
        return None
    meta["frame_units"] = units
    return meta


def read_frame_units(events_file: PathLike) -> FrameUnits | None:
    """The frame units recorded for an event file (:func:`read_events_meta`), ``None`` when unknown."""
    meta = read_events_meta(events_file)
    return None if meta is None else meta["frame_units"]


def describe_events_file(events_file: PathLike, frame_units: FrameUnits | str | None) -> str:
    """``"PATH (frame_index units)"``: how log lines name an event file (``"units unknown"`` when ``None``)."""
    units = "units unknown" if frame_units is None else f"{as_frame_units(frame_units).value} units"
    return f"{events_file} ({units})"


def convert_events(
    events: Mapping[str, Any],
    from_units: FrameUnits | str,
    to_units: FrameUnits | str,
    frame_ids: Mapping[str, tuple[Sequence[int] | np.ndarray, Sequence[int] | np.ndarray]],
    source: str = "event file",
) -> dict[str, Any]:
    """Convert an event JSON object from one frame units to the other with the two frame ids of every frame.

    An event covers the frames whose id in ``from_units`` lies in ``[start, end]``; the converted event spans
    those frames in ``to_units`` by the gap rule of :func:`~monai_vce.events.run_spans` (from the first frame's id to
    one before the next frame's id, or to the last frame's id). Event order and labels are kept.

    Args:
        events: the event JSON object (``{"videos": [...]}``).
        from_units: the units of ``events``.
        to_units: the units wanted.
        frame_ids: per video, ``(frame_index, frame_number)`` of its frames (e.g. the arrays of its probability file).
        source: named in errors.

    Returns:
        The converted copy.

    Raises:
        ValueError: a video has no frame ids, or an event covers none of its frames.
    """
    src, dst = as_frame_units(from_units), as_frame_units(to_units)
    out: dict[str, Any] = {"videos": []}
    for video in events["videos"]:
        vid = str(video["video_id"])
        if src is dst:
            out["videos"].append({"video_id": vid, "events": [dict(e) for e in video["events"]]})
            continue
        if vid not in frame_ids:
            raise ValueError(f"{source}: no frame ids of video {vid!r} to convert its events to {dst.value} units")
        index, number = (np.asarray(a, dtype=np.int64) for a in frame_ids[vid])
        order = np.argsort(index, kind="stable")
        index, number = index[order], number[order]
        a, b = (index, number) if src is FrameUnits.FRAME_INDEX else (number, index)
        if a.size > 1 and (np.any(np.diff(a) <= 0) or np.any(np.diff(b) <= 0)):
            raise ValueError(f"{source}: the frame ids of video {vid!r} do not increase together; cannot convert")
        evs = video["events"]
        starts = np.fromiter((int(e["start"]) for e in evs), np.int64, len(evs))
        ends = np.fromiter((int(e["end"]) for e in evs), np.int64, len(evs))
        first = np.searchsorted(a, starts, side="left")
        stop = np.searchsorted(a, ends, side="right")
        empty = np.flatnonzero(stop <= first)
        if empty.size:
            j = int(empty[0])
            raise ValueError(
                f"{source}: video {vid!r} event {j} ({int(starts[j])} to {int(ends[j])} in {src.value} units) covers "
                f"none of its {a.size} frames"
            )
        lo, hi = run_spans(b, first, stop)
        out["videos"].append(
            {
                "video_id": vid,
                "events": [
                    {"start": int(s), "end": int(e), "label": list(ev["label"])}
                    for s, e, ev in zip(lo.tolist(), hi.tolist(), evs, strict=True)
                ],
            }
        )
    return out


def recorded_frame_units(obj: Any, wanted: FrameUnits | str | None, role: str) -> FrameUnits | None:
    """The units recorded beside an event file (``None`` for an in-memory object or a file without them).

    Args:
        obj: an event file path, or an event object (``None`` allowed).
        wanted: the units the caller states (``None``: any).
        role: what the file is, for messages (``"prediction"``).

    Raises:
        ValueError: the recorded units contradict ``wanted`` (one line naming the file and both units).
    """
    if obj is None or isinstance(obj, Mapping):
        return None
    recorded = read_frame_units(obj)
    if recorded is not None and wanted is not None and recorded is not as_frame_units(wanted):
        raise ValueError(
            f"the {role} {describe_events_file(obj, recorded)} is not in {as_frame_units(wanted).value} units "
            f"(recorded in {events_meta_path(obj).name}); give --frame-units {recorded.value} or the matching file"
        )
    return recorded


def frame_id_maps(probs_dir: PathLike, events: Mapping[str, Any]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """``{video_id: (frame_index, frame_number)}`` of the videos of ``events``, from their probability files in
    ``probs_dir`` (the maps :func:`convert_events` takes)."""
    out = {}
    for v in events["videos"]:
        video = load_video_probs(probability_file(probs_dir, v["video_id"]))
        out[str(v["video_id"])] = (video.frame_index, video.frame_number)
    return out


def events_in_common_units(
    pred: Any,
    pred_obj: Mapping[str, Any],
    gt: Any = None,
    frame_units: FrameUnits | str | None = None,
    probs_dir: PathLike | None = None,
    source: str = "prediction",
) -> tuple[dict[str, Any], FrameUnits]:
    """The frame units to read a prediction and its ground truth in, and the prediction in those units.

    The units are ``frame_units`` when given (the override for files without a sidecar), else those recorded
    beside the ground truth, else beside the prediction, else ``frame_index``.

    Args:
        pred: the prediction as given (path or object; only a path has recorded units).
        pred_obj: the prediction's parsed event object.
        gt: the ground truth as given (path, object or ``None``).
        frame_units: the units the caller states, or ``None``.
        probs_dir: probability files holding both ids of every frame, to convert the prediction.
        source: the prediction's name in messages.

    Raises:
        ValueError: a file records other units than ``frame_units``, or the prediction records other units than
            the ground truth and ``probs_dir`` is not given.
    """
    pred_units = recorded_frame_units(pred, frame_units, "prediction")
    gt_units = recorded_frame_units(gt, frame_units, "ground truth") if gt is not None else None
    units = as_frame_units(frame_units or gt_units or pred_units or FrameUnits.FRAME_INDEX)
    if pred_units is None or pred_units is units:
        return dict(pred_obj), units
    if probs_dir is None:
        gt_name = gt if isinstance(gt, (str, os.PathLike)) else "object"
        raise ValueError(
            f"frame units differ: the prediction {describe_events_file(source, pred_units)}, the ground truth "
            f"{describe_events_file(gt_name, units)}; give the probability files (--probs-dir) to convert"
        )
    return convert_events(pred_obj, pred_units, units, frame_id_maps(probs_dir, pred_obj), source), units
