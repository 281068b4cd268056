"""The temporal refiner: a network over a whole video's per-frame inputs, returning refined probabilities.

:class:`TemporalRefiner` wraps a :data:`NETWORKS` network (default :class:`LabelwiseTCN`; :class:`MultiStageTCN`
for features alone), refines in exact chunks and saves one checked file.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from monai_vce.labels import LABELS, NUM_LABELS, SECTIONS
from monai_vce.utils import atomic_write_bytes, check_torch_seal, seal_torch_bytes

from .losses import as_stages
from .networks import LabelwiseTCN, MultiStageTCN, network_context

__all__ = [
    "RATE_TOLERANCE",
    "refine_at_rate",
    "INPUTS",
    "POSITION_CHANNELS",
    "FILE_FORMAT",
    "ENSEMBLE_FORMAT",
    "NETWORKS",
    "TemporalRefiner",
    "RefinerEnsemble",
    "load_refiner_file",
    "input_channels",
    "position_channels",
]

#: The input kinds of a refiner.
INPUTS: tuple[str, ...] = ("probs", "features", "both")
#: Input channels added by ``position=True``: relative position, log frames since the start, log frames to the end.
POSITION_CHANNELS = 3
#: The ``format`` entry of a saved refiner.
FILE_FORMAT = "monai_vce.temporal_refiner"
#: The ``format`` entry of a saved :class:`RefinerEnsemble`.
ENSEMBLE_FORMAT = "monai_vce.temporal_refiner_ensemble"
_FILE_VERSION = 1

PathLike = str | os.PathLike


def input_channels(inputs: str, feature_dim: int = 0, position: bool = False) -> int:
    """Input channels per frame of a refiner: 17 for ``"probs"``, ``D`` for ``"features"``, ``17 + D`` for
    ``"both"``, plus :data:`POSITION_CHANNELS` with ``position``."""
    if inputs not in INPUTS:
        raise ValueError(f"inputs must be one of {INPUTS}, got {inputs!r}")
    if inputs != "probs" and int(feature_dim) < 1:
        raise ValueError(f"inputs={inputs!r} needs feature_dim >= 1 (the width D of the features), got {feature_dim}")
    base = {"probs": NUM_LABELS, "features": int(feature_dim), "both": NUM_LABELS + int(feature_dim)}[inputs]
    return base + (POSITION_CHANNELS if position else 0)


def position_channels(offset: int, rows: int, total: int) -> np.ndarray:
    """``(3, rows)`` position inputs of the frames ``offset .. offset + rows - 1`` of a ``total``-frame video:
    relative position ``(t + 0.5) / total``, ``log(1 + t)`` and ``log(total - t)`` (frames since the start and
    to the end, on a log scale: the mouth lasts tens of frames, the colon thousands)."""
    t = np.arange(offset, offset + rows, dtype=np.float64)
    return np.stack([(t + 0.5) / max(total, 1), np.log1p(t), np.log(np.maximum(total - t, 1.0))]).astype(np.float32)


def _class_path_of(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _class_path(obj: nn.Module) -> str:
    return _class_path_of(type(obj))


def _network_name(obj: nn.Module) -> str:
    """The ``_target_`` a file records: the :data:`NETWORKS` key of a project network, else the class path (such a
    file is refused when read: nothing a file names is imported)."""
    names = {cls: name for name, cls in NETWORKS.items()}
    return names.get(type(obj), _class_path(obj))


#: The refinement networks a refiner file or a ``network`` mapping may name (``_target_``), by class name; a name
#: outside it is refused before anything is imported: importing a module runs its code.
NETWORKS: dict[str, type[nn.Module]] = {"LabelwiseTCN": LabelwiseTCN, "MultiStageTCN": MultiStageTCN}

#: Accepted ranges of the integer sizes of a network's configuration, checked before it is built (a small file
#: declaring huge sizes must not make the loader allocate gigabytes before refusing it).
_INT_RANGES: dict[str, tuple[int, int]] = {
    "in_channels": (1, 1 << 16),
    "out_channels": (1, 1 << 16),
    "stages": (0, 64),
    "layers": (0, 64),
    "channels": (1, 4096),
    "kernel_size": (1, 64),
    "label_features": (0, 256),
    "embedding": (0, 256),
    "context_channels": (0, 4096),
    "context_layers": (0, 64),
    "lookback": (0, 1 << 20),
    "lookahead": (0, 1 << 20),
}
_MAX_CHANGE_POINTS = 64
_MAX_STEP_SPANS = 16
#: Members an ensemble file may hold (cross-fitting folds are a handful).
_MAX_MEMBERS = 256


def _network_class(target: Any) -> type[nn.Module]:
    """The class named by a ``_target_``: a key of :data:`NETWORKS`, or a class itself."""
    if isinstance(target, type) and issubclass(target, nn.Module):
        return target  # given in code, not read from a file
    cls = NETWORKS.get(target) if isinstance(target, str) else None
    if cls is None:
        raise ValueError(
            f"network _target_ {_short(target)} is not a refinement network of this project; "
            f"expected one of {sorted(NETWORKS)} (nothing else is imported)"
        )
    return cls


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _check_network_sizes(kwargs: Mapping[str, Any]) -> None:
    """Range-check the sizes of a network configuration (types included) before anything is built."""
    for key, value in kwargs.items():
        if key in _INT_RANGES:
            lo, hi = _INT_RANGES[key]
            if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
                raise ValueError(f"network {key} must be an integer in [{lo}, {hi}], got {_short(value)}")
        elif key == "dropout":
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0.0 <= value < 1.0:
                raise ValueError(f"network dropout must be a number in [0, 1), got {_short(value)}")
        elif key == "residual":
            if not isinstance(value, bool):
                raise ValueError(f"network residual must be true or false, got {_short(value)}")
        elif key == "change_points" and (
            not isinstance(value, list | tuple)
            or len(value) > _MAX_CHANGE_POINTS
            or not all(isinstance(h, int | float) and not isinstance(h, bool) and math.isfinite(h) for h in value)
        ):
            raise ValueError(
                f"network change_points must be a list of at most {_MAX_CHANGE_POINTS} finite numbers, "
                f"got {_short(value)}"
            )
        elif key == "step_spans" and (
            not isinstance(value, list | tuple)
            or not 1 <= len(value) <= _MAX_STEP_SPANS
            or not all(isinstance(k, int) and not isinstance(k, bool) and 1 <= k <= 4096 for k in value)
        ):
            raise ValueError(
                f"network step_spans must be a list of 1 to {_MAX_STEP_SPANS} integers in [1, 4096], "
                f"got {_short(value)}"
            )


def _build_network(
    spec: Mapping[str, Any], in_channels: int, inputs: str, state: Mapping[str, Any] | None = None
) -> nn.Module:
    """Build a network from ``{"_target_": name, **kwargs}`` (a key of :data:`NETWORKS`); the default target is
    :class:`LabelwiseTCN` when the probabilities are among the inputs (it reads them as per-label evidence)
    and :class:`MultiStageTCN` for features alone.

    With ``state`` (the weights of a file), the network is first built on the ``meta`` device (nothing allocated)
    and every tensor shape it declares must match the file's, so that the real build allocates no more than the
    file holds.
    """
    kwargs = {k: v for k, v in spec.items() if k != "_target_"}
    default = MultiStageTCN if inputs == "features" else LabelwiseTCN
    cls = _network_class(spec.get("_target_", default))
    if cls in NETWORKS.values():
        _check_network_sizes(kwargs)
    if cls is LabelwiseTCN and inputs == "features":
        raise ValueError("LabelwiseTCN reads per-label probabilities; inputs='features' has none (use MultiStageTCN)")
    if cls is MultiStageTCN:
        # the probabilities come first in the inputs: refine them rather than predict from scratch
        kwargs.setdefault("residual", inputs != "features")
    kwargs.setdefault("in_channels", in_channels)
    kwargs.setdefault("out_channels", NUM_LABELS)
    if kwargs["in_channels"] != in_channels or kwargs["out_channels"] != NUM_LABELS:
        raise ValueError(
            f"network has in_channels={kwargs['in_channels']}, out_channels={kwargs['out_channels']}; "
            f"the inputs need {in_channels} and {NUM_LABELS}"
        )
    if state is not None:
        with torch.device("meta"):
            declared = {f"network.{k}": v for k, v in cls(**kwargs).state_dict().items()}
        for key, tensor in declared.items():
            saved = state.get(key)
            if not isinstance(saved, torch.Tensor):
                raise ValueError(f"the weights have no tensor {key!r} that the configured network needs")
            if tuple(saved.shape) != tuple(tensor.shape):
                raise ValueError(
                    f"tensor {key!r} has shape {tuple(saved.shape)}, the configured network declares "
                    f"{tuple(tensor.shape)}"
                )
    return cls(**kwargs)


class TemporalRefiner(nn.Module):
    """Refines a video's per-frame outputs with a temporal network (see ``docs/design/temporal.md``).

    Args:
        inputs: ``"probs"``, ``"features"`` or ``"both"``.
        feature_dim: width ``D`` of the features (needed unless ``inputs="probs"``).
        network: the refinement network: ``None`` (with its defaults, a :class:`LabelwiseTCN` when the
            probabilities are among the inputs, else a :class:`MultiStageTCN`), a mapping of
            its arguments, optionally with a ``"_target_"``: a key of :data:`NETWORKS` (no other name is
            imported) or an ``nn.Module`` class given in code (the input and output widths are filled in), or a
            built module mapping ``(B, C_in, T)`` inputs and an optional ``(B, 1, T)`` mask to ``(B, 17, T)`` or
            ``(S, B, 17, T)`` logits. A built module is saved by its :data:`NETWORKS` key (another class: its
            class path, which no file may name when read) and its ``config`` attribute (its constructor
            arguments), so it needs one.
        prob_floor: probabilities are clipped to ``[prob_floor, 1 - prob_floor]`` before the logit.
        position: add :data:`POSITION_CHANNELS` inputs telling each frame where it lies in the video (a capsule
            meets the sections in order, so position is evidence; it also tells a video's true start from any
            other frame).
        passthrough: labels whose input probabilities :meth:`refine` returns unchanged, for labels the decoder
            already models better than a refiner trained on few videos can; the refiner still reads them as
            inputs. ``None`` (default): the five sections when the probabilities are among the inputs (the
            decoder's Viterbi places them along the gut order, and keeps the short mouth and esophagus runs at a
            video's start that a refiner fitted frame by frame squashes: see BENCHMARKS.md, "Temporal refiner"),
            none otherwise; ``()`` refines every label.
        chunk_size: frames per chunk of :meth:`refine` (``None`` or 0: whole videos at once).

    Example::

        refiner = TemporalRefiner(inputs="probs", network={"stages": 4, "layers": 10, "channels": 32})
        refined = refiner.refine(probs)  # (T, 17) -> (T, 17) probabilities
    """

    def __init__(
        self,
        inputs: str = "probs",
        feature_dim: int = 0,
        network: nn.Module | Mapping[str, Any] | None = None,
        prob_floor: float = 1e-4,
        position: bool = False,
        passthrough: Sequence[str] | None = None,
        chunk_size: int | None = 65536,
    ) -> None:
        super().__init__()
        in_channels = input_channels(inputs, feature_dim, position)
        if not 0.0 < prob_floor < 0.5:
            raise ValueError(f"prob_floor must be in (0, 0.5), got {prob_floor}")
        if chunk_size is not None and int(chunk_size) < 0:
            raise ValueError(f"chunk_size must be >= 0 or None, got {chunk_size}")
        self.inputs = inputs
        self.feature_dim = int(feature_dim) if inputs != "probs" else 0
        self.prob_floor = float(prob_floor)
        self.position = bool(position)
        self.chunk_size = None if chunk_size is None else int(chunk_size)
        if passthrough is None:
            passthrough = SECTIONS if inputs != "features" else ()
        unknown = [n for n in passthrough if n not in LABELS]
        if unknown:
            raise ValueError(f"passthrough: unknown label(s) {unknown}; expected names from LABELS")
        if passthrough and inputs == "features":
            raise ValueError("passthrough needs probabilities among the inputs (inputs='probs' or 'both')")
        self.passthrough = [n for n in LABELS if n in set(passthrough)]
        if isinstance(network, nn.Module):
            self.network = network
        else:
            self.network = _build_network(dict(network or {}), in_channels, inputs)
        self.input_mean: torch.Tensor
        self.input_std: torch.Tensor
        self.register_buffer("input_mean", torch.zeros(in_channels))
        self.register_buffer("input_std", torch.ones(in_channels))
        #: what the refiner was fitted on (video ids, settings, losses); saved with it
        self.fit_info: dict[str, Any] = {}

    @property
    def in_channels(self) -> int:
        return int(self.input_mean.numel())

    @property
    def context(self) -> int | None:
        """Frames on each side that an output depends on (``None`` when the network does not say)."""
        return network_context(self.network)

    @property
    def trained_videos(self) -> list[str]:
        """Ids of the videos the refiner was fitted on (empty when unknown)."""
        return [str(v) for v in self.fit_info.get("videos", [])]

    # ------------------------------------------------------------------ inputs
    def check_inputs(
        self, probs: np.ndarray | None, features: np.ndarray | None = None, where: str = "video"
    ) -> tuple[np.ndarray | None, np.ndarray | None]:
        """Validate one video's inputs; errors are one line naming ``where``.

        Returns:
            ``(probs (T, 17) float32 or None, features (T, D) or None)`` as the refiner needs them.
        """
        if self.inputs in ("probs", "both"):
            if probs is None:
                raise ValueError(f"{where}: the refiner needs probabilities")
            probs = np.asarray(probs)
            if probs.ndim != 2 or probs.shape[1] != NUM_LABELS:
                raise ValueError(f"{where}: expected probabilities of shape (T, {NUM_LABELS}), got {probs.shape}")
            probs = probs.astype(np.float32, copy=False)
            if not np.isfinite(probs).all():
                t = int(np.argwhere(~np.isfinite(probs))[0, 0])
                raise ValueError(f"{where}: non-finite probability at row {t}")
            if probs.size and (probs.min() < 0.0 or probs.max() > 1.0):
                t = int(np.argwhere((probs < 0) | (probs > 1))[0, 0])
                raise ValueError(f"{where}: probability outside [0, 1] at row {t}; pass sigmoid outputs, not logits")
        if self.inputs in ("features", "both"):
            if features is None:
                raise ValueError(
                    f"{where}: the refiner was built for inputs={self.inputs!r} and needs per-frame features "
                    f"(the 'features' array of the probability file)"
                )
            features = np.asarray(features)
            if features.ndim != 2 or features.shape[1] != self.feature_dim:
                raise ValueError(f"{where}: expected features of shape (T, {self.feature_dim}), got {features.shape}")
            if probs is not None and features.shape[0] != probs.shape[0]:
                raise ValueError(
                    f"{where}: {features.shape[0]} feature rows but {probs.shape[0]} probability rows; one per frame"
                )
            if not np.isfinite(features).all():
                t = int(np.argwhere(~np.isfinite(features))[0, 0])
                raise ValueError(f"{where}: non-finite feature at row {t}")
        return probs, features

    def raw_inputs(
        self, probs: np.ndarray | None, features: np.ndarray | None = None, offset: int = 0, total: int | None = None
    ) -> np.ndarray:
        """``(C_in, n)`` float32 network inputs before standardisation (probability logits, features, position).

        Args:
            probs: ``(n, 17)`` probabilities (or ``None`` for ``inputs="features"``).
            features: ``(n, D)`` features (or ``None`` for ``inputs="probs"``).
            offset: position in the video of the first row (for the position channels).
            total: frames of the whole video (default ``offset + n``).
        """
        parts = []
        if self.inputs in ("probs", "both"):
            p = np.clip(np.asarray(probs, dtype=np.float32), self.prob_floor, 1.0 - self.prob_floor)
            parts.append((np.log(p) - np.log1p(-p)).T)
        if self.inputs in ("features", "both"):
            parts.append(np.asarray(features, dtype=np.float32).T)
        if self.position:
            rows = len(probs) if probs is not None else len(features)  # type: ignore[arg-type]
            parts.append(position_channels(offset, rows, offset + rows if total is None else int(total)))
        return np.ascontiguousarray(np.concatenate(parts, axis=0) if len(parts) > 1 else parts[0])

    def set_input_statistics(self, mean: np.ndarray, std: np.ndarray) -> None:
        """Set the per-channel standardisation of the inputs (mean and standard deviation over training frames).

        A network with an ``init_skip(scale, bias)`` method (the residual :class:`MultiStageTCN`) gets the inverse
        map of the probability channels, so that before training it returns the frame model's logits unchanged.
        """
        mean_t = torch.as_tensor(np.asarray(mean, dtype=np.float32))
        std_t = torch.as_tensor(np.asarray(std, dtype=np.float32))
        if mean_t.shape != self.input_mean.shape or std_t.shape != self.input_std.shape:
            raise ValueError(f"input statistics must have shape ({self.in_channels},)")
        self.input_mean.copy_(mean_t)
        self.input_std.copy_(torch.clamp(std_t, min=1e-6))
        init_skip = getattr(self.network, "init_skip", None)
        if callable(init_skip) and self.inputs != "features":
            init_skip(self.input_std[:NUM_LABELS].clone(), self.input_mean[:NUM_LABELS].clone())

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        """Standardise ``(..., C_in, T)`` raw inputs channel by channel."""
        return (x - self.input_mean[:, None]) / self.input_std[:, None]

    # ------------------------------------------------------------------ forward
    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """
        Args:
            x: ``(B, C_in, T)`` raw inputs (:meth:`raw_inputs`; standardised here).
            mask: optional ``(B, 1, T)`` 0/1 mask of real frames.

        Returns:
            ``(S, B, 17, T)`` logits of every stage of the network (``S = 1`` for single-output networks).
        """
        x = self.normalize(x)
        out = self.network(x) if mask is None else self.network(x * mask, mask)
        return as_stages(out)

    def logits(self, x: torch.Tensor, chunk_size: int | None = None) -> torch.Tensor:
        """``(17, T)`` final-stage logits of one video's ``(C_in, T)`` raw inputs, computed chunk by chunk.

        Args:
            x: ``(C_in, T)`` raw inputs.
            chunk_size: frames per chunk (default :attr:`chunk_size`); 0, or a network without a declared
                ``context``: the whole video at once.
        """
        chunk = self.chunk_size if chunk_size is None else int(chunk_size)
        ctx = self.context
        T = int(x.shape[-1])
        if not chunk or ctx is None or chunk >= T:
            return self(x[None])[-1, 0]
        out = x.new_empty((NUM_LABELS, T))
        for start in range(0, T, chunk):
            stop = min(start + chunk, T)
            lo, hi = max(0, start - ctx), min(T, stop + ctx)
            out[:, start:stop] = self(x[None, :, lo:hi])[-1, 0, :, start - lo : stop - lo]
        return out

    @property
    def rows_per_second(self) -> float | None:
        """The row rate of the videos it was fitted on (``fit_info["rows_per_second"]``), ``None`` when unknown."""
        return _fitted_rate(self.fit_info)

    def refine(
        self,
        probs: np.ndarray | None,
        features: np.ndarray | None = None,
        chunk_size: int | None = None,
        rows_per_second: float | None = None,
    ) -> np.ndarray:
        """Refined probabilities of one whole video.

        Args:
            probs: ``(T, 17)`` frame probabilities in :data:`~monai_vce.labels.LABELS` order (may be ``None`` for
                ``inputs="features"``).
            features: ``(T, D)`` frame features (for ``inputs="features"`` / ``"both"``).
            chunk_size: frames per chunk (default :attr:`chunk_size`; 0: the whole video at once); the result
                does not depend on it.
            rows_per_second: the video's row rate; when it and :attr:`rows_per_second` are known and differ by
                more than 5 %, the video is resampled to the fitted rate, refined and resampled back
                (:func:`refine_at_rate`), so that the network's windows span the seconds it learned.

        Returns:
            ``(T, 17)`` float32 refined probabilities.

        Raises:
            ValueError: inputs of the wrong shape, non-finite, or probabilities outside [0, 1].
        """
        probs, features = self.check_inputs(probs, features)
        if _needs_resampling(rows_per_second, self.rows_per_second):
            return refine_at_rate(self, probs, features, rows_per_second, chunk_size)  # type: ignore[arg-type]
        T = probs.shape[0] if probs is not None else features.shape[0]  # type: ignore[union-attr]
        if T == 0:
            return np.zeros((0, NUM_LABELS), dtype=np.float32)
        device = self.input_mean.device
        was_training = self.training
        self.eval()
        try:
            with torch.inference_mode():
                x = torch.from_numpy(self.raw_inputs(probs, features)).to(device)
                out = torch.sigmoid(self.logits(x, chunk_size))
        finally:
            self.train(was_training)
        refined = out.T.float().cpu().numpy().astype(np.float32, copy=False)
        if self.passthrough:
            keep = [LABELS.index(n) for n in self.passthrough]
            refined[:, keep] = probs[:, keep]  # type: ignore[index]
        return refined

    # ------------------------------------------------------------------ files
    def get_config(self) -> dict[str, Any]:
        """The JSON-able configuration that rebuilds this refiner (weights excluded)."""
        net_config = getattr(self.network, "config", None)
        if not isinstance(net_config, Mapping):
            raise ValueError(
                f"network {_class_path(self.network)} has no 'config' dict of its constructor arguments; "
                f"it cannot be saved"
            )
        return {
            "inputs": self.inputs,
            "feature_dim": self.feature_dim,
            "prob_floor": self.prob_floor,
            "position": self.position,
            "passthrough": list(self.passthrough),
            "chunk_size": self.chunk_size,
            "network": {"_target_": _network_name(self.network), **dict(net_config)},
            "labels": list(LABELS),
        }

    def payload(self) -> dict[str, Any]:
        """The refiner file's content: configuration as JSON text, fit record, weights (see :meth:`save`)."""
        return {
            "format": FILE_FORMAT,
            "version": _FILE_VERSION,
            "config": json.dumps(self.get_config()),
            "fit": json.dumps(self.fit_info),
            "state_dict": {k: v.detach().cpu() for k, v in self.state_dict().items()},
        }

    def save(self, path: PathLike) -> Path:
        """Write the refiner (configuration as JSON text, fit record, weights) to ``path`` atomically."""
        return _save_payload(path, self.payload())

    @classmethod
    def from_payload(cls, payload: Any, where: str, map_location: str | torch.device = "cpu") -> TemporalRefiner:
        """Rebuild a refiner from :meth:`payload` (as read back by ``torch.load(weights_only=True)``).

        Raises:
            ValueError: not a refiner's content, or weights that do not match its configuration (naming ``where``).
        """
        if not isinstance(payload, dict) or payload.get("format") != FILE_FORMAT:
            if isinstance(payload, dict) and payload.get("format") == ENSEMBLE_FORMAT:
                raise ValueError(
                    f"{where} is a refiner ensemble; read it with monai_vce.temporal.load_refiner or "
                    "RefinerEnsemble.load"
                )
            raise ValueError(f"{where} is not a temporal refiner (no format {FILE_FORMAT!r})")
        _check_version(payload, where)
        try:
            config, fit_info = _read_config(payload)
            state = payload.get("state_dict")
            if not isinstance(state, dict) or not all(
                isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in state.items()
            ):
                raise ValueError("its 'state_dict' is not a dict of named tensors")
            network = config.get("network")
            if network is not None and not isinstance(network, dict):
                raise ValueError(f"its network configuration is a {type(network).__name__}, not a mapping")
            network = dict(network or {})
            in_channels = input_channels(
                config.get("inputs", "probs"), config.get("feature_dim", 0), config.get("position", False)
            )
            # sizes range-checked and matched against the file's tensors before the real network is built
            config["network"] = _build_network(network, in_channels, config.get("inputs", "probs"), state)
            refiner = cls(**config)
            refiner.load_state_dict(state, strict=True)
        except Exception as e:  # whatever the content: one line naming the file, never a traceback
            raise ValueError(f"{where}: {_first_line(e)}") from None
        refiner.fit_info = fit_info
        return refiner.to(map_location)

    @classmethod
    def load(cls, path: PathLike, map_location: str | torch.device = "cpu") -> TemporalRefiner:
        """Read a refiner written by :meth:`save` (``torch.load(weights_only=True)``: no code is unpickled).

        Raises:
            FileNotFoundError: the file is missing.
            ValueError: the file is not a refiner file or does not match its configuration (one line naming it).
        """
        path = Path(path)
        return cls.from_payload(_load_payload(path, map_location), f"refiner file {path}", map_location)

    @staticmethod
    def fingerprint(path: PathLike) -> str:
        """A short content hash of a refiner file, recorded as the ``source`` of the probability files it refines."""
        return "refiner:" + hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0][:300] if text else type(e).__name__


