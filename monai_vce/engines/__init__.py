"""Training engines: the monai-vce training iteration (mixup, dual-path loss, AMP) on MONAI's SupervisedTrainer,
and the learning-rate schedule of the training recipes."""

from __future__ import annotations

from .schedulers import ResumableOneCycleLR
from .trainer import MultiLabelMixUp, VCETrainer, forward_paths

__all__ = ["MultiLabelMixUp", "ResumableOneCycleLR", "VCETrainer", "forward_paths"]
