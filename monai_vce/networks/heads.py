"""Classifier heads on CLIP image features: a squeeze-and-excitation gated linear head and a text-contrastive head."""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from monai.networks.blocks import ChannelSELayer

from monai_vce.labels import NUM_LABELS

__all__ = ["SEGatedClassifierHead", "TextContrastiveHead", "DEFAULT_LOGIT_SCALE"]

#: CLIP's initial log logit scale, log(1 / 0.07).
DEFAULT_LOGIT_SCALE: float = math.log(1 / 0.07)


class SEGatedClassifierHead(nn.Module):
    """Image features -> squeeze-and-excitation channel gate -> dropout -> linear -> class logits.

    The gate (MONAI's :class:`~monai.networks.blocks.ChannelSELayer` on the feature vector seen as a length-1
    sequence) rescales each feature channel by a sigmoid computed from all channels, so the head can emphasise the
    CLIP feature channels that matter for capsule-endoscopy findings before the linear classifier.

    Args:
        in_features: width of the image features.
        num_classes: number of output logits.
        reduction: reduction ratio of the gate's bottleneck (``in_features // reduction`` hidden units).
        dropout: dropout probability before the linear layer.
    """

    def __init__(
        self, in_features: int, num_classes: int = NUM_LABELS, reduction: int = 4, dropout: float = 0.0
    ) -> None:
        super().__init__()
        self.gate = ChannelSELayer(spatial_dims=1, in_channels=in_features, r=reduction)
        self.dropout = nn.Dropout(dropout)
        self.fc = nn.Linear(in_features, num_classes)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        """Map (B, in_features) features to (B, num_classes) logits."""
        gated = self.gate(features.unsqueeze(-1)).squeeze(-1)
        return self.fc(self.dropout(gated))


class TextContrastiveHead(nn.Module):
    """CLIP-style logits: cosine similarity of image features with frozen class text embeddings, times a learned scale.

    Args:
        text_embeddings: (num_classes, embed_dim) embeddings of the class prompts; normalised and stored as a frozen,
            non-persistent buffer (the file they come from is part of the configuration, not of the weights).
        logit_scale_init: initial log scale (CLIP's ``logit_scale``), e.g. the checkpoint's.
        max_logit_scale: upper clamp of the scale (not its log), as in CLIP training.
    """

    def __init__(
        self,
        text_embeddings: torch.Tensor,
        logit_scale_init: float = DEFAULT_LOGIT_SCALE,
        max_logit_scale: float = 100.0,
    ) -> None:
        super().__init__()
        if text_embeddings.ndim != 2:
            raise ValueError(
                f"text_embeddings must be (num_classes, embed_dim), got shape {tuple(text_embeddings.shape)}"
            )
        self.register_buffer("text_embeddings", F.normalize(text_embeddings.detach().float(), dim=-1), persistent=False)
        self.logit_scale = nn.Parameter(torch.tensor(float(logit_scale_init)))
        self.max_logit_scale = float(max_logit_scale)

    @property
    def num_classes(self) -> int:
        return int(self.text_embeddings.shape[0])

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        """Map (B, embed_dim) image features to (B, num_classes) float32 logits."""
        image = F.normalize(features.float(), dim=-1)
        scale = self.logit_scale.exp().clamp(max=self.max_logit_scale)
        return scale * (image @ self.text_embeddings.t())
