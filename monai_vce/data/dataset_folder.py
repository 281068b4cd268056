"""Datalists of a dataset folder (the bundle's ``--dataset_dir``): a Galar training folder, a folder of videos, or a
datalist JSON file.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import cast

from monai_vce.data.galar import build_galar_datalist, build_ground_truth, build_inference_datalist, discover_videos
from monai_vce.events.probabilities import datalist_videos
from monai_vce.events.units import FrameUnits
from monai_vce.utils import natural_key, read_json_file, short_repr

__all__ = ["check_folder", "galar_datalist", "galar_ground_truth", "inference_datalist"]

PathLike = str | os.PathLike


def check_folder(path: PathLike, what: str = "dataset folder") -> str:
    """Return ``path`` as a string, or raise ``FileNotFoundError`` naming it and the config key to change."""
    if not Path(path).is_dir():
        config, example = (
            ("inference.json", "/data/galar_test") if what == "input folder" else ("train.json", "/data/galar")
        )
        raise FileNotFoundError(
            f"{what} {path} not found; pass the right one on the command line, e.g. --dataset_dir {example} "
            f"(or use the demo's: --config_file \"['bundle/configs/{config}','bundle/configs/demo.json']\")"
        )
    return str(path)


def galar_datalist(
    dataset_dir: PathLike,
    videos: Iterable[str] | None = None,
    check_images: bool | str = False,
    bad_frames: str = "error",
) -> list[dict]:
    """Labelled frame datalist of a Galar-layout folder (``frames/``, ``labels/``, optional ``metadata.csv``).

    Args:
        dataset_dir: the folder holding ``frames/<video_id>/*.PNG`` and ``labels/<video_id>.csv``.
        videos: video ids to keep (``None``: all with both frames and labels).
        check_images: check every frame before the run (``"header"`` or ``"decode"``, see
            :func:`monai_vce.data.build_galar_datalist`); ``False``: the loader finds bad frames when it reaches them.
        bad_frames: what a frame failing the check does: ``"error"`` (one line naming the file) or ``"skip"`` (left
            out, reported per video).
    """
    root = Path(check_folder(dataset_dir))
    meta = root / "metadata.csv"
    datalist = build_galar_datalist(
        root / "frames",
        root / "labels",
        metadata_csv=meta if meta.is_file() else None,
        videos=videos,
        check_images=check_images,
        bad_frames=bad_frames,
    )
    return cast(list[dict], datalist)


def galar_ground_truth(
    dataset_dir: PathLike, videos: Iterable[str] | None = None, frame_units: FrameUnits | str = FrameUnits.FRAME_INDEX
) -> dict:
    """The ground truth the challenge scores for videos of a Galar-layout folder: all rows of ``labels/*.csv``
    (:func:`monai_vce.data.build_ground_truth`), not only the rows whose frame image exists.

    Args:
        dataset_dir: the folder holding ``labels/<video_id>.csv``.
        videos: video ids to include (``None``: every CSV).
        frame_units: ``"frame_index"`` or ``"frame_number"``.
    """
    root = Path(check_folder(dataset_dir))
    return build_ground_truth(root / "labels", videos=videos, frame_units=frame_units)


def inference_datalist(
    dataset_dir: PathLike,
    videos: Iterable[str] | None = None,
    check_images: bool | str = False,
    bad_frames: str = "error",
) -> list[dict]:
    """Unlabelled frame datalist of a folder of videos (``<dir>/frames/<video_id>/`` or ``<dir>/<video_id>/``).

    The frame ids follow the folder: a video with a label CSV (``<dir>/labels/<video_id>.csv``, the Galar layout)
    takes its ``frame_index`` from the CSV's ``index`` column (the ground truth's units, as in training), so that
    inference on a labelled folder writes events in the units of its ground truth; frames without a label row
    are then left out, as :func:`monai_vce.data.build_galar_datalist` does. A video without one takes the number
    in the file name (:func:`monai_vce.data.build_inference_datalist`). The labels themselves are dropped.

    A datalist JSON file (a list of frame dicts, or ``{"testing": [...]}``) is also accepted in place of the
    folder (its frames are not checked in advance: the loader names a bad frame when it reaches it).

    Args:
        dataset_dir: the folder, or a datalist JSON file.
        videos: video ids to keep (``None``: all).
        check_images: check every frame of the folder before the run (see :func:`galar_datalist`).
        bad_frames: ``"error"`` or ``"skip"`` for a frame failing the check (see :func:`galar_datalist`).
    """
    path = Path(dataset_dir)
    if path.is_file() and path.suffix.lower() == ".json":
        data = read_json_file(path, what="datalist file")  # strict: a repeated key is an error
        if isinstance(data, Mapping):
            data = data.get("testing", data.get("validation", data.get("data")))
        if not isinstance(data, list):
            raise ValueError(f"datalist file {path}: expected a list of frame dicts (or {{'testing': [...]}})")
        for i, d in enumerate(data):
            if not isinstance(d, Mapping) or not isinstance(d.get("image"), str) or not d["image"]:
                raise ValueError(
                    f"datalist file {path}: item {i} must be a frame dict with an 'image' path, got {short_repr(d, 80)}"
                )
        # every item's video id and frame ids, one line naming the item when one is missing or out of range
        datalist_videos(data, source=f"datalist file {path}")
        keep = None if videos is None else {str(v) for v in videos}
        return [dict(d) for d in data if keep is None or str(d.get("video_id")) in keep]
    root = Path(check_folder(path, "input folder"))
    frames = root / "frames" if (root / "frames").is_dir() else root
    meta = root / "metadata.csv"
    metadata = meta if meta.is_file() else None
    labels = root / "labels"
    csvs = {p.stem for p in labels.glob("*.csv")} if labels.is_dir() and frames != root else set()
    if not csvs:
        return build_inference_datalist(
            frames, videos=videos, metadata_csv=metadata, check_images=check_images, bad_frames=bad_frames
        )
    found = list(videos) if videos is not None else list(discover_videos(frames))
    labelled = [str(v) for v in found if str(v) in csvs]
    other = [str(v) for v in found if str(v) not in csvs]
    items = (
        build_galar_datalist(
            frames, labels, metadata_csv=metadata, videos=labelled, check_images=check_images, bad_frames=bad_frames
        )
        if labelled
        else []
    )
    out = [{k: v for k, v in d.items() if k != "label"} for d in cast(list[dict], items)]
    if other:
        out += build_inference_datalist(
            frames, videos=other, metadata_csv=metadata, check_images=check_images, bad_frames=bad_frames
        )
    order = {v: i for i, v in enumerate(sorted(labelled + other, key=natural_key))}
    return sorted(out, key=lambda d: order[str(d["video_id"])])
