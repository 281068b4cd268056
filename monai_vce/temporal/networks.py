"""Temporal refinement networks: multi-stage dilated temporal convolutions over a whole video.

:class:`MultiStageTCN` and :class:`LabelwiseTCN` map ``(B, C_in, T)`` to per-stage ``(B, 17, T)`` logits.
Reference: Farha and Gall, "MS-TCN", CVPR 2019.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

__all__ = [
    "DilatedResidualLayer",
    "SingleStageTCN",
    "MultiStageTCN",
    "LabelwiseTCN",
    "change_point_states",
    "network_context",
    "as_rows",
    "conv_rows",
]


def as_rows(x: torch.Tensor) -> torch.Tensor:
    """``(N, C, T)`` sequences as ``(N, C, 1, T)`` channels-last images: the layout the TCN layers compute in.

    With the few channels of these networks (8-64) and sequences of 10^5 frames, PyTorch's CPU convolutions
    run about twice as fast, forward and backward, on channels-last 2-d inputs as on ``(N, C, T)`` 1-d ones;
    the weights stay those of the ``nn.Conv1d`` modules (:func:`conv_rows`)."""
    return x.unsqueeze(2).contiguous(memory_format=torch.channels_last)


def conv_rows(conv: nn.Conv1d, x: torch.Tensor) -> torch.Tensor:
    """Apply a ``nn.Conv1d`` (stride 1, symmetric padding) to :func:`as_rows` inputs, returning the same layout."""
    return F.conv2d(
        x,
        conv.weight.unsqueeze(2),
        conv.bias,
        padding=(0, int(conv.padding[0])),  # type: ignore[index]
        dilation=(1, int(conv.dilation[0])),
    )


class DilatedResidualLayer(nn.Module):
    """One MS-TCN layer: dilated convolution -> ReLU -> 1x1 convolution -> dropout, plus the input.

    Args:
        channels: feature channels (input and output).
        dilation: dilation of the temporal convolution.
        kernel_size: odd temporal kernel size.
        dropout: dropout probability on the residual branch.
    """

    def __init__(self, channels: int, dilation: int, kernel_size: int = 3, dropout: float = 0.5) -> None:
        super().__init__()
        if kernel_size < 1 or kernel_size % 2 == 0:
            raise ValueError(f"kernel_size must be a positive odd number, got {kernel_size}")
        self.conv_dilated = nn.Conv1d(
            channels, channels, kernel_size, padding=dilation * (kernel_size - 1) // 2, dilation=dilation
        )
        self.conv_1x1 = nn.Conv1d(channels, channels, 1)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """
        Args:
            x: ``(N, C, T)`` features, or ``(N, C, 1, T)`` in the layout of :func:`as_rows` (kept in the output).
            mask: optional 0/1 mask of real frames, ``(N, 1, T)`` (or ``(N, 1, 1, T)`` with rows).
        """
        if x.dim() == 3:
            return self(as_rows(x), None if mask is None else mask.unsqueeze(2)).squeeze(2)
        # in place on fresh outputs (autograd keeps what it needs): no new buffer of 10^6 frames per operation
        out = self.dropout(conv_rows(self.conv_1x1, F.relu(conv_rows(self.conv_dilated, x), inplace=True)))
        out += x
        return out if mask is None else out * mask


class SingleStageTCN(nn.Module):
    """One MS-TCN stage: 1x1 input projection, ``layers`` dilated residual layers (dilation ``2**i``), 1x1 output.

    Args:
        in_channels: input channels.
        out_channels: output channels (logits).
        channels: feature channels.
        layers: number of dilated residual layers.
        kernel_size: odd temporal kernel size.
        dropout: dropout probability of the layers' residual branches.
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        channels: int = 64,
        layers: int = 10,
        kernel_size: int = 3,
        dropout: float = 0.5,
    ) -> None:
        super().__init__()
        self.conv_in = nn.Conv1d(in_channels, channels, 1)
        self.layers = nn.ModuleList(
            DilatedResidualLayer(channels, 2**i, kernel_size=kernel_size, dropout=dropout) for i in range(layers)
        )
        self.conv_out = nn.Conv1d(channels, out_channels, 1)
        self.context = (kernel_size - 1) // 2 * (2**layers - 1)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """
        Args:
            x: ``(N, in_channels, T)`` inputs.
            mask: optional ``(N, 1, T)`` 0/1 mask of real frames.

        Returns:
            ``(N, out_channels, T)`` outputs.
        """
        rows_mask = None if mask is None else mask.unsqueeze(2)
        out = conv_rows(self.conv_in, as_rows(x))
        if rows_mask is not None:
            out = out * rows_mask
        for layer in self.layers:
            out = layer(out, rows_mask)
        out = conv_rows(self.conv_out, out).squeeze(2)
        return out if mask is None else out * mask


class MultiStageTCN(nn.Module):
    """Multi-stage temporal convolutional network (MS-TCN) for multi-label frame refinement.

    The first stage maps the input sequence to logits; every further stage maps the sigmoid of the previous
    stage's logits to new logits. The output stacks all stages' logits (the loss supervises each stage, as in
    MS-TCN); the last stage is the prediction.

    With ``residual=True`` every stage predicts a *correction*: the first stage adds its output to a learned
    per-label affine map of the first ``out_channels`` input channels (which must then be the frame model's
    per-label evidence, e.g. its standardised logits), and every further stage adds its output to the previous
    stage's logits. The output layers start at zero, so the untrained network reproduces its input's ranking
    and training only has to learn where the frame model is wrong; labels with few positives are not lost
    while the network learns them.

    Args:
        in_channels: input channels per frame (17 for probabilities, ``D`` for features, ``17 + D`` for both).
        out_channels: output logits per frame.
        stages: number of stages (at least 1; MS-TCN uses 4).
        layers: dilated residual layers per stage (receptive field ``2**(layers + 1) - 1`` frames per stage
            for kernel size 3; MS-TCN uses 10).
        channels: feature channels of every stage (MS-TCN uses 64). The defaults (3 stages of 8 layers, 32
            channels: 765 frames of context on each side, about 0.1 M parameters) train in minutes on a CPU and refine a
            130,000-frame video in about 2 s on one core.
        kernel_size: odd temporal kernel size.
        dropout: dropout probability of the residual branches (training only).
        residual: stages predict corrections of the input evidence / previous logits (see above); needs
            ``in_channels >= out_channels``.

    Example::

        net = MultiStageTCN(in_channels=17, stages=4, layers=10, channels=64)  # MS-TCN's own settings
        logits = net(x)  # x (B, 17, T) -> (4, B, 17, T); logits[-1] is the prediction
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int = 17,
        stages: int = 3,
        layers: int = 8,
        channels: int = 32,
        kernel_size: int = 3,
        dropout: float = 0.5,
        residual: bool = False,
    ) -> None:
        super().__init__()
        for name, value in (("in_channels", in_channels), ("out_channels", out_channels), ("stages", stages)):
            if int(value) < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        if layers < 0 or channels < 1:
            raise ValueError(f"layers must be >= 0 and channels >= 1, got {layers} and {channels}")
        if residual and in_channels < out_channels:
            raise ValueError(
                f"residual=True refines the first out_channels={out_channels} inputs; in_channels={in_channels} is less"
            )
        self.config: dict[str, Any] = {
            "in_channels": int(in_channels),
            "out_channels": int(out_channels),
            "stages": int(stages),
            "layers": int(layers),
            "channels": int(channels),
            "kernel_size": int(kernel_size),
            "dropout": float(dropout),
            "residual": bool(residual),
        }
        self.stages = nn.ModuleList(
            SingleStageTCN(
                in_channels if s == 0 else out_channels, out_channels, channels, layers, kernel_size, dropout
            )
            for s in range(stages)
        )
        self.residual = bool(residual)
        if self.residual:
            self.skip_scale = nn.Parameter(torch.ones(out_channels))
            self.skip_bias = nn.Parameter(torch.zeros(out_channels))
            for stage in self._stage_list():
                nn.init.zeros_(stage.conv_out.weight)
                if stage.conv_out.bias is not None:
                    nn.init.zeros_(stage.conv_out.bias)

    def _stage_list(self) -> list[SingleStageTCN]:
        return [s for s in self.stages if isinstance(s, SingleStageTCN)]

    def init_skip(self, scale: torch.Tensor, bias: torch.Tensor) -> None:
        """Set the first stage's per-label affine skip (``residual=True``), e.g. to undo the standardisation of
        the input logits, so that the untrained network returns its input logits unchanged."""
        if not self.residual:
            return
        with torch.no_grad():
            self.skip_scale.copy_(torch.as_tensor(scale, dtype=self.skip_scale.dtype))
            self.skip_bias.copy_(torch.as_tensor(bias, dtype=self.skip_bias.dtype))

    @property
    def context(self) -> int:
        """Frames on each side of a frame that its output depends on (the half receptive field of all stages)."""
        return sum(stage.context for stage in self._stage_list())

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """
        Args:
            x: ``(B, in_channels, T)`` inputs.
            mask: optional ``(B, 1, T)`` 0/1 mask of real (not padded) frames; padded frames then influence no
                real frame, as if each sequence ended at its last real frame.

        Returns:
            ``(stages, B, out_channels, T)`` logits of every stage.
        """
        out = self.stages[0](x, mask)
        if self.residual:
            skip = x[:, : out.shape[1]] * self.skip_scale[:, None] + self.skip_bias[:, None]
            out = out + (skip if mask is None else skip * mask)
        outputs = [out]
        for stage in self.stages[1:]:
            prob = torch.sigmoid(out)
            step = stage(prob if mask is None else prob * mask, mask)
            out = out + step if self.residual else step
            outputs.append(out)
        return torch.stack(outputs)


