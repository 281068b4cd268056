"""Loading the image tower of BiomedCLIP (or any timm-based open_clip model) without its text tower.

``backbone``: ``"hf-hub:org/repo"``, ``"local-dir:PATH"``, a checkpoint file or a registered model name. Importing
registers the tiny test model (:data:`TINY_MODEL_NAME`) in memory.
"""

from __future__ import annotations

import io
import os
import re
from collections.abc import Mapping
from copy import deepcopy
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import open_clip
import timm
import torch
import torch.nn as nn
from open_clip.constants import OPENAI_DATASET_MEAN, OPENAI_DATASET_STD

from monai_vce.utils import atomic_write_bytes, atomic_write_json, check_torch_seal, read_json_file, seal_torch_bytes

__all__ = [
    "BIOMEDCLIP_HUB_ID",
    "BIOMEDCLIP_MODEL_NAME",
    "BIOMEDCLIP_CONFIG",
    "TINY_MODEL_NAME",
    "TINY_TIMM_MODEL_NAME",
    "TINY_CONFIG",
    "CHECKPOINT_SUFFIXES",
    "BackboneUnavailableError",
    "BackboneSource",
    "ImageTower",
    "resolve_backbone",
    "check_backbone",
    "read_torch_file",
    "check_weight_dtypes",
    "build_image_tower",
    "load_visual_weights",
    "create_tiny_open_clip",
    "save_tiny_checkpoint",
    "save_tiny_local_dir",
    "vit_vce_tiny_patch16_64",
]

#: Hub id of BiomedCLIP, the default backbone.
BIOMEDCLIP_HUB_ID = "hf-hub:microsoft/BiomedCLIP-PubMedBERT_256-vit_base_patch16_224"
#: Registered open_clip name of BiomedCLIP's architecture (config only; the weights come from a file or the hub).
BIOMEDCLIP_MODEL_NAME = "BiomedCLIP-PubMedBERT_256-vit_base_patch16_224"
#: BiomedCLIP's ``open_clip_config.json`` as published on the hub.
BIOMEDCLIP_CONFIG: dict[str, Any] = {
    "model_cfg": {
        "embed_dim": 512,
        "vision_cfg": {
            "timm_model_name": "vit_base_patch16_224",
            "timm_model_pretrained": False,
            "timm_pool": "",
            "timm_proj": "linear",
            "image_size": 224,
        },
        "text_cfg": {
            "hf_model_name": "microsoft/BiomedNLP-BiomedBERT-base-uncased-abstract",
            "hf_tokenizer_name": "microsoft/BiomedNLP-BiomedBERT-base-uncased-abstract",
            "hf_proj_type": "mlp",
            "hf_pooler_type": "cls_last_hidden_state_pooler",
            "context_length": 256,
        },
    },
    "preprocess_cfg": {"mean": list(OPENAI_DATASET_MEAN), "std": list(OPENAI_DATASET_STD)},
}

#: timm name of the tiny test ViT (registered on import).
TINY_TIMM_MODEL_NAME = "vit_vce_tiny_patch16_64"
#: Registered open_clip name of the tiny test model (random weights, no download).
TINY_MODEL_NAME = "vce-tiny-vit-64"
#: The tiny model's open_clip config: BiomedCLIP's tower layout (timm ViT, CLS pooling, linear projection) at toy size.
TINY_CONFIG: dict[str, Any] = {
    "model_cfg": {
        "embed_dim": 32,
        "vision_cfg": {
            "timm_model_name": TINY_TIMM_MODEL_NAME,
            "timm_model_pretrained": False,
            "timm_pool": "",
            "timm_proj": "linear",
            "image_size": 64,
        },
        "text_cfg": {"context_length": 32, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 1},
    },
    "preprocess_cfg": {"mean": list(OPENAI_DATASET_MEAN), "std": list(OPENAI_DATASET_STD)},
}

