"""Per-video probability files ``<video_id>.npz``: the one reader, the one writer, the video id -> file name rule,
and the resume of an interrupted inference.

Keys: ``probs`` (T, 17) float32, ``frame_index``, ``frame_number``, ``labels``, ``video_id``, ``source``, optional
``features``, ``inferred``, ``frame_rate``.
"""

from __future__ import annotations

import logging
import os
import string
import warnings
import zipfile
from collections.abc import Collection, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import numpy as np

from monai_vce.labels import LABELS, NUM_LABELS
from monai_vce.utils import atomic_save_npz, natural_key, short_repr

from .units import MAX_FRAME_ID, FrameUnits, as_frame_units

__all__ = [
    "PROBS_SUFFIX",
    "MAX_FRAME_RATE",
    "Video",
    "check_frame_rate",
    "videos_units",
    "video_file_name",
    "video_id_of_file_name",
    "check_video_ids",
    "datalist_videos",
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
# characters a file name keeps as they are; every other one is written as %XX (its UTF-8 bytes)
_PLAIN = frozenset(string.ascii_letters + string.digits + "-_.")
# longest file name stem made from a video id (file systems allow 255 bytes; room is left for suffixes)
_MAX_STEM = 200


class Video:
    """The frames of one video: probabilities, both frame ids and, when known, targets, features and events.

    Rows are sorted by ``frame_index`` with duplicate frames dropped; rows are the time axis of every consumer
    (decoding, tuning, refiner fitting), and frame ids are picked in one unit only at the edges
    (:meth:`frame_ids`). It is the in-memory form of a probability file (:func:`load_video_probs`).

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
        events: the ground-truth events, in ``units``, or ``None``.
        units: the frame units of ``events`` (a :class:`~monai_vce.events.FrameUnits`), chosen once where the ground
            truth is read (:func:`~monai_vce.events.ground_truth.with_ground_truth`); the frame ids
            :meth:`frame_ids` gives by default, which decoding, tuning, scoring and the report read. ``None``: not
            chosen (``frame_index``).
        frame_rate: frames per second of ``frame_number`` (the capsule's or the video file's frame counter), or
            ``None`` when unknown.
    """

    __slots__ = (
        "events",
        "features",
        "frame_index",
        "frame_number",
        "frame_rate",
        "inferred",
        "probs",
        "source",
        "targets",
        "units",
        "video_id",
    )

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
        events: list[dict[str, Any]] | None = None,
        frame_rate: float | None = None,
        units: FrameUnits | str | None = None,
    ) -> None:
        self.video_id = video_id
        self.probs = probs
        self.frame_index = frame_index
        self.frame_number = frame_number
        self.targets = targets
        self.features = features
        self.source = source
        self.inferred = inferred
        self.events = events
        self.frame_rate = check_frame_rate(frame_rate, f"video {short_repr(str(video_id), 60)}")
        self.units = None if units is None else as_frame_units(units, "units")

    @property
    def rows_per_second(self) -> float | None:
        """Rows per second of recording: ``frame_rate`` over the median step of ``frame_number`` (a video annotated
        every 5th frame has a fifth of the frame rate); ``None`` when the rate is unknown."""
        if self.frame_rate is None:
            return None
        steps = np.diff(self.frame_number)
        step = float(np.median(steps)) if steps.size else 1.0
        return self.frame_rate / max(step, 1.0)

    def duration_seconds(self) -> float | None:
        """Seconds the rows span (``frame_number`` from first to last, one frame included), ``None`` when unknown."""
        if self.frame_rate is None or not len(self):
            return None
        return float(self.frame_number[-1] - self.frame_number[0] + 1) / self.frame_rate

    def frame_ids(self, units: FrameUnits | str | None = None) -> np.ndarray:
        """The ``(T,)`` frame ids in ``units`` (``"frame_index"`` or ``"frame_number"``); ``None``: the video's own
        :attr:`units` (``frame_index`` when not chosen)."""
        chosen = self.units if units is None else as_frame_units(units, "units")
        return self.frame_number if chosen is FrameUnits.FRAME_NUMBER else self.frame_index

    def replace(self, **changes: Any) -> Video:
        """A shallow copy with the given attributes replaced."""
        fields = {k: getattr(self, k) for k in self.__slots__}
        unknown = set(changes) - set(fields)
        if unknown:
            raise TypeError(f"Video has no attribute(s) {sorted(unknown)}")
        return Video(**{**fields, **changes})

    def __len__(self) -> int:
        return int(self.frame_index.shape[0])


