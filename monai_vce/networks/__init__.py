"""Networks: BiomedCLIP's image tower with differential attention, classifier heads, backbone loading, label-prompt
text embeddings. Importing registers the tiny test model with timm and open_clip, in memory.
"""

from __future__ import annotations

from .adabn import adapt_batchnorm, batchnorm_layers, batchnorm_state, exam_batchnorm, restore_batchnorm
from .backbone import (
    BIOMEDCLIP_HUB_ID,
    BIOMEDCLIP_MODEL_NAME,
    TINY_MODEL_NAME,
    BackboneSource,
    BackboneUnavailableError,
    ImageTower,
    build_image_tower,
    create_tiny_open_clip,
    load_visual_weights,
    resolve_backbone,
    save_tiny_checkpoint,
    save_tiny_local_dir,
)
from .classifier import FUSION_MODES, DiffAttnCLIPClassifier
from .diff_attention import (
    ATTENTION_VARIANTS,
    DifferentialAttention,
    convert_to_diff_attention,
    lambda_init_for_depth,
    resolve_lambda_init,
)
from .heads import SEGatedClassifierHead, TextContrastiveHead
from .network_utils import load_pretrained, param_groups, unwrap_network
from .text_embeddings import compute_text_embeddings, load_text_embeddings, save_text_embeddings

__all__ = [
    "adapt_batchnorm",
    "exam_batchnorm",
    "batchnorm_layers",
    "batchnorm_state",
    "restore_batchnorm",
    "BIOMEDCLIP_HUB_ID",
    "BIOMEDCLIP_MODEL_NAME",
    "TINY_MODEL_NAME",
    "BackboneSource",
    "BackboneUnavailableError",
    "ImageTower",
    "build_image_tower",
    "create_tiny_open_clip",
    "load_visual_weights",
    "resolve_backbone",
    "save_tiny_checkpoint",
    "save_tiny_local_dir",
    "FUSION_MODES",
    "DiffAttnCLIPClassifier",
    "ATTENTION_VARIANTS",
    "DifferentialAttention",
    "convert_to_diff_attention",
    "lambda_init_for_depth",
    "resolve_lambda_init",
    "SEGatedClassifierHead",
    "TextContrastiveHead",
    "compute_text_embeddings",
    "load_text_embeddings",
    "save_text_embeddings",
    "param_groups",
    "load_pretrained",
    "unwrap_network",
]
