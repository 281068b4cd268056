"""Checkpoint handlers: :class:`AtomicCheckpointSaver` (files never half-written or missing),
:class:`VCECheckpointLoader` (one-line errors naming the file), :class:`BestMetricState` (best metric in resumes).
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from monai.handlers import CheckpointLoader, CheckpointSaver
from monai.utils import IgniteInfo, min_version, optional_import

from monai_vce.networks.backbone import check_weight_dtypes, read_torch_file
from monai_vce.utils import atomic_write_bytes, seal_torch_bytes

idist, _ = optional_import("ignite", IgniteInfo.OPT_IMPORT_VERSION, min_version, "distributed")
BaseSaveHandler, _ = optional_import(
    "ignite.handlers.checkpoint", IgniteInfo.OPT_IMPORT_VERSION, min_version, "BaseSaveHandler"
)
if TYPE_CHECKING:
    from ignite.handlers import DiskSaver
else:
    DiskSaver, _ = optional_import("ignite.handlers", IgniteInfo.OPT_IMPORT_VERSION, min_version, "DiskSaver")

__all__ = ["AtomicDiskSaver", "AtomicCheckpointSaver", "VCECheckpointLoader", "BestMetricState"]

logger = logging.getLogger(__name__)


def _missing_folders(folder: str | Path) -> list[Path]:
    """The folders of ``folder``'s path that do not exist yet, deepest first."""
    path, missing = Path(folder).absolute(), []
    while not path.exists() and path != path.parent:
        missing.append(path)
        path = path.parent
    return missing


def _remove_empty(folders: list[Path]) -> None:
    """Remove the given folders, deepest first, where they are (still) empty."""
    for folder in folders:
        with contextlib.suppress(OSError):
            os.rmdir(folder)


class AtomicDiskSaver(DiskSaver):
    """ignite save handler writing each checkpoint atomically and durably, on rank 0 only.

    Args:
        dirname: folder of the checkpoints (created when missing).
        filename: a fixed file name replacing the one ignite proposes (``None`` keeps ignite's names).
    """

    def __init__(self, dirname: str | Path, filename: str | None = None) -> None:
        missing = _missing_folders(dirname)
        super().__init__(dirname=dirname, atomic=True, create_dir=True, require_empty=False)
        _remove_empty(missing)  # created by the first save instead (see AtomicCheckpointSaver)
        self.filename = filename

    def __call__(self, checkpoint: Mapping, filename: str, metadata: Mapping | None = None) -> None:
        if idist.get_rank() != self.save_on_rank:
            return
        buf = io.BytesIO()
        torch.save(checkpoint, buf)
        # sealed with a checksum of its records, checked by VCECheckpointLoader (torch.load ignores the record)
        atomic_write_bytes(self.dirname / (self.filename or filename), seal_torch_bytes(buf.getvalue()))

    def remove(self, filename: str) -> None:
        # a fixed name is replaced atomically by the save that follows: deleting it first would leave a
        # window without any checkpoint
        if self.filename is not None or idist.get_rank() != self.save_on_rank:
            return
        path = self.dirname / filename
        if path.exists():
            path.unlink()


def _stateful(objects: dict) -> dict:
    """The entries that have a state to save or load.

    A swapped-in component without state (``train#sampler`` set to ``null`` for plain shuffling, or a
    ``RandomSampler``) is left out instead of failing the run, so a one-line override needs no edit of the
    checkpoint lists.
    """
    return {k: v for k, v in objects.items() if hasattr(v, "state_dict") and hasattr(v, "load_state_dict")}


