"""Per-video probability files: ``<video_id>.npz`` with the frame probabilities of one video.

The format, shared by every reader and writer of the package (the inference writer, evaluation, reports, the
resume of an interrupted inference):

==================  ==========================  ==================================================
key                 array                       meaning
==================  ==========================  ==================================================
``probs``           float32 ``(T, 17)``         probabilities in :data:`~monai_vce.labels.LABELS` order
``frame_index``     int64 ``(T,)``              frame ids in ``frame_index`` units, increasing
``frame_number``    int64 ``(T,)``              frame ids in ``frame_number`` units
``labels``          str ``(17,)``               the label names, :data:`~monai_vce.labels.LABELS`
``source``          str ``()``, optional        what wrote the file (:func:`model_fingerprint`)
``features``        float16 ``(T, D)``, opt.    the pooled image feature of each frame
``inferred``        bool ``(T,)``, optional     frames that went through the network (reduced
                                                inference; the others were filled in); absent:
                                                every frame was inferred
==================  ==========================  ==================================================

Files are written atomically, so a file that exists is complete. :func:`video_file_name` is the one place where a
video id becomes a file name; :func:`load_video_probs` is the one reader (it checks every key above and names the
file and the key in its errors); :func:`save_video_probs` the one writer.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from monai_vce.labels import LABELS, NUM_LABELS
from monai_vce.utils import atomic_save_npz, natural_key

from .units import FrameUnits, as_frame_units

__all__ = [
    "PROBS_SUFFIX",
    "VideoArrays",
    "video_file_name",
    "probability_file",
    "probability_files",
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

#: File name suffix of the per-video probability files.
PROBS_SUFFIX = ".npz"
# characters that would make a video id name something other than one file in the folder
_NOT_IN_NAMES = ("/", "\\", "\0")


class VideoArrays:
    """The frames of one video: probabilities, both frame ids and, when known, targets and features.

    Rows are sorted by ``frame_index`` with duplicate frames dropped. It is the in-memory form of a probability
    file (:func:`load_video_probs`, :func:`save_video_probs`) and what
    :class:`~monai_vce.handlers.VideoFrameCollector` assembles from an engine's outputs.

    Attributes:
        video_id: the video id.
        probs: ``(T, 17)`` float32 probabilities.
        frame_index: ``(T,)`` int64 frame ids in ``frame_index`` units.
        frame_number: ``(T,)`` int64 frame ids in ``frame_number`` units.
        targets: ``(T, 17)`` float32 targets, or ``None`` when the frames had none.
        features: ``(T, D)`` per-frame features, or ``None``.
        source: what produced the probabilities (``""`` when unknown).
        inferred: ``(T,)`` bool mask of the frames that went through the network (reduced inference), or
            ``None`` when every frame did.
    """

    __slots__ = ("features", "frame_index", "frame_number", "inferred", "probs", "source", "targets", "video_id")

    def __init__(
        self,
        video_id: str,
        probs: np.ndarray,
        frame_index: np.ndarray,
        frame_number: np.ndarray,
        targets: np.ndarray | None = None,
        features: np.ndarray | None = None,
        source: str = "",
        inferred: np.ndarray | None = None,
    ) -> None:
        self.video_id = video_id
        self.probs = probs
        self.frame_index = frame_index
        self.frame_number = frame_number
        self.targets = targets
        self.features = features
        self.source = source
        self.inferred = inferred

    @property
    def labels(self) -> np.ndarray | None:
        """Former name of :attr:`targets`."""
        return self.targets

    def frame_ids(self, frame_units: FrameUnits | str = FrameUnits.FRAME_INDEX) -> np.ndarray:
        """The ``(T,)`` frame ids in ``frame_units`` (``"frame_index"`` or ``"frame_number"``)."""
        return self.frame_index if as_frame_units(frame_units) is FrameUnits.FRAME_INDEX else self.frame_number

    def __len__(self) -> int:
        return int(self.frame_index.shape[0])


def video_file_name(video_id: str, suffix: str = PROBS_SUFFIX) -> str:
    """The file name of a video's file: ``<video_id><suffix>`` (``suffix`` e.g. ``".npz"`` or ``".png"``).

    Every file named after a video (probability files, report timelines) takes its name from here.

    Raises:
        ValueError: the id cannot be one file name (empty, ``.``/``..``, or holding ``/``, ``\\`` or NUL).
    """
    vid = str(video_id)
    if vid in ("", ".", "..") or any(c in vid for c in _NOT_IN_NAMES):
        raise ValueError(f"video id {vid!r} cannot name a file (it would leave the folder or name none)")
    return f"{vid}{suffix}"


def probability_file(folder: PathLike, video_id: str) -> Path:
    """The path of a video's probability file in ``folder``."""
    return Path(folder) / video_file_name(video_id)


