"""The offline demo of the bundle: train, validate, tune, export and infer on generated data, in minutes on a CPU.

``python -m monai_vce.demo`` writes under ``<bundle>/demo/`` (log: ``demo.log``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
import time
import traceback
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from monai_vce.cli import command_main, print_error
from monai_vce.events import describe_events_file, load_events, read_frame_units
from monai_vce.metrics import temporal_map
from monai_vce.utils import atomic_write_json, error_summary

__all__ = ["run_demo", "main"]

#: ``bundle/`` of this checkout: the demo's bundle when the working folder is not a checkout's root or bundle.
DEMO_BUNDLE = Path(__file__).resolve().parents[1] / "bundle"


def demo_bundle() -> Path:
    """The bundle the demo runs: the working folder's (``bundle/`` from a checkout's root, ``.`` from inside the
    bundle), where the documented commands that follow it read its outputs; else :data:`DEMO_BUNDLE`."""
    for here in (Path("bundle"), Path(".")):
        if (here / "configs" / "metadata.json").is_file():
            return here
    return DEMO_BUNDLE


def _shown_path(path: Path | str) -> str:
    """``path`` relative to the working folder when it lies inside it (as the documented commands write it)."""
    try:
        return str(Path(path).resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def _configs(bundle: Path, *names: str) -> list[str]:
    return [_shown_path(bundle / "configs" / name) for name in (*names, "demo.json")]


def _command(step: str, configs: list[str], extra: str = "") -> str:
    files = ",".join(f"'{c}'" for c in configs)
    return f'python -m monai.bundle {step} --config_file "[{files}]"{extra}'


#: Third-party warnings the demo understands and does not show: TorchScript's deprecation notices (the bundle's
#: export format is TorchScript, which MONAI's ``ckpt_export`` writes).
_UNDERSTOOD_WARNINGS: tuple[tuple[str, str], ...] = ((r"`torch\.jit\.\w+` is deprecated", "FutureWarning"),)


class _Console:
    """Where the demo's logs go: everything to ``log_file``, and to the console only what a user needs.

    MONAI applies the bundle's ``logging.conf`` (INFO on stdout) whenever a workflow starts; :meth:`apply` then
    lowers the console to warnings while progress bars are drawn (a terminal), so that per-epoch lines do not
    break the bars, and adds the log file. ``verbose`` keeps the console at INFO.
    """

    def __init__(self, log_file: Path, verbose: bool) -> None:
        self.log_file = log_file
        self.verbose = verbose
        self._file: logging.Handler | None = None

    def _handler(self) -> logging.Handler:
        if self._file is None:
            self.log_file.parent.mkdir(parents=True, exist_ok=True)
            self.log_file.write_text("")  # a fresh log per run
            # appending: MONAI's logging config (logging.config.fileConfig) closes every handler when a workflow
            # starts, and a closed "w" handler never reopens (the log kept one line); an "a" one reopens on emit
            self._file = logging.FileHandler(self.log_file, mode="a", encoding="utf-8")
            self._file.setFormatter(logging.Formatter("%(asctime)s - %(name)s - %(levelname)s - %(message)s"))
        return self._file

    def apply(self) -> None:
        """Lower the console handlers MONAI's logging config (and MONAI's named loggers) installed; log to the file."""
        root = logging.getLogger()
        quiet = not (self.verbose or not sys.stderr.isatty())
        level = logging.WARNING if quiet else logging.INFO
        loggers = [root, *(g for g in logging.Logger.manager.loggerDict.values() if isinstance(g, logging.Logger))]
        for g in loggers:
            for h in g.handlers:
                if isinstance(h, logging.StreamHandler) and getattr(h, "stream", None) in (sys.stdout, sys.stderr):
                    h.setLevel(max(h.level, level))
        # the note each workflow logs when it applies the bundle's logging config, and ckpt_export's input summary
        for name in ("monai.bundle.workflows", "monai.bundle.scripts"):
            logging.getLogger(name).setLevel(logging.WARNING if quiet else logging.NOTSET)
        if self._handler() not in root.handlers:
            root.addHandler(self._handler())
        root.setLevel(min(root.level or logging.INFO, logging.INFO))

    def to_file(self, message: str) -> None:
        """Write an error to the log file only."""
        record = logging.LogRecord("monai_vce.demo", logging.ERROR, __file__, 0, message, None, None)
        self._handler().handle(record)

    def close(self) -> None:
        if self._file is not None:
            logging.getLogger().removeHandler(self._file)
            self._file.close()


#: The console of the running demo (``main``), applied whenever a workflow has set up MONAI's logging.
_CONSOLES: list[_Console] = []


@contextlib.contextmanager
def _understood_warnings() -> Iterator[None]:
    """Hide the understood third-party warnings; others show as usual."""
    categories = {"FutureWarning": FutureWarning}
    with warnings.catch_warnings():
        for pattern, category in _UNDERSTOOD_WARNINGS:
            warnings.filterwarnings("ignore", message=pattern, category=categories[category])
        yield


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
    for console in _CONSOLES:
        console.apply()
    wf.initialize()
    for console in _CONSOLES:  # handlers that components added while the config was parsed
        console.apply()
    return wf


def run_demo(
    bundle_root: str | Path | None = None, max_epochs: int | None = None, quiet: bool = False
) -> dict[str, Any]:
    """Run the demo chain and return its summary (paths, scores, timings).

    Args:
        bundle_root: the bundle folder (default: :func:`demo_bundle`).
        max_epochs: override of the demo's number of epochs.
        quiet: do not print the step headers and the summary.
    """
    import torch
    from monai.bundle import ckpt_export

    bundle = Path(bundle_root if bundle_root is not None else demo_bundle()).resolve()
    say = (lambda *a: None) if quiet else (lambda *a: print(*a, flush=True))
    timings: dict[str, float] = {}
    extra = {} if max_epochs is None else {"max_epochs": int(max_epochs)}

    # 1. training
    train_cfg = _configs(bundle, "train.json")
    say(f"\n== 1/6 training: {_command('run training', train_cfg)}")
    t0 = time.perf_counter()
    wf = _workflow(train_cfg, bundle, "train", **extra)
    ckpt_dir = Path(wf.parser.get_parsed_content("ckpt_dir"))
    demo_dir = Path(wf.parser.get_parsed_content("demo_dir"))
    wf.run()
    wf.finalize()
    timings["training_s"] = time.perf_counter() - t0

    # 2. the temporal stage: refiner cross-fitted on the validation outputs, decoder tuned on refined probabilities
    temporal_cfg = _configs(bundle, "train.json", "temporal_train.json")
    say(f"\n== 2/6 temporal stage: {_command('run temporal', temporal_cfg)}")
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
    # scripted, not traced: a trace records only the float path of the network's forward, so a traced model.ts would
    # take uint8 frames without an error and compute wrong logits; the scripted one takes both, at any size
    export_args = f" --filepath {model_ts} --ckpt_file {model_pt}"
    say(f"\n== 3/6 export: {_command('ckpt_export network_def', infer_cfg, export_args)}")
    t0 = time.perf_counter()
    ckpt_export(
        net_id="network_def",
        filepath=str(model_ts),
        ckpt_file=str(model_pt),
        meta_file=str(bundle / "configs" / "metadata.json"),
        config_file=infer_cfg,
        bundle_root=str(bundle),
    )
    wf_inf = _workflow(infer_cfg, bundle, "infer")
    net = wf_inf.parser.get_parsed_content("network_def").eval()
    net.load_state_dict(torch.load(model_pt, map_location="cpu", weights_only=True))
    x = torch.rand(2, 3, size, size, generator=torch.Generator().manual_seed(0))
    frames = (x * 255).round().to(torch.uint8)
    scripted = torch.jit.load(str(model_ts), map_location="cpu")
    with torch.no_grad():
        ts_diff = max(float((scripted(x) - net(x)).abs().max()), float((scripted(frames) - net(frames)).abs().max()))
    timings["export_s"] = time.perf_counter() - t0

    # 4. inference on held-out generated videos (their label CSVs give frame_index: the ground truth's units)
    test_dir = Path(wf_inf.parser.get_parsed_content("test_dir"))
    wf_inf.finalize()
    override = {"dataset_dir": str(test_dir), "resume": False}
    shown = f" --dataset_dir {_shown_path(test_dir)} --resume False"

    def infer(stage: str, configs: list[str]) -> tuple[Path, Path]:
        """Run one inference stage as its printed command does; its event file and probability folder."""
        say(f"\n== {stage}: {_command('run', configs, shown)}")
        wf = _workflow(configs, bundle, "infer", **override)
        events = Path(wf.parser.get_parsed_content("events_file"))
        probs = Path(wf.parser.get_parsed_content("probs_dir"))
        wf.run()
        wf.finalize()
        return events, probs

    t0 = time.perf_counter()
    events_file, probs_dir = infer("4/6 inference", infer_cfg)
    timings["inference_s"] = time.perf_counter() - t0

    # ... and frame model -> refiner -> decoder, reusing the frame model's probability files of the same folder
    temporal_infer_cfg = _configs(bundle, "inference.json", "temporal_inference.json")
    override["resume"] = True  # reuse the frame model's files written just above
    shown = shown.replace(" --resume False", "")
    t0 = time.perf_counter()
    temporal_events_file, _ = infer("5/6 temporal inference", temporal_infer_cfg)
    timings["temporal_inference_s"] = time.perf_counter() - t0

    # 5. scoring against the held-out ground truth, and the empty submission's score
    gt = load_events(test_dir / "ground_truth.json")
    pred = load_events(events_file)
    empty = {"videos": [{"video_id": v["video_id"], "events": []} for v in gt["videos"]]}
    score, score_empty = temporal_map(gt, pred), temporal_map(gt, empty)
    score_temporal = temporal_map(gt, load_events(temporal_events_file))
    summary = {
        "events_file": str(events_file),
        "probs_dir": str(probs_dir),
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
    summary["frame_units"] = None if (units := read_frame_units(events_file)) is None else units.value
    atomic_write_json(demo_dir / "summary.json", summary)
    metric_cmd = f"python -m monai_vce metrics --gt {_shown_path(test_dir / 'ground_truth.json')} --events {_shown_path(events_file)}"
    say(f"\n== 6/6 held-out temporal mAP on {len(gt['videos'])} videos: {metric_cmd}")
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
    say(f"event JSON: {describe_events_file(_shown_path(events_file), units)}")
    say(
        f"temporal event JSON: {describe_events_file(_shown_path(temporal_events_file), read_frame_units(temporal_events_file))}"
    )
    say(f"summary: {demo_dir / 'summary.json'}")
    return summary


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``demo`` command to ``subparsers``; returns its parser."""
    p = subparsers.add_parser(
        "demo",
        description="The offline demo of the bundle: train, validate, tune, export and infer on generated data, "
        "in minutes on a CPU; everything is written under <bundle>/demo/, the full log to <bundle>/demo/demo.log.",
    )
    p.add_argument("--bundle-root", default=None, help="bundle folder (default: bundle/ of this repository)")
    p.add_argument("--max-epochs", type=int, default=None, help="override the demo's number of epochs")
    p.add_argument("--quiet", action="store_true", help="print nothing but errors")
    p.add_argument("--verbose", action="store_true", help="also print the full log on the console")
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch's intra-op threads (default: OMP_NUM_THREADS when set, else 1: the tiny network gains nothing "
        "from more, and on a busy machine they wait on each other)",
    )
    p.set_defaults(run=run, own_console=True)  # its console, log file and last error line are its own
    return p


