"""Refine a folder of per-video probability files with a temporal refiner into a folder of the same format.

Reference: :func:`monai_vce.temporal.refine_folder` (manifest, kept files) and :class:`monai_vce.temporal.TemporalRefiner`.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from monai_vce.temporal.files import refine_folder

from ._common import main_process, require_files, stage_videos

__all__ = ["refine"]

logger = logging.getLogger(__name__)

PathLike = str | os.PathLike


def refine(
    probs_dir: PathLike,
    refined_dir: PathLike,
    refiner: Any,
    source: str = "",
    videos: Iterable[str] | None = None,
    log: Callable[[str], Any] | None = None,
) -> dict[str, Any]:
    """Refine every video of ``probs_dir`` into ``refined_dir/<video_id>.npz`` (rank 0 only), resumable.

    A refined file of the same ``source`` and frames is kept; only files of the folder's manifest are replaced.

    Args:
        probs_dir: folder of the frame model's probability files.
        refined_dir: folder of the refined files (not ``probs_dir``).
        refiner: a :class:`~monai_vce.temporal.TemporalRefiner` or :class:`~monai_vce.temporal.RefinerEnsemble`.
        source: recorded in every refined file, e.g. ``"<frame model source> | <refiner fingerprint>"``.
        videos: the videos to refine, in order; ``None``: every file of ``probs_dir``.
        log: receives one line per video and the summary (default: this module's logger).

    Returns:
        ``{"written": [...], "kept": [...], "trained_videos": [...]}`` (empty lists on other ranks).

    Raises:
        FileNotFoundError: a video without a probability file (one line naming them).
        ValueError: ``refined_dir`` is ``probs_dir``, a file lacks the features the refiner reads, or a file in
            ``refined_dir`` the refinement did not write (naming it).
    """
    result: dict[str, Any] = {"written": [], "kept": [], "trained_videos": []}
    if not main_process():
        return result
    say = log or logger.info
    if Path(refined_dir).resolve() == Path(probs_dir).resolve():
        raise ValueError(
            f"refined_dir {refined_dir} is the folder of the frame model's probability files; choose another"
        )
    ids = stage_videos(probs_dir, videos)
    require_files(probs_dir, ids)
    if not ids:
        return result
    result = refine_folder(refiner, probs_dir, refined_dir, source=source, videos=ids, log=say)
    if result["kept"]:
        say(f"kept {len(result['kept'])} video(s) already refined by the same refiner")
    if result["trained_videos"]:
        logger.warning(
            f"{len(result['trained_videos'])} video(s) were among the refiner's training videos "
            f"(e.g. {result['trained_videos'][0]!r}): their refined probabilities are over-confident"
        )
    return result
