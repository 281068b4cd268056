"""Reader of the Galar video capsule endoscopy dataset layout: frames, label CSVs, metadata, datalists.

Images match label rows through ``frame``; inconsistencies are skipped and reported (:class:`GalarReport`), or
raise with ``strict=True``. Reference: the Galar dataset (RARE-VISION challenge).
"""

from __future__ import annotations

import csv
import io
import logging
import os
import re
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from monai_vce.data.frame_checks import (
    JPEG_SIGNATURE,
    PNG_SIGNATURE,
    check_png,
    decode_rgb,
    image_size,
    read_frame_bytes,
)
from monai_vce.data.frame_checks import check_pixels as _check_pixels
from monai_vce.data.video import is_video_file, list_video_frames, probe_video, verify_video, video_link_problem
from monai_vce.events.ground_truth import ground_truth_events
from monai_vce.events.probabilities import check_frame_rate
from monai_vce.events.units import MAX_FRAME_ID, FrameUnits, as_frame_units
from monai_vce.labels import LABELS, NUM_LABELS
from monai_vce.utils import natural_key, read_regular_file, safe_text, short_repr

__all__ = [
    "FRAME_FILE_PATTERN",
    "CONTAINER_DIR_PATTERN",
    "METADATA_VIDEO_COLUMNS",
    "METADATA_CAPSULE_COLUMNS",
    "METADATA_FRAME_RATE_COLUMNS",
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
    "read_frame_rates",
    "metadata_capsules",
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
#: Accepted header names (normalised likewise) of the optional frame rate column of ``metadata.csv`` (frames per
#: second of the frame file numbers).
METADATA_FRAME_RATE_COLUMNS: tuple[str, ...] = ("frame rate", "fps", "frames per second", "framerate")
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
    if is_video_file(root) and (problem := video_link_problem(root)):  # named explicitly: an error, not "no folder"
        raise FileNotFoundError(problem)
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

    def is_video_reported(p: Path) -> bool:
        if is_video(p):
            return True
        if is_video_file(p) and not p.name.startswith((".", "__")) and (problem := video_link_problem(p)):
            warnings.warn(
                f"{safe_text(problem)}: skipped", stacklevel=3
            )  # a link that leads nowhere is never skipped silently
        return False

    for child in sorted(root.iterdir(), key=lambda p: natural_key(p.name)):
        if not is_video_reported(child):
            continue
        if child.is_dir() and CONTAINER_DIR_PATTERN.match(child.name):
            for sub in sorted(child.iterdir(), key=lambda p: natural_key(p.name)):
                if is_video_reported(sub):
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
        (the first file in sorted name order is kept). Frame files that are broken links are left out with a
        warning naming them (the dataset builders count them in their reports).

    Raises:
        FileNotFoundError: when the folder does not exist.
        ValueError: when the folder holds no frame image (``frame_<number>.png``), or a frame file name carries a
            number above ``2**31 - 1`` (naming the file).
    """
    numbers, paths, duplicates, broken = _list_frames(video_dir)
    if broken:
        warnings.warn(
            f"video folder {safe_text(video_dir)}: {len(broken)} frame files are broken links (skipped), e.g. {broken[:_EXAMPLES]}",
            stacklevel=2,
        )
    return numbers, paths, duplicates


def _list_frames(video_dir: PathLike) -> tuple[np.ndarray, list[str], list[tuple[int, list[str]]], list[str]]:
    """:func:`list_frames` plus the names of the frame files that are broken links."""
    folder = Path(video_dir)

    if is_video_file(folder) and folder.is_file():  # an exam stored as a video file: decoded positions
        return (*list_video_frames(folder), [])
    if not folder.is_dir():
        raise FileNotFoundError(f"video folder not found: {folder}")
    names: list[str] = []
    broken: list[str] = []
    with os.scandir(folder) as it:
        for e in it:
            if FRAME_FILE_PATTERN.match(e.name):
                try:
                    is_file = e.is_file()
                except OSError:  # ELOOP: a link in a loop of links, which leads to no file, like a dangling one
                    is_file = False
                if is_file:
                    names.append(e.name)
                elif e.is_symlink() and not os.path.exists(e.path):
                    broken.append(e.name)
    if not names:
        raise ValueError(
            f"video folder {folder} contains no frame image (expected files named frame_<number>.png, "
            f"any case, e.g. frame_000100.PNG)"
            + (f"; {len(broken)} frame files are broken links, e.g. {sorted(broken)[:_EXAMPLES]}" if broken else "")
        )
    names.sort()
    parsed = [parse_frame_number(n) or 0 for n in names]
    if max(parsed) > MAX_FRAME_ID:
        bad = names[int(np.argmax(np.asarray(parsed, dtype=object) > MAX_FRAME_ID))]
        raise ValueError(
            f"frame file {folder / bad}: its frame number has {len(str(parse_frame_number(bad)))} digits, more than "
            f"the largest frame id {MAX_FRAME_ID}; rename the file (frame_<number>.png)"
        )
    numbers = np.asarray(parsed, dtype=np.int64)
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
    return numbers[keep], paths, duplicates, sorted(broken)


def verify_frames(paths: Sequence[PathLike], mode: str = "decode", max_pixels: int | None = None) -> None:
    """Check that frame images can be read; raise naming the first file that cannot.

    The checks are the frame loader's (:mod:`monai_vce.data.frame_checks`), so a frame that passes ``"decode"`` is
    one the loader decodes.

    Args:
        paths: image files.
        mode: ``"decode"`` checks every file whole (the PNG structure, the CRC-32 of every chunk, so a single
            flipped bit is found) and decodes it (slow on millions of frames); ``"header"`` only reads the file
            signature and header (fast; finds empty, non-image, mis-named and oversized files).
        max_pixels: largest accepted frame in pixels (default 4096 x 4096).

    Raises:
        ValueError: naming the unreadable, truncated, corrupt or oversized file and the reason.
    """
    bad = _bad_frames(paths, mode, max_pixels, first_only=True)
    if bad:
        raise ValueError(bad[0][1])


def _bad_frames(
    paths: Sequence[PathLike], mode: str, max_pixels: int | None, first_only: bool = False
) -> list[tuple[int, str]]:
    """``[(position, message)]`` of the frames of ``paths`` that fail the checks of ``mode``."""
    if mode not in ("decode", "header"):
        raise ValueError(f"mode must be 'decode' or 'header', got {mode!r}")
    out: list[tuple[int, str]] = []
    checked_videos: set[str] = set()
    for i, p in enumerate(paths):
        path = os.fspath(p)
        try:
            if is_video_file(path):  # frames of a video file: the container is checked once ("header") or decoded
                if path not in checked_videos:
                    checked_videos.add(path)
                    (verify_video if mode == "decode" else probe_video)(path)
                continue
            _check_frame_file(path, mode, max_pixels)
        except (OSError, ValueError) as e:
            reason = str(e).replace(f": {path}", "").replace(f" {path}", "")
            out.append((i, f"unreadable or truncated image file {path}: {reason}"))
            if first_only:
                break
    return out


def _check_frame_file(path: str, mode: str, max_pixels: int | None) -> None:
    if mode == "header":
        head = read_frame_bytes(path, 64 * 1024)  # a JPEG's frame header may follow its metadata
        if not head:
            raise ValueError(f"empty file (0 bytes): {path}")
        if not head.startswith(PNG_SIGNATURE):
            raise ValueError(f"not a PNG file (bad signature): {path}")
        width, height = image_size(head, path)
        _check_pixels(width, height, path, max_pixels)
        return
    data = read_frame_bytes(path)
    if not data:
        raise ValueError(f"empty file (0 bytes): {path}")
    if data.startswith(PNG_SIGNATURE):
        check_png(data, path, max_pixels)
        decode_rgb(data, path, "png", max_pixels)
    elif data.startswith(JPEG_SIGNATURE):
        decode_rgb(data, path, "jpeg", max_pixels)
    else:
        raise ValueError(f"neither PNG nor JPEG content: {path}")


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
    """A column of frame ids as int64, every value an integer in ``[0, 2**31 - 1]`` (the message names the row)."""
    # at most 10 digits (an optional sign aside): the cheap vectorised conversion can then neither fail silently
    # nor overflow; anything else is found and named below
    ok = np.char.isdigit(values) & (np.char.str_len(values) <= 10)
    if ok.all():
        out = values.astype(np.int64)
        if not len(out) or out.max() <= MAX_FRAME_ID:
            return out
    for r, v in enumerate(values.tolist()):
        text = str(v)
        try:
            number = int(text)
        except ValueError:
            raise ValueError(
                f"{path}: data row {r + 1}, column {name!r}: value {short_repr(text, 40)} is not an integer"
            ) from None
        if not 0 <= number <= MAX_FRAME_ID:
            raise ValueError(
                f"{path}: data row {r + 1}, column {name!r}: value {short_repr(text, 40)} is not a frame id "
                f"(an integer in [0, {MAX_FRAME_ID}])"
            )
    raise AssertionError("unreachable: every value was checked")  # pragma: no cover


def _check_index(index: np.ndarray, frame: np.ndarray, path: Path) -> None:
    """Refuse an ``index`` value given to two rows of different ``frame`` (which of them the ground truth holds at that
    index is unknown). Rows repeating a whole row (same index, same frame) follow the repeated-frame policy."""
    order = np.lexsort((frame, index))
    same_index = index[order][1:] == index[order][:-1]
    other_frame = frame[order][1:] != frame[order][:-1]
    clash = np.flatnonzero(same_index & other_frame)
    if clash.size:
        a, b = sorted((int(order[clash[0]]), int(order[clash[0] + 1])))
        raise ValueError(
            f"{path}: data rows {a + 1} and {b + 1} both have index {int(index[a])} but frames {int(frame[a])} and "
            f"{int(frame[b])}; each index names one frame (fix or remove one of the rows)"
        )


#: Largest label CSV read (bytes); the 80 Galar CSVs are at most a few MB each.
MAX_LABEL_CSV_BYTES = 1024**3


def _csv_rows(path: Path, max_bytes: int | None = MAX_LABEL_CSV_BYTES) -> list[list[str]]:
    """The non-blank rows of a CSV file, with one-line errors naming the file for what ``csv`` would raise."""
    data = read_regular_file(path, max_bytes, "label file")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise ValueError(
            f"{path}: not UTF-8 text (byte {e.start}, line {line}); save the file as UTF-8 (e.g. from a "
            "spreadsheet: CSV UTF-8)"
        ) from None
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        return [r for r in reader if r and any(c.strip() for c in r)]
    except csv.Error as e:  # e.g. a field over csv's size limit, a NUL byte
        raise ValueError(f"{path}: line {reader.line_num}: not a readable CSV row ({e})") from None


def read_label_csv(path: PathLike, video_id: str | None = None) -> LabelTable:
    """Read one Galar label CSV.

    Header names are matched after lower-casing, trimming and replacing ``_`` by a blank, so ``Small
    Intestine`` and ``small_intestine`` both match ``small intestine``. Columns other than ``index``,
    ``frame`` and the 17 labels are ignored. Label values must be ``0`` or ``1`` (``0.0``/``1.0`` are
    accepted); ``index`` and ``frame`` values integers in ``[0, 2**31 - 1]``.

    Args:
        path: the CSV file (UTF-8).
        video_id: the video id; defaults to the file stem.

    Raises:
        FileNotFoundError: when the file does not exist.
        ValueError: naming the file and the column (and row/index for values) for a file that is not UTF-8 text
            or not a regular file, a missing ``index``, ``frame`` or label column, a column given twice, a ragged
            row, a non-0/1 label value, a frame id that is not an integer in ``[0, 2**31 - 1]``, or an ``index``
            given to two rows of different frames.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"label file not found: {path}")
    rows = _csv_rows(path)
    if not rows:
        raise ValueError(f"{path}: empty label file (expected a header with 'index', the labels and 'frame')")
    header = [_norm_header(h) for h in rows[0]]
    col: dict[str, int] = {}
    for i, h in enumerate(header):
        if h in col and h in _USED_COLUMNS:
            raise ValueError(
                f"{path}: column {short_repr(rows[0][i], 40)} appears twice in the header (columns {col[h] + 1} and "
                f"{i + 1}); which one holds the values is unknown: remove one"
            )
        col.setdefault(h, i)
    for required in ("index", "frame"):
        if required not in col:
            raise ValueError(f"{path}: missing column {required!r} (header: {short_repr(', '.join(rows[0]), 200)})")
    missing = [name for name in LABELS if name not in col]
    if missing:
        raise ValueError(
            f"{path}: missing label column{'s' if len(missing) > 1 else ''} {', '.join(repr(m) for m in missing)} "
            f"(header: {short_repr(', '.join(rows[0]), 200)})"
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
    _check_index(index, frame, path)
    label_cols = [col[name] for name in LABELS]
    raw = table[:, label_cols]
    ones = (raw == "1") | (raw == "1.0")
    zeros = (raw == "0") | (raw == "0.0")
    bad = ~(ones | zeros)
    if bad.any():
        r, c = (int(x) for x in np.argwhere(bad)[0])
        raise ValueError(
            f"{path}: data row {r + 1} (index {index[r]}), column {LABELS[c]!r}: value {short_repr(str(raw[r, c]), 40)} "
            "is not 0 or 1"
        )
    return LabelTable(
        video_id=str(video_id) if video_id is not None else path.stem,
        path=path,
        index=index,
        frame=frame,
        labels=ones.astype(np.float32).reshape(len(body), NUM_LABELS),
    )


#: Normalised header names of the columns the reader uses (a repeated one is an error; other repeats are ignored).
_USED_COLUMNS = frozenset(("index", "frame", *LABELS))


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
    header, rows = _metadata_rows(path)
    vcol, ccol = _column(header, METADATA_VIDEO_COLUMNS), _column(header, METADATA_CAPSULE_COLUMNS)
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


def read_frame_rates(path: PathLike) -> dict[str, float]:
    """Read the frame rate of each video from a metadata CSV's optional frame rate column.

    Columns as :func:`read_metadata` finds them; the rate column is the first of
    :data:`METADATA_FRAME_RATE_COLUMNS` (``frame_rate``, ``fps``, ...). Empty cells are videos without a known rate.

    Returns:
        ``{video_id: frames per second}``; ``{}`` when the file has no rate column.

    Raises:
        FileNotFoundError: when the file does not exist.
        ValueError: a rate that is not a number in (0, 10000], naming the file, the line and the video.
    """
    path = Path(path)
    header, rows = _metadata_rows(path)
    vcol, rcol = _column(header, METADATA_VIDEO_COLUMNS), _column(header, METADATA_FRAME_RATE_COLUMNS)
    if rcol is None:
        return {}
    if vcol is None:
        raise ValueError(
            f"{path}: cannot find the video id column (header: {', '.join(rows[0])}); expected one of "
            f"{', '.join(METADATA_VIDEO_COLUMNS)}"
        )
    out: dict[str, float] = {}
    for line, r in enumerate(rows[1:], start=2):
        if max(vcol, rcol) >= len(r) or not r[vcol].strip() or not r[rcol].strip():
            continue
        try:
            value: Any = float(r[rcol])
        except ValueError:
            value = r[rcol].strip()
        rate = check_frame_rate(value, f"{path}: line {line} (video {r[vcol].strip()})")
        out[r[vcol].strip()] = float(rate)  # type: ignore[arg-type]
    return out


def _metadata_rows(path: Path) -> tuple[list[str], list[list[str]]]:
    """The normalised header and the non-empty rows (header first) of a metadata CSV."""
    if not path.exists():
        raise FileNotFoundError(f"metadata file not found: {path}")
    data = read_regular_file(path, MAX_LABEL_CSV_BYTES, "metadata file")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: not UTF-8 text (byte {e.start}); save the file as UTF-8") from None
    first = text.splitlines()[0] if text.strip() else ""
    delim = max((",", ";", "\t"), key=first.count)
    reader = csv.reader(text.splitlines(), delimiter=delim)
    try:
        rows = [r for r in reader if r and any(c.strip() for c in r)]
    except csv.Error as e:
        raise ValueError(f"{path}: line {reader.line_num}: not a readable CSV row ({e})") from None
    if not rows:
        raise ValueError(f"{path}: empty metadata file")
    return [_norm_header(h).replace("-", " ") for h in rows[0]], rows


def _column(header: Sequence[str], names: Sequence[str]) -> int | None:
    return next((header.index(n) for n in names if n in header), None)


def metadata_capsules(path: PathLike, video_ids: Iterable[str]) -> dict[str, str]:
    """The capsule of each of ``video_ids`` in a metadata CSV (:func:`read_metadata`; numeric ids also match
    without leading zeros), :data:`UNKNOWN_CAPSULE` for a video it does not list."""
    lookup = _capsule_lookup(read_metadata(path))
    return {str(v): _capsule_of(lookup, str(v)) for v in video_ids}


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
        broken_links: count and first names of frame files that are broken links (skipped).
        bad_frames: count and first messages of frames failing ``check_images`` (skipped with
            ``bad_frames="skip"``).
    """

    video_id: str
    n_frames: int = 0
    n_rows: int = 0
    n_items: int = 0
    unlabeled_frames: dict = field(default_factory=lambda: {"count": 0, "examples": []})
    rows_without_frame: dict = field(default_factory=lambda: {"count": 0, "examples": []})
    duplicate_frames: dict = field(default_factory=lambda: {"count": 0, "examples": []})
    duplicate_rows: dict = field(default_factory=lambda: {"count": 0, "examples": []})
    broken_links: dict = field(default_factory=lambda: {"count": 0, "examples": []})
    bad_frames: dict = field(default_factory=lambda: {"count": 0, "examples": []})

    _KINDS: ClassVar[tuple[str, ...]] = (
        "unlabeled_frames",
        "rows_without_frame",
        "duplicate_frames",
        "duplicate_rows",
        "broken_links",
        "bad_frames",
    )
    _WORDS: ClassVar[dict[str, str]] = {
        "unlabeled_frames": "frame images without a label row (dropped)",
        "rows_without_frame": "label rows without a frame image (dropped)",
        "duplicate_frames": "frame numbers carried by several image files (first file kept)",
        "duplicate_rows": "frame numbers repeated in the label CSV (first row kept)",
        "broken_links": "frame files that are broken links (skipped)",
        "bad_frames": "unreadable, corrupted or oversized frame files (skipped, bad_frames='skip')",
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
    msgs = [safe_text(m) for m in msgs]  # one line each: a name holding a newline cannot forge a log line
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


def _check_bad_frames_policy(bad_frames: str) -> str:
    if bad_frames not in ("error", "skip"):
        raise ValueError(f"bad_frames must be 'error' or 'skip', got {bad_frames!r}")
    return bad_frames


def _drop_bad_frames(
    paths: Sequence[str], check: str | None, bad_frames: str, max_pixels: int | None, rep: VideoReport
) -> np.ndarray:
    """Positions of the frames of ``paths`` to keep: all, or those passing the check (``bad_frames="skip"``)."""
    keep = np.ones(len(paths), dtype=bool)
    if not check:
        return keep
    bad = _bad_frames(paths, check, max_pixels, first_only=bad_frames == "error")
    if bad and bad_frames == "error":
        raise ValueError(bad[0][1] + " (bad_frames='skip' leaves such frames out and reports them)")
    for i, _ in bad:
        keep[i] = False
    rep.bad_frames = {"count": len(bad), "examples": [m for _, m in bad[:_EXAMPLES]]}
    return keep


def _check_mode(check_images: bool | str) -> str | None:
    if check_images is True:
        return "decode"
    if check_images is False or check_images is None:
        return None
    if check_images in ("decode", "header"):
        return check_images
    raise ValueError(f"check_images must be True, False, 'decode' or 'header', got {check_images!r}")


def _align_video(
    video_id: str,
    folder: Path,
    table: LabelTable,
    check: str | None,
    capsule: str,
    bad_frames: str = "error",
    max_pixels: int | None = None,
) -> tuple[list[dict], VideoReport]:
    numbers, paths, dup_files, broken = _list_frames(folder)
    rep = VideoReport(video_id=video_id, n_frames=len(numbers), n_rows=len(table))
    rep.duplicate_frames = {"count": sum(len(d[1]) for d in dup_files), "examples": _examples(dup_files)}
    rep.broken_links = {"count": len(broken), "examples": broken[:_EXAMPLES]}

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
        keep = _drop_bad_frames([paths[i] for i in img_idx], check, bad_frames, max_pixels, rep)
        img_idx, row_idx = img_idx[keep], row_idx[keep]
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
    bad_frames: str = "error",
    max_pixels: int | None = None,
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
            check every image whole (structure, checksums) and decode it, ``"header"`` for a fast signature and
            size check (see :func:`verify_frames`).
        bad_frames: what a frame failing ``check_images`` does: ``"error"`` (default) raises naming the file,
            ``"skip"`` leaves it out of the datalist and reports it per video (``bad_frames`` in the report; the
            frame becomes a gap, as a missing frame number does).
        max_pixels: largest accepted frame in pixels (default 4096 x 4096) for ``check_images``.
        return_report: also return the :class:`GalarReport`.

    Returns:
        The datalist, or ``(datalist, report)`` with ``return_report=True``.
    """
    frames_dir, labels_dir = Path(frames_dir), Path(labels_dir)
    if not labels_dir.is_dir():
        raise FileNotFoundError(f"labels folder not found: {labels_dir}")
    check = _check_mode(check_images)
    _check_bad_frames_policy(bad_frames)
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
        items, rep = _align_video(vid, folder, table, check, _capsule_of(capsules, vid), bad_frames, max_pixels)
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
    bad_frames: str = "error",
    max_pixels: int | None = None,
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
        bad_frames: as in :func:`build_galar_datalist` (``"skip"``: a bad frame is left out, with a warning).
        max_pixels: as in :func:`build_galar_datalist`.
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
    _check_bad_frames_policy(bad_frames)
    selected = _select_videos(discover_videos(frames_dir), videos, frames_dir)
    if not selected:
        raise ValueError(f"no video folder found under {frames_dir}")
    capsules = _load_metadata(metadata_csv)
    report = GalarReport()
    datalist: list[dict] = []
    for vid, folder in selected.items():
        numbers, paths, dups, broken = _list_frames(folder)
        rep = VideoReport(video_id=vid, n_frames=len(numbers), n_items=len(numbers))
        rep.duplicate_frames = {"count": sum(len(d[1]) for d in dups), "examples": _examples(dups)}
        rep.broken_links = {"count": len(broken), "examples": broken[:_EXAMPLES]}
        # positions are counted before bad frames are left out: a skipped frame is a gap, as a missing file is
        position = numbers if frame_index == "number" else np.arange(len(numbers), dtype=np.int64)
        keep = _drop_bad_frames(paths, check, bad_frames, max_pixels, rep)
        if not keep.all():
            numbers, position = numbers[keep], position[keep]
            paths = [p for p, k in zip(paths, keep.tolist(), strict=True) if k]
            rep.n_items = len(paths)
        if not rep.ok:
            report.videos[vid] = rep
        capsule = _capsule_of(capsules, vid)
        idx = position.tolist()
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
