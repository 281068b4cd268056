"""Frame loading: the checked decoder (whole-file checks + Pillow) against torchvision's ``decode_png``, side by side.

The loader checks every PNG whole (structure, every chunk's CRC-32, the pixel count of its header) and decodes it with
Pillow, because torchvision's ``decode_png`` crashes the process on a damaged PNG. This script measures what that
costs per frame, resize to 224 px included, on smooth synthetic frames (they compress like capsule frames; random
noise does not), and checks that both paths give the same pixels.

Usage::

    OMP_NUM_THREADS=1 python benchmarks/frame_loading.py [--sizes 336 512] [--frames 40] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
import warnings

import numpy as np
import torch
from PIL import Image

from monai_vce.data.frames import load_vce_frame, resize_frame

__all__ = ["main"]


def _frame(size: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:size, 0:size]
    img = np.stack([x * 255 // size, y * 255 // size, (x + y) * 127 // size], -1)
    return np.clip(img + rng.integers(-8, 9, img.shape), 0, 255).astype(np.uint8)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[336, 512])
    p.add_argument("--frames", type=int, default=40, help="loads per timing")
    p.add_argument("--repeats", type=int, default=3, help="timings per path; the best counts")
    args = p.parse_args(argv)
    warnings.simplefilter("ignore")  # torchvision's decoders are deprecated in favour of torchcodec
    from torchvision.io import ImageReadMode, decode_png

    torch.set_num_threads(1)
    folder = tempfile.mkdtemp()
    print(f"load average {os.getloadavg()[0]:.1f}; best of {args.repeats} x {args.frames} loads per cell")
    print("| frame | file | torchvision decode_png + resize | checks + Pillow + resize (the loader) | same pixels |")
    print("|---|---|---|---|---|")
    for size in args.sizes:
        path = os.path.join(folder, f"frame_{size}.png")
        Image.fromarray(_frame(size)).save(path)

        def torchvision_path(path: str = path) -> torch.Tensor:
            with open(path, "rb") as f:
                raw = torch.frombuffer(bytearray(f.read()), dtype=torch.uint8)
            return resize_frame(decode_png(raw, mode=ImageReadMode.RGB), 224)

        def loader_path(path: str = path) -> torch.Tensor:
            return load_vce_frame(path, 224)

        same = torch.equal(torchvision_path(), loader_path())
        best = {}
        for _ in range(args.repeats):
            for name, fn in (("tv", torchvision_path), ("ours", loader_path)):
                t0 = time.perf_counter()
                for _ in range(args.frames):
                    fn()
                ms = 1000 * (time.perf_counter() - t0) / args.frames
                best[name] = min(best.get(name, ms), ms)
        kb = os.path.getsize(path) // 1024
        print(f"| {size} px | {kb} kB | {best['tv']:.2f} ms | {best['ours']:.2f} ms | {same} |")


if __name__ == "__main__":
    main()
