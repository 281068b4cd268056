"""DiffAttn-BiomedCLIP: BiomedCLIP's image tower with differential attention, an SE-gated head and a contrastive path."""

from __future__ import annotations

import logging
import os
import re
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, cast

import torch
import torch.nn as nn

from monai_vce.labels import LABELS, NUM_LABELS, all_prompts, check_templates

from .backbone import BIOMEDCLIP_HUB_ID, build_image_tower, check_backbone
from .diff_attention import (
    DifferentialAttention,
    LambdaInit,
    convert_to_diff_attention,
    find_vit_blocks,
    resolve_variant,
)
from .heads import DEFAULT_LOGIT_SCALE, SEGatedClassifierHead, TextContrastiveHead
from .text_embeddings import compute_text_embeddings, load_text_embeddings, save_text_embeddings, text_embeddings_hint

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


def _drop_unused_contrastive_state(module: nn.Module, state_dict: dict[str, Any], prefix: str, *args: Any) -> None:
    """Load hook: ignore a checkpoint's contrastive-path entries when the network has no contrastive path."""
    if getattr(module, "contrastive_head", None) is None:
        for key in [k for k in state_dict if k.startswith(f"{prefix}contrastive_head.")]:
            del state_dict[key]


class DiffAttnCLIPClassifier(nn.Module):
    """BiomedCLIP image tower with differential attention, an SE-gated classifier and a text-contrastive path.

    The defaults build the network of the bundle's default recipe (``project``); the paper's network is
    ``attention_variant="paper", se_reduction=16, head_batch_norm=True, dropout=0.4`` (``bundle/configs/paper.json``).

    Input: RGB frames (B, 3, H, W) with H = W = ``image_size``, ``uint8`` in [0, 255] (what the bundle's
    ``preprocessing`` emits) or float in [0, 1] (what its ``prepare_batch`` hands the network); the scaling of ``uint8``
    frames and the CLIP mean/std normalisation happen inside (see ``docs/design/data.md`` for the dtype of a
    frame at each stage). :meth:`forward` returns one float32 tensor of raw logits (B, num_classes)
    in train and eval mode, so the network works with MONAI inferers, ``verify_net_in_out`` and TorchScript.
    :meth:`forward_paths` returns both paths for the training loss.

    Paths:
        * classification: image features -> :class:`~monai_vce.networks.heads.SEGatedClassifierHead` -> logits.
        * contrastive: normalised image features x frozen normalised text embeddings of the label prompts
          (:mod:`monai_vce.text_embeddings`) x a learnable logit scale clamped at ``max_logit_scale``
          (:class:`~monai_vce.networks.heads.TextContrastiveHead`). The embeddings come from a file; when the file
          does not exist and ``text_model`` is given, they are computed once with that CLIP model's text tower and
          saved to the file. Off, with one warning naming the reason, when no embeddings are available; the reason
          is kept in ``contrastive_off_reason``, and :class:`~monai_vce.engines.VCETrainer` refuses to train such a
          network with ``contrastive_weight > 0``.

    The contrastive path is a training aid: a checkpoint trained with it loads into a network built without it
    (inference builds none), its ``contrastive_head.*`` entries being ignored.

    Args:
        backbone: ``"hf-hub:org/repo"``, ``"local-dir:/folder"``, a checkpoint file or a registered model name (see
            :func:`~monai_vce.networks.backbone.resolve_backbone`). Default: BiomedCLIP from the hub.
        model_name: open_clip config of a checkpoint-file backbone (default: a config beside the file, else
            BiomedCLIP's).
        pretrained: True loads the backbone's weights, False builds it with random weights, a path loads that file.
        attention: ``"diff"`` converts the ViT attention to differential attention, ``"plain"`` keeps it.
        attention_variant: ``"paper"`` (the paper's: constant lambda_init 0.8, no sub-norm), ``"diff_transformer"``
            (Ye et al. 2024: depth schedule of lambda_init and sub-norm; the default, as in the bundle's default
            recipe), ``"preserving"`` (computes the pretrained network exactly at initialisation) or ``"authors"``
            (the layout of the paper authors' code: head groups 0..h/2-1 and h/2..h-1, each head its own value,
            ``proj(concat(A1 V1 - lambda A2 V2, A2 V2))``); see :mod:`monai_vce.networks.diff_attention`.
        lambda_init_schedule: ``"depth"`` (``0.8 - 0.6 exp(-0.3 d)``), ``"constant"`` (0.8) or a number; None takes
            the variant's.
        diff_blocks: indices of the blocks to convert; None converts every block.
        subln: per-head RMS norm and ``1 - lambda_init`` scale after the differential attention; None takes the
            variant's (on for ``"diff_transformer"`` only).
        attn_impl: ``"auto"`` (SDPA unless timm's fused-attention switch is off), ``"sdpa"`` or ``"explicit"``
            (the reference path that returns the attention maps).
        num_classes: number of logits (17 RARE-VISION labels).
        dropout: dropout before the classification layer (the paper's: 0.4).
        se_reduction: reduction ratio of the excitation gate (the paper's: 16).
        head_batch_norm: BatchNorm over the gated features before the dropout (the paper's head has it).
        text_embeddings: a ``.pt`` file of label-prompt embeddings (``python -m monai_vce.text_embeddings``), a
            (num_classes, embed_dim) tensor, or None (contrastive path off).
        text_model: the CLIP model (``hf-hub:`` id, ``local-dir:`` folder or checkpoint file) whose text tower
            computes the embeddings when the ``text_embeddings`` file does not exist yet (BiomedCLIP's needs the
            ``transformers`` package); None: a missing file is an error.
        text_model_name: open_clip config of a checkpoint-file ``text_model``.
        prompt_templates: the prompt templates of the label prompts (``{label}``: the clinical description,
            ``{name}``: the label name; see :func:`~monai_vce.labels.check_templates`); None: the built-in
            :data:`~monai_vce.labels.PROMPT_TEMPLATES`. Used when the embeddings are computed here; a file whose
            recorded prompts are other ones is refused (a ValueError with the command that rebuilds it).
        contrastive: enable the contrastive path when text embeddings are available.
        max_logit_scale: upper clamp of the contrastive path's scale ``exp(tau)`` (the paper's 100).
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
        defer_pretrained: build the architecture only (random weights; no hub, no file read) and load the
            pretrained weights and the text embeddings in :meth:`load_pretrained`. The bundle's training config
            sets it, so that parsing it needs neither the hub nor data.
    """

    __jit_unused_properties__ = ["num_layers"]  # noqa: RUF012  (TorchScript reads it as a plain class attribute)

    def __init__(
        self,
        backbone: str = BIOMEDCLIP_HUB_ID,
        model_name: str | None = None,
        pretrained: bool | str = True,
        attention: str = "diff",
        attention_variant: str | None = None,
        lambda_init_schedule: LambdaInit | None = None,
        diff_blocks: Sequence[int] | None = None,
        subln: bool | None = None,
        attn_impl: str = "auto",
        num_classes: int = NUM_LABELS,
        dropout: float = 0.1,
        se_reduction: int = 4,
        head_batch_norm: bool = False,
        text_embeddings: str | os.PathLike | torch.Tensor | None = None,
        text_model: str | None = None,
        text_model_name: str | None = None,
        prompt_templates: Sequence[str] | None = None,
        contrastive: bool = True,
        max_logit_scale: float = 100.0,
        fusion: str = "classification",
        freeze_backbone: bool = False,
        freeze_blocks: int = 0,
        image_size: int | None = None,
        normalize: bool = True,
        drop_path: float | None = None,
        logit_scale_init: float | None = None,
        defer_pretrained: bool = False,
    ) -> None:
        super().__init__()
        if attention not in ("diff", "plain"):
            raise ValueError(f"attention must be 'diff' or 'plain', got {attention!r}")
        variant = resolve_variant(attention_variant)
        if fusion not in FUSION_MODES:
            raise ValueError(f"fusion must be one of {FUSION_MODES}, got {fusion!r}")
        #: the prompt templates of the contrastive path's text embeddings
        self.prompt_templates = check_templates(prompt_templates)
        # deferred: the architecture now (random weights, offline: BiomedCLIP's config ships with the package), the
        # weights and the text embeddings in load_pretrained(), when a workflow runs
        self._deferred: dict[str, Any] | None = None
        if defer_pretrained:
            self._deferred = {
                "tower": {
                    "backbone": backbone,
                    "model_name": model_name,
                    "pretrained": pretrained,
                    "image_size": image_size,
                    "drop_path": drop_path,
                },
                "text": (text_embeddings, text_model, text_model_name),
                "logit_scale_init": logit_scale_init,
            }
        tower = build_image_tower(
            backbone,
            model_name=model_name,
            pretrained=False if defer_pretrained else pretrained,
            image_size=image_size,
            drop_path=drop_path,
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
                variant=variant,
                blocks=diff_blocks,
                lambda_init=lambda_init_schedule,
                sub_norm=subln,
                attn_impl=attn_impl,
            )
        self.attention_variant = variant if attention == "diff" else None

        self.classifier_head = SEGatedClassifierHead(
            self.embed_dim, self.num_classes, reduction=se_reduction, dropout=dropout, batch_norm=head_batch_norm
        )
        self.contrastive_head: TextContrastiveHead | None = None
        #: why the contrastive path is off (one line with the command that computes the embeddings); None when on
        self.contrastive_off_reason: str | None = (
            None if contrastive else "the network was built with contrastive=False"
        )
        self._text_model_default = str(backbone)
        if contrastive and defer_pretrained and text_embeddings is not None:
            # placeholder embeddings until load_pretrained() reads or computes them
            self.contrastive_head = TextContrastiveHead(
                torch.zeros(self.num_classes, self.embed_dim),
                DEFAULT_LOGIT_SCALE if logit_scale_init is None else logit_scale_init,
                max_logit_scale=max_logit_scale,
            )
        elif contrastive:
            embeddings = self._text_embeddings(text_embeddings, text_model, text_model_name)
            if embeddings is not None:
                scale = logit_scale_init if logit_scale_init is not None else tower.logit_scale
                self.contrastive_head = TextContrastiveHead(
                    embeddings, DEFAULT_LOGIT_SCALE if scale is None else scale, max_logit_scale=max_logit_scale
                )
        self.register_load_state_dict_pre_hook(_drop_unused_contrastive_state)

        if freeze_backbone or freeze_blocks:
            self._freeze(all_blocks=freeze_backbone, num_blocks=int(freeze_blocks))
        logger.info(
            "DiffAttnCLIPClassifier: backbone %s (pretrained=%s%s), attention=%s, variant=%s, converted blocks %s, "
            "contrastive path %s",
            backbone,
            pretrained,
            ", loaded by load_pretrained()" if defer_pretrained else "",
            attention,
            self.attention_variant,
            self.diff_blocks,
            "on" if self.contrastive_head is not None else "off",
        )

    def load_state_dict(self, state_dict: Mapping[str, Any], strict: bool = True, assign: bool = False) -> Any:
        """``nn.Module.load_state_dict``; a strict load of a state dict holding some of the network's own tensors
        (what MONAI's ``copy_model_state``, and so ``monai.bundle.load``, keeps for every checkpoint tensor of another
        name or shape) fails with the counts instead of leaving a network part checkpoint, part initial values.

        Raises:
            ValueError: ``strict`` and some tensors of ``state_dict`` are this network's own.
        """
        if strict:
            own = {k: v.data_ptr() for k, v in self.state_dict().items() if v.numel() > 0}
            kept = [
                k
                for k, v in state_dict.items()
                if isinstance(v, torch.Tensor) and v.numel() > 0 and own.get(k) == v.data_ptr()
            ]
            if kept and len(kept) < len(own):
                raise ValueError(
                    f"only {len(state_dict) - len(kept)} of {len(state_dict)} tensors of the state dict come from the "
                    f"checkpoint ({kept[0]!r} and {len(kept) - 1} more kept their initial values): the checkpoint "
                    "belongs to another network configuration (the demo's weights: network_def's backbone "
                    "'vce-tiny-vit-64', image_size 64); for an intended partial load, load_state_dict(..., strict=False)"
                )
        return super().load_state_dict(state_dict, strict=strict, assign=assign)

    @torch.jit.unused
    def load_pretrained(self) -> bool:
        """Load what ``defer_pretrained=True`` left out: the backbone's pretrained weights and the text embeddings.

        The bundle's training workflow calls it (through :func:`monai_vce.networks.load_pretrained`) when it runs, so
        that parsing the config and MONAI's ``check_properties`` need no hub and no weights file. The network's
        parameters stay the same objects (an optimizer built before keeps working); the architecture and the
        random initialisation of the new parameters are those of a network built with ``defer_pretrained=False``.
        Calling it again, or on a network built without deferring, does nothing.

        Returns:
            Whether anything was loaded.

        Raises:
            RuntimeError: the backbone's weights cannot be had (the message lists the offline alternatives).
            ValueError: the weights do not match the image tower.
        """
        deferred = self._deferred
        if deferred is None:
            return False
        spec = deferred["tower"]
        head = self.contrastive_head
        if spec["pretrained"] is not False:
            check_backbone(spec["backbone"], spec["pretrained"])  # the bundle's message when the hub is unreachable
            with torch.random.fork_rng(devices=[]):  # the second tower's random init must not shift the seed
                tower = build_image_tower(**spec)
            new = {name[len("visual.") :] for name in self._new_parameter_names()}
            missing, unexpected = self.visual.load_state_dict(tower.visual.state_dict(), strict=False)
            if unexpected or set(missing) - new:
                raise ValueError(
                    f"the weights of {spec['backbone']!r} do not match the image tower: unexpected keys "
                    f"{sorted(unexpected)[:8]}, missing keys {sorted(set(missing) - new)[:8]}"
                )
            if head is not None and deferred["logit_scale_init"] is None and tower.logit_scale is not None:
                with torch.no_grad():
                    head.logit_scale.fill_(float(tower.logit_scale))
            logger.info("pretrained weights of %s loaded into the image tower", spec["backbone"])
        if head is not None:
            embeddings = self._text_embeddings(*deferred["text"])
            if embeddings is None:
                self.contrastive_head = None
            else:
                head.text_embeddings.copy_(torch.nn.functional.normalize(embeddings.detach().float(), dim=-1))
        self._deferred = None
        return True

    def _text_embeddings(
        self,
        text_embeddings: str | os.PathLike | torch.Tensor | None,
        text_model: str | None,
        text_model_name: str | None,
    ) -> torch.Tensor | None:
        """The label-prompt embeddings of the contrastive path, or None (with the one warning) when unavailable."""
        out = (
            "bundle/models/text_embeddings.pt"
            if not isinstance(text_embeddings, (str, os.PathLike))
            else text_embeddings
        )
        hint = (
            f"{text_embeddings_hint(out, text_model or self._text_model_default, self.prompt_templates)} (`python -m "
            "monai_vce.text_embeddings` is the same command), and pass text_embeddings=<file>"
        )
        if text_embeddings is None:
            self.contrastive_off_reason = f"no text_embeddings file given; {hint}"
            warnings.warn(
                "DiffAttnCLIPClassifier: no text_embeddings file given, so the contrastive path is off (only the "
                f"classification path is trained); {hint}.",
                stacklevel=3,
            )
            return None
        if isinstance(text_embeddings, torch.Tensor) or text_model is None or Path(text_embeddings).is_file():
            return self._load_text_embeddings(text_embeddings)
        try:
            computed = self._compute_text_embeddings(text_model, text_model_name)
        except (ImportError, OSError, RuntimeError, ValueError) as err:
            first = str(err).strip().splitlines()[0] if str(err).strip() else ""
            self.contrastive_off_reason = (
                f"no text embeddings at {text_embeddings}, and the text tower of {text_model!r} cannot compute them "
                f"({type(err).__name__}: {first}); {hint}"
            )
            warnings.warn(
                f"DiffAttnCLIPClassifier: the contrastive path is off (only the classification path is trained): "
                f"no text embeddings at {text_embeddings}, and the text tower of {text_model!r} cannot compute them "
                f"({type(err).__name__}: {err}); {hint}.",
                stacklevel=3,
            )
            return None

        save_text_embeddings(computed, text_embeddings)
        logger.info("text embeddings of the label prompts computed with %s, saved to %s", text_model, text_embeddings)
        return self._load_text_embeddings(text_embeddings)

    def _compute_text_embeddings(self, text_model: str, text_model_name: str | None) -> dict[str, Any]:
        """Embed the label prompts with ``text_model``'s text tower; refuse a width other than the image tower's."""

        if self.num_classes != NUM_LABELS:
            raise ValueError(f"the label prompts describe {NUM_LABELS} labels, the network has {self.num_classes}")
        computed = compute_text_embeddings(
            text_model, model_name=text_model_name, prompts=all_prompts(self.prompt_templates)
        )
        width = int(computed["embeddings"].shape[1])
        if width != self.embed_dim:
            raise ValueError(f"its embeddings are {width} wide, the image features {self.embed_dim}")
        return computed

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
            text_embeddings,
            labels=labels,
            num_classes=self.num_classes,
            embed_dim=self.embed_dim,
            templates=self.prompt_templates if labels is not None else None,
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
        """Image features (B, embed_dim) of RGB frames (B, 3, H, W): ``uint8`` in [0, 255] or float in [0, 1]."""
        if not x.is_floating_point():
            x = x.float() / 255.0
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
