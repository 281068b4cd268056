"""Write the review site of an event JSON: the exams' frames, the predicted and true events, the probabilities.

Reference: :func:`monai_vce.review.write_run_review`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from monai_vce.review.run import write_run_review

from ._common import main_process

__all__ = ["review"]

PathLike = str | os.PathLike


def review(
    review_dir: PathLike | None,
    events_file: PathLike,
    datalist: Sequence[Mapping[str, Any]],
    probs_dir: PathLike | None = None,
    ground_truth: PathLike | Mapping[str, Any] | None = None,
    **kwargs: Any,
) -> Path | None:
    """Write the review site of ``events_file`` under ``review_dir`` (rank 0 only), in its recorded frame units.

    Args:
        review_dir: the site folder; ``None`` writes nothing.
        events_file: the event JSON.
        datalist: the run's frame datalist (frame images or video files of every video of the JSON).
        probs_dir: the probability files decoded into ``events_file``.
        ground_truth: ground-truth event JSON (path or object).
        kwargs: more :func:`monai_vce.review.write_review_site` arguments (e.g. ``frame_rate``).

    Returns:
        The site's ``index.html``, or ``None`` when nothing was written.

    Raises:
        ValueError: the event files record different frame units and ``probs_dir`` is not given to convert.
    """
    if review_dir is None or not main_process():
        return None
    return write_run_review(review_dir, events_file, datalist, probs_dir=probs_dir, gt=ground_truth, **kwargs)
