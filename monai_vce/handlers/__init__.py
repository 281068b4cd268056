"""Ignite handlers and metrics of the bundle: checkpoints, EMA, progress, event writing, thresholds, decoder tuning."""

from __future__ import annotations

from .checkpoint import AtomicCheckpointSaver, AtomicDiskSaver, BestMetricState, VCECheckpointLoader
from .decoder_tuning import DecoderTuningHandler
from .ema import EMAWeights
from .event_writer import TemporalEventWriter, VideoFrameCollector, load_video_probs
from .frame_metrics import MultiLabelAveragePrecision
from .progress import FrameProgressHandler
from .temporal_map_metric import TemporalMAPMetric, threshold_decoder
from .thresholds import ThresholdOptimizationHandler

__all__ = [
    "AtomicCheckpointSaver",
    "AtomicDiskSaver",
    "BestMetricState",
    "VCECheckpointLoader",
    "DecoderTuningHandler",
    "EMAWeights",
    "TemporalEventWriter",
    "VideoFrameCollector",
    "load_video_probs",
    "MultiLabelAveragePrecision",
    "FrameProgressHandler",
    "TemporalMAPMetric",
    "threshold_decoder",
    "ThresholdOptimizationHandler",
]