def _check_version(payload: dict, where: str) -> None:
    version = payload.get("version")
    if isinstance(version, bool) or version != _FILE_VERSION:
        raise ValueError(f"{where} has version {_short(version)}; this code reads {_FILE_VERSION}")


#: The entries of a refiner configuration and the types each must have (checked before anything is built).
_CONFIG_TYPES: dict[str, tuple[type, ...]] = {
    "inputs": (str,),
    "feature_dim": (int,),
    "prob_floor": (float, int),
    "position": (bool,),
    "passthrough": (list,),
    "chunk_size": (int, type(None)),
    "network": (dict, type(None)),
}


def _read_config(payload: dict) -> tuple[dict[str, Any], dict[str, Any]]:
    """The configuration and fit record of a refiner payload, with the label list required and every entry typed."""
    text, fit = payload.get("config"), payload.get("fit", "{}")
    if not isinstance(text, str) or not isinstance(fit, str):
        raise ValueError("its 'config' and 'fit' entries are not JSON text")
    config, fit_info = json.loads(text), json.loads(fit)
    if not isinstance(config, dict) or not isinstance(fit_info, dict):
        raise ValueError("its 'config' and 'fit' entries are not JSON objects")
    if "labels" not in config:
        raise ValueError(
            "it records no label list (the 17 labels its outputs are in the order of); refit or re-save it"
        )
    if config.pop("labels") != list(LABELS):
        raise ValueError("its labels differ from the 17 LABELS")
    for key, value in config.items():
        types = _CONFIG_TYPES.get(key)
        if types is None:
            raise ValueError(f"its configuration has an unknown entry {_short(key)}")
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
            raise ValueError(f"its configuration entry {key!r} has the wrong type: {_short(value)}")
    if not 0 <= config.get("feature_dim", 0) <= _INT_RANGES["in_channels"][1]:
        raise ValueError(f"its feature_dim {config['feature_dim']} is out of range")
    if not all(isinstance(n, str) for n in config.get("passthrough", [])):
        raise ValueError("its passthrough entry is not a list of label names")
    return config, fit_info


