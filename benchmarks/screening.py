"""Screening benchmark: lesion-level sensitivity at fixed false alarms per exam on the real Galar timelines.

Frame probabilities are simulated from the ground truth of the 80 Galar videos as in ``benchmarks/decoding.py``
(same split and seeds; for each noise level of :data:`monai_vce.postprocessing.simulate.NOISE_LEVELS` or family of
:data:`~monai_vce.postprocessing.simulate.NOISE_FAMILIES`, ``--levels ramp white ...``), and these decoders are
scored on the held-out videos with :func:`monai_vce.metrics.lesion_froc` (the 9 pathology labels pooled; a lesion
is found when a shown segment overlaps it):

- ``challenge (tuned)``: the challenge profile (:func:`~monai_vce.postprocessing.tune_decoder`), unscored: one
  operating point, whatever it emits;
- ``paper chain (F1), scored``: the paper's chain on per-class F1 thresholds of the tuning videos, per-label
  events scored like the screening profile's (so that it can be ranked): the strongest fixed baseline;
- ``screening @ F``: ``tune_decoder(profile="screening", false_alarms_per_exam=F)`` from the challenge profile,
  fitted on the tuning videos.

With ``--unseen-device``, every second held-out video stands for a capsule never seen in training: its simulated
logits are rescaled (``x 0.5 - 1``, a miscalibrated device), and a second table splits the scores by device
(:func:`monai_vce.metrics.metrics_by_group`); ``--calibration platt`` adds the screening profile fitted on
calibrated probabilities (``tune_decoder(calibration=...)``).

Usage (from the repository root)::

    python benchmarks/screening.py            # 3 noise levels, 60/20 split, seed 0
    python benchmarks/screening.py --quick    # 16 videos (12/4)
    python benchmarks/screening.py --levels medium --budgets 2 --unseen-device --calibration platt --seed 3
    python benchmarks/screening.py --levels ramp white correlated red blind bursts miscalibrated --budgets 2 4 --seed 11
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from monai_vce.data.synthetic import find_galar_events
from monai_vce.events import Video
from monai_vce.labels import LABELS, PATHOLOGY
from monai_vce.metrics import lesion_froc, metrics_by_group, temporal_map
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

GALAR = find_galar_events()  # MONAI_VCE_GALAR_EVENTS, else shared/data beside the checkout
RATES = ("0.5", "1", "2", "4", "8")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gt", default=GALAR, required=GALAR is None, help="ground-truth event JSON")
    parser.add_argument(
        "--levels", nargs="+", default=list(NOISE_LEVELS), choices=[*NOISE_LEVELS, *NOISE_FAMILIES], help="noise"
    )
    parser.add_argument("--tune-videos", type=int, default=60, help="videos used for tuning; the rest are held out")
    parser.add_argument("--budgets", type=float, nargs="+", default=[2.0, 8.0], help="screening budgets F")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="16 videos (12 tuning / 4 held out), 1 round")
    parser.add_argument("--unseen-device", action="store_true", help="every 2nd held-out video: logits x0.5 - 1")
    parser.add_argument("--calibration", default=None, help="also the screening profile on calibrated probabilities")
    args = parser.parse_args()

    videos = json.loads(Path(args.gt).read_text())["videos"]
    order = np.random.default_rng(args.seed).permutation(len(videos))
    n_tune, rounds = args.tune_videos, 2
    if args.quick:
        order, n_tune, rounds = order[:16], 12, 1
    tune_ids = [videos[i]["video_id"] for i in order[:n_tune]]
    test_ids = [videos[i]["video_id"] for i in order[n_tune:]]
    by_id = {v["video_id"]: v for v in videos}
    gt_test = {"videos": [by_id[k] for k in test_ids]}
    lesions = lesion_froc(gt_test, {"videos": []})["overall"]["overlap"]["lesions"]
    device = {k: "B (unseen)" if args.unseen_device and i % 2 else "A (trained on)" for i, k in enumerate(test_ids)}
    print(f"{len(tune_ids)} tuning videos, {len(test_ids)} held-out videos ({lesions} pathology lesions)")

    rows, groups = [], []
    for level in args.levels:
        t0 = time.perf_counter()
        sim, truths = {}, {}
        for j, k in enumerate(tune_ids + test_ids):
            events = by_id[k]["events"]
            ids = np.arange(max(e["end"] for e in events) + 1)
            truths[k] = events_to_frames(events, ids)
            probs = simulate_probabilities(truths[k], level, seed=[args.seed, j])
            if device.get(k, "").startswith("B"):
                z = np.log(np.clip(probs, 1e-6, 1 - 1e-6) / np.clip(1 - probs, 1e-6, 1))
                probs = (1 / (1 + np.exp(-(0.5 * z - 1.0)))).astype(np.float32)
            sim[k] = Video(k, probs, ids, ids, targets=truths[k].astype(np.float32), events=events)
        tune = [sim[k] for k in tune_ids]
        f1 = optimize_thresholds(np.concatenate([v.probs for v in tune]), np.concatenate([truths[k] for k in tune_ids]))
        base = DecoderParams.from_thresholds(dict(zip(LABELS, f1.tolist(), strict=True)))
        challenge = tune_decoder(tune, base=base, rounds=rounds)
        variants = {
            "challenge (tuned)": challenge,
            "paper chain (F1), scored": base.replace(composition="per_label", scores=True),
        }
        for budget in args.budgets:
            variants[f"screening @ {budget:g}"] = tune_decoder(
                tune, base=challenge, profile="screening", false_alarms_per_exam=budget
            )
            if args.calibration:
                variants[f"screening @ {budget:g}, {args.calibration}"] = tune_decoder(
                    tune,
                    base=challenge,
                    profile="screening",
                    false_alarms_per_exam=budget,
                    calibration=args.calibration,
                )
        for name, params in variants.items():
            pred = decode_videos([sim[k] for k in test_ids], EventDecoder(params))
            froc = lesion_froc(gt_test, pred, validate=False)["overall"]
            o, t = froc["overlap"], froc["tiou0.5"]
            m = temporal_map(gt_test, pred, validate=False)
            shown = sum(any(n in e["label"] for v in pred["videos"] for e in v["events"]) for n in PATHOLOGY)
            expected = params["fit"].get("screening", {}).get("expected") if "fit" in params else None
            note = (
                ""
                if expected is None
                else (
                    f"validation: {expected['false_alarms_per_exam']:.2f} FA/exam, sensitivity {expected['sensitivity']:.3f}"
                )
            )
            rows.append((level, name, o, t, m, shown, note))
            if args.unseen_device:
                groups.append((level, name, metrics_by_group(gt_test, pred, device, validate=False)))
        print(f"[{level}] {time.perf_counter() - t0:.0f} s", flush=True)

    def f(x):
        return "-" if x is None else f"{x:.3f}"

    print()
    head = " | ".join(f"sens @ {r}" for r in RATES)
    print(
        f"| noise | decoder | {head} | FROC score | sens @ 4, tIoU 0.5 | all shown: sens / FA per exam | "
        "workload @ 4 (share) | pathology labels shown | mAP@0.5 | note |"
    )
    print("|---|---|" + "---|" * (len(RATES) + 7))
    for level, name, o, t, m, shown, note in rows:
        sens = " | ".join(f(o["sensitivity"][r]) for r in RATES)
        a = o["all_events"]
        print(
            f"| {level} | {name} | {sens} | {f(o['froc_score'])} | {f(t['sensitivity']['4'])} | "
            f"{f(a['sensitivity'])} / {a['false_alarms_per_exam']:.2f} | {100 * o['workload_share']['4']:.2f} % | "
            f"{shown}/9 | {m['mAP@0.5']:.4f} | {note} |"
        )
    if groups:
        print()
        print(
            "| noise | decoder | device | videos | lesions | sens @ 1 | @ 2 | @ 4 | all shown: FA per exam | mAP@0.5 |"
        )
        print("|---|---|---|---|---|---|---|---|---|---|")
        for level, name, by in groups:
            for dev, g in by.items():
                sens = " | ".join(f(g["lesion_sensitivity"][r]) for r in ("1", "2", "4"))
                print(
                    f"| {level} | {name} | {dev} | {g['videos']} | {g['lesions']} | {sens} | "
                    f"{g['false_alarms_per_exam_all_events']:.2f} | {g['mAP@0.5']:.4f} |"
                )


if __name__ == "__main__":
    main()
