"""An on-disk cache of decoded, resized ``uint8`` frames, one memory-mapped ``.npy`` per video.

``<cache_dir>/<S>px/<video_id>.npy`` (T, 3, S, S) with a ``.json`` manifest written last; an entry is reused only
when it matches the frame list and size.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from collections.abc import Callable, Hashable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from monai.data import Dataset
from monai.transforms import apply_transform

from monai_vce.data.frames import LoadVCEFrame
from monai_vce.data.video import ensure_video_entries, video_entry_complete, video_files
from monai_vce.events.probabilities import video_file_name
from monai_vce.utils import atomic_write_json

__all__ = ["FrameCache", "FrameCacheDataset", "CACHE_FORMAT_VERSION"]

CACHE_FORMAT_VERSION = 1


def _reason(err: OSError) -> str:
    """``"no space left on the device (ENOSPC)"``: the strerror and the symbolic errno of ``err``."""
    import errno

    name = errno.errorcode.get(err.errno or 0, "")
    text = (err.strerror or str(err)).lower()
    return f"{text} ({name})" if name else text


def _show_progress(progress: bool) -> bool:
    return bool(progress) and sys.stderr.isatty()


def group_by_video(data: Sequence[Mapping[Hashable, Any]], image_key: str = "image") -> dict[str, list[str]]:
    """Frame paths of each video, in datalist order (the row order of the cache)."""
    videos: dict[str, list[str]] = {}
    for i, item in enumerate(data):
        try:
            vid, path = str(item["video_id"]), os.fspath(item[image_key])
        except KeyError as e:
            raise ValueError(
                f"datalist item {i} has no {e.args[0]!r} field; the frame cache needs 'video_id' and {image_key!r}"
            ) from None
        videos.setdefault(vid, []).append(path)
    return videos


class _FrameListDataset(torch.utils.data.Dataset):
    """(video number, row, uint8 frame) for the frames to decode, so one DataLoader serves every video."""

    def __init__(self, jobs: list[tuple[int, int, str]], loader: Callable[[str], torch.Tensor]):
        self.jobs = jobs
        self.loader = loader

    def __len__(self) -> int:
        return len(self.jobs)

    def __getitem__(self, i: int) -> tuple[int, int, torch.Tensor]:
        v, row, path = self.jobs[i]
        return v, row, self.loader(path)


class FrameCache:
    """Per-video memory-mapped cache of decoded, resized ``uint8`` frames (see ``docs/design/data.md``).

    Args:
        cache_dir: cache root folder; entries go to ``<cache_dir>/<S>px/``.
        image_size: square frame size ``S`` stored in the cache.
        check_file_sizes: include each frame file's size in the validity digest (one ``stat`` per frame),
            so that re-exported frames invalidate the entry; otherwise only the paths and their order count.
        allow_jpeg: passed to :class:`~monai_vce.data.frames.LoadVCEFrame`.
    """

    def __init__(
        self,
        cache_dir: str | os.PathLike,
        image_size: int = 224,
        check_file_sizes: bool = True,
        allow_jpeg: bool = True,
    ) -> None:
        self.image_size = int(image_size)
        self.root = Path(cache_dir) / f"{self.image_size}px"
        self.check_file_sizes = check_file_sizes
        self.loader = LoadVCEFrame(image_size=self.image_size, allow_jpeg=allow_jpeg)

    # --- paths and validity -------------------------------------------------------------------------------
    def array_path(self, video_id: str) -> Path:
        """The finished array of ``video_id`` (named by :func:`monai_vce.events.video_file_name`: never a path)."""
        return self.root / video_file_name(video_id, ".npy")

    def manifest_path(self, video_id: str) -> Path:
        """The manifest of ``video_id``; it exists only for a complete entry."""
        return self.root / video_file_name(video_id, ".json")

    def partial_path(self, video_id: str) -> Path:
        """The array under construction; never read."""
        return self.root / f".{video_file_name(video_id, '.npy.partial')}"

    def digest(self, paths: Sequence[str]) -> str:
        """SHA-256 of the frame paths in order (and, with ``check_file_sizes``, their file sizes)."""
        h = hashlib.sha256()
        for p in paths:
            if self.check_file_sizes:
                try:
                    size = os.stat(p).st_size
                except FileNotFoundError:
                    raise FileNotFoundError(f"frame file not found: {p}") from None
                h.update(f"{p}\t{size}\n".encode())
            else:
                h.update(f"{p}\n".encode())
        return h.hexdigest()

    def _expected_manifest(self, video_id: str, paths: Sequence[str], digest: str | None = None) -> dict[str, Any]:
        return {
            "format_version": CACHE_FORMAT_VERSION,
            "video_id": video_id,
            "image_size": self.image_size,
            "num_frames": len(paths),
            "digest": digest or self.digest(paths),
            "file_sizes_checked": self.check_file_sizes,
        }

    def is_complete(self, video_id: str, paths: Sequence[str], digest: str | None = None) -> bool:
        """Whether the cached entry of ``video_id`` exists, is complete and matches ``paths`` and the size."""
        mpath, apath = self.manifest_path(video_id), self.array_path(video_id)
        if not (mpath.is_file() and apath.is_file()):
            return False
        try:
            manifest = json.loads(mpath.read_text())
        except (OSError, ValueError):
            return False
        if manifest != self._expected_manifest(video_id, paths, digest):
            return False
        try:
            arr = np.load(apath, mmap_mode="r")
        except (OSError, ValueError):
            return False
        return arr.dtype == np.uint8 and arr.shape == (len(paths), 3, self.image_size, self.image_size)

    def open(self, video_id: str) -> np.ndarray:
        """Read-only memory map ``(T, 3, S, S)`` of a complete entry."""
        if not self.manifest_path(video_id).is_file():
            raise FileNotFoundError(f"no complete frame cache for video {video_id!r} in {self.root}; build it first")
        return np.load(self.array_path(video_id), mmap_mode="r")

    def open_partial(self, video_id: str, num_frames: int) -> np.memmap:
        """A writable memory map ``(T, 3, S, S)`` of the entry under construction, its disk space allocated first.

        A memory map over a sparse file dies with ``SIGBUS`` when the disk fills while it is written; the blocks
        are therefore reserved with ``posix_fallocate`` before any frame is written.

        Raises:
            OSError: the space cannot be had (``ENOSPC``, ``EFBIG``, ...): one line naming the file; the partial
                file is removed, finished entries are untouched.
        """
        partial = self.partial_path(video_id)
        shape = (int(num_frames), 3, self.image_size, self.image_size)
        try:
            arr = np.lib.format.open_memmap(partial, mode="w+", dtype=np.uint8, shape=shape)
            with open(partial, "rb+") as f:
                os.posix_fallocate(f.fileno(), 0, os.fstat(f.fileno()).st_size)
        except OSError as err:
            partial.unlink(missing_ok=True)
            out = type(err)(
                f"cannot write frame cache file {partial} ({np.prod(shape) / 1e9:.2f} GB for video {video_id!r}): "
                f"{_reason(err)}; finished cache entries are intact"
            )
            out.errno = err.errno
            raise out from None
        return arr

    # --- building ----------------------------------------------------------------------------------------
    def build(
        self,
        data: Sequence[Mapping[Hashable, Any]],
        image_key: str = "image",
        num_workers: int = 0,
        batch_size: int = 64,
        progress: bool = True,
    ) -> dict[str, Path]:
        """Decode and store every video of ``data`` whose entry is missing, partial or stale.

        Args:
            data: datalist of frame dicts with ``video_id`` and ``image_key``; a video's rows follow the
                order of its frames in ``data``.
            image_key: key of the frame paths.
            num_workers: DataLoader worker processes decoding frames (one per core is a good choice).
            batch_size: frames per DataLoader batch.
            progress: show a progress bar (frames, frames/s, videos) when ``stderr`` is a terminal.

        Returns:
            ``{video_id: array path}`` for every video of ``data``.
        """

        # exams stored as video files: each decoded once, sequentially (monai_vce.data.video)
        files = ensure_video_entries(self, data, image_key, num_workers=num_workers, progress=progress)
        videos = group_by_video(data, image_key)
        todo: list[tuple[str, list[str], str]] = []
        for vid, paths in videos.items():
            if vid in files:
                continue
            digest = self.digest(paths)
            if not self.is_complete(vid, paths, digest):
                todo.append((vid, paths, digest))
        if todo:
            self._build(todo, num_workers=num_workers, batch_size=batch_size, progress=progress)
        return {vid: self.array_path(vid) for vid in videos}

    def _build(self, todo: list[tuple[str, list[str], str]], num_workers: int, batch_size: int, progress: bool) -> None:
        from tqdm.auto import tqdm

        self.root.mkdir(parents=True, exist_ok=True)
        arrays: dict[int, np.memmap] = {}
        filled = np.zeros(len(todo), dtype=np.int64)
        jobs = [(v, row, p) for v, (_, paths, _) in enumerate(todo) for row, p in enumerate(paths)]
        # a stale manifest must never vouch for the array being rebuilt
        for vid, _, _ in todo:
            self.manifest_path(vid).unlink(missing_ok=True)
        loader = torch.utils.data.DataLoader(
            _FrameListDataset(jobs, self.loader),
            batch_size=batch_size,
            num_workers=num_workers,
            shuffle=False,
            persistent_workers=False,
            prefetch_factor=4 if num_workers > 0 else None,
        )
        done = 0
        bar = tqdm(
            total=len(jobs), unit="frame", desc="frame cache", disable=not _show_progress(progress), dynamic_ncols=True
        )
        try:
            for vnum, rows, images in loader:
                vnum, rows, images = vnum.numpy(), rows.numpy(), images.numpy()
                for v in np.unique(vnum):
                    sel = vnum == v
                    if v not in arrays:
                        vid, paths, _ = todo[v]
                        arrays[v] = self.open_partial(vid, len(paths))
                    arrays[v][rows[sel]] = images[sel]
                    filled[v] += int(sel.sum())
                    if filled[v] == len(todo[v][1]):
                        self._finish(todo[v][0], todo[v][1], todo[v][2], arrays.pop(v))
                        done += 1
                bar.update(len(vnum))
                bar.set_postfix(videos=f"{done}/{len(todo)}", refresh=False)
        finally:
            bar.close()
            # interrupted: partial files stay behind without a manifest and are rebuilt next time
            arrays.clear()

    def _finish(self, video_id: str, paths: list[str], digest: str, arr: np.memmap) -> None:
        arr.flush()
        partial = self.partial_path(video_id)
        del arr
        with open(partial, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(partial, self.array_path(video_id))
        atomic_write_json(self.manifest_path(video_id), self._expected_manifest(video_id, paths, digest))


class FrameCacheDataset(Dataset):
    """A MONAI ``Dataset`` of frame dicts whose ``image`` is read from a :class:`FrameCache` instead of decoded.

    Each item is the datalist dict with ``image_key`` replaced by the cached ``uint8`` tensor ``(3, S, S)``,
    then passed through ``transform`` (the augmentations; leave the frame loader out of it). Missing or stale
    video entries are built at construction (``build=True``), with a progress bar.

    Memory maps are opened lazily in each process (DataLoader workers included) and are never pickled.

    Args:
        data: datalist of frame dicts (``video_id``, ``image`` path, ``label``, ...).
        cache_dir: cache root folder.
        image_size: cached frame size ``S``.
        transform: transforms applied after the cached frame is in place.
        image_key: key of the frame paths / frames.
        build: build missing or stale entries now; with ``False`` a missing entry raises ``FileNotFoundError``.
        num_workers: worker processes used to build the cache.
        batch_size: frames per batch while building.
        progress: progress bar while building (shown only on a terminal).
        check_file_sizes: see :class:`FrameCache`.
    """

    def __init__(
        self,
        data: Sequence[Mapping[Hashable, Any]],
        cache_dir: str | os.PathLike,
        image_size: int = 224,
        transform: Callable | None = None,
        image_key: str = "image",
        build: bool = True,
        num_workers: int = 0,
        batch_size: int = 64,
        progress: bool = True,
        check_file_sizes: bool = True,
    ) -> None:
        if len(data) == 0:
            raise ValueError("FrameCacheDataset: the datalist is empty")
        super().__init__(data=data, transform=transform)

        files = video_files(data, image_key)  # exams stored as video files: {video_id: (file, frames needed)}
        self.image_key = image_key
        self.cache = FrameCache(cache_dir, image_size=image_size, check_file_sizes=check_file_sizes)
        if build:
            self.cache.build(
                data, image_key=image_key, num_workers=num_workers, batch_size=batch_size, progress=progress
            )
        else:
            for vid, paths in group_by_video(data, image_key).items():
                done = video_entry_complete(self.cache, vid, *files[vid]) if vid in files else None
                if done is False or (done is None and not self.cache.is_complete(vid, paths)):
                    raise FileNotFoundError(
                        f"frame cache for video {vid!r} in {self.cache.root} is missing, partial or stale; "
                        f"construct FrameCacheDataset with build=True"
                    )
        # (video, row) of every item, vectorised once
        uniq, vnum = np.unique(np.array([str(item["video_id"]) for item in data], dtype=object), return_inverse=True)
        self._video_ids = [str(v) for v in uniq]
        vnum = vnum.astype(np.int64)
        order = np.argsort(vnum, kind="stable")
        rows = np.empty(len(vnum), dtype=np.int64)
        counts = np.bincount(vnum, minlength=len(self._video_ids))
        starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
        rows[order] = np.arange(len(vnum)) - np.repeat(starts, counts)
        if files:  # frames of a video file: the cache row is the decoded position
            idx = np.flatnonzero(np.isin(uniq, list(files))[vnum])
            rows[idx] = np.fromiter((data[int(i)]["frame_number"] for i in idx), dtype=np.int64, count=len(idx))
        self._vnum, self._rows = vnum, rows
        self._maps: dict[int, np.ndarray] = {}

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_maps"] = {}  # memory maps are reopened in the receiving process
        return state

    def _frame(self, index: int) -> torch.Tensor:
        v = int(self._vnum[index])
        arr = self._maps.get(v)
        if arr is None:
            arr = self._maps[v] = self.cache.open(self._video_ids[v])
        return torch.from_numpy(np.array(arr[self._rows[index]]))

    def _transform(self, index: int) -> Any:
        item = dict(self.data[index])
        item[self.image_key] = self._frame(index)
        return apply_transform(self.transform, item) if self.transform is not None else item