def _save_payload(path: PathLike, payload: dict[str, Any]) -> Path:
    buf = io.BytesIO()
    torch.save(payload, buf)
    # a checksum of the pickle and tensors, checked on load (torch.load ignores the extra record)
    return atomic_write_bytes(path, seal_torch_bytes(buf.getvalue()))


def _load_payload(path: Path, map_location: str | torch.device = "cpu") -> Any:
    if not path.exists():
        raise FileNotFoundError(f"refiner file {path} not found")
    if not path.is_file():  # a folder, device or pipe (reading a pipe would wait forever)
        raise ValueError(f"refiner file {path} is not a regular file")
    try:
        with open(path, "rb") as f:
            head = f.read(2)
    except OSError as e:
        raise ValueError(f"refiner file {path} is unreadable: {e.strerror or e}") from None
    if not head:
        raise ValueError(f"refiner file {path} is empty (0 bytes): a copy or a save was cut short")
    if head != b"PK" and head[:1] != b"\x80":
        raise ValueError(f"refiner file {path} is not a file written by torch.save")
    check_torch_seal(path, "refiner file")
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except Exception as e:  # damaged file, or pickled objects beyond tensors and plain data
        raise ValueError(f"refiner file {path} is unreadable: {_first_line(e)}") from None


class RefinerEnsemble(nn.Module):
    """The mean of several refiners' refined probabilities; by default the fold refiners of cross-fitting.

    It has the interface of :class:`TemporalRefiner` that the product uses (:meth:`refine`, ``inputs``,
    ``feature_dim``, ``passthrough``, ``trained_videos``, ``fit_info``, :meth:`save` / :meth:`load`), so it
    goes wherever a refiner goes (``monai_vce.temporal.load_refiner`` reads either file). Why the fold ensemble:
    ``docs/design/temporal.md``.

    Args:
        refiners: the members: :class:`TemporalRefiner` instances with the same ``inputs``, ``feature_dim`` and
            ``passthrough``.

    Example::

        fit = cross_fit_refiner(videos, folds=3)       # fit.refiner is the fold refiners' ensemble
        fit.refiner.save("refiner.pt")
        refined = load_refiner("refiner.pt").refine(probs)
    """

    def __init__(self, refiners: Sequence[TemporalRefiner]) -> None:
        super().__init__()
        members = list(refiners)
        if not members:
            raise ValueError("a refiner ensemble needs at least one refiner")
        for i, r in enumerate(members):
            if not isinstance(r, TemporalRefiner):
                raise ValueError(f"refiner ensemble member {i} is a {type(r).__name__}, not a TemporalRefiner")
            for attr in ("inputs", "feature_dim", "passthrough"):
                if getattr(r, attr) != getattr(members[0], attr):
                    raise ValueError(
                        f"refiner ensemble member {i} has {attr}={getattr(r, attr)!r}, member 0 "
                        f"{getattr(members[0], attr)!r}; members must read and return the same"
                    )
        self.members = nn.ModuleList(members)
        #: what the ensemble was built from (e.g. the cross-fitting folds); saved with it
        self.fit_info: dict[str, Any] = {"members": len(members)}

    def _member(self, i: int) -> TemporalRefiner:
        member = self.members[i]
        assert isinstance(member, TemporalRefiner)
        return member

    @property
    def inputs(self) -> str:
        return self._member(0).inputs

    @property
    def feature_dim(self) -> int:
        return self._member(0).feature_dim

    @property
    def passthrough(self) -> list[str]:
        return list(self._member(0).passthrough)

    @property
    def context(self) -> int | None:
        """The largest context of the members (``None`` when one does not declare it)."""
        contexts = [self._member(i).context for i in range(len(self.members))]
        return None if any(c is None for c in contexts) else max(int(c) for c in contexts)  # type: ignore[arg-type]

    @property
    def trained_videos(self) -> list[str]:
        """Ids of the videos any member was fitted on."""
        seen: dict[str, None] = {}
        for i in range(len(self.members)):
            seen.update(dict.fromkeys(self._member(i).trained_videos))
        return list(seen)

    def check_inputs(
        self, probs: np.ndarray | None, features: np.ndarray | None = None, where: str = "video"
    ) -> tuple[np.ndarray | None, np.ndarray | None]:
        """Validate one video's inputs (:meth:`TemporalRefiner.check_inputs`)."""
        return self._member(0).check_inputs(probs, features, where)

    @property
    def rows_per_second(self) -> float | None:
        """The row rate of the videos its members were fitted on (the first member's), ``None`` when unknown."""
        return _fitted_rate(self.fit_info) or self._member(0).rows_per_second

    def refine(
        self,
        probs: np.ndarray | None,
        features: np.ndarray | None = None,
        chunk_size: int | None = None,
        rows_per_second: float | None = None,
    ) -> np.ndarray:
        """The members' mean refined probabilities of one whole video (:meth:`TemporalRefiner.refine`)."""
        probs, features = self.check_inputs(probs, features)
        if _needs_resampling(rows_per_second, self.rows_per_second):
            return refine_at_rate(self, probs, features, rows_per_second, chunk_size)  # type: ignore[arg-type]
        total = self._member(0).refine(probs, features, chunk_size)
        for i in range(1, len(self.members)):
            total += self._member(i).refine(probs, features, chunk_size)
        total /= len(self.members)
        if self.passthrough:
            keep = [LABELS.index(n) for n in self.passthrough]
            total[:, keep] = probs[:, keep]  # type: ignore[index]  # exactly the inputs, not their mean
        return total

    def payload(self) -> dict[str, Any]:
        """The ensemble file's content: the members' :meth:`TemporalRefiner.payload` and the fit record."""
        return {
            "format": ENSEMBLE_FORMAT,
            "version": _FILE_VERSION,
            "fit": json.dumps(self.fit_info),
            "members": [self._member(i).payload() for i in range(len(self.members))],
        }

    def save(self, path: PathLike) -> Path:
        """Write the ensemble (every member and the fit record) to ``path`` atomically."""
        return _save_payload(path, self.payload())

    @classmethod
    def load(cls, path: PathLike, map_location: str | torch.device = "cpu") -> RefinerEnsemble:
        """Read an ensemble written by :meth:`save` (``torch.load(weights_only=True)``).

        Raises:
            FileNotFoundError: the file is missing.
            ValueError: the file is not an ensemble file, or a member is damaged (one line naming it).
        """
        path = Path(path)
        return cls.from_payload(_load_payload(path, map_location), f"refiner file {path}", map_location)

    @classmethod
    def from_payload(cls, payload: Any, where: str, map_location: str | torch.device = "cpu") -> RefinerEnsemble:
        """Rebuild an ensemble from :meth:`payload`.

        Raises:
            ValueError: not an ensemble's content, or a member that does not rebuild (naming ``where``).
        """
        if not isinstance(payload, dict) or payload.get("format") != ENSEMBLE_FORMAT:
            raise ValueError(f"{where} is not a refiner ensemble (no format {ENSEMBLE_FORMAT!r})")
        _check_version(payload, where)
        members = payload.get("members")
        if not isinstance(members, list) or not members:
            raise ValueError(f"{where}: the ensemble has no members")
        if len(members) > _MAX_MEMBERS:
            raise ValueError(f"{where}: the ensemble has {len(members)} members; at most {_MAX_MEMBERS} are read")
        refiners = [
            TemporalRefiner.from_payload(m, f"{where}, member {i}", map_location) for i, m in enumerate(members)
        ]
        try:
            ensemble = cls(refiners)
            fit_info = json.loads(payload.get("fit", "{}"))
        except Exception as e:
            raise ValueError(f"{where}: {str(e).splitlines()[0]}") from None
        ensemble.fit_info = fit_info
        return ensemble


