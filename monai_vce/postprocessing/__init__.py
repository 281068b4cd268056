"""Temporal decoding: per-frame probabilities -> events of the RARE-VISION event JSON."""

from __future__ import annotations

# event composition and event JSON I/O (their home is monai_vce.events; re-exported for existing code)
from monai_vce.events import (
    COMPOSITIONS,
    check_events,
    event_json,
    events_to_frames,
    frames_to_events,
    load_events,
    save_events,
    to_challenge_format,
    validate_events,
)

# decoding: the paper's chain, presence gating, anatomy decoding, the decoder and its tuning
from .anatomy import (
    LEAD_IN,
    decode_sections,
    landmark_windows,
    section_gate,
    section_log_emissions,
    transition_scores,
    viterbi_sections,
)
from .chain import (
    PAPER_ORDER,
    PAPER_PARAMS,
    apply_chain,
    fill_gaps,
    median_mask,
    median_probs,
    remove_short_runs,
    threshold_mask,
)
from .decoder import DecoderParams, EventDecoder, decode_videos, event_confidence
from .gating import apply_presence_rules, cross_validate_presence, fit_presence_rule, presence_features, video_folds
from .simulate import NOISE_LEVELS, simulate_probabilities
from .thresholds import f1_at_thresholds, load_thresholds, optimize_thresholds, save_thresholds
from .tuning import DEFAULT_ANATOMY_GRID, tune_decoder

__all__ = [
    # event composition and event JSON I/O
    "COMPOSITIONS",
    "frames_to_events",
    "events_to_frames",
    "event_json",
    "to_challenge_format",
    "load_events",
    "save_events",
    "validate_events",
    "check_events",
    # decoding
    "PAPER_ORDER",
    "PAPER_PARAMS",
    "apply_chain",
    "threshold_mask",
    "median_probs",
    "median_mask",
    "fill_gaps",
    "remove_short_runs",
    "presence_features",
    "apply_presence_rules",
    "fit_presence_rule",
    "cross_validate_presence",
    "video_folds",
    "LEAD_IN",
    "decode_sections",
    "section_log_emissions",
    "transition_scores",
    "viterbi_sections",
    "landmark_windows",
    "section_gate",
    "DecoderParams",
    "EventDecoder",
    "event_confidence",
    "decode_videos",
    "DEFAULT_ANATOMY_GRID",
    "tune_decoder",
    "optimize_thresholds",
    "f1_at_thresholds",
    "save_thresholds",
    "load_thresholds",
    "NOISE_LEVELS",
    "simulate_probabilities",
]
