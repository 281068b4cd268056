"""Command line of the temporal refiner.

Usage::

    python -m monai_vce.temporal fit --probs DIR --gt GT.json --out refiner.pt [--val-probs DIR --val-gt GT.json]
    python -m monai_vce.temporal refine --probs DIR --model refiner.pt --out DIR

``fit`` trains a refiner on the per-video probability files of ``--probs`` against the ground-truth events of
``--gt`` (in ``--frame-units``, Galar's ``frame_index`` by default) and writes it atomically; ``--val-probs`` /
``--val-gt`` choose the weights with the lowest validation loss. The inputs must be honest (outputs of a frame
model not trained on those videos): ``--frame-model-videos`` names the frame model's training videos and turns
on the leakage guard. ``refine`` writes ``<video_id>.npz`` files of the same format with refined ``probs``,
resuming an interrupted run. Both print one JSON line; bad inputs exit with status 2 and a one-line message
naming the file or video.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from collections.abc import Sequence
from typing import Any

from monai_vce.events.units import FrameUnits
from monai_vce.utils import read_json_file

from .files import read_videos, refine_folder
from .protocol import LeakageError
from .refiner import INPUTS, TemporalRefiner, load_refiner_file
from .training import fit_refiner

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m monai_vce.temporal", description="Temporal refiner of frame outputs.")
    sub = p.add_subparsers(dest="command", required=True)
    f = sub.add_parser("fit", help="train a refiner on per-video probability files and ground-truth events")
    f.add_argument("--probs", required=True, help="folder of training <video_id>.npz files (honest frame outputs)")
    f.add_argument("--gt", required=True, help="ground-truth event JSON of those videos")
    f.add_argument("--out", required=True, help="refiner file to write, e.g. refiner.pt")
    f.add_argument("--val-probs", default=None, help="folder of validation <video_id>.npz files")
    f.add_argument("--val-gt", default=None, help="ground-truth event JSON of the validation videos")
    f.add_argument("--inputs", default="probs", choices=INPUTS, help="refiner inputs (default: probs)")
    f.add_argument(
        "--frame-units",
        default=FrameUnits.FRAME_INDEX.value,
        choices=[u.value for u in FrameUnits],
        help="frame units of the events (default: frame_index)",
    )
    f.add_argument("--units", default=None, help=argparse.SUPPRESS)  # former name of --frame-units
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
    r = sub.add_parser("refine", help="refine per-video probability files with a trained refiner")
    r.add_argument("--probs", required=True, help="folder of <video_id>.npz files to refine")
    r.add_argument("--model", required=True, help="refiner file written by fit")
    r.add_argument("--out", required=True, help="output folder for the refined <video_id>.npz files")
    r.add_argument("--videos", nargs="+", default=None, help="refine only these video ids")
    r.add_argument("--chunk-size", type=int, default=None, help="frames per inference chunk (memory bound)")
    r.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    return p


def _fit(args: argparse.Namespace) -> dict[str, Any]:
    if (args.val_probs is None) != (args.val_gt is None):
        raise ValueError("--val-probs and --val-gt go together")
    if args.units is not None:
        print("warning: --units is deprecated; use --frame-units", file=sys.stderr)
        warnings.warn("--units is deprecated; use --frame-units", DeprecationWarning, stacklevel=2)
        args.frame_units = args.units
    features = args.inputs != "probs"
    units = args.frame_units
    videos = read_videos(args.probs, args.gt, frame_units=units, features=features)
    val = read_videos(args.val_probs, args.val_gt, frame_units=units, features=features) if args.val_probs else None
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
        "model": str(out),
        "videos": len(info["videos"]),
        "frames": info["frames"],
        "train_loss": info.get("train_loss"),
        "val_loss": info.get("val_loss"),
        "seconds": info["seconds"],
    }


def _refine(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    refiner = load_refiner_file(args.model)
    result = refine_folder(
        refiner,
        args.probs,
        args.out,
        source=TemporalRefiner.fingerprint(args.model),
        videos=args.videos,
        chunk_size=args.chunk_size,
        log=lambda line: print(line, file=sys.stderr, flush=True),
    )
    if result["trained_videos"]:
        print(
            f"warning: {len(result['trained_videos'])} refined video(s) were among the refiner's training videos "
            f"(e.g. {result['trained_videos'][0]!r}); do not tune a decoder on their refined probabilities",
            file=sys.stderr,
        )
    return {
        "out": str(args.out),
        "written": len(result["written"]),
        "kept": len(result["kept"]),
        "trained_videos": result["trained_videos"],
        "seconds": round(time.perf_counter() - t0, 2),
    }


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code (0 success, 2 invalid input)."""
    args = _parser().parse_args(argv)
    try:
        result = _fit(args) if args.command == "fit" else _refine(args)
    except (FileNotFoundError, ValueError, LeakageError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