def load_refiner_file(path: PathLike, map_location: str | torch.device = "cpu") -> TemporalRefiner | RefinerEnsemble:
    """Read a refiner file, a :class:`TemporalRefiner` or a :class:`RefinerEnsemble` (as its format says).

    Raises:
        FileNotFoundError: the file is missing.
        ValueError: the file is neither (one line naming it).
    """
    path = Path(path)
    payload = _load_payload(path, map_location)
    where = f"refiner file {path}"
    if isinstance(payload, dict) and payload.get("format") == ENSEMBLE_FORMAT:
        return RefinerEnsemble.from_payload(payload, where, map_location)
    return TemporalRefiner.from_payload(payload, where, map_location)


#: Relative difference of row rates below which a video is refined as it is (no resampling).
RATE_TOLERANCE = 0.05


def _fitted_rate(fit_info: Mapping[str, Any]) -> float | None:
    rate = fit_info.get("rows_per_second") if isinstance(fit_info, Mapping) else None
    ok = isinstance(rate, (int, float)) and not isinstance(rate, bool) and math.isfinite(rate) and rate > 0
    return float(rate) if ok else None  # type: ignore[arg-type]


def _needs_resampling(rate: float | None, fitted: float | None) -> bool:
    return rate is not None and fitted is not None and abs(float(rate) / fitted - 1.0) > RATE_TOLERANCE


