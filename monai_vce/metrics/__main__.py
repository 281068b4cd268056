"""Command line ``metrics``: the temporal mAP of an event JSON against a ground truth, as the RARE-VISION challenge
scores it; prints one JSON object (``mAP@0.5``, ``mAP@0.95``, ``per_label``, ``per_video``, ``frame_units``, ...,
with ``--lesions`` the lesion-level FROC of :func:`~monai_vce.metrics.lesion_froc` under ``lesions``, and with
``--metadata`` the :func:`~monai_vce.metrics.metrics_by_group` of each capsule under ``per_capsule``).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from monai_vce.cli import command_main, print_error
from monai_vce.events.metadata import convert_events, describe_events_file, read_frame_units
from monai_vce.events.probabilities import load_video_probs, probability_file
from monai_vce.events.units import FrameUnits
from monai_vce.events.validation import DEFAULT_MAX_BYTES, DEFAULT_MAX_EVENTS, load_events, validate_events
from monai_vce.utils import atomic_write_json

from .groups import metrics_by_group
from .lesions import FALSE_ALARM_RATES, lesion_froc
from .temporal_map import temporal_map

__all__ = ["add_parser", "main"]


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``metrics`` command to ``subparsers``; returns its parser."""
    p = subparsers.add_parser(
        "metrics",
        description="Temporal mAP of a RARE-VISION event JSON against a ground truth. As the challenge does, an "
        "event JSON whose video ids differ from the ground truth's is refused; files recorded in different frame "
        "units (<name>.meta.json) are refused unless --probs-dir converts the events into the ground truth's units.",
    )
    p.add_argument("--gt", required=True, help="ground-truth event JSON file")
    p.add_argument("--events", required=True, help="event JSON file to score (the prediction)")
    p.add_argument(
        "--tiou-thresholds", type=float, nargs="+", default=[0.5, 0.95], help="tIoU thresholds (default 0.5 0.95)"
    )
    p.add_argument(
        "--lesions",
        action="store_true",
        help="also report lesion-level sensitivity at fixed false alarms per exam (FROC) and reading workload, "
        "for the pathology labels and overall, ranked by the events' 'score'",
    )
    p.add_argument(
        "--false-alarm-rates",
        type=float,
        nargs="+",
        default=list(FALSE_ALARM_RATES),
        help="false-alarm events per exam of --lesions (default 0.5 1 2 4 8)",
    )
    p.add_argument(
        "--merge-gap", type=int, default=0, help="--lesions: join runs of a label at most this many frames apart"
    )
    p.add_argument(
        "--metadata",
        default=None,
        help="a metadata.csv naming each video's capsule (video id and capsule columns): also scores per capsule",
    )
    p.add_argument("--out", default=None, help="also write the result JSON to this file (atomically)")
    p.add_argument(
        "--allow-missing-videos",
        action="store_true",
        help="score ground-truth videos missing from the event JSON as empty and ignore extra videos",
    )
    p.add_argument("--max-bytes", type=int, default=DEFAULT_MAX_BYTES, help="largest accepted file size in bytes")
    p.add_argument(
        "--max-events", type=int, default=DEFAULT_MAX_EVENTS, help="largest accepted number of events per file"
    )
    p.add_argument(
        "--probs-dir",
        default=None,
        help="folder of the event JSON's probability files <video_id>.npz: converts events recorded in other "
        "frame units than the ground truth into the ground truth's units",
    )
    p.add_argument("--indent", type=int, default=2, help="JSON indentation of the printed result (-1: compact)")
    p.set_defaults(run=run)
    return p


