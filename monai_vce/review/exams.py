"""Each exam of a review site: its rows as one :class:`~monai_vce.events.Video` (probabilities, frame ids,
ground truth) and where their frames are (:class:`ExamFrames`); events mapped onto the rows."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from monai_vce.data.galar import build_inference_datalist
from monai_vce.data.video import is_video_file, probe_video
from monai_vce.events.probabilities import Video, load_video_probs
from monai_vce.events.units import FrameUnits
from monai_vce.labels import LABELS, NUM_LABELS

__all__ = ["UNITS", "ExamFrames", "has_probs", "frames_by_video", "load_exam", "event_rows", "peak_row"]

PathLike = str | os.PathLike

#: Frame units of event files: ``frame_index`` (Galar ``index``) or ``frame_number`` (file name / decoded position).
UNITS: tuple[str, ...] = tuple(u.value for u in FrameUnits)


@dataclass(frozen=True)
class ExamFrames:
    """Where the review site finds the frame of each row of an exam's :class:`~monai_vce.events.Video`.

    Attributes:
        images: (T,) path of each row's frame image, or ``None`` for a video file.
        video: the video file, or ``None`` for a frame folder.
        frame_rate: frames per second of ``frame_number``, ``None`` when unknown.
    """

    images: list[str] | None
    video: str | None
    frame_rate: float | None


def has_probs(video: Video) -> bool:
    """Whether the exam's rows have probabilities (:func:`load_exam` gives ``(T, 0)`` ones without a file)."""
    return video.probs.shape[1] > 0


def frames_by_video(frames: PathLike | Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Group the frames of a frames folder (or of a frame datalist) by video.

    Args:
        frames: a frames root (video folders and/or video files, see :func:`monai_vce.data.discover_videos`), or
            a datalist of frame dicts (``image``, ``video_id``, ``frame_index``, ``frame_number``).

    Returns:
        ``{video_id: {"images": [...], "frame_index": int64, "frame_number": int64}}``, frames in datalist order.
    """
    if isinstance(frames, (str, os.PathLike)):
        data: Sequence[Mapping[str, Any]] = build_inference_datalist(frames)
    else:
        data = frames
    grouped: dict[str, tuple[list[str], list[int], list[int]]] = {}
    for i, d in enumerate(data):
        try:
            vid, image, index = str(d["video_id"]), os.fspath(d["image"]), int(d["frame_index"])
        except KeyError as e:
            raise ValueError(f"datalist item {i} has no {e.args[0]!r} field") from None
        g = grouped.setdefault(vid, ([], [], []))
        g[0].append(image)
        g[1].append(index)
        g[2].append(int(d.get("frame_number", index)))
    return {
        vid: {"images": g[0], "frame_index": np.asarray(g[1], np.int64), "frame_number": np.asarray(g[2], np.int64)}
        for vid, g in grouped.items()
    }


def load_exam(
    video_id: str,
    frames: Mapping[str, Any],
    gt_events: Sequence[Mapping[str, Any]] | None = None,
    probs_file: PathLike | None = None,
    frame_rate: float | None = None,
) -> tuple[Video, ExamFrames]:
    """Assemble one exam: its rows (sorted by frame number) with their probabilities and ground truth, and their frames.

    Args:
        video_id: the video id.
        frames: one entry of :func:`frames_by_video`.
        gt_events: ground-truth events (the video's ``events``) or ``None``.
        probs_file: ``<video_id>.npz`` (see :func:`monai_vce.events.load_video_probs`) or ``None``: the rows are
            then the frames on disk and their probabilities ``(T, 0)`` (see :func:`has_probs`).
        frame_rate: frames per second; ``None``: the probability file's, else a video file's own.

    Returns:
        ``(video, frames)``.

    Raises:
        ValueError: frames of several video files in one video, or a probability file whose frames are not on
            disk (naming the file and the first missing frame number).
    """

    images = list(frames["images"])
    index, number = np.asarray(frames["frame_index"]), np.asarray(frames["frame_number"])
    order = np.argsort(number, kind="stable")
    images = [images[i] for i in order]
    index, number = index[order], number[order]
    video = images[0] if images and is_video_file(images[0]) else None
    if video is not None and any(p != video for p in images):
        raise ValueError(f"video {video_id!r} mixes a video file ({video}) with other frame files")
    probs = None
    if probs_file is not None:
        record = load_video_probs(probs_file)
        frame_rate = record.frame_rate if frame_rate is None else frame_rate
        probs, p_index, p_number = record.probs, record.frame_index, record.frame_number
        pos = np.searchsorted(number, p_number)
        pos_c = np.minimum(pos, max(len(number) - 1, 0))
        found = (pos < len(number)) & (number[pos_c] == p_number) if len(number) else np.zeros(len(p_number), bool)
        if not found.all():
            bad = int(p_number[np.flatnonzero(~found)[0]])
            raise ValueError(
                f"probability file {probs_file}: frame number {bad} of video {video_id!r} has no frame on disk "
                f"({int((~found).sum())} frame(s) in all); are the frames and the probabilities of the same video?"
            )
        o = np.argsort(p_number, kind="stable")
        probs, index, number = probs[o], p_index[o], p_number[o]
        images = [images[i] for i in pos_c[o]]
    if frame_rate is None and video is not None:
        frame_rate = probe_video(video).fps
    if probs is None:
        probs = np.zeros((len(index), 0), np.float32)
    record = Video(
        video_id,
        np.ascontiguousarray(probs, np.float32),
        index.astype(np.int64),
        number.astype(np.int64),
        events=None if gt_events is None else [dict(e) for e in gt_events],
        frame_rate=frame_rate,
    )
    return record, ExamFrames(
        images=None if video is not None else images, video=video, frame_rate=float(frame_rate) if frame_rate else None
    )


def event_rows(ids: np.ndarray, events: Sequence[Mapping[str, Any]]) -> tuple[np.ndarray, np.ndarray]:
    """First and last row of each event (``searchsorted`` on the sorted row ids; vectorised).

    Returns:
        ``(first, last)`` int64 arrays; an event between two rows gets ``first > last``.
    """
    starts = np.fromiter((int(e["start"]) for e in events), np.int64, count=len(events))
    ends = np.fromiter((int(e["end"]) for e in events), np.int64, count=len(events))
    return np.searchsorted(ids, starts, side="left"), np.searchsorted(ids, ends, side="right") - 1


def peak_row(probs: np.ndarray | None, first: int, last: int, labels: Sequence[str]) -> int:
    """The row of an event where its labels' probability is highest (the middle row without probabilities,
    ``None`` or ``(T, 0)``)."""
    if probs is None or probs.shape[1] == 0 or last < first:
        return (first + last) // 2
    cols = [LABELS.index(n) for n in labels if n in LABELS] or list(range(NUM_LABELS))
    return first + int(np.argmax(probs[first : last + 1, cols].max(axis=1)))
