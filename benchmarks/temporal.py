"""Temporal refiner benchmark on the real Galar timelines with simulated frame probabilities.

For each noise level (:data:`monai_vce.postprocessing.NOISE_LEVELS`, plus ``shifted``, a noise model defined
here that the refiner's settings were never chosen on, and the families of
:data:`~monai_vce.postprocessing.NOISE_FAMILIES`, structurally unlike the step-at-the-boundary levels), frame probabilities are simulated from the ground truth
of the 80 Galar videos, the videos are split into 40 fitting and 40 held-out videos (a seeded shuffle; ``--seed``
changes the split and the simulation draw), and two pipelines are scored on the held-out videos with
:func:`monai_vce.metrics.temporal_map`, side by side:

- ``decoder``: :func:`monai_vce.postprocessing.tune_decoder` fitted on the 40 fitting videos' probabilities;
- ``refiner``: :func:`monai_vce.temporal.cross_fit_refiner` on the 40 fitting videos (``--folds`` folds: each
  fold's videos are refined by a refiner fitted on the other folds), ``tune_decoder`` fitted on those
  out-of-fold refined probabilities (never on a refiner's own training videos), and the fold refiners together
  (:class:`~monai_vce.temporal.RefinerEnsemble`, the mean of their probabilities, the default ``final``)
  followed by that decoder on the held-out videos; the refiner's defaults, so the five sections' probabilities
  are passed through unchanged (``passthrough``);
- ``refiner, refitted on all videos`` (with ``--refit``): the same, but the held-out videos are refined by one
  more refiner fitted on all 40 videos (``final="refit"``) and decoded with the same decoder;
- ``refiner, every label refined``: the fold ensemble with nothing passed through (``passthrough=()``), the
  decoder tuned on those out-of-fold probabilities (the refiners are fitted once: passing labels through changes
  only what :meth:`TemporalRefiner.refine` returns);
- ``selected``: the pipeline :func:`monai_vce.temporal.select_pipeline` picks from the decoder, ``refiner`` and
  ``refiner, every label refined`` by their decoders' tuning objectives on the fitting videos (the decoder alone unless a refiner pipeline leads by more than the
  default margin, 0.01), scored on the held-out videos: what a user gets who lets the product decide.

``--variants`` adds decoding variants of the same fits: ``refiner, logit-mean ensemble`` (the fold refiners'
logits averaged instead of their probabilities; same decoder) and ``refiner, passthrough chosen per label``
(a label is passed through when the decoder alone scores it higher on the fitting videos, in-sample, than the
every-label pipeline does on their out-of-fold refined probabilities; decoder re-tuned). ``--cache DIR`` keeps
the fits (fold refiners and out-of-fold outputs, keyed by everything they depend on), so that a later run of
the same fits only decodes.

``--ceiling`` scores what a perfect refiner of some labels could give at most: the held-out ground truth of
those labels alone, composed into label-set events (all other labels left out, as a decoder that abstains).
``--fit-all`` instead fits one refiner on all 80 videos (``medium``) and reports its wall time and the peak
memory of the process; ``--speed`` times :meth:`TemporalRefiner.refine` of one 130,000-frame video on one CPU
thread: one refiner and the ensemble of ``--folds`` of them.

Usage (from the repository root)::

    python benchmarks/temporal.py                       # low, medium, high, shifted; 40 / 40 split
    python benchmarks/temporal.py --seed 1              # another split and simulation draw
    python benchmarks/temporal.py --levels medium --refit   # also a refiner refitted on all 40 videos
    python benchmarks/temporal.py --levels medium --quick   # 16 videos, 2 folds, short fits: a smoke test
    python benchmarks/temporal.py --levels medium --variants --cache fits/   # decoding variants; fits kept
    python benchmarks/temporal.py --levels ramp white correlated red blind bursts miscalibrated --seed 11
    python benchmarks/temporal.py --ceiling
    python benchmarks/temporal.py --fit-all
    python benchmarks/temporal.py --speed
"""

from __future__ import annotations

import argparse
import hashlib
import json
import resource
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from monai_vce.data.synthetic import find_galar_events
from monai_vce.events import Video, with_ground_truth
from monai_vce.inference.interpolation import logit, sigmoid
from monai_vce.labels import LABELS, SECTIONS
from monai_vce.metrics import lesion_froc, temporal_map
from monai_vce.postprocessing import (
    NOISE_FAMILIES,
    NOISE_LEVELS,
    EventDecoder,
    decode_videos,
    events_to_frames,
    noise_settings,
    simulate_probabilities,
    tune_decoder,
)
from monai_vce.temporal import (
    CrossFitResult,
    RefinerEnsemble,
    TemporalRefiner,
    cross_fit_refiner,
    fit_refiner,
    select_pipeline,
)

