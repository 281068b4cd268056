"""Label-frequency weighted frame samplers: a frame's weight is ``f_c ** -exponent`` (0.5: inverse square root) of
its rarest positive label (or the mean), all-negative frames as one pseudo-class; drawn with replacement.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from monai.data import DistributedWeightedRandomSampler
from torch.utils.data import Sampler

__all__ = [
    "label_frequency_weights",
    "SqrtFrequencySampler",
    "DistributedSqrtFrequencySampler",
    "VideoBatchSampler",
]

_COMBINE = ("max", "mean")


def _label_matrix(data: Sequence[Mapping[str, Any]], label_key: str) -> np.ndarray:
    """Stack the items' multi-hot labels into a (N, C) bool array, with clear errors for bad items."""
    if len(data) == 0:
        raise ValueError("cannot build a label-frequency sampler from an empty datalist")
    try:
        rows = [item[label_key] for item in data]
    except KeyError:
        bad = next(i for i, item in enumerate(data) if label_key not in item)
        item = data[bad]
        raise ValueError(
            f"datalist item {bad} (video {item.get('video_id', '?')}, frame {item.get('frame_index', '?')}) has no "
            f"{label_key!r}; a label-frequency sampler needs labelled frames"
        ) from None
    try:
        labels = np.asarray(rows, dtype=np.float32)
    except ValueError:
        lengths = {len(r) for r in rows}
        raise ValueError(f"datalist {label_key!r} entries have different lengths {sorted(lengths)}") from None
    if labels.ndim != 2:
        raise ValueError(
            f"datalist {label_key!r} entries must be flat lists of per-class values, got shape {labels.shape}"
        )
    return labels >= 0.5


def label_frequency_weights(
    labels: np.ndarray, exponent: float = 0.5, combine: str = "max"
) -> tuple[np.ndarray, np.ndarray, float]:
    """Per-frame sampling weights from a (N, C) multi-hot label matrix (see ``docs/design/data.md``).

    Args:
        labels: (N, C) array, positive where ``>= 0.5`` (or bool).
        exponent: the weight of a class of frequency ``f`` is ``f ** -exponent``; 0.5 is inverse square root,
            1.0 inverse frequency, 0.0 uniform sampling.
        combine: ``"max"`` (the rarest positive label decides) or ``"mean"`` (mean of the positive labels'
            weights) for frames with several positive labels.

    Returns:
        ``(weights (N,) float64, class_frequencies (C,) float64, none_frequency)``.
    """
    if combine not in _COMBINE:
        raise ValueError(f"combine must be one of {_COMBINE}, got {combine!r}")
    if exponent < 0:
        raise ValueError(f"exponent must be >= 0, got {exponent}")
    pos = np.asarray(labels) >= 0.5 if np.asarray(labels).dtype != bool else np.asarray(labels)
    n = pos.shape[0]
    freq = pos.sum(axis=0, dtype=np.float64) / n
    none = ~pos.any(axis=1)
    f_none = float(none.sum()) / n
    # classes without any positive never enter a frame's weight; 1.0 only avoids 0 ** -exponent
    class_w = np.where(freq > 0, freq, 1.0) ** -exponent
    if combine == "max":
        w = np.where(pos, class_w[None, :], 0.0).max(axis=1)
    else:
        counts = pos.sum(axis=1)
        w = (pos @ class_w) / np.maximum(counts, 1)
    if f_none > 0:
        w = np.where(none, f_none**-exponent, w)
    return w, freq, f_none


