"""Command line ``review``: the static review site of an event JSON (:mod:`monai_vce.review.site`); prints one JSON
line with the path of its ``index.html``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from monai_vce.cli import command_main
from monai_vce.review.exams import UNITS
from monai_vce.review.site import write_review_site

__all__ = ["add_parser", "main"]


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``review`` command to ``subparsers``; returns its parser."""
    p = subparsers.add_parser(
        "review",
        description="Write a static review site of an event JSON: timelines, events with thumbnails, a frame "
        "viewer, review actions and export of the corrected events (JSON) and labels (Galar CSV).",
    )
    p.add_argument("--events", required=True, help="event JSON to review (challenge format, most confident first)")
    p.add_argument(
        "--frames-dir", required=True, help="frames root: video folders of frame_<number>.png and/or video files"
    )
    p.add_argument("--out", required=True, help="site folder (created; open its index.html in a browser)")
    p.add_argument("--probs-dir", default=None, help="folder of per-video probability files <video_id>.npz")
    p.add_argument("--gt", default=None, help="ground-truth event JSON, drawn in the timelines")
    p.add_argument(
        "--frame-units",
        default=None,
        choices=UNITS,
        help="frame units of the event files: frame_index (the labels CSV's index) or frame_number; default: the "
        "units recorded beside the event files (<name>.meta.json), else frame_index. A file recorded in other units "
        "is refused (the events are converted when --probs-dir is given)",
    )
    p.add_argument(
        "--frame-rate",
        type=float,
        default=None,
        help="frames per second of every exam (default: as inference recorded)",
    )
    p.add_argument("--videos", nargs="+", default=None, help="only these video ids, in this order")
    p.add_argument("--strip-frames", type=int, default=1500, help="timeline thumbnails per exam (default 1500)")
    p.add_argument(
        "--max-event-thumbnails", type=int, default=1000, help="events per exam with thumbnails (default 1000)"
    )
    p.add_argument(
        "--max-full-frames",
        type=int,
        default=3000,
        help="full-size frames stored per exam stored as a video file (default 3000)",
    )
    p.add_argument("--workers", type=int, default=None, help="threads writing thumbnails (default: one per core)")
    p.set_defaults(run=run)
    return p


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Write the review site of ``args``; returns ``{"index": <absolute path of its index.html>}``."""
    index = write_review_site(
        args.events,
        args.frames_dir,
        args.out,
        probs_dir=args.probs_dir,
        gt=args.gt,
        frame_units=args.frame_units,
        frame_rate=args.frame_rate,
        videos=args.videos,
        strip_frames=args.strip_frames,
        max_event_thumbnails=args.max_event_thumbnails,
        max_full_frames=args.max_full_frames,
        num_workers=args.workers,
    )
    return {"index": str(Path(index).resolve())}


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m monai_vce.review``, the same as ``python -m monai_vce review``; returns the exit code."""
    return command_main(add_parser, argv, "python -m monai_vce.review")


if __name__ == "__main__":
    sys.exit(main())
