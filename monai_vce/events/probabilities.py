"""Per-video probability files: ``<video_id>.npz`` with the frame probabilities of one video.

The format (the contract shared by every reader and writer): ``probs`` float32 ``(T, 17)`` in
:data:`~monai_vce.labels.LABELS` order, ``frame_index`` and ``frame_number`` int64 ``(T,)``, ``labels`` (the 17
names), and ``source`` (what produced the file). Files are written atomically, so a file that exists is complete.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from monai_vce.labels import LABELS, NUM_LABELS
from monai_vce.utils import atomic_save_npz

__all__ = [
    "VideoArrays",
    "save_video_probs",
    "load_video_probs",
    "npz_frame_count",
    "npz_record",
    "model_fingerprint",
    "completed_videos",
    "pending_frames",
]

logger = logging.getLogger(__name__)

PathLike = str | os.PathLike


class VideoArrays:
    """The assembled frames of one video, sorted by ``frame_index`` with duplicate frames dropped.

    Attributes:
        video_id: the video id.
        probs: ``(T, 17)`` float32 probabilities.
        frame_index: ``(T,)`` int64 frame indices (ground-truth units).
        frame_number: ``(T,)`` int64 frame numbers of the image file names.
        labels: ``(T, 17)`` float32 targets, or ``None`` when the frames had none.
    """

    __slots__ = ("frame_index", "frame_number", "labels", "probs", "video_id")

    def __init__(
        self,
        video_id: str,
        probs: np.ndarray,
        frame_index: np.ndarray,
        frame_number: np.ndarray,
        labels: np.ndarray | None = None,
    ) -> None:
        self.video_id = video_id
        self.probs = probs
        self.frame_index = frame_index
        self.frame_number = frame_number
        self.labels = labels

    def __len__(self) -> int:
        return int(self.frame_index.shape[0])


def save_video_probs(path: PathLike, video: VideoArrays, source: str = "") -> Path:
    """Write one video's probabilities in the project's ``.npz`` format, atomically.

    ``source`` (stored as the extra key ``source``) identifies what produced them, e.g. the model file
    (:func:`monai_vce.workflows.model_fingerprint`), so that a resumed run never reuses another model's files.
    """
    return atomic_save_npz(
        path,
        probs=video.probs.astype(np.float32, copy=False),
        frame_index=video.frame_index.astype(np.int64, copy=False),
        frame_number=video.frame_number.astype(np.int64, copy=False),
        labels=np.asarray(LABELS),
        source=np.asarray(str(source)),
    )


def load_video_probs(path: PathLike) -> VideoArrays:
    """Read a per-video ``.npz`` file written by :class:`TemporalEventWriter` (checked for shape and values).

    Raises:
        FileNotFoundError: the file is missing.
        ValueError: the file is unreadable or does not follow the format (the message names the file and field).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"probability file {path} not found")
    try:
        with np.load(path, allow_pickle=False) as z:
            data = {k: z[k] for k in ("probs", "frame_index", "frame_number") if k in z.files}
    except Exception as e:  # zipfile / numpy raise several kinds on a damaged file
        raise ValueError(f"probability file {path} is unreadable: {e}") from None
    for key in ("probs", "frame_index"):
        if key not in data:
            raise ValueError(f"probability file {path} has no {key!r} array")
    probs, index = data["probs"], data["frame_index"]
    if probs.ndim != 2 or probs.shape[1] != NUM_LABELS or index.shape != (probs.shape[0],):
        raise ValueError(
            f"probability file {path}: expected probs (T, {NUM_LABELS}) and frame_index (T,), got {probs.shape} and {index.shape}"
        )
    number = data.get("frame_number", index)
    return VideoArrays(path.stem, probs.astype(np.float32), index.astype(np.int64), number.astype(np.int64))


def npz_frame_count(path: PathLike) -> int | None:
    """Number of frames in a per-video ``.npz`` file, or ``None`` when it is missing or unreadable."""
    record = npz_record(path)
    return None if record is None else record[0]


def npz_record(path: PathLike) -> tuple[int, str] | None:
    """``(number of frames, source)`` of a per-video ``.npz`` file (``""`` when it records no source), or
    ``None`` when it is missing or unreadable."""
    try:
        with np.load(path, allow_pickle=False) as z:
            return int(z["frame_index"].shape[0]), str(z["source"]) if "source" in z.files else ""
    except Exception:
        return None


def model_fingerprint(model_file: PathLike) -> str:
    """A string identifying a model file's current content (path, size, modification time), ``""`` if absent.

    Stored in each probability file, it keeps a resumed inference from reusing the files of another model.
    """
    path = Path(model_file)
    if not path.is_file():
        return ""
    st = path.stat()
    return f"{path.resolve()}:{st.st_size}:{st.st_mtime_ns}"


def completed_videos(
    datalist: Sequence[Mapping[str, Any]], probs_dir: PathLike, source: str | None = None
) -> list[str]:
    """Videos of ``datalist`` whose probability file in ``probs_dir`` is complete.

    A file is complete when it exists (files are written atomically), holds as many frames as the
    datalist has for that video (a video folder that grew since is recomputed) and, when ``source`` is
    given, was written from that source (:func:`model_fingerprint`: a retrained model recomputes everything).
    """
    counts: dict[str, int] = {}
    for d in datalist:
        vid = str(d["video_id"])
        counts[vid] = counts.get(vid, 0) + 1
    out = []
    for vid, n in counts.items():
        record = npz_record(Path(probs_dir) / f"{vid}.npz")
        if record is not None and record[0] == n and (source is None or record[1] == source):
            out.append(vid)
    return out


def pending_frames(
    datalist: Sequence[Mapping[str, Any]], probs_dir: PathLike, resume: bool = True, source: str | None = None
) -> list[dict]:
    """The frames of ``datalist`` still to infer: those of videos without a complete probability file.

    Filtering the datalist before building the dataset makes an interrupted inference resumable: a rerun
    infers only the videos it had not finished, and the event JSON is still written from every video's file.

    Args:
        datalist: the full frame datalist.
        probs_dir: the folder of the per-video ``<video_id>.npz`` files.
        resume: ``False`` returns the whole datalist (recompute everything).
        source: what the probability files must have been written from (see :func:`completed_videos`).
    """
    if not resume:
        return list(datalist)
    done = set(completed_videos(datalist, probs_dir, source=source))
    if done:
        logger.info(f"skipping {len(done)} video(s) already inferred in {probs_dir}: {', '.join(sorted(done))}")
    return [d for d in datalist if str(d["video_id"]) not in done]
