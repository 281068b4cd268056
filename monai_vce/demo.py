"""The offline demo of the bundle: train, validate, tune, export and infer on generated data, in minutes on a CPU.

``python -m monai_vce.demo`` runs the bundle's own workflows in order through ``monai.bundle`` (the same code
paths as the command lines it prints), with ``bundle/configs/demo.json`` merged over each config:

1. training (``train.json`` + ``demo.json``): a generated mini-Galar, the tiny offline backbone, validation on
   whole videos, per-class thresholds and decoder tuning at the best epoch;
2. the temporal stage (``run temporal`` of ``train.json`` + ``temporal_train.json`` + ``demo.json``): the best
   model's outputs on the validation videos, a temporal refiner cross-fitted on them and a decoder tuned on its
   out-of-fold refined probabilities;
3. export (``ckpt_export``) of the best model to TorchScript with ``inference.json`` embedded, checked against
   the eager network;
4. inference (``inference.json`` + ``demo.json``) on held-out generated videos: per-video probability files
   and one challenge event JSON; then the same with ``temporal_inference.json`` (frame model, refiner, decoder),
   reusing the frame model's probability files;
5. scoring of both JSONs against the held-out ground truth, side by side, next to the empty submission's score.

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


def _configs(bundle: Path, *names: str) -> list[str]:
    return [str(bundle / "configs" / name) for name in (*names, "demo.json")]


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
    say(f"\n== 1/5 training: {_command('run training', train_cfg)}")
    t0 = time.perf_counter()
    wf = _workflow(train_cfg, bundle, "train", **extra)
    ckpt_dir = Path(wf.parser.get_parsed_content("ckpt_dir"))
    demo_dir = Path(wf.parser.get_parsed_content("demo_dir"))
    wf.run()
    wf.finalize()
    timings["training_s"] = time.perf_counter() - t0

    # 2. the temporal stage: refiner cross-fitted on the validation outputs, decoder tuned on refined probabilities
    temporal_cfg = _configs(bundle, "train.json", "temporal_train.json")
    say(f"\n== 2/5 temporal stage: {_command('run temporal', temporal_cfg)}")
    t0 = time.perf_counter()
    wf = _workflow(temporal_cfg, bundle, "train", run_id="temporal", **extra)
    temporal_summary_file = Path(wf.parser.get_parsed_content("temporal_dir")) / "temporal_fit.json"
    wf.run()
    wf.finalize()
    timings["temporal_stage_s"] = time.perf_counter() - t0
    temporal_fit = json.loads(temporal_summary_file.read_text())

    # 3. export
    infer_cfg = _configs(bundle, "inference.json")
    model_ts, model_pt = ckpt_dir / "model.ts", ckpt_dir / "model.pt"
    parse_only = _workflow(infer_cfg, bundle, "infer")
    size = int(parse_only.parser.get_parsed_content("image_size"))
    parse_only.finalize()  # releases the output lock its initialize took, for the inference step below
    # the network is traced (TorchScript tracing of the open_clip/timm trunk; scripting is not supported)
    export_args = (
        f" --filepath {model_ts} --ckpt_file {model_pt} --use_trace True --input_shape '[1, 3, {size}, {size}]'"
    )
    say(f"\n== 3/5 export: {_command('ckpt_export network_def', infer_cfg, export_args)}")
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

    # 4. inference on held-out generated videos (labelled datalist: events in index units, like the ground truth)
    test_dir = Path(wf_inf.parser.get_parsed_content("test_dir"))
    wf_inf.finalize()
    override = {
        "dataset_dir": str(test_dir),
        "datalist": "$monai_vce.workflows.galar_datalist(@dataset_dir)",
        "resume": False,
    }
    shown = f" --dataset_dir {test_dir} --datalist '$monai_vce.workflows.galar_datalist(@dataset_dir)' --resume False"
    say(f"\n== 4/5 inference: {_command('run', infer_cfg, shown)}")
    t0 = time.perf_counter()
    wf_inf = _workflow(infer_cfg, bundle, "infer", **override)
    events_file = Path(wf_inf.parser.get_parsed_content("events_file"))
    wf_inf.run()
    wf_inf.finalize()
    timings["inference_s"] = time.perf_counter() - t0

    # ... and frame model -> refiner -> decoder, reusing the frame model's probability files of the same folder
    temporal_infer_cfg = _configs(bundle, "inference.json", "temporal_inference.json")
    override["resume"] = True  # reuse the frame model's files written just above
    shown = shown.replace(" --resume False", "")
    say(f"\n== 4/5 temporal inference: {_command('run', temporal_infer_cfg, shown)}")
    t0 = time.perf_counter()
    wf_inf = _workflow(temporal_infer_cfg, bundle, "infer", **override)
    temporal_events_file = Path(wf_inf.parser.get_parsed_content("events_file"))
    wf_inf.run()
    wf_inf.finalize()
    timings["temporal_inference_s"] = time.perf_counter() - t0

    # 5. scoring against the held-out ground truth, and the empty submission's score
    gt = load_events(test_dir / "ground_truth.json")
    pred = load_events(events_file)
    empty = {"videos": [{"video_id": v["video_id"], "events": []} for v in gt["videos"]]}
    score, score_empty = temporal_map(gt, pred), temporal_map(gt, empty)
    score_temporal = temporal_map(gt, load_events(temporal_events_file))
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
        "temporal_events_file": str(temporal_events_file),
        "refiner": temporal_fit["refiner_file"],
        "temporal_decoder_params": temporal_fit["decoder_file"],
        "temporal_mAP@0.5": float(score_temporal["mAP@0.5"]),
        "temporal_mAP@0.95": float(score_temporal["mAP@0.95"]),
        "temporal_selected_on_validation": temporal_fit["selected"],
        "timings_s": {k: round(v, 1) for k, v in timings.items()},
    }
    atomic_write_json(demo_dir / "summary.json", summary)
    say(
        f"\n== 5/5 held-out temporal mAP on {len(gt['videos'])} videos (python -m monai_vce.metrics --gt GT --pred EVENTS)"
    )
    say(f"{'pipeline':<34} {'mAP@0.5':>8} {'mAP@0.95':>9}")
    for name, a, b in (
        ("frame model + decoder", summary["mAP@0.5"], summary["mAP@0.95"]),
        ("frame model + refiner + decoder", summary["temporal_mAP@0.5"], summary["temporal_mAP@0.95"]),
        ("empty submission", summary["empty_mAP@0.5"], summary["empty_mAP@0.95"]),
    ):
        say(f"{name:<34} {a:>8.4f} {b:>9.4f}")
    say(
        f"temporal stage {timings['temporal_stage_s']:.1f} s, temporal inference {timings['temporal_inference_s']:.1f} s; "
        f"on the validation videos the decoder tuning preferred the {summary['temporal_selected_on_validation']} pipeline"
    )
    say(f"TorchScript vs eager logits: max abs difference {ts_diff:.2e}")
    say(f"event JSON: {events_file} (temporal: {temporal_events_file})")
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