GALAR = find_galar_events()  # MONAI_VCE_GALAR_EVENTS, else shared/data beside the checkout

#: A noise model between ``medium`` and ``high`` with a different temporal structure (shorter correlation,
#: longer false-positive bursts, more flicker), never used to choose the refiner's settings.
SHIFTED: dict[str, float] = {
    "margin_scale": 0.9,
    "sigma": 1.4,
    "rho": 0.8,
    "flicker": 0.05,
    "miss_prob": 0.3,
    "miss_length": 12,
    "fp_rate": 4.0,
    "fp_length": 20.0,
}
LEVELS: dict[str, Any] = {
    **{name: noise_settings(name) for name in NOISE_LEVELS},
    "shifted": SHIFTED,
    **{name: noise_settings(name) for name in NOISE_FAMILIES},
}


def _simulate(videos: list[dict], level: str, seed: int) -> dict[str, Video]:
    sim = {}
    for j, v in enumerate(videos):
        events = v["events"]
        ids = np.arange(max(e["end"] for e in events) + 1)
        rng = np.random.default_rng([seed, j])
        probs = simulate_probabilities(events_to_frames(events, ids), LEVELS[level], seed=rng)
        sim[v["video_id"]] = with_ground_truth(Video(v["video_id"], probs, ids, ids), events, "frame_index")
    return sim


def _score(gt: dict, decoded: dict) -> tuple[float, float, float]:
    """mAP@0.5, mAP@0.95 and the lesion sensitivity at 2 false alarms per exam (pathology, overlap)."""
    res = temporal_map(gt, decoded)
    froc = lesion_froc(gt, decoded, false_alarm_rates=(2.0,), validate=False)["overall"]["overlap"]
    return res["mAP@0.5"], res["mAP@0.95"], froc["sensitivity"]["2"] or 0.0


def _per_label(gt: dict, decoded: dict) -> dict[str, float]:
    """AP@0.5 of every label (a label the decoder never emits scores the share of videos without it)."""
    per = temporal_map(gt, decoded)["per_label"]
    return {name: float(per[name]["0.5"]) for name in LABELS}


def _logit_mean(refiners, probs: np.ndarray) -> np.ndarray:
    return sigmoid(np.mean([logit(r.refine(probs)) for r in refiners], axis=0)).astype(np.float32)


def _peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _tune_and_score(
    name: str,
    inputs: dict[str, dict[str, Video]],
    tuned: dict[str, Any],
    test_probs: dict[str, dict[str, np.ndarray]],
    frame_ids: dict[str, np.ndarray],
    gt_test: dict,
    rounds: int,
) -> tuple[tuple[float, float, float], dict[str, float], float]:
    """Tune the decoder of pipeline ``name`` (into ``tuned``; pipelines with the same tuning inputs share one) and
    score it on the held-out videos: ``(mAP@0.5, mAP@0.95, lesion sensitivity)``, AP@0.5 per label, tuning
    seconds."""
    t0 = time.perf_counter()
    same = next((n for n in tuned if inputs[n] is inputs[name]), None)
    tuned[name] = tuned[same] if same else tune_decoder(inputs[name], rounds=rounds)
    seconds = time.perf_counter() - t0
    test = [Video(k, test_probs[name][k], ids, ids) for k, ids in frame_ids.items()]
    decoded = decode_videos(test, EventDecoder(tuned[name]))
    return _score(gt_test, decoded), _per_label(gt_test, decoded), seconds


