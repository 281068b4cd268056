"""Reports of a prediction: per-video timelines and an evaluation summary.

``python -m monai_vce.report --pred PRED.json [--gt GT.json] [--probs DIR] --out DIR`` or
:func:`write_report` draws one timeline per video (a lane per label with predicted events, ground truth and
frame probabilities) and a summary page (overall and per-video mAP, per-class AP, presence decisions).
Scores come from :func:`monai_vce.metrics.temporal_map`. Drawing needs matplotlib, an optional extra
(``pip install monai-vce[report]``), imported only when a figure is drawn.
"""

from __future__ import annotations

from .evaluation import datalist_ground_truth, evaluation_report
from .summary import (
    LABEL_ABBREVIATIONS,
    PRESENCE_CODES,
    PRESENCE_COLORS,
    draw_summary,
    load_probabilities,
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
    "load_probabilities",
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
