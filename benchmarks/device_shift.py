"""Leave-one-device-out: the gap on a capsule system never seen in training, and what each remedy recovers.

Every fold trains the bundle's demo-sized model (``train.json`` + ``demo.json``, the same code path as
``python -m monai.bundle run training``) on the videos of all capsule systems but one, tunes its decoder on their
validation videos, then runs the bundle's inference on held-out videos of the training systems (in-device) and on
videos of the left-out system (unseen), with and without each remedy, each a bundle option file:

- ``exam normalisation``: a model trained with ``exam_norm_train.json``, inferred with ``exam_norm_inference.json``
  (each exam's colour mean/std mapped to the training exams');
- ``TTA``: ``tta.json`` (logits averaged over flips and right-angle rotations);
- ``recalibration``: ``recalibration.json`` (thresholds and presence cut-offs quantile-matched per exam);
- ``self-training``: ``adapt.json`` (``run adapt``: an EMA teacher's confident pseudo-labels on the exams being
  read fine-tune the norm layers and the head for a fixed budget, then inference);
- ``BN head`` / ``BN head + AdaBN``: a model trained with ``head_batch_norm`` true, without and with ``adabn.json``
  (its BatchNorm statistics re-estimated on each exam);
- ``combination``: exam normalisation + TTA + recalibration + self-training, fixed before any measurement.

Generated data (default): a mini-Galar per fold, rendered with ``--devices`` (``generate_mini_galar(capsules=...)``);
the in-device and unseen test sets share their seed, so their videos have the same timelines and content and
differ only in the capsule's appearance. Generated devices are a proxy for real ones. With ``--dataset_dir`` the
same protocol runs on a Galar-layout folder: the ``capsule`` column of its ``metadata.csv`` names each video's
system; the videos of ``--holdout`` are the unseen set, a fifth of the others (label-stratified) the in-device
test set, the rest train and validate.

Scores (mean over the seeds): temporal mAP at tIoU 0.5 and 0.95 of the challenge events, frame mAP over the labels
present, lesion sensitivity at 1 false alarm per exam of the screening events (pathology pooled, overlap), and
seconds of inference per exam. ``gap recovered`` = (unseen mAP@0.5 of the arm - of ``none``) / (in-device - unseen
of ``none``). Results are saved per run under ``--out`` (a rerun skips finished runs).

Usage (from the repository root)::

    python benchmarks/device_shift.py --quick                       # one fold (NaviCam unseen), 2 seeds
    python benchmarks/device_shift.py --holdout all --seeds 3 4 5   # every fold
    python benchmarks/device_shift.py --dataset_dir /data/galar --holdout Olympus --seeds 0 \\
        --set backbone=hf-hub:microsoft/BiomedCLIP-PubMedBERT_256-vit_base_patch16_224 --set image_size=224
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
BUNDLE = REPO / "bundle"
CONFIGS = BUNDLE / "configs"

sys.path.insert(0, str(Path(__file__).resolve().parent))
from recipe import frame_mean_ap  # noqa: E402  (the benchmarks folder's shared frame-level score)

#: model -> the training option files (and overrides) it is trained with.
MODELS: dict[str, tuple[list[str], dict[str, Any]]] = {
    "base": ([], {}),
    "exam_norm": (["exam_norm_train.json"], {}),
    "bn_head": ([], {"head_batch_norm": True}),
}
#: arm -> (model, inference option files, run id)
ARMS: dict[str, tuple[str, list[str], str]] = {
    "none": ("base", [], "run"),
    "exam normalisation": ("exam_norm", ["exam_norm_inference.json"], "run"),
    "TTA": ("base", ["tta.json"], "run"),
    "recalibration": ("base", ["recalibration.json"], "run"),
    "self-training": ("base", ["adapt.json"], "adapt"),
    "BN head": ("bn_head", [], "run"),
    "BN head + AdaBN": ("bn_head", ["adabn.json"], "run"),
    "combination": (
        "exam_norm",
        ["exam_norm_inference.json", "tta.json", "recalibration.json", "adapt.json"],
        "adapt",
    ),
}
DEVICES = ("PillCam SB3", "Olympus", "NaviCam")


def _parse_value(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def _workflow(files: Sequence[str], workflow_type: str, override: dict[str, Any], run_id: str = "run") -> Any:
    from monai.bundle import ConfigWorkflow

    wf = ConfigWorkflow(
        config_file=[str(CONFIGS / f) for f in files],
        meta_file=str(CONFIGS / "metadata.json"),
        logging_file=False,
        workflow_type=workflow_type,
        run_id=run_id,
        **override,
    )
    wf.initialize()
    return wf


class Fold:
    """The data of one left-out system: a training folder (or video list), in-device and unseen test sets."""

    def __init__(self, holdout: str, args: argparse.Namespace) -> None:
        from monai_vce.workflows import ensure_mini_galar

        self.holdout = holdout
        self.root = Path(args.out) / holdout.replace(" ", "_")
        if args.dataset_dir:
            self._galar(args)
            return
        seen = [d for d in args.devices if d != holdout]
        common = {"frames_per_video": args.frames, "size": 64, "use_real_timelines": False, "progress": False}
        train = ensure_mini_galar(self.root / "train", videos=args.videos, seed=0, capsules=seen, **common)
        tests = {
            "in-device": ensure_mini_galar(self.root / "in", videos=args.heldout, seed=1, capsules=seen, **common),
            "unseen": ensure_mini_galar(
                self.root / "unseen", videos=args.heldout, seed=1, capsules=[holdout], **common
            ),
        }
        self.train = (train, None)
        self.tests = {k: (v, None) for k, v in tests.items()}

    def _galar(self, args: argparse.Namespace) -> None:
        from monai_vce.data import galar_datalist, split_videos, video_capsules

        caps = video_capsules(galar_datalist(args.dataset_dir))
        unseen = sorted(v for v, c in caps.items() if c == self.holdout)
        seen = [v for v in caps if v not in unseen]
        if not unseen or not seen:
            raise SystemExit(
                f"--holdout {self.holdout!r}: the capsules of {args.dataset_dir} are {sorted(set(caps.values()))}"
            )
        rest, test = split_videos(galar_datalist(args.dataset_dir, videos=seen), val_fraction=0.2, seed=0)
        ids = lambda datalist: sorted({str(d["video_id"]) for d in datalist})  # noqa: E731
        self.train = (args.dataset_dir, ids(rest))
        self.tests = {"in-device": (args.dataset_dir, ids(test)), "unseen": (args.dataset_dir, unseen)}


def _train(fold: Fold, model: str, seed: int, args: argparse.Namespace) -> Path:
    ckpt = fold.root / f"seed{seed}" / model / "models"
    if (ckpt / "model.pt").is_file() and (ckpt / "reference_quantiles.json").is_file():
        return ckpt
    files, extra = MODELS[model]
    folder, videos = fold.train
    override = {
        "bundle_root": str(BUNDLE),
        "dataset_dir": folder,
        "ckpt_dir": str(ckpt),
        "output_dir": str(ckpt.parent / "eval"),
        "seed": seed,
        "max_epochs": args.epochs,
        "val_interval": args.epochs,
        "progress": False,
        **extra,
        **args.overrides,
    }
    if videos is not None:
        override["datalist#videos"] = videos
    wf = _workflow(["train.json", "demo.json", *files], "train", override)
    wf.run()
    wf.finalize()
    return ckpt


def _evaluate(fold: Fold, arm: str, seed: int, test: str, args: argparse.Namespace) -> dict[str, Any]:
    from monai_vce.data import galar_datalist, galar_ground_truth
    from monai_vce.metrics import lesion_froc, temporal_map
    from monai_vce.utils import atomic_write_json

    run_dir = fold.root / f"seed{seed}" / "arms" / arm.replace(" ", "_").replace("+", "plus") / test
    result_file = run_dir / "result.json"
    if result_file.is_file():
        return json.loads(result_file.read_text())
    model, files, run_id = ARMS[arm]
    ckpt = _train(fold, model, seed, args)
    folder, videos = fold.tests[test]
    override = {
        "bundle_root": str(BUNDLE),
        "dataset_dir": folder,
        "ckpt_dir": str(ckpt),
        "output_dir": str(run_dir),
        "datalist": "$monai_vce.workflows.galar_datalist(@dataset_dir)",
        "resume": False,
        "report": False,
        "progress": False,
        "screening": True,
        **MODELS[model][1],
        **{k: v for k, v in args.overrides.items() if k in ("backbone", "image_size", "amp", "batch_size")},
    }
    if videos is not None:
        override["datalist"] = f"$monai_vce.workflows.galar_datalist(@dataset_dir, videos={videos!r})"
    t0 = time.perf_counter()
    wf = _workflow(["inference.json", "demo.json", *files], "infer", override, run_id=run_id)
    events = Path(wf.parser.get_parsed_content("events_file"))
    screening = Path(wf.parser.get_parsed_content("screening_events_file"))
    probs_dir = Path(wf.parser.get_parsed_content("probs_dir"))
    wf.run()
    wf.finalize()
    seconds = time.perf_counter() - t0
    gt = galar_ground_truth(folder, videos=videos)
    score = temporal_map(gt, json.loads(events.read_text()))
    froc = lesion_froc(gt, json.loads(screening.read_text()), false_alarm_rates=(1.0,))
    result = {
        "arm": arm,
        "seed": seed,
        "test": test,
        "mAP@0.5": float(score["mAP@0.5"]),
        "mAP@0.95": float(score["mAP@0.95"]),
        "frame_mAP": frame_mean_ap(galar_datalist(folder, videos=videos), probs_dir),
        "sensitivity@1FA": froc["overall"]["overlap"]["sensitivity"]["1"],
        "seconds_per_exam": seconds / max(1, len(gt["videos"])),
    }
    atomic_write_json(result_file, result)
    return result


def _mean(rows: list[dict[str, Any]], key: str) -> float:
    values = [r[key] for r in rows if r.get(key) is not None]
    return float(np.mean(values)) if values else float("nan")


def summarise(results: list[dict[str, Any]], arms: Sequence[str]) -> tuple[str, dict[str, dict[str, float]]]:
    """The table (markdown) and, per arm, the mean scores, the gap recovered and the in-device change."""
    by: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in results:
        by.setdefault((r["arm"], r["test"]), []).append(r)
    base_in, base_un = (_mean(by.get(("none", t), []), "mAP@0.5") for t in ("in-device", "unseen"))
    base_s = _mean(by.get(("none", "unseen"), []), "seconds_per_exam")
    gap = base_in - base_un
    lines = [
        "| remedy | in-device mAP@0.5 | unseen mAP@0.5 | gap recovered | in-device change | unseen mAP@0.95 | "
        "unseen frame mAP | unseen sens@1FA | cost (x inference time) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    summary: dict[str, dict[str, float]] = {}
    for arm in arms:
        rin, run = by.get((arm, "in-device"), []), by.get((arm, "unseen"), [])
        if not rin or not run:
            continue
        m_in, m_un = _mean(rin, "mAP@0.5"), _mean(run, "mAP@0.5")
        recovered = (m_un - base_un) / gap if gap > 0 else float("nan")
        cost = _mean(run, "seconds_per_exam") / base_s if base_s > 0 else float("nan")
        summary[arm] = {"in": m_in, "unseen": m_un, "recovered": recovered, "in_change": m_in - base_in}
        lines.append(
            f"| {arm} | {m_in:.4f} | {m_un:.4f} | {100 * recovered:.0f} % | {m_in - base_in:+.4f} | "
            f"{_mean(run, 'mAP@0.95'):.4f} | {_mean(run, 'frame_mAP'):.4f} | {_mean(run, 'sensitivity@1FA'):.3f} | "
            f"{cost:.1f} |"
        )
    return "\n".join(lines), summary


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(REPO / "runs" / "device_shift"), help="output folder")
    parser.add_argument("--quick", action="store_true", help="one fold (NaviCam unseen), seeds 0 1, 15 epochs")
    parser.add_argument("--devices", default=",".join(DEVICES), help="capsule systems of the generated folds")
    parser.add_argument("--holdout", default="NaviCam", help="the unseen system, or 'all' (one fold each)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="training seeds")
    parser.add_argument("--epochs", type=int, default=15, help="epochs of 800 sampled frames")
    parser.add_argument("--videos", type=int, default=16, help="generated training videos per fold")
    parser.add_argument("--heldout", type=int, default=8, help="generated test videos per set")
    parser.add_argument("--frames", type=int, default=300, help="frames per generated video")
    parser.add_argument("--arms", nargs="+", default=list(ARMS), help=f"arms, of {list(ARMS)}")
    parser.add_argument("--dataset_dir", default=None, help="a Galar-layout folder instead of generated data")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a bundle override")
    args = parser.parse_args(argv)
    if args.quick:
        args.seeds, args.epochs, args.heldout = [0, 1], 15, 6
    args.devices = [d.strip() for d in args.devices.split(",") if d.strip()]
    args.overrides = {k: _parse_value(v) for k, _, v in (s.partition("=") for s in args.set)}
    unknown = [a for a in args.arms if a not in ARMS]
    if unknown or "none" not in args.arms:
        parser.error(f"arms must include 'none' and be of {list(ARMS)} (unknown: {unknown})")
    holdouts = args.devices if args.holdout == "all" else [args.holdout]
    logging.basicConfig(level=logging.WARNING)
    warnings.filterwarnings("ignore")

    t0 = time.perf_counter()
    results = []
    for holdout in holdouts:
        fold = Fold(holdout, args)
        for seed in args.seeds:
            for arm in args.arms:
                for test in ("in-device", "unseen"):
                    r = _evaluate(fold, arm, seed, test, args)
                    results.append({**r, "fold": holdout})
                    print(
                        f"{holdout:12s} seed {seed} {arm:20s} {test:9s}: mAP@0.5 {r['mAP@0.5']:.4f}  "
                        f"mAP@0.95 {r['mAP@0.95']:.4f}  frame mAP {r['frame_mAP']:.4f}  "
                        f"({r['seconds_per_exam']:.1f} s/exam)",
                        flush=True,
                    )
    print(f"\n{len(results)} runs in {time.perf_counter() - t0:.0f} s; unseen: {', '.join(holdouts)}\n")
    table, summary = summarise(results, args.arms)
    print(table)
    best = "combination" if "combination" in summary else max(summary, key=lambda a: summary[a]["recovered"])
    s, base = summary[best], summary["none"]
    print(
        f"\nunseen-device gap recovered: {100 * s['recovered']:.0f} % (gap {base['in'] - base['unseen']:.4f}, "
        f"in-device change {s['in_change']:+.4f})"
    )


if __name__ == "__main__":
    main()