def _cached_cross_fit(args: argparse.Namespace, level: str, fit: dict[str, Video], kwargs: dict[str, Any]):
    """``cross_fit_refiner`` of the fitting videos, read from / written to ``--cache`` when given.

    The fits take most of a run; with a cache, decoding variants of the same fits rerun in minutes. The key
    covers everything the fits depend on (level, seed, folds, refit, settings, fitting videos)."""

    def fit_now():
        return cross_fit_refiner(fit, folds=args.folds, final="refit" if args.refit else None, seed=args.seed, **kwargs)

    if not args.cache:
        return fit_now()
    key = json.dumps([level, args.seed, args.folds, bool(args.refit), kwargs, sorted(fit)], sort_keys=True, default=str)
    name = f"{level}-s{args.seed}-f{args.folds}-{hashlib.sha256(key.encode()).hexdigest()[:12]}"
    folder = Path(args.cache) / name
    if (folder / "done").exists():
        print(f"[{level}] refiner fits read from {folder}", flush=True)
        folds = RefinerEnsemble.load(folder / "folds.pt")
        refit = TemporalRefiner.load(folder / "refit.pt") if (folder / "refit.pt").exists() else None
        with np.load(folder / "refined.npz") as z:
            refined = {k: z[k] for k in z.files}
        members = [m for m in folds.members if isinstance(m, TemporalRefiner)]
        folds_of = json.loads((folder / "folds.json").read_text())
        return CrossFitResult(refined, refit, members, folds_of)
    cross = fit_now()
    folder.mkdir(parents=True, exist_ok=True)
    RefinerEnsemble(cross.fold_refiners).save(folder / "folds.pt")
    if cross.refiner is not None:
        cross.refiner.save(folder / "refit.pt")
    np.savez(folder / "refined.npz", **cross.refined)
    (folder / "folds.json").write_text(json.dumps(cross.folds))
    (folder / "key.json").write_text(key)
    (folder / "done").write_text("")
    return cross


