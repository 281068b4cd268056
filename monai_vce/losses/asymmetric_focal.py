"""Asymmetric focal loss for multi-label classification under extreme class imbalance."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from monai.utils import LossReduction
from torch.nn.modules.loss import _Loss

__all__ = ["AsymmetricFocalLoss"]


class AsymmetricFocalLoss(_Loss):
    """Asymmetric loss (ASL) of Ridnik et al., "Asymmetric Loss For Multi-Label Classification",
    ICCV 2021, https://arxiv.org/abs/2009.14119, computed from logits.

    With ``p = sigmoid(x)`` and the shifted probability ``p_m = max(p - clip, 0)``, each element's loss is

    .. math::

        L = -w_c \\left[ y \\,(1 - p)^{\\gamma_+} \\log p + (1 - y)\\, p_m^{\\gamma_-} \\log(1 - p_m) \\right]

    where ``y`` is the (smoothed) target in [0, 1] and ``w_c`` the optional weight of the element's class.

    - Label smoothing: the multi-label target is first moved towards 1/2,
      ``y_s = y * (1 - label_smoothing) + label_smoothing / 2`` (a 0/1 target becomes ``eps/2`` / ``1 - eps/2``).
    - Soft targets (label smoothing, mixup) weight the positive term by ``y`` and the negative term by
      ``1 - y``, each keeping its own focusing factor; for 0/1 targets this is exactly the reference loss.
    - ``detach_focusing=True`` computes the focusing factors ``(1 - p)^gamma_pos`` and ``p_m^gamma_neg``
      without gradient, as the reference implementation does (``disable_torch_grad_focal_loss``).
    - ``gamma_pos = gamma_neg = 0``, ``clip = 0`` and ``label_smoothing = 0`` give binary cross-entropy with
      logits exactly.

    The loss is evaluated in float32 (or float64 for float64 input) whatever the input precision, with
    log-sigmoid forms: ``log p = logsigmoid(x)``, and ``log(1 - p_m) = logsigmoid(-x)`` when ``clip = 0``,
    else ``log(min(sigmoid(-x) + clip, 1))`` whose argument is never below ``clip``; so no ``log(0)``
    occurs for any finite logit, also under fp16/bf16 autocast.

    Args:
        gamma_pos: focusing exponent of the positive term.
        gamma_neg: focusing exponent of the negative term.
        clip: probability margin subtracted from ``p`` in the negative term (hard-thresholds easy negatives);
            ``0`` disables it.
        label_smoothing: epsilon of the symmetric multi-label smoothing above; ``0`` disables it.
        weight: optional per-class weights, a sequence of ``C`` non-negative floats applied along dim 1.
        detach_focusing: compute the focusing factors without gradient (reference behaviour).
        reduction: ``"mean"``: the mean over all ``B x C (x ...)`` elements; ``"sum"``: their sum;
            ``"none"``: the element-wise loss with the input's shape, e.g. ``(B, C)``.

    Example::

        loss = AsymmetricFocalLoss()
        value = loss(logits, targets)  # logits (B, 17), targets (B, 17) in [0, 1]
    """

    def __init__(
        self,
        gamma_pos: float = 1.0,
        gamma_neg: float = 4.0,
        clip: float = 0.05,
        label_smoothing: float = 0.05,
        weight: Sequence[float] | torch.Tensor | None = None,
        detach_focusing: bool = True,
        reduction: LossReduction | str = LossReduction.MEAN,
    ) -> None:
        super().__init__(reduction=LossReduction(reduction).value)
        if gamma_pos < 0 or gamma_neg < 0:
            raise ValueError(f"gamma_pos and gamma_neg must be >= 0, got {gamma_pos} and {gamma_neg}")
        if not 0.0 <= clip < 1.0:
            raise ValueError(f"clip must be in [0, 1), got {clip}")
        if not 0.0 <= label_smoothing < 1.0:
            raise ValueError(f"label_smoothing must be in [0, 1), got {label_smoothing}")
        self.gamma_pos = float(gamma_pos)
        self.gamma_neg = float(gamma_neg)
        self.clip = float(clip)
        self.label_smoothing = float(label_smoothing)
        self.detach_focusing = bool(detach_focusing)
        class_weight: torch.Tensor | None = None
        if weight is not None:
            class_weight = torch.as_tensor(weight, dtype=torch.float32).flatten()
            if (class_weight < 0).any():
                raise ValueError(f"class weights must be non-negative, got {class_weight.tolist()}")
        self.class_weight: torch.Tensor | None
        self.register_buffer("class_weight", class_weight)

    def forward(self, input: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """
        Args:
            input: logits of shape ``(B, C, ...)``.
            target: targets in [0, 1] of the same shape (0/1 or soft).

        Returns:
            A scalar for ``"mean"``/``"sum"``, else the element-wise loss with the shape of ``input``
            (float32, or float64 for float64 input).

        Raises:
            ValueError: when the shapes differ or the class weights do not match dim 1.
        """
        if input.shape != target.shape:
            raise ValueError(
                f"input and target must have the same shape, got {tuple(input.shape)} and {tuple(target.shape)}"
            )
        compute_dtype = torch.float64 if input.dtype == torch.float64 else torch.float32
        x = input.to(compute_dtype)
        y = target.to(compute_dtype)
        if self.label_smoothing > 0:
            y = y * (1.0 - self.label_smoothing) + 0.5 * self.label_smoothing

        log_p = F.logsigmoid(x)
        if self.clip > 0:
            # 1 - p_m = min(1 - p + clip, 1) >= clip, so the log is finite
            log_1m_pm = torch.log(torch.clamp(torch.sigmoid(-x) + self.clip, max=1.0))
        else:
            log_1m_pm = F.logsigmoid(-x)

        with torch.set_grad_enabled(torch.is_grad_enabled() and not self.detach_focusing):
            # (1 - p)^g = exp(g * logsigmoid(-x)): exact 1 for g = 0 and a finite gradient everywhere
            w_pos = torch.exp(self.gamma_pos * F.logsigmoid(-x)) if self.gamma_pos > 0 else torch.ones_like(x)
            if self.gamma_neg > 0:
                p_m = torch.clamp(torch.sigmoid(x) - self.clip, min=0.0)
                # the tiny floor keeps pow's gradient finite at p_m = 0, where clamp's gradient is 0 anyway
                w_neg = p_m.clamp(min=torch.finfo(compute_dtype).tiny).pow(self.gamma_neg)
            else:
                w_neg = torch.ones_like(x)

        loss = -(y * w_pos * log_p + (1.0 - y) * w_neg * log_1m_pm)

        if self.class_weight is not None:
            if input.ndim < 2 or self.class_weight.numel() != input.shape[1]:
                raise ValueError(
                    f"weight has {self.class_weight.numel()} values but the input has "
                    f"{input.shape[1] if input.ndim > 1 else 'no'} classes along dim 1"
                )
            shape = [1, -1] + [1] * (input.ndim - 2)
            loss = loss * self.class_weight.to(loss).view(shape)

        if self.reduction == LossReduction.MEAN.value:
            return loss.mean()
        if self.reduction == LossReduction.SUM.value:
            return loss.sum()
        return loss
