"""Reduced inference: frames through the network vs temporal mAP, against full inference.

Two measurements, one table each.

``simulated`` (default). Frame probabilities of the 80 real Galar timelines are simulated
(:func:`monai_vce.postprocessing.simulate_probabilities`, one draw per video and noise level); the network is
replaced by a lookup into them, so every frame a method asks for is "inferred" at no cost and the methods differ
only in which frames they look at. The decoder is tuned as in ``benchmarks/decoding.py``
(:func:`~monai_vce.postprocessing.tune_decoder`, 2 rounds), cross-fitted: the videos are dealt into ``--folds``
folds and each fold is decoded with the decoder tuned on the other folds, so every video is scored held out.
For each method the table gives the share of all frames passed to ``predict``, the temporal mAP
(:func:`monai_vce.metrics.temporal_map`, all 80 videos) and its change against full inference of the same draw,
and the refinement rounds (``predict`` calls per video). Methods: full inference (``stride=1``), strided
inference with logit interpolation for ``--strides``, and coarse-to-fine refinement for each ``--refine``
setting. Tuned decoders are cached in ``--work-dir`` (keyed by noise, folds, seed and rounds).

The table also gives the lesion sensitivity at 2 false alarms per exam (:func:`monai_vce.metrics.lesion_froc`,
pathology pooled, found by overlap) and the blind spot: the share of the short pathology lesions (1-3 frames) of
which the method never passed a frame to ``predict``.

``--levels`` takes levels and the families of :data:`~monai_vce.postprocessing.NOISE_FAMILIES`. ``--noise
NAME=JSON`` adds a noise variant: a level or family with keys overridden, e.g. ``'correlated={"base": "low", "rho": 0.98, "flicker_length": 8}'`` (frame noise correlated
over longer stretches, flicker in runs, as when a capsule lingers).

``pipeline``. The bundle's inference as users run it (``inference.json`` + ``demo.json`` through
``monai.bundle``, the reduction keys set per run) with the tiny model trained once with the demo's settings
(``python -m monai.bundle run training --config_file "['bundle/configs/train.json','bundle/configs/demo.json']"``,
into ``--work-dir``, or ``--ckpt-dir`` of a trained run) on generated mini-Galar test videos of the demo's
distribution (another seed): wall time of the inference run (model loading, PNG decoding in the loader, network,
per-video files, events), frames inferred and temporal mAP against the test videos' ground truth, of full
inference, strided inference, coarse-to-fine refinement (also with the novelty guard) and near-duplicate skipping,
side by side in one run, and the blind spot as above, from the ``inferred`` mask of the probability files.

Usage (from the repository root)::

    python benchmarks/frame_reduction.py simulated --work-dir /tmp/frame_reduction
    python benchmarks/frame_reduction.py simulated --quick          # 16 videos, one level, for a fast check
    python benchmarks/frame_reduction.py simulated --levels ramp white correlated red blind bursts miscalibrated --seed 11
    python benchmarks/frame_reduction.py pipeline --work-dir /tmp/frame_reduction_pipeline
    python benchmarks/frame_reduction.py pipeline --real-timelines --frames 1500 --min-event-frames 1 --seed 5
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from monai_vce.data.synthetic import find_galar_events

GALAR = find_galar_events()  # MONAI_VCE_GALAR_EVENTS, else shared/data beside the checkout

#: Coarse-to-fine settings measured by default (``adaptive_inference`` keyword arguments).
DEFAULT_REFINE = ('{"stride": 8}', '{"stride": 8, "margin": 0.5, "score_tolerance": 0.05}')


def _load(path: str | os.PathLike) -> dict[str, Any]:
    return json.loads(Path(path).read_text())


def noise_variants(levels: Sequence[str], extra: Sequence[str]) -> dict[str, dict[str, float] | str]:
    """``{name: level}``: the named levels, then ``NAME=JSON`` variants (``"base"`` names the level they modify)."""
    from monai_vce.postprocessing import noise_settings

    out: dict[str, dict[str, float] | str] = {name: name for name in levels}
    for spec in extra:
        name, _, text = spec.partition("=")
        cfg = json.loads(text)
        base = cfg.pop("base", "medium")
        out[name] = {**noise_settings(base), **cfg}
    return out


def simulate(videos: Sequence[dict], level: dict | str, seed: int) -> list[tuple[np.ndarray, np.ndarray, list]]:
    """``(probs, frame ids, events)`` of every video, drawn as ``benchmarks/decoding.py`` draws them."""
    from monai_vce.events import Video
    from monai_vce.postprocessing import events_to_frames, simulate_probabilities

    out = []
    for j, v in enumerate(videos):
        ids = np.arange(max(e["end"] for e in v["events"]) + 1)
        probs = simulate_probabilities(events_to_frames(v["events"], ids), level, seed=[seed, j])
        out.append(Video(v["video_id"], probs, ids, ids, events=v["events"]))
    return out


def tuned_decoders(sim: Sequence, folds: np.ndarray, level: dict | str, seed: int, rounds: int, work_dir: Path) -> list:
    """One decoder per fold, tuned on the other folds' videos (cached in ``work_dir``)."""
    from monai_vce.postprocessing import DecoderParams, tune_decoder

    key = json.dumps({"level": level, "folds": int(folds.max() + 1), "seed": seed, "rounds": rounds}, sort_keys=True)
    tag = hashlib.sha1(key.encode()).hexdigest()[:10]
    out = []
    for f in range(int(folds.max()) + 1):
        path = work_dir / f"decoder_{tag}_fold{f}.json"
        if path.is_file():
            out.append(DecoderParams.load(path))
            continue
        t = time.perf_counter()
        params = tune_decoder([sim[i] for i in np.flatnonzero(folds != f)], rounds=rounds, seed=seed)
        params.save(path)
        print(f"  tuned fold {f} in {time.perf_counter() - t:.0f} s -> {path}", file=sys.stderr, flush=True)
        out.append(params)
    return out


