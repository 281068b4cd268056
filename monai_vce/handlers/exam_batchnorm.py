"""Per-exam AdaBN in an evaluator: before the first batch of each exam, the network's BatchNorm statistics are
re-estimated on frames of that exam (:func:`monai_vce.networks.adabn.adapt_batchnorm`), so that a capsule unseen
in training is normalised with its own statistics; the stored statistics come back when the run ends.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.nn as nn
from monai.utils import IgniteInfo, min_version, optional_import

from monai_vce.networks.adabn import adapt_batchnorm, batchnorm_layers, batchnorm_state, restore_batchnorm
from monai_vce.networks.network_utils import unwrap_network

if TYPE_CHECKING:
    from ignite.engine import Engine, Events
else:
    Engine, _ = optional_import("ignite.engine", IgniteInfo.OPT_IMPORT_VERSION, min_version, "Engine")
    Events, _ = optional_import("ignite.engine", IgniteInfo.OPT_IMPORT_VERSION, min_version, "Events")

__all__ = ["ExamBatchNormHandler", "require_full_inference"]

logger = logging.getLogger(__name__)


def require_full_inference(reduced_inference: Any, enabled: bool = True) -> Any:
    """``reduced_inference`` when its settings do not reduce (or ``enabled`` is false); otherwise a one-line error:
    per-exam AdaBN is a handler of the full-inference evaluator, and reduced inference would run without it.

    Example (bundle JSON)::

        "infer#reduced_inference": "$monai_vce.handlers.exam_batchnorm.require_full_inference(@reduced_inference)"
    """
    if enabled and getattr(reduced_inference, "reduced", False):
        raise ValueError(
            "per-exam AdaBN (adabn.json) runs with full inference only; set reduction#stride 1 and "
            "reduction#budget null, or leave adabn.json out"
        )
    return reduced_inference


class ExamBatchNormHandler:
    """Ignite handler: re-estimate the network's BatchNorm statistics on each exam before predicting it (AdaBN).

    At each iteration it reads the batch's video ids (``engine.state.batch[video_key]``). When the video changes,
    the statistics stored when the run started are put back, then re-estimated from up to ``frames_per_exam``
    frames taken evenly over that video's items of ``dataset`` (transformed as the loader's frames, prepared by the
    engine's ``prepare_batch``, in batches of ``batch_size``, without gradients, every module but the BatchNorm
    layers in eval mode). The video's predictions then use them. When the run completes, terminates or fails,
    the stored statistics and the modules' train / eval modes are restored.

    Every batch must hold the frames of one video: load with :class:`monai_vce.data.VideoBatchSampler`.

    Args:
        dataset: the evaluator's dataset (indexable, with the datalist as ``data``).
        frames_per_exam: the most frames of a video the statistics are estimated from.
        batch_size: frames per forward pass of the estimation.
        modules: adapt only the BatchNorm layers under these submodules (e.g. ``["head"]``); ``None``: all.
        momentum: weight of the exam's statistics (see :func:`~monai_vce.networks.adabn.adapt_batchnorm`).
        enabled: ``False`` attaches nothing (the evaluator predicts with the stored statistics).
        network: the network to adapt (checked at ``attach``); ``None``: the engine's ``network``.
        video_key: the key of the video ids in the datalist items and the batches.
        image_key: the key of the frames in the dataset's items.

    Example (bundle JSON)::

        {"_target_": "monai_vce.handlers.ExamBatchNormHandler", "dataset": "@dataset", "network": "@network"}
    """

    def __init__(
        self,
        dataset: Any,
        frames_per_exam: int = 256,
        batch_size: int = 64,
        modules: Sequence[str] | None = None,
        momentum: float | None = None,
        enabled: bool = True,
        network: nn.Module | None = None,
        video_key: str = "video_id",
        image_key: str = "image",
    ) -> None:
        for name, value in (("frames_per_exam", frames_per_exam), ("batch_size", batch_size)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 2:
                raise ValueError(f"{name} must be an integer >= 2 (BatchNorm statistics need 2 frames), got {value!r}")
        if momentum is not None and not 0.0 <= float(momentum) <= 1.0:
            raise ValueError(f"momentum must be None or in [0, 1], got {momentum!r}")
        self.dataset = dataset
        self.frames_per_exam = frames_per_exam
        self.batch_size = batch_size
        self.modules = None if modules is None else ([modules] if isinstance(modules, str) else list(modules))
        self.momentum = momentum
        self.enabled = bool(enabled)
        self.network = network
        self.video_key = video_key
        self.image_key = image_key
        #: ids of the videos adapted in this run, in order
        self.adapted: list[str] = []
        self._state: dict[str, dict[str, Any]] | None = None
        self._modes: dict[nn.Module, bool] = {}
        self._video: Any = None
        self._indices: dict[str, list[int]] | None = None

    def _check(self, network: nn.Module) -> None:
        if not batchnorm_layers(network, self.modules):
            where = "" if self.modules is None else f" under {self.modules}"
            raise ValueError(
                f"per-exam AdaBN: {type(unwrap_network(network)).__name__} has no BatchNorm layers{where}; "
                "train with head_batch_norm true (and infer with it), or leave adabn.json out"
            )

    def _network(self, engine: Engine) -> nn.Module:
        network = self.network if self.network is not None else getattr(engine, "network", None)
        if not isinstance(network, nn.Module):
            raise ValueError(f"per-exam AdaBN needs a network (a MONAI evaluator's, or network=...), got {network!r}")
        return network

    def attach(self, engine: Engine) -> None:
        """Register the handler on an evaluator (MONAI's evaluators set ``engine.network`` after their handlers are
        attached: without ``network`` the check waits for the run's start)."""
        if not self.enabled:
            return
        if self.network is not None:
            self._check(self.network)
        engine.add_event_handler(Events.STARTED, self.started)
        engine.add_event_handler(Events.ITERATION_STARTED, self)
        engine.add_event_handler(Events.COMPLETED, self.restore)
        engine.add_event_handler(Events.TERMINATE, self.restore)
        engine.add_event_handler(Events.EXCEPTION_RAISED, self.exception_raised)
        # first in line: a handler before it that re-raises (the progress bar's) would skip the restore
        handlers = engine._event_handlers[Events.EXCEPTION_RAISED]
        handlers.insert(0, handlers.pop())

    def started(self, engine: Engine) -> None:
        """Check the network; the stored statistics are saved at the first batch (after the checkpoint is loaded)."""
        self._check(self._network(engine))
        self.restore(engine)  # a previous run that ended without its restore
        self._indices = None
        self.adapted = []

    def _video_indices(self) -> dict[str, list[int]]:
        if self._indices is None:
            data = getattr(self.dataset, "data", self.dataset)
            indices: dict[str, list[int]] = {}
            for i, item in enumerate(data):
                indices.setdefault(str(item[self.video_key]), []).append(i)
            self._indices = indices
        return self._indices

    def _batch_video(self, engine: Engine) -> str:
        batch: Any = engine.state.batch
        try:
            ids = batch[self.video_key]
        except (KeyError, TypeError, IndexError):
            raise ValueError(f"per-exam AdaBN: the batch has no {self.video_key!r} (a dict batch is needed)") from None
        if isinstance(ids, torch.Tensor):  # numeric ids, collated into a tensor
            ids = ids.reshape(-1).tolist()
        elif isinstance(ids, (str, bytes)) or not isinstance(ids, Sequence):
            ids = [ids]
        videos = list(dict.fromkeys(str(v) for v in ids))
        if len(videos) != 1:
            shown = ", ".join(videos[:3]) + (", ..." if len(videos) > 3 else "")
            raise ValueError(
                f"per-exam AdaBN: a batch holds frames of {len(videos)} videos ({shown}); load with "
                "monai_vce.data.VideoBatchSampler so that each batch is one video's"
            )
        return videos[0]

    def _frame_batches(self, engine: Engine, indices: list[int]) -> Iterator[torch.Tensor]:
        for b in range(0, len(indices), self.batch_size):
            frames = [torch.as_tensor(self.dataset[i][self.image_key]) for i in indices[b : b + self.batch_size]]
            batch = {self.image_key: torch.stack(frames)}
            prepare = getattr(engine, "prepare_batch", None)
            if prepare is None:  # a plain ignite engine: the frames as they are
                yield batch[self.image_key]
                continue
            # the engine's own preparation (uint8 -> [0, 1] on the device), as for the frames it predicts
            prepared = prepare(batch, getattr(engine.state, "device", None), getattr(engine, "non_blocking", False))
            yield prepared[0] if isinstance(prepared, (tuple, list)) else prepared

    def __call__(self, engine: Engine) -> None:
        """At an iteration's start: check the batch is one video's, and adapt to a new video."""
        video = self._batch_video(engine)
        if video == self._video:
            return
        network = self._network(engine)
        if self._state is None:
            self._state = batchnorm_state(network)
            self._modes = {m: m.training for m in unwrap_network(network).modules()}
        else:
            restore_batchnorm(network, self._state)  # each exam adapts from the trained statistics
        items = self._video_indices().get(video)
        if not items:
            raise ValueError(f"per-exam AdaBN: video {video!r} of the batch has no frames in the handler's dataset")
        picks = np.unique(np.linspace(0, len(items) - 1, min(len(items), self.frames_per_exam)).round().astype(int))
        chosen = [items[int(p)] for p in picks]
        if len(chosen) < 2:
            raise ValueError(f"per-exam AdaBN: video {video!r} has {len(chosen)} frame; its statistics need 2")
        device = getattr(engine.state, "device", None)
        autocast: Any = contextlib.nullcontext()
        if getattr(engine, "amp", False) and isinstance(device, torch.device):
            autocast = torch.autocast(device.type, **(getattr(engine, "amp_kwargs", None) or {}))
        with autocast:  # the statistics of the inputs the evaluator's forward pass will see
            adapt_batchnorm(network, self._frame_batches(engine, chosen), momentum=self.momentum, modules=self.modules)
        self._video = video
        self.adapted.append(video)
        logger.debug("per-exam AdaBN: video %s, statistics from %d of its %d frames", video, len(chosen), len(items))

    def restore(self, engine: Engine | None = None) -> None:
        """Put back the statistics and modes saved at the run's first batch (nothing when none were saved)."""
        if self._state is not None:
            network = self.network if self.network is not None else getattr(engine, "network", None)
            if isinstance(network, nn.Module):
                restore_batchnorm(network, self._state)
                for m, training in self._modes.items():
                    m.training = training
        self._state, self._modes, self._video = None, {}, None

    def exception_raised(self, engine: Engine, e: Exception) -> None:
        """Restore, then re-raise: ignite swallows an exception once any handler listens for it."""
        self.restore(engine)
        raise e
