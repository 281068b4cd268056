"""``python -m monai_vce check-backbone``: can training start from this backbone snapshot? (offline, in seconds).

Loads the image tower, converts it in every attention variant, measures the lambda-preserving ones against it and
checks that the text tower and tokenizer are reachable; see ``docs/design/networks.md``.
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

from monai_vce.cli import BAD_INPUT, command_main, print_error

from .backbone import ImageTower, build_image_tower, read_torch_file
from .diff_attention import ATTENTION_VARIANTS, DifferentialAttention, convert_to_diff_attention
from .text_embeddings import load_text_embeddings

__all__ = ["LAMBDA_ZERO_EXACT", "PRESERVING_TOLERANCE", "check_snapshot", "format_report", "add_parser", "run", "main"]

#: variants whose conversion at lambda = 0 computes the pretrained attention exactly: measured and checked
LAMBDA_ZERO_EXACT: frozenset[str] = frozenset({"preserving", "authors"})
#: largest max abs difference to the unconverted tower accepted for those variants, relative to max(1, max |output|)
PRESERVING_TOLERANCE = 1e-4
_SAFETENSORS_DTYPES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16"}
# tokenizer files of a Hugging Face tokenizer folder (one of them suffices)
_TOKENIZER_FILES = ("tokenizer.json", "vocab.txt")


def _count(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def _diff_modules(module: nn.Module) -> list[DifferentialAttention]:
    return [m for m in module.modules() if isinstance(m, DifferentialAttention)]


def _at_lambda_zero(visual: nn.Module, variant: str, converted: nn.Module) -> tuple[nn.Module, bool]:
    """``converted`` (``visual`` in ``variant``) when its own init gives lambda = 0 in every block, else a new copy
    with ``lambda_init`` 0 and equal lambda vector pairs; and whether lambda is 0 in every block of the result."""
    if all(float(b.lambda_value()) == 0.0 for b in _diff_modules(converted)):
        return converted, True
    model = copy.deepcopy(visual)
    convert_to_diff_attention(model, variant=variant, lambda_init=0.0)
    with torch.no_grad():
        for b in _diff_modules(model):
            for first, second in (("lambda_q1", "lambda_q2"), ("lambda_k1", "lambda_k2")):
                p1, p2 = getattr(b, first, None), getattr(b, second, None)
                if isinstance(p1, torch.Tensor) and isinstance(p2, torch.Tensor):
                    p2.copy_(p1)
    return model, all(float(b.lambda_value()) == 0.0 for b in _diff_modules(model))


def _checkpoint_entries(path: Path) -> dict[str, str]:
    """Key -> dtype name of the checkpoint's tensors, without reading the weights (safetensors header, mmap)."""
    if path.suffix == ".safetensors":
        from safetensors import safe_open

        with safe_open(str(path), framework="pt") as f:
            names = list(f.keys())  # safe_open is not iterable
            return {k: _SAFETENSORS_DTYPES.get(f.get_slice(k).get_dtype(), f.get_slice(k).get_dtype()) for k in names}
    obj = read_torch_file(path, "checkpoint", mmap=True, verify=False)  # already verified by the tower's load
    state = obj.get("state_dict", obj) if isinstance(obj, Mapping) else {}
    return {str(k): str(v.dtype).replace("torch.", "") for k, v in state.items() if isinstance(v, torch.Tensor)}


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0][:200] if text else ""


def _has_transformers() -> bool:
    return importlib.util.find_spec("transformers") is not None


def _hub_cached(repo_id: str, filename: str) -> str | None:
    try:
        from huggingface_hub import try_to_load_from_cache

        found = try_to_load_from_cache(repo_id, filename)
    except Exception:  # an invalid repo id, or huggingface_hub missing: not in the cache
        return None
    return found if isinstance(found, str) else None