class AtomicCheckpointSaver(CheckpointSaver):
    """MONAI's ``CheckpointSaver`` with atomic writes and a fixed name for the interval checkpoint.

    Args:
        save_dir: folder of the checkpoints.
        save_dict: objects to save, e.g. ``{"model": net, "optimizer": opt}``; entries without
            ``state_dict`` / ``load_state_dict`` (``None``, a stateless sampler) are left out; a single entry is saved unnested (a plain ``state_dict``), as MONAI bundles expect of ``model.pt``.
        interval_filename: fixed file name of the checkpoint written every ``save_interval`` epochs
            (or iterations); each save replaces the previous one atomically. ``None`` keeps MONAI's names
            (``checkpoint_epoch=N.pt``) and ``n_saved``.
        kwargs: the other arguments of ``monai.handlers.CheckpointSaver`` (``name``, ``file_prefix``,
            ``save_final``, ``final_filename``, ``save_key_metric``, ``key_metric_name``,
            ``key_metric_filename``, ``key_metric_save_state``, ``epoch_level``, ``save_interval``, ...).

    Example (bundle JSON)::

        {"_target_": "monai_vce.handlers.AtomicCheckpointSaver", "save_dir": "@ckpt_dir",
         "save_dict": {"model": "@network", "optimizer": "@optimizer", "trainer": "@train#trainer"},
         "save_interval": 1, "interval_filename": "checkpoint_last.pt"}
    """

    def __init__(self, save_dir: str, save_dict: dict, interval_filename: str | None = None, **kwargs: Any) -> None:
        if interval_filename is not None:
            kwargs["n_saved"] = 1
        missing = _missing_folders(save_dir)
        super().__init__(save_dir=save_dir, save_dict=_stateful(save_dict), **kwargs)
        # MONAI's saver creates the folder when it is built; building a workflow (parsing a config) writes nothing,
        # so the folder waits for the first save (atomic_write_bytes creates it)
        _remove_empty(missing)
        fixed = (
            (self._final_checkpoint, kwargs.get("final_filename")),
            (self._key_metric_checkpoint, kwargs.get("key_metric_filename")),
            (self._interval_checkpoint, interval_filename),
        )
        for ckpt, filename in fixed:
            if ckpt is not None:
                ckpt.save_handler = AtomicDiskSaver(self.save_dir, filename=filename)


def _unwrap(module: torch.nn.Module) -> torch.nn.Module:
    inner = getattr(module, "module", None)
    return inner if isinstance(inner, torch.nn.Module) else module


class VCECheckpointLoader(CheckpointLoader):
    """MONAI's ``CheckpointLoader`` with a one-line error naming the file when the checkpoint does not fit.

    torch's ``load_state_dict`` error lists every mismatched tensor but not the file. This loader re-raises it
    as a ``ValueError`` naming ``load_path``, and for a checkpoint of another number of classes both class
    counts. Loading stays ``torch.load(..., weights_only=True)`` (MONAI's loader).

    Args:
        load_path: the checkpoint file.
        load_dict: objects to load, e.g. ``{"model": network}``; entries without ``state_dict`` /
            ``load_state_dict`` (``None``, a stateless sampler) are left out, as in :class:`AtomicCheckpointSaver`.
        kwargs: the other arguments of ``monai.handlers.CheckpointLoader`` (``name``, ``map_location``,
            ``strict``, ``strict_shape``).

    Example (bundle JSON)::

        {"_target_": "monai_vce.handlers.VCECheckpointLoader", "load_path": "@model_file",
         "load_dict": {"model": "@network"}, "map_location": "@device"}
    """

    def __init__(self, load_path: str, load_dict: dict, **kwargs: Any) -> None:
        super().__init__(load_path=load_path, load_dict=_stateful(load_dict), **kwargs)

    def check(self) -> None:
        """Check the file before MONAI loads it: its checksum when it carries one (every checkpoint this project writes
        does), readable by ``torch.load(weights_only=True)``, and floating-point
        values wherever the network has floating-point weights (an int8 or bool ``model.pt`` would otherwise load
        silently and compute nonsense).

        Raises:
            FileNotFoundError: the file does not exist.
            ValueError: an empty, truncated, damaged or foreign file, or weights of the wrong type; one line naming
                the file (and the key).
        """
        checkpoint = read_torch_file(self.load_path, "checkpoint", mmap=True)  # mapped: no second full read
        if not isinstance(checkpoint, Mapping):
            raise ValueError(
                f"checkpoint {self.load_path} holds a {type(checkpoint).__name__}, not a dict of tensors (a state dict)"
            )
        for key, obj in self.load_dict.items():
            net = _unwrap(obj) if isinstance(obj, torch.nn.Module) else None
            if net is None:
                continue
            state = checkpoint[key] if len(self.load_dict) > 1 or key in checkpoint else checkpoint
            if isinstance(state, Mapping):
                check_weight_dtypes(state, net.state_dict(), self.load_path)

    def __call__(self, engine: Any) -> None:
        self.check()
        try:
            super().__call__(engine)
        except RuntimeError as e:
            if "Error(s) in loading state_dict" not in str(e):
                raise
            raise ValueError(self._mismatch_message(e)) from None

    def _class_counts(self) -> tuple[int, int] | None:
        """(classes of the checkpoint, classes of the network), from the tensors sized by the class count."""
        checkpoint = read_torch_file(self.load_path, "checkpoint", mmap=True, verify=False)  # check() verified it
        for key, obj in self.load_dict.items():
            net = _unwrap(obj) if isinstance(obj, torch.nn.Module) else None
            n_model = getattr(net, "num_classes", None)
            if net is None or n_model is None:
                continue
            state = checkpoint[key] if len(self.load_dict) > 1 or key in checkpoint else checkpoint
            if not isinstance(state, Mapping):
                continue
            for name, tensor in net.state_dict().items():
                saved = state.get(name)
                if (
                    isinstance(saved, torch.Tensor)
                    and tensor.ndim >= 1
                    and tensor.shape[0] == n_model
                    and saved.ndim == tensor.ndim
                    and saved.shape[0] != n_model
                ):
                    return int(saved.shape[0]), int(n_model)
        return None

    def _mismatch_message(self, error: RuntimeError) -> str:
        try:
            counts = self._class_counts()
        except Exception:  # the message must not hide the original error behind a second one
            counts = None
        if counts is not None:
            return (
                f"checkpoint {self.load_path} is a network of {counts[0]} classes, the configured network has "
                f"{counts[1]}: use a checkpoint trained for {counts[1]} classes (or set the network's num_classes)"
            )
        details = [line.strip() for line in str(error).splitlines()[1:] if line.strip()]
        first = details[0] if details else str(error).splitlines()[0]
        more = f" (and {len(details) - 1} more)" if len(details) > 1 else ""
        return f"checkpoint {self.load_path} does not fit the configured network: {first}{more}"


