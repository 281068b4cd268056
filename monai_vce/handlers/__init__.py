"""Ignite handlers and metrics of the bundle: they collect and save (per-video collector, probability files,
features, F1 thresholds, decoder tuning, checkpoints, EMA, progress).
"""

from __future__ import annotations

from .checkpoint import AtomicCheckpointSaver, AtomicDiskSaver, BestMetricState, VCECheckpointLoader
from .decoder_tuning import DecoderTuningHandler
from .ema import EMAWeights
from .exam_batchnorm import ExamBatchNormHandler
from .features import FrameFeatureCapture
from .frame_metrics import MultiLabelAveragePrecision
from .probability_writer import ProbabilityWriter
from .progress import FrameProgressHandler
from .temporal_map_metric import HeldOutDecoder, TemporalMAPMetric, threshold_decoder
from .thresholds import ThresholdOptimizationHandler
from .video_collector import VideoFrameCollector, all_gather_rows, all_gather_strings

__all__ = [
    "AtomicCheckpointSaver",
    "AtomicDiskSaver",
    "BestMetricState",
    "VCECheckpointLoader",
    "DecoderTuningHandler",
    "EMAWeights",
    "ExamBatchNormHandler",
    "ProbabilityWriter",
    "FrameFeatureCapture",
    "VideoFrameCollector",
    "MultiLabelAveragePrecision",
    "FrameProgressHandler",
    "TemporalMAPMetric",
    "HeldOutDecoder",
    "threshold_decoder",
    "ThresholdOptimizationHandler",
    "all_gather_rows",
    "all_gather_strings",
]
