"""The per-video driver of reduced inference: a network and a frame dataset in, ``<output_dir>/<video_id>.npz``
out (with the ``inferred`` mask), resumable; :class:`FramePredictor` serves the requested frames. Decoding is
:func:`monai_vce.stages.decode`'s.
"""

from __future__ import annotations

import logging
import numbers
import os
import sys
import time
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from monai.data import Dataset
from monai.utils import IgniteInfo, min_version, optional_import

from monai_vce.data import VCEPrepareBatch, vce_val_transforms, video_rows
from monai_vce.engines import FrameInferer
from monai_vce.events.probabilities import Video, completed_videos, probability_file, save_video_probs
from monai_vce.handlers import all_gather_rows
from monai_vce.labels import NUM_LABELS
from monai_vce.postprocessing import EventDecoder
from monai_vce.utils import check_setting, safe_text, short_repr

from .adaptive import adaptive_inference
from .signature import SIGNATURE_KEY, FrameSignatured

idist, _ = optional_import("ignite", IgniteInfo.OPT_IMPORT_VERSION, min_version, "distributed")

__all__ = [
    "FramePredictor",
    "ReducedInference",
    "REDUCTION_KEYS",
    "check_reduction",
    "is_reduced",
    "reduction_tag",
    "reduced_source",
    "resume_sources",
]

PathLike = str | os.PathLike
logger = logging.getLogger(__name__)


#: the keys of the bundle's ``reduction`` (the keyword arguments of :func:`reduction_tag`)
REDUCTION_KEYS = ("stride", "budget", "refine", "margin", "duplicate_tolerance", "novelty_tolerance", "options")

# the further keyword arguments of adaptive_inference that ``reduction#options`` may set: (kind, range or choices)
_OPTIONS: dict[str, tuple[str, dict[str, Any]]] = {
    "presence_margin": ("number", {"minimum": 0, "optional": True}),
    "score_tolerance": ("number", {"minimum": 0, "optional": True}),
    "transition_window": ("int", {"minimum": 0, "optional": True}),
    "max_rounds": ("int", {"minimum": 0, "optional": True}),
    "max_reuse": ("int", {"minimum": 1}),
    "interpolation": ("str", {"choices": ("logit", "linear", "nearest")}),
}


def _check_budget(budget: Any, name: str = "reduction#budget") -> int | float | None:
    if budget is None:
        return None
    if isinstance(budget, bool) or not isinstance(budget, numbers.Real):
        raise ValueError(
            f"setting {name!r} must be an int (frames) >= 1, a fraction in (0, 1] or null, got {short_repr(budget)}"
        )
    if isinstance(budget, numbers.Integral):
        return check_setting(name, budget, "int", minimum=1)
    value = float(budget)
    if not (0.0 < value <= 1.0):  # also refuses NaN
        raise ValueError(f"setting {name!r}: a fractional budget must be in (0, 1], got {short_repr(budget)}")
    return value


def check_reduction(
    stride: Any = 1,
    budget: Any = None,
    refine: Any = True,
    margin: Any = 0.3,
    duplicate_tolerance: Any = 0.0,
    options: Any = None,
    novelty_tolerance: Any = 0.0,
) -> dict[str, Any]:
    """Validate the reduction settings (the bundle's ``reduction``) before any frame is inferred.

    Types are strict (``stride`` ``1.9`` or ``true`` is not an integer, ``refine`` ``"abc"`` is not a boolean;
    the strings ``"true"``/``"false"`` of a command line are), numbers finite and in range, ``options`` keys those
    of :func:`~monai_vce.inference.adaptive_inference` listed in ``_OPTIONS``.

    Returns:
        The settings, normalised, as keyword arguments of :func:`reduction_tag`.

    Raises:
        ValueError: one line naming the setting (``reduction#stride``, ...).
    """
    if options is None:
        options = {}
    if not isinstance(options, Mapping):
        raise ValueError(f"setting 'reduction#options' must be a mapping, got {short_repr(options)}")
    opts: dict[str, Any] = {}
    for key, value in options.items():
        if key not in _OPTIONS:
            raise ValueError(
                f"setting 'reduction#options' has an unknown key {short_repr(key)}; known: {', '.join(_OPTIONS)}"
            )
        kind, kw = _OPTIONS[key]
        opts[key] = check_setting(f"reduction#options#{key}", value, kind, **kw)
    return {
        "stride": check_setting("reduction#stride", stride, "int", minimum=1),
        "budget": _check_budget(budget),
        "refine": check_setting("reduction#refine", refine, "bool"),
        "margin": check_setting("reduction#margin", margin, "number", minimum=0),
        "duplicate_tolerance": check_setting("reduction#duplicate_tolerance", duplicate_tolerance, "number", minimum=0),
        "options": opts,
        "novelty_tolerance": check_setting("reduction#novelty_tolerance", novelty_tolerance, "number", minimum=0),
    }


