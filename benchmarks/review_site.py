"""Size and build time of a review site for a full-length exam (frame folder and video file).

A 130,000-frame exam in a frame folder (hard links to 400 generated 336 px frames, so the disk holds few
bytes) with random probabilities and ``--events`` events, and an exam stored as a video file (generated,
336 px, H.264) whose events ask for more full-size frames than the site stores. Prints a Markdown table:
frames, events, thumbnails, stored full-size frames, site size and build time.

    python benchmarks/review_site.py [--frames 130000] [--video-frames 6000] [--events 1000] [--workers 2]
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

from monai_vce.events import Video, save_video_probs
from monai_vce.labels import LABELS
from monai_vce.review import write_review_site


def _events(n_frames: int, n: int, rng: np.random.Generator) -> list[dict]:
    starts = np.sort(rng.choice(n_frames - 200, n, replace=False))
    return [
        {"start": int(s), "end": int(s + rng.integers(0, 150)), "label": [LABELS[int(rng.integers(0, 17))]]}
        for s in rng.permutation(starts)
    ]


def _size(folder: Path) -> tuple[int, int, int]:
    total = thumbs = full = 0
    for p in folder.rglob("*"):
        if p.is_file():
            total += p.stat().st_size
            thumbs += p.parent.name == "thumbs"
            full += p.parent.name == "frames"
    return total, thumbs, full


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--frames", type=int, default=130_000)
    p.add_argument("--video-frames", type=int, default=6000)
    p.add_argument("--events", type=int, default=1000)
    p.add_argument("--workers", type=int, default=2)
    args = p.parse_args()
    from monai_vce.data import generate_mini_galar

    rng = np.random.default_rng(0)
    root = Path(tempfile.mkdtemp(prefix="review_bench_"))
    rows = []
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            src = generate_mini_galar(root / "src", videos=1, frames_per_video=400, size=336, seed=0)
            vsrc = generate_mini_galar(
                root / "vsrc", videos=1, frames_per_video=args.video_frames, size=336, seed=1, video_format="mp4"
            )
        pngs = sorted((src / "frames" / "1").iterdir())
        folder = root / "exam" / "frames" / "long"
        folder.mkdir(parents=True)
        for i in range(args.frames):
            os.link(pngs[i % len(pngs)], folder / f"frame_{i:06d}.PNG")
        for kind, frames_root, n in (
            ("frame folder", root / "exam" / "frames", args.frames),
            ("video file (H.264)", vsrc / "frames", args.video_frames),
        ):
            vid = "long" if kind == "frame folder" else "1"
            probs = (rng.random((n, len(LABELS))) ** 3).astype(np.float32)
            save_video_probs(root / kind / f"{vid}.npz", Video(vid, probs, np.arange(n), np.arange(n)))
            pred = {"videos": [{"video_id": vid, "events": _events(n, args.events, rng)}]}
            out = root / kind / "site"
            t0 = time.perf_counter()
            write_review_site(pred, frames_root, out, probs_dir=root / kind, num_workers=args.workers, progress=False)
            elapsed = time.perf_counter() - t0
            total, thumbs, full = _size(out)
            rows.append((kind, n, args.events, thumbs, full, total / 2**20, elapsed))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print("| exam | frames | events | thumbnails | full-size frames | site size | build time |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for kind, n, ev, th, full, mb, sec in rows:
        print(f"| {kind} | {n:,} | {ev:,} | {th:,} | {full:,} | {mb:.1f} MiB | {sec:.1f} s |")


if __name__ == "__main__":
    main()
