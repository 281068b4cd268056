"""Exams stored as video files (``.mp4``, ``.avi``, ``.mkv``, ...): listing, streamed decoding, frame cache entries.

A file is one video (id: its stem; ``frame_number``: 0-based decoded position), decoded once into the
:class:`~monai_vce.data.FrameCache`. Needs PyAV.
"""

from __future__ import annotations

import errno
import json
import os
import threading
import warnings
from collections.abc import Hashable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from monai_vce.data.frame_checks import MAX_FRAME_PIXELS, check_pixels
from monai_vce.utils import atomic_write_json, safe_text

if TYPE_CHECKING:
    from monai_vce.data.frame_cache import FrameCache

__all__ = [
    "VIDEO_EXTENSIONS",
    "VideoInfo",
    "is_video_file",
    "require_av",
    "probe_video",
    "count_video_frames",
    "video_link_problem",
    "list_video_frames",
    "iter_video_frames",
    "verify_video",
    "write_video",
    "video_source",
    "build_video_entries",
    "video_files",
    "video_entry_complete",
    "ensure_video_entries",
]

PathLike = str | os.PathLike

#: File extensions read as video files (matched case-insensitively).
VIDEO_EXTENSIONS: tuple[str, ...] = (
    ".mp4",
    ".m4v",
    ".mov",
    ".avi",
    ".mkv",
    ".webm",
    ".mpg",
    ".mpeg",
    ".wmv",
    ".ogv",
)
_INSTALL_HINT = "pip install 'monai-vce[video]'"

#: Largest share of the frames listed by a video's index that may fail to decode before the file is refused as
#: damaged (a codec's hidden frames, e.g. VP8 alt-ref, are packets without a picture); a video missing 2 % fails.
MISSING_FRAMES_TOLERANCE = 0.005


def is_video_file(path: PathLike) -> bool:
    """Whether ``path`` names a video file by its extension (see :data:`VIDEO_EXTENSIONS`); no file access."""
    return os.path.splitext(os.fspath(path))[1].lower() in VIDEO_EXTENSIONS


def require_av() -> Any:
    """Import PyAV, or raise an ``ImportError`` that says how to install it.

    Returns:
        The ``av`` module.
    """
    try:
        import av
    except ImportError:
        raise ImportError(
            f"reading exams stored as video files needs PyAV (FFmpeg's libraries): {_INSTALL_HINT}"
        ) from None
    return av


@dataclass(frozen=True)
class VideoInfo:
    """What the container says about a video file.

    Attributes:
        path: the file.
        num_frames: number of frames: the ones its index lists (:func:`probe_video`: the non-empty packets that
            are not discarded by an edit list), or the ones it decodes to (:func:`count_video_frames`).
        fps: average frame rate, ``None`` when the container does not give one.
        width: frame width in pixels, as stored (before ``rotation``).
        height: frame height in pixels, as stored.
        codec: the decoder's name.
        rotation: counter-clockwise degrees (0, 90, 180, 270) the frames are turned to be shown as a player shows
            them (the display matrix of the file); known once a frame is decoded, else 0.
        duration_frames: frames the container's duration says at ``fps``, ``None`` when it gives no duration.
        duration: the video's duration in seconds (its stream's, else the container's when it holds only video),
            ``None`` when not known.
    """

    path: str
    num_frames: int
    fps: float | None
    width: int
    height: int
    codec: str
    rotation: int = 0
    duration_frames: int | None = None
    duration: float | None = None


def video_link_problem(path: PathLike) -> str | None:
    """Why ``path`` cannot be read as a file because of a symbolic link (dangling, or a loop), else ``None``."""
    path = os.fspath(path)
    try:
        os.stat(path)
    except OSError as e:
        if os.path.islink(path) or e.errno == errno.ELOOP:
            if e.errno == errno.ELOOP:
                return f"video file {safe_text(path)} is a symbolic link loop"
            return f"video file {safe_text(path)} is a dangling symbolic link (to {safe_text(os.readlink(path))})"
    return None