#: File suffixes accepted as checkpoint files.
CHECKPOINT_SUFFIXES: tuple[str, ...] = (".bin", ".pt", ".pth", ".safetensors")
# weights file names looked for in a local-dir folder, in order of preference (open_clip's names first)
_WEIGHT_NAMES = (
    "open_clip_model.safetensors",
    "open_clip_pytorch_model.safetensors",
    "open_clip_pytorch_model.bin",
    "open_clip_pytorch_model.pth",
    "model.safetensors",
    "pytorch_model.bin",
)
_HUB_WEIGHT_NAMES = ("open_clip_model.safetensors", "open_clip_pytorch_model.bin")
_REGISTERED: dict[str, dict[str, Any]] = {TINY_MODEL_NAME: TINY_CONFIG, BIOMEDCLIP_MODEL_NAME: BIOMEDCLIP_CONFIG}
_HUB_CONFIGS: dict[str, dict[str, Any]] = {BIOMEDCLIP_HUB_ID: BIOMEDCLIP_CONFIG}


class BackboneUnavailableError(RuntimeError):
    """A hub backbone could be neither downloaded nor found in the local cache."""


def vit_vce_tiny_patch16_64(pretrained: bool = False, **kwargs: Any) -> nn.Module:
    """timm entrypoint of the tiny test ViT: patch 16, 64 px, width 64, 2 blocks, 4 heads; random weights only."""
    if pretrained:
        raise ValueError(f"{TINY_TIMM_MODEL_NAME} has no pretrained weights; it exists for tests and offline demos")
    from timm.models import build_model_with_cfg
    from timm.models.vision_transformer import VisionTransformer

    for key in ("pretrained_cfg", "pretrained_cfg_overlay", "cache_dir"):
        kwargs.pop(key, None)
    pretrained_cfg = {
        "architecture": TINY_TIMM_MODEL_NAME,
        "input_size": (3, 64, 64),
        "mean": OPENAI_DATASET_MEAN,
        "std": OPENAI_DATASET_STD,
        "num_classes": 0,
    }
    model_args = {"img_size": 64, "patch_size": 16, "embed_dim": 64, "depth": 2, "num_heads": 4, **kwargs}
    return build_model_with_cfg(
        VisionTransformer, TINY_TIMM_MODEL_NAME, False, pretrained_cfg=pretrained_cfg, **model_args
    )


def _register() -> None:
    """Register the tiny timm model and the tiny / BiomedCLIP open_clip configs (in memory, idempotent)."""
    if not timm.is_model(TINY_TIMM_MODEL_NAME):
        from timm.models import register_model

        register_model(vit_vce_tiny_patch16_64)
    # open_clip only offers file-based registration (add_model_config); its registry is this dict
    registry = open_clip.factory._MODEL_CONFIGS
    for name, cfg in _REGISTERED.items():
        registry.setdefault(name, deepcopy(cfg["model_cfg"]))


_register()


@dataclass
class BackboneSource:
    """Where an open_clip model comes from, resolved by :func:`resolve_backbone`.

    Attributes:
        spec: the ``backbone`` string as given.
        model_cfg: the open_clip model config (``embed_dim``, ``vision_cfg``, ``text_cfg``).
        preprocess_cfg: preprocessing (``mean``, ``std``) of the config, open_clip's defaults when absent.
        checkpoint: the weights file, None for random weights.
        open_clip_name: the name under which ``open_clip.create_model`` / ``get_tokenizer`` find this config.
    """

    spec: str
    model_cfg: dict[str, Any]
    preprocess_cfg: dict[str, Any] = field(default_factory=dict)
    checkpoint: Path | None = None
    open_clip_name: str = ""


@dataclass
class ImageTower:
    """An open_clip image tower and what the classifier needs to know about it.

    Attributes:
        visual: the tower (open_clip ``TimmModel``: ``trunk`` ViT then ``head`` projection); images -> (B, embed_dim).
        embed_dim: width of the image features.
        image_size: (H, W) input size.
        mean: per-channel normalisation mean (RGB, for inputs in [0, 1]).
        std: per-channel normalisation std.
        logit_scale: the checkpoint's log logit scale when it has one, else None.
        source: the resolved source.
    """

    visual: nn.Module
    embed_dim: int
    image_size: tuple[int, int]
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    logit_scale: float | None
    source: BackboneSource


def _offline_alternatives() -> str:
    return (
        "Offline alternatives: (1) a local folder holding open_clip_config.json and the weights "
        "(open_clip_pytorch_model.bin or open_clip_model.safetensors, e.g. a downloaded snapshot of the hub "
        "repository), passed as backbone='local-dir:/path/to/folder'; (2) a local checkpoint file, passed as "
        "backbone='/path/to/open_clip_pytorch_model.bin' (its config is model_name, an open_clip_config.json beside "
        f"it, or BiomedCLIP's). Without any weights, backbone='{TINY_MODEL_NAME}' with pretrained=False builds the "
        "tiny demo model with random weights."
    )


