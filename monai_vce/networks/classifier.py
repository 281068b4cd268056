"""DiffAttn-BiomedCLIP: BiomedCLIP's image tower with differential attention, an SE-gated head and a contrastive path."""

from __future__ import annotations

import logging
import os
import re
import warnings
from collections.abc import Sequence
from typing import Any, cast

import torch
import torch.nn as nn

from monai_vce.labels import LABELS, NUM_LABELS

from .backbone import BIOMEDCLIP_HUB_ID, build_image_tower
from .diff_attention import (
    CONVERSION_MODES,
    DifferentialAttention,
    LambdaInit,
    convert_to_diff_attention,
    find_vit_blocks,
)
from .heads import DEFAULT_LOGIT_SCALE, SEGatedClassifierHead, TextContrastiveHead
from .text_embeddings import load_text_embeddings

__all__ = ["DiffAttnCLIPClassifier", "FUSION_MODES"]

logger = logging.getLogger(__name__)

#: Accepted values of ``fusion``: what :meth:`DiffAttnCLIPClassifier.forward` returns.
FUSION_MODES: tuple[str, ...] = ("classification", "mean")

# parameters of the embedding stage (layer 0 of the layer-wise learning-rate decay)
_EMBED_RE = re.compile(
    r"^visual\.(trunk\.(cls_token|reg_token|pos_embed|patch_embed|norm_pre)|"
    r"(conv1|class_embedding|positional_embedding|ln_pre|patch_dropout))"
)
_BLOCK_RE = re.compile(r"^visual\.(?:trunk\.blocks|transformer\.resblocks)\.(\d+)\.")
_NO_DECAY_NAMES = ("pos_embed", "cls_token", "reg_token", "positional_embedding", "class_embedding", "logit_scale")


