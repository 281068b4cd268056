"""End-to-end inference throughput on CPU: the optimised input pipeline against a straightforward baseline.

Both pipelines run in the same process on the same generated mini-Galar frames (PNG at real Galar frame
sizes, 336 and 512 px) with the same full-size network (ViT-B/16 with differential attention, random
weights, 224 px input) and the same event decoder, and are timed per stage:

- decode+resize: PNG -> 224 px frame. Baseline: PIL per frame in the main process, float32 conversion, float
  bilinear resize. Pipeline: :class:`monai_vce.data.LoadVCEFramed` (``uint8`` decode and antialiased resize)
  in DataLoader worker processes, one per core, persistent, prefetching; the column gives the CPU seconds the
  workers spent and, in brackets, the seconds the main process waited for a batch (the loader bottleneck).
- model: batches of the same size; baseline fp32 under ``torch.no_grad()``, pipeline ``uint8`` batches
  scaled on the device (:class:`monai_vce.data.VCEPrepareBatch`) under ``torch.inference_mode()``, with
  bf16 autocast when a calibration on this machine shows it faster than fp32.
- events: per-video probabilities -> challenge events with :func:`monai_vce.postprocessing.decode_videos`.

Prints one Markdown table (and the speed-up) ready for ``BENCHMARKS.md``.

Usage::

    python benchmarks/inference_throughput.py                 # full-size network, 2 videos x 16 frames per size
    python benchmarks/inference_throughput.py --frames 64     # longer
    python benchmarks/inference_throughput.py --tiny          # seconds: tiny network at 64 px (smoke test)
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch


def _frames(root: Path, size: int, videos: int, frames: int, seed: int) -> list[dict]:
    """Generate a mini-Galar at ``size`` px (or reuse one generated with the same arguments) and list its frames."""
    from monai_vce.data.galar import build_inference_datalist
    from monai_vce.data.synthetic import generate_mini_galar

    out = root / f"mini_galar_{size}px_{videos}x{frames}_s{seed}"
    if not (out / "ground_truth.json").is_file():
        generate_mini_galar(out, videos=videos, frames_per_video=frames, size=size, seed=seed)
    return build_inference_datalist(out / "frames", frame_index="position")


def _network(tiny: bool) -> torch.nn.Module:
    from monai_vce.networks import TINY_MODEL_NAME, DiffAttnCLIPClassifier

    net = (
        DiffAttnCLIPClassifier(backbone=TINY_MODEL_NAME, pretrained=False)
        if tiny
        else DiffAttnCLIPClassifier(pretrained=False)
    )
    return net.eval()


def _by_video(datalist: Sequence[dict], probs: np.ndarray) -> list:
    from monai_vce.events import Video

    vids = np.array([d["video_id"] for d in datalist])
    ids = np.array([d["frame_index"] for d in datalist], dtype=np.int64)
    out = []
    for v in dict.fromkeys(vids.tolist()):
        sel = vids == v
        out.append(Video(v, probs[sel], ids[sel], ids[sel]))
    return out


def run_baseline(datalist: Sequence[dict], model: torch.nn.Module, image_size: int, batch_size: int) -> dict:
    """Single process, fp32, PIL per frame with a float resize, a Python loop feeding batches."""
    from PIL import Image

    from monai_vce.postprocessing import decode_videos

    load_s = model_s = 0.0
    outputs, batch = [], []
    t_start = time.perf_counter()

    def flush():
        nonlocal model_s
        t = time.perf_counter()
        with torch.no_grad():
            outputs.append(torch.sigmoid(model(torch.stack(batch))).numpy())
        model_s += time.perf_counter() - t
        batch.clear()

    for item in datalist:
        t = time.perf_counter()
        img = np.asarray(Image.open(item["image"]).convert("RGB"), dtype=np.float32) / 255.0
        x = torch.from_numpy(img).permute(2, 0, 1)[None]
        x = torch.nn.functional.interpolate(x, size=(image_size, image_size), mode="bilinear", antialias=True)[0]
        batch.append(x.clamp_(0, 1))
        load_s += time.perf_counter() - t
        if len(batch) == batch_size:
            flush()
    if batch:
        flush()
    probs = np.concatenate(outputs)
    t = time.perf_counter()
    events = decode_videos(_by_video(datalist, probs))
    events_s = time.perf_counter() - t
    total = time.perf_counter() - t_start
    return {
        "probs": probs,
        "events": events,
        "total": total,
        "decode_cpu": load_s,
        "wait": load_s,
        "model": model_s,
        "events_s": events_s,
    }


class _TimedFrames(torch.utils.data.Dataset):
    """The inference dataset, also reporting the worker CPU time spent decoding each frame."""

    def __init__(self, datalist: Sequence[dict], image_size: int):
        from monai_vce.data import LoadVCEFramed

        self.data = list(datalist)
        self.load = LoadVCEFramed(keys="image", image_size=image_size)

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> dict:
        t = time.thread_time()
        d = self.load(self.data[i])
        return {"image": d["image"], "decode_s": time.thread_time() - t}


def amp_context(dtype: torch.dtype | None, device: str = "cpu"):
    """``torch.autocast`` for ``dtype``, or a null context for fp32."""
    return torch.autocast(device, dtype=dtype) if dtype is not None else contextlib.nullcontext()


def calibrate_amp(
    model: torch.nn.Module, image_size: int, batch_size: int = 4, rounds: int = 3
) -> tuple[torch.dtype | None, dict]:
    """Time the model in fp32 and bf16 autocast on random input, alternating, best of ``rounds`` each.

    Returns the faster choice (``torch.bfloat16`` or ``None`` for fp32) and the best seconds per image.
    """
    x = torch.rand(batch_size, 3, image_size, image_size)
    choices = {"fp32": None, "bf16": torch.bfloat16}
    times = {name: float("inf") for name in choices}
    with torch.inference_mode():
        for dtype in choices.values():  # warm-up
            with amp_context(dtype):
                model(x[:2])
        for _ in range(rounds):  # alternating, so that a busy moment hits both
            for name, dtype in choices.items():
                with amp_context(dtype):
                    t = time.perf_counter()
                    model(x)
                    times[name] = min(times[name], (time.perf_counter() - t) / batch_size)
    return (torch.bfloat16 if times["bf16"] < times["fp32"] else None), times


def run_pipeline(
    datalist: Sequence[dict],
    model: torch.nn.Module,
    image_size: int,
    batch_size: int,
    workers: int,
    amp_dtype: torch.dtype | None,
) -> dict:
    """DataLoader workers (uint8 decode+resize), uint8 batches scaled on the device, inference mode, optional bf16."""
    from monai_vce.data import VCEPrepareBatch
    from monai_vce.postprocessing import decode_videos

    prepare = VCEPrepareBatch()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    t_start = time.perf_counter()
    loader = torch.utils.data.DataLoader(
        _TimedFrames(datalist, image_size),
        batch_size=batch_size,
        num_workers=workers,
        persistent_workers=workers > 0,
        prefetch_factor=4 if workers > 0 else None,
        pin_memory=device != "cpu",  # pinned memory only helps a copy to an accelerator
    )
    wait_s = model_s = decode_cpu = 0.0
    outputs = []
    it = iter(loader)
    with torch.inference_mode():
        while True:
            t = time.perf_counter()
            try:
                batch = next(it)
            except StopIteration:
                break
            t1 = time.perf_counter()
            wait_s += t1 - t
            decode_cpu += float(batch["decode_s"].sum())
            image, _ = prepare(batch, device=device, non_blocking=True)
            with amp_context(amp_dtype, device):
                logits = model(image)
            outputs.append(torch.sigmoid(logits.float()).cpu().numpy())
            model_s += time.perf_counter() - t1
    del it, loader  # stops the persistent workers
    probs = np.concatenate(outputs)
    t = time.perf_counter()
    events = decode_videos(_by_video(datalist, probs))
    events_s = time.perf_counter() - t
    total = time.perf_counter() - t_start
    return {
        "probs": probs,
        "events": events,
        "total": total,
        "decode_cpu": decode_cpu,
        "wait": wait_s,
        "model": model_s,
        "events_s": events_s,
    }


def _row(size: int, name: str, n: int, r: dict) -> str:
    dec = f"{r['decode_cpu']:.2f}" if name.startswith("baseline") else f"{r['decode_cpu']:.2f} ({r['wait']:.2f})"
    return (
        f"| {size} px | {name} | {n} | {r['total']:.2f} | {n / r['total']:.2f} | {dec} | {r['model']:.2f} | "
        f"{r['events_s']:.3f} | {100 * r['model'] / r['total']:.0f}% |"
    )


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--frames", type=int, default=16, help="frames per video (default 16)")
    p.add_argument("--videos", type=int, default=2, help="videos per frame size (default 2)")
    p.add_argument("--sizes", type=int, nargs="+", default=[336, 512], help="PNG frame sizes (default 336 512)")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument(
        "--workers", type=int, default=os.cpu_count() or 1, help="DataLoader workers (default: one per core)"
    )
    p.add_argument(
        "--amp", choices=("auto", "fp32", "bf16"), default="auto", help="pipeline precision (auto: the faster)"
    )
    p.add_argument("--tiny", action="store_true", help="tiny network at 64 px input (smoke test)")
    p.add_argument("--data-dir", default=None, help="where to generate frames (default: a temporary folder)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)

    torch.manual_seed(args.seed)
    image_size = 64 if args.tiny else 224
    model = _network(args.tiny)
    n_params = sum(p.numel() for p in model.parameters())
    if args.amp == "auto":
        amp_dtype, cal = calibrate_amp(model, image_size)
        amp_note = f"calibrated fp32 {1 / cal['fp32']:.2f} vs bf16 {1 / cal['bf16']:.2f} images/s -> {'bf16' if amp_dtype else 'fp32'}"
    else:
        amp_dtype, amp_note = (torch.bfloat16 if args.amp == "bf16" else None), f"{args.amp} (forced)"

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(args.data_dir or tmp)
        root.mkdir(parents=True, exist_ok=True)
        rows, totals = [], {"baseline": [0, 0.0], "pipeline": [0, 0.0]}
        max_diff = 0.0
        same_events = True
        for size in args.sizes:
            datalist = _frames(root, size, args.videos, args.frames, args.seed)
            n = len(datalist)
            with torch.inference_mode():  # one warm-up batch each, outside the timings
                model(torch.rand(2, 3, image_size, image_size))
            base = run_baseline(datalist, model, image_size, args.batch_size)
            pipe = run_pipeline(datalist, model, image_size, args.batch_size, args.workers, amp_dtype)
            max_diff = max(max_diff, float(np.abs(base["probs"] - pipe["probs"]).max()))
            same_events &= base["events"] == pipe["events"]
            rows += [_row(size, "baseline", n, base), _row(size, "pipeline", n, pipe)]
            for k, r in (("baseline", base), ("pipeline", pipe)):
                totals[k][0] += n
                totals[k][1] += r["total"]
                rows[-1 if k == "pipeline" else -2] += f" {n / r['total'] / (len(datalist) / base['total']):.2f}x |"

    fps = {k: v[0] / v[1] for k, v in totals.items()}
    net = "tiny DiffAttn ViT (64 px)" if args.tiny else "DiffAttn ViT-B/16 (224 px, random weights)"
    print(
        f"network: {net}, {n_params / 1e6:.1f} M parameters; batch {args.batch_size}; CPU threads {torch.get_num_threads()}; "
        f"workers {args.workers}; pipeline precision: {amp_note}"
    )
    print()
    print(
        "| frames | pipeline | n | wall s | frames/s | decode+resize CPU s (loader wait s) | model s | events s | model share of wall | vs baseline |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    print("\n".join(rows))
    print()
    print(
        f"end to end: baseline {fps['baseline']:.2f} frames/s, pipeline {fps['pipeline']:.2f} frames/s, "
        f"speed-up {fps['pipeline'] / fps['baseline']:.2f}x"
    )
    print(f"max |probability difference| pipeline vs baseline: {max_diff:.4f}; identical events: {same_events}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
