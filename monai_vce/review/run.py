"""The review site of a bundle run, written next to its event JSON (inference and evaluation configs)."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from monai_vce.events.metadata import events_in_common_units
from monai_vce.metrics import load_events
from monai_vce.review.site import write_review_site

__all__ = ["write_run_review"]

logger = logging.getLogger(__name__)


def write_run_review(
    review_dir: str | os.PathLike | None,
    events_file: str | os.PathLike,
    datalist: Sequence[Mapping[str, Any]],
    probs_dir: str | os.PathLike | None = None,
    gt: str | os.PathLike | Mapping[str, Any] | None = None,
    frame_rate: float | None = None,
    **kwargs: Any,
) -> Path | None:
    """Write the review site of a run's event JSON (rank 0 only; nothing when ``review_dir`` is ``None``).

    The bundle configs call this after the event JSON is written: ``review_dir`` is ``<output_dir>/review``
    when their ``review`` flag is on (the evaluation's default) and ``None`` otherwise (inference's default, since
    a large batch of exams is often not reviewed at once). The frame units are those recorded beside the event
    files (:func:`~monai_vce.events.metadata.events_in_common_units`).

    Args:
        review_dir: the site folder, or ``None`` to write nothing.
        events_file: the run's event JSON.
        datalist: the run's frame datalist (every video of the JSON; frame images or video files).
        probs_dir: the run's per-video probability files.
        gt: ground-truth event JSON (path or object), e.g. the evaluation's ``ground_truth.json``.
        frame_rate: frame rate of every exam (``None``: each probability file's, else a video file's).
        kwargs: more :func:`monai_vce.review.write_review_site` arguments.

    Returns:
        The site's ``index.html``, or ``None`` when nothing was written.
    """
    if review_dir is None:
        return None
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized() and dist.get_rank() != 0:
            return None
    except ImportError:  # pragma: no cover
        pass
    # the units recorded beside the run's event files (a run always writes them); the site gets the checked object
    pred, units = events_in_common_units(events_file, load_events(events_file), gt, None, probs_dir, str(events_file))
    keep = {str(v["video_id"]) for v in pred["videos"]}
    data = [d for d in datalist if str(d["video_id"]) in keep]
    index = write_review_site(
        pred, data, review_dir, probs_dir=probs_dir, gt=gt, frame_units=units, frame_rate=frame_rate, **kwargs
    )
    logger.info(f"review site of {len(keep)} videos: {index}")
    print(f"review site: {Path(index).resolve()}", flush=True)
    return index
