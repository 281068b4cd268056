"""The per-video driver of reduced inference: a network, a frame datalist, per-video probability files, events.

:class:`FramePredictor` turns a network and the frames of a datalist into the ``predict(rows)`` function of
:func:`~monai_vce.inference.adaptive_inference`: the requested frames are decoded by the DataLoader workers
(persistent across calls: the sampler, which lives in the main process, is pointed at the new rows before each
pass), batched, moved to the device as ``uint8`` and scaled there (:class:`~monai_vce.data.VCEPrepareBatch`),
run through the inferer under ``torch.inference_mode()`` (bf16 autocast optional) and returned as probabilities.

:class:`ReducedInference` runs a whole datalist video by video: for each video it computes the frame signatures
when near-duplicate skipping is on, calls :func:`~monai_vce.inference.adaptive_inference`, writes
``<output_dir>/<video_id>.npz`` atomically (the project's per-video probability format, plus ``inferred``, the
mask of frames that went through the network), logs "frames inferred vs frames in the video", and at the end
decodes every video into the event JSON with :class:`~monai_vce.handlers.TemporalEventWriter`. A rerun skips the
videos whose file is complete and was written by the same model with the same reduction settings (or by full
inference of the same model). In a distributed run every rank takes every ``world_size``-th video and rank 0
writes the events once all ranks are done.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from monai_vce.data import LoadVCEFramed, VCEPrepareBatch, vce_val_transforms
from monai_vce.engines import FrameInferer
from monai_vce.events.probabilities import npz_record, probability_file
from monai_vce.handlers.event_writer import TemporalEventWriter
from monai_vce.labels import LABELS, NUM_LABELS
from monai_vce.postprocessing import EventDecoder
from monai_vce.utils import atomic_save_npz

from .adaptive import adaptive_inference
from .signature import SIGNATURE_KEY, FrameSignatured

__all__ = ["FramePredictor", "ReducedInference", "video_groups", "reduction_tag"]

PathLike = str | os.PathLike
logger = logging.getLogger(__name__)


class _RowSampler(torch.utils.data.Sampler):
    """A sampler yielding the rows it was last pointed at (read in the main process at every pass)."""

    def __init__(self) -> None:
        self.rows: list[int] = []

    def __iter__(self) -> Iterator[int]:
        return iter(self.rows)

    def __len__(self) -> int:
        return len(self.rows)


class _Frames(torch.utils.data.Dataset):
    """Frame dicts of a datalist through a transform, keeping only the keys a pass needs."""

    def __init__(self, data: Sequence[Mapping[str, Any]], transform: Callable | None, keys: Sequence[str]) -> None:
        self.data = data
        self.transform = transform
        self.keys = tuple(keys)

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> dict[str, Any]:
        item = dict(self.data[i])
        if self.transform is not None:
            item = self.transform(item)
        return {k: item[k] for k in self.keys}


def _loader(dataset: torch.utils.data.Dataset, sampler: _RowSampler, batch_size: int, num_workers: int, pin: bool):
    return torch.utils.data.DataLoader(
        dataset,
        batch_size=batch_size,
        sampler=sampler,
        num_workers=num_workers,
        persistent_workers=num_workers > 0,
        prefetch_factor=4 if num_workers > 0 else None,
        pin_memory=pin,
    )


class FramePredictor:
    """``predict(rows)`` over the frames of a datalist: rows are positions in ``data``.

    Args:
        network: the classifier (``(B, 3, S, S)`` images in ``[0, 1]`` -> ``(B, 17)`` logits).
        data: frame dicts (``image`` paths, ...), e.g. one video's or the whole datalist.
        transform: the loader's transform of one frame dict (decoding and resizing), e.g.
            :func:`monai_vce.data.vce_val_transforms`; ``None`` builds that one at ``image_size``.
        image_size: frame size when ``transform`` is ``None``.
        batch_size: frames per network call.
        num_workers: DataLoader workers (kept alive between calls).
        device: where the network runs; the network's own device when ``None``.
        inferer: called as ``inferer(images, network)``; :class:`monai_vce.workflows.FrameInferer` when ``None``.
        prepare_batch: moves a batch to the device and scales it; :class:`monai_vce.data.VCEPrepareBatch` when
            ``None``.
        amp: run the network under autocast with ``amp_dtype``.
        amp_dtype: autocast dtype (``torch.bfloat16`` or its name).
        image_key: key of the frames in the transformed dicts.
        activation: turns logits into probabilities (``torch.sigmoid`` when ``None``).

    Example::

        predict = FramePredictor(network, video_items, batch_size=64)
        probs = predict(np.array([0, 8, 16]))          # (3, 17) float32
    """

    def __init__(
        self,
        network: torch.nn.Module,
        data: Sequence[Mapping[str, Any]],
        transform: Callable | None = None,
        image_size: int = 224,
        batch_size: int = 64,
        num_workers: int = 0,
        device: str | torch.device | None = None,
        inferer: Callable | None = None,
        prepare_batch: Callable | None = None,
        amp: bool = False,
        amp_dtype: torch.dtype | str = torch.bfloat16,
        image_key: str = "image",
        activation: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ) -> None:

        if int(batch_size) < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size!r}")
        self.network = network
        self.data = data
        self.device = torch.device(device) if device is not None else next(network.parameters()).device
        self.transform = transform if transform is not None else vce_val_transforms(image_size=image_size)
        self.batch_size = int(batch_size)
        self.num_workers = int(num_workers)
        self.inferer = inferer if inferer is not None else FrameInferer()
        self.prepare_batch = prepare_batch if prepare_batch is not None else VCEPrepareBatch(image_key=image_key)
        self.amp = bool(amp)
        self.amp_dtype = getattr(torch, amp_dtype) if isinstance(amp_dtype, str) else amp_dtype
        self.image_key = image_key
        self.activation = activation if activation is not None else torch.sigmoid
        self._sampler = _RowSampler()
        self._loader: torch.utils.data.DataLoader | None = None
        self.frames_inferred = 0
        self.seconds = 0.0

    def _get_loader(self) -> torch.utils.data.DataLoader:
        if self._loader is None:
            dataset = _Frames(self.data, self.transform, (self.image_key,))
            pin = self.device.type == "cuda"
            self._loader = _loader(dataset, self._sampler, self.batch_size, self.num_workers, pin)
        return self._loader

    def __call__(self, rows: np.ndarray) -> np.ndarray:
        rows = np.asarray(rows, dtype=np.int64).reshape(-1)
        if rows.size and (rows.min() < 0 or rows.max() >= len(self.data)):
            raise ValueError(f"FramePredictor: rows must lie in [0, {len(self.data)}), got {rows.min()}..{rows.max()}")
        out = np.empty((rows.size, NUM_LABELS), dtype=np.float32)
        if rows.size == 0:
            return out
        t = time.perf_counter()
        self._sampler.rows = rows.tolist()
        self.network.eval()
        pos = 0
        with torch.inference_mode(), torch.autocast(self.device.type, dtype=self.amp_dtype, enabled=self.amp):
            for batch in self._get_loader():
                images, _ = self.prepare_batch(batch, self.device, non_blocking=True)
                logits = self.inferer(images, self.network)
                probs = self.activation(logits.float()).cpu().numpy()
                out[pos : pos + probs.shape[0]] = probs
                pos += probs.shape[0]
        if pos != rows.size:
            raise RuntimeError(f"FramePredictor: the loader returned {pos} frames for {rows.size} rows")
        self.frames_inferred += int(rows.size)
        self.seconds += time.perf_counter() - t
        return out

    def signatures(
        self, rows: np.ndarray | None = None, size: int = 16, image_size: int = 64, batch_size: int = 256
    ) -> np.ndarray:
        """``(len(rows), size * size)`` ``uint8`` signatures (:class:`~monai_vce.inference.FrameSignatured`) of
        the frames ``rows`` (all frames when ``None``), decoded in the workers at ``image_size``."""
        from monai.transforms import Compose

        rows = np.arange(len(self.data)) if rows is None else np.asarray(rows, dtype=np.int64).reshape(-1)
        transform = Compose(
            [LoadVCEFramed(keys=self.image_key, image_size=image_size), FrameSignatured(self.image_key, size=size)]
        )
        sampler = _RowSampler()
        sampler.rows = rows.tolist()
        loader = _loader(_Frames(self.data, transform, (SIGNATURE_KEY,)), sampler, batch_size, self.num_workers, False)
        parts = [np.asarray(b[SIGNATURE_KEY]) for b in loader]
        return np.concatenate(parts) if parts else np.zeros((0, size * size), np.uint8)

    def close(self) -> None:
        """Stop the DataLoader workers."""
        self._loader = None


def video_groups(datalist: Sequence[Mapping[str, Any]]) -> dict[str, np.ndarray]:
    """``{video_id: rows of its frames in the datalist, in frame_index order}``, videos in order of appearance."""
    vids = [str(d["video_id"]) for d in datalist]
    index = np.array([int(d.get("frame_index", i)) for i, d in enumerate(datalist)], dtype=np.int64)
    groups: dict[str, list[int]] = {}
    for i, v in enumerate(vids):
        groups.setdefault(v, []).append(i)
    out = {}
    for v, rows in groups.items():
        r = np.asarray(rows, dtype=np.int64)
        r = r[np.argsort(index[r], kind="stable")]
        dup = np.flatnonzero(np.diff(index[r]) == 0)
        if dup.size:
            raise ValueError(f"video {v!r}: frame_index {int(index[r[dup[0]]])} appears twice in the datalist")
        out[v] = r
    return out


def reduction_tag(
    stride: int, budget: int | float | None, refine: bool, margin: float, duplicate_tolerance: float
) -> str:
    """The reduction settings as a short string, stored with each probability file (``""`` for full inference)."""
    if stride == 1 and budget is None and duplicate_tolerance == 0:
        return ""
    return f"reduced(stride={stride},budget={budget},refine={refine},margin={margin:g},dup={duplicate_tolerance:g})"


class ReducedInference:
    """Reduced inference over a frame datalist, video by video, with resumable per-video files and events.

    Args:
        network: the classifier, weights loaded (or loaded by ``load_handlers``).
        datalist: frame dicts with ``image``, ``video_id``, ``frame_index`` (and ``frame_number``).
        output_dir: folder of the per-video ``.npz`` probability files.
        events_file: the event JSON (relative paths are taken inside ``output_dir``); ``None`` writes none.
        decoder: the event decoder (``EventDecoder``, parameters, a ``decoder.json`` path or ``None``): the
            refinement aims at it and the events are decoded with it.
        stride, budget, refine, margin: see :func:`~monai_vce.inference.adaptive_inference` (``budget`` per
            video; a float is a fraction of each video).
        duplicate_tolerance: near-duplicate skipping tolerance (``0``: off); signatures are computed first,
            from every frame of the video.
        signature_size: signature thumbnail side.
        transform, image_size, batch_size, num_workers, device, inferer, prepare_batch, amp, amp_dtype:
            see :class:`FramePredictor`.
        resume: skip videos whose probability file is complete and was written from ``source`` with these
            settings (or by full inference from ``source``).
        source: what the probabilities come from (e.g. :func:`monai_vce.workflows.model_fingerprint`).
        probs_transform: applied to the filled-in probabilities before the refinement decodes them (a temporal
            refiner); the files hold the untransformed probabilities.
        load_handlers: callables run once with a bare ignite engine before the first video (e.g. a
            :class:`monai_vce.handlers.VCECheckpointLoader`).
        progress: draw a progress bar on a terminal (frames of the videos done, frames inferred in the current
            video); a summary line per video is logged either way.
        report_dir: drawn by the event writer after the JSON (see :class:`~monai_vce.handlers.TemporalEventWriter`).
        adaptive_kwargs: further keyword arguments of :func:`~monai_vce.inference.adaptive_inference`.

    Example::

        ReducedInference(network, datalist, "eval/probs", decoder="models/decoder.json", stride=8).run()
    """

    def __init__(
        self,
        network: torch.nn.Module,
        datalist: Sequence[Mapping[str, Any]],
        output_dir: PathLike,
        events_file: PathLike | None = "events.json",
        decoder: Any = None,
        stride: int = 8,
        budget: int | float | None = None,
        refine: bool = True,
        margin: float = 0.3,
        duplicate_tolerance: float = 0.0,
        signature_size: int = 16,
        transform: Callable | None = None,
        image_size: int = 224,
        batch_size: int = 64,
        num_workers: int = 0,
        device: str | torch.device | None = None,
        inferer: Callable | None = None,
        prepare_batch: Callable | None = None,
        amp: bool = False,
        amp_dtype: torch.dtype | str = torch.bfloat16,
        resume: bool = True,
        source: str = "",
        probs_transform: Callable[[np.ndarray], np.ndarray] | None = None,
        load_handlers: Sequence[Callable[[Any], Any]] = (),
        progress: bool = True,
        report_dir: PathLike | None = None,
        adaptive_kwargs: Mapping[str, Any] | None = None,
    ) -> None:

        self.network = network
        self.datalist = list(datalist)
        self.output_dir = Path(output_dir)
        self.events_file = events_file
        self.decoder = decoder if isinstance(decoder, EventDecoder) else EventDecoder(decoder)
        self.settings: dict[str, Any] = {"stride": stride, "budget": budget, "refine": refine, "margin": margin}
        self.duplicate_tolerance = float(duplicate_tolerance)
        self.signature_size = int(signature_size)
        self.predictor = FramePredictor(
            network,
            self.datalist,
            transform=transform,
            image_size=image_size,
            batch_size=batch_size,
            num_workers=num_workers,
            device=device,
            inferer=inferer,
            prepare_batch=prepare_batch,
            amp=amp,
            amp_dtype=amp_dtype,
        )
        self.resume = bool(resume)
        self.source = str(source)
        self.tag = reduction_tag(stride, budget, refine, margin, self.duplicate_tolerance)
        if self.tag and adaptive_kwargs:
            self.tag += "".join(f",{k}={v}" for k, v in sorted(adaptive_kwargs.items()))
        self.probs_transform = probs_transform
        self.load_handlers = list(load_handlers)
        self.progress = bool(progress)
        self.report_dir = report_dir
        self.adaptive_kwargs = dict(adaptive_kwargs or {})
        #: per video: frames, frames inferred, seconds (filled by :meth:`run`)
        self.stats: dict[str, dict[str, float]] = {}

    # ------------------------------------------------------------------------------------------ helpers
    def _stored_source(self) -> str:
        return f"{self.source}|{self.tag}" if self.tag else self.source

    def _complete(self, vid: str, frames: int) -> bool:

        record = npz_record(probability_file(self.output_dir, vid))
        return record is not None and record[0] == frames and record[1] in (self.source, self._stored_source())

    def _save(self, vid: str, rows: np.ndarray, probs: np.ndarray, inferred: np.ndarray) -> Path:
        items = [self.datalist[i] for i in rows.tolist()]
        index = np.array([int(d["frame_index"]) for d in items], dtype=np.int64)
        number = np.array([int(d.get("frame_number", d["frame_index"])) for d in items], dtype=np.int64)
        return atomic_save_npz(
            probability_file(self.output_dir, vid),
            probs=probs.astype(np.float32, copy=False),
            frame_index=index,
            frame_number=number,
            labels=np.asarray(LABELS),
            source=np.asarray(self._stored_source()),
            inferred=inferred.astype(bool),
        )

    def _rank(self) -> tuple[int, int]:
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            return torch.distributed.get_rank(), torch.distributed.get_world_size()
        return 0, 1

    def _load(self) -> None:
        if not self.load_handlers:
            return
        from ignite.engine import Engine

        engine = Engine(lambda e, b: None)
        for handler in self.load_handlers:
            handler(engine)

    # ---------------------------------------------------------------------------------------------- run
    def infer_video(self, vid: str, rows: np.ndarray, callback: Callable[[int, int], Any] | None = None):
        """Reduced inference of one video (``rows``: its frames' positions in the datalist, in frame order).

        Returns:
            ``(probs (T, 17) float32, inferred (T,) bool)``.
        """
        signatures = None
        if self.duplicate_tolerance > 0:
            signatures = self.predictor.signatures(rows, size=self.signature_size)
        return adaptive_inference(
            lambda r: self.predictor(rows[r]),
            int(rows.size),
            self.decoder,
            signatures=signatures,
            duplicate_tolerance=self.duplicate_tolerance,
            probs_transform=self.probs_transform,
            callback=callback,
            video_id=vid,
            **self.settings,
            **self.adaptive_kwargs,
        )

    def run(self) -> Path | None:
        """Infer every pending video of this rank, write its file, then (rank 0) the event JSON.

        Returns:
            The event JSON path (rank 0 with ``events_file``), else ``None``.
        """
        from tqdm.auto import tqdm

        groups = video_groups(self.datalist)
        rank, world = self._rank()
        mine = {v: r for i, (v, r) in enumerate(groups.items()) if i % world == rank}
        pending = {v: r for v, r in mine.items() if not (self.resume and self._complete(v, int(r.size)))}
        if len(pending) < len(mine):
            done = sorted(set(mine) - set(pending))
            logger.info(f"skipping {len(done)} video(s) already inferred in {self.output_dir}: {', '.join(done)}")
        self._load()
        total = int(sum(r.size for r in pending.values()))
        bar = tqdm(total=total, unit="frame", desc="reduced inference", disable=not (self.progress and total))
        try:
            for n, (vid, rows) in enumerate(pending.items(), 1):
                t = time.perf_counter()

                def callback(inferred: int, frames: int, vid: str = vid, n: int = n) -> None:
                    bar.set_postfix_str(f"video {vid} ({n}/{len(pending)}): {inferred}/{frames} frames inferred")

                probs, inferred = self.infer_video(vid, rows, callback)
                path = self._save(vid, rows, probs, inferred)
                secs = time.perf_counter() - t
                k = int(inferred.sum())
                self.stats[vid] = {"frames": int(rows.size), "inferred": k, "seconds": secs}
                bar.update(int(rows.size))
                logger.info(
                    f"video {vid}: inferred {k} of {rows.size} frames ({100.0 * k / max(rows.size, 1):.1f}%) "
                    f"in {secs:.1f} s: {path}"
                )
        finally:
            bar.close()
            self.predictor.close()
        if world > 1:
            torch.distributed.barrier()
        if self.events_file is None or rank != 0:
            return None
        writer = TemporalEventWriter(
            self.output_dir,
            events_file=self.events_file,
            decoder=self.decoder,
            videos=list(groups),
            report_dir=self.report_dir,
        )
        return writer.write_events()
