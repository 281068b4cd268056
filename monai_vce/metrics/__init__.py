"""Temporal mAP of event JSON files exactly as the RARE-VISION challenge scores them, and the event-file validator.

``python -m monai_vce.metrics --gt GT.json --pred PRED.json`` scores a prediction file from the command line.
:class:`TemporalMAPMetric` (an ignite metric for validation during training) is imported on first use, so
that importing this package loads neither torch nor ignite.
"""

from __future__ import annotations

from typing import Any

from .temporal_map import (
    average_precision,
    segment_tiou,
    temporal_map,
    temporal_map_reference,
    threshold_key,
    video_average_precision,
)
from .validation import (
    DEFAULT_MAX_BYTES,
    DEFAULT_MAX_EVENTS,
    check_events,
    load_events,
    save_events,
    to_challenge_format,
    validate_events,
)

__all__ = [
    "temporal_map",
    "temporal_map_reference",
    "video_average_precision",
    "average_precision",
    "segment_tiou",
    "threshold_key",
    "validate_events",
    "check_events",
    "load_events",
    "save_events",
    "to_challenge_format",
    "DEFAULT_MAX_BYTES",
    "DEFAULT_MAX_EVENTS",
    "TemporalMAPMetric",
]


def __getattr__(name: str) -> Any:
    if name == "TemporalMAPMetric":
        from .ignite import TemporalMAPMetric

        return TemporalMAPMetric
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