class BestMetricState:
    """The best key metric of a validator and the memory of its best-model saver, as one checkpointable object.

    MONAI's evaluator keeps ``state.best_metric`` / ``state.best_metric_epoch`` in memory and the best-model
    ``CheckpointSaver`` remembers the score of the file it wrote; both start over in a new process. Put this
    object in the training checkpoint's ``save_dict`` (and the resume loader's ``load_dict``) so that a resumed
    run keeps them: the first validation after resuming then replaces ``model.pt`` (and the tuned decoder and
    thresholds, written on the best validation) only when it beats the best one before the interruption.

    Args:
        evaluator: the validator (a MONAI ``Evaluator``).
        saver: the ``CheckpointSaver`` writing the best model (``save_key_metric=True``), or ``None``.

    Example (bundle JSON)::

        "best_state": {"_target_": "monai_vce.handlers.BestMetricState",
                       "evaluator": "@validate#evaluator", "saver": "@validate#best_model_saver"}
    """

    def __init__(self, evaluator: Any, saver: CheckpointSaver | None = None) -> None:
        self.evaluator = evaluator
        self.saver = saver

    def state_dict(self) -> dict[str, Any]:
        state = self.evaluator.state
        out: dict[str, Any] = {
            "best_metric": float(state.best_metric),
            "best_metric_epoch": int(state.best_metric_epoch),
        }
        ckpt = getattr(self.saver, "_key_metric_checkpoint", None)
        out["saved"] = [(float(item.priority), str(item.filename)) for item in ckpt._saved] if ckpt is not None else []
        return out

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        for key in ("best_metric", "best_metric_epoch", "saved"):
            if key not in state_dict:
                raise KeyError(f"BestMetricState: the checkpoint entry has no {key!r}")
        self.evaluator.state.best_metric = float(state_dict["best_metric"])
        self.evaluator.state.best_metric_epoch = int(state_dict["best_metric_epoch"])
        if self.saver is not None and state_dict["saved"]:
            self.saver.load_state_dict({"_saved": [(p, f) for p, f in state_dict["saved"]]})
