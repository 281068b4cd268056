"""Command line: ``python -m monai_vce.report --pred PRED.json [--gt GT.json] [--probs DIR] --out DIR``.

Writes ``DIR/timelines/<video_id>.png``, ``DIR/summary.md``, ``DIR/summary.json`` and, with ground truth,
``DIR/summary.png``; prints a JSON line with the paths and the overall mAP. Bad inputs exit with status 2
and a one-paragraph message naming the file or video; so does a DIR another run holds locked, or one holding a
file the report would replace that no report wrote (``DIR/.monai_vce_manifest.json`` lists what reports wrote).
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from collections.abc import Sequence

from monai_vce.report.summary import write_report
from monai_vce.report.timeline import UNITS

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m monai_vce.report",
        description="Draw per-video event timelines and an evaluation summary of an event JSON prediction.",
    )
    parser.add_argument("--pred", required=True, help="prediction event JSON (challenge format)")
    parser.add_argument("--gt", default=None, help="ground-truth event JSON; enables scores and the summary chart")
    parser.add_argument("--probs", default=None, help="folder of per-video probability files <video_id>.npz")
    parser.add_argument("--out", required=True, help="report folder (created when missing)")
    parser.add_argument(
        "--frame-units",
        default=None,
        choices=UNITS,
        help="frame units of the event files (default: the units recorded beside them, <name>.meta.json, else "
        "frame_index); files recorded in other units are refused",
    )
    parser.add_argument("--units", default=None, help=argparse.SUPPRESS)  # former name of --frame-units
    parser.add_argument("--videos", nargs="+", default=None, help="report only these video ids, in this order")
    args = parser.parse_args(argv)
    if args.units is not None:
        print("warning: --units is deprecated; use --frame-units", file=sys.stderr)
        warnings.warn("--units is deprecated; use --frame-units", DeprecationWarning, stacklevel=2)
        args.frame_units = args.units
    try:
        result = write_report(
            args.pred, args.out, gt=args.gt, probs_dir=args.probs, frame_units=args.frame_units, videos=args.videos
        )
    # one paragraph, no traceback: a file in the way of --out, a folder another run holds locked too
    except (ImportError, OSError, RuntimeError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    metrics = result["metrics"]
    print(
        json.dumps(
            {
                "mAP@0.5": metrics["mAP@0.5"] if metrics else None,
                "mAP@0.95": metrics["mAP@0.95"] if metrics else None,
                "frame_units": result["frame_units"],
                "summary_md": str(result["summary_md"]),
                "summary_png": str(result["summary_png"]) if result["summary_png"] else None,
                "summary_json": str(result["summary_json"]),
                "timelines": {k: str(v) for k, v in result["timelines"].items()},
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
