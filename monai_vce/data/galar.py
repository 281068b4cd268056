"""Reader of the Galar video capsule endoscopy dataset layout: frames, label CSVs, metadata, datalists.

Layout read (as the Galar archives come):

- frames: ``<frames_dir>/<video_id>/frame_<number>.<png>``. The number may have any count of digits
  (``frame_000100.PNG`` in the training archives, ``frame_0000049.png`` in the challenge test videos);
  the extension is matched case-insensitively and frames are identified by the parsed number. Videos may
  be nested one level deeper under ``Galar_Frames_<a>_to_<b>/`` folders. Other files are ignored.
- labels: ``<labels_dir>/<video_id>.csv``, comma separated, with a column ``index`` (the frame position
  in Galar ``index`` units, the units of the official ground truth), one 0/1 column per label (lower-case
  names with spaces; columns beyond the 17 labels of :data:`monai_vce.labels.LABELS` are ignored) and a
  column ``frame`` = the number in the image file name. ``frame`` and ``index`` differ in some videos
  (video 1: ``index`` 20 is ``frame`` 100), so images are matched to label rows through ``frame`` only.
- metadata: a CSV with one row per video naming its capsule system (see :func:`read_metadata`).

Policy for inconsistencies between frames and label rows (each is reported per video with a count and
the first examples, through :mod:`logging` and one :func:`warnings.warn` summary, and returned as a
:class:`GalarReport` with ``return_report=True``; ``strict=True`` raises ``ValueError`` instead):

- a frame image without a label row is left out of the labelled datalist (it cannot be trained on);
- a label row without a frame image is left out (there is nothing to load);
- two image files with the same frame number in one video (``frame_000049.PNG`` and
  ``frame_0000049.png``): the first in sorted file-name order is kept;
- two label rows with the same ``frame`` value: the first row is kept;
- a video folder without a label CSV, or a label CSV without a video folder (only when the videos are
  discovered rather than named): the video is skipped.

Errors that always raise, naming the file: a missing label, ``index`` or ``frame`` column; a value other
than 0/1 in a label column; a non-integer ``index``/``frame``; a video folder without any frame image;
an unreadable or truncated image when images are checked (``check_images``).
"""

from __future__ import annotations

import csv
import logging
import os
import re
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from monai_vce.data.video import is_video_file, list_video_frames, probe_video, verify_video
from monai_vce.events.ground_truth import ground_truth_events
from monai_vce.events.units import FrameUnits, as_frame_units
from monai_vce.labels import LABELS, NUM_LABELS
from monai_vce.utils import natural_key

__all__ = [
    "FRAME_FILE_PATTERN",
    "CONTAINER_DIR_PATTERN",
    "METADATA_VIDEO_COLUMNS",
    "METADATA_CAPSULE_COLUMNS",
    "UNKNOWN_CAPSULE",
    "LabelTable",
    "VideoReport",
    "GalarReport",
    "parse_frame_number",
    "natural_key",
    "discover_videos",
    "list_frames",
    "verify_frames",
    "read_label_csv",
    "read_metadata",
    "build_galar_datalist",
    "build_inference_datalist",
    "build_ground_truth",
]

logger = logging.getLogger(__name__)

PathLike = str | os.PathLike

#: Frame image file names: ``frame_`` + digits + ``.png``, any case, any number of digits.
FRAME_FILE_PATTERN = re.compile(r"^frame_(\d+)\.png$", re.IGNORECASE)
#: Folders that group several videos in the Galar archives (``Galar_Frames_1_to_10``); searched one level down.
CONTAINER_DIR_PATTERN = re.compile(r"^galar_frames_\d+_to_\d+$", re.IGNORECASE)
#: Accepted header names (after lower-casing and replacing ``_``/``-`` by blanks) of the video id column of
#: ``metadata.csv``.
METADATA_VIDEO_COLUMNS: tuple[str, ...] = ("video id", "video", "id", "videoid", "video name", "patient id")
#: Accepted header names (normalised likewise) of the capsule column of ``metadata.csv``.
METADATA_CAPSULE_COLUMNS: tuple[str, ...] = (
    "capsule",
    "capsule type",
    "capsule system",
    "capsule model",
    "capsule name",
    "device",
    "system",
    "camera",
)
#: ``capsule`` value of datalist items whose video has no metadata row.
UNKNOWN_CAPSULE = "unknown"