class SqrtFrequencySampler(Sampler[int]):
    """Draw frames with replacement in proportion to the inverse square root of their labels' frequencies.

    Built from the datalist itself (``data=@train#dataset#data`` in a bundle), so a datalist override reaches
    the sampler too. See ``docs/design/data.md`` for the weights. Each epoch draws ``num_samples`` indices with
    a generator seeded from ``seed + epoch``: the draw is reproducible and changes from epoch to epoch.
    ``set_epoch`` sets the epoch (``monai_vce.engines.VCETrainer`` calls it when an epoch starts); without
    it the epoch advances by one at each iteration over the sampler. The datalist is read on first use (not when
    the sampler is built), so a bundle config that builds it can be parsed without data.

    Under a process group (DDP) each process draws ``num_samples // world_size`` indices from the same weights with
    its own seed, so ``num_samples`` stays the epoch's size over all processes and the same sampler serves one or
    many processes.

    Args:
        data: the datalist, a sequence of dicts with a ``label_key`` entry (C per-class values, positive >= 0.5).
        num_samples: indices drawn per epoch; default ``len(data)``.
        replacement: draw with replacement (without it ``num_samples`` may not exceed ``len(data)``).
        seed: base seed of the draws; ``None`` takes one from torch's global generator (so that
            ``monai.utils.set_determinism`` fixes it).
        exponent: class weight ``f_c ** -exponent`` (0.5: inverse square root).
        combine: ``"max"`` or ``"mean"`` over a frame's positive labels.
        label_key: the key of the label vector in the datalist items.
        num_replicas: number of processes; default: the process group's size when one is initialised, else 1.
        rank: this process's rank; default: the process group's rank when one is initialised, else 0.

    Example::

        sampler = SqrtFrequencySampler(datalist, num_samples=20000, seed=0)
        loader = DataLoader(Dataset(datalist, transforms), batch_size=64, sampler=sampler)
    """

    def __init__(
        self,
        data: Sequence[Mapping[str, Any]],
        num_samples: int | None = None,
        replacement: bool = True,
        seed: int | None = None,
        exponent: float = 0.5,
        combine: str = "max",
        label_key: str = "label",
        num_replicas: int | None = None,
        rank: int | None = None,
    ) -> None:
        if combine not in _COMBINE:
            raise ValueError(f"combine must be one of {_COMBINE}, got {combine!r}")
        if exponent < 0:
            raise ValueError(f"exponent must be >= 0, got {exponent}")
        self.data = data
        self.exponent = float(exponent)
        self.combine = combine
        self.label_key = label_key
        self._num_samples = None if num_samples is None else int(num_samples)
        if self._num_samples is not None and self._num_samples <= 0:
            raise ValueError(f"num_samples must be positive, got {self._num_samples}")
        self.replacement = bool(replacement)
        self.num_replicas = num_replicas
        self.rank = rank
        self.seed = int(torch.randint(0, 2**31 - 1, ()).item()) if seed is None else int(seed)
        self.epoch = 0
        self._statistics: tuple[np.ndarray, torch.Tensor, np.ndarray, float] | None = None

    def _stats(self) -> tuple[np.ndarray, torch.Tensor, np.ndarray, float]:
        # computed on first use, so that building the sampler (parsing a bundle config) reads no data
        if self._statistics is None:
            labels = _label_matrix(self.data, self.label_key)
            w, freq, f_none = label_frequency_weights(labels, exponent=self.exponent, combine=self.combine)
            self._statistics = (labels, torch.as_tensor(w, dtype=torch.float64), freq, f_none)
        return self._statistics

    @property
    def labels(self) -> np.ndarray:
        """(N, C) bool label matrix of the datalist."""
        return self._stats()[0]

    @property
    def weights(self) -> torch.Tensor:
        """(N,) float64 sampling weight of each frame."""
        return self._stats()[1]

    @property
    def class_frequencies(self) -> np.ndarray:
        """(C,) fraction of frames positive for each class."""
        return self._stats()[2]

    @property
    def none_frequency(self) -> float:
        """Fraction of frames without any positive label."""
        return self._stats()[3]

    @property
    def num_samples(self) -> int:
        """Indices drawn per epoch over all processes (``len(data)`` when not given)."""
        return len(self.data) if self._num_samples is None else self._num_samples

    def _replicas(self) -> tuple[int, int]:
        """(number of processes, this process's rank): the arguments, else the process group's, else (1, 0)."""
        dist = torch.distributed
        initialized = dist.is_available() and dist.is_initialized()
        world = self.num_replicas if self.num_replicas is not None else (dist.get_world_size() if initialized else 1)
        rank = self.rank if self.rank is not None else (dist.get_rank() if initialized else 0)
        return int(world), int(rank)

    def set_epoch(self, epoch: int) -> None:
        """Set the epoch whose draw the next iteration produces."""
        self.epoch = int(epoch)

    def state_dict(self) -> dict[str, int]:
        """The seed and the epoch, enough to reproduce the next draw after a resume."""
        return {"seed": self.seed, "epoch": self.epoch}

    def load_state_dict(self, state: Mapping[str, int]) -> None:
        self.seed = int(state["seed"])
        self.epoch = int(state["epoch"])

    def effective_class_frequencies(self) -> dict[str, Any]:
        """Expected class frequencies among drawn frames, next to the original ones.

        Returns:
            A dict with ``"original"`` (C,) (fraction of datalist frames positive per class), ``"sampled"`` (C,)
            (expected fraction of drawn frames positive per class), ``"oversampling"`` (C,) (their ratio; NaN for
            classes without positives) and the same three values for the all-negative frames under
            ``"none_original"``, ``"none_sampled"``.
        """
        return _effective_frequencies(self.weights.numpy(), self.labels)

    def __iter__(self) -> Iterator[int]:
        _world, rank = self._replicas()
        num = len(self)
        if not self.replacement and num > len(self.data):
            raise ValueError(f"num_samples={num} exceeds the {len(self.data)} frames without replacement")
        # rank 0 draws exactly what a single process draws; the other ranks draw from their own seeds
        g = torch.Generator().manual_seed(self.seed + self.epoch + 1_000_003 * rank)
        self.epoch += 1
        idx = torch.multinomial(self.weights, num, self.replacement, generator=g)
        return iter(idx.tolist())

    def __len__(self) -> int:
        """Indices this process draws per epoch: ``num_samples`` divided among the processes."""
        world, _ = self._replicas()
        return max(1, self.num_samples // world)


def _effective_frequencies(weights: np.ndarray, labels: np.ndarray) -> dict[str, Any]:
    p = weights / weights.sum()
    original = labels.mean(axis=0, dtype=np.float64)
    sampled = p @ labels
    none = ~labels.any(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        ratio = np.where(original > 0, sampled / np.where(original > 0, original, 1.0), np.nan)
    return {
        "original": original,
        "sampled": sampled,
        "oversampling": ratio,
        "none_original": float(none.mean()),
        "none_sampled": float(p[none].sum()),
    }


class DistributedSqrtFrequencySampler(DistributedWeightedRandomSampler):
    """The multi-process form of :class:`SqrtFrequencySampler`, on MONAI's ``DistributedWeightedRandomSampler``.

    Each rank takes its share of the frames (MONAI/torch ``DistributedSampler``, reshuffled by ``set_epoch``,
    which MONAI's workflows call at every epoch) and draws ``num_samples_per_rank`` of them with replacement,
    in proportion to the same weights as :class:`SqrtFrequencySampler`. Draws are seeded from
    ``seed``, the epoch and the rank, so a run is reproducible.

    Args:
        data: the datalist (see :class:`SqrtFrequencySampler`).
        num_samples_per_rank: indices drawn per rank and epoch; default: the rank's share of the frames.
        seed: base seed, identical on all ranks.
        exponent: class weight ``f_c ** -exponent``.
        combine: ``"max"`` or ``"mean"`` over a frame's positive labels.
        label_key: the key of the label vector in the datalist items.
        even_divisible: see ``monai.data.DistributedSampler``.
        num_replicas: number of processes; default from the process group.
        rank: this process's rank; default from the process group.
        kwargs: more ``DistributedSampler`` arguments (``drop_last``).
    """

    def __init__(
        self,
        data: Sequence[Mapping[str, Any]],
        num_samples_per_rank: int | None = None,
        seed: int = 0,
        exponent: float = 0.5,
        combine: str = "max",
        label_key: str = "label",
        even_divisible: bool = True,
        num_replicas: int | None = None,
        rank: int | None = None,
        **kwargs: Any,
    ) -> None:
        labels = _label_matrix(data, label_key)
        w, freq, f_none = label_frequency_weights(labels, exponent=exponent, combine=combine)
        super().__init__(
            dataset=data,  # type: ignore[arg-type]
            weights=torch.as_tensor(w, dtype=torch.float64),  # type: ignore[arg-type]
            num_samples_per_rank=num_samples_per_rank,
            generator=None,
            even_divisible=even_divisible,
            num_replicas=num_replicas,
            rank=rank,
            seed=seed,
            **kwargs,
        )
        self.labels = labels
        self.class_frequencies = freq
        self.none_frequency = f_none

    def effective_class_frequencies(self) -> dict[str, Any]:
        """Expected class frequencies among drawn frames over all ranks (see :class:`SqrtFrequencySampler`)."""
        return _effective_frequencies(np.asarray(self.weights, dtype=np.float64), self.labels)

    def state_dict(self) -> dict[str, int]:
        return {"seed": int(self.seed), "epoch": int(self.epoch)}

    def load_state_dict(self, state: Mapping[str, int]) -> None:
        self.seed = int(state["seed"])
        self.epoch = int(state["epoch"])

    def __iter__(self) -> Iterator[int]:
        # same draw as MONAI's DistributedWeightedRandomSampler, with the weight lookup vectorised and a
        # generator seeded per (seed, epoch, rank) so that runs are reproducible
        indices = torch.as_tensor(list(super(DistributedWeightedRandomSampler, self).__iter__()), dtype=torch.long)
        g = torch.Generator().manual_seed(int(self.seed) + 1_000_003 * int(self.epoch) + 7919 * int(self.rank))
        weights = torch.as_tensor(self.weights)  # already a tensor; typed as a sequence by MONAI
        draw = torch.multinomial(weights[indices], self.num_samples_per_rank, True, generator=g)
        return iter(indices[draw].tolist())


class VideoBatchSampler(Sampler[list[int]]):
    """Batches of consecutive indices, in datalist order, that never span two videos: each batch is one exam's.

    For per-exam processing of a batch (:class:`~monai_vce.handlers.ExamBatchNormHandler`): a video of ``T`` frames
    gives ``ceil(T / batch_size)`` batches, the last one possibly smaller. The datalist must list each video's
    frames together (as inference datalists do); a video id met again after another video's frames starts a new
    run of batches. The datalist is read on first use (``len`` or iteration), so building the sampler in a bundle
    config reads no data.

    Args:
        data: the datalist (dicts with ``video_key``), or a dataset with a ``data`` datalist.
        batch_size: the most indices in a batch.
        video_key: the key of the video id in the datalist items.

    Example (bundle JSON)::

        "dataloader": {"_target_": "monai_vce.data.VCEDataLoader", "dataset": "@dataset",
                       "batch_sampler": {"_target_": "monai_vce.data.VideoBatchSampler", "data": "@dataset",
                                         "batch_size": "@batch_size"}}
    """

    def __init__(self, data: Any, batch_size: int, video_key: str = "video_id") -> None:
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
        self.data = data
        self.batch_size = batch_size
        self.video_key = video_key

    def _datalist(self) -> Sequence[Mapping[str, Any]]:
        data = self.data
        # a dataset's own datalist: indexing the dataset would load (and transform) the frames
        if not isinstance(data, (list, tuple)) and hasattr(data, "data"):
            data = data.data
        return data  # type: ignore[no-any-return]

    def runs(self) -> list[tuple[Any, int, int]]:
        """``(video_id, start, stop)`` of each run of consecutive indices of one video, in order."""
        out: list[tuple[Any, int, int]] = []
        start, current = 0, None
        data = self._datalist()
        for i, item in enumerate(data):
            try:
                vid = item[self.video_key]
            except (KeyError, TypeError):
                raise ValueError(f"datalist item {i} has no {self.video_key!r}; VideoBatchSampler needs it") from None
            if i > 0 and vid != current:
                out.append((current, start, i))
                start = i
            current = vid
        if len(data) > 0:
            out.append((current, start, len(data)))
        return out

    def __iter__(self) -> Iterator[list[int]]:
        for _vid, start, stop in self.runs():
            for b in range(start, stop, self.batch_size):
                yield list(range(b, min(b + self.batch_size, stop)))

    def __len__(self) -> int:
        return sum(-(-(stop - start) // self.batch_size) for _vid, start, stop in self.runs())
