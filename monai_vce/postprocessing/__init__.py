"""Temporal decoding: per-frame probabilities -> events of the RARE-VISION event JSON (the chain, anatomy
decoding, presence gating, the decoder, its parameters and tuning, F1 thresholds).
"""

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
    ANATOMY_PARAMS,
    DEFAULT_ANATOMY_GRID,
    LEAD_IN,
    decode_sections,
    landmark_windows,
    section_gate,
    section_log_emissions,
    transition_scores,
    viterbi_sections,
)
from .calibration import CALIBRATION_METHODS, ProbabilityCalibration, load_calibration
from .chain import (
    CHAIN_STEPS,
    PAPER_ORDER,
    PAPER_PARAMS,
    apply_chain,
    fill_gaps,
    median_mask,
    median_probs,
    remove_short_runs,
    run_chain,
    threshold_mask,
)
from .decoder import EventDecoder, decode_videos, event_confidence, event_scores, load_decoder
from .gating import (
    apply_presence_rules,
    column_presence,
    cross_validate_presence,
    fit_presence_rule,
    presence_features,
    video_folds,
)
from .params import WINDOW_SECONDS_PARAMS, DecoderParams, decoder_params_schema
from .recalibration import (
    DEFAULT_LEVELS,
    ReferenceQuantiles,
    load_reference_quantiles,
    quantile_match,
    recalibrate_decoder,
    recalibrate_thresholds,
)
from .screening import SCREENING_THRESHOLDS, load_screening_decoder, screening_operating_point, tune_screening
from .simulate import NOISE_FAMILIES, NOISE_LEVELS, noise_settings, simulate_probabilities
from .steps import MAX_FRAMES, ChainStep, Param
from .thresholds import f1_at_thresholds, grid_thresholds, load_thresholds, optimize_thresholds, save_thresholds
from .tuning import DEFAULT_GRIDS, tune_decoder

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
    # decoding steps and their parameters
    "Param",
    "ChainStep",
    "MAX_FRAMES",
    "CHAIN_STEPS",
    "ANATOMY_PARAMS",
    # decoding
    "PAPER_ORDER",
    "PAPER_PARAMS",
    "run_chain",
    "apply_chain",
    "threshold_mask",
    "median_probs",
    "median_mask",
    "fill_gaps",
    "remove_short_runs",
    "presence_features",
    "column_presence",
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
    "decoder_params_schema",
    "EventDecoder",
    "event_confidence",
    "event_scores",
    "decode_videos",
    "load_decoder",
    "DEFAULT_ANATOMY_GRID",
    "DEFAULT_GRIDS",
    "tune_decoder",
    "tune_screening",
    "CALIBRATION_METHODS",
    "ProbabilityCalibration",
    "load_calibration",
    "WINDOW_SECONDS_PARAMS",
    "screening_operating_point",
    "load_screening_decoder",
    "SCREENING_THRESHOLDS",
    "optimize_thresholds",
    "grid_thresholds",
    "f1_at_thresholds",
    "save_thresholds",
    "load_thresholds",
    "NOISE_FAMILIES",
    "NOISE_LEVELS",
    "DEFAULT_LEVELS",
    "ReferenceQuantiles",
    "load_reference_quantiles",
    "recalibrate_thresholds",
    "recalibrate_decoder",
    "quantile_match",
    "noise_settings",
    "simulate_probabilities",
]
