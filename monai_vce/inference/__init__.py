"""Reduced inference: fewer frames of a video through the network (stride, coarse-to-fine, near-duplicate
skipping), the others interpolated before decoding. The numpy parts import without torch.
"""

from __future__ import annotations

from .adaptive import adaptive_inference, resolve_budget, strided_rows
from .duplicates import duplicate_anchors, signature_distance
from .interpolation import interpolate_probs, knot_brackets
from .refinement import DecoderTarget, dilate_frames

__all__ = [
    "adaptive_inference",
    "resolve_budget",
    "strided_rows",
    "DecoderTarget",
    "dilate_frames",
    "interpolate_probs",
    "knot_brackets",
    "signature_distance",
    "duplicate_anchors",
    "SIGNATURE_KEY",
    "FrameSignatured",
    "frame_signature",
    "FramePredictor",
    "ReducedInference",
    "is_reduced",
    "check_reduction",
    "reduction_tag",
    "reduced_source",
    "resume_sources",
]

_LAZY = {
    "SIGNATURE_KEY": "signature",
    "FrameSignatured": "signature",
    "frame_signature": "signature",
    "FramePredictor": "driver",
    "ReducedInference": "driver",
    "is_reduced": "driver",
    "check_reduction": "driver",
    "reduction_tag": "driver",
    "reduced_source": "driver",
    "resume_sources": "driver",
}


def __getattr__(name: str):
    if name in _LAZY:
        from importlib import import_module

        return getattr(import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
