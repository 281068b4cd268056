"""Command line ``temporal fit``: train a temporal refiner on honest per-video probability files against ground-truth
events and write it atomically (:func:`~monai_vce.temporal.training.fit_refiner`); prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from monai_vce.cli import command_main
from monai_vce.events.units import FrameUnits
from monai_vce.utils import read_json_file

from .files import read_videos
from .refiner import INPUTS
from .training import fit_refiner

__all__ = ["add_parser", "main"]


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``temporal`` command (its action ``fit``) to ``subparsers``; returns its parser."""
    p = subparsers.add_parser("temporal", description="Temporal refiner of frame outputs.")
    sub = p.add_subparsers(dest="action", required=True)
    f = sub.add_parser(
        "fit",
        help="train a refiner on per-video probability files and ground-truth events",
        description="Train a refiner on per-video probability files against ground-truth events; --val-probs-dir "
        "and --val-gt choose the weights with the lowest validation loss. The inputs must be honest (outputs of a "
        "frame model not trained on those videos): --frame-model-videos turns on the leakage guard.",
    )
    f.add_argument("--probs-dir", required=True, help="folder of training <video_id>.npz files (honest frame outputs)")
    f.add_argument("--gt", required=True, help="ground-truth event JSON of those videos")
    f.add_argument("--out", required=True, help="refiner file to write, e.g. refiner.pt")
    f.add_argument("--val-probs-dir", default=None, help="folder of validation <video_id>.npz files")
    f.add_argument("--val-gt", default=None, help="ground-truth event JSON of the validation videos")
    f.add_argument("--inputs", default="probs", choices=INPUTS, help="refiner inputs (default: probs)")
    f.add_argument(
        "--frame-units",
        default=FrameUnits.FRAME_INDEX.value,
        choices=[u.value for u in FrameUnits],
        help="frame units of the events (default: frame_index)",
    )
    f.add_argument("--network", default=None, help='network settings as JSON, e.g. \'{"stages": 4, "channels": 64}\'')
    f.add_argument("--steps", type=int, default=480, help="optimisation steps (default 480)")
    f.add_argument("--crop-length", type=int, default=1024, help="frames per training crop (default 1024)")
    f.add_argument("--batch-size", type=int, default=8, help="crops per step (default 8)")
    f.add_argument("--learning-rate", type=float, default=1e-2, help="peak learning rate (default 1e-2)")
    f.add_argument("--smoothness", type=float, default=0.0, help="weight of the smoothness term (default 0: off)")
    f.add_argument(
        "--boundary-weight", type=float, default=8.0, help="extra loss weight next to label changes (default 8; 0: off)"
    )
    f.add_argument("--position", action="store_true", help="give the refiner each frame's position in the video")
    f.add_argument(
        "--passthrough",
        nargs="*",
        default=None,
        metavar="LABEL",
        help="labels returned unchanged (default: the five sections when reading probabilities; no LABEL: none)",
    )
    f.add_argument("--seed", type=int, default=0)
    f.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    f.add_argument("--device", default="cpu", help="torch device (default cpu)")
    f.add_argument(
        "--frame-model-videos",
        default=None,
        help="JSON file: list of the frame model's training video ids, or {video_id: [ids]} for out-of-fold "
        "outputs; fitting refuses videos whose outputs the frame model was trained on",
    )
    f.set_defaults(run=_fit)
    return p


def _fit(args: argparse.Namespace) -> dict[str, Any]:
    if (args.val_probs_dir is None) != (args.val_gt is None):
        raise ValueError("--val-probs-dir and --val-gt go together")
    features = args.inputs != "probs"
    units = args.frame_units
    videos = read_videos(args.probs_dir, args.gt, frame_units=units, features=features)
    val = (
        read_videos(args.val_probs_dir, args.val_gt, frame_units=units, features=features)
        if args.val_probs_dir
        else None
    )
    network = None
    if args.network:
        try:
            network = json.loads(args.network)
        except json.JSONDecodeError as e:
            raise ValueError(f"--network is not valid JSON: {e}") from None
        if not isinstance(network, dict):
            raise ValueError("--network must be a JSON object of network arguments")
    trained_on = None
    if args.frame_model_videos:
        # strict and bounded, as every JSON file a user hands in; its errors are one line naming the file
        trained_on = read_json_file(args.frame_model_videos, max_bytes=64 * 1024**2, what="frame-model video list")
    refiner = fit_refiner(
        videos,
        args.inputs,
        network=network,
        position=args.position,
        passthrough=args.passthrough,
        crop_length=args.crop_length,
        batch_size=args.batch_size,
        steps=args.steps,
        learning_rate=args.learning_rate,
        smoothness=args.smoothness,
        boundary_weight=args.boundary_weight,
        val_videos=val,
        trained_on=trained_on,
        seed=args.seed,
        device=args.device,
        num_threads=args.threads,
        log=lambda line: print(line, file=sys.stderr, flush=True),
    )
    out = refiner.to("cpu").save(args.out)
    info = refiner.fit_info
    return {
        "out": str(out),
        "videos": len(info["videos"]),
        "frames": info["frames"],
        "train_loss": info.get("train_loss"),
        "val_loss": info.get("val_loss"),
        "seconds": info["seconds"],
    }


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m monai_vce.temporal``, the same as ``python -m monai_vce temporal``; returns the exit code."""
    return command_main(add_parser, argv, "python -m monai_vce.temporal")


if __name__ == "__main__":
    sys.exit(main())
