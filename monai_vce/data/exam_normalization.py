"""Per-exam colour normalisation: map every frame of an exam so that the exam's colour statistics match reference ones.

A capsule never seen in training has its own colour response, white balance and vignetting; the statistics of a
whole exam (many frames of one video) measure that response far better than one frame. Statistics are per-channel
mean and standard deviation over the field of view (pixels brighter than a small threshold: the capsule's dark
vignette border is left out), in ``[0, 1]`` units whatever the frames' dtype (``uint8`` frames are divided by 255).

Typical use: the reference statistics of the training devices (:func:`reference_color_stats` of
:func:`datalist_exam_stats` on the training datalist), the statistics of the new exams (:class:`ExamStatsLoader`,
computed lazily per video), and :class:`ExamColorNormalized` after the frame is decoded.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from monai.config import KeysCollection
from monai.transforms import MapTransform
from monai.utils import convert_to_dst_type, convert_to_tensor

from monai_vce.data.frames import load_vce_frame
from monai_vce.utils import atomic_write_json, read_json_file

__all__ = [
    "ExamColorNormalized",
    "ExamStatsLoader",
    "color_reference",
    "datalist_exam_stats",
    "exam_color_stats",
    "reference_color_stats",
]

#: Default field-of-view threshold in ``[0, 1]`` units: pixels whose brightest channel is below it are background.
DEFAULT_THRESHOLD = 10.0 / 255.0
_MODES = ("mean_std", "grey_world")
_ON_MISSING = ("error", "skip")
_REFERENCE_FORMAT = "monai-vce colour reference"

Stats = tuple[np.ndarray, np.ndarray]


def _as_float01(x: torch.Tensor) -> torch.Tensor:
    """Float32 copy of ``x`` in ``[0, 1]`` units: integer frames are divided by 255."""
    return x.float().div(255.0) if not x.is_floating_point() else x.float()


def exam_color_stats(
    frames: np.ndarray | torch.Tensor,
    threshold: float = DEFAULT_THRESHOLD,
    channels_last: bool | None = None,
    chunk_size: int = 64,
) -> Stats:
    """Per-channel mean and std of a sample of an exam's frames over their field of view, in ``[0, 1]`` units.

    Args:
        frames: ``(N, C, H, W)`` or ``(N, H, W, C)`` frames (a single ``(C, H, W)`` / ``(H, W, C)`` frame is one
            frame), ``uint8`` in ``[0, 255]`` or float in ``[0, 1]``.
        threshold: pixels whose brightest channel is below it (``[0, 1]`` units) are background, left out;
            ``0`` keeps every pixel.
        channels_last: layout of ``frames``; ``None`` detects it (channels last when the last axis has 1 or 3
            entries and axis 1 has not).
        chunk_size: frames processed at once (bounds memory; the sums are float64).

    Returns:
        ``(mean, std)``, two float64 arrays of shape ``(C,)``.

    Raises:
        ValueError: ``frames`` is not 3-D or 4-D, or no pixel lies in the field of view.
    """
    x = convert_to_tensor(frames, track_meta=False)
    if x.ndim == 3:
        x = x[None]
    if x.ndim != 4:
        raise ValueError(f"exam_color_stats expects (N, C, H, W) or (N, H, W, C) frames, got {tuple(x.shape)}")
    if channels_last is None:
        channels_last = x.shape[-1] in (1, 3) and x.shape[1] not in (1, 3)
    if channels_last:
        x = x.movedim(-1, 1)
    channels = x.shape[1]
    count = torch.zeros((), dtype=torch.float64)
    s1 = torch.zeros(channels, dtype=torch.float64)
    s2 = torch.zeros(channels, dtype=torch.float64)
    for start in range(0, x.shape[0], max(1, int(chunk_size))):
        chunk = _as_float01(x[start : start + chunk_size])
        mask = (chunk.amax(dim=1, keepdim=True) >= threshold).to(chunk.dtype)
        count += mask.sum(dtype=torch.float64).cpu()
        s1 += (chunk * mask).sum(dim=(0, 2, 3), dtype=torch.float64).cpu()
        s2 += (chunk * chunk * mask).sum(dim=(0, 2, 3), dtype=torch.float64).cpu()
    if count.item() == 0:
        raise ValueError(f"exam_color_stats: no pixel of the {x.shape[0]} frames reaches the threshold {threshold}")
    mean = s1 / count
    std = (s2 / count - mean * mean).clamp_min(0.0).sqrt()
    return mean.numpy(), std.numpy()


def reference_color_stats(exam_stats: Mapping[Hashable, Stats] | Iterable[Stats]) -> Stats:
    """Reference statistics of a set of exams (the training devices'): the average of the exams' means and stds.

    Each exam weighs the same, whatever its number of frames.

    Args:
        exam_stats: ``{video_id: (mean, std)}`` (e.g. :func:`datalist_exam_stats` of the training datalist) or an
            iterable of ``(mean, std)``.

    Returns:
        ``(mean, std)``, two float64 arrays of shape ``(C,)``.
    """
    values = list(exam_stats.values()) if isinstance(exam_stats, Mapping) else list(exam_stats)
    if not values:
        raise ValueError("reference_color_stats: no exam statistics given")
    means = np.stack([np.asarray(m, dtype=np.float64) for m, _ in values])
    stds = np.stack([np.asarray(s, dtype=np.float64) for _, s in values])
    return means.mean(axis=0), stds.mean(axis=0)


def _reference_from_file(path: Path) -> tuple[Stats, list[str] | None]:
    obj = read_json_file(path, max_bytes=16 * 1024**2, what="colour reference")
    if not isinstance(obj, dict) or obj.get("format") != _REFERENCE_FORMAT:
        raise ValueError(f"{path}: not a colour reference (expected format {_REFERENCE_FORMAT!r})")
    try:
        mean, std = (np.asarray(obj[k], dtype=np.float64) for k in ("mean", "std"))
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"{path}: a colour reference needs numeric 'mean' and 'std' lists ({e})") from None
    finite = all(math.isfinite(v) for v in (*mean.tolist(), *std.tolist()))
    if mean.ndim != 1 or mean.shape != std.shape or not finite or (std <= 0).any():
        raise ValueError(f"{path}: 'mean' and 'std' must be finite per-channel lists of one length, std > 0")
    videos = obj.get("videos")
    return (mean, std), [str(v) for v in videos] if isinstance(videos, list) else None


def color_reference(
    path: str | os.PathLike,
    exam_stats: Mapping[Hashable, Stats] | None = None,
    videos: Iterable[Hashable] | None = None,
    overwrite: bool = False,
) -> Stats:
    """The reference colour statistics of a model's training exams, kept next to the model as a JSON file.

    With ``exam_stats`` (a training's), their :func:`reference_color_stats` is written to ``path`` (atomically)
    when there is no file yet or with ``overwrite``; an existing file is otherwise read, so that a resumed training
    and an evaluation keep the reference the model was trained with.

    Args:
        path: the JSON file (``{"format", "mean", "std", "videos"}``; reading it executes nothing).
        exam_stats: ``{video_id: (mean, std)}`` of the exams (:func:`datalist_exam_stats`); ``None``: read ``path``.
        videos: the exams of ``exam_stats`` the reference is computed from (the training split); ``None``: all.
        overwrite: recompute the reference even when the file exists (a new training).

    Returns:
        ``(mean, std)``, float64 arrays of shape ``(C,)``.

    Raises:
        FileNotFoundError: no file to read (the model was trained without exam normalisation).
        ValueError: a malformed file (naming it), or ``videos`` without statistics.
    """
    file = Path(path)
    if exam_stats is None or (file.is_file() and not overwrite):
        if not file.is_file():
            raise FileNotFoundError(
                f"colour reference {file} not found: exam normalisation needs the reference written by a training "
                "with configs/exam_norm_train.json"
            )
        return _reference_from_file(file)[0]
    keep = list(exam_stats) if videos is None else list(dict.fromkeys(videos))
    missing = [v for v in keep if v not in exam_stats]
    if missing:
        raise ValueError(f"color_reference: no exam statistics for videos {missing[:5]} ({len(missing)} in all)")
    mean, std = reference_color_stats([exam_stats[v] for v in keep])
    obj = {"format": _REFERENCE_FORMAT, "mean": mean.tolist(), "std": std.tolist(), "videos": sorted(map(str, keep))}
    atomic_write_json(file, obj)
    return mean, std


class ExamStatsLoader:
    """Callable ``video_id -> (mean, std)``: the :func:`exam_color_stats` of frames sampled evenly from one exam.

    The items of ``data`` are grouped by video on the first call. A plain datalist's frames are decoded from their
    ``image`` path by :func:`~monai_vce.data.load_vce_frame` (resized to ``image_size``, as the frame pipeline
    does) unless the item already holds the frame; a MONAI ``Dataset`` (e.g. :class:`~monai_vce.data.VideoFrameDataset`,
    whose exams are video files) is grouped by its ``data`` items and its frames are read by indexing it (its
    transform must leave the ``(3, H, W)`` frame under ``image_key`` and must not hold the normalisation itself).

    Args:
        data: datalist of frame dicts (with ``image_key`` and ``video_key``) or a MONAI ``Dataset`` of them.
        frames_per_exam: frames sampled per exam, evenly spaced over its items (all when fewer).
        image_size: resize of decoded frames (``None``: the decoded size).
        threshold: field-of-view threshold of :func:`exam_color_stats`.
        image_key: key of the frames (paths or arrays).
        video_key: key of the video id.
    """

    def __init__(
        self,
        data: Sequence[Mapping[Hashable, Any]],
        frames_per_exam: int = 64,
        image_size: int | None = 224,
        threshold: float = DEFAULT_THRESHOLD,
        image_key: str = "image",
        video_key: str = "video_id",
    ) -> None:
        if frames_per_exam < 1:
            raise ValueError(f"frames_per_exam must be >= 1, got {frames_per_exam}")
        self.data = data
        self.frames_per_exam = int(frames_per_exam)
        self.image_size = image_size
        self.threshold = float(threshold)
        self.image_key = image_key
        self.video_key = video_key
        self._groups: dict[Hashable, list[int]] | None = None

    def _items(self) -> Sequence[Mapping[Hashable, Any]]:
        items = getattr(self.data, "data", None) if isinstance(self.data, torch.utils.data.Dataset) else None
        return items if items is not None else self.data

    @property
    def groups(self) -> dict[Hashable, list[int]]:
        """``{video_id: item indices}``, in datalist order."""
        if self._groups is None:
            groups: dict[Hashable, list[int]] = {}
            for i, item in enumerate(self._items()):
                groups.setdefault(item[self.video_key], []).append(i)
            self._groups = groups
        return self._groups

    def _frame(self, index: int) -> torch.Tensor:
        if isinstance(self.data, torch.utils.data.Dataset):
            return convert_to_tensor(self.data[index][self.image_key], track_meta=False)
        value = self.data[index][self.image_key]
        if isinstance(value, (np.ndarray, torch.Tensor)):
            return convert_to_tensor(value, track_meta=False)
        return load_vce_frame(value, image_size=self.image_size)

    def __call__(self, video_id: Hashable) -> Stats:
        indices = self.groups.get(video_id)
        if not indices:
            raise KeyError(f"ExamStatsLoader: no frames of video {video_id!r} in the datalist")
        if len(indices) > self.frames_per_exam:
            picks = np.linspace(0, len(indices) - 1, self.frames_per_exam).round().astype(int)
            indices = [indices[i] for i in picks]
        frames = torch.stack([self._frame(i) for i in indices])
        return exam_color_stats(frames, threshold=self.threshold, channels_last=False)


def datalist_exam_stats(
    data: Sequence[Mapping[Hashable, Any]],
    frames_per_exam: int = 64,
    image_size: int | None = 224,
    threshold: float = DEFAULT_THRESHOLD,
    image_key: str = "image",
    video_key: str = "video_id",
) -> dict[Hashable, Stats]:
    """``{video_id: (mean, std)}`` of every exam of a datalist (arguments of :class:`ExamStatsLoader`)."""
    loader = ExamStatsLoader(data, frames_per_exam, image_size, threshold, image_key, video_key)
    return {vid: loader(vid) for vid in loader.groups}


class ExamColorNormalized(MapTransform):
    """Map each frame so that its exam's colour statistics match reference statistics.

    With ``mode="mean_std"`` each channel is mapped affinely, ``y = (x - m) * s_ref / s + m_ref`` (``m``, ``s``
    the exam's mean and std), so the exam's field of view gets the reference mean and std; with
    ``mode="grey_world"`` each channel is scaled (white balance), ``y = x * m_ref / m``, or, without a reference
    mean, ``y = x * mean(m) / m`` (grey world: equal channel means). Values are in ``[0, 1]`` units; the result is
    clipped and leaves with the input's dtype (``uint8`` rounded). Background pixels (brightest channel below
    ``threshold``) are left unchanged with ``keep_background``, so the vignette stays black.

    The exam's statistics come from ``stats``, by the item's ``video_key``: a ``{video_id: (mean, std)}`` mapping,
    or a callable ``video_id -> (mean, std)`` (e.g. :class:`ExamStatsLoader`) called once per video and cached.

    Args:
        keys: keys of the channel-first ``(C, H, W)`` frames.
        stats: exam statistics, a mapping or a callable (see above), in ``[0, 1]`` units.
        reference_mean: reference per-channel mean (``[0, 1]`` units); required by ``"mean_std"``.
        reference_std: reference per-channel std; required by ``"mean_std"``.
        mode: ``"mean_std"`` or ``"grey_world"``.
        video_key: item key of the video id.
        threshold: background threshold (``[0, 1]`` units) of ``keep_background``.
        keep_background: leave background pixels unchanged.
        on_missing: ``"error"`` raises when ``stats`` has no entry for the video, ``"skip"`` leaves its frames
            unchanged.
        eps: floor of the exam's std and mean (a flat channel).
        allow_missing_keys: do not raise when a key is missing.
    """

    def __init__(
        self,
        keys: KeysCollection,
        stats: Mapping[Hashable, Stats] | Callable[[Hashable], Stats],
        reference_mean: Sequence[float] | np.ndarray | None = None,
        reference_std: Sequence[float] | np.ndarray | None = None,
        mode: str = "mean_std",
        video_key: str = "video_id",
        threshold: float = DEFAULT_THRESHOLD,
        keep_background: bool = True,
        on_missing: str = "error",
        eps: float = 1e-6,
        allow_missing_keys: bool = False,
    ) -> None:
        super().__init__(keys, allow_missing_keys)
        if mode not in _MODES:
            raise ValueError(f"mode must be one of {_MODES}, got {mode!r}")
        if on_missing not in _ON_MISSING:
            raise ValueError(f"on_missing must be one of {_ON_MISSING}, got {on_missing!r}")
        if mode == "mean_std" and (reference_mean is None or reference_std is None):
            raise ValueError("mode='mean_std' needs reference_mean and reference_std")
        self.stats = stats
        self.reference_mean = None if reference_mean is None else np.asarray(reference_mean, dtype=np.float64)
        self.reference_std = None if reference_std is None else np.asarray(reference_std, dtype=np.float64)
        self.mode = mode
        self.video_key = video_key
        self.threshold = float(threshold)
        self.keep_background = keep_background
        self.on_missing = on_missing
        self.eps = float(eps)
        self._cache: dict[Hashable, Stats | None] = {}

    def exam_stats(self, video_id: Hashable) -> Stats | None:
        """The statistics of ``video_id`` (cached), or ``None`` when unknown and ``on_missing="skip"``."""
        if video_id in self._cache:
            return self._cache[video_id]
        found: Stats | None
        if isinstance(self.stats, Mapping):
            found = self.stats.get(video_id)
            if found is None and self.on_missing == "error":
                known = sorted(map(str, self.stats))
                more = ", ..." if len(known) > 5 else ""
                raise KeyError(
                    f"ExamColorNormalized: no colour statistics for video {video_id!r} "
                    f"(known: {', '.join(known[:5])}{more})"
                )
        else:
            try:
                found = self.stats(video_id)
            except KeyError:
                if self.on_missing == "error":
                    raise
                found = None
        if found is not None:
            found = (np.asarray(found[0], dtype=np.float64), np.asarray(found[1], dtype=np.float64))
        self._cache[video_id] = found
        return found

    def _gain_bias(self, mean: np.ndarray, std: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        mean = np.maximum(mean, self.eps)
        if self.mode == "mean_std":
            assert self.reference_mean is not None and self.reference_std is not None
            gain = self.reference_std / np.maximum(std, self.eps)
            return gain, self.reference_mean - gain * mean
        target = self.reference_mean if self.reference_mean is not None else np.full_like(mean, mean.mean())
        return target / mean, np.zeros_like(mean)

    def __call__(self, data: Mapping[Hashable, Any]) -> dict[Hashable, Any]:
        d = dict(data)
        if self.video_key not in d:
            raise KeyError(f"ExamColorNormalized: the item has no video id key {self.video_key!r}")
        stats = self.exam_stats(d[self.video_key])
        if stats is None:
            return d
        gain, bias = self._gain_bias(*stats)
        for key in self.key_iterator(d):
            img = d[key]
            t = convert_to_tensor(img, track_meta=False)
            if t.ndim != 3 or t.shape[0] != gain.shape[0]:
                raise ValueError(
                    f"ExamColorNormalized expects ({gain.shape[0]}, H, W) frames, got {tuple(t.shape)} for {key!r}"
                )
            x = _as_float01(t)
            g = torch.as_tensor(gain, dtype=x.dtype, device=x.device).view(-1, 1, 1)
            b = torch.as_tensor(bias, dtype=x.dtype, device=x.device).view(-1, 1, 1)
            y = (x * g + b).clamp_(0.0, 1.0)
            if self.keep_background:
                y = torch.where(x.amax(dim=0, keepdim=True) < self.threshold, x, y)
            y = y.to(t.dtype) if t.is_floating_point() else y.mul_(255.0).round_().to(t.dtype)
            d[key] = convert_to_dst_type(y, img, dtype=y.dtype)[0]
        return d