def change_point_states(
    x: torch.Tensor,
    thresholds: Sequence[float],
    lookback: int,
    mask: torch.Tensor | None = None,
    lookahead: int = 0,
    span: int = 1,
) -> torch.Tensor:
    """Step states of sequences: for each threshold ``h``, +1 where the last step within ``lookback`` frames went
    up by more than ``h``, -1 where it went down by more than ``h``, 0 where there was none; with ``lookahead``,
    also the same states of the *next* step within ``lookahead`` frames ahead. A step is the difference of frames
    ``span`` apart (``x[t] - x[t - span]``), so that a boundary ramped over up to ``span`` frames is one step.

    A frame model's evidence for a label jumps where the label starts or stops, while its errors on
    neighbouring frames are correlated and drift slowly; the difference of consecutive frames separates the two,
    and the sign of the last large difference says which side of a boundary a frame lies on, however noisy the
    level. A convolution stack could learn the difference but hardly the "last step" memory, so it is given it.
    The next step ahead completes the picture: a frame between an up-step behind and a down-step ahead lies
    inside a run, and knows where it ends.

    Args:
        x: ``(N, 1, T)`` sequences (standardised logits).
        thresholds: step sizes, in the units of ``x``.
        lookback: frames a step is remembered.
        mask: optional ``(N, 1, T)`` 0/1 mask of real frames; no step is taken across or at a padded frame.
        lookahead: frames before a step that see it (outputs then depend on frames up to ``lookahead + span``
            ahead); 0: no states of the next step.
        span: frames between the two ends of a step (outputs depend on no frame more than ``lookback + span``
            back).

    Returns:
        ``(N, len(thresholds), T)`` states in {-1, 0, 1} (0 on padded frames), followed with ``lookahead`` by
        ``len(thresholds)`` states of the next step (its sign: +1 for a step up).
    """
    if span < 1:
        raise ValueError(f"change_point_states: span must be >= 1, got {span}")
    d = x[..., span:] - x[..., :-span]
    if mask is not None:
        d = d * mask[..., span:] * mask[..., :-span]
    t = torch.arange(x.shape[-1], device=x.device).expand(*x.shape[:-1], -1)
    never = torch.full_like(t, -(1 << 40))

    def last_step(steps: torch.Tensor, window: int) -> list[torch.Tensor]:
        # steps[t]: the step into frame t; per threshold, the sign of the last large one within the window
        states = []
        for h in thresholds:
            sign = (steps > h).to(x.dtype) - (steps < -h).to(x.dtype)
            last = torch.cummax(torch.where(sign != 0, t, never), dim=-1).values
            states.append(torch.gather(sign, -1, last.clamp(min=0)) * ((t - last) <= window).to(x.dtype))
        return states

    out = last_step(F.pad(d, (span, 0)), lookback)
    if lookahead:
        # the next step out of frame t is the last step into the mirrored frame of the reversed sequence,
        # with the opposite sign
        out += [-s.flip(-1) for s in last_step(F.pad(-d, (0, span)).flip(-1), lookahead)]
    states = torch.cat(out, dim=1)
    return states if mask is None else states * mask