def run_levels(args: argparse.Namespace, fit_kwargs: dict[str, Any]) -> None:
    videos = json.loads(Path(args.gt).read_text())["videos"]
    order = np.random.default_rng(args.seed).permutation(len(videos))
    n_fit = args.fit_videos
    if args.quick:
        order, n_fit = order[:16], 8
    videos = [videos[i] for i in order]
    fit_ids = [v["video_id"] for v in videos[:n_fit]]
    test_ids = [v["video_id"] for v in videos[n_fit:]]
    by_id = {v["video_id"]: v for v in videos}
    gt_test = {"videos": [by_id[k] for k in test_ids]}
    print(f"{len(fit_ids)} fitting videos, {len(test_ids)} held-out videos, {args.folds} folds, seed {args.seed}")
    print(f"refiner settings: {json.dumps(fit_kwargs)}", flush=True)
    sections = [LABELS.index(n) for n in SECTIONS]

    def passthrough(refined: np.ndarray, probs: np.ndarray, cols: list[int] = sections) -> np.ndarray:
        out = refined.copy()
        out[:, cols] = probs[:, cols]
        return out

    rows = []
    for level in args.levels:
        sim = _simulate(videos, level, args.seed)
        fit = {k: sim[k] for k in fit_ids}
        inputs: dict[str, dict[str, Video]] = {"decoder": fit}
        test_probs: dict[str, dict[str, np.ndarray]] = {"decoder": {k: sim[k].probs for k in test_ids}}

        t0 = time.perf_counter()
        # fitted with nothing passed through; the default (sections passed through) is derived from the same fits;
        # a refit is one more fit, for its row only (the default refiner is the fold refiners' ensemble)
        kwargs = {**fit_kwargs, "passthrough": ()}
        cross = _cached_cross_fit(args, level, fit, kwargs)
        t_fit = time.perf_counter() - t0
        ensemble = RefinerEnsemble(cross.fold_refiners)
        refined_test = {k: ensemble.refine(sim[k].probs) for k in test_ids}
        inputs["refiner"] = {k: sim[k].replace(probs=passthrough(cross.refined[k], sim[k].probs)) for k in fit_ids}
        test_probs["refiner"] = {k: passthrough(refined_test[k], sim[k].probs) for k in test_ids}
        if cross.refiner is not None:  # the same out-of-fold tuning inputs, hence the same decoder (tuned once)
            inputs["refiner, refitted on all videos"] = inputs["refiner"]
            test_probs["refiner, refitted on all videos"] = {
                k: passthrough(cross.refiner.refine(sim[k].probs), sim[k].probs) for k in test_ids
            }
        inputs["refiner, every label refined"] = cross.tuning_videos(fit)
        test_probs["refiner, every label refined"] = refined_test

        tuned: dict[str, Any] = {}
        scores, seconds, labels = {}, {}, {}
        frame_ids = {k: sim[k].frame_index for k in test_ids}

        for name in list(inputs):
            scores[name], labels[name], seconds[name] = _tune_and_score(
                name, inputs, tuned, test_probs, frame_ids, gt_test, args.rounds
            )
        if args.variants:
            # ensemble in logit space: same decoder as the refiner row
            inputs["refiner, logit-mean ensemble"] = inputs["refiner"]
            test_probs["refiner, logit-mean ensemble"] = {
                k: passthrough(_logit_mean(cross.fold_refiners, sim[k].probs), sim[k].probs) for k in test_ids
            }
            # labels passed through where the decoder alone beats the refined labels on the fitting videos
            fit_gt = {"videos": [by_id[k] for k in fit_ids]}
            own = {}
            for name in ("decoder", "refiner, every label refined"):
                dec = decode_videos([inputs[name][k] for k in fit_ids], EventDecoder(tuned[name]))
                per = temporal_map(fit_gt, dec)["per_label"]
                own[name] = {n: (per[n]["0.5"] + per[n]["0.95"]) / 2 for n in LABELS}
            chosen_pass = [
                LABELS.index(n) for n in LABELS if own["decoder"][n] > own["refiner, every label refined"][n]
            ]
            print(f"[{level}] passed through by the fitting videos: {[LABELS[i] for i in chosen_pass]}", flush=True)
            chosen_name = "refiner, passthrough chosen per label"
            inputs[chosen_name] = {
                k: sim[k].replace(probs=passthrough(cross.refined[k], sim[k].probs, chosen_pass)) for k in fit_ids
            }
            test_probs[chosen_name] = {k: passthrough(refined_test[k], sim[k].probs, chosen_pass) for k in test_ids}
            for name in ("refiner, logit-mean ensemble", chosen_name):
                scores[name], labels[name], seconds[name] = _tune_and_score(
                    name, inputs, tuned, test_probs, frame_ids, gt_test, args.rounds
                )
        chosen = select_pipeline(
            {n: tuned[n] for n in ("decoder", "refiner", "refiner, every label refined")}, baseline="decoder"
        )
        for name in inputs:
            objective = tuned[name]["fit"]["objective"]
            rows.append((level, name, scores[name], scores["decoder"], objective, seconds[name], t_fit))
            print(
                f"[{level}] {name}: {scores[name][0]:.4f} / {scores[name][1]:.4f} (tuning objective {objective:.4f}, "
                f"tuned in {seconds[name]:.0f} s)",
                flush=True,
            )
        for name in inputs:
            if name == "decoder":
                continue
            # where the mAP moves: labels whose AP@0.5 changed, with the decoder's presence rule of each pipeline
            moved = [n for n in LABELS if abs(labels[name][n] - labels["decoder"][n]) >= 0.02]
            print(
                f"[{level}] {name}: AP@0.5 per label against the decoder alone: "
                + (
                    ", ".join(
                        f"{n} {labels['decoder'][n]:.2f}->{labels[name][n]:.2f} "
                        f"({tuned['decoder']['labels'][n]['presence']['feature']}->"
                        f"{tuned[name]['labels'][n]['presence']['feature']})"
                        for n in moved
                    )
                    or "no label moves by 0.02"
                ),
                flush=True,
            )
        rows.append((level, f"selected ({chosen})", scores[chosen], scores["decoder"], None, 0.0, t_fit))
        fits = f"{args.folds} folds" + (" + refit" if args.refit else "")
        print(f"[{level}] refiner fits ({fits}): {t_fit:.0f} s; selected: {chosen}", flush=True)
    print()
    print("| noise | pipeline | mAP@0.5 | gain | mAP@0.95 | gain | lesions @2 FA | tuning objective | note |")
    print("|---|---|---|---|---|---|---|---|---|")
    for level, name, score, base, objective, _, t_fit in rows:
        note = f"refiner fits {t_fit:.0f} s" if name == "refiner" else ""
        obj = "" if objective is None else f"{objective:.4f}"
        print(
            f"| {level} | {name} | {score[0]:.4f} | {score[0] - base[0]:+.4f} | {score[1]:.4f} | "
            f"{score[1] - base[1]:+.4f} | {score[2]:.3f} | {obj} | {note} |"
        )


def run_ceiling(args: argparse.Namespace) -> None:
    from monai_vce.postprocessing import frames_to_events

    videos = json.loads(Path(args.gt).read_text())["videos"]
    order = np.random.default_rng(args.seed).permutation(len(videos))
    test = [videos[i] for i in order[args.fit_videos :]]
    gt = {"videos": test}
    groups = {
        "nothing (empty submission)": [],
        "sections": list(SECTIONS),
        "sections + landmarks": list(LABELS[:8]),
        "sections + blood": [*SECTIONS, "blood"],
        "all 17 labels": list(LABELS),
    }
    print(f"{len(test)} held-out videos (seed {args.seed}); exact ground truth of the listed labels only")
    print("| exact labels | mAP@0.5 | mAP@0.95 |")
    print("|---|---|---|")
    for name, labels in groups.items():
        keep = [LABELS.index(n) for n in labels]
        pred = []
        for v in test:
            ids = np.arange(max(e["end"] for e in v["events"]) + 1)
            truth = events_to_frames(v["events"], ids)
            mask = np.zeros_like(truth)
            mask[:, keep] = truth[:, keep]
            pred.append({"video_id": v["video_id"], "events": frames_to_events(mask, ids)})
        m5, m95, _ = _score(gt, {"videos": pred})
        print(f"| {name} | {m5:.4f} | {m95:.4f} |")


