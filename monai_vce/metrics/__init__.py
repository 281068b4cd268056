"""Temporal mAP of event JSON files exactly as the RARE-VISION challenge scores them, and the event-file validator.

``python -m monai_vce.metrics --gt GT.json --pred PRED.json`` scores a prediction file from the command line.
The package is pure numpy: the ignite metric that reports the temporal mAP during training is
:class:`monai_vce.handlers.TemporalMAPMetric` (``monai_vce.metrics.TemporalMAPMetric`` still resolves to it, with
a ``DeprecationWarning``). Event JSON validation and I/O live in :mod:`monai_vce.events` and are re-exported here.
"""

from __future__ import annotations

from typing import Any

from monai_vce.events.validation import (
    DEFAULT_MAX_BYTES,
    DEFAULT_MAX_EVENTS,
    check_events,
    load_events,
    save_events,
    to_challenge_format,
    validate_events,
)

from .temporal_map import (
    average_precision,
    segment_tiou,
    temporal_map,
    temporal_map_reference,
    threshold_key,
    video_average_precision,
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
        # deprecated alias of the metric's new home (a handler, above this package); removed in the next release
        import warnings

        from monai_vce.handlers.temporal_map_metric import TemporalMAPMetric

        warnings.warn(
            "monai_vce.metrics.TemporalMAPMetric moved to monai_vce.handlers.TemporalMAPMetric; the old name is "
            "removed in the next release",
            DeprecationWarning,
            stacklevel=2,
        )
        return TemporalMAPMetric
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