def short_lesions(events: Sequence[dict], longest: int = 3) -> list[tuple[int, int]]:
    """``(start, end)`` frames of the pathology lesions (maximal label runs) of at most ``longest`` frames."""
    from monai_vce.labels import PATHOLOGY
    from monai_vce.metrics import label_runs

    out = []
    for name in PATHOLOGY:
        runs, _ = label_runs(events, name)
        out += [(int(a), int(b)) for a, b in runs if b - a + 1 <= longest]
    return out


def run_method(sim: Sequence, videos: Sequence[dict], decoders: list, folds: np.ndarray, kwargs: dict) -> dict:
    """Reduced inference of every video with a lookup as the network; events, frames inferred, calls, time, and
    the short lesions of which no frame was inferred."""
    from monai_vce.inference import adaptive_inference
    from monai_vce.postprocessing import EventDecoder

    decs = [EventDecoder(p) for p in decoders]
    pred, inferred, frames, calls, short, unseen = [], 0, 0, [], 0, 0
    t = time.perf_counter()
    for j, video in enumerate(sim):
        probs, ids = video.probs, video.frame_index
        n = [0]

        def lookup(rows: np.ndarray, probs: np.ndarray = probs, n: list = n) -> np.ndarray:
            n[0] += 1
            return probs[rows]

        dec = decs[int(folds[j])]
        filled, mask = adaptive_inference(lookup, len(probs), dec, video_id=videos[j]["video_id"], **kwargs)
        pred.append({"video_id": videos[j]["video_id"], "events": dec(filled, ids)})
        inferred += int(mask.sum())
        frames += len(probs)
        for a, b in short_lesions(videos[j]["events"]):  # frame ids are row indices here
            short += 1
            unseen += not mask[a : b + 1].any()
        calls.append(n[0])
    return {
        "pred": {"videos": pred},
        "fraction": inferred / frames,
        "calls": float(np.mean(calls)),
        "max_calls": int(np.max(calls)),
        "short_lesions": short,
        "unseen_short": unseen,
        "seconds": time.perf_counter() - t,
    }


def method_name(kwargs: dict) -> str:
    if kwargs.get("stride", 8) == 1:
        return "full"
    if not kwargs.get("refine", True):
        return f"strided k={kwargs['stride']}"
    rest = ", ".join(f"{k} {v}" for k, v in kwargs.items() if k != "stride")
    return f"coarse-to-fine k={kwargs.get('stride', 8)}" + (f" ({rest})" if rest else "")


