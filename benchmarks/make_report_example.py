"""Make the example report images of the bundle documentation.

A prediction is needed to draw a report; this script makes a realistic one without a trained network:
it takes ground-truth timelines (by default a few videos of the real Galar annotations; or the
``ground_truth.json`` of a generated mini-Galar), simulates noisy frame probabilities from them with
:func:`monai_vce.postprocessing.simulate.simulate_probabilities`, decodes them with the post-processing
chain and event composition of :mod:`monai_vce.postprocessing`, and runs :func:`monai_vce.report.write_report`.
The prediction therefore differs from the ground truth the way a network's does (shifted boundaries,
fragmented sections, missed short events, false bursts), and every score comes from
:func:`monai_vce.metrics.temporal_map`.

Usage (from the repository root)::

    python benchmarks/make_report_example.py                       # real Galar timelines
    python benchmarks/make_report_example.py --gt MINI/ground_truth.json --videos all --show <video_id>

It writes the full report under ``--out`` (default ``runs/report_example``) and copies one timeline and the
summary chart to ``bundle/docs/images/timeline_example.png`` and ``summary_example.png``.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import numpy as np

from monai_vce.data.synthetic import find_galar_events
from monai_vce.labels import LABELS, LANDMARKS, PATHOLOGY, SECTIONS
from monai_vce.metrics import load_events, save_events
from monai_vce.postprocessing import events_to_frames, frames_to_events
from monai_vce.postprocessing.chain import apply_chain
from monai_vce.postprocessing.simulate import simulate_probabilities
from monai_vce.report import write_report
from monai_vce.utils import atomic_save_npz

ROOT = Path(__file__).resolve().parents[1]
GALAR = find_galar_events()  # MONAI_VCE_GALAR_EVENTS, else shared/data beside the checkout
#: A mix of short and long Galar videos with different pathologies.
DEFAULT_VIDEOS = ("14", "18", "22", "26", "27", "32")
#: Hand-set chain parameters per group (sections, landmarks, pathology), in LABELS order; a tuned decoder
#: does better, the point here is a plausible prediction to draw.
_GROUP = np.array([0] * len(SECTIONS) + [1] * len(LANDMARKS) + [2] * len(PATHOLOGY))
CHAIN = {
    "thresholds": np.array([0.5, 0.6, 0.7])[_GROUP],
    "median_windows": np.array([31, 9, 9])[_GROUP],
    "max_gaps": np.array([30, 5, 10])[_GROUP],
    "min_lengths": np.array([60, 3, 8])[_GROUP],
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--gt", default=GALAR, required=GALAR is None, help="ground-truth event JSON (frame_index units)"
    )
    parser.add_argument("--videos", nargs="+", default=list(DEFAULT_VIDEOS), help="video ids, or 'all'")
    parser.add_argument("--show", default="27", help="video whose timeline becomes the example image")
    parser.add_argument("--level", default="low", help="noise level of the simulated probabilities")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=str(ROOT / "runs" / "report_example"))
    parser.add_argument("--images", default=str(ROOT / "bundle" / "docs" / "images"))
    args = parser.parse_args()

    gt_all = load_events(args.gt)
    by_id = {v["video_id"]: v["events"] for v in gt_all["videos"]}
    ids = list(by_id) if args.videos == ["all"] else args.videos
    out = Path(args.out)
    rng = np.random.default_rng(args.seed)
    gt_videos, pred_videos = [], []
    for vid in ids:
        events = by_id[vid]
        frame_ids = np.arange(max(e["end"] for e in events) + 1, dtype=np.int64)
        truth = events_to_frames(events, frame_ids)
        probs = simulate_probabilities(truth, level=args.level, seed=rng)
        active = apply_chain(probs, **CHAIN)
        pred_videos.append({"video_id": vid, "events": frames_to_events(active, frame_ids, mode="label_set")})
        gt_videos.append({"video_id": vid, "events": events})
        atomic_save_npz(
            out / "probs" / f"{vid}.npz",
            probs=probs,
            frame_index=frame_ids,
            frame_number=frame_ids,
            labels=np.array(LABELS),
        )
    gt_path, pred_path = out / "gt.json", out / "pred.json"
    save_events(gt_path, {"videos": gt_videos})
    save_events(pred_path, {"videos": pred_videos})
    result = write_report(pred_path, out / "report", gt=gt_path, probs_dir=out / "probs")

    images = Path(args.images)
    images.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(result["timelines"][args.show], images / "timeline_example.png")
    shutil.copyfile(result["summary_png"], images / "summary_example.png")
    m = result["metrics"]
    print(
        json.dumps(
            {
                "mAP@0.5": m["mAP@0.5"],
                "mAP@0.95": m["mAP@0.95"],
                "report": str(out / "report"),
                "images": [str(images / "timeline_example.png"), str(images / "summary_example.png")],
            }
        )
    )


if __name__ == "__main__":
    main()