def is_reduced(
    stride: int, budget: int | float | None = None, duplicate_tolerance: float = 0.0, novelty_tolerance: float = 0.0
) -> bool:
    """Whether these settings infer fewer frames than full inference (stride above 1, a budget, or
    near-duplicate skipping); refinement settings and the novelty guard alone change nothing.

    Raises:
        ValueError: a setting of the wrong type or out of range (:func:`check_reduction`), so that a bad value
            never falls back to full inference.
    """
    s = check_reduction(stride, budget, duplicate_tolerance=duplicate_tolerance, novelty_tolerance=novelty_tolerance)
    return s["stride"] != 1 or s["budget"] is not None or s["duplicate_tolerance"] > 0


def reduction_tag(
    stride: int,
    budget: int | float | None = None,
    refine: bool = True,
    margin: float = 0.3,
    duplicate_tolerance: float = 0.0,
    options: Mapping[str, Any] | None = None,
    novelty_tolerance: float = 0.0,
) -> str:
    """The reduction settings as a short string (``""`` for full inference, see :func:`is_reduced`); a novelty
    guard adds ``novelty=T`` (no key when off, so the tags of runs without it are unchanged).

    Example: ``reduced(stride=8,budget=None,refine=True,margin=0.3,dup=0,novelty=4,score_tolerance=0.2)``.

    Raises:
        ValueError: a bad setting (:func:`check_reduction`).
    """
    s = check_reduction(stride, budget, refine, margin, duplicate_tolerance, options, novelty_tolerance)
    if not is_reduced(s["stride"], s["budget"], s["duplicate_tolerance"]):
        return ""
    novelty = f",novelty={s['novelty_tolerance']:g}" if s["novelty_tolerance"] > 0 else ""
    extra = "".join(f",{k}={v}" for k, v in sorted(s["options"].items()))
    return (
        f"reduced(stride={s['stride']},budget={s['budget']},refine={s['refine']},margin={s['margin']:g},"
        f"dup={s['duplicate_tolerance']:g}{novelty}{extra})"
    )


def reduced_source(source: str, tag: str) -> str:
    """The ``source`` stored in the probability files of a reduced inference: the model's source and the
    reduction settings (``tag``, from :func:`reduction_tag`), ``source`` itself for full inference.

    Full inference (:func:`monai_vce.events.pending_frames` with the model's source) therefore never reuses the
    files of a reduced run, and a reduced run reuses those of full inference and of a reduced run with the same
    settings only.
    """
    return f"{source}|{tag}" if tag else source


def resume_sources(source: str, reduction: Mapping[str, Any] | None = None) -> list[str]:
    """The ``source`` values of the probability files that a run with these reduction settings reuses on resume:
    full inference's (``source``) and, for a reduced run, its own (:func:`reduced_source`).

    Args:
        source: the model's source (:func:`monai_vce.events.model_fingerprint`).
        reduction: the keyword arguments of :func:`reduction_tag` (the bundle's ``reduction`` keys); ``None``:
            full inference.

    Example (bundle JSON, the frames still to infer)::

        "$monai_vce.workflows.pending_frames(@datalist, @probs_dir, resume=@resume,
            source=monai_vce.inference.resume_sources(@probs_source, @reduction))"
    """
    if reduction and not isinstance(reduction, Mapping):
        raise ValueError(
            f"setting 'reduction' must be a mapping of {', '.join(REDUCTION_KEYS)}, got {short_repr(reduction)}"
        )
    unknown = sorted(set(reduction or {}) - set(REDUCTION_KEYS))
    if unknown:
        raise ValueError(f"setting 'reduction' has an unknown key {unknown[0]!r}; known: {', '.join(REDUCTION_KEYS)}")
    tag = reduction_tag(**reduction) if reduction else ""
    return [source, reduced_source(source, tag)] if tag else [source]