def _open(path: PathLike) -> Any:
    av = require_av()
    path = os.fspath(path)
    if not os.path.isfile(path):
        problem = video_link_problem(path)
        raise FileNotFoundError(problem or f"video file not found: {safe_text(path)}")
    try:
        container = av.open(path)
    except Exception as e:  # FFmpeg's errors all derive from av.FFmpegError, itself an OSError/ValueError mix
        raise ValueError(f"cannot open video file {safe_text(path)}: {_reason(e)}") from None
    if not container.streams.video:
        container.close()
        raise ValueError(f"video file {safe_text(path)} has no video stream")
    return container


def _reason(e: Exception) -> str:
    return safe_text((str(e).strip() or type(e).__name__).splitlines()[-1])


def probe_video(path: PathLike) -> VideoInfo:
    """Read a video file's frame count, frame rate and size without decoding it.

    The frame count is the container's (``nb_frames``) when it records one, else the number of non-empty
    packets of the video stream (demuxing only). It is what the file *says*: :func:`count_video_frames` gives the
    frames it decodes to, which the datalists and caches use.

    Raises:
        ImportError: PyAV is not installed.
        FileNotFoundError: the file does not exist, or is a dangling or looped link.
        ValueError: the file cannot be opened as a video, has no video stream or no frame.
    """
    name = safe_text(path)
    with _open(path) as container:
        stream = container.streams.video[0]
        rate = stream.average_rate or stream.guessed_rate
        fps = float(rate) if rate else None
        n = int(stream.frames or 0)
        if n <= 0:
            n = 0
            try:
                for packet in container.demux(stream):
                    n += 1 if packet.size else 0
            except Exception as e:
                raise ValueError(
                    f"corrupt or truncated video file {name}: unreadable after frame {n - 1} (last good frame; "
                    f"{_reason(e)})"
                ) from None
        # not a refusal: variable-frame-rate files disagree with it; count_video_frames warns instead. The
        # stream's own duration when it has one (an audio track may outlast the video)
        seconds = float(stream.duration * stream.time_base) if stream.duration and stream.time_base else None
        if not seconds and container.duration and all(s.type == "video" for s in container.streams):
            seconds = container.duration / 1e6
        duration = round(seconds * fps) if seconds and fps else None
        ctx = stream.codec_context
        info = VideoInfo(
            os.fspath(path), n, fps, int(ctx.width or 0), int(ctx.height or 0), str(ctx.name), 0, duration, seconds
        )
    if info.width and info.height:  # a frame size no capsule has: refused before any frame is decoded
        check_pixels(info.width, info.height, f"of video file {name}")
    if info.num_frames <= 0:
        raise ValueError(f"video file {name} contains no frame")
    return info


# (file identity) -> (decoded info, warning): one counting pass per file and process, the warning given each time
_COUNTED: dict[tuple, tuple[VideoInfo, str | None]] = {}
_COUNTED_LOCK = threading.Lock()