def _same_units(args: argparse.Namespace, objs: dict[str, Any]) -> tuple[FrameUnits | None, str | None]:
    """The units the files are scored in, converting the prediction with ``--probs-dir`` when they differ.

    Returns:
        ``(units, problem)``: ``problem`` is the one-line refusal, or ``None``.
    """
    gt_units, pred_units = read_frame_units(args.gt), read_frame_units(args.events)
    if gt_units is None or pred_units is None:
        known = gt_units or pred_units
        if known is not None:
            missing = args.events if pred_units is None else args.gt
            print(
                f"note: {missing} records no frame units; scored as {known.value} like the other file", file=sys.stderr
            )
        return known, None
    if gt_units is pred_units:
        return gt_units, None
    if args.probs_dir is None:
        return gt_units, (
            f"frame units differ: {describe_events_file(args.gt, gt_units)}, {describe_events_file(args.events, pred_units)}; "
            "pass --probs-dir DIR (the event JSON's probability files hold both frame ids) to convert, "
            "or score files in the same units"
        )
    try:
        ids = {}
        for v in objs["prediction"]["videos"]:
            video = load_video_probs(probability_file(args.probs_dir, v["video_id"]))
            ids[str(v["video_id"])] = (video.frame_index, video.frame_number)
        objs["prediction"] = convert_events(objs["prediction"], pred_units, gt_units, ids, source=args.events)
    except (FileNotFoundError, ValueError) as e:
        return gt_units, f"cannot convert {args.events} to {gt_units.value} units: {e}"
    print(
        f"note: converted {describe_events_file(args.events, pred_units)} to {gt_units.value} units with the frame ids "
        f"of {args.probs_dir}",
        file=sys.stderr,
    )
    return gt_units, None


def run(args: argparse.Namespace) -> int:
    """Score ``args.events`` against ``args.gt``; prints the result; returns the exit code (0, or 2: invalid input)."""
    problems: list[str] = []
    objs = {}
    for role, path in (("ground truth", args.gt), ("prediction", args.events)):
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
        problems += [f"{args.events}: {p}" for p in pred_problems]
    capsules: dict[str, str] | None = None
    if args.metadata is not None:
        # deferred: the data package (and torch with it) is imported only for --metadata
        from monai_vce.data.galar import UNKNOWN_CAPSULE, metadata_capsules

        ids = [str(v["video_id"]) for v in objs["ground truth"]["videos"]] if "ground truth" in objs else []
        try:
            capsules = metadata_capsules(args.metadata, ids)
        except (FileNotFoundError, ValueError) as e:
            problems.append(f"--metadata: {e}")
        else:
            if ids and all(c == UNKNOWN_CAPSULE for c in capsules.values()):
                problems.append(f"--metadata {args.metadata}: names the capsule of none of the ground truth's videos")
    units = None
    if not problems:
        units, problem = _same_units(args, objs)
        if problem:
            problems.append(problem)
    if not problems:
        try:
            result = temporal_map(
                objs["ground truth"], objs["prediction"], tiou_thresholds=args.tiou_thresholds, validate=False
            )
            if args.lesions:
                result["lesions"] = lesion_froc(
                    objs["ground truth"],
                    objs["prediction"],
                    false_alarm_rates=args.false_alarm_rates,
                    merge_gap=args.merge_gap,
                    validate=False,
                )
            if capsules is not None:
                result["per_capsule"] = metrics_by_group(
                    objs["ground truth"], objs["prediction"], capsules, validate=False
                )
        except ValueError as e:
            problems.append(str(e))
    if problems:  # every problem of the files, one line each
        for problem in problems:
            print_error(problem)
        return 2
    result["frame_units"] = None if units is None else units.value
    indent = None if args.indent < 0 else min(args.indent, 16)
    if args.out:
        try:
            atomic_write_json(args.out, result, indent=indent)
        except OSError as e:  # a file in the way of --out's folder, a read-only folder...
            return print_error(f"--out {args.out}: {e}")
    print(json.dumps(result, indent=indent))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m monai_vce.metrics``, the same as ``python -m monai_vce metrics``; returns the exit code."""
    return command_main(add_parser, argv, "python -m monai_vce.metrics")


if __name__ == "__main__":
    sys.exit(main())
