"""Temporal mAP of event JSON files exactly as the RARE-VISION challenge scores them, and the event-file validator.

``python -m monai_vce.metrics --gt GT.json --pred PRED.json`` scores a prediction file from the command line.
The package is pure numpy: the ignite metric that reports the temporal mAP during training is
:class:`monai_vce.handlers.TemporalMAPMetric` (``monai_vce.metrics.TemporalMAPMetric`` still resolves to it, with
a ``DeprecationWarning``). Event JSON validation and I/O live in :mod:`monai_vce.events` and are re-exported here.
"""

from __future__ import annotations

import warnings
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

from .frame_average_precision import multilabel_average_precision
from .temporal_map import (
    average_precision,
    segment_tiou,
    temporal_map,
    temporal_map_reference,
    tiou_key,
    video_average_precision,
)

__all__ = [
    "temporal_map",
    "temporal_map_reference",
    "multilabel_average_precision",
    "video_average_precision",
    "average_precision",
    "segment_tiou",
    "tiou_key",
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
    if name == "threshold_key":  # deprecated name of tiou_key
        warnings.warn(
            "monai_vce.metrics.threshold_key is deprecated and will be removed in the next release; use tiou_key",
            DeprecationWarning,
            stacklevel=2,
        )
        return tiou_key
    if name == "TemporalMAPMetric":
        # deprecated alias of the metric's new home, a handler, on a floor above this package: imported on use
        # only, so that metrics stays free of torch and ignite; removed in the next release
        from monai_vce.handlers.temporal_map_metric import TemporalMAPMetric

        warnings.warn(
            "monai_vce.metrics.TemporalMAPMetric moved to monai_vce.handlers.TemporalMAPMetric; the old name is "
            "removed in the next release",
            DeprecationWarning,
            stacklevel=2,
        )
        return TemporalMAPMetric
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
