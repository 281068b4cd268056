"""Engines: the training iteration (mixup, dual-path loss, AMP) on MONAI's ``SupervisedTrainer``, the learning-rate
schedules and the frame inferer.
"""

from __future__ import annotations

from .inferer import FrameInferer
from .schedulers import ResumableOneCycleLR
from .trainer import MultiLabelMixUp, VCETrainer, forward_paths
from .tta import TTA_VIEWS, FrameTTAInferer, tta_view

__all__ = ["FrameInferer", "MultiLabelMixUp", "ResumableOneCycleLR", "VCETrainer", "forward_paths"]
__all__ += ["TTA_VIEWS", "FrameTTAInferer", "tta_view"]