def _find(folder_or_repo: str, names: Sequence[str]) -> str | None:
    """The first of ``names`` in a local folder, or in the Hugging Face cache of a repo id."""
    folder = Path(folder_or_repo).expanduser()
    if folder.is_dir():
        return next((str(folder / n) for n in names if (folder / n).is_file()), None)
    return next((p for n in names if (p := _hub_cached(folder_or_repo, n)) is not None), None)


def _text_parts(tower: ImageTower, entries: Mapping[str, Any], text_config: str | None) -> list[dict[str, Any]]:
    """One row per text part needed to compute the label-prompt embeddings: name, found (path or None), missing."""
    source = tower.source
    text_cfg = dict(source.model_cfg.get("text_cfg", {}))
    text_keys = [k for k in entries if not k.startswith("visual.") and not k.startswith("logit_")]
    where = str(source.checkpoint) if source.checkpoint is not None else "no checkpoint"
    rows = [
        {
            "part": "text weights",
            "found": f"{len(text_keys)} tensors in {where}" if text_keys else None,
            "missing": f"the text-tower weights (no keys but visual.* in {where})",
        }
    ]
    hf_model, hf_tokenizer = text_cfg.get("hf_model_name"), text_cfg.get("hf_tokenizer_name")
    if not (hf_model or hf_tokenizer):
        import open_clip

        found, reason = None, ""
        try:
            found = f"open_clip's {type(open_clip.get_tokenizer(source.open_clip_name)).__name__}"
        except Exception as err:  # open_clip raises anything from OSError to KeyError here
            reason = f" ({type(err).__name__}: {err})"
        rows.append(
            {"part": "tokenizer", "found": found, "missing": f"the tokenizer of {source.open_clip_name}{reason}"}
        )
        return rows
    rows.append(
        {
            "part": "transformers",
            "found": "installed" if _has_transformers() else None,
            "missing": "the transformers package (pip install transformers)",
        }
    )
    config_from = text_config or str(hf_model)
    local_dir = source.open_clip_name.startswith("local-dir:")
    # open_clip reads a local-dir model's tokenizer from that folder only
    tokenizer_from = source.open_clip_name[len("local-dir:") :] if local_dir else str(hf_tokenizer or hf_model)
    config_missing = (
        f"config.json in {text_config}"
        if text_config
        else f"config.json of {hf_model} (not in the Hugging Face cache; or give its folder: --text-config)"
    )
    for part, found, missing in (
        ("text config", _find(config_from, ("config.json",)), config_missing),
        (
            "tokenizer",
            _find(tokenizer_from, _TOKENIZER_FILES),
            f"{' or '.join(_TOKENIZER_FILES)} of the tokenizer {hf_tokenizer} in {tokenizer_from}",
        ),
    ):
        if found is not None and _has_transformers():  # found: does transformers read it, offline?
            try:
                if part == "text config":
                    from transformers import AutoConfig

                    AutoConfig.from_pretrained(config_from, local_files_only=True)
                elif local_dir:
                    import open_clip

                    open_clip.get_tokenizer(source.open_clip_name)  # what the text-embeddings command runs
                else:
                    from transformers import AutoTokenizer

                    AutoTokenizer.from_pretrained(tokenizer_from, local_files_only=True)
            except Exception as err:  # transformers raises OSError, ValueError, KeyError, ... on bad folders
                missing = f"a {part} transformers can read ({found}: {type(err).__name__}: {_first_line(err)})"
                found = None
        rows.append({"part": part, "found": found, "missing": missing})
    return rows


