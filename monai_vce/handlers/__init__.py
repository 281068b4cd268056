from .progress import FrameProgressHandler
from .ema import EMAWeights
from .thresholds import ThresholdOptimizationHandler
from .checkpoint import AtomicCheckpointSaver, AtomicDiskSaver, BestMetricState, VCECheckpointLoader
from .decoder_tuning import DecoderTuningHandler
from .event_writer import TemporalEventWriter, VideoFrameCollector, load_video_probs
from .frame_metrics import MultiLabelAveragePrecision