def cmd_simulated(args: argparse.Namespace) -> None:
    from monai_vce.metrics import lesion_froc, temporal_map
    from monai_vce.postprocessing import video_folds

    videos = _load(args.gt)["videos"]
    levels = args.levels
    if args.quick:
        videos, levels = videos[:16], levels[:1]
    work_dir = Path(args.work_dir or tempfile.mkdtemp(prefix="frame_reduction_"))
    work_dir.mkdir(parents=True, exist_ok=True)
    folds = video_folds(len(videos), args.folds, args.seed)
    methods = [{"stride": 1}] + [{"stride": k, "refine": False} for k in args.strides]
    methods += [json.loads(text) for text in args.refine]
    load = os.getloadavg()
    print(
        f"{len(videos)} videos ({args.folds}-fold cross-fitted decoders, {args.rounds} tuning rounds), seed {args.seed}; "
        f"load average before: {load[0]:.2f}, {load[1]:.2f}, {load[2]:.2f} on {os.cpu_count()} cores",
        flush=True,
    )
    rows = []
    for name, level in noise_variants(levels, args.noise).items():
        sim = simulate(videos, level, args.seed)
        decoders = tuned_decoders(sim, folds, level, args.seed, args.rounds, work_dir)
        gt = {"videos": [{"video_id": v["video_id"], "events": v["events"]} for v in videos]}
        base = None
        for kwargs in methods:
            res = run_method(sim, videos, decoders, folds, kwargs)
            score = temporal_map(gt, res["pred"], validate=False)
            m5, m95 = score["mAP@0.5"], score["mAP@0.95"]
            froc = lesion_froc(gt, res["pred"], false_alarm_rates=(2.0,), validate=False)["overall"]["overlap"]
            res["sensitivity"] = froc["sensitivity"]["2"] or 0.0
            if base is None:
                base = (m5, m95)
            rows.append((name, method_name(kwargs), res, m5, m95, m5 - base[0], m95 - base[1]))
            print(
                f"[{name}] {method_name(kwargs)}: {100 * res['fraction']:.1f}% frames, "
                f"mAP {m5:.4f} / {m95:.4f} ({res['seconds']:.0f} s)",
                file=sys.stderr,
                flush=True,
            )
    load = os.getloadavg()
    print(f"load average after: {load[0]:.2f}, {load[1]:.2f}, {load[2]:.2f}")
    print()
    print(
        "| noise | method | frames inferred | mAP@0.5 | change | mAP@0.95 | change | lesions @2 FA | "
        "short lesions never inferred | predict calls per video (max) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, method, res, m5, m95, d5, d95 in rows:
        blind = f"{res['unseen_short']} / {res['short_lesions']}"
        print(
            f"| {name} | {method} | {100 * res['fraction']:.1f}% | {m5:.4f} | {d5:+.4f} | {m95:.4f} | {d95:+.4f} | "
            f"{res['sensitivity']:.3f} | {blind} | {res['calls']:.1f} ({res['max_calls']}) |"
        )


BUNDLE = Path(__file__).resolve().parents[1] / "bundle"

#: Novelty guard tolerances of the pipeline table (mean grey levels, 0-255, of the 16 x 16 signatures; the
#: generated frames differ from the interpolation of their stride-8 neighbours by about 15 at the median).
NOVELTY_TOLERANCES = (16.0, 24.0)

#: Inference settings of the pipeline table: ``(name, reduction keys of inference.json)``.
PIPELINE_METHODS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("full", {}),
    ("every frame, reduced-inference driver (budget 1.0)", {"budget": 1.0}),
    ("strided k=2", {"stride": 2, "refine": False}),
    ("strided k=4", {"stride": 4, "refine": False}),
    ("strided k=8", {"stride": 8, "refine": False}),
    ("coarse-to-fine k=4", {"stride": 4}),
    ("coarse-to-fine k=8", {"stride": 8}),
    ("coarse-to-fine k=16", {"stride": 16}),
    ("coarse-to-fine k=8, margin 0.1", {"stride": 8, "margin": 0.1}),
    *((f"coarse-to-fine k=8, novelty guard {t:g}", {"stride": 8, "novelty_tolerance": t}) for t in NOVELTY_TOLERANCES),
)


def bundle_workflow(configs: Sequence[str], workflow_type: str, **override: Any) -> Any:
    """A ``monai.bundle`` workflow of the bundle's configs (plus ``demo.json``), as ``python -m monai.bundle run``
    builds it, initialised."""
    from monai.bundle import ConfigWorkflow

    wf = ConfigWorkflow(
        config_file=[str(BUNDLE / "configs" / c) for c in (*configs, "demo.json")],
        meta_file=str(BUNDLE / "configs" / "metadata.json"),
        logging_file=str(BUNDLE / "configs" / "logging.conf"),
        workflow_type=workflow_type,
        bundle_root=str(BUNDLE),
        **override,
    )
    wf.initialize()
    return wf


