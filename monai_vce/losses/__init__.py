"""Loss functions for multi-label frame classification under extreme class imbalance."""

from __future__ import annotations

from .asymmetric_focal import AsymmetricFocalLoss

__all__ = ["AsymmetricFocalLoss"]
