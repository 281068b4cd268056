"""Command line: score a prediction event JSON against a ground truth as the RARE-VISION challenge does.

Usage::

    python -m monai_vce.metrics --gt GT.json --pred PRED.json [--tiou-thresholds 0.5 0.95] [--out result.json]

Prints one JSON object (``mAP@0.5``, ``mAP@0.95``, ``per_label``, ``per_video``, ...). Invalid files are
reported one problem per line on stderr with exit code 2. As the challenge does, a prediction whose video
ids differ from the ground truth's is refused; ``--allow-missing-videos`` scores missing videos as empty
predictions and ignores extra ones instead.
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from collections.abc import Sequence

from monai_vce.events.validation import DEFAULT_MAX_BYTES, DEFAULT_MAX_EVENTS, load_events, validate_events
from monai_vce.utils import atomic_write_json

from .temporal_map import temporal_map

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m monai_vce.metrics",
        description="Temporal mAP of a RARE-VISION event JSON prediction against a ground truth.",
    )
    p.add_argument("--gt", required=True, help="ground-truth event JSON file")
    p.add_argument("--pred", required=True, help="prediction event JSON file")
    p.add_argument(
        "--tiou-thresholds", type=float, nargs="+", default=[0.5, 0.95], help="tIoU thresholds (default 0.5 0.95)"
    )
    p.add_argument("--thresholds", type=float, nargs="+", default=None, help=argparse.SUPPRESS)  # former name
    p.add_argument("--out", default=None, help="also write the result JSON to this file (atomically)")
    p.add_argument(
        "--allow-missing-videos",
        action="store_true",
        help="score ground-truth videos missing from the prediction as empty and ignore extra predicted videos",
    )
    p.add_argument("--max-bytes", type=int, default=DEFAULT_MAX_BYTES, help="largest accepted file size in bytes")
    p.add_argument(
        "--max-events", type=int, default=DEFAULT_MAX_EVENTS, help="largest accepted number of events per file"
    )
    p.add_argument("--indent", type=int, default=2, help="JSON indentation of the printed result (-1: compact)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code (0 success, 2 invalid input)."""
    args = _parser().parse_args(argv)
    if args.thresholds is not None:
        warnings.warn(
            "--thresholds is deprecated and will be removed in the next release; use --tiou-thresholds",
            DeprecationWarning,
            stacklevel=2,
        )
        print("warning: --thresholds is deprecated; use --tiou-thresholds", file=sys.stderr)
        args.tiou_thresholds = args.thresholds
    problems: list[str] = []
    objs = {}
    for role, path in (("ground truth", args.gt), ("prediction", args.pred)):
        try:
            objs[role] = load_events(path, max_bytes=args.max_bytes, max_events=args.max_events, validate=False)
        except (FileNotFoundError, ValueError) as e:
            problems.append(f"{role}: {e}")
    if not problems:
        gt, pred = objs["ground truth"], objs["prediction"]
        problems += [f"{args.gt}: {p}" for p in validate_events(gt, max_events=args.max_events)]
        pred_problems = validate_events(
            pred, gt=None if args.allow_missing_videos or problems else gt, max_events=args.max_events
        )
        problems += [f"{args.pred}: {p}" for p in pred_problems]
    if not problems:
        try:
            result = temporal_map(
                objs["ground truth"], objs["prediction"], tiou_thresholds=args.tiou_thresholds, validate=False
            )
        except ValueError as e:
            problems.append(str(e))
    if problems:
        print("\n".join(problems), file=sys.stderr)
        return 2
    indent = None if args.indent < 0 else min(args.indent, 16)
    if args.out:
        try:
            atomic_write_json(args.out, result, indent=indent)
        except OSError as e:  # a file in the way of --out's folder, a read-only folder...
            print(f"--out {args.out}: {e}", file=sys.stderr)
            return 2
    print(json.dumps(result, indent=indent))
    return 0


if __name__ == "__main__":
    sys.exit(main())