def _hub_offline() -> bool:
    flag = os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in {"1", "ON", "YES", "TRUE"}
    try:
        from huggingface_hub import constants

        flag = flag or bool(constants.HF_HUB_OFFLINE)
    except ImportError:
        pass
    return flag


def _hub_download(spec: str, model_id: str, filenames: tuple[str, ...]) -> Path:
    """Download the first of ``filenames`` that the hub repo has (the local cache only when offline)."""
    try:
        from huggingface_hub import hf_hub_download
    except ImportError as err:  # pragma: no cover - open_clip depends on huggingface_hub
        raise BackboneUnavailableError(
            f"cannot load {spec!r}: huggingface_hub is not installed. {_offline_alternatives()}"
        ) from err
    offline = _hub_offline()
    errors = []
    for name in filenames:
        try:
            return Path(hf_hub_download(repo_id=model_id, filename=name, local_files_only=offline))
        except Exception as err:
            errors.append(f"{name}: {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}")
    where = "HF_HUB_OFFLINE is set and the files are not in the local cache" if offline else "the download failed"
    raise BackboneUnavailableError(
        f"cannot load {spec!r} from the Hugging Face Hub: {where} ({'; '.join(errors)}). {_offline_alternatives()}"
    )


def _read_config_file(path: Path) -> dict[str, Any]:
    try:
        cfg = read_json_file(path, max_bytes=16 * 1024**2, what="open_clip config")
    except (OSError, ValueError) as err:
        raise ValueError(f"cannot read the open_clip config {path}: {err}") from None
    model_cfg = cfg.get("model_cfg", cfg) if isinstance(cfg, dict) else None
    if not isinstance(model_cfg, dict) or not all(k in model_cfg for k in ("embed_dim", "vision_cfg")):
        raise ValueError(f"{path} is not an open_clip config: expected 'model_cfg' with 'embed_dim' and 'vision_cfg'")
    return {"model_cfg": model_cfg, "preprocess_cfg": cfg.get("preprocess_cfg", {})}


def _named_config(name: str) -> dict[str, Any] | None:
    if name in _REGISTERED:
        return deepcopy(_REGISTERED[name])
    model_cfg = open_clip.get_model_config(name)
    return None if model_cfg is None else {"model_cfg": model_cfg, "preprocess_cfg": {}}


def _weights_in_dir(folder: Path) -> Path | None:
    for name in _WEIGHT_NAMES:
        if (folder / name).is_file():
            return folder / name
    found = sorted(p for p in folder.iterdir() if p.is_file() and p.suffix in CHECKPOINT_SUFFIXES)
    return found[0] if len(found) == 1 else None