def run_fit_all(args: argparse.Namespace, fit_kwargs: dict[str, Any]) -> None:
    videos = json.loads(Path(args.gt).read_text())["videos"]
    sim = _simulate(videos, "medium", args.seed)
    frames = sum(len(s) for s in sim.values())
    before = _peak_rss_mib()
    t0 = time.perf_counter()
    refiner = fit_refiner(sim, **fit_kwargs)
    seconds = time.perf_counter() - t0
    after = _peak_rss_mib()
    params = sum(p.numel() for p in refiner.parameters())
    print(
        f"fit on {len(sim)} videos ({frames:,} frames), {params:,} parameters, {torch.get_num_threads()} thread(s): "
        f"{seconds:.0f} s; peak resident memory {after:.0f} MiB (before the fit {before:.0f} MiB, with the "
        f"simulated probabilities)"
    )


def run_speed(args: argparse.Namespace, fit_kwargs: dict[str, Any]) -> None:
    torch.set_num_threads(1)

    def build(seed: int) -> TemporalRefiner:
        torch.manual_seed(seed)
        return TemporalRefiner(network=fit_kwargs.get("network"), position=fit_kwargs.get("position", False))

    single = build(0)
    models = {
        "one refiner": single,
        f"ensemble of {args.folds}": RefinerEnsemble([single, *map(build, range(1, args.folds))]),
    }
    probs = np.random.default_rng(0).random((130_000, 17)).astype(np.float32)
    before = _peak_rss_mib()
    for name, model in models.items():
        for chunk in (single.chunk_size, 0):
            model.refine(probs[:5000], chunk_size=chunk)
            times = []
            for _ in range(args.repeats):
                t0 = time.perf_counter()
                model.refine(probs, chunk_size=chunk)
                times.append(time.perf_counter() - t0)
            print(
                f"{name}: refine 130,000 frames, 1 thread, chunk_size {chunk or 'whole video'}: median "
                f"{np.median(times):.2f} s, min {min(times):.2f} s over {args.repeats} runs; peak resident memory "
                f"{_peak_rss_mib():.0f} MiB (before refining {before:.0f} MiB)",
                flush=True,
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gt", default=GALAR, required=GALAR is None, help="ground-truth event JSON (index units)")
    parser.add_argument("--levels", nargs="+", default=list(LEVELS), choices=list(LEVELS), help="noise levels")
    parser.add_argument("--fit-videos", type=int, default=40, help="videos for fitting; the rest are held out")
    parser.add_argument("--folds", type=int, default=3, help="cross-fitting folds over the fitting videos")
    parser.add_argument("--refit", action="store_true", help="also score a refiner refitted on all fitting videos")
    parser.add_argument("--rounds", type=int, default=2, help="coordinate-ascent rounds of the decoder tuning")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--settings", default="{}", help="JSON of fit_refiner arguments overriding the defaults")
    parser.add_argument("--quick", action="store_true", help="16 videos (8 / 8), short fits: a smoke test")
    parser.add_argument("--ceiling", action="store_true", help="scores of exact ground truth for some labels")
    parser.add_argument("--fit-all", action="store_true", help="time and memory of one fit on all 80 videos")
    parser.add_argument("--speed", action="store_true", help="refine one 130,000-frame video on one thread")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs of --speed")
    parser.add_argument("--variants", action="store_true", help="also score decoding variants of the same fits")
    parser.add_argument("--cache", default="", help="folder keeping the refiner fits, reused by later runs")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads for fitting")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    fit_kwargs: dict[str, Any] = json.loads(args.settings)
    if args.quick:
        fit_kwargs = {"steps": 10, "crop_length": 512, **fit_kwargs}
        args.folds, args.rounds = 2, 1
    if args.ceiling:
        run_ceiling(args)
    elif args.speed:
        run_speed(args, fit_kwargs)
    elif args.fit_all:
        run_fit_all(args, fit_kwargs)
    else:
        run_levels(args, fit_kwargs)


if __name__ == "__main__":
    main()
