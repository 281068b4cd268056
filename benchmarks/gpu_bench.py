"""Accelerator throughput of inference and training, with and without ``torch.compile``; one table.

Measures, for the full-size network (ViT-B/16 with differential attention, random weights, 224 px, bf16
autocast):

- inference, model only: ``uint8`` batches already on the device (the ceiling of the end-to-end figure);
- inference, end to end, through the bundle as users run it (``bundle/configs/inference.json`` via
  ``monai.bundle``, the network's weights read back by the bundle's checkpoint loader): PNG files -> DataLoader
  workers (one per core, persistent, prefetching, pinned memory) -> ``uint8`` to the device -> model under
  ``torch.inference_mode()`` -> per-video probability files -> the event JSON (the events stage is also timed
  alone);
- reduced inference, end to end, through the same bundle with its ``reduction`` keys (strided every 8th frame,
  and coarse-to-fine from stride 8 aimed at the default decoder): frames/s counts the frames of the videos, and
  the share of frames that went through the network is given (with random weights the refinement has little to
  go on, so that share is not the one of a trained model);
- training, model only: forward + asymmetric focal loss + backward + AdamW step on device-resident batches;
- training, end to end: the same fed by the training augmentations (``train#preprocessing`` of ``bundle/configs/train.json``)
  in the workers;
- the plain ViT / differential attention ratio (model-only inference and training, eager);
- peak device memory of each phase.

Frames: a pool of generated mini-Galar frames (rendered in parallel, one process per video) at Galar's 336 px;
the long frame lists cycle over the pool, so each frame file is decoded many times (as real files are, from the
page cache or a fast disk).

``--device cpu --tiny`` is a smoke mode (tiny network at 64 px, a few batches) that runs the same code anywhere.

Usage::

    python benchmarks/gpu_bench.py                          # on a GPU; see benchmarks/gpu.sh
    python benchmarks/gpu_bench.py --device cpu --tiny      # smoke test
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import torch


# ---------------------------------------------------------------------------------------------------------- data
def _render_one(args: tuple[str, int, int, int]) -> str:
    from monai_vce.data.synthetic import generate_mini_galar

    out, frames, size, seed = args
    if not (Path(out) / "ground_truth.json").is_file():
        generate_mini_galar(
            out, videos=1, frames_per_video=frames, size=size, seed=seed, use_real_timelines=False, naming="galar"
        )
    return out


def make_pool(root: Path, videos: int, frames: int, size: int, workers: int) -> list[dict]:
    """Render ``videos`` one-video mini-Galars in parallel; return their labelled frames (``video_id`` made unique)."""
    from monai_vce.data.galar import build_galar_datalist

    jobs = [(str(root / f"pool_{size}px_{frames}f_{v}"), frames, size, v) for v in range(videos)]
    with ProcessPoolExecutor(max_workers=max(1, min(workers, videos))) as ex:
        outs = list(ex.map(_render_one, jobs))
    pool = []
    for v, out in enumerate(outs):
        for item in build_galar_datalist(Path(out) / "frames", Path(out) / "labels"):
            pool.append({**item, "video_id": f"pool{v}"})
    return pool


def long_list(pool: Sequence[dict], n: int, video_len: int) -> list[dict]:
    """``n`` frames cycling over ``pool``, cut into videos of ``video_len`` frames in frame order."""
    return [
        {
            "image": pool[i % len(pool)]["image"],
            "label": pool[i % len(pool)]["label"],
            "video_id": f"video{i // video_len:03d}",
            "frame_index": i % video_len,
        }
        for i in range(n)
    ]


def _loader(
    dataset, batch_size: int, workers: int, device: torch.device, shuffle: bool = False, drop_last: bool = False
):
    return torch.utils.data.DataLoader(
        dataset,
        batch_size=batch_size,
        shuffle=shuffle,
        drop_last=drop_last,
        num_workers=workers,
        persistent_workers=workers > 0,
        prefetch_factor=4 if workers > 0 else None,
        pin_memory=device.type == "cuda",
    )


# ---------------------------------------------------------------------------------------------------------- timing
def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def _peak_gib(device: torch.device) -> float | None:
    return torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None


def _autocast(device: torch.device):
    return torch.autocast(device.type, dtype=torch.bfloat16)


def build_network(tiny: bool, attention: str, device: torch.device) -> torch.nn.Module:
    from monai_vce.networks import TINY_MODEL_NAME, DiffAttnCLIPClassifier

    kw = {"backbone": TINY_MODEL_NAME} if tiny else {}
    return DiffAttnCLIPClassifier(pretrained=False, attention=attention, **kw).to(device)


def infer_model_only(model, device, image_size: int, batch: int, batches: int) -> float:
    """frames/s of the model alone on device-resident uint8 batches (scaled to [0, 1] on the device)."""
    from monai_vce.data import VCEPrepareBatch

    prepare = VCEPrepareBatch()
    x = torch.randint(0, 256, (batch, 3, image_size, image_size), dtype=torch.uint8, device=device)
    model.eval()
    with torch.inference_mode(), _autocast(device):
        for _ in range(2):
            model(prepare({"image": x}, device)[0])
        _sync(device)
        t = time.perf_counter()
        for _ in range(batches):
            model(prepare({"image": x}, device)[0])
        _sync(device)
    return batch * batches / (time.perf_counter() - t)


BUNDLE = Path(__file__).resolve().parents[1] / "bundle"


def write_datalist(data: Sequence[dict], path: Path) -> Path:
    """The inference datalist as a JSON file, which the bundle's ``dataset_dir`` accepts in place of a folder."""
    keys = ("image", "video_id", "frame_index")
    path.write_text(json.dumps([{k: d[k] for k in keys} for d in data]))
    return path


