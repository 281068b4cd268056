"""Loss functions for multi-label frame classification under extreme class imbalance."""

from __future__ import annotations

from .asymmetric_focal import BinaryCrossEntropyLoss, VCEAsymmetricFocalLoss
from .weights import class_positive_weights

__all__ = ["VCEAsymmetricFocalLoss", "BinaryCrossEntropyLoss", "class_positive_weights"]
