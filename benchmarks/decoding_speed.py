"""Speed of decoding and scoring all 80 Galar videos (3.5 M frames x 17 labels) on one core.

Simulated probabilities (noise level ``low``) of the 80 real timelines are decoded with the paper's chain
and with the chain plus anatomy decoding (Viterbi; default settings, and the lead-in state with the lower
switch cost that the tuning usually picks); the resulting prediction files are scored with
:func:`monai_vce.metrics.temporal_map` and, side by side in the same run, with the plain per-pair loop
:func:`monai_vce.metrics.temporal_map_reference`. Run it with one thread for one-core figures::

    OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1 python benchmarks/decoding_speed.py
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from monai_vce.data.synthetic import find_galar_events
from monai_vce.events import Video
from monai_vce.metrics import temporal_map, temporal_map_reference
from monai_vce.postprocessing import (
    DecoderParams,
    EventDecoder,
    decode_videos,
    events_to_frames,
    simulate_probabilities,
)

GALAR = find_galar_events()  # MONAI_VCE_GALAR_EVENTS, else shared/data beside the checkout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gt", default=GALAR, required=GALAR is None)
    parser.add_argument("--level", default="low")
    parser.add_argument("--skip-reference", action="store_true", help="do not time the per-pair reference metric")
    args = parser.parse_args()
    gt = json.loads(Path(args.gt).read_text())
    probs = {}
    for j, v in enumerate(gt["videos"]):
        ids = np.arange(max(e["end"] for e in v["events"]) + 1)
        p = simulate_probabilities(events_to_frames(v["events"], ids), args.level, seed=j)
        probs[v["video_id"]] = Video(v["video_id"], p, ids, ids)
    frames = sum(len(v) for v in probs.values())
    print(f"{len(probs)} videos, {frames} frames x 17 labels, noise {args.level}")

    rows = []
    for name, params in (
        ("paper chain", DecoderParams.paper()),
        ("chain + anatomy Viterbi", DecoderParams.paper(anatomy={"enabled": True})),
        (
            "chain + anatomy Viterbi with lead-in",
            DecoderParams.paper(
                anatomy={"enabled": True, "switch_cost": 2.5, "skip_cost": 2.5, "backward_cost": 7.5, "entry_cost": 0.0}
            ),
        ),
    ):
        t0 = time.perf_counter()
        pred = decode_videos(probs, EventDecoder(params))
        t_dec = time.perf_counter() - t0
        n_events = sum(len(v["events"]) for v in pred["videos"])
        t0 = time.perf_counter()
        res = temporal_map(gt, pred)
        t_map = time.perf_counter() - t0
        if args.skip_reference:
            t_ref, same = float("nan"), "-"
        else:
            t0 = time.perf_counter()
            ref = temporal_map_reference(gt, pred)
            t_ref = time.perf_counter() - t0
            same = str(ref["mAP@0.5"] == res["mAP@0.5"] and ref["mAP@0.95"] == res["mAP@0.95"])
        rows.append((name, n_events, t_dec, t_map, t_ref, same, res["mAP@0.5"]))

    print()
    print("| decoder | events | decode (s) | temporal_map (s) | temporal_map_reference (s) | same result | mAP@0.5 |")
    print("|---|---|---|---|---|---|---|")
    for name, n, t_dec, t_map, t_ref, same, m in rows:
        print(f"| {name} | {n} | {t_dec:.2f} | {t_map:.2f} | {t_ref:.2f} | {same} | {m:.4f} |")


if __name__ == "__main__":
    main()
