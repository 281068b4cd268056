"""Asymmetric focal loss and binary cross-entropy for multi-label classification, with label smoothing and
per-class positive weights. Reference: Ridnik et al., "Asymmetric Loss", ICCV 2021.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from monai.utils import LossReduction
from torch.nn.modules.loss import _Loss

__all__ = ["VCEAsymmetricFocalLoss", "BinaryCrossEntropyLoss"]

_POS_WEIGHT_MODES = ("target", "smoothed", "positive_term")


def _as_class_vector(value: Sequence[float] | torch.Tensor | None, name: str) -> torch.Tensor | None:
    if value is None:
        return None
    vector = torch.as_tensor(value, dtype=torch.float32).detach().flatten().clone()
    if (vector < 0).any() or not torch.isfinite(vector).all():
        raise ValueError(f"{name} must be finite and non-negative, got {vector.tolist()}")
    return vector


class VCEAsymmetricFocalLoss(_Loss):
    """Asymmetric loss (ASL) of Ridnik et al., "Asymmetric Loss For Multi-Label Classification",
    ICCV 2021, https://arxiv.org/abs/2009.14119, computed from logits, with label smoothing and per-class positive weights.

    One focusing weight per element from its combined ``p_t`` (as timm's ``AsymmetricLossMultiLabel``); evaluated in
    float32 with log-sigmoid forms, so no ``log(0)`` for any finite logit. ``gamma_pos = gamma_neg = clip =
    label_smoothing = 0`` without weights is binary cross-entropy exactly. Derivation: ``docs/design/training.md``.

    Args:
        gamma_pos: focusing exponent of the positive part.
        gamma_neg: focusing exponent of the negative part.
        clip: probability margin subtracted from ``p`` in the negative part (hard-thresholds easy negatives);
            ``0`` disables it.
        label_smoothing: ``eps`` of the smoothing above, in [0, 0.5); ``0`` disables it.
        pos_weight: optional per-class positive weights, ``C`` non-negative floats along dim 1 (None: all 1).
        weight: optional per-class weights, ``C`` non-negative floats along dim 1.
        detach_focusing: compute the focusing weight without gradient (reference behaviour).
        reduction: ``"mean"``: the mean over all ``B x C (x ...)`` elements; ``"sum"``: their sum;
            ``"none"``: the element-wise loss with the input's shape, e.g. ``(B, C)``.
        pos_weight_mode: how ``w = pos_weight`` enters. ``"target"``: the focused loss times ``1 + (w - 1) y``
            with ``y`` the target before smoothing (negatives keep their optimum at ``eps``); ``"smoothed"``: times
            ``t w + 1 - t`` with ``t`` the smoothed target (the authors' ASL); ``"positive_term"``: only
            ``t log p`` is multiplied by ``w``, before focusing (``torch.nn.BCEWithLogitsLoss``'s form).

    Example::

        loss = VCEAsymmetricFocalLoss(pos_weight=class_positive_weights(train_datalist))
        value = loss(logits, targets)  # logits (B, 17), targets (B, 17) in [0, 1]
    """

    def __init__(
        self,
        gamma_pos: float = 1.0,
        gamma_neg: float = 4.0,
        clip: float = 0.05,
        label_smoothing: float = 0.05,
        pos_weight: Sequence[float] | torch.Tensor | None = None,
        weight: Sequence[float] | torch.Tensor | None = None,
        detach_focusing: bool = True,
        reduction: LossReduction | str = LossReduction.MEAN,
        pos_weight_mode: str = "target",
    ) -> None:
        super().__init__(reduction=LossReduction(reduction).value)
        if pos_weight_mode not in _POS_WEIGHT_MODES:
            raise ValueError(f"pos_weight_mode must be one of {_POS_WEIGHT_MODES}, got {pos_weight_mode!r}")
        if gamma_pos < 0 or gamma_neg < 0:
            raise ValueError(f"gamma_pos and gamma_neg must be >= 0, got {gamma_pos} and {gamma_neg}")
        if not 0.0 <= clip < 1.0:
            raise ValueError(f"clip must be in [0, 1), got {clip}")
        if not 0.0 <= label_smoothing < 0.5:
            raise ValueError(f"label_smoothing must be in [0, 0.5), got {label_smoothing}")
        self.gamma_pos = float(gamma_pos)
        self.gamma_neg = float(gamma_neg)
        self.clip = float(clip)
        self.label_smoothing = float(label_smoothing)
        self.detach_focusing = bool(detach_focusing)
        self.pos_weight_mode = pos_weight_mode
        self.pos_weight: torch.Tensor | None
        self.class_weight: torch.Tensor | None
        self.register_buffer("pos_weight", _as_class_vector(pos_weight, "pos_weight"))
        self.register_buffer("class_weight", _as_class_vector(weight, "class weights"))

    def _per_class(self, vector: torch.Tensor, input: torch.Tensor, name: str) -> torch.Tensor:
        if input.ndim < 2 or vector.numel() != input.shape[1]:
            raise ValueError(
                f"{name} has {vector.numel()} values but the input has "
                f"{input.shape[1] if input.ndim > 1 else 'no'} classes along dim 1"
            )
        return vector.view([1, -1] + [1] * (input.ndim - 2))

    def forward(self, input: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """
        Args:
            input: logits of shape ``(B, C, ...)``.
            target: targets in [0, 1] of the same shape (0/1 or soft), before smoothing.

        Returns:
            A scalar for ``"mean"``/``"sum"``, else the element-wise loss with the shape of ``input``
            (float32, or float64 for float64 input).

        Raises:
            ValueError: when the shapes differ or the per-class weights do not match dim 1.
        """
        if input.shape != target.shape:
            raise ValueError(
                f"input and target must have the same shape, got {tuple(input.shape)} and {tuple(target.shape)}"
            )
        compute_dtype = torch.float64 if input.dtype == torch.float64 else torch.float32
        x = input.to(compute_dtype)
        y = target.to(compute_dtype)
        t = y * (1.0 - 2.0 * self.label_smoothing) + self.label_smoothing if self.label_smoothing > 0 else y

        pos_weight = None if self.pos_weight is None else self._per_class(self.pos_weight, input, "pos_weight").to(x)
        log_p = F.logsigmoid(x)
        if self.clip > 0:
            # 1 - p_m = min(1 - p + clip, 1) >= clip, so the log is finite
            log_1m_pm = torch.log(torch.clamp(torch.sigmoid(-x) + self.clip, max=1.0))
        else:
            log_1m_pm = F.logsigmoid(-x)
        pos_term = t * log_p
        if pos_weight is not None and self.pos_weight_mode == "positive_term":
            pos_term = pos_term * pos_weight
        loss = -(pos_term + (1.0 - t) * log_1m_pm)

        if self.gamma_pos > 0 or self.gamma_neg > 0:
            with torch.set_grad_enabled(torch.is_grad_enabled() and not self.detach_focusing):
                p_m = torch.clamp(torch.sigmoid(x) - self.clip, min=0.0) if self.clip > 0 else torch.sigmoid(x)
                one_minus_pt = t * torch.sigmoid(-x) + (1.0 - t) * p_m
                gamma = t * self.gamma_pos + (1.0 - t) * self.gamma_neg
                # the tiny floor keeps pow's gradient finite at 1 - p_t = 0, where clamp's gradient is 0 anyway
                focus = one_minus_pt.clamp(min=torch.finfo(compute_dtype).tiny).pow(gamma)
            loss = loss * focus

        if pos_weight is not None and self.pos_weight_mode != "positive_term":
            loss = loss * (1.0 + (pos_weight - 1.0) * (y if self.pos_weight_mode == "target" else t))
        if self.class_weight is not None:
            loss = loss * self._per_class(self.class_weight, input, "weight").to(loss)

        if self.reduction == LossReduction.MEAN.value:
            return loss.mean()
        if self.reduction == LossReduction.SUM.value:
            return loss.sum()
        return loss


class BinaryCrossEntropyLoss(VCEAsymmetricFocalLoss):
    """Binary cross-entropy with logits, label smoothing and per-class positive weights.

    The :class:`VCEAsymmetricFocalLoss` without focusing and clipping: ``-[t log p + (1 - t) log(1 - p)]
    (1 + (w^+_c - 1) y) w_c`` with ``t = y (1 - 2 eps) + eps``. Without smoothing it equals
    ``torch.nn.BCEWithLogitsLoss(pos_weight=..., weight=...)`` on 0/1 targets; with smoothing the positive weight
    follows the target before smoothing (``pos_weight_mode="target"``), so negatives keep their optimum at ``eps``
    (see :class:`VCEAsymmetricFocalLoss`). The loss of the contrastive path.

    Args:
        label_smoothing: ``eps`` in [0, 0.5).
        pos_weight: optional per-class positive weights (``C`` values along dim 1).
        weight: optional per-class weights.
        reduction: ``"mean"``, ``"sum"`` or ``"none"``.
        pos_weight_mode: ``"target"``, ``"smoothed"`` or ``"positive_term"`` (see :class:`VCEAsymmetricFocalLoss`);
            ``"positive_term"`` is ``torch.nn.BCEWithLogitsLoss(pos_weight=...)`` on the smoothed targets.
    """

    def __init__(
        self,
        label_smoothing: float = 0.05,
        pos_weight: Sequence[float] | torch.Tensor | None = None,
        weight: Sequence[float] | torch.Tensor | None = None,
        reduction: LossReduction | str = LossReduction.MEAN,
        pos_weight_mode: str = "target",
    ) -> None:
        super().__init__(
            gamma_pos=0.0,
            gamma_neg=0.0,
            clip=0.0,
            label_smoothing=label_smoothing,
            pos_weight=pos_weight,
            weight=weight,
            reduction=reduction,
            pos_weight_mode=pos_weight_mode,
        )
