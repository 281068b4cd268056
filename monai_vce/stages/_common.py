"""Shared checks of the stages: the main process, the videos of a stage and their probability files."""

from __future__ import annotations

import os
from collections.abc import Iterable

from monai_vce.events.probabilities import check_video_ids, probability_file, probability_files

PathLike = str | os.PathLike


def main_process() -> bool:
    """Whether this process writes the stages' files: rank 0 of a distributed run, or a single process."""
    try:
        import torch.distributed as dist
    except ImportError:  # pragma: no cover
        return True
    return not (dist.is_available() and dist.is_initialized() and dist.get_rank() != 0)


def stage_videos(probs_dir: PathLike, videos: Iterable[str] | None) -> list[str]:
    """``videos`` (checked ids, in order) or every ``<video_id>.npz`` of ``probs_dir`` in natural order."""
    if videos is not None:
        return check_video_ids(videos, "the stage's videos")
    return list(probability_files(probs_dir))


def require_files(probs_dir: PathLike, ids: Iterable[str]) -> None:
    """Refuse, in one line, videos without a probability file in ``probs_dir``.

    Raises:
        FileNotFoundError: naming up to 10 videos and the folder.
    """
    missing = [v for v in ids if not probability_file(probs_dir, v).is_file()]
    if missing:
        raise FileNotFoundError(
            f"no probability file for video(s) {', '.join(missing[:10])}{' ...' if len(missing) > 10 else ''} "
            f"in {probs_dir}: run inference on them first"
        )
