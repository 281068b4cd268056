"""Time ``python -m monai_vce check-backbone`` on a BiomedCLIP-shaped snapshot with random weights, full size.

The snapshot is written to a temporary folder in the hub's file layout: ``open_clip_config.json`` (BiomedCLIP's,
PubMedBERT text config included) and ``open_clip_pytorch_model.bin`` holding a ViT-B/16 image tower (``visual.*``),
a BERT-base text tower under BiomedCLIP's key names (``text.transformer.*``, ``text.proj.*``, built without
``transformers``) and ``logit_scale`` = ln 100, plus random label-prompt embeddings (``--text-embeddings``). The check runs in a fresh
process, as a user runs it; its wall time and the report's numbers are printed. ``--size small`` writes the same layout at toy size (what the tests use).

Usage (from the repository root)::

    python benchmarks/check_backbone.py                 # full size (~0.8 GB file)
    python benchmarks/check_backbone.py --size small --keep /tmp/biomedclip_small
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
import time
from copy import deepcopy
from pathlib import Path

import torch

from monai_vce.labels import LABELS
from monai_vce.networks.backbone import BIOMEDCLIP_CONFIG, TINY_TIMM_MODEL_NAME
from monai_vce.networks.text_embeddings import save_text_embeddings
from monai_vce.utils import atomic_write_json

# (vision timm model, image size, embed_dim, text width, text layers, vocabulary, intermediate width)
SIZES = {
    "full": ("vit_base_patch16_224", 224, 512, 768, 12, 30522, 3072),
    "small": (TINY_TIMM_MODEL_NAME, 64, 32, 32, 1, 64, 64),
}


def _bert_state(width: int, layers: int, vocab: int, intermediate: int, embed_dim: int) -> dict[str, torch.Tensor]:
    """Random tensors under the key names and shapes of BiomedCLIP's text tower (BERT + 2-layer MLP projection)."""
    state: dict[str, torch.Tensor] = {}

    def linear(name: str, out: int, inp: int, bias: bool = True) -> None:
        state[f"{name}.weight"] = torch.randn(out, inp) * 0.02
        if bias:
            state[f"{name}.bias"] = torch.zeros(out)

    def norm(name: str) -> None:
        state[f"{name}.weight"], state[f"{name}.bias"] = torch.ones(width), torch.zeros(width)

    t = "text.transformer"
    state[f"{t}.embeddings.word_embeddings.weight"] = torch.randn(vocab, width) * 0.02
    state[f"{t}.embeddings.position_embeddings.weight"] = torch.randn(512, width) * 0.02
    state[f"{t}.embeddings.token_type_embeddings.weight"] = torch.randn(2, width) * 0.02
    norm(f"{t}.embeddings.LayerNorm")
    for i in range(layers):
        layer = f"{t}.encoder.layer.{i}"
        for part in ("query", "key", "value"):
            linear(f"{layer}.attention.self.{part}", width, width)
        linear(f"{layer}.attention.output.dense", width, width)
        norm(f"{layer}.attention.output.LayerNorm")
        linear(f"{layer}.intermediate.dense", intermediate, width)
        linear(f"{layer}.output.dense", width, intermediate)
        norm(f"{layer}.output.LayerNorm")
    linear(f"{t}.pooler.dense", width, width)
    hidden = (width + embed_dim) // 2
    linear("text.proj.0", hidden, width, bias=False)
    linear("text.proj.2", embed_dim, hidden, bias=False)
    return state


def write_biomedclip_shaped(folder: str | Path, size: str = "full", seed: int = 0) -> Path:
    """Write a BiomedCLIP-shaped ``local-dir:`` folder with random weights; returns the folder.

    Args:
        folder: destination (created when missing).
        size: ``"full"`` (ViT-B/16 + BERT-base, BiomedCLIP's shapes) or ``"small"`` (same layout, toy size).
        seed: seed of the random weights.
    """
    from open_clip.model import _build_vision_tower

    timm_name, image_size, embed_dim, width, layers, vocab, intermediate = SIZES[size]
    config = deepcopy(BIOMEDCLIP_CONFIG)
    config["model_cfg"]["embed_dim"] = embed_dim
    config["model_cfg"]["vision_cfg"].update(timm_model_name=timm_name, image_size=image_size)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        visual = _build_vision_tower(embed_dim, config["model_cfg"]["vision_cfg"])
        state = {f"visual.{k}": v for k, v in visual.state_dict().items()}
        state.update(_bert_state(width, layers, vocab, intermediate, embed_dim))
    state["logit_scale"] = torch.tensor(math.log(100.0))
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    torch.save(state, folder / "open_clip_pytorch_model.bin")  # as published: a plain torch.save, no checksum
    atomic_write_json(folder / "open_clip_config.json", config)
    return folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="full")
    parser.add_argument("--keep", default=None, help="write the snapshot to this folder and keep it")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(args.keep) if args.keep else Path(tmp) / "biomedclip"
        start = time.perf_counter()
        write_biomedclip_shaped(folder, args.size)
        written = time.perf_counter() - start
        # random label-prompt embeddings of the tower's width: the text side is then not needed (exit 0)
        embed_dim = SIZES[args.size][2]
        tensor = torch.nn.functional.normalize(torch.randn(len(LABELS), embed_dim), dim=-1)
        embeddings = save_text_embeddings({"labels": list(LABELS), "embeddings": tensor}, Path(tmp) / "text.pt")
        command = [sys.executable, "-m", "monai_vce", "check-backbone", f"local-dir:{folder}", "--json"]
        command += ["--text-embeddings", str(embeddings)]
        start = time.perf_counter()
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        elapsed = time.perf_counter() - start
        report = json.loads(done.stdout)
        size_mb = (folder / "open_clip_pytorch_model.bin").stat().st_size / 1024**2
    print(f"snapshot: {args.size}, {size_mb:.0f} MiB, written in {written:.1f} s")
    print(f"check-backbone: exit {done.returncode} in {elapsed:.1f} s (fresh process, imports included)")
    print(f"image tower: {report['tower']['params']:,} parameters, logit_scale {report['tower']['logit_scale']:.4f}")
    for v in report["variants"]:
        print(
            f"  {v['variant']:<18} +{v['added_params']:,} parameters, max|diff| at lambda=0 {v['max_abs_diff_at_lambda_0']}"
        )
    print(f"inside the check: {report['seconds']}")
    for row in report["text"]:
        print(f"  {row['part']:<14} {row['found'] or 'MISSING: ' + row['missing']}")
    print(f"missing: {report['missing']}")


if __name__ == "__main__":
    main()
