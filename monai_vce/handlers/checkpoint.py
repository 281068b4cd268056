"""A ``CheckpointSaver`` whose files are never half-written and never missing.

MONAI's ``CheckpointSaver`` writes with ignite's ``DiskSaver(atomic=False)``, and ignite's ``Checkpoint``
deletes the previous file *before* writing the new one when it replaces a checkpoint of the same name. A run
killed during a save (SIGKILL, power loss) can therefore leave a truncated checkpoint or none at all.
:class:`AtomicCheckpointSaver` keeps MONAI's arguments and behaviour but writes every file through
:func:`monai_vce.utils.atomic_write_bytes` (temporary file in the same folder, ``fsync``, ``os.replace``), and
a file replaced under the same name is only swapped once the new one is complete. It also accepts a fixed file
name for the interval checkpoint (``interval_filename``), so that resuming always reads the same path, e.g.
``checkpoint_last.pt``.
"""

from __future__ import annotations

import io
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from monai.handlers import CheckpointSaver
from monai.utils import IgniteInfo, min_version, optional_import

from monai_vce.utils import atomic_write_bytes

idist, _ = optional_import("ignite", IgniteInfo.OPT_IMPORT_VERSION, min_version, "distributed")
BaseSaveHandler, _ = optional_import("ignite.handlers.checkpoint", IgniteInfo.OPT_IMPORT_VERSION, min_version, "BaseSaveHandler")
DiskSaver, _ = optional_import("ignite.handlers", IgniteInfo.OPT_IMPORT_VERSION, min_version, "DiskSaver")

__all__ = ["AtomicDiskSaver", "AtomicCheckpointSaver"]


class AtomicDiskSaver(DiskSaver):
    """ignite save handler writing each checkpoint atomically and durably, on rank 0 only.

    Args:
        dirname: folder of the checkpoints (created when missing).
        filename: a fixed file name replacing the one ignite proposes (``None`` keeps ignite's names).
    """

    def __init__(self, dirname: str | Path, filename: str | None = None) -> None:
        super().__init__(dirname=dirname, atomic=True, create_dir=True, require_empty=False)
        self.filename = filename

    def __call__(self, checkpoint: Mapping, filename: str, metadata: Mapping | None = None) -> None:
        if idist.get_rank() != self.save_on_rank:
            return
        buf = io.BytesIO()
        torch.save(checkpoint, buf)
        atomic_write_bytes(self.dirname / (self.filename or filename), buf.getvalue())

    def remove(self, filename: str) -> None:
        # a fixed name is replaced atomically by the save that follows: deleting it first would leave a
        # window without any checkpoint
        if self.filename is not None or idist.get_rank() != self.save_on_rank:
            return
        path = self.dirname / filename
        if path.exists():
            path.unlink()


class AtomicCheckpointSaver(CheckpointSaver):
    """MONAI's ``CheckpointSaver`` with atomic writes and a fixed name for the interval checkpoint.

    Args:
        save_dir: folder of the checkpoints.
        save_dict: objects to save (anything with ``state_dict``), e.g. ``{"model": net, "optimizer": opt}``;
            a single entry is saved unnested (a plain ``state_dict``), as MONAI bundles expect of ``model.pt``.
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
        super().__init__(save_dir=save_dir, save_dict=save_dict, **kwargs)
        fixed = (
            (self._final_checkpoint, kwargs.get("final_filename")),
            (self._key_metric_checkpoint, kwargs.get("key_metric_filename")),
            (self._interval_checkpoint, interval_filename),
        )
        for ckpt, filename in fixed:
            if ckpt is not None:
                ckpt.save_handler = AtomicDiskSaver(self.save_dir, filename=filename)