def check_snapshot(
    backbone: str,
    model_name: str | None = None,
    text_config: str | None = None,
    text_embeddings: str | None = None,
    batch_size: int = 2,
    seed: int = 0,
    device: str = "cpu",
) -> dict[str, Any]:
    """Check that training can start from ``backbone``: tower, its conversions, the text side; nothing is written.

    Args:
        backbone: ``"hf-hub:org/repo"``, ``"local-dir:/folder"`` or a checkpoint file (see
            :func:`~monai_vce.networks.backbone.resolve_backbone`); its weights are required.
        model_name: open_clip config of a checkpoint file.
        text_config: a local folder holding the Hugging Face text tower's ``config.json`` (default: the HF cache).
        text_embeddings: an existing label-prompt embeddings file; when valid, the text tower is not needed.
        batch_size: images of the fixed random batch.
        seed: seed of that batch.
        device: device the towers run on.

    Returns:
        A JSON-able report: ``tower`` (parameters, dtypes, ``logit_scale``), ``variants`` (one row per
        :data:`~monai_vce.networks.diff_attention.ATTENTION_VARIANTS` entry), ``text`` (one row per part),
        ``missing`` (one line per problem; empty when training can start) and ``ready``.
    """
    start = time.perf_counter()
    tower = build_image_tower(backbone, model_name=model_name, pretrained=True)
    load_s = time.perf_counter() - start
    visual = tower.visual.to(device).eval()
    checkpoint = tower.source.checkpoint
    entries = _checkpoint_entries(checkpoint) if checkpoint is not None else {}
    visual_dtypes = sorted({d for k, d in entries.items() if k.startswith("visual.")})
    params = _count(visual)
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(batch_size, 3, *tower.image_size, generator=generator).to(device)
    missing: list[str] = []
    with torch.no_grad():
        reference = visual(x)
        scale = max(1.0, float(reference.abs().max()))
        variants = []
        for variant in ATTENTION_VARIANTS:
            converted = copy.deepcopy(visual)
            blocks = convert_to_diff_attention(converted, variant=variant)
            count = _count(converted)
            exact = variant in LAMBDA_ZERO_EXACT
            diff, ok, zero = None, None, None
            if exact:  # the others are not the pretrained function at lambda = 0: no forward pass spent on them
                zero, settable = _at_lambda_zero(visual, variant, converted)
                diff = float((zero(x) - reference).abs().max()) if settable else None
                ok = diff is not None and diff <= PRESERVING_TOLERANCE * scale
            if ok is False:
                missing.append(
                    f"the {variant} conversion at lambda = 0 differs from the tower by {diff} (max abs), more than "
                    f"{PRESERVING_TOLERANCE} x {scale:.3g}"
                )
            variants.append(
                {
                    "variant": variant,
                    "blocks": len(blocks),
                    "params": count,
                    "added_params": count - params,
                    "max_abs_diff_at_lambda_0": diff,
                    "exact_at_lambda_0": exact,
                    "ok": ok,
                }
            )
            del converted, zero
    variants_s = time.perf_counter() - start - load_s
    text = _text_parts(tower, entries, text_config)
    text_missing = [row["missing"] for row in text if row["found"] is None]
    embeddings = None
    if text_embeddings is not None:
        try:
            load_text_embeddings(text_embeddings, embed_dim=tower.embed_dim)
            embeddings = {"path": str(text_embeddings), "ok": True}
        except (OSError, ValueError) as err:
            embeddings = {"path": str(text_embeddings), "ok": False, "error": str(err)}
            missing.append(f"the text embeddings are not usable ({err})")
    if text_missing and not (embeddings and embeddings["ok"]):
        missing.append(
            "the text embeddings cannot be computed, missing: " + "; ".join(text_missing) + " (or pass an existing "
            "--text-embeddings file)"
        )
    return {
        "backbone": backbone,
        "checkpoint": None if checkpoint is None else str(checkpoint),
        "tower": {
            "params": params,
            "embed_dim": tower.embed_dim,
            "image_size": list(tower.image_size),
            "checkpoint_dtypes": visual_dtypes,
            "tower_dtype": str(next(visual.parameters()).dtype).replace("torch.", ""),
            "logit_scale": tower.logit_scale,
        },
        "batch": {"size": batch_size, "seed": seed, "max_abs_output": float(reference.abs().max())},
        "variants": variants,
        "text": text,
        "text_embeddings": embeddings,
        "missing": missing,
        "ready": not missing,
        "seconds": {"load": round(load_s, 2), "variants": round(variants_s, 2)},
    }