def count_video_frames(path: PathLike) -> VideoInfo:
    """Count a video file's frames by decoding it, as a player (or ``ffprobe -count_frames``) does.

    One pass over the file (decoding only, no colour conversion), remembered per file content for the process.
    Warns, naming both numbers, when the container's frame count or its duration at its frame rate disagrees
    with the decoded count (variable frame rate, an edit list, or frames missing from the file), with the first
    timestamp jump when there is one.

    Returns:
        The :func:`probe_video` info with ``num_frames`` the decoded count and ``rotation`` the file's.

    Raises:
        ValueError: the file is corrupt or truncated (naming the last good frame), decodes to no frame, or decodes
            to fewer frames than its index lists by more than :data:`MISSING_FRAMES_TOLERANCE` (both counts).
    """
    info = probe_video(path)
    st = os.stat(path)
    key = (os.path.realpath(path), st.st_ino, st.st_size, st.st_mtime_ns)
    with _COUNTED_LOCK:
        known = _COUNTED.get(key)
    if known is not None:
        if known[1]:
            warnings.warn(known[1], stacklevel=2)
        return replace(known[0], path=os.fspath(path))
    name = safe_text(path)
    listed = decoded = 0
    rotation = 0
    jumps: list[int] = []
    first_pts: int | None = None
    last_pts: int | None = None
    step: int | None = None
    with _open(path) as container:
        stream = container.streams.video[0]
        stream.thread_type = "AUTO"
        time_base = float(stream.time_base or 0)
        try:
            for packet in container.demux(stream):
                # packets an edit list cuts are demuxed but never shown: not part of the index a player plays
                if packet.size and not packet.is_discard:
                    listed += 1
                for frame in packet.decode():
                    if decoded == 0:
                        rotation = (round(float(getattr(frame, "rotation", 0) or 0) / 90) % 4) * 90
                    if frame.pts is not None:
                        first_pts = frame.pts if first_pts is None else first_pts
                        if last_pts is not None and frame.pts > last_pts:
                            delta = frame.pts - last_pts
                            step = delta if step is None else min(step, delta)
                            if delta * 2 > step * 3:
                                jumps.append(decoded - 1)
                        last_pts = frame.pts
                    decoded += 1
        except Exception as e:
            last = f"frame {decoded - 1}" if decoded else "no frame"
            raise ValueError(
                f"corrupt or truncated video file {name}: decoding failed after {last} (last good frame; {_reason(e)})"
            ) from None
    if decoded <= 0:
        raise ValueError(f"video file {name} contains no frame (its index lists {listed})")
    if listed - decoded > MISSING_FRAMES_TOLERANCE * listed:
        raise ValueError(
            f"damaged video file {name}: it decodes to {decoded} frames but its index lists {listed} "
            f"({listed - decoded} missing, {100 * (listed - decoded) / listed:.1f} %)"
        )
    if info.duration and time_base and first_pts is not None and last_pts is not None:
        # a file cut short still carries the duration of the whole video in its header, where a
        # variable-frame-rate file's frames span the whole duration
        span = (last_pts - first_pts + (step or 0)) * time_base
        frame_time = (step or 0) * time_base or (1 / info.fps if info.fps else 0)
        if info.duration - span > max(2 * frame_time, 0.01 * info.duration):
            raise ValueError(
                f"corrupt or truncated video file {name}: its {decoded} frames end at {span:.2f} s but its duration "
                f"is {info.duration:.2f} s (last good frame: {decoded - 1})"
            )
    says = []
    note = None
    if info.num_frames != decoded:
        says.append(f"its container lists {info.num_frames} frames")
    # one frame off already tells: a Matroska file missing a few frames has no other sign of it
    if info.duration and info.fps and abs(info.duration * info.fps - decoded) > 0.75:
        says.append(f"its duration at {info.fps:g} frames/s says about {info.duration_frames}")
    if says:
        jump = f"; its timestamps jump {len(jumps)} times, first after decoded frame {jumps[0]}" if jumps else ""
        note = (
            f"video file {name} decodes to {decoded} frames, but {' and '.join(says)} (variable frame rate, an edit "
            f"list, or frames missing from the file{jump}); the {decoded} decoded frames are used"
        )
        warnings.warn(note, stacklevel=2)
    out = replace(info, num_frames=decoded, rotation=rotation)
    with _COUNTED_LOCK:
        _COUNTED[key] = (out, note)
    return out


def list_video_frames(path: PathLike) -> tuple[np.ndarray, list[str], list[tuple[int, list[str]]]]:
    """The frames of a video file in the form of :func:`monai_vce.data.galar.list_frames`.

    Returns:
        ``(numbers, paths, duplicates)``: the decoded positions ``0..T-1`` (``T`` counted by decoding, see
        :func:`count_video_frames`), the video file repeated ``T`` times (one datalist ``image`` per frame) and no
        duplicates.
    """
    n = count_video_frames(path).num_frames
    return np.arange(n, dtype=np.int64), [os.fspath(path)] * n, []


