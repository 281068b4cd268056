"""Text embeddings of the label prompts, for the contrastive path of :class:`~monai_vce.networks.DiffAttnCLIPClassifier`.

Each label has several prompt variants (:func:`monai_vce.labels.all_prompts`); each variant is embedded with the
CLIP text tower and L2-normalised, the variants of a label are averaged and the mean is normalised again (CLIP's
prompt ensembling). The result is saved with ``torch.save`` as ``{"labels": [17 names], "embeddings": (17, D)
float32 tensor, "model": source, "prompts": {label: [variants]}}`` and read back with ``weights_only=True``.

Command line::

    python -m monai_vce.text_embeddings --model hf-hub:microsoft/BiomedCLIP-PubMedBERT_256-vit_base_patch16_224 \\
        --out bundle/models/text_embeddings.pt
    python -m monai_vce.text_embeddings --model local-dir:/models/biomedclip --out bundle/models/text_embeddings.pt
    python -m monai_vce.text_embeddings --model /models/open_clip_pytorch_model.bin --out text_embeddings.pt

BiomedCLIP's text tower is a Hugging Face BiomedBERT, so computing its embeddings needs ``transformers`` (and the
BiomedBERT config from the hub or its cache); training and inference only read the saved file.
"""

from __future__ import annotations

import argparse
import importlib.util
import io
import json
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from monai_vce.labels import LABELS, all_prompts
from monai_vce.utils import atomic_write_bytes, seal_torch_bytes

from .backbone import read_torch_file, resolve_backbone

__all__ = ["compute_text_embeddings", "save_text_embeddings", "load_text_embeddings", "main"]


def load_text_embeddings(
    path: str | os.PathLike,
    labels: Sequence[str] | None = LABELS,
    num_classes: int | None = None,
    embed_dim: int | None = None,
) -> Any:
    """Read a text-embedding file and return its (num_classes, D) L2-normalised float32 tensor.

    Args:
        path: a ``.pt`` file holding a plain tensor or ``{"labels": [...], "embeddings": tensor}``.
        labels: the expected label names in order (checked when the file lists labels); None skips the check.
        num_classes: expected number of rows (default ``len(labels)``).
        embed_dim: expected width (the image tower's embedding width); None skips the check.

    Raises:
        FileNotFoundError: the file does not exist.
        ValueError: unreadable content, wrong shape, label names or order that differ, or non-finite / zero rows;
            the message names the file.
    """
    import torch
    import torch.nn.functional as F

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"text embeddings file not found: {path}")
    obj = read_torch_file(path, "text embeddings")  # torch.load(weights_only=True), one-line errors
    file_labels = None
    if isinstance(obj, Mapping):
        if "embeddings" not in obj:
            raise ValueError(
                f"text embeddings {path}: expected a tensor or a dict with 'embeddings', got keys {list(obj)}"
            )
        tensor, file_labels = obj["embeddings"], obj.get("labels")
    else:
        tensor = obj
    if not isinstance(tensor, torch.Tensor) or tensor.ndim != 2 or not tensor.is_floating_point():
        shape = tuple(tensor.shape) if isinstance(tensor, torch.Tensor) else type(tensor).__name__
        raise ValueError(f"text embeddings {path}: expected a 2-D float tensor (classes, dim), got {shape}")
    rows = num_classes if num_classes is not None else (len(labels) if labels is not None else tensor.shape[0])
    if tensor.shape[0] != rows or (embed_dim is not None and tensor.shape[1] != embed_dim):
        want = f"({rows}, {embed_dim if embed_dim is not None else 'D'})"
        raise ValueError(f"text embeddings {path}: expected shape {want}, got {tuple(tensor.shape)}")
    if labels is not None and file_labels is not None:
        file_labels = [str(x) for x in file_labels]
        if file_labels != list(labels):
            if sorted(file_labels) == sorted(labels):
                raise ValueError(
                    f"text embeddings {path}: labels are in a different order than expected: {file_labels}"
                )
            unknown = sorted(set(file_labels) - set(labels))
            absent = sorted(set(labels) - set(file_labels))
            raise ValueError(f"text embeddings {path}: label names differ (unexpected: {unknown}; missing: {absent})")
    tensor = tensor.float()
    norms = tensor.norm(dim=1)
    if not torch.isfinite(tensor).all() or bool((norms == 0).any()):
        raise ValueError(f"text embeddings {path}: non-finite values or all-zero rows")
    return F.normalize(tensor, dim=-1)


def _require_text_tower(model_cfg: Mapping[str, Any], spec: str) -> None:
    text_cfg = model_cfg.get("text_cfg", {})
    if ("hf_model_name" in text_cfg or "hf_tokenizer_name" in text_cfg) and importlib.util.find_spec(
        "transformers"
    ) is None:
        raise RuntimeError(
            f"the text tower of {spec!r} is a Hugging Face model ({text_cfg.get('hf_model_name')}), which needs the "
            "`transformers` package: `pip install transformers`. It is needed only to compute the text embeddings; "
            "training and inference read the saved file."
        )


