from .checkpoint import AtomicCheckpointSaver, AtomicDiskSaver, BestMetricState, VCECheckpointLoader
from .decoder_tuning import DecoderTuningHandler
from .ema import EMAWeights
from .event_writer import TemporalEventWriter, VideoFrameCollector, load_video_probs
from .frame_metrics import MultiLabelAveragePrecision
from .progress import FrameProgressHandler
from .thresholds import ThresholdOptimizationHandler
