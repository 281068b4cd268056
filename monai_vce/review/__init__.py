"""The reader's review site: a static site to review, correct and export events as event JSON and Galar label
CSVs (``python -m monai_vce.review``).
"""

from __future__ import annotations

from .exams import UNITS, ExamFrames, event_rows, frames_by_video, has_probs, load_exam, peak_row
from .run import write_run_review
from .site import SECTION_COLORS, SITE_FORMAT_VERSION, exam_data, exam_file_name, js_data, write_review_site
from .thumbnails import ImageJob, jpeg_bytes, render_jobs

__all__ = [
    "write_review_site",
    "write_run_review",
    "exam_data",
    "exam_file_name",
    "js_data",
    "SITE_FORMAT_VERSION",
    "SECTION_COLORS",
    "UNITS",
    "ExamFrames",
    "has_probs",
    "load_exam",
    "frames_by_video",
    "event_rows",
    "peak_row",
    "ImageJob",
    "render_jobs",
    "jpeg_bytes",
]