class DiffAttnCLIPClassifier(nn.Module):
    """BiomedCLIP image tower with differential attention, an SE-gated classifier and a text-contrastive path.

    Input: float RGB images in [0, 1], shape (B, 3, H, W) with H = W = ``image_size``; the CLIP mean/std
    normalisation happens inside (buffers). :meth:`forward` returns one float32 tensor of raw logits (B, num_classes)
    in train and eval mode, so the network works with MONAI inferers, ``verify_net_in_out`` and TorchScript.
    :meth:`forward_paths` returns both paths for the training loss.

    Paths:
        * classification: image features -> :class:`~monai_vce.networks.heads.SEGatedClassifierHead` -> logits.
        * contrastive: normalised image features x frozen normalised text embeddings of the label prompts
          (:mod:`monai_vce.text_embeddings`) x a learnable logit scale
          (:class:`~monai_vce.networks.heads.TextContrastiveHead`). Off, with one warning, when no text-embedding
          file is given.

    Args:
        backbone: ``"hf-hub:org/repo"``, ``"local-dir:/folder"``, a checkpoint file or a registered model name (see
            :func:`~monai_vce.networks.backbone.resolve_backbone`). Default: BiomedCLIP from the hub.
        model_name: open_clip config of a checkpoint-file backbone (default: a config beside the file, else
            BiomedCLIP's).
        pretrained: True loads the backbone's weights, False builds it with random weights, a path loads that file.
        attention: ``"diff"`` converts the ViT attention to differential attention, ``"plain"`` keeps it.
        conversion_mode: ``"paper"`` (the paper's layout, new function at step 0) or ``"preserving"`` (computes the
            pretrained network exactly at initialisation); see :mod:`monai_vce.networks.diff_attention`.
        lambda_init_schedule: ``"depth"`` (``0.8 - 0.6 exp(-0.3 d)``), ``"constant"`` (0.8) or a number; paper mode.
        diff_blocks: indices of the blocks to convert; None converts every block.
        subln: per-head RMS norm and ``1 - lambda_init`` scale after the differential attention (paper mode).
        attn_impl: ``"auto"`` (SDPA unless timm's fused-attention switch is off), ``"sdpa"`` or ``"explicit"``
            (the reference path that returns the attention maps).
        num_classes: number of logits (17 RARE-VISION labels).
        dropout: dropout before the classification layer.
        se_reduction: reduction ratio of the excitation gate.
        text_embeddings: a ``.pt`` file of label-prompt embeddings (``python -m monai_vce.text_embeddings``), a
            (num_classes, embed_dim) tensor, or None (contrastive path off).
        contrastive: enable the contrastive path when text embeddings are given.
        fusion: what :meth:`forward` returns: ``"classification"`` (the classification logits; default) or
            ``"mean"`` (mean of the classification and contrastive logits when the contrastive path is on).
        freeze_backbone: freeze every pretrained weight of the image tower (linear probing); the new
            differential-attention parameters (lambda vectors, sub-norms) stay trainable.
        freeze_blocks: freeze the patch embedding, the position / class embeddings and the first ``freeze_blocks``
            transformer blocks (their pretrained weights) for partial fine-tuning.
        image_size: input size; None keeps the backbone's (224 for BiomedCLIP). Another size resamples the position
            embedding.
        normalize: normalise the [0, 1] input with the backbone's mean/std inside the network.
        drop_path: stochastic depth rate of the ViT trunk (None keeps the config's).
        logit_scale_init: initial log scale of the contrastive path; None takes the checkpoint's ``logit_scale``
            when present, else log(1 / 0.07).
    """

    __jit_unused_properties__ = ["num_layers"]  # noqa: RUF012  (TorchScript reads it as a plain class attribute)

    def __init__(
        self,
        backbone: str = BIOMEDCLIP_HUB_ID,
        model_name: str | None = None,
        pretrained: bool | str = True,
        attention: str = "diff",
        conversion_mode: str = "paper",
        lambda_init_schedule: LambdaInit = "depth",
        diff_blocks: Sequence[int] | None = None,
        subln: bool = True,
        attn_impl: str = "auto",
        num_classes: int = NUM_LABELS,
        dropout: float = 0.1,
        se_reduction: int = 4,
        text_embeddings: str | os.PathLike | torch.Tensor | None = None,
        contrastive: bool = True,
        fusion: str = "classification",
        freeze_backbone: bool = False,
        freeze_blocks: int = 0,
        image_size: int | None = None,
        normalize: bool = True,
        drop_path: float | None = None,
        logit_scale_init: float | None = None,
    ) -> None:
        super().__init__()
        if attention not in ("diff", "plain"):
            raise ValueError(f"attention must be 'diff' or 'plain', got {attention!r}")
        if conversion_mode not in CONVERSION_MODES:
            raise ValueError(f"conversion_mode must be one of {CONVERSION_MODES}, got {conversion_mode!r}")
        if fusion not in FUSION_MODES:
            raise ValueError(f"fusion must be one of {FUSION_MODES}, got {fusion!r}")
        tower = build_image_tower(
            backbone, model_name=model_name, pretrained=pretrained, image_size=image_size, drop_path=drop_path
        )
        self.visual = tower.visual
        self.embed_dim = tower.embed_dim
        self.image_size = tower.image_size
        self.num_classes = int(num_classes)
        self.fusion = fusion
        self.normalize = bool(normalize)
        self.register_buffer("mean", torch.tensor(tower.mean, dtype=torch.float32).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(tower.std, dtype=torch.float32).view(1, 3, 1, 1), persistent=False)

        self.diff_blocks: list[int] = []
        if attention == "diff":
            self.diff_blocks = convert_to_diff_attention(
                self.visual,
                mode=conversion_mode,
                blocks=diff_blocks,
                lambda_init=lambda_init_schedule,
                sub_norm=subln,
                attn_impl=attn_impl,
            )
        self.conversion_mode = conversion_mode if attention == "diff" else None

        self.classifier_head = SEGatedClassifierHead(
            self.embed_dim, self.num_classes, reduction=se_reduction, dropout=dropout
        )
        self.contrastive_head: TextContrastiveHead | None = None
        if contrastive and text_embeddings is None:
            warnings.warn(
                "DiffAttnCLIPClassifier: no text_embeddings file given, so the contrastive path is off (only the "
                "classification path is trained); compute one with `python -m monai_vce.text_embeddings --model "
                "<backbone> --out bundle/models/text_embeddings.pt` and pass text_embeddings=<file>.",
                stacklevel=2,
            )
        elif contrastive and text_embeddings is not None:
            embeddings = self._load_text_embeddings(text_embeddings)
            scale = logit_scale_init if logit_scale_init is not None else tower.logit_scale
            self.contrastive_head = TextContrastiveHead(embeddings, DEFAULT_LOGIT_SCALE if scale is None else scale)

        if freeze_backbone or freeze_blocks:
            self._freeze(all_blocks=freeze_backbone, num_blocks=int(freeze_blocks))
        logger.info(
            "DiffAttnCLIPClassifier: backbone %s (pretrained=%s), attention=%s, mode=%s, converted blocks %s, "
            "contrastive path %s",
            backbone,
            pretrained,
            attention,
            self.conversion_mode,
            self.diff_blocks,
            "on" if self.contrastive_head is not None else "off",
        )

    def _load_text_embeddings(self, text_embeddings: str | os.PathLike | torch.Tensor) -> torch.Tensor:
        if isinstance(text_embeddings, torch.Tensor):
            if tuple(text_embeddings.shape) != (self.num_classes, self.embed_dim):
                raise ValueError(
                    f"text_embeddings tensor must be ({self.num_classes}, {self.embed_dim}), "
                    f"got {tuple(text_embeddings.shape)}"
                )
            return text_embeddings
        labels = LABELS if self.num_classes == NUM_LABELS else None
        return load_text_embeddings(
            text_embeddings, labels=labels, num_classes=self.num_classes, embed_dim=self.embed_dim
        )

    def _new_parameter_names(self) -> set[str]:
        """Names of the parameters the differential-attention conversion added (lambda vectors, sub-norms)."""
        names = set()
        for module_name, module in self.named_modules():
            if isinstance(module, DifferentialAttention):
                for name, _ in module.named_parameters():
                    if name.startswith(("lambda_", "sub_norm.")):
                        names.add(f"{module_name}.{name}")
        return names

    def _freeze(self, all_blocks: bool, num_blocks: int) -> None:
        new = self._new_parameter_names()
        num_layers = self.num_layers
        if not 0 <= num_blocks <= num_layers:
            raise ValueError(f"freeze_blocks must lie in [0, {num_layers}], got {num_blocks}")
        for name, param in self.named_parameters():
            if not name.startswith("visual.") or name in new:
                continue
            layer = self._layer_id(name, num_layers)
            if all_blocks or layer <= num_blocks:
                param.requires_grad_(False)

    @property
    def num_layers(self) -> int:
        """Number of transformer blocks of the image tower."""
        try:
            return len(find_vit_blocks(self.visual))
        except ValueError:
            resblocks = getattr(getattr(self.visual, "transformer", None), "resblocks", None)
            return len(resblocks) if resblocks is not None else 0

    @staticmethod
    def _layer_id(name: str, num_layers: int) -> int:
        """Layer of a parameter for layer-wise decay: 0 embeddings, i + 1 block i, num_layers + 1 the rest."""
        if _EMBED_RE.match(name):
            return 0
        match = _BLOCK_RE.match(name)
        if match:
            return int(match.group(1)) + 1
        return num_layers + 1

    def param_groups(
        self,
        lr: float,
        backbone_lr_mult: float = 0.1,
        layer_decay: float = 0.75,
        weight_decay: float = 0.05,
    ) -> list[dict[str, Any]]:
        """Optimizer parameter groups with layer-wise learning-rate decay over the image tower.

        The heads and the parameters the conversion added (lambda vectors, sub-norms) train at ``lr``. A pretrained
        image-tower parameter at layer ``l`` (0: embeddings, ``i + 1``: block ``i``, ``L + 1``: final norm and
        projection) trains at ``lr * backbone_lr_mult * layer_decay ** (L + 1 - l)``. Biases, norms, lambda vectors,
        position / class embeddings and the logit scale get no weight decay. Frozen parameters are left out.

        Args:
            lr: base learning rate (of the heads).
            backbone_lr_mult: learning-rate factor of the top of the image tower.
            layer_decay: factor per layer going down the tower (1.0 disables the decay).
            weight_decay: weight decay of the other parameters.

        Returns:
            A list of ``{"params", "lr", "weight_decay", "name"}`` dicts for any ``torch.optim`` optimizer, e.g. in a
            bundle: ``"params": "$@network.param_groups(@learning_rate)"``.
        """
        num_layers = self.num_layers
        new = self._new_parameter_names()
        groups: dict[tuple[str, float, float], dict[str, Any]] = {}
        for name, param in self.named_parameters():
            if not param.requires_grad:
                continue
            if name.startswith("visual.") and name not in new:
                layer = self._layer_id(name, num_layers)
                group_lr = lr * backbone_lr_mult * layer_decay ** (num_layers + 1 - layer)
                tag = f"layer_{layer}"
            else:
                group_lr, tag = lr, "new"
            no_decay = param.ndim <= 1 or name.split(".")[-1] in _NO_DECAY_NAMES
            wd = 0.0 if no_decay else weight_decay
            key = (tag, group_lr, wd)
            if key not in groups:
                groups[key] = {
                    "params": [],
                    "lr": group_lr,
                    "weight_decay": wd,
                    "name": f"{tag}{'_no_decay' if no_decay else ''}",
                }
            groups[key]["params"].append(param)
        return list(groups.values())

    def differential_lambdas(self) -> dict[int, float]:
        """The current lambda of every converted block, ``{block index: value}`` (for logging)."""
        if not self.diff_blocks:
            return {}
        blocks = find_vit_blocks(self.visual)
        return {i: float(cast(DifferentialAttention, blocks[i].attn).lambda_value().detach()) for i in self.diff_blocks}

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """Image features (B, embed_dim) of float RGB images in [0, 1] (B, 3, H, W)."""
        if self.normalize:
            x = (x - self.mean.to(x.dtype)) / self.std.to(x.dtype)
        return self.visual(x)

    @torch.jit.export
    def forward_paths(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Both paths for the training loss: ``(classification_logits, contrastive_logits or None)``, float32."""
        features = self.forward_features(x)
        cls_logits = self.classifier_head(features).float()
        head = self.contrastive_head
        con_logits = head(features).float() if head is not None else None
        return cls_logits, con_logits

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Raw logits (B, num_classes), float32: the classification logits, or the mean of both paths (``fusion``)."""
        features = self.forward_features(x)
        logits = self.classifier_head(features).float()
        head = self.contrastive_head
        if self.fusion == "mean" and head is not None:
            logits = 0.5 * (logits + head(features).float())
        return logits