#: Number of examples listed per problem in reports and messages.
_EXAMPLES = 5
_BINARY = {"0": 0.0, "1": 1.0, "0.0": 0.0, "1.0": 1.0}


def parse_frame_number(name: str) -> int | None:
    """Return the frame number of a frame image file name, or ``None`` when it is not a frame image.

    Args:
        name: a file name such as ``frame_000100.PNG`` or ``frame_0000049.png``.
    """
    m = FRAME_FILE_PATTERN.match(name)
    return int(m.group(1)) if m else None


def _norm_header(name: str) -> str:
    return " ".join(str(name).strip().lower().replace("_", " ").split())


def _examples(values: Iterable[Any]) -> list:
    out: list = []
    for v in values:
        if len(out) >= _EXAMPLES:
            break
        out.append(v.item() if isinstance(v, np.generic) else v)
    return out


# ----------------------------------------------------------------------------------------------- discovery
def _has_frames(folder: Path) -> bool:
    try:
        with os.scandir(folder) as it:
            return any(e.is_file() and FRAME_FILE_PATTERN.match(e.name) for e in it)
    except OSError:
        return False


def discover_videos(frames_dir: PathLike) -> dict[str, Path]:
    """Find the video folders under a Galar frames root.

    Every sub-folder of ``frames_dir`` is a video folder named by its video id, except folders named like
    ``Galar_Frames_<a>_to_<b>`` which are searched one level down, and hidden folders (``.``/``__``
    prefix), which are skipped. A video file (``.mp4``, ``.avi``, ``.mkv``, ...; see
    :mod:`monai_vce.data.video`) is a video too, its id the file stem. When ``frames_dir`` itself holds frame
    images, it is returned as the only video, named after the folder; when it is a video file, likewise.

    Args:
        frames_dir: the frames root.

    Returns:
        ``{video_id: folder}`` in natural video-id order.

    Raises:
        FileNotFoundError: when ``frames_dir`` is not a folder.
        ValueError: when one video id appears in two container folders.
    """

    root = Path(frames_dir)
    if root.is_file() and is_video_file(root):
        return {root.stem: root}
    if not root.is_dir():
        raise FileNotFoundError(f"frames folder not found: {root}")
    if _has_frames(root):
        return {root.name: root}
    found: dict[str, Path] = {}

    def add(folder: Path) -> None:
        vid = folder.stem if folder.is_file() else folder.name
        if vid in found:
            raise ValueError(f"video {vid!r} found twice under {root}: {found[vid]} and {folder}")
        found[vid] = folder

    def is_video(p: Path) -> bool:
        # a video folder, or an exam stored as one video file (monai_vce.data.video)
        return not p.name.startswith((".", "__")) and (p.is_dir() or (is_video_file(p) and p.is_file()))

    for child in sorted(root.iterdir(), key=lambda p: natural_key(p.name)):
        if not is_video(child):
            continue
        if child.is_dir() and CONTAINER_DIR_PATTERN.match(child.name):
            for sub in sorted(child.iterdir(), key=lambda p: natural_key(p.name)):
                if is_video(sub):
                    add(sub)
        else:
            add(child)
    return dict(sorted(found.items(), key=lambda kv: natural_key(kv[0])))


def list_frames(video_dir: PathLike) -> tuple[np.ndarray, list[str], list[tuple[int, list[str]]]]:
    """List the frame images of one video folder in frame order.

    Args:
        video_dir: the folder of one video, or a video file (its frames are the decoded positions ``0..T-1``,
            each with the video file as path; see :func:`monai_vce.data.video.list_video_frames`).

    Returns:
        ``(numbers, paths, duplicates)``: frame numbers (int64, increasing, unique), the matching image
        paths, and for each frame number carried by several files, ``(number, [dropped file names])``
        (the first file in sorted name order is kept).

    Raises:
        FileNotFoundError: when the folder does not exist.
        ValueError: when the folder holds no frame image (``frame_<number>.png``).
    """
    folder = Path(video_dir)

    if is_video_file(folder) and folder.is_file():  # an exam stored as a video file: decoded positions
        return list_video_frames(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"video folder not found: {folder}")
    names: list[str] = []
    with os.scandir(folder) as it:
        for e in it:
            if FRAME_FILE_PATTERN.match(e.name) and e.is_file():
                names.append(e.name)
    if not names:
        raise ValueError(
            f"video folder {folder} contains no frame image (expected files named frame_<number>.png, "
            f"any case, e.g. frame_000100.PNG)"
        )
    names.sort()
    numbers = np.fromiter((parse_frame_number(n) for n in names), dtype=np.int64, count=len(names))
    order = np.argsort(numbers, kind="stable")  # stable: among equal numbers, sorted-name order is kept
    numbers = numbers[order]
    names = [names[i] for i in order]
    keep = np.ones(len(names), dtype=bool)
    keep[1:] = numbers[1:] != numbers[:-1]
    duplicates: list[tuple[int, list[str]]] = []
    if not keep.all():
        for pos in np.flatnonzero(~keep):
            num = int(numbers[pos])
            if duplicates and duplicates[-1][0] == num:
                duplicates[-1][1].append(names[pos])
            else:
                duplicates.append((num, [names[pos]]))
    paths = [str(folder / n) for n, k in zip(names, keep, strict=False) if k]
    return numbers[keep], paths, duplicates


