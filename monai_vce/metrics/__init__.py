"""Temporal mAP of event JSON files exactly as the RARE-VISION challenge scores them, lesion-level FROC and reading
workload, and frame-level AP (numpy only). Command line: ``python -m monai_vce metrics --gt GT.json --events
EVENTS.json [--lesions]``.
"""

from __future__ import annotations

from monai_vce.events.validation import (
    DEFAULT_MAX_BYTES,
    DEFAULT_MAX_EVENTS,
    check_events,
    load_events,
    save_events,
    to_challenge_format,
    validate_events,
)

from .calibration import expected_calibration_error
from .frame_average_precision import multilabel_average_precision
from .groups import metrics_by_group
from .lesions import FALSE_ALARM_RATES, LESION_CRITERIA, label_runs, lesion_froc
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
    "lesion_froc",
    "metrics_by_group",
    "label_runs",
    "FALSE_ALARM_RATES",
    "LESION_CRITERIA",
    "multilabel_average_precision",
    "expected_calibration_error",
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
]