def bundle_inference(
    model: torch.nn.Module,
    device: torch.device,
    datalist_file: Path,
    ckpt_dir: Path,
    image_size: int,
    batch: int,
    workers: int,
    reduction: dict | None = None,
) -> tuple[float, float, float]:
    """The bundle's inference as users run it (``bundle/configs/inference.json`` through ``monai.bundle``,
    the ``reduction`` keys set for reduced inference), with ``model`` as the network (its weights saved in
    ``ckpt_dir/model.pt`` and loaded by the bundle's checkpoint loader).

    Returns:
        frames of the videos per second from the start of the run (checkpoint loading, loader workers, network,
        per-video files and the event JSON), the share of frames that went through the network, and the seconds
        of the events stage alone (decoding every file into the JSON, timed once more after the run).
    """
    from monai.bundle import ConfigWorkflow

    from monai_vce.events.probabilities import load_video_probs, probability_files
    from monai_vce.stages import decode

    keys = {
        "stride": 1,
        "refine": True,
        "budget": None,
        "margin": 0.3,
        "duplicate_tolerance": 0.0,
        "novelty_tolerance": 0.0,
    }
    keys["options"] = {}
    with tempfile.TemporaryDirectory() as out:
        wf = ConfigWorkflow(
            config_file=str(BUNDLE / "configs" / "inference.json"),
            meta_file=str(BUNDLE / "configs" / "metadata.json"),
            logging_file=False,
            workflow_type="infer",
            bundle_root=str(BUNDLE),
            dataset_dir=str(datalist_file),
            ckpt_dir=str(ckpt_dir),
            decoder_params=None,
            output_dir=out,
            network=model,
            device=device,
            amp=device.type == "cuda",
            cpu_amp=device.type == "cpu",
            amp_dtype="bfloat16",
            image_size=image_size,
            batch_size=batch,
            num_workers=workers,
            progress=False,
            report=False,
            review=False,
            resume=False,
            compile=False,  # a compiled model is passed in as the network
            reduction={**keys, **(reduction or {})},
            **{"decode#_disabled_": True},  # decoded below, timed on its own
        )
        wf.initialize()
        for name in ("dataset", "evaluator", "reduced_inference"):  # built before the clock starts
            wf.parser.get_parsed_content(name)
        # the DataLoader workers of earlier runs in this process are stopped when collected (seconds each): not here
        gc.collect()
        _sync(device)
        t = time.perf_counter()
        wf.run()
        _sync(device)
        wall = time.perf_counter() - t
        t = time.perf_counter()
        parsed = wf.parser.get_parsed_content
        decode(Path(out) / "probs", Path(out) / "events.json", parsed("decoder"), parsed("videos"))
        events_s = time.perf_counter() - t
        wf.finalize()
        videos = [load_video_probs(p) for p in probability_files(Path(out) / "probs").values()]
    frames = sum(len(v) for v in videos)
    inferred = sum(len(v) if v.inferred is None else int(v.inferred.sum()) for v in videos)
    return frames / wall, inferred / max(frames, 1), events_s