def videos_units(videos: Iterable[Video]) -> FrameUnits:
    """The one frame units of several videos' ground-truth events (:attr:`Video.units`; ``frame_index`` when none
    chose them).

    Raises:
        ValueError: the videos' events count in different units.
    """
    found = {v.units for v in videos if v.units is not None}
    if len(found) > 1:
        raise ValueError(
            f"the videos' ground-truth events count in different frame units ({sorted(u.value for u in found)}); "
            "read them all in one"
        )
    return found.pop() if found else FrameUnits.FRAME_INDEX


#: Largest frame rate accepted (frames per second); capsules record 0.5-35, video files up to a few hundred.
MAX_FRAME_RATE = 10_000.0


def check_frame_rate(value: Any, where: str = "frame_rate") -> float | None:
    """``value`` as a frame rate in frames per second (``None`` stays ``None``).

    Raises:
        ValueError: not a finite number in ``(0, MAX_FRAME_RATE]``; the message names ``where``.
    """
    if value is None:
        return None
    ok = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_))
    rate = float(value) if ok else float("nan")
    if not (np.isfinite(rate) and 0 < rate <= MAX_FRAME_RATE):
        raise ValueError(
            f"{where}: frame_rate must be a number of frames per second in (0, {MAX_FRAME_RATE:g}], got "
            f"{short_repr(value, 40)}"
        )
    return rate


def _encode_char(c: str) -> str:
    return c if c in _PLAIN else "".join(f"%{b:02X}" for b in c.encode("utf-8", "surrogatepass"))


def video_file_name(video_id: str, suffix: str = PROBS_SUFFIX) -> str:
    """The file name of a video's file: the id, made safe, plus ``suffix`` (e.g. ``".npz"`` or ``".png"``).

    Every file named after a video takes its name from here. ASCII letters, digits, ``-``, ``_`` and ``.`` are
    kept; every other character is written as ``%XX`` (its UTF-8 bytes), as is a leading ``.``. The name is never
    a path (no ``/``, ``\\``, ``..``), never hidden, and different ids give different names; the id is recovered
    by :func:`video_id_of_file_name`.

    Raises:
        ValueError: the id is empty, or its name would be longer than 200 characters.
    """
    vid = str(video_id)
    if not vid:
        raise ValueError("a video id must be a non-empty string: an empty id cannot name a file")
    stem = "".join(_encode_char(c) for c in vid)
    if stem.startswith("."):
        stem = "%2E" + stem[1:]
    if len(stem) > _MAX_STEM:
        raise ValueError(
            f"video id {short_repr(vid, 60)} is too long to name a file ({len(stem)} characters once made safe, "
            f"at most {_MAX_STEM}); shorten it"
        )
    return f"{stem}{suffix}"


def video_id_of_file_name(name: str, suffix: str = PROBS_SUFFIX) -> str | None:
    """The video id a file name was made from by :func:`video_file_name`, or ``None`` for other names."""
    if not name.endswith(suffix) or len(name) == len(suffix):
        return None
    stem = name[: len(name) - len(suffix)] if suffix else name
    try:
        vid = unquote(stem, encoding="utf-8", errors="surrogatepass")
        return vid if video_file_name(vid, suffix) == name else None
    except (UnicodeDecodeError, ValueError):
        return None


