"""Command line ``report``: per-video event timelines and an evaluation summary of an event JSON
(:func:`~monai_vce.report.summary.write_report`); prints one JSON line with the paths and the overall mAP.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from monai_vce.cli import command_main
from monai_vce.report.summary import write_report
from monai_vce.report.timeline import UNITS

__all__ = ["add_parser", "main"]


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``report`` command to ``subparsers``; returns its parser."""
    p = subparsers.add_parser(
        "report",
        description="Write DIR/timelines/<video_id>.png, DIR/summary.md, DIR/summary.json and, with ground truth, "
        "DIR/summary.png. A DIR another run holds locked, or one holding a file the report would replace that no "
        "report wrote (DIR/.monai_vce_manifest.json lists what reports wrote), is refused.",
    )
    p.add_argument("--events", required=True, help="event JSON to report (challenge format)")
    p.add_argument("--gt", default=None, help="ground-truth event JSON; enables scores and the summary chart")
    p.add_argument("--probs-dir", default=None, help="folder of per-video probability files <video_id>.npz")
    p.add_argument("--out", required=True, help="report folder (created when missing)")
    p.add_argument(
        "--frame-units",
        default=None,
        choices=UNITS,
        help="frame units of the event files (default: the units recorded beside them, <name>.meta.json, else "
        "frame_index); files recorded in other units are refused",
    )
    p.add_argument("--videos", nargs="+", default=None, help="report only these video ids, in this order")
    p.set_defaults(run=run)
    return p


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Write the report of ``args``; returns the printed summary (paths, overall mAP, frame units)."""
    result = write_report(
        args.events, args.out, gt=args.gt, probs_dir=args.probs_dir, frame_units=args.frame_units, videos=args.videos
    )
    metrics = result["metrics"]
    return {
        "mAP@0.5": metrics["mAP@0.5"] if metrics else None,
        "mAP@0.95": metrics["mAP@0.95"] if metrics else None,
        "frame_units": result["frame_units"],
        "summary_md": str(result["summary_md"]),
        "summary_png": str(result["summary_png"]) if result["summary_png"] else None,
        "summary_json": str(result["summary_json"]),
        "timelines": {k: str(v) for k, v in result["timelines"].items()},
    }


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m monai_vce.report``, the same as ``python -m monai_vce report``; returns the exit code."""
    return command_main(add_parser, argv, "python -m monai_vce.report")


if __name__ == "__main__":
    sys.exit(main())
