"""Asymmetric focal loss (and its no-focusing limit, binary cross-entropy) for multi-label classification under
extreme class imbalance, with label smoothing and per-class positive weights."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from monai.utils import LossReduction
from torch.nn.modules.loss import _Loss

__all__ = ["AsymmetricFocalLoss", "BinaryCrossEntropyLoss"]


def _as_class_vector(value: Sequence[float] | torch.Tensor | None, name: str) -> torch.Tensor | None:
    if value is None:
        return None
    vector = torch.as_tensor(value, dtype=torch.float32).detach().flatten().clone()
    if (vector < 0).any() or not torch.isfinite(vector).all():
        raise ValueError(f"{name} must be finite and non-negative, got {vector.tolist()}")
    return vector


class AsymmetricFocalLoss(_Loss):
    """Asymmetric loss (ASL) of Ridnik et al., "Asymmetric Loss For Multi-Label Classification",
    ICCV 2021, https://arxiv.org/abs/2009.14119, computed from logits.

    With ``p = sigmoid(x)``, the shifted probability ``p_m = max(p - clip, 0)`` and the (smoothed) target
    ``t`` in [0, 1], each element's loss is

    .. math::

        L = -\\,(1 - p_t)^{\\gamma} \\left[ t \\log p + (1 - t) \\log(1 - p_m) \\right] \\,
            \\bigl(1 + (w^+_c - 1)\\, y\\bigr)\\, w_c,

        p_t = t\\, p + (1 - t)(1 - p_m), \\qquad \\gamma = t\\, \\gamma_+ + (1 - t)\\, \\gamma_-

    - One asymmetric focusing weight per element, from its combined ``p_t`` (as in the reference implementation
      and timm's ``AsymmetricLossMultiLabel``): for a 0/1 target it is ``(1 - p)^gamma_pos`` on a positive and
      ``p_m^gamma_neg`` on a negative. With label smoothing, an easy negative (``t = eps``) gets the weight
      ``(eps (1 - p) + (1 - eps) p_m)^gamma``, tiny on both terms, so its probability settles near ``eps``
      (just above ``clip``): focusing the smoothed positive and negative terms separately instead would give the
      ``eps`` part the positive's weight ``(1 - p)^gamma_pos`` (about 1) against ``p_m^gamma_neg`` (about 0) and
      pull every negative towards ``p ~ 0.4``.
    - Label smoothing maps a target ``y`` to ``t = y (1 - 2 eps) + eps``, i.e. 0/1 to ``[eps, 1 - eps]``.
    - Positive weights ``w^+_c`` (e.g. :func:`monai_vce.losses.class_positive_weights`, the negative/positive
      frame ratio of each class) weight the elements whose target *before smoothing* is positive; a soft
      (mixup) target ``y`` gets ``1 + (w^+ - 1) y``. For 0/1 targets without smoothing this is exactly the
      ``pos_weight`` of ``torch.nn.BCEWithLogitsLoss``. Weighting the smoothed positive term ``eps log p`` of
      every negative instead would move the optimum of a rare class's negatives to
      ``w^+ eps / (w^+ eps + 1 - eps)`` (0.84 for ``w^+ = 100``, ``eps = 0.05``).
    - ``w_c`` is the optional weight of the element's class (``weight``), scaling its whole loss.
    - ``detach_focusing=True`` computes the focusing weight without gradient, as the reference implementation
      does (``disable_torch_grad_focal_loss``).
    - ``gamma_pos = gamma_neg = 0``, ``clip = 0``, ``label_smoothing = 0`` and no weights give binary
      cross-entropy with logits exactly (:class:`BinaryCrossEntropyLoss`).

    The loss is evaluated in float32 (or float64 for float64 input) whatever the input precision, with
    log-sigmoid forms: ``log p = logsigmoid(x)``, and ``log(1 - p_m) = logsigmoid(-x)`` when ``clip = 0``,
    else ``log(min(sigmoid(-x) + clip, 1))`` whose argument is never below ``clip``; ``1 - p_t`` is computed as
    ``t sigmoid(-x) + (1 - t) p_m`` (no cancellation). So no ``log(0)`` occurs for any finite logit, also under
    fp16/bf16 autocast.

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

    Example::

        loss = AsymmetricFocalLoss(pos_weight=class_positive_weights(train_datalist))
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
    ) -> None:
        super().__init__(reduction=LossReduction(reduction).value)
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

        log_p = F.logsigmoid(x)
        if self.clip > 0:
            # 1 - p_m = min(1 - p + clip, 1) >= clip, so the log is finite
            log_1m_pm = torch.log(torch.clamp(torch.sigmoid(-x) + self.clip, max=1.0))
        else:
            log_1m_pm = F.logsigmoid(-x)
        loss = -(t * log_p + (1.0 - t) * log_1m_pm)

        if self.gamma_pos > 0 or self.gamma_neg > 0:
            with torch.set_grad_enabled(torch.is_grad_enabled() and not self.detach_focusing):
                p_m = torch.clamp(torch.sigmoid(x) - self.clip, min=0.0) if self.clip > 0 else torch.sigmoid(x)
                one_minus_pt = t * torch.sigmoid(-x) + (1.0 - t) * p_m
                gamma = t * self.gamma_pos + (1.0 - t) * self.gamma_neg
                # the tiny floor keeps pow's gradient finite at 1 - p_t = 0, where clamp's gradient is 0 anyway
                focus = one_minus_pt.clamp(min=torch.finfo(compute_dtype).tiny).pow(gamma)
            loss = loss * focus

        if self.pos_weight is not None:
            pos_weight = self._per_class(self.pos_weight, input, "pos_weight").to(loss)
            loss = loss * (1.0 + (pos_weight - 1.0) * y)
        if self.class_weight is not None:
            loss = loss * self._per_class(self.class_weight, input, "weight").to(loss)

        if self.reduction == LossReduction.MEAN.value:
            return loss.mean()
        if self.reduction == LossReduction.SUM.value:
            return loss.sum()
        return loss


class BinaryCrossEntropyLoss(AsymmetricFocalLoss):
    """Binary cross-entropy with logits, label smoothing and per-class positive weights.

    The :class:`AsymmetricFocalLoss` without focusing and clipping: ``-[t log p + (1 - t) log(1 - p)]
    (1 + (w^+_c - 1) y) w_c`` with ``t = y (1 - 2 eps) + eps``. Without smoothing it equals
    ``torch.nn.BCEWithLogitsLoss(pos_weight=..., weight=...)`` on 0/1 targets; with smoothing the positive weight
    follows the target before smoothing, so negatives keep their optimum at ``eps`` (see
    :class:`AsymmetricFocalLoss`). The loss of the contrastive path.

    Args:
        label_smoothing: ``eps`` in [0, 0.5).
        pos_weight: optional per-class positive weights (``C`` values along dim 1).
        weight: optional per-class weights.
        reduction: ``"mean"``, ``"sum"`` or ``"none"``.
    """

    def __init__(
        self,
        label_smoothing: float = 0.05,
        pos_weight: Sequence[float] | torch.Tensor | None = None,
        weight: Sequence[float] | torch.Tensor | None = None,
        reduction: LossReduction | str = LossReduction.MEAN,
    ) -> None:
        super().__init__(
            gamma_pos=0.0,
            gamma_neg=0.0,
            clip=0.0,
            label_smoothing=label_smoothing,
            pos_weight=pos_weight,
            weight=weight,
            reduction=reduction,
        )