def compute_text_embeddings(
    model: str,
    model_name: str | None = None,
    prompts: Mapping[str, Sequence[str]] | None = None,
    device: str = "cpu",
    batch_size: int = 64,
) -> dict[str, Any]:
    """Embed the label prompts with an open_clip model's text tower.

    Args:
        model: ``"hf-hub:org/repo"``, ``"local-dir:/folder"``, a checkpoint file or a registered name (see
            :func:`monai_vce.networks.backbone.resolve_backbone`); its weights are required.
        model_name: open_clip config of a checkpoint file (default: a config beside the file, else BiomedCLIP's).
        prompts: ``{label: [variants]}`` for every label of :data:`~monai_vce.labels.LABELS`; default
            :func:`~monai_vce.labels.all_prompts`.
        device: device to run the text tower on.
        batch_size: prompts per forward pass.

    Returns:
        ``{"labels": list(LABELS), "embeddings": (17, D) float32 CPU tensor (L2-normalised), "model": model,
        "prompts": prompts}``.
    """
    import open_clip
    import torch
    import torch.nn.functional as F

    prompts = dict(all_prompts() if prompts is None else prompts)
    missing = [label for label in LABELS if not prompts.get(label)]
    if missing:
        raise ValueError(f"no prompts for labels: {missing}")
    source = resolve_backbone(model, model_name=model_name, pretrained=True)
    model_cfg = dict(source.model_cfg)
    _require_text_tower(model_cfg, model)
    is_hf_text = "hf_model_name" in model_cfg.get("text_cfg", {})
    custom_text = bool(model_cfg.pop("custom_text", False)) or is_hf_text
    if is_hf_text:
        model_cfg["text_cfg"] = {
            **model_cfg["text_cfg"],
            "hf_model_pretrained": False,
        }  # weights come from the checkpoint
    vision_cfg = dict(model_cfg["vision_cfg"])
    if vision_cfg.get("timm_model_name"):
        vision_cfg["timm_model_pretrained"] = False
    model_cfg["vision_cfg"] = vision_cfg
    cls = open_clip.CustomTextCLIP if custom_text else open_clip.CLIP
    clip = cls(**model_cfg)
    try:
        open_clip.load_checkpoint(clip, str(source.checkpoint), strict=True)
    except RuntimeError as err:
        raise ValueError(f"checkpoint {source.checkpoint} does not match the config of {model!r}: {err}") from err
    clip = clip.to(device).eval()
    tokenizer = open_clip.get_tokenizer(source.open_clip_name)

    flat = [p for label in LABELS for p in prompts[label]]
    chunks = []
    with torch.no_grad():
        for start in range(0, len(flat), batch_size):
            tokens = tokenizer(flat[start : start + batch_size]).to(device)
            chunks.append(clip.encode_text(tokens, normalize=True).float().cpu())
    per_prompt = torch.cat(chunks)
    rows, start = [], 0
    for label in LABELS:
        n = len(prompts[label])
        rows.append(per_prompt[start : start + n].mean(dim=0))
        start += n
    embeddings = F.normalize(torch.stack(rows), dim=-1)
    return {
        "labels": list(LABELS),
        "embeddings": embeddings.contiguous(),
        "model": str(model),
        "prompts": {label: list(prompts[label]) for label in LABELS},
    }


def save_text_embeddings(result: Mapping[str, Any], path: str | os.PathLike) -> Path:
    """Write the result of :func:`compute_text_embeddings` atomically with ``torch.save``."""
    import torch

    buffer = io.BytesIO()
    torch.save(dict(result), buffer)
    return atomic_write_bytes(path, seal_torch_bytes(buffer.getvalue()))


def main(argv: Sequence[str] | None = None) -> int:
    """Command line entry point; prints a JSON summary of the written file."""
    parser = argparse.ArgumentParser(
        prog="python -m monai_vce.text_embeddings",
        description="Compute the label-prompt text embeddings of the contrastive path from a CLIP checkpoint.",
    )
    parser.add_argument(
        "--model",
        required=True,
        help="hf-hub:org/repo, local-dir:/folder (open_clip_config.json + weights), or a checkpoint file",
    )
    parser.add_argument(
        "--model-name", default=None, help="open_clip config of a checkpoint file (default: BiomedCLIP's)"
    )
    parser.add_argument("--out", required=True, help="output .pt file, e.g. bundle/models/text_embeddings.pt")
    parser.add_argument("--device", default="cpu", help="device of the text tower (default: cpu)")
    parser.add_argument("--batch-size", type=int, default=64, help="prompts per forward pass")
    args = parser.parse_args(argv)
    try:
        result = compute_text_embeddings(
            args.model, model_name=args.model_name, device=args.device, batch_size=args.batch_size
        )
        out = save_text_embeddings(result, args.out)
    except (OSError, RuntimeError, ValueError) as err:
        parser.exit(2, f"error: {err}\n")
    summary = {
        "out": str(out),
        "model": args.model,
        "labels": len(result["labels"]),
        "embed_dim": int(result["embeddings"].shape[1]),
    }
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