class LabelwiseTCN(nn.Module):
    """A label-wise denoising stage shared by all labels, then MS-TCN stages over all labels together.

    Stage 1 (:class:`SingleStageTCN`, weights shared by the 17 labels) reads each label's evidence alone (its logit,
    a label embedding, optional step states) and returns a correction and ``label_features`` channels per label; the
    context stages (residual, as :class:`MultiStageTCN`) see all labels together. Output layers start at zero, so the
    untrained network returns its input evidence. Rationale: ``docs/design/temporal.md``.

    Args:
        in_channels: input channels per frame; the first ``out_channels`` must be the per-label evidence.
        out_channels: labels (logits per frame).
        channels: feature channels of the label-wise stage.
        layers: dilated residual layers of the label-wise stage.
        label_features: channels per label passed from the label-wise stage to the context stages.
        embedding: width of the learned label embedding given to the label-wise stage.
        stages: context stages after the label-wise stage (0: label-wise only).
        context_channels: feature channels of each context stage.
        context_layers: dilated residual layers of each context stage.
        kernel_size: odd temporal kernel size of every dilated convolution.
        dropout: dropout probability of the residual branches (training only).
        change_points: step sizes (in standard deviations of the label's logit) of the step-state inputs of the
            label-wise stage; empty: none.
        lookback: frames a step is remembered by the step states.
        lookahead: frames ahead of a step that also see it (the states of the next large step, mirroring
            ``lookback``): a frame then knows the steps on both sides of it, where a run it lies in starts and
            ends; 0: only the last step behind.
        step_spans: frames between the two ends of a step, one set of step states per span (``(1,)``: one-frame
            steps; longer spans also see boundaries ramped over up to that many frames).

    Example::

        net = LabelwiseTCN(in_channels=17)
        logits = net(x)  # x (B, 17, T) standardised logits -> (2, B, 17, T); logits[-1] is the prediction
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int = 17,
        channels: int = 16,
        layers: int = 7,
        label_features: int = 4,
        embedding: int = 4,
        stages: int = 1,
        context_channels: int = 32,
        context_layers: int = 7,
        kernel_size: int = 3,
        dropout: float = 0.1,
        change_points: Sequence[float] = (0.3, 0.5, 0.8, 1.2, 2.0),
        lookback: int = 128,
        lookahead: int = 128,
        step_spans: Sequence[int] = (1,),
    ) -> None:
        super().__init__()
        if out_channels < 1 or in_channels < out_channels:
            raise ValueError(
                f"LabelwiseTCN reads its first out_channels={out_channels} inputs as per-label evidence; "
                f"in_channels={in_channels} is less"
            )
        spans = tuple(int(k) for k in step_spans)
        if not spans or min(spans) < 1:
            raise ValueError(f"LabelwiseTCN: step_spans must be one or more integers >= 1, got {list(step_spans)}")
        if min(layers, label_features, embedding, stages, lookback, lookahead) < 0 or channels < 1:
            raise ValueError(
                "channels must be >= 1; layers, label_features, embedding, stages, lookback and lookahead >= 0"
            )
        self.config: dict[str, Any] = {
            "in_channels": int(in_channels),
            "out_channels": int(out_channels),
            "channels": int(channels),
            "layers": int(layers),
            "label_features": int(label_features),
            "embedding": int(embedding),
            "stages": int(stages),
            "context_channels": int(context_channels),
            "context_layers": int(context_layers),
            "kernel_size": int(kernel_size),
            "dropout": float(dropout),
            "change_points": [float(h) for h in change_points],
            "lookback": int(lookback),
            "lookahead": int(lookahead),
            "step_spans": list(spans),
        }
        self.labels = int(out_channels)
        self.label_features = int(label_features)
        self.change_points = tuple(float(h) for h in change_points)
        self.lookback = int(lookback)
        self.lookahead = int(lookahead) if self.change_points else 0
        self.step_spans = spans
        self.embedding = nn.Parameter(torch.empty(out_channels, embedding))
        nn.init.normal_(self.embedding, std=0.5)
        self.labelwise = SingleStageTCN(
            1 + embedding + len(self.change_points) * (2 if self.lookahead else 1) * len(spans),
            1 + label_features,
            channels,
            layers,
            kernel_size,
            dropout,
        )
        extra = in_channels - out_channels
        self.context_stages = nn.ModuleList(
            SingleStageTCN(
                out_channels * (1 + label_features) + extra,
                out_channels,
                context_channels,
                context_layers,
                kernel_size,
                dropout,
            )
            for _ in range(stages)
        )
        self.skip_scale = nn.Parameter(torch.ones(out_channels))
        self.skip_bias = nn.Parameter(torch.zeros(out_channels))
        for stage in [self.labelwise, *self.context_stages]:
            if isinstance(stage, SingleStageTCN):
                nn.init.zeros_(stage.conv_out.weight)
                if stage.conv_out.bias is not None:
                    nn.init.zeros_(stage.conv_out.bias)

    def init_skip(self, scale: torch.Tensor, bias: torch.Tensor) -> None:
        """Set the per-label affine skip, e.g. to undo the standardisation of the input logits, so that the
        untrained network returns its input logits unchanged."""
        with torch.no_grad():
            self.skip_scale.copy_(torch.as_tensor(scale, dtype=self.skip_scale.dtype))
            self.skip_bias.copy_(torch.as_tensor(bias, dtype=self.skip_bias.dtype))

    @property
    def context(self) -> int:
        """Frames on each side of a frame that its output depends on."""
        stages = [self.labelwise, *self.context_stages]
        # a step state looks one span beyond its window: the step into its oldest frame
        steps = max(self.lookback, self.lookahead) + max(self.step_spans) if self.change_points else 0
        return sum(int(s.context) for s in stages) + steps

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """
        Args:
            x: ``(B, in_channels, T)`` inputs, the first ``out_channels`` the per-label evidence.
            mask: optional ``(B, 1, T)`` 0/1 mask of real (not padded) frames.

        Returns:
            ``(1 + stages, B, out_channels, T)`` logits of every stage.
        """
        B, _, T = x.shape
        C = self.labels
        evidence = x[:, :C]
        # each label's sequence becomes one sample of the shared stage: (B * C, channels, T)
        seq = evidence.reshape(B * C, 1, T)
        per_label = [seq, self.embedding.repeat(B, 1)[:, :, None].expand(B * C, -1, T)]
        m = None if mask is None else mask.repeat_interleave(C, dim=0)
        if self.change_points:
            for k in self.step_spans:
                per_label.append(change_point_states(seq, self.change_points, self.lookback, m, self.lookahead, k))
        lw = self.labelwise(torch.cat(per_label, dim=1), m).reshape(B, C, 1 + self.label_features, T)
        out = evidence * self.skip_scale[:, None] + self.skip_bias[:, None] + lw[:, :, 0]
        if mask is not None:
            out = out * mask
        outputs = [out]
        feats = lw[:, :, 1:].reshape(B, C * self.label_features, T)
        for stage in self.context_stages:
            z = torch.cat([torch.sigmoid(out), feats, x[:, C:]], dim=1)
            out = out + stage(z if mask is None else z * mask, mask)
            outputs.append(out)
        return torch.stack(outputs)


def network_context(network: nn.Module) -> int | None:
    """Frames of context on each side that ``network``'s outputs depend on (its ``context`` attribute), or
    ``None`` when it does not declare one (then inference runs over whole videos, never in chunks)."""
    ctx = getattr(network, "context", None)
    return None if ctx is None else int(ctx)