_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def verify_frames(paths: Sequence[PathLike], mode: str = "decode") -> None:
    """Check that frame images can be read; raise naming the first file that cannot.

    Args:
        paths: image files.
        mode: ``"decode"`` decodes every image completely (finds truncated files; slow on millions of
            frames), ``"header"`` only reads the file signature and header (fast; finds empty, non-image
            and mis-named files).

    Raises:
        ValueError: naming the unreadable, truncated or corrupt file and the reason.
    """
    if mode not in ("decode", "header"):
        raise ValueError(f"mode must be 'decode' or 'header', got {mode!r}")

    videos = list(dict.fromkeys(os.fspath(p) for p in paths if is_video_file(p)))
    if videos:  # frames of a video file: the container is checked once ("header") or decoded whole ("decode")
        for v in videos:
            (verify_video if mode == "decode" else probe_video)(v)
        paths = [p for p in paths if not is_video_file(p)]
    from PIL import ImageFile

    # a process-wide "load truncated images" switch set elsewhere must not hide truncated frames here
    tolerant, ImageFile.LOAD_TRUNCATED_IMAGES = ImageFile.LOAD_TRUNCATED_IMAGES, False
    try:
        _verify(paths, mode)
    finally:
        ImageFile.LOAD_TRUNCATED_IMAGES = tolerant


def _verify(paths: Sequence[PathLike], mode: str) -> None:
    from PIL import Image

    for p in paths:
        try:
            if mode == "header":
                with open(p, "rb") as f:
                    head = f.read(8)
                if head != _PNG_SIGNATURE:
                    raise OSError("not a PNG file (bad signature)" if head else "empty file")
                with Image.open(p) as im:
                    if im.size[0] <= 0 or im.size[1] <= 0:
                        raise OSError(f"invalid image size {im.size}")
            else:
                with Image.open(p) as im:
                    im.load()
        except Exception as e:  # PIL raises OSError, SyntaxError, ValueError, zlib errors...
            raise ValueError(f"unreadable or truncated image file {p}: {type(e).__name__}: {e}") from None


# ---------------------------------------------------------------------------------------------- label CSV
@dataclass
class LabelTable:
    """The content of one Galar label CSV, restricted to the 17 labels.

    Attributes:
        video_id: the video id (the CSV file stem).
        path: the CSV file.
        index: ``index`` column, int64 (R,).
        frame: ``frame`` column, int64 (R,).
        labels: float32 (R, 17) 0/1 values in :data:`LABELS` order.
    """

    video_id: str
    path: Path
    index: np.ndarray
    frame: np.ndarray
    labels: np.ndarray

    def __len__(self) -> int:
        return int(self.index.shape[0])


def _int_column(values: np.ndarray, name: str, path: Path) -> np.ndarray:
    try:
        return values.astype(np.int64)
    except ValueError:
        pass
    for r, v in enumerate(values):
        try:
            int(v)
        except ValueError:
            raise ValueError(f"{path}: data row {r + 1}, column {name!r}: value {str(v)!r} is not an integer") from None
    raise ValueError(f"{path}: column {name!r} holds values that are not integers")  # pragma: no cover