def trained_model(work_dir: Path) -> Path:
    """The checkpoint folder of the tiny model trained once with the demo's settings (trained when missing)."""
    demo_dir = work_dir / "demo"
    models = demo_dir / "models"
    if not (models / "model.pt").is_file() or not (models / "decoder.json").is_file():
        print(
            "training the tiny model with the demo settings: python -m monai.bundle run training --config_file "
            f"\"['bundle/configs/train.json','bundle/configs/demo.json']\" --demo_dir {demo_dir} --progress False",
            file=sys.stderr,
            flush=True,
        )
        wf = bundle_workflow(["train.json"], "train", demo_dir=str(demo_dir), progress=False)
        wf.run()
        wf.finalize()
    return models


def inferred_frames(probs_dir: Path, gt: dict | None = None) -> tuple[int, int, int, int]:
    """``(frames inferred, frames, short lesions never inferred, short lesions)`` over the probability files of a
    run (no ``inferred`` mask: every frame); the short pathology lesions (:func:`short_lesions`) are those of
    ``gt`` (events in ``frame_index`` units, matched to the files' rows by their ``frame_index``)."""
    from monai_vce.events.probabilities import load_video_probs, probability_files

    events = {v["video_id"]: v["events"] for v in (gt or {}).get("videos", [])}
    inferred = frames = unseen = short = 0
    for vid, path in probability_files(probs_dir).items():
        video = load_video_probs(path)
        frames += len(video)
        mask = np.ones(len(video), bool) if video.inferred is None else np.asarray(video.inferred, bool)
        inferred += int(mask.sum())
        for a, b in short_lesions(events.get(vid, [])):
            short += 1
            unseen += not mask[(video.frame_index >= a) & (video.frame_index <= b)].any()
    return inferred, frames, unseen, short


