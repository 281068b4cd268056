"""Inference cost of differential attention: plain ViT-B/16 image tower vs the converted one, side by side.

BiomedCLIP's image tower (timm ``vit_base_patch16_224`` + 768 -> 512 projection) is built once with random weights
(offline); copies are converted to differential attention in every block. All variants run in one process, in
rotating order within each repeat (so that load from other processes hits them alike), in ``torch.inference_mode``
at float32. The median wall-clock and process CPU time per batch and their ratios to the plain tower are printed as
a Markdown table; CPU time is less sensitive than wall time to other processes sharing the cores.

Variants: ``plain``; the attention variants ``paper`` (constant lambda_init, no sub-norm), ``diff_transformer``
(Ye et al.'s, with the per-head sub-norm), ``preserving`` and ``authors`` (the paper authors' head-group layout) with
the default ``attn_impl="auto"`` (one fused ``scaled_dot_product_attention`` call per block, on CPU too); ``diff_transformer (explicit)``, the explicit-map
reference path (``--explicit-variant``). The load average of the machine before and after the run is printed with the table.

Usage (from the repository root)::

    python benchmarks/attention_overhead.py                    # batch 16, 2 warm-up + 5 timed repeats
    python benchmarks/attention_overhead.py --repeats 9 --threads 2 --explicit-variant
"""

from __future__ import annotations

import argparse
import copy
import os
import platform
import statistics
import time

import torch

from monai_vce.networks import BIOMEDCLIP_HUB_ID, build_image_tower, convert_to_diff_attention


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--warmup", type=int, default=2, help="untimed rounds over all variants")
    parser.add_argument("--repeats", type=int, default=5, help="timed rounds over all variants")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--explicit-variant", action="store_true", help="add the explicit-map reference path")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)

    torch.manual_seed(0)
    plain = build_image_tower(BIOMEDCLIP_HUB_ID, pretrained=False).visual.eval()
    variants = {"plain": plain}
    for name, variant, impl in (
        ("paper", "paper", "auto"),
        ("diff_transformer", "diff_transformer", "auto"),
        ("preserving", "preserving", "auto"),
        ("authors", "authors", "auto"),
        ("diff_transformer (explicit)", "diff_transformer", "explicit"),
    ):
        if impl == "explicit" and not args.explicit_variant:
            continue
        model = copy.deepcopy(plain)
        convert_to_diff_attention(model, variant=variant, attn_impl=impl)
        variants[name] = model.eval()
    for model in variants.values():
        model.to(device)

    x = torch.rand(args.batch_size, 3, 224, 224, device=device)
    times: dict[str, list[float]] = {name: [] for name in variants}
    cpu_times: dict[str, list[float]] = {name: [] for name in variants}
    names = list(variants)
    load_before = os.getloadavg() if hasattr(os, "getloadavg") else None
    with torch.inference_mode():
        for r in range(args.warmup + args.repeats):
            order = names[r % len(names) :] + names[: r % len(names)]
            for name in order:
                if device.type == "cuda":
                    torch.cuda.synchronize()
                start, cpu_start = time.perf_counter(), time.process_time()
                variants[name](x)
                if device.type == "cuda":
                    torch.cuda.synchronize()
                if r >= args.warmup:
                    times[name].append(time.perf_counter() - start)
                    cpu_times[name].append(time.process_time() - cpu_start)

    load_after = os.getloadavg() if hasattr(os, "getloadavg") else None
    base = statistics.median(times["plain"])
    cpu_base = statistics.median(cpu_times["plain"])
    print(
        f"# ViT-B/16 image tower, batch {args.batch_size}, 224 px, fp32 inference, {args.device}, "
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, {platform.machine()}, "
        f"{args.warmup} warm-up + {args.repeats} timed rounds (interleaved)"
    )
    if load_before is not None and load_after is not None:
        print(
            f"# load average (1, 5, 15 min) on {os.cpu_count()} cores: before {', '.join(f'{v:.2f}' for v in load_before)}; "
            f"after {', '.join(f'{v:.2f}' for v in load_after)}"
        )
    print(
        "| variant | median wall s / batch | min wall s / batch | wall ratio to plain | median CPU s / batch | CPU ratio to plain |"
    )
    print("|---|---|---|---|---|---|")
    for name in names:
        med, cpu = statistics.median(times[name]), statistics.median(cpu_times[name])
        print(f"| {name} | {med:.3f} | {min(times[name]):.3f} | {med / base:.3f} | {cpu:.3f} | {cpu / cpu_base:.3f} |")


if __name__ == "__main__":
    main()
