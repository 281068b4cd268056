"""The per-video collector of an engine's frame outputs (:class:`VideoFrameCollector`, one
:class:`~monai_vce.events.Video` per video), and the one cross-rank gather (:func:`all_gather_rows`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from monai.utils import IgniteInfo, evenly_divisible_all_gather, min_version, optional_import, string_list_all_gather

from monai_vce.events.ground_truth import ground_truth_events
from monai_vce.events.probabilities import Video
from monai_vce.events.runs import value_runs
from monai_vce.events.units import FrameUnits, as_frame_units
from monai_vce.labels import NUM_LABELS
from monai_vce.utils import natural_key, short_repr

Events, _ = optional_import("ignite.engine", IgniteInfo.OPT_IMPORT_VERSION, min_version, "Events")
idist, _ = optional_import("ignite", IgniteInfo.OPT_IMPORT_VERSION, min_version, "distributed")
if TYPE_CHECKING:
    from ignite.engine import Engine
else:
    Engine, _ = optional_import("ignite.engine", IgniteInfo.OPT_IMPORT_VERSION, min_version, "Engine")

__all__ = ["VideoFrameCollector", "all_gather_rows", "all_gather_strings", "to_numpy"]

logger = logging.getLogger(__name__)

# (probs, frame_index, frame_number, targets or None, features or None) of some frames of one video
_Chunk = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None, np.ndarray | None]


def to_numpy(value: Any, dtype: Any) -> np.ndarray:
    """A batch value (tensor, array, or decollated list of per-item values) as one numpy array."""
    if isinstance(value, torch.Tensor):
        value = value.detach().float().cpu().numpy() if dtype == np.float32 else value.detach().cpu().numpy()
    elif isinstance(value, (list, tuple)) and value and isinstance(value[0], torch.Tensor):
        value = torch.stack([torch.as_tensor(v) for v in value]).detach().cpu().numpy()
    return np.asarray(value, dtype=dtype)


def _ids(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, (torch.Tensor, np.ndarray)):
        return [str(v) for v in value.reshape(-1).tolist()]
    out: list[str] = []
    for v in value:
        out.extend(_ids(v) if isinstance(v, (list, tuple)) else [str(v)])
    return out


def all_gather_rows(*arrays: np.ndarray) -> tuple[np.ndarray, ...]:
    """Concatenate the rows of arrays across ranks (a different number of rows per rank is fine).

    Every rank receives every row, rank by rank. Uses MONAI's ``evenly_divisible_all_gather`` on the
    distributed device; returns the arrays unchanged in a single-process run.
    """
    if idist.get_world_size() <= 1:
        return arrays
    device = idist.device()
    out = []
    for a in arrays:
        t = torch.as_tensor(np.ascontiguousarray(a)).to(device)
        out.append(evenly_divisible_all_gather(t, concat=True).cpu().numpy())
    return tuple(out)


def all_gather_strings(strings: Sequence[str]) -> list[str]:
    """The union of non-empty strings of every rank, sorted (MONAI's ``string_list_all_gather``)."""
    if idist.get_world_size() <= 1:
        return sorted(set(strings))
    # a rank without strings sends "", which the gather returns as one empty string: dropped here
    return sorted({s for s in string_list_all_gather(list(strings)) if s})


class VideoFrameCollector:
    """Groups per-frame outputs of an engine by video (see ``docs/design/training.md``).

    Works with the batch-level output of an evaluator run with ``decollate=False`` (``engine.state.output`` a
    dict of batched tensors, ``engine.state.batch`` the collated batch) and with decollated outputs (lists of
    per-frame dicts).

    Args:
        on_video: called with each complete :class:`~monai_vce.events.Video` (hand-over mode; on rank 0
            only in distributed runs); ``None`` keeps every video for :meth:`videos` (keep mode).
        pred_key: key of the ``(B, 17)`` probabilities in the engine output.
        label_key: key of the ``(B, 17)`` targets in the engine output (or the batch); ``None`` collects none.
        video_key: batch key of the video ids.
        index_key: batch key of the ``frame_index`` ids.
        number_key: batch key of the ``frame_number`` ids (when absent from the batch, ``frame_index`` is used).
        output_transform: optional callable ``engine.state.output -> (B, 17) probabilities`` replacing the
            lookup by ``pred_key``.
        batch_transform: optional callable ``engine.state.batch -> dict`` with ``video_key``, ``index_key``,
            ``number_key`` entries, replacing the default lookup.
        streaming: hand over each video as soon as the next one starts (single process; frames must arrive in
            video order, as the inference and validation loaders deliver them). Disabled automatically in
            distributed runs; default: on in hand-over mode.
        sigmoid: apply a sigmoid to the collected values (when the output holds logits).
        features_key: key of ``(B, D)`` per-frame features in the engine output (put there by
            :class:`~monai_vce.handlers.FrameFeatureCapture`), collected as float16 into each video's ``features``;
            ``None`` collects none.
        frame_units: the frame ids of the events of :meth:`labelled_videos` (``"frame_index"`` or ``"frame_number"``).
        ground_truth: the ground truth of the collected videos, an event JSON object in ``frame_units``, e.g.
            :func:`monai_vce.data.build_ground_truth` of the labels CSVs (what the challenge scores). ``None``
            builds each video's ground truth from the collected targets with the same rule
            (:func:`monai_vce.events.ground_truth_events`). Read on first use (a
            :class:`~monai_vce.utils.LazyMapping` stays unread until the first validation).
        on_discard: called with the id of a video handed over as complete whose frames turn out to continue
            later (a datalist listing one video in two places, streaming mode), before the collector raises a
            ``ValueError`` naming the video; the writer removes the video's partial file there.
        name: logger name (``None``: the engine's logger).
        frame_rates: ``{video_id: frames per second of frame_number}`` (:func:`monai_vce.data.video_frame_rates`),
            recorded in each video; read on first use. ``None``: unknown.
    """

    def __init__(
        self,
        on_video: Callable[[Video], Any] | None = None,
        pred_key: str = "pred",
        label_key: str | None = None,
        video_key: str = "video_id",
        index_key: str = FrameUnits.FRAME_INDEX.value,
        number_key: str = FrameUnits.FRAME_NUMBER.value,
        output_transform: Callable[[Any], Any] | None = None,
        batch_transform: Callable[[Any], Any] | None = None,
        streaming: bool | None = None,
        sigmoid: bool = False,
        frame_units: FrameUnits | str = FrameUnits.FRAME_INDEX,
        ground_truth: Mapping[str, Any] | None = None,
        on_discard: Callable[[str], Any] | None = None,
        name: str | None = None,
        features_key: str | None = None,
        frame_rates: Mapping[str, float | None] | None = None,
    ) -> None:
        self.logger = logging.getLogger(name)
        self.frame_rates = frame_rates
        self._name = name
        self.on_video = on_video
        self.on_discard = on_discard
        self.features_key = features_key
        self.pred_key = pred_key
        self.label_key = label_key
        self.video_key = video_key
        self.index_key = index_key
        self.number_key = number_key
        self.output_transform = output_transform
        self.batch_transform = batch_transform
        # keep mode holds every video until the epoch ends: nothing to stream
        self.streaming = on_video is not None and (streaming is None or bool(streaming))
        self.sigmoid = bool(sigmoid)
        self.frame_units = as_frame_units(frame_units)
        # read on first use, so that a bundle config naming the labels CSVs can be parsed without the data
        self._ground_truth_source = ground_truth
        self._ground_truth_events: dict[str, list[dict[str, Any]]] | None = None
        #: incremented at every reset: consumers cache what they computed from one epoch's videos by it
        self.generation = 0
        self.reset()

    @property
    def ground_truth(self) -> dict[str, list[dict[str, Any]]] | None:
        """The ground-truth events of each video (``None``: built from the targets), read on first use."""
        if self._ground_truth_events is None and self._ground_truth_source is not None:
            self._ground_truth_events = _events_by_video(self._ground_truth_source)
        return self._ground_truth_events

    def reset(self) -> None:
        """Forget every collected frame (at the start of every epoch)."""
        # video id -> list of (probs, index, number, targets, features) chunks, in arrival order of the videos
        self._chunks: dict[str, list[_Chunk]] = {}
        self._videos: dict[str, Video] | None = None
        self._labelled: dict[str, Video] | None = None
        self.completed: list[str] = []
        self._handed: set[str] = set()
        self.generation += 1

    def _refuse_repeat(self, vid: str) -> None:
        """A video handed over as complete gets more frames: its hand-over held part of it only."""
        if self.on_discard is not None:
            self.on_discard(vid)
        raise ValueError(
            f"video {short_repr(vid, 60)}: more of its frames arrive after other videos' frames, but its frames were "
            "taken as complete when the next video started; list each video's frames together in the datalist "
            "(monai_vce.events.pending_frames groups them), its partial result was removed"
        )

    # --- reading one iteration -------------------------------------------------------------------------------
    @staticmethod
    def _get(container: Any, key: str) -> Any:
        if isinstance(container, Mapping):
            return container.get(key)
        if isinstance(container, Sequence) and container and isinstance(container[0], Mapping):
            if key not in container[0]:
                return None
            return [c[key] for c in container]
        return None

    def _read(
        self, engine: Engine
    ) -> tuple[list[str], np.ndarray, np.ndarray, np.ndarray, np.ndarray | None, np.ndarray | None]:
        output, batch = engine.state.output, engine.state.batch
        preds = self.output_transform(output) if self.output_transform is not None else self._get(output, self.pred_key)
        if preds is None:
            raise KeyError(f"engine output has no {self.pred_key!r} entry: cannot collect frame probabilities")
        probs = to_numpy(preds, np.float32).reshape(-1, NUM_LABELS)
        meta = self.batch_transform(batch) if self.batch_transform is not None else batch
        vids = self._get(meta, self.video_key)
        index = self._get(meta, self.index_key)
        if vids is None or index is None:
            raise KeyError(
                f"batch has no {self.video_key!r} / {self.index_key!r} entries: the datalist items must carry the "
                "video id and frame index of every frame (see monai_vce.data.build_inference_datalist)"
            )
        vids = _ids(vids)
        index = to_numpy(index, np.int64).reshape(-1)
        number = self._get(meta, self.number_key)
        number = index if number is None else to_numpy(number, np.int64).reshape(-1)
        targets = None
        if self.label_key is not None:
            lab = self._get(output, self.label_key)
            if lab is None:
                lab = self._get(batch, self.label_key)
            if lab is None:
                raise KeyError(f"neither the engine output nor the batch has targets under {self.label_key!r}")
            targets = to_numpy(lab, np.float32).reshape(-1, NUM_LABELS)
        features = None
        if self.features_key is not None:
            feats = self._get(output, self.features_key)
            if feats is None:
                raise KeyError(
                    f"engine output has no {self.features_key!r} entry: cannot collect per-frame features (attach a "
                    "monai_vce.handlers.FrameFeatureCapture to the engine)"
                )
            features = to_numpy(feats, np.float16).reshape(probs.shape[0], -1)
        return vids, probs, index, number, targets, features

    # --- event callbacks -------------------------------------------------------------------------------------
    def iteration_completed(self, engine: Engine) -> None:
        """Collect the frames of the current iteration; hand over the videos completed by it."""
        self.update(*self._read(engine))

    def update(
        self,
        video_ids: Sequence[str],
        probs: np.ndarray,
        frame_index: np.ndarray,
        frame_number: np.ndarray | None = None,
        targets: np.ndarray | None = None,
        features: np.ndarray | None = None,
    ) -> None:
        """Add frames: their video ids, ``(B, 17)`` probabilities, frame ids, optional ``(B, 17)`` targets and
        optional ``(B, D)`` features (kept as float16).

        ``frame_number`` defaults to ``frame_index`` (when a caller knows one kind of frame id only).
        """
        vids = list(video_ids)
        if not vids:
            return
        index = np.asarray(frame_index, dtype=np.int64).reshape(-1)
        number = index if frame_number is None else np.asarray(frame_number, dtype=np.int64).reshape(-1)
        probs = np.asarray(probs, dtype=np.float32).reshape(-1, NUM_LABELS)
        if self.sigmoid:
            probs = 1.0 / (1.0 + np.exp(-probs))
        if targets is not None:
            targets = np.asarray(targets, dtype=np.float32).reshape(-1, NUM_LABELS)
        if features is not None:
            features = np.asarray(features, dtype=np.float16).reshape(probs.shape[0], -1)
        if not (len(vids) == index.shape[0] == number.shape[0] == probs.shape[0]) or (
            targets is not None and targets.shape[0] != probs.shape[0]
        ):
            raise ValueError(
                f"batch sizes disagree: {probs.shape[0]} probability rows, {len(vids)} video ids, "
                f"{index.shape[0]} frame ids" + (f", {targets.shape[0]} target rows" if targets is not None else "")
            )
        # split the batch into runs of the same video (a batch can span the end of one video and the next)
        starts, ends, _ = value_runs(np.asarray(vids))
        for s, e in zip(starts.tolist(), ends.tolist(), strict=True):
            vid = vids[s]
            if self.streaming and vid in self._handed:
                self._refuse_repeat(vid)
            if self.streaming and idist.get_world_size() == 1 and self._chunks and vid not in self._chunks:
                # a new video starts: every video seen before it is complete (frames come in video order)
                for done in list(self._chunks):
                    self._finish(done, self._concat(self._chunks.pop(done)))
            chunk = (
                probs[s:e],
                index[s:e],
                number[s:e],
                None if targets is None else targets[s:e],
                None if features is None else features[s:e],
            )
            self._chunks.setdefault(vid, []).append(chunk)

    def epoch_completed(self, engine: Engine | None = None) -> None:
        """Assemble every remaining video (gathered from all ranks in a distributed run) and hand it over."""
        self._assemble()

    def _assemble(self) -> dict[str, Video]:
        """Gather and assemble the epoch's videos once (every rank must call it: it is collective)."""
        if self._videos is not None:
            return self._videos
        self._videos = {}
        parts = {vid: self._concat(chunks) for vid, chunks in self._chunks.items()}
        self._chunks = {}
        if idist.get_world_size() > 1:
            parts = self._gather(parts)
            if idist.get_rank() != 0 and self.on_video is not None:
                return self._videos
        for vid in sorted(parts, key=natural_key):
            self._finish(vid, parts[vid])
        return self._videos

    def _gather(self, parts: dict[str, tuple]) -> dict[str, tuple]:
        """Every rank's share of every video, on every rank."""
        vocab = all_gather_strings(list(parts))
        code = {vid: i for i, vid in enumerate(vocab)}
        local = [self._concat([p]) for p in parts.values()] if parts else []
        n = [len(p[1]) for p in local]
        codes = np.repeat(np.asarray([code[v] for v in parts], dtype=np.int64), n)
        probs = np.concatenate([p[0] for p in local]) if local else np.zeros((0, NUM_LABELS), np.float32)
        index = np.concatenate([p[1] for p in local]) if local else np.zeros(0, np.int64)
        number = np.concatenate([p[2] for p in local]) if local else np.zeros(0, np.int64)
        arrays = [codes, probs, index, number]
        if self.label_key is not None:
            arrays.append(np.concatenate([p[3] for p in local]) if local else np.zeros((0, NUM_LABELS), np.float32))
        if self.features_key is not None:
            # every rank must send the same width: a rank without frames learns it from the others' first row
            mine = [p[4] for p in local if p[4] is not None]
            width = max(int(all_gather_rows(np.asarray([mine[0].shape[1] if mine else -1]))[0].max()), 0)
            feats = np.concatenate(mine) if mine else np.zeros((0, width), np.float16)
            arrays.append(feats.astype(np.float32))  # float32: not every backend gathers float16
        gathered = all_gather_rows(*arrays)
        codes, probs, index, number = gathered[:4]
        targets = gathered[4] if self.label_key is not None else None
        features = gathered[-1].astype(np.float16) if self.features_key is not None else None
        out = {}
        order = np.argsort(codes, kind="stable")
        bounds = np.searchsorted(codes[order], np.arange(len(vocab) + 1))
        for i, vid in enumerate(vocab):
            rows = order[bounds[i] : bounds[i + 1]]
            out[vid] = (
                probs[rows],
                index[rows],
                number[rows],
                None if targets is None else targets[rows],
                None if features is None else features[rows],
            )
        return out

    @staticmethod
    def _concat(chunks: list[_Chunk]) -> _Chunk:
        probs = np.concatenate([c[0] for c in chunks])
        index = np.concatenate([c[1] for c in chunks])
        number = np.concatenate([c[2] for c in chunks])
        targets = None if any(c[3] is None for c in chunks) else np.concatenate([c[3] for c in chunks])
        features = None if any(c[4] is None for c in chunks) else np.concatenate([c[4] for c in chunks])
        return probs, index, number, targets, features

    def _finish(self, vid: str, part: tuple) -> None:
        probs, index, number, targets, features = part
        # sort by frame index and drop repeated frames (a distributed sampler may pad with repeats)
        order = np.argsort(index, kind="stable")
        index = index[order]
        keep = np.r_[True, index[1:] != index[:-1]] if index.size else np.zeros(0, bool)
        order = order[keep]
        probs, index, number = probs[order], index[keep], number[order]
        targets = targets[order] if targets is not None else None
        features = features[order] if features is not None else None
        finite = np.isfinite(probs).all(axis=1)
        if not finite.all():
            bad = int(np.flatnonzero(~finite)[0])
            raise ValueError(
                f"video {vid}: non-finite probability (NaN or inf) at frame_index {int(index[bad])} "
                f"({int((~finite).sum())} frame(s) in all); refusing to decode or save them"
            )
        self.completed.append(vid)
        if self.streaming:
            self._handed.add(vid)
        video = Video(
            vid,
            np.ascontiguousarray(probs, np.float32),
            index.astype(np.int64),
            number.astype(np.int64),
            targets,
            features=features,
            frame_rate=None if self.frame_rates is None else self.frame_rates.get(vid),
        )
        if self.on_video is not None:
            self.on_video(video)
        elif self._videos is not None:
            self._videos[vid] = video

    # --- what the consumers read -----------------------------------------------------------------------------
    def videos(self) -> dict[str, Video]:
        """The epoch's videos ``{video_id: Video}`` (keep mode), assembled on the first call of the epoch.

        In a distributed run every rank must call it (the first call gathers the ranks' shares), and every rank
        receives every video.
        """
        if self.on_video is not None:
            raise RuntimeError("a collector with on_video hands its videos over; it keeps none to return")
        return self._assemble()

    def labelled_videos(self) -> dict[str, Video]:
        """The epoch's videos with their ground-truth ``events`` in ``frame_units`` (their ``units``), the same
        objects for every consumer of the epoch (the metric, the decoder's tuning)."""
        if self._labelled is None:
            units = self.frame_units
            self._labelled = {
                vid: v.replace(events=self._ground_truth(v, v.frame_ids(units)), units=units)
                for vid, v in self.videos().items()
            }
        return self._labelled

    def frames(self) -> tuple[np.ndarray, np.ndarray]:
        """All collected frames, ``(probs (N, 17), targets (N, 17))``, videos in order (for frame-level fits)."""
        videos = list(self.videos().values())
        targets = [v.targets for v in videos if v.targets is not None]
        if len(targets) < len(videos):
            raise ValueError("the collector has no targets: give it the label_key of the validation targets")
        if not videos:
            return np.zeros((0, NUM_LABELS), np.float32), np.zeros((0, NUM_LABELS), np.float32)
        return np.concatenate([v.probs for v in videos]), np.concatenate(targets)

    def _ground_truth(self, video: Video, frame_ids: np.ndarray) -> list[dict[str, Any]]:
        if self.ground_truth is not None:
            if video.video_id not in self.ground_truth:
                raise ValueError(f"video {video.video_id}: not in the ground truth given to the collector")
            return self.ground_truth[video.video_id]
        if video.targets is None:
            raise ValueError(
                f"video {video.video_id}: no targets and no ground truth; give the collector a label_key or a "
                "ground_truth"
            )
        return ground_truth_events(frame_ids, video.targets, video_id=video.video_id)

    def attach(self, engine: Engine) -> None:
        """Register the collection callbacks on ``engine`` (every iteration, start and end of every epoch)."""
        if self._name is None:
            self.logger = engine.logger
        if not engine.has_event_handler(self._epoch_started, Events.EPOCH_STARTED):
            engine.add_event_handler(Events.EPOCH_STARTED, self._epoch_started)
        if not engine.has_event_handler(self.iteration_completed, Events.ITERATION_COMPLETED):
            engine.add_event_handler(Events.ITERATION_COMPLETED, self.iteration_completed)
        if not engine.has_event_handler(self.epoch_completed, Events.EPOCH_COMPLETED):
            engine.add_event_handler(Events.EPOCH_COMPLETED, self.epoch_completed)

    def _epoch_started(self, engine: Engine) -> None:
        self.reset()


def _events_by_video(ground_truth: Mapping[str, Any]) -> dict[str, list[dict[str, Any]]]:
    try:
        return {str(v["video_id"]): list(v["events"]) for v in ground_truth["videos"]}
    except (KeyError, TypeError):
        raise ValueError("ground_truth must be an event JSON object {'videos': [{'video_id', 'events'}]}") from None
