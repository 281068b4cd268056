"""Command line: ``python -m monai_vce.review --pred EVENTS.json --frames FRAMES_DIR [--probs DIR] [--gt GT.json]
--out REVIEW_DIR``.

Writes the review site (see :mod:`monai_vce.review.site`) and prints a JSON line with the path of its
``index.html``. Bad inputs exit with status 2 and a message naming the file or video.
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from monai_vce.review.exams import UNITS
from monai_vce.review.site import write_review_site
from monai_vce.utils import safe_text

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Command line entry point (``python -m monai_vce.review``)."""
    p = argparse.ArgumentParser(
        prog="python -m monai_vce.review",
        description="Write a static review site of an event JSON: timelines, events with thumbnails, a frame "
        "viewer, review actions and export of the corrected events (JSON) and labels (Galar CSV).",
    )
    p.add_argument("--pred", required=True, help="predicted event JSON (challenge format, most confident first)")
    p.add_argument(
        "--frames", required=True, help="frames root: video folders of frame_<number>.png and/or video files"
    )
    p.add_argument("--out", required=True, help="site folder (created; open its index.html in a browser)")
    p.add_argument("--probs", default=None, help="folder of per-video probability files <video_id>.npz")
    p.add_argument("--gt", default=None, help="ground-truth event JSON, drawn in the timelines")
    p.add_argument(
        "--frame-units",
        default=None,
        choices=UNITS,
        help="frame units of the event files: frame_index (the labels CSV's index) or frame_number; default: the "
        "units recorded beside the event files (<name>.meta.json), else frame_index. A file recorded in other units "
        "is refused (the prediction is converted when --probs is given)",
    )
    p.add_argument("--fps", type=float, default=None, help="frame rate of frame folders, for durations in seconds")
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
    args = p.parse_args(argv)
    with warnings.catch_warnings():  # restored after the run: main() may be called in-process
        warnings.showwarning = _one_line_warning
        try:
            index = write_review_site(
                args.pred,
                args.frames,
                args.out,
                probs_dir=args.probs,
                gt=args.gt,
                frame_units=args.frame_units,
                fps=args.fps,
                videos=args.videos,
                strip_frames=args.strip_frames,
                max_event_thumbnails=args.max_event_thumbnails,
                max_full_frames=args.max_full_frames,
                num_workers=args.workers,
            )
        except (ImportError, OSError, RuntimeError, ValueError) as e:  # one line, no traceback (a locked --out too)
            print(f"error: {safe_text(e)}", file=sys.stderr)
            return 2
    print(json.dumps({"index": str(Path(index).resolve())}))
    return 0


def _one_line_warning(message: Any, category: type[Warning], *args: Any, **kwargs: Any) -> None:
    # a warning is one line naming what is wrong; no source line of ours under it
    print(f"warning: {safe_text(message)}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