def probability_files(folder: PathLike) -> dict[str, Path]:
    """The probability files of a folder, ``{video_id: path}`` in natural video id order (``{}`` if no folder)."""
    folder = Path(folder)
    if not folder.is_dir():
        return {}
    files = {p.name[: -len(PROBS_SUFFIX)]: p for p in folder.glob(f"*{PROBS_SUFFIX}") if p.is_file()}
    return {vid: files[vid] for vid in sorted(files, key=natural_key)}


def save_video_probs(path: PathLike, video: VideoArrays, source: str | None = None) -> Path:
    """Write one video's probabilities (and features and the inferred mask, when it has them) in the format
    above, atomically.

    Args:
        path: the file (name it with :func:`probability_file`).
        video: the video's arrays.
        source: what produced them, e.g. the model file (:func:`model_fingerprint`), so that a resumed run never
            reuses another model's files; ``None`` takes ``video.source``.
    """
    arrays: dict[str, Any] = {
        "probs": np.asarray(video.probs, dtype=np.float32),
        "frame_index": np.asarray(video.frame_index, dtype=np.int64),
        "frame_number": np.asarray(video.frame_number, dtype=np.int64),
        "labels": np.asarray(LABELS),
        "source": np.asarray(str(video.source if source is None else source)),
    }
    if video.features is not None:
        arrays["features"] = np.asarray(video.features, dtype=np.float16)
    if video.inferred is not None:
        inferred = np.asarray(video.inferred)
        if inferred.shape != arrays["probs"].shape[:1] or inferred.dtype != np.bool_:
            raise ValueError(
                f"video {video.video_id!r}: 'inferred' must be {len(arrays['probs'])} booleans (one per frame), "
                f"got {inferred.dtype} {inferred.shape}"
            )
        arrays["inferred"] = inferred
    return atomic_save_npz(path, **arrays)