def refine_at_rate(
    refiner: TemporalRefiner | RefinerEnsemble,
    probs: np.ndarray | None,
    features: np.ndarray | None,
    rows_per_second: float,
    chunk_size: int | None = None,
) -> np.ndarray:
    """Refine a video recorded at ``rows_per_second`` at the refiner's fitted rate: the inputs' logits (and
    features) are linearly resampled to that rate, refined, and the refined logits resampled back to the rows.

    Returns:
        ``(T, 17)`` float32 refined probabilities; passthrough labels are the inputs exactly.
    """
    fitted = refiner.rows_per_second
    if fitted is None:
        raise ValueError("refine_at_rate: the refiner records no rows_per_second (fit it on videos with a frame rate)")
    T = probs.shape[0] if probs is not None else features.shape[0]  # type: ignore[union-attr]
    n = max(2, round(T * fitted / float(rows_per_second)))
    if T < 2:
        return refiner.refine(probs, features, chunk_size)
    rows = np.arange(T, dtype=np.float64)
    grid = np.linspace(0.0, T - 1.0, n)

    def resample(x: np.ndarray, at: np.ndarray, of: np.ndarray) -> np.ndarray:
        # np.interp per column, vectorised: the same weights for every column
        hi = np.clip(np.searchsorted(of, at, side="right"), 1, len(of) - 1)
        w = ((at - of[hi - 1]) / (of[hi] - of[hi - 1]))[:, None]
        return (1.0 - w) * x[hi - 1] + w * x[hi]

    eps = 1e-6
    p = None
    if probs is not None:
        q = np.clip(probs.astype(np.float64), eps, 1 - eps)
        p = (1.0 / (1.0 + np.exp(-resample(np.log(q / (1 - q)), grid, rows)))).astype(np.float32)
    f = None if features is None else resample(features.astype(np.float32), grid, rows).astype(np.float32)
    out = refiner.refine(p, f, chunk_size)
    r = np.clip(out.astype(np.float64), eps, 1 - eps)
    back = (1.0 / (1.0 + np.exp(-resample(np.log(r / (1 - r)), rows, grid)))).astype(np.float32)
    if refiner.passthrough and probs is not None:
        keep = [LABELS.index(name) for name in refiner.passthrough]
        back[:, keep] = probs[:, keep]
    return back
