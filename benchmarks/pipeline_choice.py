"""False-switch rate of the validation-time pipeline choice (:func:`monai_vce.temporal.select_pipeline`).

The choice keeps the frame pipeline (``decoder``) unless another pipeline's tuning objective leads by more than a
margin. A false switch adopts a pipeline that is no better on held-out videos. The candidate here is the same
videos' probabilities with independent logit noise added (``--noise``, standard deviation): no information is
added, so whatever lead it gets comes from the tuning's own variability. For each seed and noise family, frame
probabilities of the 80 Galar timelines are simulated (40 fitting, 40 held-out videos, a seeded shuffle, as
``benchmarks/temporal.py``), :func:`~monai_vce.postprocessing.tune_decoder` is fitted on the fitting videos of both
pipelines, and the tables give each trial's objective lead and held-out mAP@0.5 difference, then, per margin, the
switches (lead above the margin) and the false ones among them (held-out difference <= 0).

Usage (from the repository root)::

    python benchmarks/pipeline_choice.py --seeds 21 22 --levels medium ramp white red bursts
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from monai_vce.data.synthetic import find_galar_events
from monai_vce.inference.interpolation import logit, sigmoid
from monai_vce.metrics import temporal_map
from monai_vce.postprocessing import (
    NOISE_FAMILIES,
    NOISE_LEVELS,
    EventDecoder,
    decode_videos,
    tune_decoder,
)

sys.path.insert(0, str(Path(__file__).resolve().parent))
from temporal import _simulate  # the refiner benchmark's draw of the same videos

GALAR = find_galar_events()  # MONAI_VCE_GALAR_EVENTS, else shared/data beside the checkout
MARGINS = (0.0, 0.005, 0.01, 0.02)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gt", default=GALAR, required=GALAR is None, help="ground-truth event JSON (index units)")
    parser.add_argument("--levels", nargs="+", default=["medium"], choices=[*NOISE_LEVELS, *NOISE_FAMILIES])
    parser.add_argument("--seeds", type=int, nargs="+", default=[21])
    parser.add_argument("--fit-videos", type=int, default=40, help="videos for fitting; the rest are held out")
    parser.add_argument("--noise", type=float, default=0.3, help="logit noise of the candidate pipeline")
    parser.add_argument("--rounds", type=int, default=2, help="coordinate-ascent rounds of the decoder tuning")
    args = parser.parse_args()

    all_videos = json.loads(Path(args.gt).read_text())["videos"]
    trials = []
    for seed in args.seeds:
        order = np.random.default_rng(seed).permutation(len(all_videos))
        videos = [all_videos[i] for i in order]
        fit_ids = [v["video_id"] for v in videos[: args.fit_videos]]
        test_ids = [v["video_id"] for v in videos[args.fit_videos :]]
        gt_test = {"videos": videos[args.fit_videos :]}
        for level in args.levels:
            t0 = time.perf_counter()
            sim = _simulate(videos, level, seed)
            noisy = {}
            for j, (k, video) in enumerate(sim.items()):
                extra = args.noise * np.random.default_rng([seed, j, 1]).standard_normal(video.probs.shape)
                noisy[k] = video.replace(probs=sigmoid(logit(video.probs) + extra).astype(np.float32))
            scores = {}
            for name, inputs in (("decoder", sim), ("candidate", noisy)):
                params = tune_decoder([inputs[k] for k in fit_ids], rounds=args.rounds)
                decoded = decode_videos([inputs[k] for k in test_ids], EventDecoder(params))
                scores[name] = (params["fit"]["objective"], temporal_map(gt_test, decoded)["mAP@0.5"])
            lead = scores["candidate"][0] - scores["decoder"][0]
            gain = scores["candidate"][1] - scores["decoder"][1]
            trials.append((seed, level, lead, gain))
            print(
                f"[seed {seed}, {level}] objective lead {lead:+.4f}, held-out mAP@0.5 difference {gain:+.4f} "
                f"({time.perf_counter() - t0:.0f} s)",
                flush=True,
            )
    print()
    print("| seed | noise | candidate's objective lead | held-out mAP@0.5 difference |")
    print("|---|---|---|---|")
    for seed, level, lead, gain in trials:
        print(f"| {seed} | {level} | {lead:+.4f} | {gain:+.4f} |")
    print()
    leads = np.array([t[2] for t in trials])
    gains = np.array([t[3] for t in trials])
    print(f"| margin | switches | false switches (held-out difference <= 0) | of {len(trials)} trials |")
    print("|---|---|---|---|")
    for margin in MARGINS:
        switch = leads > margin
        false = switch & (gains <= 0)
        print(f"| {margin:g} | {int(switch.sum())} | {int(false.sum())} | {100 * float(false.mean()):.0f} % |")


if __name__ == "__main__":
    main()
