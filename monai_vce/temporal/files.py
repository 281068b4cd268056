"""Folders of per-video probability files in and out of the temporal refiner.

The refiner reads and writes the project's per-video format (``<video_id>.npz`` with ``probs`` float32
``(T, 17)``, ``frame_index``, ``frame_number``, ``labels``, optionally ``features`` ``(T, D)``), through the
same reader and writer as inference, so refined files are drop-in replacements for the frame model's.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from monai_vce.events.probabilities import (
    VideoArrays,
    load_video_probs,
    probability_file,
    save_video_probs,
)
from monai_vce.events.probabilities import probability_files as _probability_files
from monai_vce.events.validation import load_events

from .refiner import TemporalRefiner

__all__ = ["UNITS", "probability_files", "load_features", "read_videos", "refine_folder"]

#: Frame-id units of ground-truth events: the ``frame_index`` or ``frame_number`` array of the files.
UNITS: tuple[str, ...] = ("index", "frame_number")

PathLike = str | os.PathLike


def probability_files(folder: PathLike) -> dict[str, Path]:
    """``{video_id: path}`` of the ``<video_id>.npz`` files of a folder, in sorted order.

    Raises:
        FileNotFoundError: the folder is missing.
        ValueError: it holds no ``.npz`` file.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"probability folder {folder} not found")
    files = dict(sorted(_probability_files(folder).items()))  # file names made by video_file_name -> video ids
    if not files:
        raise ValueError(f"probability folder {folder} holds no <video_id>.npz file")
    return files


def load_features(path: PathLike) -> np.ndarray | None:
    """The ``(T, D)`` ``features`` array of a per-video file, or ``None`` when the file has none.

    Raises:
        ValueError: the file is unreadable or its features are not a 2-D array.
    """
    # through the one reader of probability files: its checks (array sizes bounded before reading, shapes, types)
    return load_video_probs(path, features=True).features


def _frame_ids(video: VideoArrays, units: str) -> np.ndarray:
    if units not in UNITS:
        raise ValueError(f"units must be one of {UNITS}, got {units!r}")
    return video.frame_index if units == "index" else video.frame_number


def read_videos(
    probs_dir: PathLike,
    gt: PathLike | Mapping[str, Any] | None = None,
    units: str = "index",
    features: bool = False,
) -> dict[str, tuple]:
    """Read a folder of per-video files as the tuples :func:`~monai_vce.temporal.fit_refiner` takes.

    Args:
        probs_dir: folder of ``<video_id>.npz`` files.
        gt: ground-truth event JSON (path or object); every video of the folder must be in it. ``None`` reads
            no events (an empty list per video).
        units: which frame ids of the files the events count in: ``"index"`` (Galar's ground truth) or
            ``"frame_number"``.
        features: also read each file's ``features`` (an error when a file has none).

    Returns:
        ``{video_id: (probs, frame_ids, gt_events)}``, or ``(probs, frame_ids, gt_events, features)`` with
        ``features=True``.

    Raises:
        FileNotFoundError: a missing folder or file.
        ValueError: a malformed file, a video without ground truth, or a file without features (one line naming
            the file or video).
    """
    files = probability_files(probs_dir)
    events: dict[str, list] = {}
    if gt is not None:
        gt_obj = load_events(gt) if not isinstance(gt, Mapping) else gt
        for v in gt_obj.get("videos", []):
            events.setdefault(str(v["video_id"]), []).extend(v["events"])
        missing = [vid for vid in files if vid not in events]
        if missing:
            name = gt if not isinstance(gt, Mapping) else "the ground truth"
            raise ValueError(
                f"{name} has no video {missing[0]!r} (of {probability_file(probs_dir, missing[0])})"
                + (f" nor {len(missing) - 1} more" if len(missing) > 1 else "")
            )
    out: dict[str, tuple] = {}
    for vid, path in files.items():
        video = load_video_probs(path)
        item: tuple = (video.probs, _frame_ids(video, units), events.get(vid, []))
        if features:
            feats = load_features(path)
            if feats is None:
                raise ValueError(f"probability file {path} has no 'features' array (needed by the refiner's inputs)")
            if feats.shape[0] != len(video):
                raise ValueError(f"probability file {path}: {feats.shape[0]} feature rows for {len(video)} frames")
            item = (*item, feats)
        out[vid] = item
    return out


def _refined_from(target: Path, video: VideoArrays, source: str) -> bool:
    """Whether ``target`` is the refined file of ``video`` by ``source``: the same frames (ids, not just their count:
    a video re-inferred after its frames were renumbered is refined again)."""
    if not target.is_file():
        return False
    try:
        old = load_video_probs(target, video_id=video.video_id)
    except (OSError, ValueError):
        return False
    return (
        old.source == source
        and np.array_equal(old.frame_index, video.frame_index)
        and np.array_equal(old.frame_number, video.frame_number)
    )


def refine_folder(
    refiner: TemporalRefiner,
    probs_dir: PathLike,
    out_dir: PathLike,
    source: str = "",
    videos: Sequence[str] | None = None,
    chunk_size: int | None = None,
    log: Callable[[str], Any] | None = None,
) -> dict[str, Any]:
    """Refine every per-video file of a folder into ``out_dir/<video_id>.npz`` (same format, refined ``probs``).

    A file already in ``out_dir`` with the same ``source`` and frame count is complete (files are written
    atomically) and is kept, so an interrupted run resumes where it stopped.

    Args:
        refiner: the refiner.
        probs_dir: folder of the frame model's ``<video_id>.npz`` files.
        out_dir: output folder (created when missing; may not be ``probs_dir``).
        source: recorded as each output's ``source`` (e.g. :meth:`TemporalRefiner.fingerprint` of the model file).
        videos: refine only these video ids (default all files of the folder).
        chunk_size: frames per inference chunk (default the refiner's).
        log: optional callable receiving one line per video.

    Returns:
        ``{"written": [...], "kept": [...], "trained_videos": [...]}`` (``trained_videos``: refined videos the
        refiner was fitted on; their refined outputs are over-confident and must not be used to tune a decoder).

    Raises:
        FileNotFoundError, ValueError: a missing or malformed file (naming it).
    """
    files = probability_files(probs_dir)
    out_dir = Path(out_dir)
    if out_dir.resolve() == Path(probs_dir).resolve():
        raise ValueError(f"output folder {out_dir} is the input folder; refined files would replace the inputs")
    if videos is not None:
        unknown = [v for v in videos if v not in files]
        if unknown:
            raise FileNotFoundError(f"no probability file {probability_file(probs_dir, unknown[0])}")
        files = {v: files[v] for v in videos}
    trained = set(refiner.trained_videos)
    written, kept = [], []
    needs_features = refiner.inputs != "probs"
    for vid, path in files.items():
        target = probability_file(out_dir, vid)
        video = load_video_probs(path)
        if _refined_from(target, video, source):
            kept.append(vid)
            continue
        feats = load_features(path) if needs_features else None
        if needs_features and feats is None:
            raise ValueError(f"probability file {path} has no 'features' array (the refiner's inputs need it)")
        try:
            refined = refiner.refine(video.probs, feats, chunk_size=chunk_size)
        except ValueError as e:
            raise ValueError(f"probability file {path}: {e}") from None
        save_video_probs(target, VideoArrays(vid, refined, video.frame_index, video.frame_number), source=source)
        written.append(vid)
        if log:
            log(f"{vid}: {len(video)} frames refined")
    return {"written": written, "kept": kept, "trained_videos": [v for v in files if v in trained]}