def check_video_ids(video_ids: Iterable[Any], source: str = "datalist") -> list[str]:
    """Check that every video id can name its files, and that no two ids name the same file anywhere.

    Args:
        video_ids: the ids (converted with ``str``).
        source: what holds them, for messages.

    Returns:
        The ids as strings, in order, each once.

    Raises:
        ValueError: an id that cannot name a file (:func:`video_file_name`), or two ids that differ only in case
            (one file on case-insensitive file systems); the message names them.
    """
    ids = list(dict.fromkeys(str(v) for v in video_ids))
    folded: dict[str, str] = {}
    for vid in ids:
        try:
            key = video_file_name(vid, "").lower()
        except ValueError as e:
            raise ValueError(f"{source}: {e}") from None
        other = folded.setdefault(key, vid)
        if other != vid:
            raise ValueError(
                f"{source}: video ids {short_repr(other, 60)} and {short_repr(vid, 60)} differ only in case: their "
                "files would be one file on case-insensitive file systems (macOS, Windows); rename one of the videos"
            )
    return ids


def probability_file(folder: PathLike, video_id: str) -> Path:
    """The path of a video's probability file in ``folder``."""
    return Path(folder) / video_file_name(video_id)


def probability_files(folder: PathLike) -> dict[str, Path]:
    """The probability files of a folder, ``{video_id: path}`` in natural video id order (``{}`` if no folder).

    Only files named by :func:`video_file_name` are listed (hidden temporary files of an interrupted write, and
    files named otherwise, are not probability files of this package).
    """
    folder = Path(folder)
    if not folder.is_dir():
        return {}
    files: dict[str, Path] = {}
    for p in folder.glob(f"*{PROBS_SUFFIX}"):
        vid = video_id_of_file_name(p.name)
        if vid is not None and p.is_file():
            files[vid] = p
    return {vid: files[vid] for vid in sorted(files, key=natural_key)}


def save_video_probs(path: PathLike, video: Video, source: str | None = None) -> Path:
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
        "video_id": np.asarray(str(video.video_id)),
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
    if video.frame_rate is not None:
        arrays["frame_rate"] = np.asarray(float(video.frame_rate), dtype=np.float64)
    return atomic_save_npz(path, **arrays)


