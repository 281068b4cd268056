"""Frame units: which frame id of a datalist item events count in, ``frame_index`` (the label CSV's ``index``) or
``frame_number`` (the image file's number).
"""

from __future__ import annotations

from enum import Enum

__all__ = ["MAX_FRAME_ID", "FrameUnits", "as_frame_units"]

#: Largest frame id accepted anywhere (label CSVs, frame file names, datalists, event files): 2**31 - 1, far beyond
#: any exam (Galar's longest has about 130,000 frames) and exact in every integer and float type the package
#: computes with, so that no frame id overflows or loses precision on its way through.
MAX_FRAME_ID: int = 2**31 - 1


class FrameUnits(str, Enum):
    """The units of frame ids in events, decoder parameters and reports; the values are datalist keys."""

    FRAME_INDEX = "frame_index"
    FRAME_NUMBER = "frame_number"

    def __str__(self) -> str:
        return self.value


def as_frame_units(value: FrameUnits | str, name: str = "frame_units") -> FrameUnits:
    """Return ``value`` as a :class:`FrameUnits`.

    Args:
        value: a :class:`FrameUnits` or its value (``"frame_index"``, ``"frame_number"``).
        name: the argument or key named in messages.

    Raises:
        ValueError: an unknown value (the message names ``name`` and the accepted values).
    """
    if isinstance(value, FrameUnits):
        return value
    try:
        return FrameUnits(value)
    except ValueError:
        raise ValueError(f"{name} must be one of {[u.value for u in FrameUnits]}, got {value!r}") from None
