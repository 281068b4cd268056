"""Thumbnails and stored frames of a review site: small JPEG files, bounded per exam, written once by a thread
pool.
"""

from __future__ import annotations

import contextlib
import io
import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from monai_vce.data.frame_checks import JPEG_SIGNATURE, PNG_SIGNATURE, check_png, decode_rgb, read_frame_bytes
from monai_vce.data.video import iter_video_frames
from monai_vce.utils import safe_text

__all__ = ["ImageJob", "render_jobs", "jpeg_bytes"]

PathLike = str | os.PathLike


@dataclass
class ImageJob:
    """The images one exam needs.

    Attributes:
        images: (T,) frame image paths, or ``None`` for a video file.
        video: the video file, or ``None``.
        thumb_rows: rows whose thumbnail is written as ``thumb_dir/<row>.jpg``.
        full_rows: rows written at full size as ``full_dir/<row>.jpg`` (video files).
        thumb_dir: folder of the thumbnails.
        full_dir: folder of the full-size frames.
        num_frames: the number of frames of the video file (decoding stops there).
    """

    images: Sequence[str] | None
    video: str | None
    thumb_rows: np.ndarray
    full_rows: np.ndarray
    thumb_dir: Path
    full_dir: Path
    num_frames: int


def jpeg_bytes(rgb: np.ndarray, max_side: int | None, quality: int) -> bytes:
    """Encode an ``(H, W, 3)`` uint8 image as JPEG, shrunk so that its longer side is at most ``max_side``."""
    from PIL import Image

    im = Image.fromarray(np.ascontiguousarray(rgb))
    if max_side is not None and max(im.size) > max_side:
        im.thumbnail((max_side, max_side), Image.Resampling.LANCZOS)
    buf = io.BytesIO()
    im.save(buf, format="JPEG", quality=quality, optimize=True)
    return buf.getvalue()


def _read_rgb(path: str) -> np.ndarray:
    # the frame loader's checks (structure, checksums, pixel limit from the header) before Pillow decodes
    data = read_frame_bytes(path)  # a regular file, bounded
    if data.startswith(PNG_SIGNATURE):
        check_png(data, path)
        rgb = decode_rgb(data, path, "png")
    elif data.startswith(JPEG_SIGNATURE):
        rgb = decode_rgb(data, path, "jpeg")
    else:
        raise ValueError(f"unreadable frame file {path}: neither PNG nor JPEG content")
    if rgb.dtype != np.uint8:  # 16-bit grayscale: scale to 8 bit as the frame loader does
        return ((rgb.astype(np.int32) * 255 + 32767) // 65535).astype(np.uint8)
    return rgb


def _write(path: Path, data: bytes) -> None:
    # written beside and renamed (no fsync: thumbnails are many, small and remade when lost), so a thumbnail
    # that exists is complete; a failed write (a full disk) names the file and fails the run
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)  # left by a killed run; "x" then never follows a link planted there
        with open(tmp, "xb") as f:
            f.write(data)
        os.replace(tmp, path)
    except OSError as e:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise OSError(e.errno, f"cannot write the review thumbnail {safe_text(path)}: {e.strerror or e}") from None


def _is_jpeg(path: Path) -> bool:
    """Whether ``path`` is a complete JPEG file (start and end markers): an empty or cut file is written again."""
    try:
        with open(path, "rb") as f:
            head = f.read(len(JPEG_SIGNATURE))
            f.seek(-2, os.SEEK_END)
            return head == JPEG_SIGNATURE and f.read(2) == b"\xff\xd9"
    except OSError:  # missing, too short to seek, a folder
        return False