def read_label_csv(path: PathLike, video_id: str | None = None) -> LabelTable:
    """Read one Galar label CSV.

    Header names are matched after lower-casing, trimming and replacing ``_`` by a blank, so ``Small
    Intestine`` and ``small_intestine`` both match ``small intestine``. Columns other than ``index``,
    ``frame`` and the 17 labels are ignored. Label values must be ``0`` or ``1`` (``0.0``/``1.0`` are
    accepted).

    Args:
        path: the CSV file.
        video_id: the video id; defaults to the file stem.

    Raises:
        FileNotFoundError: when the file does not exist.
        ValueError: naming the file and the column (and row/index for values) for a missing ``index``,
            ``frame`` or label column, a ragged row, a non-0/1 label value or a non-integer frame number.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"label file not found: {path}")
    with open(path, newline="", encoding="utf-8-sig") as f:
        rows = [r for r in csv.reader(f) if r and any(c.strip() for c in r)]
    if not rows:
        raise ValueError(f"{path}: empty label file (expected a header with 'index', the labels and 'frame')")
    header = [_norm_header(h) for h in rows[0]]
    col: dict[str, int] = {}
    for i, h in enumerate(header):
        col.setdefault(h, i)  # a repeated header name: the first column wins
    for required in ("index", "frame"):
        if required not in col:
            raise ValueError(f"{path}: missing column {required!r} (header: {', '.join(rows[0])})")
    missing = [name for name in LABELS if name not in col]
    if missing:
        raise ValueError(
            f"{path}: missing label column{'s' if len(missing) > 1 else ''} {', '.join(repr(m) for m in missing)} "
            f"(header: {', '.join(rows[0])})"
        )
    body = rows[1:]
    width = len(rows[0])
    lengths = np.fromiter((len(r) for r in body), dtype=np.int64, count=len(body))
    if len(body) and (lengths != width).any():
        bad = int(np.flatnonzero(lengths != width)[0])
        raise ValueError(f"{path}: data row {bad + 1} has {lengths[bad]} fields, the header has {width}")
    table: np.ndarray = np.asarray(body, dtype=str).reshape(len(body), width)
    table = np.char.strip(table) if table.size else table
    index = _int_column(table[:, col["index"]], "index", path)
    frame = _int_column(table[:, col["frame"]], "frame", path)
    label_cols = [col[name] for name in LABELS]
    raw = table[:, label_cols]
    ones = (raw == "1") | (raw == "1.0")
    zeros = (raw == "0") | (raw == "0.0")
    bad = ~(ones | zeros)
    if bad.any():
        r, c = (int(x) for x in np.argwhere(bad)[0])
        raise ValueError(
            f"{path}: data row {r + 1} (index {index[r]}), column {LABELS[c]!r}: value {str(raw[r, c])!r} is not 0 or 1"
        )
    return LabelTable(
        video_id=str(video_id) if video_id is not None else path.stem,
        path=path,
        index=index,
        frame=frame,
        labels=ones.astype(np.float32).reshape(len(body), NUM_LABELS),
    )


# ----------------------------------------------------------------------------------------------- metadata
def _canonical_id(video_id: str) -> str:
    s = str(video_id).strip()
    return str(int(s)) if s.isdigit() else s


def read_metadata(path: PathLike) -> dict[str, str]:
    """Read the capsule system of each video from a metadata CSV.

    The video id column is the first whose normalised header (lower-case, ``_``/``-`` as blanks) is one of
    :data:`METADATA_VIDEO_COLUMNS` (``video_id``, ``video``, ``id``, ...), the capsule column the first in
    :data:`METADATA_CAPSULE_COLUMNS` (``capsule``, ``capsule_type``, ``device``, ...). A file of exactly two
    columns with other names is read as ``video id, capsule``. Other columns are ignored. The delimiter may
    be ``,``, ``;`` or a tab.

    Args:
        path: the metadata CSV.

    Returns:
        ``{video_id: capsule}``; numeric ids are also matched without leading zeros by the datalist builders.

    Raises:
        FileNotFoundError: when the file does not exist.
        ValueError: when the id or capsule column cannot be identified, naming the file and its header.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"metadata file not found: {path}")
    text = path.read_text(encoding="utf-8-sig")
    first = text.splitlines()[0] if text.strip() else ""
    delim = max((",", ";", "\t"), key=first.count)
    rows = [r for r in csv.reader(text.splitlines(), delimiter=delim) if r and any(c.strip() for c in r)]
    if not rows:
        raise ValueError(f"{path}: empty metadata file")
    header = [_norm_header(h).replace("-", " ") for h in rows[0]]

    def find(names: Sequence[str]) -> int | None:
        for n in names:
            if n in header:
                return header.index(n)
        return None

    vcol, ccol = find(METADATA_VIDEO_COLUMNS), find(METADATA_CAPSULE_COLUMNS)
    if (vcol is None or ccol is None) and len(header) == 2:
        vcol, ccol = 0, 1
    if vcol is None or ccol is None:
        what = "video id" if vcol is None else "capsule"
        raise ValueError(
            f"{path}: cannot find the {what} column (header: {', '.join(rows[0])}); expected one of "
            f"{', '.join(METADATA_VIDEO_COLUMNS if vcol is None else METADATA_CAPSULE_COLUMNS)}"
        )
    out: dict[str, str] = {}
    for r in rows[1:]:
        if max(vcol, ccol) < len(r) and r[vcol].strip():
            out[r[vcol].strip()] = r[ccol].strip()
    return out