def run(args: argparse.Namespace) -> int:
    """Run the demo of ``args``; returns the exit code (0, or 1 when it failed: the error's one line is printed last)."""
    threads = args.threads if args.threads is not None else (None if os.environ.get("OMP_NUM_THREADS") else 1)
    if threads is not None:
        import torch

        torch.set_num_threads(max(int(threads), 1))
    bundle = Path(args.bundle_root if args.bundle_root is not None else demo_bundle())
    console = _Console(bundle / "demo" / "demo.log", args.verbose)
    _CONSOLES.append(console)
    try:
        console.apply()
        with _understood_warnings():
            summary = run_demo(args.bundle_root, max_epochs=args.max_epochs, quiet=args.quiet)
    except Exception as e:  # the full traceback goes to the log; the one-line cause is the last line shown
        console.to_file(f"the demo failed:\n{traceback.format_exc()}")
        print(f"\nthe demo failed; full traceback in {_shown_path(console.log_file)}", file=sys.stderr)
        print_error(error_summary(e))
        return 1
    finally:
        _CONSOLES.remove(console)
        console.close()
    if args.quiet:
        print(json.dumps(summary))
    else:
        print(f"log: {_shown_path(console.log_file)}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m monai_vce.demo``, the same as ``python -m monai_vce demo``; returns the exit code."""
    return command_main(add_parser, argv, "python -m monai_vce.demo")


if __name__ == "__main__":
    sys.exit(main())