def iter_video_frames(
    path: PathLike,
    image_size: int | Sequence[int] | None = None,
    chunk: int = 64,
    expected: int | None = None,
    antialias: bool = True,
) -> Iterator[tuple[int, np.ndarray]]:
    """Decode a video file in order, streamed, as chunks of ``uint8`` RGB frames.

    Only one chunk is in memory at a time. Frames are resized like PNG frames
    (:func:`monai_vce.data.frames.load_vce_frame`: bilinear, antialiased, on the ``uint8`` tensor).

    Args:
        path: the video file.
        image_size: output size (int or ``(H, W)``); ``None`` keeps the decoded size.
        chunk: frames per yielded chunk.
        expected: the number of frames the video must have; fewer decoded frames raise ``ValueError``
            (decoding stops at ``expected``, later frames are ignored). ``None``: decode to the end.
        antialias: antialiased resize.

    Yields:
        ``(first position, frames)`` with ``frames`` uint8 ``(B, 3, H, W)``.

    Raises:
        ImportError: PyAV is not installed.
        ValueError: the file is corrupt or truncated: ``corrupt or truncated video file PATH: ... after frame N
            (the last good frame) ...``, or has fewer frames than ``expected``.
    """
    import torch

    from monai_vce.data.frames import resize_frame

    path = os.fspath(path)
    name = safe_text(path)
    buf: list[np.ndarray] = []
    start = 0
    done = 0
    limit = MAX_FRAME_PIXELS

    def flush() -> np.ndarray:
        batch = torch.from_numpy(np.stack(buf)).permute(0, 3, 1, 2)
        return resize_frame(batch, image_size, antialias).numpy()

    def last_good() -> str:
        return f"frame {done - 1}" if done else "no frame"

    with _open(path) as container:
        stream = container.streams.video[0]
        stream.thread_type = "AUTO"  # FFmpeg's own frame threads
        frames = container.decode(stream)
        while expected is None or done < expected:
            try:
                frame = next(frames)
            except StopIteration:
                break
            except Exception as e:
                raise ValueError(
                    f"corrupt or truncated video file {name}: decoding failed after {last_good()} "
                    f"(last good frame; {_reason(e)})"
                ) from None
            if done == 0 or frame.width * frame.height > limit:
                check_pixels(frame.width, frame.height, f"{done} of video file {name}")
            rgb = frame.to_ndarray(format="rgb24")
            turns = round(float(getattr(frame, "rotation", 0) or 0) / 90) % 4
            buf.append(np.rot90(rgb, turns) if turns else rgb)  # as a player shows it (display matrix)
            done += 1
            if len(buf) == chunk:
                yield start, flush()
                start, buf = done, []
    if buf:
        yield start, flush()
    if expected is not None and done < expected:
        raise ValueError(
            f"corrupt or truncated video file {name}: {done} frames decoded, the container lists {expected} "
            f"(last good frame: {last_good().removeprefix('frame ')})"
        )


def verify_video(path: PathLike) -> int:
    """Decode a whole video file to check it (:func:`count_video_frames`); returns its number of frames.

    Raises:
        ValueError: naming the file and the last good frame when it is corrupt or truncated, or both counts when
            it decodes to fewer frames than its index lists.
    """
    return count_video_frames(path).num_frames


def write_video(
    path: PathLike,
    frames: Iterator[np.ndarray] | Sequence[np.ndarray],
    fps: int = 5,
    codec: str | None = None,
    quality: int = 12,
) -> Path:
    """Encode ``uint8`` RGB frames ``(H, W, 3)`` (or chunks ``(B, H, W, 3)``) into a video file.

    Used by the generated mini-Galar. The codec follows the extension unless given: H.264 (``.mp4``, ``.mov``,
    ``.mkv``), Motion-JPEG (``.avi``), VP9 (``.webm``); ``codec="ffv1"`` is lossless RGB. Single-threaded encoding
    with fixed settings, so the same frames give the same file. Frame sides must be even (4:2:0 chroma).

    Args:
        path: the output file; written to a temporary name and renamed, so it exists only when complete.
        frames: frames or chunks of frames, in order.
        fps: frame rate stored in the container.
        codec: FFmpeg encoder name (``None``: from the extension).
        quality: constant quality (H.264/VP9 CRF; lower is better), or the MJPEG quantiser scale.

    Returns:
        ``path``.
    """
    av = require_av()
    path = Path(path)
    ext = path.suffix.lower()
    codec = codec or {".avi": "mjpeg", ".webm": "libvpx-vp9"}.get(ext, "libx264")
    tmp = path.with_name(f".{path.name}.partial{ext}")
    path.parent.mkdir(parents=True, exist_ok=True)
    stream = None
    try:
        with av.open(str(tmp), "w") as container:
            for item in frames:
                batch = item[None] if item.ndim == 3 else item
                for arr in batch:
                    if stream is None:
                        h, w = arr.shape[:2]
                        if h % 2 or w % 2:
                            raise ValueError(f"video frames need even sides, got {w} x {h}: {path}")
                        stream = container.add_stream(codec, rate=int(fps))
                        stream.width, stream.height = w, h
                        if codec == "ffv1":  # lossless, in RGB: an exact round trip
                            stream.pix_fmt = "bgr0"
                        elif codec == "mjpeg":
                            stream.pix_fmt = "yuvj420p"
                            stream.options = {"q:v": str(quality)}
                            stream.codec_context.qmin = stream.codec_context.qmax = int(quality)
                        else:
                            stream.pix_fmt = "yuv420p"
                            stream.options = {"crf": str(quality), "threads": "1"}
                            if codec == "libx264":
                                stream.options.update({"preset": "veryfast", "tune": "stillimage"})
                    frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(arr, dtype=np.uint8), format="rgb24")
                    for packet in stream.encode(frame):
                        container.mux(packet)
            if stream is None:
                raise ValueError(f"no frame to write into {path}")
            for packet in stream.encode():
                container.mux(packet)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


