"""Folders of per-video probability files in and out of the temporal refiner; refined files are drop-in
replacements for the frame model's.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from monai_vce.events.ground_truth import with_ground_truth
from monai_vce.events.probabilities import (
    Video,
    load_video_probs,
    probability_file,
    probability_files,
    save_video_probs,
)
from monai_vce.events.units import FrameUnits, as_frame_units
from monai_vce.events.validation import load_events
from monai_vce.utils import atomic_write_json, read_json_file, safe_text

from .refiner import RefinerEnsemble, TemporalRefiner

__all__ = ["video_files", "read_videos", "refine_folder"]

PathLike = str | os.PathLike

#: The refined folder's record of the files the refinement wrote there (only those are ever replaced).
MANIFEST = ".monai_vce_manifest.json"


def video_files(folder: PathLike) -> dict[str, Path]:
    """``{video_id: path}`` of the probability files of a folder (:func:`monai_vce.events.probability_files`),
    which must exist and hold at least one.

    Raises:
        FileNotFoundError: the folder is missing.
        ValueError: it holds no ``<video_id>.npz`` file.
    """
    if not Path(folder).is_dir():
        raise FileNotFoundError(f"probability folder {folder} not found")
    files = probability_files(folder)
    if not files:
        raise ValueError(f"probability folder {folder} holds no <video_id>.npz file")
    return files


def _with_features(path: Path, needed: bool) -> Video:
    video = load_video_probs(path, features=needed)
    if needed and video.features is None:
        raise ValueError(f"probability file {path} has no 'features' array (the refiner's inputs need it)")
    return video


def read_videos(
    probs_dir: PathLike,
    gt: PathLike | Mapping[str, Any] | None = None,
    frame_units: FrameUnits | str = FrameUnits.FRAME_INDEX,
    features: bool = False,
) -> dict[str, Video]:
    """Read a folder of per-video files as the videos :func:`~monai_vce.temporal.fit_refiner` takes.

    Args:
        probs_dir: folder of ``<video_id>.npz`` files.
        gt: ground-truth event JSON (path or object); every video of the folder must be in it. ``None`` reads
            no events (an empty list per video).
        frame_units: the frame ids the events count in (``"frame_index"``, Galar's ground truth, or
            ``"frame_number"``).
        features: also read each file's ``features`` (an error when a file has none).

    Returns:
        ``{video_id: Video}`` with ground-truth ``events`` in ``frame_units`` and the ``targets`` they mark
        (:func:`~monai_vce.events.with_ground_truth`), and ``features`` with ``features=True``.

    Raises:
        FileNotFoundError: a missing folder or file.
        ValueError: a malformed file, a video without ground truth, or a file without features (one line naming
            the file or video).
    """
    units = as_frame_units(frame_units)
    files = video_files(probs_dir)
    events: dict[str, list] = {}
    if gt is not None:
        gt_obj = load_events(gt) if not isinstance(gt, Mapping) else gt
        for v in gt_obj.get("videos", []):
            events.setdefault(str(v["video_id"]), []).extend(v["events"])
        missing = [vid for vid in files if vid not in events]
        if missing:
            name = gt if not isinstance(gt, Mapping) else "the ground truth"
            raise ValueError(
                f"{name} has no video {missing[0]!r} (of {files[missing[0]]})"
                + (f" nor {len(missing) - 1} more" if len(missing) > 1 else "")
            )
    return {
        vid: with_ground_truth(_with_features(path, features), events.get(vid, []), units)
        for vid, path in files.items()
    }


def _refined_from(target: Path, video: Video, source: str) -> bool:
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


def _refined_manifest(out_dir: Path) -> set[str]:
    """The file names a refinement recorded in ``out_dir`` (empty when it holds no manifest)."""
    path = out_dir / MANIFEST
    if not path.exists():
        return set()
    where = f"refined folder manifest {safe_text(path)}"
    data = read_json_file(path, max_bytes=64 * 1024**2, what="refined folder manifest")
    if not isinstance(data, dict) or data.get("writer") != "monai_vce.temporal.refine_folder":
        raise ValueError(f"{where} was not written by the refinement; remove it or choose another folder")
    files = data.get("files")
    if not isinstance(files, list) or not all(
        isinstance(f, str) and f.endswith(".npz") and Path(f).name == f and f[:1] != "." for f in files
    ):
        raise ValueError(f"{where} names a file outside its folder or not a probability file")
    return set(files)


def refine_folder(
    refiner: TemporalRefiner | RefinerEnsemble,
    probs_dir: PathLike,
    out_dir: PathLike,
    source: str = "",
    videos: Sequence[str] | None = None,
    chunk_size: int | None = None,
    log: Callable[[str], Any] | None = None,
) -> dict[str, Any]:
    """Refine every per-video file of a folder into ``out_dir/<video_id>.npz`` (same format, refined ``probs``).

    A file already in ``out_dir`` with the same ``source`` and frame ids is complete (files are written
    atomically) and is kept, so an interrupted run resumes where it stopped. Only files recorded in the folder's
    manifest (``.monai_vce_manifest.json``) are ever replaced.

    Args:
        refiner: the refiner (or a :class:`RefinerEnsemble`).
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
        FileNotFoundError, ValueError: a missing or malformed file (naming it), or a file in ``out_dir`` that
            the refinement did not write.
    """
    files = video_files(probs_dir)
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
    own = _refined_manifest(out_dir)
    for vid, path in files.items():
        target = probability_file(out_dir, vid)
        if (target.exists() or target.is_symlink()) and target.name not in own:
            raise ValueError(
                f"refined folder {safe_text(out_dir)} holds {safe_text(target.name)}, which the refinement did not "
                f"write (not in its manifest {MANIFEST}); it is left as it is: move it away or choose another folder"
            )
        video = _with_features(path, refiner.inputs != "probs")
        if _refined_from(target, video, source):
            kept.append(vid)
            continue
        if target.name not in own:  # listed before it is written, so a killed run's file is known as ours
            own.add(target.name)
            atomic_write_json(out_dir / MANIFEST, {"writer": "monai_vce.temporal.refine_folder", "files": sorted(own)})
        try:
            # a refiner that records its fitted row rate resamples a video recorded at another one
            timed = video.rows_per_second is not None and getattr(refiner, "rows_per_second", None) is not None
            rate = {"rows_per_second": video.rows_per_second} if timed else {}
            refined = refiner.refine(video.probs, video.features, chunk_size=chunk_size, **rate)
        except ValueError as e:
            raise ValueError(f"probability file {path}: {e}") from None
        save_video_probs(target, video.replace(probs=refined, features=None, inferred=None), source=source)
        written.append(vid)
        if log:
            log(f"{vid}: {len(video)} frames refined")
    return {"written": written, "kept": kept, "trained_videos": [v for v in files if v in trained]}