def _train_step_fn(model, device) -> Callable[[torch.Tensor, torch.Tensor], None]:
    from monai_vce.data import VCEPrepareBatch
    from monai_vce.losses import VCEAsymmetricFocalLoss

    prepare = VCEPrepareBatch()
    loss_fn = VCEAsymmetricFocalLoss()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, weight_decay=0.05)
    model.train()

    def step(images: torch.Tensor, labels: torch.Tensor) -> None:
        x, y = prepare({"image": images, "label": labels}, device, non_blocking=True)
        with _autocast(device):
            loss = loss_fn(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    return step


def train_model_only(model, device, image_size: int, batch: int, steps: int) -> float:
    step = _train_step_fn(model, device)
    x = torch.randint(0, 256, (batch, 3, image_size, image_size), dtype=torch.uint8, device=device)
    y = (torch.rand(batch, 17, device=device) < 0.1).float()
    for _ in range(2):
        step(x, y)
    _sync(device)
    t = time.perf_counter()
    for _ in range(steps):
        step(x, y)
    _sync(device)
    return batch * steps / (time.perf_counter() - t)


def train_end_to_end(
    model, device, data: Sequence[dict], image_size: int, batch: int, steps: int, workers: int
) -> float:
    from monai.bundle import ConfigParser
    from monai.data import Dataset

    parser = ConfigParser()
    parser.read_config(str(BUNDLE / "configs" / "train.json"))
    parser["image_size"] = image_size
    step = _train_step_fn(model, device)
    loader = _loader(
        Dataset(list(data), parser.get_parsed_content("train#preprocessing")),
        batch,
        workers,
        device,
        shuffle=True,
        drop_last=True,
    )
    it = iter(loader)
    b = next(it)  # workers started and one step taken outside the timing (compile warm-up lives here too)
    step(b["image"], b["label"])
    _sync(device)
    t = time.perf_counter()
    n = 0
    for _ in range(steps):
        b = next(it)
        step(b["image"], b["label"])
        n += b["image"].shape[0]
    _sync(device)
    fps = n / (time.perf_counter() - t)
    del it, loader
    return fps


def _timed(fn: Callable[[], float]) -> tuple[float, float]:
    t = time.perf_counter()
    v = fn()
    return v, time.perf_counter() - t


# ---------------------------------------------------------------------------------------------------------- main
#: Reduced inference measured end to end (the bundle's ``reduction`` keys).
REDUCTIONS: dict[str, dict] = {"strided": {"stride": 8, "refine": False}, "c2f": {"stride": 8}}


def measure_variant(
    key: str,
    attention: str,
    mode: str,
    args: argparse.Namespace,
    device: torch.device,
    image_size: int,
    datalist_file: Path,
    train_data: Sequence[dict],
) -> dict[str, object]:
    """Every phase of one network variant (``attention`` ``"diff"`` or ``"plain"``, ``mode`` eager or compiled)."""
    base = build_network(args.tiny, attention, device)
    model = torch.compile(base) if mode == "compiled" else base
    r: dict[str, object] = {}

    def phase(fields: tuple[str, ...], fn: Callable[[], object]) -> None:
        # one failing phase (e.g. a compile error) must not cost the other figures
        try:
            out = fn()
        except Exception as e:
            print(f"[{key}] {fields[0]} failed: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
            r.update({f: "failed" for f in fields})
            return
        values = out if isinstance(out, tuple) else (out,)
        r.update(zip(fields, values, strict=True))

    _reset_peak(device)
    phase(
        ("infer_model", "infer_model_s"),
        lambda: _timed(lambda: infer_model_only(model, device, image_size, args.batch_size, args.infer_batches)),
    )
    r["infer_peak"] = _peak_gib(device)
    if attention == "diff":
        with tempfile.TemporaryDirectory() as ckpt_dir:
            torch.save(model.state_dict(), Path(ckpt_dir) / "model.pt")  # what the bundle's loader reads back
            for name, reduction in {"e2e": None, **REDUCTIONS}.items():
                phase(
                    (f"infer_{name}", f"share_{name}", f"events_{name}"),
                    lambda reduction=reduction: bundle_inference(
                        model,
                        device,
                        datalist_file,
                        Path(ckpt_dir),
                        image_size,
                        args.batch_size,
                        args.workers,
                        reduction,
                    ),
                )
    _reset_peak(device)
    phase(
        ("train_model", "train_model_s"),
        lambda: _timed(lambda: train_model_only(model, device, image_size, args.train_batch_size, args.train_steps)),
    )
    r["train_peak"] = _peak_gib(device)
    if attention == "diff":
        phase(
            ("train_e2e",),
            lambda: train_end_to_end(
                model, device, train_data, image_size, args.train_batch_size, args.train_steps, args.workers
            ),
        )
    return r


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--tiny", action="store_true", help="tiny network at 64 px, few batches (smoke test)")
    p.add_argument("--compile", choices=("both", "off", "only"), default="both")
    p.add_argument("--frame-size", type=int, default=336, help="PNG size of the generated frames")
    p.add_argument("--pool-videos", type=int, default=8)
    p.add_argument("--pool-frames", type=int, default=32, help="frames rendered per pool video")
    p.add_argument("--frames", type=int, default=30720, help="frames of the end-to-end inference run")
    p.add_argument("--video-len", type=int, default=5120, help="frames per video in the end-to-end run")
    p.add_argument("--batch-size", type=int, default=256, help="inference batch")
    p.add_argument("--train-batch-size", type=int, default=128)
    p.add_argument("--infer-batches", type=int, default=30)
    p.add_argument("--train-steps", type=int, default=30)
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    p.add_argument("--data-dir", default=None)
    args = p.parse_args(argv)

    device = torch.device(args.device)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        torch.backends.cudnn.benchmark = True
    if args.tiny:  # a smoke run: every code path, minutes on a laptop CPU
        args.batch_size, args.train_batch_size = min(args.batch_size, 32), min(args.train_batch_size, 16)
        args.infer_batches, args.train_steps = min(args.infer_batches, 3), min(args.train_steps, 3)
        args.frames, args.video_len = min(args.frames, 8 * args.batch_size), min(args.video_len, 3 * args.batch_size)
        args.pool_videos, args.pool_frames, args.frame_size = (
            min(args.pool_videos, 2),
            min(args.pool_frames, 8),
            min(args.frame_size, 96),
        )
    image_size = 64 if args.tiny else 224
    torch.manual_seed(0)
    modes = {"both": ("eager", "compiled"), "off": ("eager",), "only": ("compiled",)}[args.compile]

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(args.data_dir or tmp)
        root.mkdir(parents=True, exist_ok=True)
        t = time.perf_counter()
        pool = make_pool(root, args.pool_videos, args.pool_frames, args.frame_size, args.workers)
        gen_s = time.perf_counter() - t
        data = long_list(pool, args.frames, args.video_len)
        datalist_file = write_datalist(data, root / "inference_datalist.json")
        train_data = long_list(pool, max(len(pool), args.train_batch_size * (args.train_steps + 2)), args.video_len)

        res: dict[str, dict[str, object]] = {}
        ratio: dict[str, float] = {}
        for attention in ("diff", "plain"):
            for mode in modes if attention == "diff" else ("eager",):
                key = f"{attention}/{mode}"
                res[key] = measure_variant(key, attention, mode, args, device, image_size, datalist_file, train_data)
                print(
                    f"[{key}] "
                    + ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in res[key].items()),
                    file=sys.stderr,
                    flush=True,
                )
        if "diff/eager" in res:
            for k in ("infer", "train"):
                plain, diff = res["plain/eager"].get(f"{k}_model"), res["diff/eager"].get(f"{k}_model")
                if isinstance(plain, float) and isinstance(diff, float):
                    ratio[k] = plain / diff

    def cell(key: str, field: str, fmt: str = "{:.0f}") -> str:
        v = res.get(key, {}).get(field)
        return "-" if v is None else v if isinstance(v, str) else fmt.format(v)

    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    net = "tiny DiffAttn ViT (64 px)" if args.tiny else "DiffAttn ViT-B/16 (224 px, random weights)"
    print(
        f"device: {name}; network: {net}; bf16 autocast; torch {torch.__version__}; workers {args.workers}; "
        f"frames: {len(pool)} generated {args.frame_size} px PNGs ({gen_s:.0f} s) cycled to {len(data)} "
        f"(videos of {args.video_len}); inference batch {args.batch_size}, training batch {args.train_batch_size}"
    )
    print()
    print("| measurement | eager | torch.compile |")
    print("|---|---|---|")
    print(
        f"| inference, model only (frames/s) | {cell('diff/eager', 'infer_model')} | {cell('diff/compiled', 'infer_model')} |"
    )
    print(
        f"| inference, end to end PNG -> events (frames/s) | {cell('diff/eager', 'infer_e2e')} | {cell('diff/compiled', 'infer_e2e')} |"
    )
    for name, what in (("strided", "strided k=8"), ("c2f", "coarse-to-fine k=8")):
        print(
            f"| inference, end to end, reduced {what} (frames of the video/s) | {cell('diff/eager', 'infer_' + name)} | "
            f"{cell('diff/compiled', 'infer_' + name)} |"
        )
        print(
            f"| frames inferred, {what} (%) | {cell('diff/eager', 'share_' + name, '{:.1%}')} | "
            f"{cell('diff/compiled', 'share_' + name, '{:.1%}')} |"
        )
    print(
        f"| training, model only (frames/s) | {cell('diff/eager', 'train_model')} | {cell('diff/compiled', 'train_model')} |"
    )
    print(
        f"| training, end to end with augmentation (frames/s) | {cell('diff/eager', 'train_e2e')} | {cell('diff/compiled', 'train_e2e')} |"
    )
    print(
        f"| inference model-only phase incl. warm-up/compile (s) | {cell('diff/eager', 'infer_model_s', '{:.1f}')} | {cell('diff/compiled', 'infer_model_s', '{:.1f}')} |"
    )
    print(
        f"| training model-only phase incl. warm-up/compile (s) | {cell('diff/eager', 'train_model_s', '{:.1f}')} | {cell('diff/compiled', 'train_model_s', '{:.1f}')} |"
    )
    print(
        f"| peak device memory, inference (GiB) | {cell('diff/eager', 'infer_peak', '{:.2f}')} | {cell('diff/compiled', 'infer_peak', '{:.2f}')} |"
    )
    print(
        f"| peak device memory, training (GiB) | {cell('diff/eager', 'train_peak', '{:.2f}')} | {cell('diff/compiled', 'train_peak', '{:.2f}')} |"
    )
    print(
        f"| events stage of the end-to-end run (s) | {cell('diff/eager', 'events_e2e', '{:.2f}')} | {cell('diff/compiled', 'events_e2e', '{:.2f}')} |"
    )
    for k, what in (("infer", "inference"), ("train", "training")):
        if k in ratio:
            print(f"| plain ViT / DiffAttn speed, {what} model only | {ratio[k]:.2f}x | - |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