def load_video_probs(path: PathLike, features: bool = False, video_id: str | None = None) -> Video:
    """Read and check one probability file (the one reader of the format).

    Args:
        path: the ``.npz`` file; the video id is the one it stores.
        features: also read the optional ``features`` array (``None`` when the file has none).
        video_id: the video the file must hold; a file of another video (copied or renamed) is refused.

    Raises:
        FileNotFoundError: the file is missing.
        ValueError: the file is unreadable, holds pickled objects, lacks a key, or a key has the wrong shape,
            type or content, or it holds another video than ``video_id`` (the message names the file and the key).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"probability file {path} not found")
    keys = ("probs", "frame_index", "frame_number", "labels", "video_id", "source", "inferred", "frame_rate") + (
        ("features",) if features else ()
    )
    _check_member_sizes(path, keys)
    try:
        with np.load(path, allow_pickle=False) as z:
            data = {k: z[k] for k in keys if k in z.files}
    except Exception as e:  # zipfile / numpy raise several kinds on a damaged or pickled file
        raise ValueError(f"probability file {path} is unreadable: {type(e).__name__}: {e}") from None
    missing = [k for k in ("probs", "frame_index", "frame_number", "labels", "video_id", "source") if k not in data]
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
    rate = data.get("frame_rate")
    if rate is not None:
        if rate.shape != () or rate.dtype.kind not in "fiu":
            raise ValueError(f"probability file {path}: 'frame_rate' must be one number, got {rate.dtype} {rate.shape}")
        check_frame_rate(rate.item(), f"probability file {path}")
    stored = data["video_id"]
    if stored.shape != () or stored.dtype.kind != "U" or not str(stored):
        raise ValueError(f"probability file {path}: 'video_id' must be one non-empty string")
    vid = str(stored)
    if video_id is not None and vid != str(video_id):
        raise ValueError(
            f"probability file {path} holds video {short_repr(vid, 60)}, not {short_repr(str(video_id), 60)} "
            "(a copied or renamed file?); delete it to infer the video again"
        )
    return Video(
        vid,
        probs.astype(np.float32, copy=False),
        data["frame_index"].astype(np.int64, copy=False),
        data["frame_number"].astype(np.int64, copy=False),
        features=feats,
        source=str(data["source"]),
        inferred=inferred,
        frame_rate=None if rate is None else float(rate.item()),
    )


#: Largest array a probability file may hold (bytes once read): the features of a 130,000-frame video at D=768 in
#: float16 are 200 MB; a file declaring far more (a hostile or damaged one) is refused before it is read.
MAX_ARRAY_BYTES = 2 * 1024**3


def _check_member_sizes(path: Path, keys: Sequence[str]) -> None:
    """Refuse a probability file whose arrays would take more than :data:`MAX_ARRAY_BYTES` once read (zip header)."""
    try:
        with zipfile.ZipFile(path) as zf:
            sizes = {i.filename.removesuffix(".npy"): i.file_size for i in zf.infolist()}
    except (OSError, zipfile.BadZipFile, ValueError):
        return  # np.load reports it below, with the file named
    big = {k: n for k, n in sizes.items() if k in keys and n > MAX_ARRAY_BYTES}
    if big:
        key, n = next(iter(big.items()))
        raise ValueError(
            f"probability file {path}: {key!r} would take {n / 1024**3:.1f} GiB once read, more than the "
            f"{MAX_ARRAY_BYTES / 1024**3:.0f} GiB a probability file holds (a damaged or foreign file)"
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


def datalist_videos(datalist: Sequence[Mapping[str, Any]], source: str = "datalist") -> dict[str, np.ndarray]:
    """The items of each video of a frame datalist: ``{video_id: item positions}``, videos in order of appearance.

    Positions are sorted by ``frame_index`` (stable), and an item repeating a frame of its video (the same
    ``frame_index``) is left out, as the collector of the engine outputs keeps only the first of repeated frames.
    A video listed in several places of the datalist is gathered into one.

    Args:
        datalist: frame dicts with ``video_id`` and ``frame_index`` (and optionally ``frame_number``).
        source: what the datalist is, for messages.

    Raises:
        ValueError: an item that is not a dict, lacks ``video_id`` or ``frame_index``, or has a frame id that is
            not an integer in ``[0, 2**31 - 1]``; the message names the item's position and key. Ids that cannot
            name files (see :func:`check_video_ids`).
    """
    positions: dict[str, list[int]] = {}
    index = np.empty(len(datalist), dtype=np.int64)
    for i, d in enumerate(datalist):
        if not isinstance(d, Mapping):
            raise ValueError(f"{source}: item {i} must be a dict (a frame), got {type(d).__name__}")
        if "video_id" not in d:
            raise ValueError(
                f"{source}: item {i} has no 'video_id' (keys: {short_repr(sorted(map(str, d)), 80)}); every frame "
                "needs the id of its video"
            )
        index[i] = _frame_id(d, "frame_index", i, source)
        positions.setdefault(str(d["video_id"]), []).append(i)
    check_video_ids(positions, source)
    out: dict[str, np.ndarray] = {}
    for vid, pos in positions.items():
        rows = np.asarray(pos, dtype=np.int64)
        rows = rows[np.argsort(index[rows], kind="stable")]
        keep = np.r_[True, index[rows[1:]] != index[rows[:-1]]] if len(rows) else np.zeros(0, bool)
        out[vid] = rows[keep]
    return out


def _frame_id(item: Mapping[str, Any], key: str, position: int, source: str) -> int:
    value = item.get(key)
    if value is None:
        raise ValueError(f"{source}: item {position} (video {short_repr(item.get('video_id'), 40)}) has no {key!r}")
    if isinstance(value, (np.integer, np.ndarray)) and np.ndim(value) == 0:
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MAX_FRAME_ID:
        raise ValueError(
            f"{source}: item {position} (video {short_repr(item.get('video_id'), 40)}): {key!r} must be an integer "
            f"in [0, {MAX_FRAME_ID}], got {short_repr(value, 40)}"
        )
    return value


def completed_videos(
    datalist: Sequence[Mapping[str, Any]],
    probs_dir: PathLike,
    source: str | Collection[str] | None = None,
    features: bool = False,
) -> list[str]:
    """Videos of ``datalist`` whose probability file in ``probs_dir`` is complete.

    A file is complete when it exists (files are written atomically), passes :func:`load_video_probs`'s checks, holds
    this video, holds exactly the frames the datalist lists for it (the same ``frame_index`` and ``frame_number``
    ids: a video whose frames were renumbered, added or removed since is recomputed) and, when ``source`` is given,
    was written from that source (:func:`model_fingerprint`: a retrained model recomputes everything) or, when
    ``source`` is a collection, from one of them (a reduced inference reuses the files of a full inference of the
    same model, see :func:`monai_vce.inference.reduced_source`).
    With ``features``, a file must also hold the per-frame ``features`` (a file of a run without them is
    recomputed).
    So a file written from other frame ids (e.g. from a labelled datalist, whose ``frame_index`` is the labels'
    ``index``, resumed with one whose ``frame_index`` is the file-name number) is never reused: frame units are
    never mixed in one event file.
    """
    return _completed(datalist, datalist_videos(datalist), probs_dir, source, features)


def _completed(
    datalist: Sequence[Mapping[str, Any]],
    videos: Mapping[str, np.ndarray],
    probs_dir: PathLike,
    source: str | Collection[str] | None,
    features: bool = False,
) -> list[str]:
    accepted = _sources(source)
    out = []
    for vid, rows in videos.items():
        path = probability_file(probs_dir, vid)
        if not path.is_file():
            continue
        try:
            video = load_video_probs(path, video_id=vid)
        except (OSError, ValueError) as e:
            logger.info(f"video {vid}: {e}; inferring it again")
            continue
        if accepted is not None and video.source not in accepted:
            continue
        items = [datalist[i] for i in rows.tolist()]
        index = np.fromiter((int(d["frame_index"]) for d in items), dtype=np.int64, count=len(items))
        number = np.fromiter(
            (int(d.get("frame_number", d["frame_index"])) for d in items), dtype=np.int64, count=len(items)
        )
        if not (np.array_equal(video.frame_index, index) and np.array_equal(video.frame_number, number)):
            logger.info(f"video {vid}: its frames changed since {path} was written; inferring it again")
        elif not features or _has_features(path):
            out.append(vid)
        else:
            logger.info(f"video {vid}: {path} holds no per-frame features; inferring it again")
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
    infers only the videos it had not finished, and the event JSON is still written from every video's file. The
    frames come grouped by video (videos in order of first appearance, frames by ``frame_index``; items repeating a
    frame are left out with a warning), so that the inference writer, which writes a video's file as soon as the
    next video starts, always sees each video whole, whatever the order of the datalist.

    Args:
        datalist: the full frame datalist.
        probs_dir: the folder of the per-video ``<video_id>.npz`` files.
        resume: ``False`` infers every video again.
        source: what the probability files must have been written from, or a collection of the sources
            accepted (see :func:`completed_videos`).
        features: the files must also hold per-frame features (see :func:`completed_videos`).

    Raises:
        ValueError: an item without ``video_id`` or with a bad frame id, or a video id that cannot name a file
            (see :func:`datalist_videos`).
    """
    videos = datalist_videos(datalist)
    repeated = len(datalist) - sum(len(rows) for rows in videos.values())
    if repeated:
        warnings.warn(
            f"the datalist repeats {repeated} frame(s) of their video (same video_id and frame_index): each frame is "
            "inferred once",
            stacklevel=2,
        )
    done = set(_completed(datalist, videos, probs_dir, source, features)) if resume else set()
    if done:
        logger.info(f"skipping {len(done)} video(s) already inferred in {probs_dir}: {', '.join(sorted(done))}")
    return [datalist[i] for vid, rows in videos.items() if vid not in done for i in rows.tolist()]
