"""The training loss of the temporal refiner: asymmetric focal loss per stage plus a temporal smoothness term."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.modules.loss import _Loss

from monai_vce.losses import VCEAsymmetricFocalLoss

__all__ = ["FRAME_LOSS_DEFAULTS", "REFINER_LOSS_DEFAULTS", "TemporalRefinementLoss", "as_stages"]

#: The frame model's loss settings (``bundle/configs/train.json``).
FRAME_LOSS_DEFAULTS: dict[str, float] = {"gamma_pos": 1.0, "gamma_neg": 4.0, "clip": 0.05, "label_smoothing": 0.05}
#: The refiner's default: the asymmetric focal loss without focusing, clipping or smoothing (binary
#: cross-entropy), so that refined probabilities are calibrated. The decoder thresholds them on a fixed grid and
#: reads section logits as evidence; with the frame settings every negative frame of a refiner trained on
#: simulated Galar probabilities settled near 0.43 (the clipped, focused negative term stops pushing there),
#: which no threshold of that grid separates.
REFINER_LOSS_DEFAULTS: dict[str, float] = {"gamma_pos": 0.0, "gamma_neg": 0.0, "clip": 0.0, "label_smoothing": 0.0}


def as_stages(logits: torch.Tensor | Sequence[torch.Tensor]) -> torch.Tensor:
    """``(S, B, C, T)`` per-stage logits from a network output: a ``(B, C, T)`` tensor (one stage), a
    ``(S, B, C, T)`` tensor or a sequence of ``(B, C, T)`` tensors."""
    if isinstance(logits, torch.Tensor):
        if logits.ndim == 3:
            return logits.unsqueeze(0)
        if logits.ndim == 4:
            return logits
        raise ValueError(f"refiner network output must be (B, C, T) or (S, B, C, T), got shape {tuple(logits.shape)}")
    return torch.stack(list(logits))


class TemporalRefinementLoss(_Loss):
    """Classification loss on every stage's logits plus MS-TCN's truncated smoothness term.

    For logits ``x`` of shape ``(S, B, C, T)`` (stages, batch, labels, frames), targets ``y`` ``(B, C, T)`` and a
    mask of real frames, the loss is the sum over stages of

    - the classification loss (the project's :class:`~monai_vce.losses.VCEAsymmetricFocalLoss`, by default with
      :data:`REFINER_LOSS_DEFAULTS`), averaged over real frames and labels, plus
    - ``smoothness`` times the truncated mean squared difference of consecutive frames' log-probabilities
      (Farha and Gall, MS-TCN, CVPR 2019, eq. 4, with the previous frame detached), over both outcomes of each
      label (``log sigmoid(x)`` and ``log sigmoid(-x)``, the multi-label analogue of the log-softmax):
      ``mean(min((log p_t - log p_{t-1})^2, tau^2))`` over pairs of consecutive real frames.

    Args:
        loss: the classification loss: a mapping of :class:`~monai_vce.losses.VCEAsymmetricFocalLoss` arguments
            (merged over :data:`REFINER_LOSS_DEFAULTS`; pass :data:`FRAME_LOSS_DEFAULTS` for the frame model's
            settings) or a module returning the element-wise loss
            (``reduction="none"``) of ``(B, C, T)`` logits and targets.
        smoothness: weight of the smoothness term (MS-TCN uses 0.15); 0 turns it off.
        tau: truncation of the absolute log-probability difference (MS-TCN uses 4).
        class_weight: per-label weights of the classification loss (``C`` non-negative floats), as for the
            frame model; only with a mapping ``loss``.
        boundary_weight: extra weight of the classification loss on frames within ``boundary_radius`` frames of
            a change of the label's target (a frame's loss is multiplied by ``1 + boundary_weight`` there). The
            challenge matches events by temporal IoU, so a boundary a few frames off, or two runs merged across
            a short gap, loses the event, while a per-frame loss counts those frames like any other; 0 turns
            it off.
        boundary_radius: frames on each side of a change that count as near it.
    """

    def __init__(
        self,
        loss: Mapping[str, Any] | nn.Module | None = None,
        smoothness: float = 0.15,
        tau: float = 4.0,
        class_weight: Sequence[float] | torch.Tensor | None = None,
        boundary_weight: float = 0.0,
        boundary_radius: int = 2,
    ) -> None:
        super().__init__()
        if smoothness < 0 or tau <= 0:
            raise ValueError(f"smoothness must be >= 0 and tau > 0, got {smoothness} and {tau}")
        if boundary_weight < 0 or boundary_radius < 0:
            raise ValueError(
                f"boundary_weight and boundary_radius must be >= 0, got {boundary_weight} and {boundary_radius}"
            )
        self.boundary_weight = float(boundary_weight)
        self.boundary_radius = int(boundary_radius)
        if isinstance(loss, nn.Module):
            if class_weight is not None:
                raise ValueError("class_weight applies to the default loss; give the module its own weights")
            self.classification = loss
        else:
            kwargs = {**REFINER_LOSS_DEFAULTS, **dict(loss or {})}
            kwargs.pop("reduction", None)
            if class_weight is not None:
                kwargs["weight"] = class_weight
            self.classification = VCEAsymmetricFocalLoss(**kwargs, reduction="none")
        self.smoothness = float(smoothness)
        self.tau = float(tau)

    def boundary_weights(self, target: torch.Tensor) -> torch.Tensor:
        """``(B, C, T)`` per-element weights: ``1 + boundary_weight`` within ``boundary_radius`` frames of a change
        of the target along time, 1 elsewhere."""
        change = (target[..., 1:] != target[..., :-1]).to(target.dtype)
        # both frames of a change are on the boundary
        edge = torch.maximum(F.pad(change, (1, 0)), F.pad(change, (0, 1)))
        r = self.boundary_radius
        near = F.max_pool1d(edge, 2 * r + 1, stride=1, padding=r) if r > 0 else edge
        return 1.0 + self.boundary_weight * near

    def forward(
        self,
        logits: torch.Tensor | Sequence[torch.Tensor],
        target: torch.Tensor,
        mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """
        Args:
            logits: ``(S, B, C, T)`` per-stage logits (or ``(B, C, T)``, or a sequence of them).
            target: ``(B, C, T)`` targets in [0, 1].
            mask: optional ``(B, 1, T)`` 0/1 mask of real frames.

        Returns:
            The scalar loss.
        """
        x = as_stages(logits)
        if x.shape[1:] != target.shape:
            raise ValueError(f"logits {tuple(x.shape)} do not match targets {tuple(target.shape)} (B, C, T)")
        m = torch.ones_like(target[:, :1]) if mask is None else mask.to(target.dtype)
        denom = m.sum().clamp(min=1.0) * target.shape[1]
        pair = m[..., 1:] * m[..., :-1]
        pair_denom = pair.sum().clamp(min=1.0) * target.shape[1] * 2
        weight = m * self.boundary_weights(target) if self.boundary_weight > 0 else m
        total = x.new_zeros(())
        for stage in x:
            total = total + (self.classification(stage, target) * weight).sum() / denom
            if self.smoothness > 0 and stage.shape[-1] > 1:
                logp = torch.cat([F.logsigmoid(stage), F.logsigmoid(-stage)], dim=1)
                diff = logp[..., 1:] - logp.detach()[..., :-1]
                smooth = torch.clamp(diff.square(), max=self.tau**2) * pair
                total = total + self.smoothness * smooth.sum() / pair_denom
        return total
