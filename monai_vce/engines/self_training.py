"""Self-training test-time adaptation: a mean-teacher fit of a trained frame model to an unseen capsule's frames.

Without labels, an EMA teacher labels each frame's confident classes (hard pseudo-labels from its probabilities on the
frame as is) and the student learns them on a strongly augmented view; only the normalisation layers' affine
parameters and the classifier head train by default, held near their trained values by an L2-SP anchor.
"""

from __future__ import annotations

import copy
import io
import logging
import math
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.modules.batchnorm import _BatchNorm
from torch.utils.data import DataLoader, Dataset

from monai_vce.engines.tta import TTA_VIEWS, tta_view
from monai_vce.handlers.checkpoint import VCECheckpointLoader
from monai_vce.networks.network_utils import unwrap_network
from monai_vce.utils import atomic_write_bytes, seal_torch_bytes

__all__ = ["PARAMETER_SUBSETS", "SelfTraining", "self_train", "strong_view", "trainable_parameters"]

logger = logging.getLogger(__name__)

#: The parameter subsets that can train: normalisation affine parameters plus the classifier head, or everything.
PARAMETER_SUBSETS: tuple[str, ...] = ("norm_and_head", "all")

_NORM_TYPES: tuple[type[nn.Module], ...] = (nn.LayerNorm, _BatchNorm, nn.GroupNorm) + (
    (nn.RMSNorm,) if hasattr(nn, "RMSNorm") else ()
)


def _is_norm(module: nn.Module) -> bool:
    # timm's RmsNorm / LayerNorm2d are not torch subclasses everywhere: their names say what they are
    return isinstance(module, _NORM_TYPES) or type(module).__name__.endswith("Norm")


def trainable_parameters(network: nn.Module, parameters: str = "norm_and_head") -> dict[str, nn.Parameter]:
    """The parameters that self-training updates, by name (as in ``named_parameters()``).

    Args:
        network: the network (a DDP / DataParallel wrapper is looked through).
        parameters: ``"norm_and_head"``: the affine parameters of the normalisation layers (LayerNorm, BatchNorm,
            GroupNorm, RMSNorm) and every parameter of the ``classifier_head`` submodule; ``"all"``: every parameter.

    Raises:
        ValueError: unknown ``parameters``, or ``"norm_and_head"`` on a network without ``classifier_head``.
    """
    if parameters not in PARAMETER_SUBSETS:
        raise ValueError(f"parameters must be one of {PARAMETER_SUBSETS}, got {parameters!r}")
    net = unwrap_network(network)
    if parameters == "all":
        return dict(net.named_parameters())
    if not isinstance(getattr(net, "classifier_head", None), nn.Module):
        raise ValueError(f"{type(net).__name__} has no classifier_head submodule: use parameters='all'")
    ids: set[int] = set()
    for prefix, module in net.named_modules():
        if prefix == "classifier_head" or prefix.startswith("classifier_head.") or _is_norm(module):
            ids.update(id(p) for p in module.parameters(recurse=False))
    return {name: p for name, p in net.named_parameters() if id(p) in ids}


def _frames(batch: Sequence[Mapping[str, Any]]) -> torch.Tensor:
    """Stack the ``image`` of the items (plain tensors: MONAI's metadata is not needed here); labels are never read."""
    return torch.stack([torch.as_tensor(item["image"]).as_subclass(torch.Tensor) for item in batch])


def _to_unit(x: torch.Tensor) -> torch.Tensor:
    # the scaling of FrameInferer, so that the teacher sees what inference shows the network
    return x.float().div_(255.0) if not x.is_floating_point() else x.float()


def strong_view(images: torch.Tensor, generator: torch.Generator, jitter: float = 0.3) -> torch.Tensor:
    """A strongly augmented copy of frames ``(B, 3, H, W)`` in ``[0, 1]``: per frame a random flip / right-angle
    rotation (:data:`~monai_vce.engines.TTA_VIEWS`), brightness, contrast and per-channel colour gain.

    Args:
        images: float frames in ``[0, 1]``, square (a rotation keeps the shape).
        generator: CPU generator drawing the augmentation (seeded by the caller).
        jitter: relative strength of the photometric changes (factors drawn in ``[1 - jitter, 1 + jitter]``).
    """
    b, c = images.shape[0], images.shape[1]
    views = torch.randint(len(TTA_VIEWS), (b,), generator=generator).tolist()
    out = torch.stack([tta_view(images[i], TTA_VIEWS[v]) for i, v in enumerate(views)])

    def factors(*shape: int) -> torch.Tensor:
        u = torch.rand(shape, generator=generator) * 2.0 - 1.0
        return (1.0 + jitter * u).to(out.device, out.dtype)

    out = out * factors(b, 1, 1, 1)
    mean = out.mean(dim=(1, 2, 3), keepdim=True)
    out = (out - mean) * factors(b, 1, 1, 1) + mean
    out = out * factors(b, c, 1, 1) ** 0.5  # colour: a milder gain per channel
    return out.clamp_(0.0, 1.0)