def cmd_pipeline(args: argparse.Namespace) -> None:
    import torch

    from monai_vce.metrics import temporal_map
    from monai_vce.workflows import ensure_mini_galar

    torch.set_num_threads(args.threads)
    work_dir = Path(args.work_dir or tempfile.mkdtemp(prefix="frame_reduction_"))
    models = Path(args.ckpt_dir) if args.ckpt_dir else trained_model(work_dir)
    real = f"_galar_min{args.min_event_frames}" if args.real_timelines else ""
    data = ensure_mini_galar(
        work_dir / f"test_{args.videos}x{args.frames}_seed{args.seed}{real}",
        videos=args.videos,
        frames_per_video=args.frames,
        size=64,
        seed=args.seed,
        use_real_timelines=args.real_timelines,
        min_event_frames=args.min_event_frames,
    )
    gt = _load(Path(data) / "ground_truth.json")
    methods = list(PIPELINE_METHODS) + [
        (f"near-duplicate tolerance {t:g}", {"duplicate_tolerance": t}) for t in args.duplicate_tolerances
    ]
    methods += [
        (f"coarse-to-fine k=8, novelty guard {t:g}", {"stride": 8, "novelty_tolerance": t})
        for t in args.novelty_tolerances
        if t not in NOVELTY_TOLERANCES  # in PIPELINE_METHODS already
    ]
    load = os.getloadavg()
    print(
        f"bundle inference (inference.json + demo.json) of the tiny model trained with the demo settings ({models}) "
        f"on a generated mini-Galar test set: {args.videos} videos x {args.frames} frames, 64 px PNG, seed "
        f"{args.seed}; batch {args.batch_size}, {args.workers} workers, {args.threads} threads, best wall time of "
        f"{args.repeats}; load average before: {load[0]:.2f}, {load[1]:.2f}, {load[2]:.2f} on {os.cpu_count()} cores",
        flush=True,
    )

    def infer(name: str, reduction: dict[str, Any]) -> tuple[float, Path]:
        out = work_dir / "runs" / Path(data).name / name.replace(" ", "_").replace("=", "").replace(",", "")
        shutil.rmtree(out, ignore_errors=True)  # the files of this run only
        keys = {
            "stride": 1, "refine": True, "budget": None, "margin": 0.3, "duplicate_tolerance": 0.0,
            "novelty_tolerance": 0.0,
        }  # fmt: skip
        wf = bundle_workflow(
            ["inference.json"],
            "infer",
            dataset_dir=str(data),
            ckpt_dir=str(models),
            output_dir=str(out),
            batch_size=args.batch_size,
            num_workers=args.workers,
            resume=False,
            progress=False,
            report=False,
            reduction={**keys, "options": {}, **reduction},
        )
        # the DataLoader workers of earlier runs in this process are stopped when collected (seconds each): not here
        gc.collect()
        t = time.perf_counter()
        wf.run()
        wall = time.perf_counter() - t
        wf.finalize()
        return wall, out

    for reduction in ({}, {"stride": 8}):  # page cache, lazy imports of both paths
        infer("warm-up", reduction)
    rows = []
    for name, reduction in methods:
        walls = []
        for _ in range(args.repeats):
            wall, out = infer(name, reduction)
            walls.append(wall)
        score = temporal_map(gt, _load(out / "events.json"))
        inferred, frames, unseen, short = inferred_frames(out / "probs", gt)
        rows.append((name, min(walls), inferred, frames, score["mAP@0.5"], score["mAP@0.95"], unseen, short))
        print(
            f"[{name}] {inferred}/{frames} frames, {min(walls):.2f} s, mAP {score['mAP@0.5']:.4f} / "
            f"{score['mAP@0.95']:.4f}",
            file=sys.stderr,
            flush=True,
        )
    load = os.getloadavg()
    print(f"load average after: {load[0]:.2f}, {load[1]:.2f}, {load[2]:.2f}")
    print()
    print(
        "| inference | frames inferred | wall s | frames of the videos/s | mAP@0.5 | change | mAP@0.95 | change | "
        "short lesions never inferred |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    base5, base95 = rows[0][4], rows[0][5]
    for name, wall, inferred, frames, m5, m95, unseen, short in rows:
        print(
            f"| {name} | {inferred}/{frames} ({100 * inferred / frames:.1f}%) | {wall:.2f} | {frames / wall:.0f} | "
            f"{m5:.4f} | {m5 - base5:+.4f} | {m95:.4f} | {m95 - base95:+.4f} | {unseen} / {short} |"
        )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command")
    s = sub.add_parser("simulated", help="simulated probabilities of the 80 Galar timelines (default)")
    s.add_argument("--gt", default=GALAR, required=GALAR is None, help="ground-truth event JSON (index units)")
    s.add_argument("--levels", nargs="*", default=["low", "medium", "high"], help="noise levels or families")
    s.add_argument("--noise", nargs="*", default=[], help="extra noise variants NAME=JSON (see the docstring)")
    s.add_argument("--folds", type=int, default=4)
    s.add_argument("--rounds", type=int, default=2, help="tuning rounds of the decoder")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--strides", type=int, nargs="*", default=[2, 4, 8, 16])
    s.add_argument("--refine", nargs="*", default=list(DEFAULT_REFINE), help="coarse-to-fine settings, JSON each")
    s.add_argument("--work-dir", default=None, help="cache of the tuned decoders")
    s.add_argument("--quick", action="store_true", help="16 videos, the first level only")
    p = sub.add_parser("pipeline", help="the bundle's inference of a trained tiny model on a generated mini-Galar")
    p.add_argument("--videos", type=int, default=12)
    p.add_argument("--frames", type=int, default=300)
    p.add_argument("--seed", type=int, default=1, help="seed of the generated test videos (the demo trains on seed 0)")
    p.add_argument(
        "--real-timelines", action="store_true", help="test videos on resampled Galar timelines (short lesions kept)"
    )
    p.add_argument("--min-event-frames", type=int, default=2, help="shortest event of the generated test videos")
    p.add_argument("--duplicate-tolerances", type=float, nargs="*", default=[4.0, 8.0, 12.0, 16.0])
    p.add_argument("--novelty-tolerances", type=float, nargs="*", default=[], help="more novelty guard rows")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeats", type=int, default=2, help="runs per setting (the best wall time is reported)")
    p.add_argument("--ckpt-dir", default=None, help="a trained checkpoint folder (model.pt, decoder.json)")
    p.add_argument("--work-dir", default=None, help="the trained model, the test videos and the runs")
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in ("simulated", "pipeline", "-h", "--help"):
        argv = ["simulated", *argv]
    args = parser.parse_args(argv)
    {"simulated": cmd_simulated, "pipeline": cmd_pipeline}[args.command](args)


if __name__ == "__main__":
    main()