def render_jobs(
    jobs: Sequence[ImageJob],
    thumb_size: int = 128,
    quality: int = 80,
    full_quality: int = 90,
    num_workers: int | None = None,
    progress: bool = True,
) -> None:
    """Write the thumbnails and full-size frames of several exams.

    Complete JPEG files that already exist are kept (a rerun writes only what is missing, empty or cut; the caller
    empties the folders when the frames changed).

    Args:
        jobs: one :class:`ImageJob` per exam.
        thumb_size: longer side of the thumbnails in pixels.
        quality: JPEG quality of the thumbnails.
        full_quality: JPEG quality of the full-size frames.
        num_workers: encoding threads (default: the cores available to the process).
        progress: a progress bar on terminals.

    Raises:
        FileNotFoundError: a frame file is missing.
        ValueError: a frame file is unreadable, or a video file is corrupt or truncated (naming the file and its
            last good frame).
        OSError: a thumbnail could not be written (named in the message).
    """
    import sys

    from tqdm.auto import tqdm

    workers = num_workers or max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1)
    for job in jobs:
        job.thumb_dir.mkdir(parents=True, exist_ok=True)
        if len(job.full_rows):
            job.full_dir.mkdir(parents=True, exist_ok=True)
    total = sum((len(np.union1d(j.thumb_rows, j.full_rows)) if j.video is None else j.num_frames) for j in jobs)
    bar = tqdm(
        total=total,
        unit="frame",
        desc="review thumbnails",
        disable=not (progress and sys.stderr.isatty()),
        dynamic_ncols=True,
    )
    lock = threading.Lock()

    def tick(n: int = 1) -> None:
        with lock:
            bar.update(n)

    def image_task(job: ImageJob, row: int, thumb: bool, full: bool) -> None:
        tpath, fpath = job.thumb_dir / f"{row}.jpg", job.full_dir / f"{row}.jpg"
        thumb, full = thumb and not _is_jpeg(tpath), full and not _is_jpeg(fpath)
        if not thumb and not full:
            tick()
            return
        assert job.images is not None
        rgb = _read_rgb(job.images[row])
        if thumb:
            _write(tpath, jpeg_bytes(rgb, thumb_size, quality))
        if full:
            _write(fpath, jpeg_bytes(rgb, None, full_quality))
        tick()

    def video_task(job: ImageJob, pool: ThreadPoolExecutor) -> None:

        assert job.video is not None
        want_t = set(int(r) for r in job.thumb_rows if not _is_jpeg(job.thumb_dir / f"{int(r)}.jpg"))
        want_f = set(int(r) for r in job.full_rows if not _is_jpeg(job.full_dir / f"{int(r)}.jpg"))
        if not want_t and not want_f:
            tick(job.num_frames)
            return
        last = max(want_t | want_f)
        pending: list[Future] = []
        decoded = 0
        for first, frames in iter_video_frames(job.video, None, expected=job.num_frames):
            for k in range(len(frames)):
                row = first + k
                if row in want_t:
                    pending.append(
                        pool.submit(_encode_to, job.thumb_dir / f"{row}.jpg", frames[k], thumb_size, quality)
                    )
                if row in want_f:
                    pending.append(pool.submit(_encode_to, job.full_dir / f"{row}.jpg", frames[k], None, full_quality))
            decoded += len(frames)
            tick(len(frames))
            if first + len(frames) > last:
                break
        tick(job.num_frames - decoded)
        for f in pending:
            f.result()

    with ThreadPoolExecutor(max_workers=workers) as pool:
        futures: list[Future] = []
        video_threads: list[tuple[threading.Thread, list[BaseException]]] = []
        for job in jobs:
            if job.video is not None:
                errors: list[BaseException] = []
                t = threading.Thread(target=_capture(video_task, errors), args=(job, pool), daemon=True)
                t.start()
                video_threads.append((t, errors))
                continue
            thumbs, fulls = set(job.thumb_rows.tolist()), set(job.full_rows.tolist())
            for row in sorted(thumbs | fulls):
                futures.append(pool.submit(image_task, job, int(row), row in thumbs, row in fulls))
        try:
            for f in futures:
                f.result()
            for t, errors in video_threads:
                t.join()
                if errors:
                    raise errors[0]
        finally:
            bar.close()


def _encode_to(path: Path, chw: np.ndarray, max_side: int | None, quality: int) -> None:
    _write(path, jpeg_bytes(np.transpose(chw, (1, 2, 0)), max_side, quality))


def _capture(fn: Callable, errors: list[BaseException]) -> Callable:
    def run(*args: object) -> None:
        try:
            fn(*args)
        except BaseException as e:
            errors.append(e)

    return run
