"""Engines: the training iteration (mixup, dual-path loss, AMP) on MONAI's ``SupervisedTrainer``, the learning-rate
schedules, the frame inferer and self-training test-time adaptation.
"""

from __future__ import annotations

from .inferer import FrameInferer
from .schedulers import ResumableOneCycleLR
from .self_training import PARAMETER_SUBSETS, SelfTraining, self_train, strong_view, trainable_parameters
from .trainer import MultiLabelMixUp, VCETrainer, forward_paths
from .tta import TTA_VIEWS, FrameTTAInferer, tta_view

__all__ = ["FrameInferer", "MultiLabelMixUp", "ResumableOneCycleLR", "VCETrainer", "forward_paths"]
__all__ += ["TTA_VIEWS", "FrameTTAInferer", "tta_view"]
__all__ += ["PARAMETER_SUBSETS", "SelfTraining", "self_train", "strong_view", "trainable_parameters"]
