"""Speed of the temporal mAP: vectorised :func:`temporal_map` against the per-pair reference.

The ground truth is the real 80-video Galar timeline (``../shared/data/galar_events.json`` beside the
repository, or ``--gt``). The prediction is a noisy copy of it, listed in random order:

* each ground-truth event is dropped with probability ``--drop`` (default 0.2);
* the start and end of each kept event move by Gaussian noise of 5 % of its length (at least 1 frame);
* each kept event is listed twice with probability ``--dup`` (default 0.1);
* ``--fp`` false positives per ground-truth event (default 0.5): random 1-50 frame events with one or
  two random labels;
* ``--scale`` repeats the whole noisy prediction that many times (larger prediction files).

Usage::

    python benchmarks/metric_speed.py [--gt PATH] [--scale 1] [--seed 0] [--skip-reference]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from monai_vce.data.synthetic import find_galar_events
from monai_vce.labels import LABELS
from monai_vce.metrics import load_events, temporal_map, temporal_map_reference

DEFAULT_GT = find_galar_events()  # MONAI_VCE_GALAR_EVENTS, else shared/data beside the checkout


def noisy_prediction(gt: dict, rng: np.random.Generator, drop: float, dup: float, fp: float, scale: int) -> dict:
    videos = []
    for video in gt["videos"]:
        events = [e for e in video["events"] if e["label"]]
        end = max(e["end"] for e in events)
        out = []
        for _ in range(scale):
            for e in events:
                if rng.random() < drop:
                    continue
                sigma = max(1.0, 0.05 * (e["end"] - e["start"] + 1))
                s = max(0, e["start"] + int(rng.normal(0, sigma)))
                t = max(s, e["end"] + int(rng.normal(0, sigma)))
                out.append({"start": s, "end": t, "label": list(e["label"])})
                if rng.random() < dup:
                    out.append(dict(out[-1]))
            for _ in range(int(fp * len(events))):
                s = int(rng.integers(0, end))
                names = rng.choice(LABELS, size=int(rng.integers(1, 3)), replace=False).tolist()
                out.append({"start": s, "end": s + int(rng.integers(0, 50)), "label": names})
        videos.append({"video_id": video["video_id"], "events": [out[i] for i in rng.permutation(len(out))]})
    return {"videos": videos}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gt", default=DEFAULT_GT, required=DEFAULT_GT is None)
    p.add_argument("--drop", type=float, default=0.2)
    p.add_argument("--dup", type=float, default=0.1)
    p.add_argument("--fp", type=float, default=0.5)
    p.add_argument("--scale", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--skip-reference", action="store_true")
    args = p.parse_args()

    gt = load_events(args.gt)
    pred = noisy_prediction(gt, np.random.default_rng(args.seed), args.drop, args.dup, args.fp, args.scale)
    n_gt = sum(len(v["events"]) for v in gt["videos"])
    n_pred = sum(len(v["events"]) for v in pred["videos"])
    print(f"ground truth: {len(gt['videos'])} videos, {n_gt} events; prediction: {n_pred} events")

    times = []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        fast = temporal_map(gt, pred)
        times.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    temporal_map(gt, pred, validate=False)
    t_novalid = time.perf_counter() - t0
    print(
        f"temporal_map (vectorised): {min(times):.3f} s best of {args.repeats} "
        f"({t_novalid:.3f} s without input validation); "
        f"mAP@0.5 {fast['mAP@0.5']:.4f}, mAP@0.95 {fast['mAP@0.95']:.4f}"
    )
    if not args.skip_reference:
        t0 = time.perf_counter()
        ref = temporal_map_reference(gt, pred)
        t_ref = time.perf_counter() - t0
        diff = max(
            abs(fast["per_video"][v]["AP"][n][k] - ref["per_video"][v]["AP"][n][k])
            for v in ref["per_video"]
            for n in LABELS
            for k in ("0.5", "0.95")
        )
        print(
            f"temporal_map_reference (per-pair loops): {t_ref:.3f} s; speed-up {t_ref / min(times):.1f}x; "
            f"largest AP difference {diff:.1e}"
        )


if __name__ == "__main__":
    main()
