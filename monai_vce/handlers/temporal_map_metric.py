"""An ignite metric reporting the challenge's temporal mAP on whole validation videos during training."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from ignite.engine import Engine
from ignite.exceptions import NotComputableError
from ignite.metrics import Metric

from monai_vce.events import event_json, frames_to_events
from monai_vce.labels import NUM_LABELS
from monai_vce.metrics.temporal_map import temporal_map, threshold_key

__all__ = ["TemporalMAPMetric", "threshold_decoder"]

Decoder = Callable[[np.ndarray, np.ndarray], list]


def threshold_decoder(probs: np.ndarray, frame_ids: np.ndarray, threshold: float = 0.5) -> list[dict[str, Any]]:
    """The simplest decoder: ``probs >= threshold`` then label-set runs, in time order.

    Args:
        probs: (T, 17) per-frame probabilities of one video.
        frame_ids: (T,) increasing frame ids.
        threshold: one probability threshold for every label.
    """
    return frames_to_events(np.asarray(probs) >= threshold, frame_ids, mode="label_set")


def _numpy(x: Any, dtype: Any) -> np.ndarray:
    """A batch (tensor, array, or decollated list of per-item values) as one numpy array."""
    if isinstance(x, torch.Tensor):
        return x.detach().cpu().numpy().astype(dtype, copy=False)
    if isinstance(x, (list, tuple)):
        if not x:
            return np.zeros((0,), dtype=dtype)
        return np.stack([_numpy(i, dtype) for i in x])
    return np.asarray(x, dtype=dtype)


def _strings(x: Any) -> list[str]:
    if isinstance(x, str):
        return [x]
    if isinstance(x, (torch.Tensor, np.ndarray)):
        return [str(v) for v in x.reshape(-1).tolist()]
    out: list[str] = []
    for v in x:
        out.extend(_strings(v) if isinstance(v, (list, tuple)) else [str(v)])
    return out


class TemporalMAPMetric(Metric):
    """Temporal mAP (the RARE-VISION challenge's) of whole validation videos, as an ignite metric.

    Each iteration contributes per-frame probabilities, 17-float targets, video ids and frame indices. At
    the end of the run the frames are grouped by video and sorted by frame index (duplicates, e.g. the
    padding of a distributed sampler, are dropped); the ground-truth events of each video are the label-set
    runs of its targets (``>= 0.5``; :func:`~monai_vce.postprocessing.frames_to_events`), the predicted
    events come from ``decoder``, and :func:`~monai_vce.metrics.temporal_map` scores them. When the
    validation frames are a subsample of each video (every n-th frame), the events of both sides span the
    sampled frame indices, so the score is that of the subsampled timeline.

    With MONAI's ``SupervisedEvaluator`` (``engine.state.output`` holds ``pred`` and ``label``; the video id
    and frame index are keys of ``engine.state.batch``) the defaults work as they are::

        from monai.engines import SupervisedEvaluator
        from monai.transforms import Activationsd
        from monai_vce.handlers import TemporalMAPMetric
        from monai_vce.postprocessing import EventDecoder

        evaluator = SupervisedEvaluator(
            device, val_loader, net,
            postprocessing=Activationsd(keys="pred", sigmoid=True),
            key_val_metric={"val_temporal_mAP": TemporalMAPMetric(decoder=EventDecoder("decoder.json"))},
        )

    ``output_transform`` may instead return all four items, ``(pred, label, video_ids, frame_indices)``,
    and ``batch_transform`` is then not used.

    ``decoder="cross_fitted"`` scores the model as it will be used, with a decoder tuned for it, yet without
    scoring a video with parameters fitted on that video: the validation videos are dealt into ``folds``
    folds, and each fold is decoded by :func:`~monai_vce.postprocessing.tune_decoder` fitted on the other
    folds (``tune_kwargs`` are passed on). A fixed decoder can rank epochs by how well the model happens to
    suit that decoder (a model that grows more confident may emit more labels that the fixed thresholds
    keep, and lose the absent-label scores), which the cross-fitted score does not. With fewer than
    ``folds`` videos it falls back to the default decoder, with a warning.

    Args:
        decoder: callable ``(probs (T, 17), frame_ids (T,)) -> events`` (e.g.
            ``monai_vce.postprocessing.EventDecoder``), ``"cross_fitted"`` (see above), or None for
            :func:`threshold_decoder` at 0.5.
        folds: number of folds of the ``"cross_fitted"`` decoder.
        tune_kwargs: keyword arguments of :func:`~monai_vce.postprocessing.tune_decoder` for ``"cross_fitted"``
            (default: one round).
        threshold: the tIoU threshold of the value returned by :meth:`compute` (and stored under the
            metric's name in ``engine.state.metrics``).
        thresholds: further tIoU thresholds, each stored as ``"<name>_tiou<t>"`` in ``engine.state.metrics``
            (no ``@``: MLflow and TensorBoard accept only plain metric names).
        sigmoid: apply a sigmoid to ``pred`` (when it holds logits rather than probabilities).
        output_transform: ``engine.state.output -> (pred, label)`` or ``(pred, label, video_ids,
            frame_indices)``; default ``monai.handlers.from_engine(["pred", "label"])``.
        batch_transform: ``engine.state.batch -> (video_ids, frame_indices)``; default
            ``monai.handlers.from_engine([video_key, frame_key])``.
        video_key: batch key of the video id.
        frame_key: batch key of the frame index (``"frame_number"`` for frame-number units).
        save_details: also store the full :func:`~monai_vce.metrics.temporal_map` result in
            ``engine.state.metric_details[name]`` (MONAI's convention).
        device: ignite metric device (accumulation is on the CPU in numpy whatever it is).

    Attributes:
        result: the full result of the last :meth:`compute` (``per_video``, ``per_label``, ...).
    """

    def __init__(
        self,
        decoder: Decoder | str | None = None,
        folds: int = 2,
        tune_kwargs: dict[str, Any] | None = None,
        threshold: float = 0.5,
        thresholds: Sequence[float] = (0.5, 0.95),
        sigmoid: bool = False,
        output_transform: Callable | None = None,
        batch_transform: Callable | None = None,
        video_key: str = "video_id",
        frame_key: str = "frame_index",
        save_details: bool = True,
        device: str | torch.device = "cpu",
    ) -> None:
        from monai.handlers.utils import from_engine

        if isinstance(decoder, str) and decoder != "cross_fitted":
            raise ValueError(f"decoder must be a callable, 'cross_fitted' or None, got {decoder!r}")
        self.decoder = decoder if decoder is not None else threshold_decoder
        self.folds = int(folds)
        self.tune_kwargs = {"rounds": 1, **(tune_kwargs or {})}
        self.threshold = float(threshold)
        self.thresholds = tuple(dict.fromkeys([self.threshold, *map(float, thresholds)]))
        self.sigmoid = sigmoid
        self.batch_transform = batch_transform if batch_transform is not None else from_engine([video_key, frame_key])
        self.save_details = save_details
        self.result: dict[str, Any] | None = None
        super().__init__(
            output_transform=output_transform if output_transform is not None else from_engine(["pred", "label"]),
            device=device,
        )

    def reset(self) -> None:
        self._probs: list[np.ndarray] = []
        self._targets: list[np.ndarray] = []
        self._videos: list[str] = []
        self._frames: list[np.ndarray] = []

    def iteration_completed(self, engine: Engine) -> None:
        out = self._output_transform(engine.state.output)
        if len(out) == 2:
            video_ids, frames = self.batch_transform(engine.state.batch)
            out = (out[0], out[1], video_ids, frames)
        self.update(out)

    def update(self, output: Sequence[Any]) -> None:
        """Add one batch: ``(pred (B, 17), label (B, 17), video_ids (B,), frame_indices (B,))``."""
        if len(output) != 4:
            raise ValueError(
                f"{type(self).__name__} expects (pred, label, video_ids, frame_indices), got {len(output)} items"
            )
        pred, label, video_ids, frames = output
        probs = _numpy(pred, np.float32).reshape(-1, NUM_LABELS)
        targets = _numpy(label, np.float32).reshape(-1, NUM_LABELS)
        vids = _strings(video_ids)
        idx = _numpy(frames, np.int64).reshape(-1)
        if not (len(probs) == len(targets) == len(vids) == len(idx)):
            raise ValueError(
                f"{type(self).__name__}: batch sizes differ: pred {len(probs)}, label {len(targets)}, "
                f"video ids {len(vids)}, frame indices {len(idx)}"
            )
        if self.sigmoid:
            probs = 1.0 / (1.0 + np.exp(-probs))
        self._probs.append(probs)
        self._targets.append(targets)
        self._videos.extend(vids)
        self._frames.append(idx)

    def _gathered(self) -> tuple[np.ndarray, np.ndarray, list[str], np.ndarray]:
        probs = np.concatenate(self._probs) if self._probs else np.zeros((0, NUM_LABELS), np.float32)
        targets = np.concatenate(self._targets) if self._targets else np.zeros((0, NUM_LABELS), np.float32)
        frames = np.concatenate(self._frames) if self._frames else np.zeros((0,), np.int64)
        import ignite.distributed as idist

        if idist.get_world_size() <= 1:
            return probs, targets, list(self._videos), frames
        vocab, codes = np.unique(np.asarray(self._videos, dtype=str), return_inverse=True)
        # different frame counts per rank: gather the sizes, then padded tensors; video ids as a
        # per-rank vocabulary (one JSON string) plus per-frame integer codes
        dev = idist.device()
        sizes = [int(s) for s in idist.all_gather(len(frames))]
        vocabs = [json.loads(s) for s in idist.all_gather(json.dumps([str(v) for v in vocab]))]

        def gather(a: np.ndarray) -> list[np.ndarray]:
            t = torch.as_tensor(a).to(dev)
            shapes = [[s, *a.shape[1:]] for s in sizes]
            return [x.cpu().numpy() for x in idist.all_gather_tensors_with_shapes(t, shapes)]

        all_probs = np.concatenate(gather(probs))
        all_targets = np.concatenate(gather(targets))
        all_frames = np.concatenate(gather(frames))
        all_codes = gather(np.asarray(codes, dtype=np.int64).reshape(-1))
        all_vids = [v for voc, c in zip(vocabs, all_codes) for v in np.asarray(voc, dtype=object)[c].tolist()]
        return all_probs, all_targets, all_vids, all_frames

    def compute(self) -> float:
        probs, targets, vids, frames = self._gathered()
        if len(frames) == 0:
            raise NotComputableError(f"{type(self).__name__} must have at least one frame before it can be computed")
        vid_arr = np.asarray(vids, dtype=str)
        # one stable sort by (video, frame): frames of a video become contiguous and ordered
        order = np.lexsort((frames, vid_arr))
        vid_arr, frames, probs, targets = vid_arr[order], frames[order], probs[order], targets[order]
        keep = np.r_[True, (vid_arr[1:] != vid_arr[:-1]) | (frames[1:] != frames[:-1])]
        vid_arr, frames, probs, targets = vid_arr[keep], frames[keep], probs[keep], targets[keep]
        bounds = np.flatnonzero(np.r_[True, vid_arr[1:] != vid_arr[:-1], True])
        gt_videos, videos = {}, {}
        for lo, hi in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
            vid, ids = str(vid_arr[lo]), frames[lo:hi]
            gt_videos[vid] = frames_to_events(targets[lo:hi] >= 0.5, ids, mode="label_set")
            videos[vid] = (probs[lo:hi], ids)
        if self.decoder == "cross_fitted":
            pred_videos = self._cross_fitted(videos, gt_videos)
        else:
            pred_videos = {vid: list(self.decoder(p, ids)) for vid, (p, ids) in videos.items()}
        self.result = temporal_map(
            event_json(gt_videos), event_json(pred_videos), thresholds=self.thresholds, validate=True
        )
        return float(self.result[f"mAP@{threshold_key(self.threshold)}"])

    def _cross_fitted(self, videos: dict[str, tuple], gt_videos: dict[str, list]) -> dict[str, list]:
        """Decode each fold of videos with a decoder tuned on the other folds."""
        import warnings

        from monai_vce.postprocessing import EventDecoder, tune_decoder, video_folds

        vids = sorted(videos)
        if len(vids) < max(2, self.folds):
            warnings.warn(
                f"{type(self).__name__}: {len(vids)} validation video(s) cannot be cross-fitted in {self.folds} "
                "folds; scoring with the default threshold decoder",
                stacklevel=2,
            )
            return {v: list(threshold_decoder(*videos[v])) for v in vids}
        fold = video_folds(len(vids), self.folds, seed=0)
        pred: dict[str, list] = {}
        for k in range(int(fold.max()) + 1):
            fit = [(*videos[v], gt_videos[v]) for v, f in zip(vids, fold) if f != k]
            decoder = EventDecoder(tune_decoder(fit, **self.tune_kwargs))
            pred.update({v: list(decoder(*videos[v])) for v, f in zip(vids, fold) if f == k})
        return pred

    def completed(self, engine: Engine, name: str) -> None:
        value = self.compute()
        engine.state.metrics[name] = value
        for t in self.thresholds:
            if t != self.threshold:
                engine.state.metrics[f"{name}_tiou{threshold_key(t)}"] = float(self.result[f"mAP@{threshold_key(t)}"])
        if self.save_details:
            if not hasattr(engine.state, "metric_details"):
                engine.state.metric_details = {}
            engine.state.metric_details[name] = self.result
