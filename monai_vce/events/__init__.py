"""Events and their files: the floor every other package builds on.

- :mod:`~monai_vce.events.composition`: per-frame label activity <-> events of the challenge's event JSON;
- :mod:`~monai_vce.events.validation`: validation, reading and writing of event JSON files;
- :mod:`~monai_vce.events.probabilities`: the per-video probability files ``<video_id>.npz``.

Importing this package loads numpy only (no torch, MONAI or ignite).
"""

from __future__ import annotations

from .composition import COMPOSITIONS, event_json, events_to_frames, frames_to_events
from .probabilities import VideoArrays, load_video_probs, npz_frame_count, npz_record, save_video_probs
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
    "COMPOSITIONS",
    "frames_to_events",
    "events_to_frames",
    "event_json",
    "DEFAULT_MAX_BYTES",
    "DEFAULT_MAX_EVENTS",
    "EVENT_KEYS",
    "validate_events",
    "check_events",
    "load_events",
    "save_events",
    "to_challenge_format",
    "VideoArrays",
    "save_video_probs",
    "load_video_probs",
    "npz_frame_count",
    "npz_record",
]