def load_video_probs(path: PathLike, features: bool = False) -> VideoArrays:
    """Read and check one probability file (the one reader of the format).

    Args:
        path: the ``.npz`` file; the video id is its name without the suffix.
        features: also read the optional ``features`` array (``None`` when the file has none).

    Raises:
        FileNotFoundError: the file is missing.
        ValueError: the file is unreadable, holds pickled objects, lacks a key, or a key has the wrong shape,
            type or content (the message names the file and the key).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"probability file {path} not found")
    keys = ("probs", "frame_index", "frame_number", "labels", "source", "inferred") + (
        ("features",) if features else ()
    )
    try:
        with np.load(path, allow_pickle=False) as z:
            data = {k: z[k] for k in keys if k in z.files}
    except Exception as e:  # zipfile / numpy raise several kinds on a damaged or pickled file
        raise ValueError(f"probability file {path} is unreadable: {type(e).__name__}: {e}") from None
    missing = [k for k in ("probs", "frame_index", "frame_number", "labels") if k not in data]
    if missing:
        raise ValueError(f"probability file {path}: missing key{'s' if len(missing) > 1 else ''} {', '.join(missing)}")
    probs = data["probs"]
    if probs.ndim != 2 or probs.shape[1] != NUM_LABELS or not np.issubdtype(probs.dtype, np.floating):
        raise ValueError(
            f"probability file {path}: 'probs' must be a float (T, {NUM_LABELS}) array, got {probs.dtype} {probs.shape}"
        )
    T = probs.shape[0]
    for key in ("frame_index", "frame_number"):
        if data[key].shape != (T,) or (T and not np.issubdtype(data[key].dtype, np.integer)):
            raise ValueError(
                f"probability file {path}: '{key}' must be {T} integers (one per row of 'probs'), "
                f"got {data[key].dtype} {data[key].shape}"
            )
    if [str(x) for x in np.asarray(data["labels"]).reshape(-1)] != list(LABELS):
        raise ValueError(f"probability file {path}: 'labels' are not the {NUM_LABELS} LABELS in order")
    feats = data.get("features")
    if feats is not None and (feats.ndim != 2 or feats.shape[0] != T or not np.issubdtype(feats.dtype, np.floating)):
        raise ValueError(f"probability file {path}: 'features' must be a float (T={T}, D) array, got {feats.shape}")
    inferred = data.get("inferred")
    if inferred is not None and (inferred.shape != (T,) or inferred.dtype != np.bool_):
        raise ValueError(
            f"probability file {path}: 'inferred' must be {T} booleans (one per row of 'probs'), "
            f"got {inferred.dtype} {inferred.shape}"
        )
    return VideoArrays(
        path.name[: -len(PROBS_SUFFIX)] if path.name.endswith(PROBS_SUFFIX) else path.stem,
        probs.astype(np.float32, copy=False),
        data["frame_index"].astype(np.int64, copy=False),
        data["frame_number"].astype(np.int64, copy=False),
        features=feats,
        source=str(data["source"]) if "source" in data else "",
        inferred=inferred,
    )


def npz_record(path: PathLike) -> tuple[int, str] | None:
    """``(number of frames, source)`` of a valid probability file, or ``None`` when it is missing or invalid."""
    try:
        video = load_video_probs(path)
    except (OSError, ValueError):
        return None
    return len(video), video.source


def npz_frame_count(path: PathLike) -> int | None:
    """Number of frames of a valid probability file, or ``None`` when it is missing or invalid."""
    record = npz_record(path)
    return None if record is None else record[0]


def model_fingerprint(model_file: PathLike) -> str:
    """A string identifying a model file's current content (path, size, modification time), ``""`` if absent.

    Stored in each probability file, it keeps a resumed inference from reusing the files of another model.
    """
    path = Path(model_file)
    if not path.is_file():
        return ""
    st = path.stat()
    return f"{path.resolve()}:{st.st_size}:{st.st_mtime_ns}"


def _sources(source: str | Collection[str] | None) -> frozenset[str] | None:
    if source is None:
        return None
    return frozenset([source] if isinstance(source, str) else (str(s) for s in source))


def completed_videos(
    datalist: Sequence[Mapping[str, Any]],
    probs_dir: PathLike,
    source: str | Collection[str] | None = None,
    features: bool = False,
) -> list[str]:
    """Videos of ``datalist`` whose probability file in ``probs_dir`` is complete.

    A file is complete when it exists (files are written atomically), passes :func:`load_video_probs`'s checks,
    holds as many frames as the datalist has for that video (a video folder that grew since is recomputed) and,
    when ``source`` is given, was written from that source (:func:`model_fingerprint`: a retrained model
    recomputes everything) or, when ``source`` is a collection, from one of them (a reduced inference reuses
    the files of a full inference of the same model, see :func:`monai_vce.inference.reduced_source`).
    With ``features``, a file must also hold the per-frame ``features`` (a file of a run without them is
    recomputed).
    """
    accepted = _sources(source)
    counts: dict[str, int] = {}
    for d in datalist:
        vid = str(d["video_id"])
        counts[vid] = counts.get(vid, 0) + 1
    out = []
    for vid, n in counts.items():
        record = npz_record(probability_file(probs_dir, vid))
        complete = record is not None and record[0] == n and (accepted is None or record[1] in accepted)
        if complete and (not features or _has_features(probability_file(probs_dir, vid))):
            out.append(vid)
    return out


def _has_features(path: PathLike) -> bool:
    try:
        with np.load(path, allow_pickle=False) as z:
            return "features" in z.files
    except Exception:  # a file unreadable now is not complete
        return False


def pending_frames(
    datalist: Sequence[Mapping[str, Any]],
    probs_dir: PathLike,
    resume: bool = True,
    source: str | Collection[str] | None = None,
    features: bool = False,
) -> list[Mapping[str, Any]]:
    """The frames of ``datalist`` still to infer: those of videos without a complete probability file.

    Filtering the datalist before building the dataset makes an interrupted inference resumable: a rerun
    infers only the videos it had not finished, and the event JSON is still written from every video's file.

    Args:
        datalist: the full frame datalist.
        probs_dir: the folder of the per-video ``<video_id>.npz`` files.
        resume: ``False`` returns the whole datalist (recompute everything).
        source: what the probability files must have been written from, or a collection of the sources
            accepted (see :func:`completed_videos`).
        features: the files must also hold per-frame features (see :func:`completed_videos`).
    """
    if not resume:
        return list(datalist)
    done = set(completed_videos(datalist, probs_dir, source=source, features=features))
    if done:
        logger.info(f"skipping {len(done)} video(s) already inferred in {probs_dir}: {', '.join(sorted(done))}")
    return [d for d in datalist if str(d["video_id"]) not in done]
