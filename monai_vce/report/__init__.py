"""Reports of a prediction: per-video timelines and an evaluation summary (``python -m monai_vce.report``).
Drawing needs matplotlib (``pip install monai-vce[report]``).
"""

from __future__ import annotations

from .evaluation import datalist_ground_truth, evaluation_report
from .summary import (
    LABEL_ABBREVIATIONS,
    PRESENCE_CODES,
    PRESENCE_COLORS,
    draw_summary,
    per_label_ap,
    presence_matrix,
    present_labels,
    summary_markdown,
    write_report,
)
from .timeline import (
    SECTION_COLORS,
    UNITS,
    draw_timeline,
    figure_to_png,
    label_cuts,
    label_intervals,
    max_pool_trace,
    require_matplotlib,
)

__all__ = [
    "write_report",
    "evaluation_report",
    "datalist_ground_truth",
    "draw_timeline",
    "draw_summary",
    "summary_markdown",
    "presence_matrix",
    "present_labels",
    "per_label_ap",
    "label_intervals",
    "label_cuts",
    "max_pool_trace",
    "figure_to_png",
    "require_matplotlib",
    "UNITS",
    "SECTION_COLORS",
    "PRESENCE_CODES",
    "PRESENCE_COLORS",
    "LABEL_ABBREVIATIONS",
]
