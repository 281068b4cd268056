"""Training engines: the monai-vce training iteration (mixup, dual-path loss, AMP) on MONAI's SupervisedTrainer."""

from __future__ import annotations

from .trainer import MultiLabelMixUp, VCETrainer, forward_paths

__all__ = ["MultiLabelMixUp", "VCETrainer", "forward_paths"]
