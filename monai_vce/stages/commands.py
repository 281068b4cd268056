"""Command lines ``decode`` and ``refine`` of ``python -m monai_vce``: :func:`~monai_vce.stages.decode` and
:func:`~monai_vce.stages.refine` on folders; each prints one JSON line (conventions in :mod:`monai_vce.cli`).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

from monai_vce.events.metadata import read_frame_units
from monai_vce.events.units import FrameUnits
from monai_vce.postprocessing.screening import load_screening_decoder
from monai_vce.temporal.refiner import TemporalRefiner, load_refiner_file

from .decode import decode
from .refine import refine

__all__ = ["add_decode_parser", "add_refine_parser"]


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def add_decode_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``decode`` command to ``subparsers``; returns its parser."""
    p = subparsers.add_parser(
        "decode",
        description="Decode every <video_id>.npz of a probability folder into one event JSON, with its units "
        "sidecar <name>.meta.json.",
    )
    p.add_argument("--probs-dir", required=True, help="folder of per-video probability files <video_id>.npz")
    p.add_argument(
        "--decoder", default=None, help="decoder parameters JSON, e.g. bundle/models/decoder.json (default: defaults)"
    )
    p.add_argument("--out", required=True, help="event JSON to write")
    p.add_argument("--videos", nargs="+", default=None, help="only these video ids, in this order (default: all)")
    p.add_argument(
        "--frame-units",
        default=None,
        choices=[u.value for u in FrameUnits],
        help="frame ids of the events (default: those the decoder parameters were fitted in, else frame_index)",
    )
    p.add_argument(
        "--false-alarms-per-exam",
        type=float,
        default=None,
        help="with a screening decoder (screening_decoder.json): its operating point at this many false alarms per "
        "exam, from the validation curves it recorded (default: the budget it was fitted at)",
    )
    p.set_defaults(run=run_decode)
    return p


def run_decode(args: argparse.Namespace) -> dict[str, Any]:
    """Decode ``args.probs_dir`` into ``args.out``; returns the printed summary (videos, events, frame units)."""
    if not Path(args.probs_dir).is_dir():  # the stage decodes a missing folder as no videos: here it is a typo
        raise FileNotFoundError(f"probability folder {args.probs_dir} not found")
    decoder = args.decoder
    if args.false_alarms_per_exam is not None:
        decoder = load_screening_decoder(args.decoder, args.false_alarms_per_exam, required=True)
    path = decode(
        args.probs_dir, args.out, decoder=decoder, videos=args.videos, frame_units=args.frame_units, log=_stderr
    )
    if path is None:  # pragma: no cover (another rank of a distributed run)
        return {"out": None}
    videos = json.loads(path.read_text(encoding="utf-8"))["videos"]
    units = read_frame_units(path)
    return {
        "out": str(path),
        "videos": len(videos),
        "events": sum(len(v["events"]) for v in videos),
        "frame_units": None if units is None else units.value,
    }


def add_refine_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``refine`` command to ``subparsers``; returns its parser."""
    p = subparsers.add_parser(
        "refine",
        description="Refine every <video_id>.npz of a probability folder with a temporal refiner into a folder of "
        "the same format; a rerun keeps the files already refined by the same refiner.",
    )
    p.add_argument("--probs-dir", required=True, help="folder of the <video_id>.npz files to refine")
    p.add_argument(
        "--refiner",
        required=True,
        help="refiner file (python -m monai_vce temporal fit, or the bundle's temporal stage)",
    )
    p.add_argument("--out", required=True, help="output folder of the refined <video_id>.npz files")
    p.add_argument("--videos", nargs="+", default=None, help="refine only these video ids")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    p.set_defaults(run=run_refine)
    return p


def run_refine(args: argparse.Namespace) -> dict[str, Any]:
    """Refine ``args.probs_dir`` into ``args.out``; returns the printed summary (written, kept, trained videos)."""
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    refiner = load_refiner_file(args.refiner)
    source = TemporalRefiner.fingerprint(args.refiner)
    result = refine(args.probs_dir, args.out, refiner, source=source, videos=args.videos, log=_stderr)
    return {
        "out": str(args.out),
        "written": len(result["written"]),
        "kept": len(result["kept"]),
        "trained_videos": result["trained_videos"],
        "seconds": round(time.perf_counter() - t0, 2),
    }
