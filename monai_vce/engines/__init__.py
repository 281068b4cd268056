"""Training engines: the monai-vce training iteration (mixup, dual-path loss, AMP) on MONAI's SupervisedTrainer,
and the learning-rate schedule of the training recipes, and the frame inferer of validation and inference."""

from __future__ import annotations

from .inferer import FrameInferer
from .schedulers import ResumableOneCycleLR
from .trainer import MultiLabelMixUp, VCETrainer, forward_paths

__all__ = ["FrameInferer", "MultiLabelMixUp", "ResumableOneCycleLR", "VCETrainer", "forward_paths"]