class _RowSampler(torch.utils.data.Sampler):
    """A sampler yielding the rows it was last pointed at (read in the main process at every pass)."""

    def __init__(self, rows: Sequence[int] = ()) -> None:
        self.rows: list[int] = list(rows)

    def __iter__(self) -> Iterator[int]:
        return iter(self.rows)

    def __len__(self) -> int:
        return len(self.rows)


class _Keys(torch.utils.data.Dataset):
    """The items of a dataset (optionally through one more transform), keeping only the keys a pass collates."""

    def __init__(self, dataset: Any, keys: Sequence[str], transform: Callable | None = None) -> None:
        self.dataset = dataset
        self.keys = tuple(keys)
        self.transform = transform

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, i: int) -> dict[Hashable, Any]:
        item = self.dataset[i]
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
    """``predict(rows)`` over the frames of a dataset: rows are positions in the dataset.

    Args:
        network: the classifier (``(B, 3, S, S)`` images in ``[0, 1]`` -> ``(B, 17)`` logits).
        data: a dataset of frame dicts, transformed (e.g. the bundle's :class:`~monai_vce.data.VideoFrameDataset`;
            its ``data`` attribute holds the datalist), or a datalist of frame dicts (``image`` paths of frame
            images), then served by a MONAI ``Dataset`` with ``transform``.
        transform: the transform of a datalist's frame dicts (decoding and resizing); ``None`` builds
            :func:`monai_vce.data.vce_val_transforms` at ``image_size``. Unused with a dataset.
        image_size: frame size when ``transform`` is ``None``.
        batch_size: frames per network call.
        num_workers: DataLoader workers (kept alive between calls).
        device: where the network runs; the network's own device when ``None``.
        inferer: called as ``inferer(images, network)``; :class:`monai_vce.engines.FrameInferer` when ``None``.
        prepare_batch: moves a batch to the device and scales it; :class:`monai_vce.data.VCEPrepareBatch` when
            ``None``.
        amp: run the network under autocast with ``amp_dtype``.
        amp_dtype: autocast dtype (``torch.bfloat16`` or its name).
        image_key: key of the frames in the transformed dicts.
        activation: turns logits into probabilities (``torch.sigmoid`` when ``None``).

    Raises:
        ValueError: ``batch_size`` below 1, or a dataset without the ``data`` attribute of MONAI datasets.

    Example::

        predict = FramePredictor(network, video_items, batch_size=64)
        probs = predict(np.array([0, 8, 16]))          # (3, 17) float32
    """

    def __init__(
        self,
        network: torch.nn.Module,
        data: torch.utils.data.Dataset | Sequence[Mapping[str, Any]],
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
        if isinstance(data, torch.utils.data.Dataset):
            if not isinstance(getattr(data, "data", None), Sequence):
                raise ValueError(
                    f"FramePredictor: the dataset {type(data).__name__} has no 'data' datalist (a MONAI Dataset has)"
                )
            self.dataset: Any = data
        else:
            items = list(data)
            self.dataset = Dataset(items, transform if transform is not None else vce_val_transforms(image_size))
        self.network = network
        self.device = torch.device(device) if device is not None else next(network.parameters()).device
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
        self._signature_sampler = _RowSampler()
        self._signature_loaders: dict[int, torch.utils.data.DataLoader] = {}
        self.frames_inferred = 0
        self.seconds = 0.0

    @property
    def data(self) -> Sequence[Mapping[str, Any]]:
        """The frame dicts of the datalist (before the transform), one per row."""
        return self.dataset.data

    def _get_loader(self) -> torch.utils.data.DataLoader:
        if self._loader is None:
            pin = self.device.type == "cuda"
            dataset = _Keys(self.dataset, (self.image_key,))
            self._loader = _loader(dataset, self._sampler, self.batch_size, self.num_workers, pin)
        return self._loader

    def __call__(self, rows: np.ndarray) -> np.ndarray:
        rows = np.asarray(rows, dtype=np.int64).reshape(-1)
        if rows.size and (rows.min() < 0 or rows.max() >= len(self.dataset)):
            raise ValueError(
                f"FramePredictor: rows must lie in [0, {len(self.dataset)}), got {rows.min()}..{rows.max()}"
            )
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

    def signatures(self, rows: np.ndarray | None = None, size: int = 16) -> np.ndarray:
        """``(len(rows), size * size)`` ``uint8`` signatures (:class:`~monai_vce.inference.FrameSignatured`) of
        the frames ``rows`` (all frames when ``None``), computed in the workers (persistent across calls) from
        the dataset's frames."""
        rows = np.arange(len(self.dataset)) if rows is None else np.asarray(rows, dtype=np.int64).reshape(-1)
        loader = self._signature_loaders.get(size)
        if loader is None:
            dataset = _Keys(self.dataset, (SIGNATURE_KEY,), FrameSignatured(self.image_key, size=size))
            loader = _loader(dataset, self._signature_sampler, self.batch_size, self.num_workers, False)
            self._signature_loaders[size] = loader
        self._signature_sampler.rows = rows.tolist()
        parts = [np.asarray(b[SIGNATURE_KEY]) for b in loader]
        return np.concatenate(parts) if parts else np.zeros((0, size * size), np.uint8)

    def close(self) -> None:
        """Stop the DataLoader workers."""
        self._loader = None
        self._signature_loaders.clear()


def _video_frames(data: Sequence[Mapping[str, Any]]) -> dict[str, np.ndarray]:
    """``{video_id: rows of its frames in data, in frame_index order}``, videos in natural id order.

    Raises:
        ValueError: a ``frame_index`` appears twice in a video (the message names the video and the frame).
    """
    index = np.array([int(d["frame_index"]) for d in data], dtype=np.int64)
    out = {}
    for vid, rows in video_rows(data).items():
        rows = rows[np.argsort(index[rows], kind="stable")]
        dup = np.flatnonzero(np.diff(index[rows]) == 0)
        if dup.size:
            raise ValueError(f"video {vid!r}: frame_index {int(index[rows[dup[0]]])} appears twice in the datalist")
        out[vid] = rows
    return out


class ReducedInference:
    """Reduced inference over a frame dataset, video by video, into resumable per-video probability files.

    Args:
        network: the classifier, weights loaded (or loaded by ``load_handlers``).
        data: the frames: a dataset of frame dicts (the bundle's inference ``dataset``) or a datalist (see
            :class:`FramePredictor`); every frame dict has ``video_id``, ``frame_index`` (and ``frame_number``).
        output_dir: folder of the per-video ``.npz`` probability files.
        decoder: the event decoder (``EventDecoder``, parameters, a ``decoder.json`` path or ``None``) the
            refinement aims at (the run's decode stage decodes the files with the same parameters).
        stride, budget, refine, margin: see :func:`~monai_vce.inference.adaptive_inference` (``budget`` per
            video; a float is a fraction of each video).
        duplicate_tolerance: near-duplicate skipping tolerance (``0``: off); the signatures of every frame of
            the video are computed first (each frame is decoded once more).
        novelty_tolerance: novelty guard tolerance (``0``: off; see
            :func:`~monai_vce.inference.adaptive_inference`); needs the signatures too.
        options: further keyword arguments of :func:`~monai_vce.inference.adaptive_inference` (e.g.
            ``score_tolerance``, ``transition_window``, ``max_rounds``, ``interpolation``, ``max_reuse``).
        signature_size: signature thumbnail side.
        transform, image_size, batch_size, num_workers, device, inferer, prepare_batch, amp, amp_dtype:
            see :class:`FramePredictor`.
        compile: run the network through ``torch.compile``.
        resume: skip videos whose probability file is complete and was written from ``source`` by full
            inference or by reduced inference with these settings (:func:`reduced_source`).
        source: what the probabilities come from (e.g. :func:`monai_vce.events.model_fingerprint`).
        refiner: an optional temporal refiner of probabilities (``inputs="probs"``, e.g.
            :func:`monai_vce.temporal.load_refiner`): the refinement aims at the events of its refined
            probabilities, which the run's refine stage writes; the files hold the frame model's probabilities.
        features: the run asks for per-frame features (``write_features``): refused by a reduced run, which
            infers some frames only.
        load_handlers: callables run once with a bare ignite engine before the first video (e.g. a
            :class:`monai_vce.handlers.VCECheckpointLoader`).
        progress: draw a progress bar on a terminal (frames of the videos done; frames inferred vs frames of
            the current video); a line per video and a summary are logged either way.
        frame_rates: ``{video_id: frames per second}`` recorded in each file
            (:func:`monai_vce.data.video_frame_rates`); read on first use.

    Example::

        ReducedInference(network, datalist, "eval/probs", decoder="models/decoder.json", stride=8).run()
        monai_vce.stages.decode("eval/probs", "eval/events.json", decoder="models/decoder.json")
    """

    def __init__(
        self,
        network: torch.nn.Module,
        data: torch.utils.data.Dataset | Sequence[Mapping[str, Any]],
        output_dir: PathLike,
        decoder: Any = None,
        stride: int = 8,
        budget: int | float | None = None,
        refine: bool = True,
        margin: float = 0.3,
        duplicate_tolerance: float = 0.0,
        options: Mapping[str, Any] | None = None,
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
        compile: bool = False,
        resume: bool = True,
        source: str = "",
        refiner: Any = None,
        features: bool = False,
        load_handlers: Sequence[Callable[[Any], Any]] = (),
        progress: bool = True,
        frame_rates: Mapping[str, float | None] | None = None,
        novelty_tolerance: float = 0.0,
    ) -> None:

        # every setting checked before the network, the decoder or a frame is touched
        checked = check_reduction(stride, budget, refine, margin, duplicate_tolerance, options, novelty_tolerance)
        self.output_dir = check_setting("output_dir", output_dir, "path")
        self.options = checked["options"]
        self.settings: dict[str, Any] = {k: checked[k] for k in ("stride", "budget", "refine", "margin")}
        self.duplicate_tolerance = checked["duplicate_tolerance"]
        self.novelty_tolerance = checked["novelty_tolerance"]
        self.signature_size = check_setting("signature_size", signature_size, "int", minimum=1, maximum=256)
        batch_size = check_setting("batch_size", batch_size, "int", minimum=1, maximum=1 << 20)
        num_workers = check_setting("num_workers", num_workers, "int", minimum=0, maximum=1024)
        amp, compile = check_setting("amp", amp, "bool"), check_setting("compile", compile, "bool")
        resume, progress = check_setting("resume", resume, "bool"), check_setting("progress", progress, "bool")
        self.decoder = decoder if isinstance(decoder, EventDecoder) else EventDecoder(decoder)
        self.network = network
        # the compiled wrapper shares the module's parameters: weights loaded later (load_handlers) are used
        runnable: Any = torch.compile(network) if compile else network
        self.predictor = FramePredictor(
            runnable,
            data,
            transform=transform,
            image_size=image_size,
            batch_size=batch_size,
            num_workers=num_workers,
            device=device if device is not None else next(network.parameters()).device,
            inferer=inferer,
            prepare_batch=prepare_batch,
            amp=amp,
            amp_dtype=amp_dtype,
        )
        self.resume = bool(resume)
        self.source = str(source)
        #: the reduction settings stored in every file's ``source`` (``""``: full inference)
        self.tag = reduction_tag(**checked)
        self.refiner = refiner
        self.features = check_setting("write_features", features, "bool")
        self.load_handlers = list(load_handlers)
        self.progress = bool(progress)
        self.frame_rates = frame_rates
        #: per video of this rank: frames, frames inferred, seconds (filled by :meth:`run`)
        self.stats: dict[str, dict[str, float]] = {}

    @property
    def reduced(self) -> bool:
        """Whether the settings infer fewer frames than full inference (:func:`is_reduced`)."""
        return bool(self.tag)

    @property
    def stored_source(self) -> str:
        """The ``source`` written into the files: the model's and the reduction settings."""
        return reduced_source(self.source, self.tag)

    @property
    def probs_transform(self) -> Callable[[np.ndarray], np.ndarray] | None:
        """What the refinement aims through before decoding: the refiner's ``refine`` (``None`` without one)."""
        return None if self.refiner is None else self.refiner.refine

    def _check_inputs(self) -> None:
        """Refuse, in one line, a run that needs what reduced inference does not write: per-frame features (for the
        files, or as the inputs of its temporal refiner)."""
        inputs = getattr(self.refiner, "inputs", "probs") if self.refiner is not None else "probs"
        if self.features or inputs != "probs":
            need = "write_features" if inputs == "probs" else f"a temporal refiner with inputs={inputs!r}"
            raise ValueError(
                f"reduced inference ({self.tag}) writes no per-frame features, but the run asks for them ({need}): "
                "infer every frame (stride 1, no budget, no duplicate skipping) or use a refiner fitted on probabilities"
            )

    def _load(self) -> None:
        if not self.load_handlers:
            return
        from ignite.engine import Engine

        engine = Engine(lambda e, b: None)
        for handler in self.load_handlers:
            handler(engine)

    def infer_video(
        self, vid: str, rows: np.ndarray, callback: Callable[[int, int], Any] | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Reduced inference of one video (``rows``: its frames' positions in the dataset, in frame order).

        Returns:
            ``(probs (T, 17) float32, inferred (T,) bool)``.
        """
        signatures = None
        if self.duplicate_tolerance > 0 or self.novelty_tolerance > 0:
            signatures = self.predictor.signatures(rows, size=self.signature_size)
        return adaptive_inference(
            lambda r: self.predictor(rows[r]),
            int(rows.size),
            self.decoder,
            signatures=signatures,
            duplicate_tolerance=self.duplicate_tolerance,
            novelty_tolerance=self.novelty_tolerance,
            probs_transform=self.probs_transform,
            callback=callback,
            video_id=vid,
            **self.settings,
            **self.options,
        )

    def _save(self, vid: str, rows: np.ndarray, probs: np.ndarray, inferred: np.ndarray) -> None:
        items = [self.predictor.data[i] for i in rows.tolist()]
        index = np.array([int(d["frame_index"]) for d in items], dtype=np.int64)
        number = np.array([int(d.get("frame_number", d["frame_index"])) for d in items], dtype=np.int64)
        rate = None if self.frame_rates is None else self.frame_rates.get(vid)
        video = Video(vid, probs, index, number, inferred=inferred, frame_rate=rate)
        save_video_probs(probability_file(self.output_dir, vid), video, source=self.stored_source)

    def run(self) -> Path:
        """Infer every pending video of this rank and write its file; in a distributed run, wait for every rank.

        Returns:
            ``output_dir``, the folder the decode stage reads.

        Raises:
            ValueError: a reduced run asked for per-frame features (see ``features`` and ``refiner``).
        """
        from tqdm.auto import tqdm

        if self.reduced:
            self._check_inputs()
        data = self.predictor.data
        groups = _video_frames(data)
        rank, world = idist.get_rank(), idist.get_world_size()
        mine = {v: r for i, (v, r) in enumerate(groups.items()) if i % world == rank}
        done: set[str] = set()
        if self.resume and mine:
            accepted = {self.source, self.stored_source}  # the rule of resume_sources, which the bundle filters with
            done = set(
                completed_videos([data[i] for r in mine.values() for i in r.tolist()], self.output_dir, accepted)
            )
        pending = {v: r for v, r in mine.items() if v not in done}
        if done:
            logger.info(
                f"skipping {len(done)} video(s) already inferred in {safe_text(self.output_dir)}: {', '.join(safe_text(v) for v in sorted(done))}"
            )
        self._load()
        t0 = time.perf_counter()
        total = int(sum(r.size for r in pending.values()))
        show = self.progress and sys.stderr.isatty() and total > 0
        bar = tqdm(total=total, unit="frame", desc="reduced inference", disable=not show, dynamic_ncols=True)
        try:
            for n, (vid, rows) in enumerate(pending.items(), 1):
                t = time.perf_counter()

                def callback(inferred: int, frames: int, vid: str = vid, n: int = n) -> None:
                    bar.set_postfix_str(
                        f"video {safe_text(vid)} ({n}/{len(pending)}): {inferred}/{frames} frames inferred"
                    )

                probs, inferred = self.infer_video(vid, rows, callback)
                self._save(vid, rows, probs, inferred)
                secs = time.perf_counter() - t
                k = int(inferred.sum())
                self.stats[vid] = {"frames": int(rows.size), "inferred": k, "seconds": secs}
                bar.update(int(rows.size))
                logger.info(
                    f"video {safe_text(vid)}: inferred {k} of {rows.size} frames ({100.0 * k / max(rows.size, 1):.1f}%) "
                    f"in {secs:.1f} s"
                )
        finally:
            bar.close()
            self.predictor.close()
        self._summary(time.perf_counter() - t0)
        if world > 1:
            idist.barrier()
        return Path(self.output_dir)

    def _summary(self, seconds: float) -> None:
        """Log the frames inferred vs the frames of the videos of every rank (gathered) on rank 0."""
        counts = np.array([[s["frames"], s["inferred"]] for s in self.stats.values()], dtype=np.int64).reshape(-1, 2)
        (counts,) = all_gather_rows(counts)
        if idist.get_rank() != 0 or not counts.size:
            return
        frames, inferred = (int(x) for x in counts.sum(0))
        logger.info(
            f"reduced inference: inferred {inferred} of {frames} frames ({100.0 * inferred / max(frames, 1):.1f}%) "
            f"of {counts.shape[0]} video(s) in {seconds:.1f} s ({frames / max(seconds, 1e-9):.1f} frames/s)"
        )
