"""Data components: the Galar reader, video-level splits, the generated mini-Galar, samplers and transforms."""

from __future__ import annotations

from .dataset_folder import check_folder, galar_datalist, galar_ground_truth, inference_datalist
from .frame_rates import video_frame_rates
from .galar import (
    GalarReport,
    LabelTable,
    VideoReport,
    build_galar_datalist,
    build_ground_truth,
    build_inference_datalist,
    discover_videos,
    list_frames,
    parse_frame_number,
    read_frame_rates,
    read_label_csv,
    read_metadata,
    verify_frames,
)
from .splits import (
    group_by_video,
    kfold_videos,
    lazy_split_videos,
    split_videos,
    subsample_frames,
    video_capsules,
    video_ids,
    video_label_presence,
    video_rows,
)

__all__ = [
    "GalarReport",
    "LabelTable",
    "VideoReport",
    "build_galar_datalist",
    "build_ground_truth",
    "build_inference_datalist",
    "discover_videos",
    "list_frames",
    "parse_frame_number",
    "read_label_csv",
    "read_metadata",
    "read_frame_rates",
    "video_frame_rates",
    "verify_frames",
    "check_folder",
    "galar_datalist",
    "galar_ground_truth",
    "inference_datalist",
    "group_by_video",
    "video_rows",
    "kfold_videos",
    "lazy_split_videos",
    "subsample_frames",
    "split_videos",
    "video_ids",
    "video_capsules",
    "video_label_presence",
    "generate_mini_galar",
    "ensure_mini_galar",
    "resample_timeline",
    "VCEDataLoader",
    "DistributedSqrtFrequencySampler",
    "SqrtFrequencySampler",
    "VideoBatchSampler",
    "label_frequency_weights",
    "FrameCache",
    "FrameCacheDataset",
    "LoadVCEFrame",
    "LoadVCEFramed",
    "VCEPrepareBatch",
    "load_vce_frame",
    "RandErasingd",
    "RandHueSaturationd",
    "RandResizedCropd",
    "vce_load_transforms",
    "vce_val_transforms",
    "ExamColorNormalized",
    "color_reference",
    "ExamStatsLoader",
    "datalist_exam_stats",
    "exam_color_stats",
    "reference_color_stats",
    "VideoFrameDataset",
    "is_video_file",
    "probe_video",
]

# Imported on first use: the torch/MONAI-based modules, so that the reader and the generator stay light
# (`python -m monai_vce.data.synthetic` starts in a fraction of a second), and the generator itself, so that
# running it as __main__ does not import it twice.
_LAZY = {
    "generate_mini_galar": "synthetic",
    "ensure_mini_galar": "synthetic",
    "resample_timeline": "synthetic",
    "VCEDataLoader": "loader",
    "DistributedSqrtFrequencySampler": "samplers",
    "SqrtFrequencySampler": "samplers",
    "VideoBatchSampler": "samplers",
    "label_frequency_weights": "samplers",
    "FrameCache": "frame_cache",
    "FrameCacheDataset": "frame_cache",
    "LoadVCEFrame": "frames",
    "LoadVCEFramed": "frames",
    "VCEPrepareBatch": "frames",
    "load_vce_frame": "frames",
    "RandErasingd": "transforms",
    "RandHueSaturationd": "transforms",
    "RandResizedCropd": "transforms",
    "vce_load_transforms": "transforms",
    "vce_val_transforms": "transforms",
    "ExamColorNormalized": "exam_normalization",
    "ExamStatsLoader": "exam_normalization",
    "color_reference": "exam_normalization",
    "datalist_exam_stats": "exam_normalization",
    "exam_color_stats": "exam_normalization",
    "reference_color_stats": "exam_normalization",
    "VideoFrameDataset": "video_dataset",
    "is_video_file": "video",
    "probe_video": "video",
}


def __getattr__(name: str):
    if name in _LAZY:
        from importlib import import_module

        return getattr(import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
