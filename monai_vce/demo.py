"""The offline demo of the bundle: train, validate, tune, export and infer on generated data, in minutes on a CPU.

``python -m monai_vce.demo`` runs the bundle's own workflows in order through ``monai.bundle`` (the same code
paths as the command lines it prints), with ``bundle/configs/demo.json`` merged over each config:

1. training (``train.json`` + ``demo.json``): a generated mini-Galar, the tiny offline backbone, validation on
   whole videos, per-class thresholds and decoder tuning at the best epoch;
2. export (``ckpt_export``) of the best model to TorchScript with ``inference.json`` embedded, checked against
   the eager network;
3. inference (``inference.json`` + ``demo.json``) on held-out generated videos: per-video probability files
   and one challenge event JSON;
4. scoring of that JSON against the held-out ground truth, next to the empty submission's score.

Everything is written under ``<bundle>/demo/``; a rerun reuses the generated data.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from monai_vce.events import load_events
from monai_vce.metrics import temporal_map
from monai_vce.utils import atomic_write_json, default_bundle_root

__all__ = ["run_demo", "main"]


def _configs(bundle: Path, name: str) -> list[str]:
    return [str(bundle / "configs" / name), str(bundle / "configs" / "demo.json")]


def _command(step: str, configs: list[str], extra: str = "") -> str:
    files = ",".join(f"'{c}'" for c in configs)
    return f'python -m monai.bundle {step} --config_file "[{files}]"{extra}'


def _workflow(configs: list[str], bundle: Path, workflow_type: str, **override: Any) -> Any:
    from monai.bundle import ConfigWorkflow

    wf = ConfigWorkflow(
        config_file=configs,
        meta_file=str(bundle / "configs" / "metadata.json"),
        logging_file=str(bundle / "configs" / "logging.conf"),
        workflow_type=workflow_type,
        bundle_root=str(bundle),
        **override,
    )
    wf.initialize()
    return wf


def run_demo(
    bundle_root: str | Path | None = None, max_epochs: int | None = None, quiet: bool = False
) -> dict[str, Any]:
    """Run the demo chain and return its summary (paths, scores, timings).

    Args:
        bundle_root: the bundle folder (default: ``bundle`` of this repository).
        max_epochs: override of the demo's number of epochs.
        quiet: do not print the step headers and the summary.
    """
    import torch
    from monai.bundle import ckpt_export

    bundle = Path(bundle_root if bundle_root is not None else default_bundle_root()).resolve()
    say = (lambda *a: None) if quiet else (lambda *a: print(*a, flush=True))
    timings: dict[str, float] = {}
    extra = {} if max_epochs is None else {"max_epochs": int(max_epochs)}

    # 1. training
    train_cfg = _configs(bundle, "train.json")
    say(f"\n== 1/4 training: {_command('run training', train_cfg)}")
    t0 = time.perf_counter()
    wf = _workflow(train_cfg, bundle, "train", **extra)
    ckpt_dir = Path(wf.parser.get_parsed_content("ckpt_dir"))
    demo_dir = Path(wf.parser.get_parsed_content("demo_dir"))
    wf.run()
    wf.finalize()
    timings["training_s"] = time.perf_counter() - t0

    # 2. export
    infer_cfg = _configs(bundle, "inference.json")
    model_ts, model_pt = ckpt_dir / "model.ts", ckpt_dir / "model.pt"
    parse_only = _workflow(infer_cfg, bundle, "infer")
    size = int(parse_only.parser.get_parsed_content("image_size"))
    parse_only.finalize()  # releases the output lock its initialize took, for the inference step below
    # the network is traced (TorchScript tracing of the open_clip/timm trunk; scripting is not supported)
    export_args = (
        f" --filepath {model_ts} --ckpt_file {model_pt} --use_trace True --input_shape '[1, 3, {size}, {size}]'"
    )
    say(f"\n== 2/4 export: {_command('ckpt_export network_def', infer_cfg, export_args)}")
    t0 = time.perf_counter()
    ckpt_export(
        net_id="network_def",
        filepath=str(model_ts),
        ckpt_file=str(model_pt),
        meta_file=str(bundle / "configs" / "metadata.json"),
        config_file=infer_cfg,
        use_trace=True,
        input_shape=[1, 3, size, size],
        bundle_root=str(bundle),
    )
    wf_inf = _workflow(infer_cfg, bundle, "infer")
    net = wf_inf.parser.get_parsed_content("network_def").eval()
    net.load_state_dict(torch.load(model_pt, map_location="cpu", weights_only=True))
    x = torch.rand(2, 3, size, size, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ts_diff = float((torch.jit.load(str(model_ts), map_location="cpu")(x) - net(x)).abs().max())
    timings["export_s"] = time.perf_counter() - t0

    # 3. inference on held-out generated videos (labelled datalist: events in index units, like the ground truth)
    test_dir = Path(wf_inf.parser.get_parsed_content("test_dir"))
    wf_inf.finalize()
    override = {
        "dataset_dir": str(test_dir),
        "datalist": "$monai_vce.workflows.galar_datalist(@dataset_dir)",
        "resume": False,
    }
    shown = f" --dataset_dir {test_dir} --datalist '$monai_vce.workflows.galar_datalist(@dataset_dir)' --resume False"
    say(f"\n== 3/4 inference: {_command('run', infer_cfg, shown)}")
    t0 = time.perf_counter()
    wf_inf = _workflow(infer_cfg, bundle, "infer", **override)
    events_file = Path(wf_inf.parser.get_parsed_content("events_file"))
    wf_inf.run()
    wf_inf.finalize()
    timings["inference_s"] = time.perf_counter() - t0

    # 4. scoring against the held-out ground truth, and the empty submission's score
    gt = load_events(test_dir / "ground_truth.json")
    pred = load_events(events_file)
    empty = {"videos": [{"video_id": v["video_id"], "events": []} for v in gt["videos"]]}
    score, score_empty = temporal_map(gt, pred), temporal_map(gt, empty)
    summary = {
        "events_file": str(events_file),
        "probs_dir": str(wf_inf.parser.get_parsed_content("probs_dir")),
        "model": str(ckpt_dir / "model.pt"),
        "torchscript": str(model_ts),
        "torchscript_max_abs_diff": ts_diff,
        "decoder_params": str(ckpt_dir / "decoder.json"),
        "heldout_videos": len(gt["videos"]),
        "heldout_events": int(sum(len(v["events"]) for v in pred["videos"])),
        "mAP@0.5": float(score["mAP@0.5"]),
        "mAP@0.95": float(score["mAP@0.95"]),
        "empty_mAP@0.5": float(score_empty["mAP@0.5"]),
        "empty_mAP@0.95": float(score_empty["mAP@0.95"]),
        "timings_s": {k: round(v, 1) for k, v in timings.items()},
    }
    atomic_write_json(demo_dir / "summary.json", summary)
    say("\n== 4/4 held-out score (python -m monai_vce.metrics --gt GT --pred EVENTS)")
    say(
        f"temporal mAP@0.5 {summary['mAP@0.5']:.4f} (empty submission {summary['empty_mAP@0.5']:.4f}), "
        f"mAP@0.95 {summary['mAP@0.95']:.4f} (empty {summary['empty_mAP@0.95']:.4f}) on {len(gt['videos'])} held-out videos"
    )
    say(f"TorchScript vs eager logits: max abs difference {ts_diff:.2e}")
    say(f"event JSON: {events_file}")
    say(f"summary: {demo_dir / 'summary.json'}")
    return summary


def main(argv: Sequence[str] | None = None) -> int:
    """Command line entry point: ``python -m monai_vce.demo``."""
    p = argparse.ArgumentParser(prog="python -m monai_vce.demo", description=__doc__.split("\n\n")[0])
    p.add_argument("--bundle-root", default=None, help="bundle folder (default: bundle/ of this repository)")
    p.add_argument("--max-epochs", type=int, default=None, help="override the demo's number of epochs")
    p.add_argument("--quiet", action="store_true", help="print nothing but errors")
    args = p.parse_args(argv)
    summary = run_demo(args.bundle_root, max_epochs=args.max_epochs, quiet=args.quiet)
    if args.quiet:
        print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