def resolve_backbone(backbone: str, model_name: str | None = None, pretrained: bool | str = True) -> BackboneSource:
    """Resolve a backbone string into a config and a weights file (see ``docs/design/networks.md`` for the forms).

    Args:
        backbone: ``"hf-hub:org/repo"``, ``"local-dir:/folder"``, a checkpoint file path or a registered model name.
        model_name: the open_clip config of a checkpoint file (a registered or built-in name, or ``local-dir:``);
            ignored for the other forms.
        pretrained: True loads the source's weights, False gives random weights, a path loads that checkpoint file.

    Raises:
        BackboneUnavailableError: a hub id that can be neither downloaded nor found in the cache.
        FileNotFoundError: a folder, config or checkpoint file that does not exist.
        ValueError: an unknown model name, or ``pretrained=True`` for a source without weights.
    """
    spec = str(backbone)
    explicit_ckpt: Path | None = None
    if isinstance(pretrained, (str, os.PathLike)):
        explicit_ckpt = Path(pretrained).expanduser()
        if not explicit_ckpt.is_file():
            raise FileNotFoundError(f"pretrained checkpoint file not found: {explicit_ckpt}")
    want_weights = bool(pretrained) and explicit_ckpt is None

    if spec.startswith("local-dir:"):
        folder = Path(spec[len("local-dir:") :]).expanduser()
        if not folder.is_dir():
            raise FileNotFoundError(f"backbone folder not found: {folder} (from {spec!r})")
        config_path = folder / "open_clip_config.json"
        if not config_path.is_file():
            raise FileNotFoundError(f"backbone folder {folder} has no open_clip_config.json")
        cfg = _read_config_file(config_path)
        checkpoint = explicit_ckpt
        if want_weights:
            checkpoint = _weights_in_dir(folder)
            if checkpoint is None:
                raise FileNotFoundError(
                    f"no weights file in {folder}: expected one of {', '.join(_WEIGHT_NAMES)} "
                    "(or pass pretrained=False for random weights)"
                )
        return BackboneSource(spec, cfg["model_cfg"], cfg["preprocess_cfg"], checkpoint, f"local-dir:{folder}")

    if spec.startswith("hf-hub:"):
        model_id = spec[len("hf-hub:") :].strip("/")
        if not model_id:
            raise ValueError("empty hub id after 'hf-hub:'")
        if not want_weights and spec in _HUB_CONFIGS:
            cfg = deepcopy(_HUB_CONFIGS[spec])
        else:
            cfg = _read_config_file(_hub_download(spec, model_id, ("open_clip_config.json",)))
        checkpoint = _hub_download(spec, model_id, _HUB_WEIGHT_NAMES) if want_weights else explicit_ckpt
        return BackboneSource(spec, cfg["model_cfg"], cfg["preprocess_cfg"], checkpoint, spec)

    path = Path(spec).expanduser()
    if path.is_file():
        if model_name:
            if str(model_name).startswith("local-dir:"):
                cfg = _read_config_file(
                    Path(str(model_name)[len("local-dir:") :]).expanduser() / "open_clip_config.json"
                )
            else:
                named = _named_config(str(model_name))
                if named is None:
                    raise ValueError(f"unknown model_name {model_name!r} for checkpoint {path}")
                cfg = named
            name = str(model_name)
        elif (path.parent / "open_clip_config.json").is_file():
            cfg = _read_config_file(path.parent / "open_clip_config.json")
            name = f"local-dir:{path.parent}"
        else:
            cfg, name = deepcopy(BIOMEDCLIP_CONFIG), BIOMEDCLIP_MODEL_NAME
        checkpoint = path if pretrained is not False and explicit_ckpt is None else explicit_ckpt
        return BackboneSource(spec, cfg["model_cfg"], cfg["preprocess_cfg"], checkpoint, name)

    named = _named_config(spec)
    if named is not None:
        if want_weights:
            raise ValueError(
                f"backbone {spec!r} is a model name without weights: pass pretrained=False for random weights, "
                "pretrained='/path/to/checkpoint' for a file, or use a 'hf-hub:' id or 'local-dir:' folder"
            )
        return BackboneSource(spec, named["model_cfg"], named["preprocess_cfg"], explicit_ckpt, spec)

    if path.suffix in CHECKPOINT_SUFFIXES or os.sep in spec:
        raise FileNotFoundError(f"backbone checkpoint file not found: {path}")
    raise ValueError(
        f"unknown backbone {spec!r}: expected 'hf-hub:org/repo', 'local-dir:/folder', a checkpoint file "
        f"({', '.join(CHECKPOINT_SUFFIXES)}) or a model name such as {TINY_MODEL_NAME!r} or {BIOMEDCLIP_MODEL_NAME!r}"
    )


def _is_safetensors(head: bytes) -> bool:
    # safetensors: an 8-byte little-endian header length, then the JSON header
    return len(head) >= 9 and head[8:9] == b"{" and 2 <= int.from_bytes(head[:8], "little") < 100 * 1024**2


