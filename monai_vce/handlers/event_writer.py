"""Ignite handlers that group frame outputs by video, write per-video probability files and the event JSON.

:class:`VideoFrameCollector` is the shared engine: it reads, at every iteration, the frame probabilities of
the batch (and optionally its labels) with the video id and frame ids of each frame, and assembles them into
one ``(T, 17)`` array per video. Frames stream in video order in a single-process run, so a video is complete
as soon as the next one starts: it is handed over (written) at once and dropped from memory, and memory stays
bounded by one video whatever the number of videos. In a distributed run the frames of a video are spread over
the ranks, so every rank keeps its share until the end of the epoch, the shares are gathered, and rank 0
assembles and hands over every video.

:class:`TemporalEventWriter` (modelled on MONAI's ``ClassificationSaver``) writes ``<output_dir>/<video_id>.npz``
(the contract: ``probs`` float32 ``(T, 17)``, ``frame_index`` and ``frame_number`` int64 ``(T,)``, ``labels``)
atomically, then decodes the videos into events with :class:`monai_vce.postprocessing.EventDecoder` and writes
the challenge event JSON atomically. File writers belong in handlers, never in post-processing transforms, so
that MONAI Label or MONAI Deploy, which run a bundle's ``postprocessing``, write nothing.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from monai.utils import IgniteInfo, min_version, optional_import

from monai_vce.events.probabilities import (
    VideoArrays,
    load_video_probs,
    npz_frame_count,
    save_video_probs,
)
from monai_vce.labels import NUM_LABELS

Events, _ = optional_import("ignite.engine", IgniteInfo.OPT_IMPORT_VERSION, min_version, "Events")
idist, _ = optional_import("ignite", IgniteInfo.OPT_IMPORT_VERSION, min_version, "distributed")
if TYPE_CHECKING:
    from ignite.engine import Engine
else:
    Engine, _ = optional_import("ignite.engine", IgniteInfo.OPT_IMPORT_VERSION, min_version, "Engine")

__all__ = [
    "VideoFrameCollector",
    "TemporalEventWriter",
    "VideoArrays",
    "save_video_probs",
    "load_video_probs",
    "npz_frame_count",
]

PathLike = str | os.PathLike


def _to_numpy(value: Any, dtype: Any) -> np.ndarray:
    if isinstance(value, torch.Tensor):
        value = value.detach().float().cpu().numpy() if dtype == np.float32 else value.detach().cpu().numpy()
    elif isinstance(value, (list, tuple)) and value and isinstance(value[0], torch.Tensor):
        value = torch.stack([torch.as_tensor(v) for v in value]).detach().cpu().numpy()
    return np.asarray(value, dtype=dtype)


def _ids(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, torch.Tensor):
        return [str(v) for v in value.reshape(-1).tolist()]
    return [str(v) for v in value]


class VideoFrameCollector:
    """Groups per-frame outputs of an engine by video and hands each complete video to ``on_video``.

    Works with the batch-level output of an evaluator run with ``decollate=False`` (``engine.state.output`` a
    dict of batched tensors, ``engine.state.batch`` the collated batch) and with decollated outputs (lists of
    per-frame dicts).

    Args:
        on_video: called with each complete :class:`VideoArrays` (on rank 0 only in distributed runs).
        pred_key: key of the ``(B, 17)`` probabilities in the engine output.
        label_key: key of the ``(B, 17)`` targets in the engine output; ``None`` to collect no labels.
        video_key: batch key of the video ids.
        index_key: batch key of the frame indices.
        number_key: batch key of the frame numbers (when absent from the batch, the frame indices are used).
        output_transform: optional callable ``engine.state.output -> (B, 17) probabilities`` replacing the
            lookup by ``pred_key``.
        batch_transform: optional callable ``engine.state.batch -> dict`` with ``video_key``, ``index_key``,
            ``number_key`` entries, replacing the default lookup.
        streaming: hand over each video as soon as the next one starts (single process; frames must arrive
            in video order, as the inference and validation loaders deliver them). Disabled automatically in
            distributed runs.
    """

    def __init__(
        self,
        on_video: Callable[[VideoArrays], Any],
        pred_key: str = "pred",
        label_key: str | None = None,
        video_key: str = "video_id",
        index_key: str = "frame_index",
        number_key: str = "frame_number",
        output_transform: Callable[[Any], Any] | None = None,
        batch_transform: Callable[[Any], Any] | None = None,
        streaming: bool = True,
    ) -> None:
        self.on_video = on_video
        self.pred_key = pred_key
        self.label_key = label_key
        self.video_key = video_key
        self.index_key = index_key
        self.number_key = number_key
        self.output_transform = output_transform
        self.batch_transform = batch_transform
        self.streaming = streaming
        self.reset()

    def reset(self) -> None:
        """Forget every collected frame."""
        # video id -> list of (probs, index, number, labels) chunks, in arrival order of the videos
        self._chunks: dict[str, list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]]] = {}
        self.completed: list[str] = []

    # --- reading one iteration -------------------------------------------------------------------------------
    def _get(self, container: Any, key: str) -> Any:
        if isinstance(container, Mapping):
            return container.get(key)
        if isinstance(container, Sequence) and container and isinstance(container[0], Mapping):
            if key not in container[0]:
                return None
            return [c[key] for c in container]
        return None

    def _read(self, engine: Engine) -> tuple[list[str], np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
        output, batch = engine.state.output, engine.state.batch
        preds = self.output_transform(output) if self.output_transform is not None else self._get(output, self.pred_key)
        if preds is None:
            raise KeyError(f"engine output has no {self.pred_key!r} entry: cannot collect frame probabilities")
        probs = _to_numpy(preds, np.float32).reshape(-1, NUM_LABELS)
        meta = self.batch_transform(batch) if self.batch_transform is not None else batch
        vids = self._get(meta, self.video_key)
        index = self._get(meta, self.index_key)
        if vids is None or index is None:
            raise KeyError(
                f"batch has no {self.video_key!r} / {self.index_key!r} entries: the datalist items must carry the video id and "
                f"frame index of every frame (see monai_vce.data.build_inference_datalist)"
            )
        vids = _ids(vids)
        index = _to_numpy(index, np.int64).reshape(-1)
        number = self._get(meta, self.number_key)
        number = index if number is None else _to_numpy(number, np.int64).reshape(-1)
        labels = None
        if self.label_key is not None:
            lab = self._get(output, self.label_key)
            if lab is None:
                lab = self._get(batch, self.label_key)
            if lab is not None:
                labels = _to_numpy(lab, np.float32).reshape(-1, NUM_LABELS)
        n = probs.shape[0]
        if not (len(vids) == index.shape[0] == number.shape[0] == n) or (labels is not None and labels.shape[0] != n):
            raise ValueError(
                f"batch sizes disagree: {n} probability rows, {len(vids)} video ids, {index.shape[0]} frame indices"
                + (f", {labels.shape[0]} label rows" if labels is not None else "")
            )
        return vids, probs, index, number, labels

    # --- event callbacks -------------------------------------------------------------------------------------
    def iteration_completed(self, engine: Engine) -> None:
        """Collect the frames of the current iteration; hand over the videos completed by it."""
        vids, probs, index, number, labels = self._read(engine)
        if not vids:
            return
        arr = np.asarray(vids)
        # split the batch into runs of the same video (a batch can span the end of one video and the next)
        starts = np.flatnonzero(np.r_[True, arr[1:] != arr[:-1]])
        ends = np.r_[starts[1:], len(arr)]
        for s, e in zip(starts.tolist(), ends.tolist()):
            vid = vids[s]
            if self.streaming and self._streaming_active() and self._chunks and vid not in self._chunks:
                # a new video starts: every video seen before it is complete (frames come in video order)
                for done in list(self._chunks):
                    self._finish(done)
            chunk = (probs[s:e], index[s:e], number[s:e], None if labels is None else labels[s:e])
            self._chunks.setdefault(vid, []).append(chunk)

    def epoch_completed(self, engine: Engine) -> None:
        """Hand over every remaining video (gathered from all ranks in a distributed run)."""
        if idist.get_world_size() > 1:
            local = {vid: self._concat(chunks) for vid, chunks in self._chunks.items()}
            self._chunks = {}
            gathered = idist.all_gather(local)  # list of dicts, one per rank (all_gather of Python objects)
            if idist.get_rank() != 0:
                return
            merged: dict[str, list] = {}
            for part in gathered if isinstance(gathered, list) else [gathered]:
                for vid, arrays in part.items():
                    merged.setdefault(vid, []).append(arrays)
            self._chunks = merged
        for vid in list(self._chunks):
            self._finish(vid)

    def _streaming_active(self) -> bool:
        return idist.get_world_size() == 1

    @staticmethod
    def _concat(chunks: list) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
        probs = np.concatenate([c[0] for c in chunks])
        index = np.concatenate([c[1] for c in chunks])
        number = np.concatenate([c[2] for c in chunks])
        labels = None if any(c[3] is None for c in chunks) else np.concatenate([c[3] for c in chunks])
        return probs, index, number, labels

    def _finish(self, vid: str) -> None:
        probs, index, number, labels = self._concat(self._chunks.pop(vid))
        # sort by frame index and drop repeated frames (a distributed sampler may pad with repeats)
        order = np.argsort(index, kind="stable")
        index = index[order]
        keep = np.r_[True, index[1:] != index[:-1]] if index.size else np.zeros(0, bool)
        order = order[keep]
        probs, index, number = probs[order], index[keep], number[order]
        labels = labels[order] if labels is not None else None
        finite = np.isfinite(probs).all(axis=1)
        if not finite.all():
            bad = int(np.flatnonzero(~finite)[0])
            raise ValueError(
                f"video {vid}: non-finite probability (NaN or inf) at frame_index {int(index[bad])} "
                f"({int((~finite).sum())} frame(s) in all); refusing to decode or save them"
            )
        self.completed.append(vid)
        self.on_video(
            VideoArrays(
                vid, np.ascontiguousarray(probs, np.float32), index.astype(np.int64), number.astype(np.int64), labels
            )
        )

    def attach(self, engine: Engine) -> None:
        """Register the collection callbacks on ``engine`` (every iteration, end of every epoch)."""
        if not engine.has_event_handler(self.iteration_completed, Events.ITERATION_COMPLETED):
            engine.add_event_handler(Events.ITERATION_COMPLETED, self.iteration_completed)
        if not engine.has_event_handler(self.epoch_completed, Events.EPOCH_COMPLETED):
            engine.add_event_handler(Events.EPOCH_COMPLETED, self.epoch_completed)
        if not engine.has_event_handler(self._epoch_started, Events.EPOCH_STARTED):
            engine.add_event_handler(Events.EPOCH_STARTED, self._epoch_started)

    def _epoch_started(self, engine: Engine) -> None:
        self.reset()


def _natural_key(text: str) -> tuple:
    return tuple(int(t) if t.isdigit() else t for t in re.split(r"(\d+)", text))


class TemporalEventWriter:
    """Event handler writing per-video probability files and the challenge event JSON of an inference run.

    Modelled on MONAI's ``ClassificationSaver``: it collects the frame probabilities at every iteration, groups
    them by video (:class:`VideoFrameCollector`), writes ``<output_dir>/<video_id>.npz`` atomically as soon as a
    video is complete (single process) or once on rank 0 after gathering all ranks (distributed), and at the end
    of the run decodes every video's probabilities with the tuned decoder and writes ``events_file`` atomically
    (validated before writing). Videos whose ``.npz`` already exists from an interrupted run are read back, so
    the JSON always covers every video of ``videos``.

    Args:
        output_dir: folder of the per-video ``.npz`` files.
        events_file: path of the event JSON; a relative path is taken inside ``output_dir``. ``None`` writes
            no JSON (probabilities only).
        decoder: an ``EventDecoder``, decoder parameters (``DecoderParams``, dict or JSON path) or ``None`` for
            the decoder's defaults.
        units: frame ids written in the events: ``"index"`` (``frame_index``, Galar ground-truth units) or
            ``"frame_number"`` (numbers of the image file names); ``None`` takes the decoder parameters'
            ``frame_units``.
        videos: ids of every video the JSON must list, in order (e.g. all videos of the datalist, including
            those skipped because their ``.npz`` was complete). ``None``: every ``.npz`` in ``output_dir``.
        pred_key: key of the probabilities in the engine output (apply the sigmoid in ``postprocessing``).
        output_transform: see :class:`VideoFrameCollector`.
        batch_transform: see :class:`VideoFrameCollector`.
        report_dir: folder of the report drawn after the JSON is written (one timeline PNG per video with
            the frame probabilities behind the predicted events, and a summary; see
            :func:`monai_vce.report.write_report`); ``None`` draws nothing. Drawing needs matplotlib
            (``pip install monai-vce[report]``); without it a one-line warning is logged and nothing is drawn.
        name: logger name (``None``: the engine's logger).

    Example (bundle JSON)::

        {"_target_": "monai_vce.handlers.TemporalEventWriter", "output_dir": "@output_dir",
         "events_file": "events.json", "decoder": "@decoder_params_file", "videos": "@video_ids"}
    """

    def __init__(
        self,
        output_dir: PathLike,
        events_file: PathLike | None = "events.json",
        decoder: Any = None,
        units: str | None = None,
        videos: Iterable[str] | None = None,
        pred_key: str = "pred",
        output_transform: Callable[[Any], Any] | None = None,
        batch_transform: Callable[[Any], Any] | None = None,
        report_dir: PathLike | None = None,
        source: str = "",
        name: str | None = None,
    ) -> None:
        if units not in (None, "index", "frame_number"):
            raise ValueError(f"units must be 'index' or 'frame_number', got {units!r}")
        self.output_dir = Path(output_dir)
        self.events_file = None if events_file is None else self._resolve(events_file)
        self.decoder = decoder
        self.units = units
        self.videos = None if videos is None else [str(v) for v in videos]
        self.report_dir = None if report_dir is None else Path(report_dir)
        self.source = str(source)
        self.logger = logging.getLogger(name)
        self._name = name
        self.collector = VideoFrameCollector(
            self._save_video,
            pred_key=pred_key,
            output_transform=output_transform,
            batch_transform=batch_transform,
        )
        self.written: list[str] = []

    def _resolve(self, path: PathLike) -> Path:
        path = Path(path)
        return path if path.is_absolute() or path.parent != Path(".") else self.output_dir / path

    def _save_video(self, video: VideoArrays) -> None:
        path = save_video_probs(self.output_dir / f"{video.video_id}.npz", video, source=self.source)
        self.written.append(video.video_id)
        self.logger.info(f"saved probabilities of video {video.video_id} ({len(video)} frames): {path}")

    def _get_decoder(self) -> Any:
        from monai_vce.postprocessing.decoder import EventDecoder

        if isinstance(self.decoder, EventDecoder):
            return self.decoder
        if callable(self.decoder) and not isinstance(self.decoder, (str, os.PathLike, Mapping)):
            return self.decoder
        return EventDecoder(self.decoder)

    def video_ids(self) -> list[str]:
        """The videos the JSON lists: ``videos`` or every ``.npz`` file of ``output_dir`` in natural order."""
        if self.videos is not None:
            return list(self.videos)
        if not self.output_dir.is_dir():
            return []
        return sorted((p.stem for p in self.output_dir.glob("*.npz")), key=_natural_key)

    def write_events(self) -> Path | None:
        """Decode every video's ``.npz`` and write the event JSON atomically (rank 0 only), then the report.

        Reads one video at a time, so memory is bounded by the longest video. Can be called on its own (e.g.
        when every video was already complete and the engine had nothing to run). With ``report_dir``, the
        timelines of the videos are drawn after the JSON is written.

        Returns:
            The JSON path, or ``None`` on other ranks or when ``events_file`` is ``None``.

        Raises:
            FileNotFoundError: a video of ``videos`` has no ``.npz`` file.
        """
        if self.events_file is None or idist.get_rank() != 0:
            return None
        from monai_vce.metrics import save_events

        decoder = self._get_decoder()
        units = self.units
        if units is None:
            params = getattr(decoder, "params", None)
            units = params["frame_units"] if params is not None else "index"
        out: dict[str, Any] = {"videos": []}
        missing = [v for v in self.video_ids() if not (self.output_dir / f"{v}.npz").is_file()]
        if missing:
            raise FileNotFoundError(
                f"no probability file for video(s) {', '.join(missing[:10])}{' ...' if len(missing) > 10 else ''} "
                f"in {self.output_dir}: run inference on them first"
            )
        for vid in self.video_ids():
            video = load_video_probs(self.output_dir / f"{vid}.npz")
            frame_ids = video.frame_index if units == "index" else video.frame_number
            events = decoder(video.probs, frame_ids, video_id=vid) if len(video) else []
            out["videos"].append({"video_id": vid, "events": list(events)})
        path = save_events(self.events_file, out)
        n_events = sum(len(v["events"]) for v in out["videos"])
        self.logger.info(f"wrote {n_events} events of {len(out['videos'])} videos: {path}")
        if self.report_dir is not None:
            self.write_report(out, units)
        return path

    def write_report(self, events: Mapping[str, Any], units: str) -> Path | None:
        """Draw the timelines of ``events`` (with the probabilities of ``output_dir``) under ``report_dir``.

        Returns:
            ``report_dir``, or ``None`` when matplotlib is missing (a warning says so) or no report is asked.
        """
        if self.report_dir is None:
            return None
        try:
            from monai_vce.report import write_report

            names = {v["video_id"] for v in events["videos"]}
            # probability files of other videos (an earlier run on more videos) would be refused: draw
            # the events alone then
            strays = [p.name for p in self.output_dir.glob("*.npz") if p.stem not in names]
            if strays:
                self.logger.warning(
                    f"{self.output_dir} holds probability files of videos not in this run ({', '.join(strays[:3])}"
                    f"{' ...' if len(strays) > 3 else ''}): the report draws the events without probabilities"
                )
            write_report(events, self.report_dir, probs_dir=None if strays else self.output_dir, units=units)
        except ImportError as e:  # matplotlib is an optional extra
            self.logger.warning(f"report not drawn ({e}); install monai-vce[report] for timelines")
            return None
        self.logger.info(f"drew the timelines of {len(events['videos'])} videos: {self.report_dir}")
        return self.report_dir

    def _completed(self, engine: Engine) -> None:
        self.write_events()

    def attach(self, engine: Engine) -> None:
        """Attach to an evaluator: collect every iteration, write the videos and, when the run completes, the JSON."""
        if self._name is None:
            self.logger = engine.logger
        self.collector.attach(engine)
        if not engine.has_event_handler(self._completed, Events.COMPLETED):
            engine.add_event_handler(Events.COMPLETED, self._completed)