# ------------------------------------------------------------------------------------------- frame cache
def video_source(path: PathLike) -> dict[str, Any]:
    """What identifies a video file's content in a cache manifest: absolute path, size and modification time."""
    p = Path(path)
    try:
        st = p.stat()
    except FileNotFoundError:
        raise FileNotFoundError(f"video file not found: {p}") from None
    return {"video": str(p.resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def _show_progress(progress: bool) -> bool:
    import sys

    return bool(progress) and sys.stderr.isatty()


def build_video_entries(
    cache: FrameCache,
    todo: Sequence[tuple[str, str]],
    num_workers: int = 0,
    progress: bool = True,
    chunk: int = 64,
) -> None:
    """Decode video files into frame cache entries, each once, sequentially, videos in parallel.

    Each video is streamed into ``.<video_id>.npy.partial`` (a chunk in memory at a time), renamed into place
    when every frame is in, and its manifest (format version, id, size, frame count and the file's
    :func:`video_source`) written last, like image entries (see :class:`~monai_vce.data.FrameCache`). A
    corrupt or truncated video raises ``ValueError`` naming the file and its last good frame; its partial file
    is removed, entries finished before it stay.

    Args:
        cache: the frame cache.
        todo: ``(video_id, video file)`` pairs to build.
        num_workers: videos decoded at the same time (threads; FFmpeg decodes and the resize runs outside
            Python's lock); ``0`` or ``1`` decodes one at a time.
        progress: a frames/s progress bar when ``stderr`` is a terminal.
        chunk: frames decoded and written per step.
    """
    from tqdm.auto import tqdm

    if not todo:
        return
    cache.root.mkdir(parents=True, exist_ok=True)
    infos = [count_video_frames(path) for _, path in todo]  # the decoded count, as a player shows the video
    s = cache.image_size
    bar = tqdm(
        total=sum(i.num_frames for i in infos),
        unit="frame",
        desc="video decode",
        disable=not _show_progress(progress),
        dynamic_ncols=True,
    )
    lock = threading.Lock()
    stop = threading.Event()

    def one(k: int) -> None:
        vid, path = todo[k]
        info = infos[k]
        cache.manifest_path(vid).unlink(missing_ok=True)  # a stale manifest never vouches for a rebuilt array
        partial = cache.partial_path(vid)
        arr = cache.open_partial(vid, info.num_frames)  # disk space reserved first: a full disk is an OSError
        try:
            for first, frames in iter_video_frames(path, s, chunk=chunk, expected=info.num_frames):
                if stop.is_set():
                    raise RuntimeError("stopped")
                arr[first : first + len(frames)] = frames
                with lock:
                    bar.update(len(frames))
            arr.flush()
            del arr
            with open(partial, "rb+") as f:
                os.fsync(f.fileno())
            os.replace(partial, cache.array_path(vid))

            atomic_write_json(cache.manifest_path(vid), _video_manifest(cache, vid, info.num_frames, path, info))
        except BaseException:
            stop.set()
            partial.unlink(missing_ok=True)
            raise

    try:
        workers = max(1, int(num_workers))
        if workers == 1 or len(todo) == 1:
            for k in range(len(todo)):
                one(k)
        else:
            with ThreadPoolExecutor(max_workers=min(workers, len(todo))) as pool:
                for fut in [pool.submit(one, k) for k in range(len(todo))]:
                    fut.result()
    finally:
        bar.close()


def _video_manifest(
    cache: FrameCache, video_id: str, num_frames: int, path: PathLike, info: VideoInfo | None = None
) -> dict[str, Any]:
    """The manifest of a video's cache entry; ``info`` adds what a reader of the video needs (frame rate, rotation)."""
    from monai_vce.data.frame_cache import CACHE_FORMAT_VERSION

    out: dict[str, Any] = {
        "format_version": CACHE_FORMAT_VERSION,
        "video_id": video_id,
        "image_size": cache.image_size,
        "num_frames": int(num_frames),
        "source": video_source(path),
    }
    if info is not None:
        out.update(fps=info.fps, rotation=info.rotation)
    return out


def video_entry_complete(cache: FrameCache, video_id: str, path: PathLike, frames_needed: int = 0) -> bool:
    """Whether the cache entry of a video file is complete, made from the file as it is now, at the cache's size,
    and holds at least ``frames_needed`` frames."""
    mpath, apath = cache.manifest_path(video_id), cache.array_path(video_id)
    if not (mpath.is_file() and apath.is_file()):
        return False
    try:
        manifest = json.loads(mpath.read_text())
        num = int(manifest["num_frames"])
    except (OSError, ValueError, KeyError, TypeError):
        return False
    expected = _video_manifest(cache, video_id, num, path)  # the identity; the frame rate etc. are information
    if not isinstance(manifest, dict) or {k: manifest.get(k) for k in expected} != expected or num < frames_needed:
        return False
    try:
        arr = np.load(apath, mmap_mode="r")
    except (OSError, ValueError):
        return False
    return arr.dtype == np.uint8 and arr.shape == (num, 3, cache.image_size, cache.image_size)


def video_files(data: Sequence[Mapping[Hashable, Any]], image_key: str) -> dict[str, tuple[str, int]]:
    """``{video_id: (video file, frames needed)}`` of the datalist items whose image is a video file."""
    out: dict[str, tuple[str, int]] = {}
    for i, item in enumerate(data):
        image = item.get(image_key)
        if not isinstance(image, (str, os.PathLike)) or not is_video_file(image):
            continue
        try:
            vid, row = str(item["video_id"]), int(item["frame_number"])
        except KeyError as e:
            raise ValueError(
                f"datalist item {i} (video file {image}) has no {e.args[0]!r} field; frames of a video file are "
                f"served by their decoded position, 'frame_number'"
            ) from None
        path, need = out.get(vid, (os.fspath(image), 0))
        if path != os.fspath(image):
            raise ValueError(f"video {vid!r} names two video files: {safe_text(path)} and {safe_text(image)}")
        out[vid] = (path, max(need, row + 1))
    return out


def ensure_video_entries(
    cache: FrameCache,
    data: Sequence[Mapping[Hashable, Any]],
    image_key: str = "image",
    num_workers: int = 0,
    progress: bool = True,
) -> dict[str, str]:
    """Build the missing or stale cache entries of every video file named in ``data``.

    Returns:
        ``{video_id: video file}`` of the video files in ``data``.
    """
    videos = video_files(data, image_key)
    todo = [(vid, path) for vid, (path, need) in videos.items() if not video_entry_complete(cache, vid, path, need)]
    build_video_entries(cache, todo, num_workers=num_workers, progress=progress)
    for vid, (path, need) in videos.items():
        num = int(json.loads(cache.manifest_path(vid).read_text())["num_frames"])
        if need > num:
            raise ValueError(
                f"datalist asks for frame {need - 1} of video file {safe_text(path)}, which decodes to {num} frames"
            )
    return {vid: path for vid, (path, _) in videos.items()}
