"""Draw the report of an event JSON: one timeline per video over its probabilities, and a summary.

Reference: :func:`monai_vce.report.write_report`; needs matplotlib (``pip install monai-vce[report]``).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from monai_vce.events.probabilities import probability_files
from monai_vce.events.validation import load_events
from monai_vce.report.summary import write_report

from ._common import main_process

__all__ = ["report"]

logger = logging.getLogger(__name__)

PathLike = str | os.PathLike


def report(
    events_file: PathLike,
    report_dir: PathLike | None,
    probs_dir: PathLike | None = None,
    log: Callable[[str], Any] | None = None,
) -> Path | None:
    """Draw the timelines of ``events_file`` under ``report_dir`` (rank 0 only), in its recorded frame units.

    Probability files of videos not in the events (an earlier run on more videos) are not drawn: a warning says
    so and the report draws the events alone. Without matplotlib, one warning line and nothing drawn.

    Args:
        events_file: the event JSON (with its units sidecar, as :func:`~monai_vce.stages.decode` writes it).
        report_dir: the report folder; ``None`` draws nothing.
        probs_dir: the probability files decoded into ``events_file``, drawn behind the events.
        log: receives the summary line (default: this module's logger).

    Returns:
        ``report_dir``, or ``None`` when nothing was drawn.
    """
    if report_dir is None or not main_process():
        return None
    names = {str(v["video_id"]) for v in load_events(events_file)["videos"]}
    strays = [] if probs_dir is None else [p.name for v, p in probability_files(probs_dir).items() if v not in names]
    if strays:
        logger.warning(
            f"{probs_dir} holds probability files of videos not in this run ({', '.join(strays[:3])}"
            f"{' ...' if len(strays) > 3 else ''}): the report draws the events without probabilities"
        )
    try:
        write_report(events_file, report_dir, probs_dir=None if strays else probs_dir)
    except ImportError as e:  # matplotlib is an optional extra
        logger.warning(f"report not drawn ({e}); install monai-vce[report] for timelines")
        return None
    (log or logger.info)(f"drew the timelines of {len(names)} videos: {report_dir}")
    return Path(report_dir)