def read_torch_file(path: str | os.PathLike, what: str = "checkpoint", mmap: bool = False, verify: bool = True) -> Any:
    """``torch.load(path, weights_only=True)`` with one-line errors naming the file and what to do.

    torch's own errors name nothing (a zero-byte file raises a bare ``EOFError``, a truncated one a zip-reader
    error) or advise ``weights_only=False``, exactly wrong for a file that holds more than tensors: such a file is
    refused here, and nothing in it ever runs.

    Args:
        path: the file.
        what: what the file is, for messages (``"checkpoint"``, ``"text embeddings"``).
        mmap: map the file instead of reading it (cheap inspection of large checkpoints; zip-format files).
        verify: check the checksum the project writes into its files (:func:`monai_vce.utils.check_torch_seal`);
            a file without one is read after a logged note.

    Raises:
        FileNotFoundError: the file does not exist.
        ValueError: an empty, truncated or foreign file (e.g. a safetensors file under a ``.pt`` name), or one
            holding objects other than tensors and plain containers, or one whose checksum does not match.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{what} {path} not found")
    cannot = f"cannot read {what} {path}"
    if not path.is_file():  # a folder, device or named pipe (opening a pipe would wait forever)
        raise ValueError(f"{cannot}: it is not a regular file (a folder, device, pipe or socket); give a file")
    try:
        with open(path, "rb") as f:
            head = f.read(16)
    except OSError as e:
        raise ValueError(f"{cannot}: {e.strerror or e}") from None
    if not head:
        raise ValueError(f"{cannot}: the file is empty (0 bytes), a copy or a save was cut short; use a complete file")
    if _is_safetensors(head) and path.suffix != ".safetensors":
        raise ValueError(
            f"{cannot}: it is a safetensors file, not a torch checkpoint; give it the .safetensors suffix where "
            "safetensors files are accepted (backbone weights), or save the weights with torch.save"
        )
    if not head.startswith(b"PK") and head[:1] != b"\x80":  # neither torch's zip format nor a legacy pickle
        raise ValueError(f"{cannot}: it is not a file written by torch.save")
    if verify:
        check_torch_seal(path, what)
    try:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap and head.startswith(b"PK"))
    except Exception as err:  # torch raises RuntimeError, EOFError, UnpicklingError, KeyError, ... on bad files
        text = str(err)
        if "Weights only load failed" in text:
            found = re.search(r"(Unsupported [^.\n]*)", text)
            detail = f" ({found.group(1).strip()})" if found else ""
            raise ValueError(
                f"{cannot}: it holds objects other than tensors and plain containers{detail} and is refused, since "
                "loading it could run code (Weights only load failed); save a state dict of tensors"
            ) from None
        first = text.strip().splitlines()[0] if text.strip() else type(err).__name__
        raise ValueError(
            f"{cannot}: the file is truncated or damaged ({type(err).__name__}: {first[:120]}); copy or save it again"
        ) from None


def check_weight_dtypes(
    state: Mapping[str, Any], expected: Mapping[str, torch.Tensor], path: str | os.PathLike, what: str = "checkpoint"
) -> None:
    """Refuse weights of a non-floating type for floating tensors of the model.

    ``load_state_dict`` copies an int8 or bool tensor into a float parameter without a word, and the network then
    computes nonsense (int8 weights) or constants (bool weights loaded as zeros and ones).

    Args:
        state: the checkpoint's tensors by key.
        expected: the model's ``state_dict()``.
        path: the file, for messages.
        what: what the file is, for messages.

    Raises:
        ValueError: naming the file, the first such key, both types and the number of such keys.
    """
    bad = [
        (k, v.dtype, expected[k].dtype)
        for k, v in state.items()
        if k in expected
        and isinstance(v, torch.Tensor)
        and expected[k].is_floating_point()
        and not (v.is_floating_point() or v.is_complex())
    ]
    if bad:
        key, got, want = bad[0]
        more = f" (and {len(bad) - 1} more keys)" if len(bad) > 1 else ""
        raise ValueError(
            f"{what} {path}: key {key!r} holds {str(got).replace('torch.', '')} values where the model has "
            f"{str(want).replace('torch.', '')} weights{more}; the file holds no usable weights (quantised or "
            "converted?): use the floating-point checkpoint"
        )


def _read_state_dict(path: Path) -> dict[str, torch.Tensor]:
    if path.suffix == ".safetensors":
        try:
            state = open_clip.factory.load_state_dict(str(path), device="cpu", weights_only=True)
        except Exception as err:
            raise ValueError(f"cannot read checkpoint {path}: {type(err).__name__}: {err}") from None
    else:
        obj = read_torch_file(path, "checkpoint")
        # the forms open_clip accepts: a state dict, or one under "state_dict", with "module." prefixes removed
        state = obj.get("state_dict", obj) if isinstance(obj, Mapping) else obj
        if isinstance(state, Mapping) and next(iter(state), "").startswith("module."):
            state = {k[7:]: v for k, v in state.items()}
    if not isinstance(state, Mapping) or not state:
        raise ValueError(f"checkpoint {path} holds no state dict")
    return dict(state)


def load_visual_weights(visual: nn.Module, checkpoint: str | os.PathLike, state: dict | None = None) -> float | None:
    """Load the image-tower weights of an open_clip checkpoint into ``visual``, requiring an exact key match.

    The checkpoint may be a full open_clip state dict (``visual.*`` keys are used, text keys ignored) or the image
    tower's own state dict.

    Args:
        visual: the image tower built from the same config.
        checkpoint: ``.bin`` / ``.pt`` / ``.pth`` / ``.safetensors`` file.
        state: the already-read state dict of ``checkpoint`` (read from the file when None).

    Returns:
        The checkpoint's ``logit_scale`` (log scale) when present, else None.

    Raises:
        ValueError: unreadable file, no image-tower weights, or missing / unexpected / mis-shaped keys (listed).
    """
    path = Path(checkpoint)
    state = _read_state_dict(path) if state is None else state
    expected = visual.state_dict()
    tower = {k[len("visual.") :]: v for k, v in state.items() if k.startswith("visual.")}
    if not tower and any(k in expected for k in state):
        tower = dict(state)
    if not tower:
        sample = ", ".join(list(state)[:5])
        raise ValueError(
            f"checkpoint {path} has no image-tower weights ('visual.*' keys); its keys start with: {sample}"
        )
    check_weight_dtypes(tower, expected, path)
    missing = sorted(set(expected) - set(tower))
    unexpected = sorted(set(tower) - set(expected))
    mis_shaped = sorted(
        f"{k} {tuple(tower[k].shape)} vs {tuple(expected[k].shape)}"
        for k in set(tower) & set(expected)
        if tuple(tower[k].shape) != tuple(expected[k].shape)
    )
    if missing or unexpected or mis_shaped:

        def _list(keys: list[str]) -> str:
            return ", ".join(keys[:8]) + (f" ... ({len(keys)} in all)" if len(keys) > 8 else "") if keys else "none"

        raise ValueError(
            f"checkpoint {path} does not match the image tower: missing keys: {_list(missing)}; "
            f"unexpected keys: {_list(unexpected)}; shape mismatches (checkpoint vs model): {_list(mis_shaped)}"
        )
    visual.load_state_dict(tower, strict=True)
    scale = state.get("logit_scale")
    return float(scale.float().reshape(-1)[0]) if isinstance(scale, torch.Tensor) and scale.numel() else None


def build_image_tower(
    backbone: str = BIOMEDCLIP_HUB_ID,
    model_name: str | None = None,
    pretrained: bool | str = True,
    image_size: int | None = None,
    drop_path: float | None = None,
) -> ImageTower:
    """Build the image tower of an open_clip model and load its pretrained weights (text tower never built).

    Args:
        backbone: see :func:`resolve_backbone`.
        model_name: config of a checkpoint-file backbone (see :func:`resolve_backbone`).
        pretrained: True loads the source's weights, False gives random weights, a path loads that file.
        image_size: input size; the timm position embedding is resampled when it differs from the config's.
        drop_path: stochastic depth rate of the timm trunk (None keeps the config's).

    Returns:
        The :class:`ImageTower`.
    """
    from open_clip.model import _build_vision_tower

    source = resolve_backbone(backbone, model_name=model_name, pretrained=pretrained)
    model_cfg = deepcopy(source.model_cfg)
    vision_cfg = dict(model_cfg["vision_cfg"])
    if vision_cfg.get("timm_model_name"):
        vision_cfg["timm_model_pretrained"] = False  # never fetch ImageNet weights behind the user's back
        if drop_path is not None:
            vision_cfg["timm_drop_path"] = drop_path
    visual = _build_vision_tower(
        int(model_cfg["embed_dim"]), vision_cfg, quick_gelu=bool(model_cfg.get("quick_gelu", False))
    )
    logit_scale = None
    if source.checkpoint is not None:
        logit_scale = load_visual_weights(visual, source.checkpoint)
    size = vision_cfg.get("image_size", 224)
    size = tuple(size) if isinstance(size, (list, tuple)) else (int(size), int(size))
    if image_size is not None and (
        isinstance(image_size, bool) or not (isinstance(image_size, int) and 1 <= image_size <= 8192)
    ):
        # before set_input_size allocates the position embedding (10 GB at 100000 pixels)
        raise ValueError(f"image_size must be one or two sides in [1, 8192] pixels, got {image_size!r}")
    if image_size is not None and (int(image_size), int(image_size)) != size:
        if not hasattr(visual, "set_input_size"):
            raise ValueError(f"the image tower of {backbone!r} cannot change its input size from {size}")
        visual.set_input_size(int(image_size))
        size = (int(image_size), int(image_size))
    mean = cast(
        tuple[float, float, float], tuple(float(m) for m in source.preprocess_cfg.get("mean", OPENAI_DATASET_MEAN))
    )
    std = cast(
        tuple[float, float, float], tuple(float(s) for s in source.preprocess_cfg.get("std", OPENAI_DATASET_STD))
    )
    return ImageTower(visual, int(model_cfg["embed_dim"]), size, mean, std, logit_scale, source)


def create_tiny_open_clip(seed: int = 0) -> nn.Module:
    """The full tiny open_clip model (image and built-in text tower) with seeded random weights, in eval mode."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = open_clip.model.CLIP(**deepcopy(TINY_CONFIG["model_cfg"]))
    return model.eval()


def _save_state_dict(state: dict[str, torch.Tensor], path: Path) -> Path:
    state = {k: v.detach().contiguous().cpu() for k, v in state.items()}
    if path.suffix == ".safetensors":
        from safetensors.torch import save as safetensors_save

        return atomic_write_bytes(path, safetensors_save(state))
    buffer = io.BytesIO()
    torch.save(state, buffer)
    return atomic_write_bytes(path, seal_torch_bytes(buffer.getvalue()))


def save_tiny_checkpoint(path: str | os.PathLike, seed: int = 0, model: nn.Module | None = None) -> Path:
    """Write the tiny model's full open_clip state dict (``visual.*``, ``text`` keys, ``logit_scale``) to a file.

    Args:
        path: destination; ``.safetensors`` is written with safetensors, other suffixes with ``torch.save``.
        seed: seed of the random weights (ignored when ``model`` is given).
        model: a tiny open_clip model to save instead of a fresh one.

    Returns:
        The written path. Load it with ``backbone=path, model_name=TINY_MODEL_NAME``.
    """
    model = create_tiny_open_clip(seed) if model is None else model
    return _save_state_dict(model.state_dict(), Path(path))


def save_tiny_local_dir(
    folder: str | os.PathLike, seed: int = 0, safetensors: bool = False, model: nn.Module | None = None
) -> Path:
    """Write the tiny model as an open_clip ``local-dir:`` folder: ``open_clip_config.json`` plus the weights.

    Args:
        folder: destination folder (created when missing).
        seed: seed of the random weights (ignored when ``model`` is given).
        safetensors: write ``open_clip_model.safetensors`` instead of ``open_clip_pytorch_model.bin``.
        model: a tiny open_clip model to save instead of a fresh one.

    Returns:
        The folder. Load it with ``backbone=f"local-dir:{folder}"``.
    """
    folder = Path(folder)
    name = "open_clip_model.safetensors" if safetensors else "open_clip_pytorch_model.bin"
    save_tiny_checkpoint(folder / name, seed=seed, model=model)
    atomic_write_json(folder / "open_clip_config.json", deepcopy(TINY_CONFIG))
    return folder


def check_backbone(backbone: str, pretrained: bool | str = True) -> str:
    """Resolve the backbone before anything is built, with a bundle-specific message when it is unavailable.

    A hub backbone (BiomedCLIP by default) is downloaded and cached here. When neither the hub nor the cache
    has it, the error says how to pass local weights on the bundle command line, or how to run the demo.

    Returns:
        ``backbone`` unchanged.

    Raises:
        RuntimeError: the backbone cannot be loaded (the message lists the alternatives).
    """
    try:
        resolve_backbone(backbone, pretrained=pretrained)
    except BackboneUnavailableError as e:
        raise RuntimeError(
            f"{e}\nWith the bundle: pass a local copy on the command line, e.g. "
            f"--backbone local-dir:/path/to/BiomedCLIP (a folder with open_clip_config.json and "
            f"open_clip_pytorch_model.bin) or --backbone /path/to/open_clip_pytorch_model.bin; or run the offline "
            f"demo, python -m monai_vce.demo (configs train.json + demo.json)."
        ) from None
    return backbone
