"""monai-vce: rare-pathology and anatomy event detection in video capsule endoscopy, as a MONAI plugin.

Importing the package is cheap: it loads no torch, MONAI or open_clip module and touches no network.
Import the sub-packages (``monai_vce.networks``, ``monai_vce.data``, ...) for the components.
"""

from __future__ import annotations

from .labels import ANATOMY, LABELS, NUM_LABELS, PATHOLOGY, SECTIONS

__version__ = "0.1.0"

__all__ = ["__version__", "LABELS", "NUM_LABELS", "ANATOMY", "PATHOLOGY", "SECTIONS"]
