"""Temporal decoding benchmark on the real Galar timelines with simulated frame probabilities.

For each noise level of :data:`monai_vce.postprocessing.simulate.NOISE_LEVELS` (or family of
:data:`~monai_vce.postprocessing.simulate.NOISE_FAMILIES`, ``--levels ramp white ...``), frame probabilities are
simulated from the ground truth of the 80 Galar videos, the videos are split into tuning and held-out sets
(a seeded shuffle, 60 / 20 by default), and these decoders are scored on the held-out videos with
:func:`monai_vce.metrics.temporal_map`:

- ``empty``: no event at all (every label a video lacks scores 1.0);
- ``raw 0.5``: threshold 0.5, label-set runs, no smoothing;
- ``paper chain 0.5``: threshold 0.5 -> median 7 -> gaps <= 5 filled -> runs < 3 removed, label-set runs;
- ``paper chain``: the same chain with the per-class F1 thresholds of the tuning videos' frames
  (:func:`monai_vce.postprocessing.optimize_thresholds`): the paper's decoding, what the ``paper`` preset writes
  (``tune_decoder(profile="paper")``);
- ``tuned``: :func:`monai_vce.postprocessing.tune_decoder` fitted on the tuning videos from the same F1
  thresholds, as training does (Viterbi settings,
  chain parameters, presence gating with the cross-validated emit-or-abstain decision, ranking), scored on the
  held-out videos. The note gives the fit time, the chosen ranking and section switch cost, and how many
  labels the fitted decoder may emit at all (the others are left out, as in the empty submission).

``--peer-ideas`` adds ``tuned + peer ideas``: the same tuning with the off-by-default ideas searched too
(hysteresis thresholds and a two-state duration prior per label, ``default_grids(optional=True)``, and pathology
gated by the sections holding 99 % of its tuning frames, ``pathology_gating=0.99``).

``--peer-decoder`` adds the peer decoder (``benchmarks/peer_decoder.py``): the best published entry's decoding
as published (hysteresis), and the best of its four combinations (hysteresis or a two-state HMM per label, with
or without anatomy gates) on the tuning videos.

Each row also gives the lesion sensitivity at 2 false alarms per exam (:func:`monai_vce.metrics.lesion_froc`,
the 9 pathology labels pooled, a lesion found by overlap).

Usage (from the repository root)::

    python benchmarks/decoding.py            # 3 noise levels, 60/20 split
    python benchmarks/decoding.py --quick    # 16 videos (12/4), 1 tuning round, for a fast check
    python benchmarks/decoding.py --levels ramp white correlated red blind bursts miscalibrated --seed 11
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from monai_vce.data.synthetic import find_galar_events
from monai_vce.events import Video
from monai_vce.labels import LABELS, SECTIONS
from monai_vce.metrics import lesion_froc, temporal_map
from monai_vce.postprocessing import (
    NOISE_FAMILIES,
    NOISE_LEVELS,
    DecoderParams,
    EventDecoder,
    decode_videos,
    events_to_frames,
    optimize_thresholds,
    simulate_probabilities,
    tune_decoder,
)
from monai_vce.postprocessing.tuning import default_grids

sys.path.insert(0, str(Path(__file__).resolve().parent))
from peer_decoder import PeerDecoder, fit_peer_decoder, select_peer_decoder

GALAR = find_galar_events()  # MONAI_VCE_GALAR_EVENTS, else shared/data beside the checkout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--gt", default=GALAR, required=GALAR is None, help="ground-truth event JSON (frame_index units)"
    )
    parser.add_argument(
        "--levels", nargs="+", default=list(NOISE_LEVELS), choices=[*NOISE_LEVELS, *NOISE_FAMILIES], help="noise"
    )
    parser.add_argument("--tune-videos", type=int, default=60, help="videos used for tuning; the rest are held out")
    parser.add_argument("--rounds", type=int, default=2, help="coordinate-ascent rounds of the tuning")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="16 videos (12 tuning / 4 held out), 1 round")
    parser.add_argument("--peer-ideas", action="store_true", help="also tune with hysteresis, duration and gates")
    parser.add_argument("--peer-decoder", action="store_true", help="also score the peer decoder (peer_decoder.py)")
    parser.add_argument("--per-label", action="store_true", help="also print per-label APs of tuned and peer fitted")
    parser.add_argument(
        "--peer-only", action="store_true", help="with --peer-decoder, skip the tuned decoder (rows are deterministic)"
    )
    args = parser.parse_args()

    gt_all = json.loads(Path(args.gt).read_text())
    videos = gt_all["videos"]
    rng = np.random.default_rng(args.seed)
    order = rng.permutation(len(videos))
    n_tune = args.tune_videos
    if args.quick:
        order, n_tune, args.rounds = order[:16], 12, 1
    tune_ids = [videos[i]["video_id"] for i in order[:n_tune]]
    test_ids = [videos[i]["video_id"] for i in order[n_tune:]]
    by_id = {v["video_id"]: v for v in videos}
    gt_test = {"videos": [by_id[k] for k in test_ids]}
    print(f"{len(tune_ids)} tuning videos, {len(test_ids)} held-out videos, {args.rounds} tuning round(s)")

    variants = {
        "raw 0.5": DecoderParams({"order": ["threshold"], "ranking": "none"}),
        "paper chain 0.5": DecoderParams.paper(ranking="none"),
    }

    per_label: dict[tuple[str, str], dict] = {}

    def score(pred: dict, name: str = "", level: str = "") -> tuple[float, float, float]:
        res = temporal_map(gt_test, pred)
        per_label[level, name] = res["per_label"]
        froc = lesion_froc(gt_test, pred, false_alarm_rates=(2.0,), validate=False)["overall"]["overlap"]
        return res["mAP@0.5"], res["mAP@0.95"], froc["sensitivity"]["2"] or 0.0

    rows = []
    for level in args.levels:
        t0 = time.perf_counter()
        sim, truths = {}, {}
        for j, k in enumerate(tune_ids + test_ids):
            events = by_id[k]["events"]
            ids = np.arange(max(e["end"] for e in events) + 1)
            truths[k] = events_to_frames(events, ids)
            probs = simulate_probabilities(truths[k], level, seed=[args.seed, j])
            sim[k] = Video(k, probs, ids, ids, events=events)
        t_sim = time.perf_counter() - t0
        f1 = optimize_thresholds(
            np.concatenate([sim[k].probs for k in tune_ids]), np.concatenate([truths[k] for k in tune_ids])
        )
        base = DecoderParams.from_thresholds(dict(zip(LABELS, f1.tolist(), strict=True)))
        variants["paper chain"] = tune_decoder([sim[k] for k in tune_ids], base=base, profile="paper")
        rows.append((level, "empty", *score({"videos": [{"video_id": k, "events": []} for k in test_ids]}), ""))
        for name, params in variants.items():
            pred = decode_videos([sim[k] for k in test_ids], EventDecoder(params))
            rows.append((level, name, *score(pred), ""))
        t0 = time.perf_counter()
        if not args.peer_only:
            tuned = tune_decoder([sim[k] for k in tune_ids], base=base, rounds=args.rounds)
            pred = decode_videos([sim[k] for k in test_ids], EventDecoder(tuned))
            emitted = sum(tuned["labels"][n]["presence"]["feature"] != "never" for n in tuned["labels"])
            note = (
                f"fit {time.perf_counter() - t0:.0f} s, ranking {tuned['ranking']}, "
                f"switch cost {tuned['anatomy']['switch_cost']:g}, {emitted}/17 labels emitted"
            )
            rows.append((level, "tuned", *score(pred, "tuned", level), note))
        t_tune = time.perf_counter() - t0
        if args.peer_ideas:
            t0 = time.perf_counter()
            peer = tune_decoder(
                [sim[k] for k in tune_ids],
                base=base,
                rounds=args.rounds,
                grids=default_grids(optional=True),
                pathology_gating=0.99,
            )
            t_peer = time.perf_counter() - t0
            pred = decode_videos([sim[k] for k in test_ids], EventDecoder(peer))
            used = sorted(
                {s for n in LABELS for s in ("hysteresis", "duration_cost") if peer["labels"][n].get(s, 0)}
                | ({"section gates"} if peer["anatomy"]["pathology_sections"] else set())
            )
            rows.append((level, "tuned + peer ideas", *score(pred), f"fit {t_peer:.0f} s, uses {used or 'none'}"))
        if args.peer_decoder:
            t0 = time.perf_counter()
            published = PeerDecoder()
            rows.append(
                (level, "peer decoder (published)", *score(published.decode_videos([sim[k] for k in test_ids])), "")
            )
            gt_tune = {"videos": [by_id[k] for k in tune_ids]}
            chosen, objectives = select_peer_decoder([sim[k] for k in tune_ids], truths, gt_tune)
            note = f"chose {chosen.name}; tuning objectives " + ", ".join(f"{n} {o:.4f}" for n, o in objectives.items())
            rows.append(
                (level, "peer decoder (best on tuning)", *score(chosen.decode_videos([sim[k] for k in test_ids])), note)
            )
            fitted, objective = fit_peer_decoder([sim[k] for k in tune_ids], gt_tune, rounds=args.rounds)
            pred = fitted.decode_videos([sim[k] for k in test_ids])
            emitted = sum(c["presence_max"] <= 1 for name, c in fitted.config.items() if name not in SECTIONS)
            note = f"{fitted.name}, tuning objective {objective:.4f}, {emitted}/12 other labels emitted"
            rows.append((level, "peer decoder (fitted on tuning)", *score(pred, "peer fitted", level), note))
            print(f"[{level}] peer decoders in {time.perf_counter() - t0:.1f} s", flush=True)
        print(f"[{level}] simulated in {t_sim:.1f} s, tuned in {t_tune:.1f} s", flush=True)
        for row in rows:  # each level's rows as soon as they exist
            if row[0] == level:
                print("  ", row, flush=True)

    if args.per_label:
        print("\nper-label AP@0.5 / AP@0.95 on the held-out videos")
        for (level, name), aps in per_label.items():
            if name:
                print(f"[{level}] {name}: " + ", ".join(f"{n} {a['0.5']:.3f}/{a['0.95']:.3f}" for n, a in aps.items()))
    print()
    print("| noise | decoder | mAP@0.5 | mAP@0.95 | lesion sensitivity at 2 false alarms per exam | note |")
    print("|---|---|---|---|---|---|")
    for level, name, m5, m95, sens, note in rows:
        print(f"| {level} | {name} | {m5:.4f} | {m95:.4f} | {sens:.3f} | {note} |")


if __name__ == "__main__":
    main()
