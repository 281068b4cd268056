"""Events and their files (floor 1): frame units, runs and the gap rule, composition, ground truth, event JSON,
its units sidecar, per-video probability files. Imports numpy only.
"""

from __future__ import annotations

from .composition import (
    COMPOSITIONS,
    RANKINGS,
    compose_runs,
    confidence_order,
    event_json,
    events_to_frames,
    frames_to_events,
    label_codes,
    run_confidence,
    runs_to_events,
)
from .ground_truth import ground_truth_events, with_ground_truth
from .metadata import (
    EVENTS_META_SUFFIX,
    convert_events,
    describe_events_file,
    events_meta_path,
    read_events_meta,
    read_frame_units,
    write_events_meta,
)
from .probabilities import (
    PROBS_SUFFIX,
    Video,
    completed_videos,
    load_video_probs,
    model_fingerprint,
    npz_frame_count,
    npz_record,
    pending_frames,
    probability_file,
    probability_files,
    save_video_probs,
    video_file_name,
    videos_units,
)
from .runs import run_bounds, run_spans, value_runs
from .units import FrameUnits, as_frame_units
from .validation import (
    DEFAULT_MAX_BYTES,
    DEFAULT_MAX_EVENTS,
    EVENT_KEYS,
    check_events,
    load_events,
    save_events,
    to_challenge_format,
    validate_events,
)

__all__ = [
    # frame units
    "FrameUnits",
    "as_frame_units",
    # runs and the gap rule
    "run_bounds",
    "value_runs",
    "run_spans",
    # composition
    "COMPOSITIONS",
    "RANKINGS",
    "label_codes",
    "compose_runs",
    "run_confidence",
    "confidence_order",
    "runs_to_events",
    "frames_to_events",
    "events_to_frames",
    "event_json",
    # ground truth
    "ground_truth_events",
    "with_ground_truth",
    # event JSON
    "DEFAULT_MAX_BYTES",
    "DEFAULT_MAX_EVENTS",
    "EVENT_KEYS",
    "validate_events",
    "check_events",
    "load_events",
    "save_events",
    "to_challenge_format",
    # frame units of event files
    "EVENTS_META_SUFFIX",
    "events_meta_path",
    "write_events_meta",
    "read_events_meta",
    "read_frame_units",
    "describe_events_file",
    "convert_events",
    # probability files
    "PROBS_SUFFIX",
    "Video",
    "videos_units",
    "video_file_name",
    "probability_file",
    "probability_files",
    "save_video_probs",
    "load_video_probs",
    "npz_frame_count",
    "npz_record",
    "model_fingerprint",
    "completed_videos",
    "pending_frames",
]