def _capsule_lookup(metadata: dict[str, str] | None) -> dict[str, str]:
    if not metadata:
        return {}
    out = {_canonical_id(k): v for k, v in metadata.items()}
    out.update(metadata)
    return out


def _capsule_of(lookup: dict[str, str], video_id: str) -> str:
    return lookup.get(video_id) or lookup.get(_canonical_id(video_id)) or UNKNOWN_CAPSULE


# ----------------------------------------------------------------------------------------------- reports
@dataclass
class VideoReport:
    """Consistency report of one video: counts and first examples of each kind of problem.

    Attributes:
        video_id: the video.
        n_frames: frame images found (after removing duplicate numbers).
        n_rows: label rows read.
        n_items: datalist items produced.
        unlabeled_frames: count and first frame numbers of images without a label row (dropped).
        rows_without_frame: count and first ``(index, frame)`` pairs of label rows without an image (dropped).
        duplicate_frames: count and first ``(frame number, [dropped files])`` of image numbers carried by
            several files (first file kept).
        duplicate_rows: count and first ``(frame, index)`` of repeated ``frame`` values in the CSV (first row
            kept).
    """

    video_id: str
    n_frames: int = 0
    n_rows: int = 0
    n_items: int = 0
    unlabeled_frames: dict = field(default_factory=lambda: {"count": 0, "examples": []})
    rows_without_frame: dict = field(default_factory=lambda: {"count": 0, "examples": []})
    duplicate_frames: dict = field(default_factory=lambda: {"count": 0, "examples": []})
    duplicate_rows: dict = field(default_factory=lambda: {"count": 0, "examples": []})

    _KINDS: ClassVar[tuple[str, ...]] = ("unlabeled_frames", "rows_without_frame", "duplicate_frames", "duplicate_rows")
    _WORDS: ClassVar[dict[str, str]] = {
        "unlabeled_frames": "frame images without a label row (dropped)",
        "rows_without_frame": "label rows without a frame image (dropped)",
        "duplicate_frames": "frame numbers carried by several image files (first file kept)",
        "duplicate_rows": "frame numbers repeated in the label CSV (first row kept)",
    }

    @property
    def ok(self) -> bool:
        """True when the video has none of the reported problems."""
        return all(getattr(self, k)["count"] == 0 for k in self._KINDS)

    def messages(self) -> list[str]:
        """One line per problem kind present: count, what it means and the first examples."""
        out = []
        for k in self._KINDS:
            d = getattr(self, k)
            if d["count"]:
                out.append(f"video {self.video_id}: {d['count']} {self._WORDS[k]}, e.g. {d['examples']}")
        return out

    def to_dict(self) -> dict:
        """A JSON-serialisable copy."""
        return {
            "video_id": self.video_id,
            "n_frames": self.n_frames,
            "n_rows": self.n_rows,
            "n_items": self.n_items,
            **{
                k: {"count": getattr(self, k)["count"], "examples": list(getattr(self, k)["examples"])}
                for k in self._KINDS
            },
        }


