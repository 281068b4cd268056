"""The training iteration: uint8 frames to float on the device, multi-label mixup, the dual-path loss, AMP."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np
import torch
from ignite.engine import Events
from monai.engines import SupervisedTrainer
from monai.engines.utils import IterationEvents, default_metric_cmp_fn
from monai.engines.workflow import Workflow
from monai.inferers import Inferer
from monai.transforms import Randomizable, Transform
from monai.utils.enums import CommonKeys as Keys
from torch.optim.optimizer import Optimizer
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

from monai_vce.data.frames import VCEPrepareBatch
from monai_vce.networks.network_utils import unwrap_network

__all__ = ["MultiLabelMixUp", "VCETrainer", "check_contrastive_path", "forward_paths"]

_AMP_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16}


class MultiLabelMixUp(Randomizable):
    """Batch-level mixup (Zhang et al., ICLR 2018) of images and multi-label targets.

    Per sample ``lam_i ~ Beta(alpha, alpha)`` and a random permutation ``j``: ``lam_i * x_i + (1 - lam_i) * x_j`` and
    the same soft mix of the targets; with probability ``1 - prob`` the batch passes unchanged. Why not MONAI's
    ``MixUp``: ``docs/design/training.md``.

    Args:
        alpha: Beta distribution parameter; ``0`` disables mixup.
        prob: probability that a batch is mixed.
        per_batch: draw one ``lam ~ Beta(alpha, alpha)`` for the whole batch and use ``max(lam, 1 - lam)``, so each
            sample's own image stays dominant (the authors' training code); False: one ``lam`` per sample.
    """

    def __init__(self, alpha: float = 0.3, prob: float = 1.0, per_batch: bool = False) -> None:
        if alpha < 0:
            raise ValueError(f"mixup alpha must be >= 0, got {alpha}")
        if not 0.0 <= prob <= 1.0:
            raise ValueError(f"mixup prob must be in [0, 1], got {prob}")
        self.alpha = float(alpha)
        self.prob = float(prob)
        self.per_batch = bool(per_batch)
        self._lam: np.ndarray | None = None
        self._perm: np.ndarray | None = None

    def randomize(self, batch_size: int) -> None:  # type: ignore[override]
        self._lam, self._perm = None, None
        if self.alpha <= 0 or batch_size < 2 or self.R.rand() >= self.prob:
            return
        if self.per_batch:
            lam = self.R.beta(self.alpha, self.alpha)
            self._lam = np.full(batch_size, max(lam, 1.0 - lam))
        else:
            self._lam = self.R.beta(self.alpha, self.alpha, size=batch_size)
        self._perm = self.R.permutation(batch_size)

    def __call__(
        self, images: torch.Tensor, targets: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """Mix a batch.

        Args:
            images: ``(B, ...)`` float tensor.
            targets: ``(B, C)`` float tensor.

        Returns:
            ``(images, targets, lam, index)``: the mixed batch, the weights ``(B,)`` (all equal for ``per_batch``)
            and the partner index ``(B,)`` on the batch's device (``None`` when the batch was not mixed).
        """
        if images.shape[0] != targets.shape[0]:
            raise ValueError(f"mixup needs as many targets as images, got {images.shape[0]} and {targets.shape[0]}")
        self.randomize(images.shape[0])
        if self._lam is None or self._perm is None:
            return images, targets, None, None
        index = torch.as_tensor(self._perm, device=images.device)
        lam = torch.as_tensor(self._lam, device=images.device, dtype=torch.float32)
        lam_x = lam.to(images.dtype).view(-1, *([1] * (images.ndim - 1)))
        lam_y = lam.to(targets.dtype).view(-1, *([1] * (targets.ndim - 1)))
        mixed_x = lam_x * images + (1 - lam_x) * images[index]
        mixed_y = lam_y * targets + (1 - lam_y) * targets[index]
        return mixed_x, mixed_y, lam, index


def forward_paths(network: torch.nn.Module, inputs: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
    """Call ``network.forward_paths`` (classification and contrastive logits), also through DDP.

    A ``DistributedDataParallel`` wrapper synchronises gradients only for work done inside its own
    ``forward``; calling ``ddp.module.forward_paths`` directly would bypass it. So, for DDP, the inner
    module's ``forward`` is pointed at ``forward_paths`` for the duration of one ``ddp(...)`` call.
    """
    if isinstance(network, torch.nn.parallel.DistributedDataParallel):
        inner = network.module
        inner.forward = inner.forward_paths  # type: ignore[method-assign]
        try:
            return network(inputs, *args, **kwargs)
        finally:
            del inner.forward  # back to the class's forward
    return network.forward_paths(inputs, *args, **kwargs)  # type: ignore[operator]


def _has_paths(network: torch.nn.Module) -> bool:
    inner = network.module if isinstance(network, torch.nn.parallel.DistributedDataParallel) else network
    return callable(getattr(inner, "forward_paths", None))


def check_contrastive_path(network: torch.nn.Module, contrastive_weight: float) -> None:
    """Refuse ``contrastive_weight > 0`` for a network whose contrastive path is off (no text embeddings).

    A network that has a ``contrastive_head`` attribute (:class:`~monai_vce.networks.DiffAttnCLIPClassifier`) set to
    None would train without the weighted contrastive term (the paper's 0.4 x BCE); networks without the attribute
    are not checked (their ``forward_paths`` decides). The message is the network's ``contrastive_off_reason``.

    Raises:
        ValueError: one line: the weight, why the path is off, the command that computes the embeddings.
    """
    inner = unwrap_network(network)
    inner = getattr(inner, "_orig_mod", inner)  # torch.compile's wrapper
    if contrastive_weight > 0 and hasattr(inner, "contrastive_head") and inner.contrastive_head is None:
        reason = getattr(inner, "contrastive_off_reason", None) or "the network has no contrastive head"
        raise ValueError(
            f"contrastive_weight is {contrastive_weight} but the network's contrastive path is off, so training "
            f"would drop that term: {reason}; or set contrastive_weight 0 to train the classification path only"
        )


class VCETrainer(SupervisedTrainer):
    """``SupervisedTrainer`` with the training iteration of monai-vce.

    It takes every ``SupervisedTrainer`` argument plus the ones below. One iteration: ``prepare_batch`` (``uint8`` to
    float on the device), mixup, forward under autocast (``forward_paths`` when ``contrastive_weight > 0``), loss
    ``loss_function(cls, y) + contrastive_weight * contrastive_loss_function(con, y)``, a ``FloatingPointError`` on a
    non-finite loss before any step, backward (``GradScaler`` for float16), optional gradient clipping, step.

    With ``contrastive_weight > 0`` a network whose contrastive path is off is refused when the trainer is built and
    again when it runs (:func:`check_contrastive_path`), before the first iteration.

    ``engine.state.output`` holds ``image``, ``label`` (mixed), ``pred``, ``loss``, ``loss_cls``, ``loss_con`` and,
    when mixed, ``mixup_lambda`` / ``mixup_index``. Each epoch calls the sampler's ``set_epoch`` if it has one.

    Args:
        device, max_epochs, train_data_loader, network, optimizer, loss_function, epoch_length, non_blocking,
        iteration_update, inferer, postprocessing, key_train_metric, additional_metrics, metric_cmp_fn,
        train_handlers, amp, event_names, event_to_attr, decollate, optim_set_to_none, to_kwargs, amp_kwargs,
        compile, compile_kwargs, accumulation_steps: as in ``monai.engines.SupervisedTrainer``.
        prepare_batch: default :class:`monai_vce.data.VCEPrepareBatch` (``uint8`` -> float on the device).
        mixup_alpha: Beta(alpha, alpha) mixup parameter; ``0`` disables mixup.
        mixup_prob: probability that a batch is mixed.
        mixup_per_batch: one mixup weight per batch, ``max(lam, 1 - lam)`` (the authors' training code); False: one
            per sample (see :class:`MultiLabelMixUp`).
        contrastive_weight: weight of the contrastive path's loss (the paper's 0.4); ``0`` trains the
            classification path only.
        contrastive_loss_function: loss of the contrastive logits, e.g.
            :class:`monai_vce.losses.BinaryCrossEntropyLoss`; None uses ``loss_function``.
        grad_clip_norm: clip the global gradient norm to this value; ``None`` disables clipping.
        amp_dtype: autocast dtype when ``amp`` is on, ``"float16"`` or ``"bfloat16"``.
        check_finite_loss: raise on a non-finite loss (one host sync per iteration).
    """

    def __init__(
        self,
        device: str | torch.device,
        max_epochs: int,
        train_data_loader: Iterable | DataLoader,
        network: torch.nn.Module,
        optimizer: Optimizer,
        loss_function: Callable,
        epoch_length: int | None = None,
        non_blocking: bool = False,
        prepare_batch: Callable | None = None,
        iteration_update: Callable | None = None,
        inferer: Inferer | None = None,
        postprocessing: Transform | None = None,
        key_train_metric: dict | None = None,
        additional_metrics: dict | None = None,
        metric_cmp_fn: Callable = default_metric_cmp_fn,
        train_handlers: Sequence | None = None,
        amp: bool = False,
        event_names: list | None = None,
        event_to_attr: dict | None = None,
        decollate: bool = True,
        optim_set_to_none: bool = False,
        to_kwargs: dict | None = None,
        amp_kwargs: dict | None = None,
        compile: bool = False,
        compile_kwargs: dict | None = None,
        accumulation_steps: int = 1,
        mixup_alpha: float = 0.3,
        mixup_prob: float = 1.0,
        mixup_per_batch: bool = False,
        contrastive_weight: float = 0.4,
        contrastive_loss_function: Callable | None = None,
        grad_clip_norm: float | None = None,
        amp_dtype: str | torch.dtype = "float16",
        check_finite_loss: bool = True,
    ) -> None:
        if isinstance(amp_dtype, str):
            if amp_dtype not in _AMP_DTYPES:
                raise ValueError(f"amp_dtype must be one of {sorted(_AMP_DTYPES)}, got {amp_dtype!r}")
            amp_dtype = _AMP_DTYPES[amp_dtype]
        if contrastive_weight < 0:
            raise ValueError(f"contrastive_weight must be >= 0, got {contrastive_weight}")
        if grad_clip_norm is not None and grad_clip_norm <= 0:
            raise ValueError(f"grad_clip_norm must be positive or None, got {grad_clip_norm}")
        check_contrastive_path(network, contrastive_weight)
        super().__init__(
            device=device,
            max_epochs=max_epochs,
            train_data_loader=train_data_loader,
            network=network,
            optimizer=optimizer,
            loss_function=loss_function,
            epoch_length=epoch_length,
            non_blocking=non_blocking,
            prepare_batch=VCEPrepareBatch() if prepare_batch is None else prepare_batch,
            iteration_update=iteration_update,
            inferer=inferer,
            postprocessing=postprocessing,
            key_train_metric=key_train_metric,
            additional_metrics=additional_metrics,
            metric_cmp_fn=metric_cmp_fn,
            train_handlers=train_handlers,
            amp=amp,
            event_names=event_names,
            event_to_attr=event_to_attr,
            decollate=decollate,
            optim_set_to_none=optim_set_to_none,
            to_kwargs=to_kwargs,
            amp_kwargs=amp_kwargs,
            compile=compile,
            compile_kwargs=compile_kwargs,
            accumulation_steps=accumulation_steps,
        )
        self.mixup = MultiLabelMixUp(alpha=mixup_alpha, prob=mixup_prob, per_batch=mixup_per_batch)
        self.contrastive_weight = float(contrastive_weight)
        self.contrastive_loss_function = (
            loss_function if contrastive_loss_function is None else contrastive_loss_function
        )
        self.grad_clip_norm = grad_clip_norm
        self.amp_dtype: torch.dtype = amp_dtype
        self.check_finite_loss = bool(check_finite_loss)
        self.amp_kwargs = {k: v for k, v in self.amp_kwargs.items() if k not in ("dtype", "device_type")}

        sampler = getattr(train_data_loader, "sampler", None)
        set_epoch = getattr(sampler, "set_epoch", None)
        if callable(set_epoch) and not isinstance(sampler, DistributedSampler):
            # MONAI's Workflow does this for DistributedSampler only
            self.add_event_handler(Events.EPOCH_STARTED, lambda engine: set_epoch(engine.state.epoch))

    def set_random_state(self, seed: int | None = None, state: np.random.RandomState | None = None) -> VCETrainer:
        """Seed the mixup draws (the rest of the randomness follows ``monai.utils.set_determinism``)."""
        self.mixup.set_random_state(seed=seed, state=state)
        return self

    def run(self) -> None:  # type: ignore[override]
        """Run training; a gradient scaler is used for float16 autocast only (bfloat16 keeps float32's range)."""
        check_contrastive_path(self.network, self.contrastive_weight)  # load_pretrained() may have turned it off
        use_scaler = self.amp and self.amp_dtype == torch.float16
        self.scaler = torch.amp.GradScaler(self.state.device.type) if use_scaler else None  # type: ignore[assignment]
        Workflow.run(self)  # skips Trainer.run, which would create a CUDA float16 scaler unconditionally

    def _non_finite(self, engine: VCETrainer, what: str, value: Any) -> FloatingPointError:
        epoch_length = engine.state.epoch_length
        local = (engine.state.iteration - 1) % epoch_length + 1 if epoch_length else engine.state.iteration
        return FloatingPointError(
            f"non-finite {what} ({value}) at epoch {engine.state.epoch}, iteration {engine.state.iteration} "
            f"(iteration {local} of the epoch); training stopped before the optimizer step, so the weights are those "
            f"of the last finite iteration. Lower the learning rate, set grad_clip_norm, or check this batch's "
            f"images and labels."
        )

    def _iteration(self, engine: VCETrainer, batchdata: dict[str, torch.Tensor]) -> dict:  # type: ignore[override]
        if batchdata is None:
            raise ValueError("Must provide batch data for current iteration.")
        batch = engine.prepare_batch(batchdata, engine.state.device, engine.non_blocking, **engine.to_kwargs)
        if len(batch) == 2:
            inputs, targets = batch
            args: tuple = ()
            kwargs: dict = {}
        else:
            inputs, targets, args, kwargs = batch
        if targets is None:
            raise ValueError("the training batch has no 'label': training needs labelled frames")
        targets = targets.float()
        inputs, targets, lam, index = engine.mixup(inputs, targets)

        engine.state.output = {Keys.IMAGE: inputs, Keys.LABEL: targets}
        if lam is not None:
            engine.state.output["mixup_lambda"] = lam
            engine.state.output["mixup_index"] = index

        acc = engine.accumulation_steps
        if acc > 1:
            epoch_length = engine.state.epoch_length
            local_iter = (engine.state.iteration - 1) % epoch_length if epoch_length else engine.state.iteration - 1
            should_zero_grad = local_iter % acc == 0
            should_step = (local_iter + 1) % acc == 0 or (epoch_length is not None and local_iter + 1 == epoch_length)
        else:
            should_zero_grad = should_step = True

        engine.network.train()
        if should_zero_grad:
            engine.optimizer.zero_grad(set_to_none=engine.optim_set_to_none)

        use_paths = engine.contrastive_weight > 0 and _has_paths(engine.network)
        device_type = engine.state.device.type if engine.state.device is not None else inputs.device.type
        with torch.autocast(device_type, dtype=engine.amp_dtype, enabled=engine.amp, **engine.amp_kwargs):
            if use_paths:
                paths = lambda x, *a, **k: forward_paths(engine.network, x, *a, **k)  # noqa: E731
                out = engine.inferer(inputs, paths, *args, **kwargs)
                if not isinstance(out, (tuple, list)) or len(out) != 2:
                    raise ValueError(
                        "network.forward_paths must return (classification_logits, contrastive_logits | None)"
                    )
                cls_logits, con_logits = out
            else:
                cls_logits, con_logits = engine.inferer(inputs, engine.network, *args, **kwargs), None
            engine.state.output[Keys.PRED] = cls_logits
            engine.fire_event(IterationEvents.FORWARD_COMPLETED)
            loss_cls = engine.loss_function(cls_logits, targets).mean()
            if con_logits is not None:
                loss_con = engine.contrastive_loss_function(con_logits, targets).mean()
                loss = loss_cls + engine.contrastive_weight * loss_con
            else:
                loss_con = torch.zeros_like(loss_cls)
                loss = loss_cls
            engine.state.output[Keys.LOSS] = loss
            engine.state.output["loss_cls"] = loss_cls.detach()
            engine.state.output["loss_con"] = loss_con.detach()
            engine.fire_event(IterationEvents.LOSS_COMPLETED)

        if engine.check_finite_loss and not bool(torch.isfinite(loss.detach())):
            raise self._non_finite(engine, "training loss", float(loss.detach()))

        scaler = engine.scaler
        (scaler.scale(loss / acc) if scaler is not None else loss / acc).backward()
        engine.fire_event(IterationEvents.BACKWARD_COMPLETED)
        engine.state.output[Keys.LOSS] = loss.detach()  # handlers read a value; the graph is spent
        if should_step:
            if engine.grad_clip_norm is not None:
                if scaler is not None:
                    scaler.unscale_(engine.optimizer)
                norm = torch.nn.utils.clip_grad_norm_(engine.network.parameters(), engine.grad_clip_norm)
                # with a scaler, an overflow is normal: the scaler skips the step and lowers its scale
                if scaler is None and engine.check_finite_loss and not bool(torch.isfinite(norm)):
                    raise self._non_finite(engine, "gradient norm", float(norm))
            if scaler is not None:
                scaler.step(engine.optimizer)
                scaler.update()
            else:
                engine.optimizer.step()
        engine.fire_event(IterationEvents.MODEL_COMPLETED)
        return engine.state.output
