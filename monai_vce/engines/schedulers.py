"""Learning-rate schedules of the training recipes."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch.optim.lr_scheduler import OneCycleLR

__all__ = ["ResumableOneCycleLR"]


class ResumableOneCycleLR(OneCycleLR):
    """``torch.optim.lr_scheduler.OneCycleLR`` whose schedule follows the configured length after a resume.

    torch's scheduler saves ``total_steps`` (and the phase boundaries derived from it) in its state, so a run
    resumed with more epochs (``--max_epochs 20 --resume True`` after 10) would stop with "Tried to step N
    times". This subclass restores the position in the schedule (step count, last learning rates) and keeps the
    schedule built from the current configuration, as MONAI's ``WarmupCosineSchedule`` does; resumed with the
    same configuration it is exactly torch's scheduler.

    Args:
        args: as ``torch.optim.lr_scheduler.OneCycleLR``, e.g. ``optimizer``, ``max_lr`` (one value per
            parameter group for a backbone and a head rate), ``total_steps``, ``pct_start``, ``cycle_momentum``.
        kwargs: as ``torch.optim.lr_scheduler.OneCycleLR``.

    Example (bundle JSON)::

        {"_target_": "monai_vce.engines.ResumableOneCycleLR", "optimizer": "@optimizer",
         "max_lr": "$[g['lr'] for g in @optimizer.param_groups]",
         "total_steps": "$@max_epochs * len(@train#dataloader)", "pct_start": 0.3, "cycle_momentum": false}
    """

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Load the position in the schedule; the schedule's length and phases stay the configured ones."""
        configured = {k: self.__dict__[k] for k in ("total_steps", "_schedule_phases")}
        super().load_state_dict(dict(state_dict))
        self.__dict__.update(configured)