def format_report(report: Mapping[str, Any]) -> str:
    """The report of :func:`check_snapshot` as a readable table."""
    t = report["tower"]
    scale = t["logit_scale"]
    lines = [
        f"backbone     {report['backbone']}",
        f"checkpoint   {report['checkpoint']}",
        f"image tower  {t['params']:,} parameters, embed_dim {t['embed_dim']}, image size {t['image_size']}",
        f"dtype        checkpoint {', '.join(t['checkpoint_dtypes']) or '-'}; tower {t['tower_dtype']}",
        "logit_scale  "
        + ("none in the checkpoint" if scale is None else f"{scale:.4f} (exp: {torch.tensor(scale).exp():.2f})"),
        f"seconds      {report['seconds']['load']} loading, {report['seconds']['variants']} converting and running",
        "",
        f"{'variant':<18} {'blocks':>6} {'parameters':>14} {'added':>8} {'max|diff| at lambda=0':>24}  check",
    ]
    for v in report["variants"]:
        diff = "-" if v["max_abs_diff_at_lambda_0"] is None else f"{v['max_abs_diff_at_lambda_0']:.3g}"
        check = {True: "ok (exact)", False: "FAILED", None: "(not the pretrained function at lambda = 0)"}[v["ok"]]
        lines.append(
            f"{v['variant']:<18} {v['blocks']:>6} {v['params']:>14,} {v['added_params']:>8,} {diff:>24}  {check}"
        )
    lines.append("")
    for row in report["text"]:
        lines.append(f"{row['part']:<14} {row['found'] or 'MISSING: ' + row['missing']}")
    emb = report["text_embeddings"]
    if emb is not None:
        lines.append(f"{'embeddings':<14} {emb['path']}: {'ok' if emb['ok'] else 'INVALID: ' + emb['error']}")
    lines.append("")
    lines.append("training can start" if report["ready"] else "training cannot start: " + "; ".join(report["missing"]))
    return "\n".join(lines)


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``check-backbone`` command to ``subparsers``; returns its parser."""
    p = subparsers.add_parser(
        "check-backbone",
        description="Check a backbone snapshot offline: load the image tower, convert it in every attention variant, "
        "and check the text tower and tokenizer. Exit 0 when training can start, 2 otherwise.",
    )
    p.add_argument("backbone", help="hf-hub:org/repo, local-dir:/folder (open_clip_config.json + weights), or a file")
    p.add_argument("--model-name", default=None, help="open_clip config of a checkpoint file (default: BiomedCLIP's)")
    p.add_argument(
        "--text-config", default=None, help="local folder of the text tower's config.json (default: the HF cache)"
    )
    p.add_argument("--text-embeddings", default=None, help="an existing text_embeddings.pt (then no text tower needed)")
    p.add_argument("--batch-size", type=int, default=2, help="images of the fixed random batch (default: 2)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random batch (default: 0)")
    p.add_argument("--device", default="cpu", help="device of the towers (default: cpu)")
    p.add_argument("--json", action="store_true", help="print the report as one JSON object instead of the table")
    p.set_defaults(run=run)
    return p


def run(args: argparse.Namespace) -> int:
    """Print the report of ``args``; returns 0 when training can start, else prints one error line and returns 2."""
    import json

    if args.batch_size < 1:
        raise ValueError(f"--batch-size must be at least 1, got {args.batch_size}")
    report = check_snapshot(
        args.backbone,
        model_name=args.model_name,
        text_config=args.text_config,
        text_embeddings=args.text_embeddings,
        batch_size=args.batch_size,
        seed=args.seed,
        device=args.device,
    )
    print(json.dumps(report) if args.json else format_report(report), flush=True)
    if report["ready"]:
        return 0
    print_error(f"{args.backbone}: training cannot start: " + "; ".join(report["missing"]))
    return BAD_INPUT


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m monai_vce.networks.check``, the same as ``python -m monai_vce check-backbone``."""
    return command_main(add_parser, argv, "python -m monai_vce.networks.check")


if __name__ == "__main__":
    sys.exit(main())
