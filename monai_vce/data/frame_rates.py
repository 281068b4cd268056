"""The frame rate of each video of a datalist: from its items, the dataset's ``metadata.csv``, the video file, or a
setting, in that order.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from monai_vce.data.galar import _canonical_id, read_frame_rates
from monai_vce.data.video import is_video_file, probe_video
from monai_vce.events.probabilities import check_frame_rate
from monai_vce.utils import short_repr

__all__ = ["video_frame_rates"]

PathLike = str | os.PathLike


def video_frame_rates(
    datalist: Sequence[Mapping[str, Any]],
    dataset_dir: PathLike | None = None,
    frame_rate: float | None = None,
) -> dict[str, float | None]:
    """Frames per second of ``frame_number`` of each video of a frame datalist.

    A video's rate is the first known of: its items' ``frame_rate`` key (one value per video), the frame rate
    column of ``<dataset_dir>/metadata.csv`` (:func:`monai_vce.data.read_frame_rates`), the rate its video file
    records (video-file items), ``frame_rate``. ``None`` when none is known: time is then counted in rows.

    Args:
        datalist: frame dicts with ``video_id`` (and ``image``).
        dataset_dir: the dataset folder whose ``metadata.csv`` may carry a frame rate column; ``None``: none.
        frame_rate: the rate of videos that give none (the bundle's ``frame_rate`` setting), ``None``: unknown.

    Returns:
        ``{video_id: frames per second or None}``, videos in datalist order.

    Raises:
        ValueError: a rate that is not a number in (0, 10000], or two rates for one video; the message names the
            video and where the rate came from.
    """
    default = check_frame_rate(frame_rate, "frame_rate setting")
    meta = Path(dataset_dir) / "metadata.csv" if dataset_dir is not None and Path(dataset_dir).is_dir() else None
    listed = read_frame_rates(meta) if meta is not None and meta.is_file() else {}
    listed.update({_canonical_id(k): v for k, v in list(listed.items()) if _canonical_id(k) not in listed})
    items: dict[str, float | None] = {}
    files: dict[str, str] = {}
    for i, d in enumerate(datalist):
        vid = str(d.get("video_id"))
        if "frame_rate" in d and d["frame_rate"] is not None:
            rate = check_frame_rate(d["frame_rate"], f"datalist item {i} (video {short_repr(vid, 40)})")
            if items.get(vid) not in (None, rate):
                raise ValueError(
                    f"datalist item {i}: video {short_repr(vid, 40)} has frame_rate {rate:g} after "
                    f"{items[vid]:g}; one rate per video"
                )
            items[vid] = rate
        else:
            items.setdefault(vid, None)
        image = d.get("image")
        if vid not in files and isinstance(image, str) and is_video_file(image):
            files[vid] = image
    out: dict[str, float | None] = {}
    for vid, rate in items.items():
        if rate is None:
            rate = listed.get(vid, listed.get(_canonical_id(vid)))
        if rate is None and vid in files:
            rate = probe_video(files[vid]).fps
        out[vid] = rate if rate is not None else default
    return out