class _DummyEngine:
    """The little of an ignite engine that MONAI's ``CheckpointLoader`` reads (``state.epoch``, ``max_epochs``)."""

    def __init__(self) -> None:
        self.state = SimpleNamespace(epoch=0, max_epochs=None)


def _thresholds(value: Any, name: str) -> torch.Tensor:
    """A threshold or per-class thresholds as a float32 tensor, checked to lie in [0, 1]."""
    if isinstance(value, bool):
        raise ValueError(f"{name} must be a number or numbers in [0, 1], got {value!r}")
    try:
        t = torch.as_tensor(np.asarray(value, dtype=np.float64), dtype=torch.float32)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a number or numbers in [0, 1], got {value!r}") from None
    if t.ndim > 1 or not torch.isfinite(t).all() or (t < 0).any() or (t > 1).any():
        raise ValueError(f"{name} must be a number or one number per class in [0, 1], got {value!r}")
    return t


class SelfTraining:
    """Mean-teacher self-training of a frame classifier on unlabelled target frames, a fixed number of steps.

    Each step draws a random batch of frames (seeded); the teacher (an EMA copy of the student, eval mode) gives
    probabilities on the frames as they are, and entries above ``positive_threshold`` become pseudo-label 1, below
    ``negative_threshold`` 0, the others are left out of the loss. The student sees a strong view (:func:`strong_view`)
    and minimises the masked binary cross-entropy with logits plus ``anchor_weight`` times the squared distance of the
    trained parameters to their starting values (L2-SP; AdamW runs without weight decay, which would pull towards zero
    instead). Only the chosen subset trains; the student's BatchNorm layers keep their stored statistics (augmented
    batches would skew them; :func:`monai_vce.networks.adapt_batchnorm` is the tool for statistics). After each step
    the teacher follows the student by EMA. The teacher's weights are saved to ``output_file`` as a plain state dict,
    sealed and written atomically like the bundle's ``model.pt`` (loadable by
    :class:`~monai_vce.handlers.VCECheckpointLoader`). A call always recomputes (no resume): the result depends on
    the data, which a record could not cheaply fingerprint.

    Frames are scaled to ``[0, 1]`` as :class:`~monai_vce.engines.FrameInferer` does at inference.

    Args:
        network: the student, holding the trained weights (or given ``load_path``); trained in place, the
            ``requires_grad`` flags restored afterwards.
        data: dataset of target frames, items dicts whose ``"image"`` is a ``(3, H, W)`` tensor (``uint8`` or float in
            ``[0, 1]``, square), as the inference dataset yields.
        output_file: where the adapted (teacher's) weights are saved.
        load_path: a checkpoint loaded into ``network`` first (checked as ``VCECheckpointLoader`` does); ``None``:
            ``network`` already holds the weights.
        steps: number of optimisation steps.
        batch_size: frames per step.
        learning_rate: AdamW's learning rate.
        ema_decay: teacher's EMA decay per step, in ``[0, 1)``.
        positive_threshold: teacher probabilities strictly above it are pseudo-label 1: one value, or one per class
            (e.g. a high quantile of the validation scores, whose scale a focal loss leaves far from 0 and 1).
        negative_threshold: teacher probabilities strictly below it are pseudo-label 0 (one value or one per class).
        parameters: ``"norm_and_head"`` or ``"all"`` (see :func:`trainable_parameters`).
        anchor_weight: weight of the L2-SP penalty towards the starting weights (0: none).
        jitter: strength of the photometric augmentation of the student's view, in ``[0, 1)``.
        seed: seed of the batches, the augmentations and dropout (the caller's random state is left as it was).
        device: device of the training; ``None``: that of the network's first parameter.
        num_workers: data loader workers.
        amp: bfloat16 autocast on CUDA.

    Example (bundle JSON)::

        {"_target_": "monai_vce.engines.self_train", "network": "@adapt_network", "load_path": "@model_file",
         "data": "@adapt_dataset", "output_file": "@adapted_model_file", "steps": 200, "device": "@device"}
    """

    def __init__(
        self,
        network: nn.Module,
        data: Dataset,
        output_file: str | Path,
        load_path: str | Path | None = None,
        steps: int = 200,
        batch_size: int = 32,
        learning_rate: float = 1e-3,
        ema_decay: float = 0.99,
        positive_threshold: float | Sequence[float] = 0.9,
        negative_threshold: float | Sequence[float] = 0.1,
        parameters: str = "norm_and_head",
        anchor_weight: float = 0.01,
        jitter: float = 0.3,
        seed: int = 0,
        device: torch.device | str | None = None,
        num_workers: int = 0,
        amp: bool = False,
    ) -> None:
        if not isinstance(network, nn.Module):
            raise TypeError(f"network must be a torch.nn.Module, got {type(network).__name__}")
        if not hasattr(data, "__getitem__") or not hasattr(data, "__len__"):
            raise TypeError(f"data must be a dataset of frame dicts (with len), got {type(data).__name__}")
        for name, value in (("steps", steps), ("batch_size", batch_size), ("seed", seed)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"{name} must be an integer, got {value!r}")
        if steps < 1:
            raise ValueError(f"steps must be at least 1, got {steps}")
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 0:
            raise ValueError(f"num_workers must be an integer >= 0, got {num_workers!r}")
        checks = (
            ("learning_rate", learning_rate, lambda v: 0.0 < v < math.inf, "a finite number > 0"),
            ("ema_decay", ema_decay, lambda v: 0.0 <= v < 1.0, "in [0, 1)"),
            ("anchor_weight", anchor_weight, lambda v: 0.0 <= v < math.inf, "a finite number >= 0"),
            ("jitter", jitter, lambda v: 0.0 <= v < 1.0, "in [0, 1)"),
        )
        for name, number, ok, expected in checks:
            if isinstance(number, bool) or not isinstance(number, (int, float)) or not ok(float(number)):
                raise ValueError(f"{name} must be {expected}, got {number!r}")
        pos, neg = (
            _thresholds(positive_threshold, "positive_threshold"),
            _thresholds(negative_threshold, "negative_threshold"),
        )
        if (neg > pos).any():
            raise ValueError(
                f"negative_threshold ({negative_threshold}) must not exceed positive_threshold ({positive_threshold})"
            )
        trainable_parameters(network, parameters)  # fails now on an unknown subset or a network without head
        if not str(output_file):
            raise ValueError("output_file must be a file path, got an empty string")
        self.network = network
        self.data = data
        self.output_file = Path(output_file)
        self.load_path = None if load_path is None else Path(load_path)
        if self.load_path is not None and self.load_path.resolve() == self.output_file.resolve():
            raise ValueError(f"output_file {self.output_file} is the checkpoint it adapts: give another file")
        self.steps, self.batch_size, self.seed, self.num_workers = steps, batch_size, seed, num_workers
        self.learning_rate, self.ema_decay = float(learning_rate), float(ema_decay)
        self.positive_threshold, self.negative_threshold = pos, neg
        self.parameters, self.anchor_weight, self.jitter = parameters, float(anchor_weight), float(jitter)
        self.device = None if device is None else torch.device(device)
        self.amp = bool(amp)
        #: Filled by a call: ``{"steps", "confident", "seconds", "loss"}`` (share of confident pseudo-labels).
        self.summary: dict[str, float] = {}
        #: The adapted teacher after a call (its weights are those saved), else ``None``.
        self.teacher: nn.Module | None = None

    def _load(self, net: nn.Module, device: torch.device) -> None:
        loader = VCECheckpointLoader(load_path=str(self.load_path), load_dict={"model": net}, map_location=device)
        loader(_DummyEngine())

    def _loader(self, n: int, generator: torch.Generator) -> DataLoader:
        # one random batch per step: a fresh permutation whenever the previous one is used up (no repeats in a batch
        # unless the data is smaller than the batch)
        need = self.steps * self.batch_size
        order: list[int] = []
        while len(order) < need:
            order += torch.randperm(n, generator=generator).tolist()
        return DataLoader(
            self.data,  # type: ignore[arg-type]
            batch_size=self.batch_size,
            sampler=order[:need],
            num_workers=self.num_workers,
            collate_fn=_frames,
        )

    def __call__(self) -> Path:
        """Run the adaptation and save the teacher's weights.

        Returns:
            ``output_file``.

        Raises:
            ValueError: the data is empty, or an item has no ``(3, H, W)`` ``"image"``.
        """
        start = time.perf_counter()
        net = unwrap_network(self.network)
        device = self.device or next((p.device for p in net.parameters()), torch.device("cpu"))
        net.to(device)
        if self.load_path is not None:
            self._load(net, device)
        n = len(self.data)  # type: ignore[arg-type]
        if n == 0:
            raise ValueError("self-training needs target frames, the dataset is empty")
        chosen = trainable_parameters(net, self.parameters)
        flags = {p: p.requires_grad for p in net.parameters()}
        modes = {m: m.training for m in net.modules()}
        devices = [device.index or 0] if device.type == "cuda" else []
        try:
            with torch.random.fork_rng(devices=devices):
                torch.manual_seed(self.seed)
                teacher = self._fit(net, chosen, n, device)
        finally:
            for p, flag in flags.items():
                p.requires_grad_(flag)
            for m, training in modes.items():
                m.training = training
        self.teacher = teacher
        buf = io.BytesIO()
        torch.save({k: v.detach().cpu() for k, v in teacher.state_dict().items()}, buf)
        atomic_write_bytes(self.output_file, seal_torch_bytes(buf.getvalue()))
        self.summary["seconds"] = time.perf_counter() - start
        logger.info(
            "self-training: %d steps, %.1f%% confident pseudo-labels, final loss %.4f, %.1f s -> %s",
            self.steps,
            100.0 * self.summary["confident"],
            self.summary["loss"],
            self.summary["seconds"],
            self.output_file,
        )
        return self.output_file

    def _fit(self, net: nn.Module, chosen: dict[str, nn.Parameter], n: int, device: torch.device) -> nn.Module:
        """The training loop; returns the teacher (the student ``net`` is trained in place)."""
        for p in net.parameters():
            p.requires_grad_(False)
        params = list(chosen.values())
        for p in params:
            p.requires_grad_(True)
        anchors = [p.detach().clone() for p in params]
        teacher = copy.deepcopy(net).eval()
        for p in teacher.parameters():
            p.requires_grad_(False)
        pairs = [(dict(teacher.named_parameters())[name], p) for name, p in chosen.items()]
        optimizer = torch.optim.AdamW(params, lr=self.learning_rate, weight_decay=0.0)
        generator = torch.Generator().manual_seed(self.seed)
        net.train()
        for m in net.modules():
            if isinstance(m, _BatchNorm):
                m.eval()
        use_amp = self.amp and device.type == "cuda"
        confident = total = 0
        loss_value = 0.0
        for batch in self._loader(n, generator):
            if batch.ndim != 4 or batch.shape[1] != 3:
                raise ValueError(f"self-training expects frames (3, H, W), got items of shape {tuple(batch.shape[1:])}")
            weak = _to_unit(batch.to(device, non_blocking=True))
            strong = strong_view(weak, generator, self.jitter)
            with torch.no_grad(), torch.autocast(device.type, dtype=torch.bfloat16, enabled=use_amp):
                probs = torch.sigmoid(teacher(weak).float())
            positive = probs > self.positive_threshold.to(probs.device)
            negative = probs < self.negative_threshold.to(probs.device)
            mask = positive | negative
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=use_amp):
                logits = net(strong).float()
            bce = F.binary_cross_entropy_with_logits(logits, positive.float(), reduction="none")
            loss = (bce * mask).sum() / mask.sum().clamp(min=1)
            if self.anchor_weight > 0:
                loss = loss + self.anchor_weight * sum(
                    ((p - a) ** 2).sum() for p, a in zip(params, anchors, strict=True)
                )
            optimizer.zero_grad(set_to_none=True)
            loss.backward()  # type: ignore[no-untyped-call]
            optimizer.step()
            with torch.no_grad():
                for t, s in pairs:
                    t.lerp_(s, 1.0 - self.ema_decay)
            confident += int(mask.sum())
            total += mask.numel()
            loss_value = float(loss.detach())
        self.summary = {"steps": float(self.steps), "confident": confident / max(total, 1), "loss": loss_value}
        return teacher


def self_train(**kwargs: Any) -> Path:
    """Build a :class:`SelfTraining` from ``kwargs`` and run it (for a bundle run list item).

    Returns:
        the saved file (``output_file``).
    """
    return SelfTraining(**kwargs)()
