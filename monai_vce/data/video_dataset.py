"""A MONAI ``Dataset`` serving the frames of exams stored as video files from the frame cache."""

from __future__ import annotations

import os
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from monai.data import Dataset
from monai.transforms import apply_transform
from monai.utils import ImageMetaKey

from monai_vce.data.frame_cache import FrameCache
from monai_vce.data.video import ensure_video_entries, is_video_file

__all__ = ["VideoFrameDataset"]

PathLike = str | os.PathLike


class VideoFrameDataset(Dataset):
    """A MONAI ``Dataset`` of frame dicts that serves the frames of video files from the frame cache.

    Items whose ``image`` is a video file get the decoded, resized ``uint8`` frame ``(3, S, S)`` at their
    ``frame_number`` (the decoded position) from the video's :class:`~monai_vce.data.FrameCache` entry; the
    other items (frame images) pass through unchanged, for the ``transform`` to decode as usual
    (:class:`~monai_vce.data.LoadVCEFramed` only resizes a frame that is already decoded). Missing or stale
    entries are built on first use (``len(dataset)``, see :attr:`videos`), not at construction, so parsing a
    bundle config reads no data: each video decoded once, sequentially (:func:`build_video_entries`).
    A datalist without video files costs nothing beyond one pass over its items.

    Disk use of the cache: ``T * 3 * S * S`` bytes per video (150 KiB per frame at 224 px); put ``cache_dir`` on
    a scratch disk for long exams, and delete it when the run is over.

    Args:
        data: datalist of frame dicts (``image``, ``video_id``, ``frame_number``, ...).
        transform: transforms applied to each item (the usual frame pipeline).
        cache_dir: cache root folder of the decoded video frames.
        image_size: side ``S`` of the cached frames (the network's input size avoids a second resize).
        image_key: key of the frame paths.
        num_workers: videos decoded at the same time while building.
        progress: progress bar while building (on a terminal).
    """

    def __init__(
        self,
        data: Sequence[Mapping[Hashable, Any]],
        transform: Callable | None = None,
        cache_dir: PathLike = "video_frames",
        image_size: int = 224,
        image_key: str = "image",
        num_workers: int = 0,
        progress: bool = True,
    ) -> None:

        super().__init__(data=data, transform=transform)
        self.image_key = image_key
        self.cache = FrameCache(cache_dir, image_size=image_size)
        self.num_workers = num_workers
        self.progress = progress
        self._videos: dict[str, str] | None = None
        self._maps: dict[str, np.ndarray] = {}

    @property
    def videos(self) -> dict[str, str]:
        """``{video_id: video file}`` of the video files in the datalist, their cache entries built on first use.

        First use is ``len(dataset)`` (every loader and engine asks it before the loader's workers start), so building
        the dataset (parsing a bundle config) reads no data, and the entries are built once, in the main process.
        """
        if self._videos is None:
            self._videos = ensure_video_entries(
                self.cache, self.data, self.image_key, num_workers=self.num_workers, progress=self.progress
            )
        return self._videos

    def __len__(self) -> int:
        self.videos  # noqa: B018  (builds the cache entries before any worker starts)
        return super().__len__()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_maps"] = {}  # memory maps are reopened in each worker process
        return state

    def _transform(self, index: int) -> Any:
        item = self.data[index]
        image = item.get(self.image_key)
        if isinstance(image, (str, os.PathLike)) and is_video_file(image):
            vid = str(item["video_id"])
            arr = self._maps.get(vid)
            if arr is None:
                arr = self._maps[vid] = self.cache.open(vid)
            item = dict(item)
            item[self.image_key] = torch.from_numpy(np.array(arr[int(item["frame_number"])]))
            # one name per frame for MONAI's savers (ClassificationSaver), as LoadVCEFramed gives a frame file
            item.setdefault(ImageMetaKey.FILENAME_OR_OBJ, f"{os.fspath(image)}#{int(item['frame_number'])}")
        return apply_transform(self.transform, item) if self.transform is not None else item