@dataclass
class GalarReport:
    """Report of a datalist build: per-video reports plus videos skipped for a missing folder or CSV.

    Attributes:
        videos: ``{video_id: VideoReport}``.
        videos_without_labels: video folders skipped because their label CSV is missing.
        labels_without_frames: label CSVs skipped because their video folder is missing.
    """

    videos: dict[str, VideoReport] = field(default_factory=dict)
    videos_without_labels: list[str] = field(default_factory=list)
    labels_without_frames: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when nothing was dropped, duplicated or skipped."""
        skipped = self.videos_without_labels or self.labels_without_frames
        return all(v.ok for v in self.videos.values()) and not skipped

    def messages(self) -> list[str]:
        """One line per problem, per video."""
        out = [m for v in self.videos.values() for m in v.messages()]
        if self.videos_without_labels:
            out.append(
                f"{len(self.videos_without_labels)} video folders without a label CSV (skipped): "
                f"{_examples(self.videos_without_labels)}"
            )
        if self.labels_without_frames:
            out.append(
                f"{len(self.labels_without_frames)} label CSVs without a video folder (skipped): "
                f"{_examples(self.labels_without_frames)}"
            )
        return out

    def to_dict(self) -> dict:
        """A JSON-serialisable copy."""
        return {
            "videos": {k: v.to_dict() for k, v in self.videos.items()},
            "videos_without_labels": list(self.videos_without_labels),
            "labels_without_frames": list(self.labels_without_frames),
        }


def _raise_or_warn(report: GalarReport, strict: bool, source: str) -> None:
    msgs = report.messages()
    if not msgs:
        return
    if strict:
        raise ValueError(f"{source}: inconsistent frames and labels (strict=True):\n  " + "\n  ".join(msgs))
    for m in msgs:
        logger.warning(m)
    shown = msgs[:_EXAMPLES]
    more = f"\n  ... and {len(msgs) - len(shown)} more" if len(msgs) > len(shown) else ""
    warnings.warn(f"{source}: " + "\n  ".join(shown) + more, stacklevel=3)


# --------------------------------------------------------------------------------------------- datalists
def _select_videos(found: dict[str, Path], videos: Iterable[str] | None, frames_dir: Path) -> dict[str, Path]:
    if videos is None:
        return found
    if isinstance(videos, str):
        videos = [videos]
    lookup = {_canonical_id(k): k for k in found}
    out = {}
    missing = []
    for v in videos:
        key = str(v)
        if key in found:
            out[key] = found[key]
        elif _canonical_id(key) in lookup:
            out[lookup[_canonical_id(key)]] = found[lookup[_canonical_id(key)]]
        else:
            missing.append(key)
    if missing:
        raise FileNotFoundError(f"no frame folder for video(s) {', '.join(missing)} under {frames_dir}")
    return out


def _load_metadata(metadata_csv: PathLike | dict[str, str] | None) -> dict[str, str]:
    if metadata_csv is None:
        return {}
    if isinstance(metadata_csv, dict):
        return _capsule_lookup(metadata_csv)
    return _capsule_lookup(read_metadata(metadata_csv))


def _check_mode(check_images: bool | str) -> str | None:
    if check_images is True:
        return "decode"
    if check_images is False or check_images is None:
        return None
    if check_images in ("decode", "header"):
        return check_images
    raise ValueError(f"check_images must be True, False, 'decode' or 'header', got {check_images!r}")


def _align_video(
    video_id: str, folder: Path, table: LabelTable, check: str | None, capsule: str
) -> tuple[list[dict], VideoReport]:
    numbers, paths, dup_files = list_frames(folder)
    rep = VideoReport(video_id=video_id, n_frames=len(numbers), n_rows=len(table))
    rep.duplicate_frames = {"count": sum(len(d[1]) for d in dup_files), "examples": _examples(dup_files)}

    # duplicate `frame` values in the CSV: keep the first row of each frame number
    order = np.argsort(table.frame, kind="stable")
    fsorted = table.frame[order]
    first = np.ones(len(order), dtype=bool)
    first[1:] = fsorted[1:] != fsorted[:-1]
    dup_rows = np.sort(order[~first])
    rep.duplicate_rows = {
        "count": int(dup_rows.size),
        "examples": [(int(table.frame[r]), int(table.index[r])) for r in dup_rows[:_EXAMPLES]],
    }
    rows = order[first]  # one row per frame number, in increasing frame order
    row_frames = table.frame[rows]

    # match images to rows through the frame number (both sorted and unique)
    pos = np.searchsorted(row_frames, numbers)
    pos_c = np.minimum(pos, max(len(row_frames) - 1, 0))
    if len(row_frames):
        matched = (pos < len(row_frames)) & (row_frames[pos_c] == numbers)
    else:
        matched = np.zeros(len(numbers), dtype=bool)
    rep.unlabeled_frames = {"count": int((~matched).sum()), "examples": _examples(numbers[~matched])}
    has_image = np.isin(row_frames, numbers)
    orphan = np.sort(rows[~has_image])
    rep.rows_without_frame = {
        "count": int(orphan.size),
        "examples": [(int(table.index[r]), int(table.frame[r])) for r in orphan[:_EXAMPLES]],
    }

    img_idx = np.flatnonzero(matched)
    row_idx = rows[pos_c[img_idx]]
    if check:
        verify_frames([paths[i] for i in img_idx], mode=check)
    labels = table.labels[row_idx].tolist()
    findex = table.index[row_idx].tolist()
    fnum = numbers[img_idx].tolist()
    items = [
        {
            "image": paths[i],
            "label": lab,
            "video_id": video_id,
            "frame_index": fi,
            "frame_number": fn,
            "capsule": capsule,
        }
        for i, lab, fi, fn in zip(img_idx.tolist(), labels, findex, fnum, strict=False)
    ]
    rep.n_items = len(items)
    return items, rep


def _label_files(labels_dir: Path) -> dict[str, Path]:
    files = sorted(p for p in labels_dir.iterdir() if p.is_file() and p.suffix.lower() == ".csv")
    out: dict[str, Path] = {}
    for p in files:
        out.setdefault(p.stem, p)
    return dict(sorted(out.items(), key=lambda kv: natural_key(kv[0])))


def build_galar_datalist(
    frames_dir: PathLike,
    labels_dir: PathLike,
    metadata_csv: PathLike | dict[str, str] | None = None,
    videos: Iterable[str] | None = None,
    *,
    strict: bool = False,
    check_images: bool | str = False,
    return_report: bool = False,
) -> list[dict] | tuple[list[dict], GalarReport]:
    """Build the labelled datalist of Galar videos: one dict per frame with an image and a label row.

    Items are ``{"image", "label", "video_id", "frame_index", "frame_number", "capsule"}``: ``label`` is
    17 floats in :data:`LABELS` order taken from the CSV row whose ``frame`` equals the number in the image
    file name; ``frame_index`` is that row's ``index`` (ground-truth units). Videos come in natural id order,
    frames of a video in frame order. Inconsistencies follow the module's documented policy.

    Args:
        frames_dir: frames root (see :func:`discover_videos`).
        labels_dir: folder of ``<video_id>.csv`` label files.
        metadata_csv: ``metadata.csv`` path or a ready ``{video_id: capsule}`` dict; ``None`` leaves
            ``capsule`` as ``"unknown"``.
        videos: video ids to include; ``None`` takes every video having both a folder and a CSV (videos
            with only one of them are reported and skipped). Named videos must have both.
        strict: raise ``ValueError`` on any reported inconsistency instead of warning.
        check_images: ``False`` (default; decoding millions of frames is slow), ``True``/``"decode"`` to
            decode every image, ``"header"`` for a fast signature check; a bad file raises naming it.
        return_report: also return the :class:`GalarReport`.

    Returns:
        The datalist, or ``(datalist, report)`` with ``return_report=True``.
    """
    frames_dir, labels_dir = Path(frames_dir), Path(labels_dir)
    if not labels_dir.is_dir():
        raise FileNotFoundError(f"labels folder not found: {labels_dir}")
    check = _check_mode(check_images)
    found = discover_videos(frames_dir)
    csvs = _label_files(labels_dir)
    report = GalarReport()
    if videos is None:
        selected = {k: v for k, v in found.items() if k in csvs}
        report.videos_without_labels = [k for k in found if k not in csvs]
        report.labels_without_frames = sorted((k for k in csvs if k not in found), key=natural_key)
    else:
        selected = _select_videos(found, videos, frames_dir)
        missing = [k for k in selected if k not in csvs]
        if missing:
            raise FileNotFoundError(f"no label file for video(s) {', '.join(missing)} in {labels_dir}")
    if not selected:
        raise ValueError(f"no video has both a frame folder under {frames_dir} and a label CSV in {labels_dir}")
    capsules = _load_metadata(metadata_csv)
    datalist: list[dict] = []
    for vid, folder in selected.items():
        table = read_label_csv(csvs[vid], video_id=vid)
        items, rep = _align_video(vid, folder, table, check, _capsule_of(capsules, vid))
        report.videos[vid] = rep
        datalist.extend(items)
    _raise_or_warn(report, strict, f"Galar datalist from {frames_dir}")
    return (datalist, report) if return_report else datalist


def build_inference_datalist(
    frames_dir: PathLike,
    videos: Iterable[str] | None = None,
    metadata_csv: PathLike | dict[str, str] | None = None,
    *,
    check_images: bool | str = False,
    frame_index: str = "number",
) -> list[dict]:
    """Build an unlabeled datalist (no ``label`` key) of every frame image of one or several videos.

    ``frames_dir`` is either a frames root (sub-folders per video and/or video files, see
    :func:`discover_videos`), the folder of a single video (then the video id is the folder name) or a single
    video file. Duplicate frame numbers keep the first file in sorted name order and are reported by a
    warning. The frames of a video file are its decoded positions: ``frame_number`` (and ``frame_index``) is the
    0-based position and ``image`` the video file; serve them with
    :class:`monai_vce.data.VideoFrameDataset`, which decodes each video once into a frame cache.

    Args:
        frames_dir: frames root or one video folder.
        videos: video ids to include (``None``: all found).
        metadata_csv: optional ``metadata.csv`` path or ``{video_id: capsule}``.
        check_images: as in :func:`build_galar_datalist`.
        frame_index: without a label CSV there are no ``index`` values: ``"number"`` (default) sets
            ``frame_index`` to the frame number of the file name, ``"position"`` to the 0-based position
            of the frame in frame order.

    Returns:
        The datalist: ``{"image", "video_id", "frame_index", "frame_number", "capsule"}`` per frame, videos
        in natural id order, frames in frame order.
    """
    if frame_index not in ("number", "position"):
        raise ValueError(f"frame_index must be 'number' or 'position', got {frame_index!r}")
    frames_dir = Path(frames_dir)
    check = _check_mode(check_images)
    selected = _select_videos(discover_videos(frames_dir), videos, frames_dir)
    if not selected:
        raise ValueError(f"no video folder found under {frames_dir}")
    capsules = _load_metadata(metadata_csv)
    report = GalarReport()
    datalist: list[dict] = []
    for vid, folder in selected.items():
        numbers, paths, dups = list_frames(folder)
        if dups:
            rep = VideoReport(video_id=vid, n_frames=len(numbers), n_items=len(numbers))
            rep.duplicate_frames = {"count": sum(len(d[1]) for d in dups), "examples": _examples(dups)}
            report.videos[vid] = rep
        if check:
            verify_frames(paths, mode=check)
        capsule = _capsule_of(capsules, vid)
        idx = numbers.tolist() if frame_index == "number" else list(range(len(numbers)))
        datalist.extend(
            {"image": p, "video_id": vid, "frame_index": i, "frame_number": n, "capsule": capsule}
            for p, i, n in zip(paths, idx, numbers.tolist(), strict=False)
        )
    _raise_or_warn(report, False, f"inference datalist from {frames_dir}")
    return datalist


def build_ground_truth(
    labels_dir: PathLike,
    videos: Iterable[str] | None = None,
    frame_units: FrameUnits | str = FrameUnits.FRAME_INDEX,
) -> dict:
    """Build the challenge event JSON of Galar label CSVs (the frame images are not needed).

    Every video's events come from all the rows of its CSV through
    :func:`monai_vce.events.ground_truth_events`, the challenge's ground-truth rule: runs of rows carrying the
    same label set, a gap in the frame ids never ends an event, label lists sorted by name, rows without labels
    kept as events with an empty label list.

    Args:
        labels_dir: folder of ``<video_id>.csv`` label files.
        videos: video ids to include (``None``: every CSV, natural id order).
        frame_units: ``"frame_index"`` (the CSV's ``index`` column, the challenge's units) or ``"frame_number"``
            (its ``frame`` column).

    Returns:
        ``{"videos": [{"video_id", "events": [{"start", "end", "label"}]}]}``.
    """
    units = as_frame_units(frame_units)
    labels_dir = Path(labels_dir)
    if not labels_dir.is_dir():
        raise FileNotFoundError(f"labels folder not found: {labels_dir}")
    csvs = _label_files(labels_dir)
    if videos is None:
        ids = list(csvs)
    else:
        ids = [str(videos)] if isinstance(videos, str) else [str(v) for v in videos]
        missing = [v for v in ids if v not in csvs]
        if missing:
            raise FileNotFoundError(f"no label file for video(s) {', '.join(missing)} in {labels_dir}")
    out = []
    for vid in ids:
        table = read_label_csv(csvs[vid], video_id=vid)
        rows = table.index if units is FrameUnits.FRAME_INDEX else table.frame
        out.append({"video_id": vid, "events": ground_truth_events(rows, table.labels, video_id=vid)})
    return {"videos": out}
