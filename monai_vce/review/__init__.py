"""The reader's review site: look at the events found, jump to the frames, accept, reject or correct them, and
export the corrections as event JSON and Galar label CSVs.

``python -m monai_vce.review --pred EVENTS.json --frames FRAMES_DIR [--probs PROBS_DIR] [--gt GT.json] --out DIR``
or :func:`write_review_site` writes a static site (plain HTML, CSS and JavaScript; it opens from disk, loads
nothing from the network). The bundle writes one next to its event JSON (:func:`write_run_review`).
"""

from __future__ import annotations

from .exams import UNITS, Exam, event_rows, frames_by_video, load_exam, peak_row
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
    "Exam",
    "load_exam",
    "frames_by_video",
    "event_rows",
    "peak_row",
    "ImageJob",
    "render_jobs",
    "jpeg_bytes",
]
