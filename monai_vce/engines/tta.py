"""Test-time augmentation for frame classification: logits averaged over the flips and rotations a capsule sees."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from monai.inferers import Inferer

from monai_vce.engines.inferer import FrameInferer

__all__ = ["TTA_VIEWS", "FrameTTAInferer", "tta_view"]

#: The views of a capsule frame: its orientation is arbitrary, so flips and right-angle rotations are equally likely.
TTA_VIEWS: tuple[str, ...] = ("identity", "hflip", "vflip", "rot90", "rot180", "rot270")

_VIEW_OPS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "identity": lambda x: x,
    "hflip": lambda x: torch.flip(x, dims=(-1,)),
    "vflip": lambda x: torch.flip(x, dims=(-2,)),
    "rot90": lambda x: torch.rot90(x, k=1, dims=(-2, -1)),
    "rot180": lambda x: torch.rot90(x, k=2, dims=(-2, -1)),
    "rot270": lambda x: torch.rot90(x, k=3, dims=(-2, -1)),
    "transpose": lambda x: x.transpose(-2, -1),
    "antitranspose": lambda x: torch.rot90(x.transpose(-2, -1), k=2, dims=(-2, -1)),
}


def tta_view(images: torch.Tensor, view: str) -> torch.Tensor:
    """One view of a batch of frames ``(..., H, W)``.

    Args:
        images: frames, the last two axes ``(H, W)``.
        view: ``"identity"``, ``"hflip"``, ``"vflip"``, ``"rot90"``, ``"rot180"``, ``"rot270"`` (counter-clockwise),
            ``"transpose"`` or ``"antitranspose"``.

    Raises:
        ValueError: unknown ``view``.
    """
    op = _VIEW_OPS.get(view)
    if op is None:
        raise ValueError(f"unknown TTA view {view!r}; expected one of {tuple(_VIEW_OPS)}")
    return op(images)


def _mean(outputs: list[Any]) -> Any:
    """Element-wise mean of network outputs (tensors, or tuples/lists/dicts of them), accumulated in float32."""
    first = outputs[0]
    if isinstance(first, torch.Tensor):
        if not first.is_floating_point():
            raise TypeError(f"FrameTTAInferer averages floating-point outputs, got {first.dtype}")
        acc = first.float() if first.dtype != torch.float64 else first.clone()
        for out in outputs[1:]:
            acc = acc + out.to(acc.dtype)
        return (acc / len(outputs)).to(first.dtype)
    if isinstance(first, dict):
        return {k: _mean([o[k] for o in outputs]) for k in first}
    if isinstance(first, (tuple, list)):
        return type(first)(_mean(list(items)) for items in zip(*outputs, strict=True))
    if first is None:
        return None
    raise TypeError(f"FrameTTAInferer cannot average network outputs of type {type(first).__name__}")


class FrameTTAInferer(Inferer):
    """Test-time augmentation: the network's outputs (logits) averaged over fixed views of the frames.

    Each view (a flip or right-angle rotation of the ``(B, C, H, W)`` batch, :func:`tta_view`) is run through
    ``inferer`` and the outputs are averaged (element-wise, accumulated in float32, returned in the outputs'
    dtype), so the shape and dtype are those of one plain call. ``uint8`` frames are scaled to ``[0, 1]`` first,
    as :class:`FrameInferer` does.

    By default the views are run one after the other (``views_per_pass=1``): the peak memory is that of plain
    inference at the bundle's batch size, at ``len(views)`` times the time. ``views_per_pass=k`` concatenates
    ``k`` views into one forward pass (batch ``k * B``: fewer, larger passes, ``k`` times the activation memory);
    views of different shapes (``rot90`` of non-square frames) are never concatenated. The network must treat
    the items of a batch independently (eval mode), as the project's networks do.

    Args:
        views: names of the views (:data:`TTA_VIEWS` by default); ``("identity",)`` is plain inference.
        inferer: inferer called as ``inferer(images, network, *args, **kwargs)`` per pass;
            :class:`FrameInferer` when ``None``.
        views_per_pass: views concatenated into one forward pass (``0``: all of them).

    Raises:
        ValueError: an unknown or repeated view, no view, or a negative ``views_per_pass``.
    """

    def __init__(
        self,
        views: Sequence[str] = TTA_VIEWS,
        inferer: Inferer | Callable[..., Any] | None = None,
        views_per_pass: int = 1,
    ) -> None:
        super().__init__()
        views = (views,) if isinstance(views, str) else tuple(views)
        if not views:
            raise ValueError("FrameTTAInferer needs at least one view")
        for v in views:
            if v not in _VIEW_OPS:
                raise ValueError(f"unknown TTA view {v!r}; expected one of {tuple(_VIEW_OPS)}")
        if len(set(views)) != len(views):
            raise ValueError(f"repeated TTA views in {views}")
        if views_per_pass < 0:
            raise ValueError(f"views_per_pass must be >= 0, got {views_per_pass}")
        self.views = views
        self.inferer = inferer if inferer is not None else FrameInferer()
        self.views_per_pass = int(views_per_pass) or len(views)

    def _passes(self, inputs: torch.Tensor) -> list[list[str]]:
        """The views grouped into passes: at most ``views_per_pass`` each, all of one output shape."""
        passes: list[list[str]] = []
        for v in self.views:
            shape = tta_view(inputs[:0], v).shape
            for group in passes:
                if len(group) < self.views_per_pass and tta_view(inputs[:0], group[0]).shape == shape:
                    group.append(v)
                    break
            else:
                passes.append([v])
        return passes

    def __call__(self, inputs: torch.Tensor, network: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Average of ``inferer(view(inputs), network, *args, **kwargs)`` over the views.

        Args:
            inputs: frames ``(B, C, H, W)``, float in ``[0, 1]`` or ``uint8``.
            network: the network (or any callable on a batch).
            args: positional arguments passed on to the inferer.
            kwargs: keyword arguments passed on to the inferer.
        """
        if not isinstance(inputs, torch.Tensor) or inputs.ndim < 3:
            shape = tuple(inputs.shape) if isinstance(inputs, torch.Tensor) else type(inputs).__name__
            raise ValueError(f"FrameTTAInferer expects a (B, C, H, W) tensor, got {shape}")
        if not inputs.is_floating_point():
            inputs = inputs.float().div_(255.0)
        if self.views == ("identity",):
            return self.inferer(inputs, network, *args, **kwargs)
        batch = inputs.shape[0]
        outputs: list[Any] = []
        for group in self._passes(inputs):
            if len(group) == 1:
                outputs.append(self.inferer(tta_view(inputs, group[0]), network, *args, **kwargs))
                continue
            out = self.inferer(torch.cat([tta_view(inputs, v) for v in group]), network, *args, **kwargs)
            outputs.extend(_split(out, batch, len(group)))
        return _mean(outputs)


def _split(output: Any, batch: int, n: int) -> list[Any]:
    """Split a pass's output over ``n`` concatenated views of ``batch`` frames into ``n`` outputs."""
    if isinstance(output, torch.Tensor):
        if output.shape[0] != n * batch:
            raise ValueError(f"FrameTTAInferer: a pass of {n * batch} frames returned {output.shape[0]} outputs")
        return list(output.split(batch))
    if isinstance(output, dict):
        parts = {k: _split(v, batch, n) for k, v in output.items()}
        return [{k: parts[k][i] for k in output} for i in range(n)]
    if isinstance(output, (tuple, list)):
        parts_seq = [_split(v, batch, n) for v in output]
        return [type(output)(p[i] for p in parts_seq) for i in range(n)]
    if output is None:
        return [None] * n
    raise TypeError(f"FrameTTAInferer cannot split network outputs of type {type(output).__name__}")
