"""Per-video probability files: ``<video_id>.npz`` with the frame probabilities of one video.

The format (the contract shared by every reader and writer): ``probs`` float32 ``(T, 17)`` in
:data:`~monai_vce.labels.LABELS` order, ``frame_index`` and ``frame_number`` int64 ``(T,)``, ``labels`` (the 17
names), and ``source`` (what produced the file). Files are written atomically, so a file that exists is complete.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from monai_vce.labels import LABELS, NUM_LABELS
from monai_vce.utils import atomic_save_npz

__all__ = ["VideoArrays", "save_video_probs", "load_video_probs", "npz_frame_count", "npz_record"]

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
