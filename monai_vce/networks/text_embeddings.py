"""Text embeddings of the label prompts, for the contrastive path of :class:`~monai_vce.networks.DiffAttnCLIPClassifier`.

CLIP prompt ensembling, saved as ``{"labels", "embeddings": (17, D) float32, "model", "prompts"}`` (``prompts``: the
variants of each label, from the templates of ``--templates``); computing them needs ``transformers`` (and, offline, a
local folder of the Hugging Face text tower), reading them does not.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import os
import shlex
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from monai_vce.cli import command_main
from monai_vce.labels import LABELS, PROMPT_TEMPLATES, all_prompts, check_templates
from monai_vce.utils import atomic_write_bytes, seal_torch_bytes

from .backbone import BIOMEDCLIP_CONFIG, BIOMEDCLIP_HUB_ID, read_torch_file, resolve_backbone

__all__ = [
    "BIOMEDBERT_HUB_ID",
    "compute_text_embeddings",
    "save_text_embeddings",
    "load_text_embeddings",
    "resolve_text_config",
    "text_embeddings_command",
    "text_embeddings_hint",
    "main",
]

#: the Hugging Face repository of BiomedCLIP's text tower (its config and tokenizer; the weights are BiomedCLIP's)
BIOMEDBERT_HUB_ID: str = BIOMEDCLIP_CONFIG["model_cfg"]["text_cfg"]["hf_model_name"]
# files of a Hugging Face text-tower folder: the config, and one of the tokenizer files
_CONFIG_FILE = "config.json"
_TOKENIZER_FILES = ("tokenizer.json", "vocab.txt")


def text_embeddings_command(
    out: str | os.PathLike, model: str | None = None, templates: Sequence[str] | None = None
) -> str:
    """The ``text-embeddings`` command line that writes ``out`` with ``model`` (default BiomedCLIP) and ``templates``
    (``--templates`` only when they are not the built-in :data:`~monai_vce.labels.PROMPT_TEMPLATES`)."""
    command = f"python -m monai_vce text-embeddings --model {model or BIOMEDCLIP_HUB_ID} --out {out}"
    checked = check_templates(templates)
    if checked != PROMPT_TEMPLATES:
        command += " --templates " + " ".join(shlex.quote(t) for t in checked)
    return command


def text_embeddings_hint(
    out: str | os.PathLike = "bundle/models/text_embeddings.pt",
    model: str | None = None,
    templates: Sequence[str] | None = None,
) -> str:
    """One sentence saying how to write ``out``: the command (:func:`text_embeddings_command`), and what it needs
    once (for error messages)."""
    return (
        f"compute them once with `{text_embeddings_command(out, model, templates)}` "
        f"(add `--text-config /path/to/{BIOMEDBERT_HUB_ID.rsplit('/', 1)[-1]}` offline); it needs the "
        f"BiomedBERT config and tokenizer ({BIOMEDBERT_HUB_ID}: config.json, vocab.txt) once, from the hub, the "
        "Hugging Face cache or that folder"
    )


def _snapshot(repo_dir: Path) -> Path | None:
    """The snapshot folder of a Hugging Face cache repository folder (``models--org--name``): ``refs/main``'s,
    else the newest snapshot holding a config."""
    ref = repo_dir / "refs" / "main"
    if ref.is_file():
        folder = repo_dir / "snapshots" / ref.read_text(encoding="utf-8").strip()
        if (folder / _CONFIG_FILE).is_file():
            return folder
    snapshots = [d for d in (repo_dir / "snapshots").glob("*") if (d / _CONFIG_FILE).is_file()]
    return max(snapshots, key=lambda d: d.stat().st_mtime) if snapshots else None


def resolve_text_config(folder: str | os.PathLike, repo_id: str = BIOMEDBERT_HUB_ID) -> Path:
    """The folder holding a Hugging Face text tower's config and tokenizer, from a local copy or a cache.

    Args:
        folder: a folder in the hub repository's layout (``config.json``, ``vocab.txt`` or ``tokenizer.json``,
            ``tokenizer_config.json``), or a Hugging Face cache folder holding ``repo_id`` (``~/.cache/huggingface``,
            its ``hub`` folder, or the ``models--org--name`` folder itself).
        repo_id: the repository looked for in a cache (the config's ``text_cfg.hf_model_name``).

    Returns:
        The folder with ``config.json`` and a tokenizer file.

    Raises:
        FileNotFoundError: no such folder, or neither the layout nor a cache of ``repo_id`` (one line naming it).
    """
    given = Path(folder).expanduser()
    if not given.is_dir():
        raise FileNotFoundError(f"text config folder not found: {given} (expected a local copy of {repo_id})")
    cache_name = "models--" + repo_id.replace("/", "--")
    candidates = [given]
    for repo_dir in (given, given / cache_name, given / "hub" / cache_name):
        if repo_dir.name.startswith("models--") and repo_dir.is_dir():
            snapshot = _snapshot(repo_dir)
            if snapshot is not None:
                candidates.append(snapshot)
    for candidate in candidates:
        if (candidate / _CONFIG_FILE).is_file():
            if not any((candidate / name).is_file() for name in _TOKENIZER_FILES):
                raise FileNotFoundError(
                    f"text config folder {candidate} has no tokenizer ({' or '.join(_TOKENIZER_FILES)}); expected "
                    f"the files of {repo_id}"
                )
            return candidate
    raise FileNotFoundError(
        f"text config folder {given} holds neither {_CONFIG_FILE} (the layout of {repo_id}: config.json, vocab.txt, "
        f"tokenizer_config.json) nor a Hugging Face cache of {repo_id}"
    )


def load_text_embeddings(
    path: str | os.PathLike,
    labels: Sequence[str] | None = LABELS,
    num_classes: int | None = None,
    embed_dim: int | None = None,
    templates: Sequence[str] | None = None,
) -> Any:
    """Read a text-embedding file and return its (num_classes, D) L2-normalised float32 tensor.

    Args:
        path: a ``.pt`` file holding a plain tensor or ``{"labels": [...], "embeddings": tensor, "prompts": {...}}``.
        labels: the expected label names in order (checked when the file lists labels); None skips the check.
        num_classes: expected number of rows (default ``len(labels)``).
        embed_dim: expected width (the image tower's embedding width); None skips the check.
        templates: the prompt templates the embeddings must come from: when the file records its prompts, they must
            be :func:`~monai_vce.labels.all_prompts` of these (``labels`` must then be :data:`LABELS`); None skips
            the check.

    Raises:
        FileNotFoundError: the file does not exist.
        ValueError: unreadable content, wrong shape, label names or order that differ, recorded prompts other than
            those of ``templates`` (the message has the command that rebuilds the file), or non-finite / zero rows;
            the message names the file.
    """
    import torch
    import torch.nn.functional as F

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"text embeddings file not found: {path}")
    obj = read_torch_file(path, "text embeddings")  # torch.load(weights_only=True), one-line errors
    file_labels = file_prompts = None
    if isinstance(obj, Mapping):
        if "embeddings" not in obj:
            raise ValueError(
                f"text embeddings {path}: expected a tensor or a dict with 'embeddings', got keys {list(obj)}"
            )
        tensor, file_labels, file_prompts = obj["embeddings"], obj.get("labels"), obj.get("prompts")
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
    if templates is not None and file_prompts is not None:
        _check_prompts(path, file_prompts, templates, labels, obj.get("model") if isinstance(obj, Mapping) else None)
    tensor = tensor.float()
    norms = tensor.norm(dim=1)
    if not torch.isfinite(tensor).all() or bool((norms == 0).any()):
        raise ValueError(f"text embeddings {path}: non-finite values or all-zero rows")
    return F.normalize(tensor, dim=-1)


def _check_prompts(
    path: Path, recorded: Any, templates: Sequence[str], labels: Sequence[str] | None, model: Any
) -> None:
    """Refuse a file whose recorded prompts are not those of ``templates``, naming the command that rebuilds it."""
    if labels is None or list(labels) != list(LABELS):
        raise ValueError(f"text embeddings {path}: checking prompt templates needs labels=LABELS, got {labels}")
    expected = all_prompts(templates)
    if not isinstance(recorded, Mapping):
        raise ValueError(f"text embeddings {path}: 'prompts' must be a dict of label -> prompts")
    differ = [label for label in LABELS if [str(p) for p in recorded.get(label, ())] != expected[label]]
    if differ:
        command = text_embeddings_command(path, str(model) if model else None, templates)
        raise ValueError(
            f"text embeddings {path} were computed from other prompts than those of the prompt templates "
            f"{list(check_templates(templates))} (labels {differ[:3]}{' ...' if len(differ) > 3 else ''}); rebuild it "
            f"with `{command}`"
        )


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


@contextlib.contextmanager
def _hf_errors(model: str, text_cfg: Mapping[str, Any], what: str) -> Iterator[None]:
    """Turn transformers' many-line 'cannot find' errors into one line saying what to pass."""
    try:
        yield
    except OSError as err:
        name = text_cfg.get("hf_tokenizer_name" if what == "tokenizer" else "hf_model_name")
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise RuntimeError(
            f"the text tower of {model!r} needs the {what} of {name}, which cannot be loaded ({first}); download "
            f"{name} once (config.json, vocab.txt, tokenizer_config.json) and pass its folder or the Hugging Face "
            "cache as --text-config"
        ) from None


def _tokenizer(open_clip_name: str, text_cfg: Mapping[str, Any], local: Path | None) -> Any:
    """open_clip's tokenizer of the model, from ``local`` when given; a ``local-dir:`` folder without tokenizer
    files (a BiomedCLIP snapshot) falls back to the config's ``hf_tokenizer_name``."""
    import open_clip
    from open_clip.tokenizer import DEFAULT_CONTEXT_LENGTH, HFTokenizer

    source: str | None = str(local) if local is not None else None
    if source is None and "hf_tokenizer_name" in text_cfg and open_clip_name.startswith("local-dir:"):
        folder = Path(open_clip_name[len("local-dir:") :])
        if not any((folder / name).is_file() for name in _TOKENIZER_FILES):
            source = str(text_cfg["hf_tokenizer_name"])
    if source is None:
        return open_clip.get_tokenizer(open_clip_name)
    return HFTokenizer(
        source,
        context_length=text_cfg.get("context_length", DEFAULT_CONTEXT_LENGTH),
        tokenizer_mode=text_cfg.get("tokenizer_mode"),
        **text_cfg.get("tokenizer_kwargs", {}),
    )


def compute_text_embeddings(
    model: str,
    model_name: str | None = None,
    prompts: Mapping[str, Sequence[str]] | None = None,
    device: str = "cpu",
    batch_size: int = 64,
    text_config: str | os.PathLike | None = None,
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
        text_config: for a Hugging Face text tower (BiomedCLIP's BiomedBERT), a local folder of it (hub layout) or a
            Hugging Face cache holding it (:func:`resolve_text_config`): its config builds the text tower, its
            tokenizer tokenises, nothing is downloaded. None: the config's ``hf_model_name`` from the hub or its
            cache, the tokenizer from a ``local-dir:`` folder when it has one (open_clip's rule), else likewise.

    Raises:
        FileNotFoundError: a missing ``text_config`` folder or files (one line naming it).
        RuntimeError: the Hugging Face text config or tokenizer cannot be had (one line saying what to pass).

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
    text_cfg = dict(model_cfg.get("text_cfg", {}))
    is_hf_text = "hf_model_name" in text_cfg
    custom_text = bool(model_cfg.pop("custom_text", False)) or is_hf_text
    local = resolve_text_config(text_config, str(text_cfg.get("hf_model_name"))) if text_config is not None else None
    if local is not None and not is_hf_text:
        raise ValueError(f"--text-config {text_config}: the text tower of {model!r} is not a Hugging Face model")
    if is_hf_text:
        text_cfg["hf_model_pretrained"] = False  # the weights come from the checkpoint
        if local is not None:  # the text tower's config and tokenizer from the local folder, offline
            text_cfg["hf_model_name"] = text_cfg["hf_tokenizer_name"] = str(local)
        model_cfg["text_cfg"] = text_cfg
    vision_cfg = dict(model_cfg["vision_cfg"])
    if vision_cfg.get("timm_model_name"):
        vision_cfg["timm_model_pretrained"] = False
    model_cfg["vision_cfg"] = vision_cfg
    cls = open_clip.CustomTextCLIP if custom_text else open_clip.CLIP
    with _hf_errors(model, text_cfg, "config"):
        clip = cls(**model_cfg)
    try:
        open_clip.load_checkpoint(clip, str(source.checkpoint), strict=True)
    except RuntimeError as err:
        raise ValueError(f"checkpoint {source.checkpoint} does not match the config of {model!r}: {err}") from err
    clip = clip.to(device).eval()
    with _hf_errors(model, text_cfg, "tokenizer"):
        tokenizer = _tokenizer(source.open_clip_name, text_cfg, local)

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


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``text-embeddings`` command to ``subparsers``; returns its parser."""
    p = subparsers.add_parser(
        "text-embeddings",
        description="Compute the label-prompt text embeddings of the contrastive path from a CLIP checkpoint; "
        "BiomedCLIP's text tower needs transformers.",
    )
    p.add_argument(
        "--model",
        required=True,
        help="hf-hub:org/repo, local-dir:/folder (open_clip_config.json + weights), or a checkpoint file",
    )
    p.add_argument("--model-name", default=None, help="open_clip config of a checkpoint file (default: BiomedCLIP's)")
    p.add_argument(
        "--text-config",
        default=None,
        help="offline: a local folder of the Hugging Face text tower (BiomedBERT's hub layout: config.json, vocab.txt, "
        "tokenizer_config.json) or a Hugging Face cache folder holding it; default: the hub or its cache",
    )
    p.add_argument("--out", required=True, help="output .pt file, e.g. bundle/models/text_embeddings.pt")
    p.add_argument(
        "--templates",
        nargs="+",
        action="extend",
        default=None,
        metavar="TEMPLATE",
        help="prompt templates, each with {label} (the label's clinical description) and/or {name} (its name), e.g. "
        "'a video capsule endoscopy image showing {name}'; several after one --templates or repeated; default: the "
        "built-in monai_vce.labels.PROMPT_TEMPLATES",
    )
    p.add_argument("--device", default="cpu", help="device of the text tower (default: cpu)")
    p.add_argument("--batch-size", type=int, default=64, help="prompts per forward pass")
    p.set_defaults(run=run)
    return p


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Compute and save the embeddings of ``args``; returns the printed summary of the written file."""
    prompts = all_prompts(args.templates)  # invalid templates fail before the model is loaded
    result = compute_text_embeddings(
        args.model,
        model_name=args.model_name,
        prompts=prompts,
        device=args.device,
        batch_size=args.batch_size,
        text_config=args.text_config,
    )
    out = save_text_embeddings(result, args.out)
    return {
        "out": str(out),
        "model": args.model,
        "labels": len(result["labels"]),
        "embed_dim": int(result["embeddings"].shape[1]),
    }


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m monai_vce.text_embeddings``, the same as ``python -m monai_vce text-embeddings``."""
    return command_main(add_parser, argv, "python -m monai_vce.text_embeddings")


if __name__ == "__main__":
    sys.exit(main())
