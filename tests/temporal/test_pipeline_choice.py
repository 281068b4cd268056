"""The validation-time pipeline choice keeps the frame pipeline where the refiner loses (``select_pipeline``)."""

from __future__ import annotations

import numpy as np
import torch

from monai_vce.data.synthetic import builtin_timeline
from monai_vce.events import Video, with_ground_truth
from monai_vce.metrics import temporal_map
from monai_vce.postprocessing import EventDecoder, decode_videos, frames_to_events, simulate_probabilities, tune_decoder
from monai_vce.temporal import RefinerEnsemble, cross_fit_refiner, select_pipeline

GRIDS = {"threshold": (0.3, 0.5, 0.7), "median_window": (1, 9), "max_gap": (0, 5), "min_length": (0, 5)}


def _videos(n: int, family: str) -> dict[str, Video]:
    out = {}
    for j in range(n):
        rng = np.random.default_rng([7, j])
        truth = builtin_timeline(1200, rng, min_event_frames=3)
        ids = np.arange(len(truth))
        probs = simulate_probabilities(truth, family, seed=rng)
        out[f"v{j}"] = with_ground_truth(Video(f"v{j}", probs, ids, ids), frames_to_events(truth, ids), "frame_index")
    return out


def test_choice_keeps_the_decoder_where_the_refiner_loses_on_ramped_boundaries():
    videos = _videos(16, "ramp")
    fit, test = dict(list(videos.items())[:8]), list(videos.values())[8:]
    torch.manual_seed(0)
    # an under-trained refiner on ramped boundaries: a pipeline that loses, on validation and held out
    cross = cross_fit_refiner(fit, folds=2, seed=0, steps=5, crop_length=256, passthrough=())
    tuned = {
        "decoder": tune_decoder(list(fit.values()), rounds=1, grids=GRIDS),
        "refiner": tune_decoder(cross.tuning_videos(fit), rounds=1, grids=GRIDS),
    }
    ensemble = RefinerEnsemble(cross.fold_refiners)
    gt = {"videos": [{"video_id": v.video_id, "events": v.events} for v in test]}
    held_out = {
        "decoder": temporal_map(gt, decode_videos(test, EventDecoder(tuned["decoder"])))["mAP@0.5"],
        "refiner": temporal_map(
            gt, decode_videos([v.replace(probs=ensemble.refine(v.probs)) for v in test], EventDecoder(tuned["refiner"]))
        )["mAP@0.5"],
    }
    assert held_out["refiner"] < held_out["decoder"] - 0.02  # the refiner really loses here
    assert tuned["refiner"]["fit"]["objective"] < tuned["decoder"]["fit"]["objective"]
    assert select_pipeline(tuned, baseline="decoder") == "decoder"
    # without a baseline the choice is the best objective, which is still the decoder
    assert select_pipeline(tuned) == "decoder"
