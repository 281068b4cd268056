"""Definitions of decoding steps (:class:`ChainStep`) and their parameters (:class:`Param`), from which the
decoder's defaults, validation and search grids derive.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["MAX_FRAMES", "MAX_COST", "Param", "ChainStep"]

#: Upper bound of every frame count parameter (windows, gaps, lengths): longer than any capsule video.
MAX_FRAMES: int = 10_000_000
#: Upper bound of the anatomy decoder's transition costs (nats).
MAX_COST: float = 1e6

_KINDS = ("number", "integer", "odd_integer", "boolean")


@dataclass(frozen=True)
class Param:
    """One decoder parameter.

    Args:
        name: its key in the parameter JSON.
        kind: ``"number"`` (a finite float), ``"integer"``, ``"odd_integer"`` or ``"boolean"``.
        default: the value when the parameter is not given.
        minimum: smallest allowed value (numbers and integers).
        maximum: largest allowed value (numbers and integers).
        nullable: ``None`` (JSON ``null``) is allowed too.
        grid: candidate values searched by the decoder's tuning (empty: not tuned).
        doc: what the parameter does, in a few words.
    """

    name: str
    kind: str
    default: Any
    minimum: float | None = None
    maximum: float | None = None
    nullable: bool = False
    grid: tuple[Any, ...] = ()
    doc: str = ""

    def __post_init__(self) -> None:
        if self.kind not in _KINDS:
            raise ValueError(f"Param {self.name!r}: kind must be one of {_KINDS}, got {self.kind!r}")

    @property
    def dtype(self) -> type:
        """numpy dtype of a per-label array of this parameter."""
        return np.float64 if self.kind == "number" else np.int64

    def schema(self) -> dict[str, Any]:
        """The JSON schema of the parameter's value."""
        if self.kind == "boolean":
            out: dict[str, Any] = {"type": "boolean"}
        else:
            out = {"type": "number" if self.kind == "number" else "integer"}
            if self.kind == "number":
                out["finite"] = True
            if self.minimum is not None:
                out["minimum"] = self.minimum
            if self.maximum is not None:
                out["maximum"] = self.maximum
            if self.kind == "odd_integer":
                out["not"] = {"multipleOf": 2}
        return {"anyOf": [out, {"type": "null"}]} if self.nullable else out

    def describe(self) -> str:
        """What a valid value is, for error messages (e.g. ``"an odd integer in [1, 10000000]"``)."""
        kind = {"number": "a finite number", "integer": "an integer", "odd_integer": "an odd integer"}.get(
            self.kind, "true or false"
        )
        if self.kind != "boolean" and (self.minimum is not None or self.maximum is not None):
            lo = "-inf" if self.minimum is None else _number(self.minimum)
            hi = "inf" if self.maximum is None else _number(self.maximum)
            kind += f" in [{lo}, {hi}]"
        return kind + (" or null" if self.nullable else "")

    def is_valid(self, value: Any) -> bool:
        """Whether ``value`` is valid (the same rule as :meth:`schema`)."""
        if value is None:
            return self.nullable
        if self.kind == "boolean":
            return isinstance(value, bool)
        if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
            return False
        if self.kind != "number" and not isinstance(value, (int, np.integer)):
            return False
        if self.kind == "number" and not math.isfinite(float(value)):
            return False
        if self.minimum is not None and value < self.minimum:
            return False
        if self.maximum is not None and value > self.maximum:
            return False
        return not (self.kind == "odd_integer" and value % 2 == 0)


def _number(x: float) -> str:
    return str(int(x)) if float(x).is_integer() and abs(x) < 1e16 else f"{x:g}"


@dataclass(frozen=True)
class ChainStep:
    """One per-label step of the decoding chain.

    Args:
        name: the step's name in the parameters' ``order``.
        param: its per-label parameter (one value per label).
        kernel: ``(x (T, C), values (C,)) -> (T, C)``: the step on probabilities (float) or on the binary mask
            (bool), vectorised over frames and columns.
        needs_mask: the step works on the binary mask only, so it must come after ``"threshold"``.
        needs_probs: the step works on the probabilities only, so it must come before ``"threshold"``.
        searched: the tuner searches its grid by default (else only when its grid is given to it).
        context: the kernel also takes ``probs=`` (the probabilities that entered ``"threshold"``) and
            ``thresholds=`` (their per-column thresholds); only for a step after ``"threshold"``.
        doc: what the step does.
    """

    name: str
    param: Param
    kernel: Callable[[np.ndarray, np.ndarray], np.ndarray] = field(compare=False)
    needs_mask: bool = False
    needs_probs: bool = False
    searched: bool = True
    context: bool = False
    doc: str = ""

    def __post_init__(self) -> None:
        if self.needs_mask and self.needs_probs:
            raise ValueError(f"ChainStep {self.name!r}: needs_mask and needs_probs exclude each other")
        if self.context and not self.needs_mask:
            raise ValueError(f"ChainStep {self.name!r}: a context step reads the threshold, so it needs_mask")
