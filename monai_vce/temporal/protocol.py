"""Leakage-free training of the temporal refiner: out-of-fold inputs, cross-fitting, a leakage guard
(:func:`check_no_leakage`) and the choice between the frame and the temporal pipeline.
"""

from __future__ import annotations

import copy
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from monai_vce.events.probabilities import Video
from monai_vce.postprocessing.gating import video_folds

from .refiner import RefinerEnsemble, TemporalRefiner

__all__ = [
    "LeakageError",
    "check_no_leakage",
    "kfold_videos",
    "fold_provenance",
    "CrossFitResult",
    "FINAL_REFINERS",
    "cross_fit_refiner",
    "select_pipeline",
]

#: What :func:`cross_fit_refiner` returns as the refiner for new videos: ``"ensemble"``, the fold refiners
#: together; ``"refit"``, one more refiner fitted on all videos.
FINAL_REFINERS: tuple[str, ...] = ("ensemble", "refit")


class LeakageError(ValueError):
    """A model would learn from (or be tuned on) outputs that a model produced for its own training videos."""


def check_no_leakage(
    video_ids: Iterable[str],
    trained_on: Mapping[str, Collection[str]] | Collection[str],
    what: str = "frame model",
) -> None:
    """Raise when a video's inputs were produced by a model trained on that video.

    Args:
        video_ids: ids of the videos about to be used (to fit a refiner, or to tune a decoder).
        trained_on: the training videos of the model that produced the inputs: one collection of ids (one model
            produced every input), or a mapping from video id to the training videos of the model that produced
            that video's inputs (out-of-fold outputs). A video missing from the mapping is an error: its
            provenance is unknown.
        what: the producing model, for the message (``"frame model"``, ``"refiner"``).

    Raises:
        LeakageError: naming the offending videos.
    """
    ids = [str(v) for v in video_ids]
    if isinstance(trained_on, Mapping):
        unknown = [v for v in ids if v not in trained_on]
        if unknown:
            raise LeakageError(
                f"no provenance for video(s) {_some(unknown)}: trained_on must list, for every video, the "
                f"training videos of the {what} that produced its inputs"
            )
        leaked = [v for v in ids if v in {str(t) for t in trained_on[v]}]
    else:
        if isinstance(trained_on, str):
            raise TypeError("trained_on must be a collection of video ids or a mapping, not a string")
        seen = {str(t) for t in trained_on}
        leaked = [v for v in ids if v in seen]
    if leaked:
        raise LeakageError(
            f"video(s) {_some(leaked)}: the inputs come from a {what} trained on the same video; use out-of-fold "
            f"outputs (k-fold over videos) or videos the {what} never saw (cross-fitting)"
        )


def _some(ids: Sequence[str], n: int = 5) -> str:
    shown = ", ".join(repr(v) for v in ids[:n])
    return shown + (f" and {len(ids) - n} more" if len(ids) > n else "")


def kfold_videos(video_ids: Sequence[str], folds: int = 5, seed: int = 0) -> dict[str, int]:
    """Assign videos to ``min(folds, len(video_ids))`` folds (seeded shuffle, dealt round-robin: sizes differ by
    at most one). Whole videos go to one fold, never frames."""
    ids = [str(v) for v in video_ids]
    if len(set(ids)) != len(ids):
        raise ValueError("video ids must be unique")
    if folds < 2 or len(ids) < 2:
        raise ValueError(f"k-fold needs at least 2 folds and 2 videos, got {folds} folds and {len(ids)} videos")
    assignment = video_folds(len(ids), folds, seed)
    return {v: int(f) for v, f in zip(ids, assignment, strict=True)}


def fold_provenance(folds: Mapping[str, int]) -> dict[str, list[str]]:
    """``trained_on`` of out-of-fold outputs: for each video, the videos of the other folds (the training videos
    of the fold model that produced its outputs)."""
    by_fold: dict[int, list[str]] = {}
    for v, f in folds.items():
        by_fold.setdefault(int(f), []).append(str(v))
    return {str(v): [u for g, us in by_fold.items() if g != int(f) for u in us] for v, f in folds.items()}


class CrossFitResult:
    """What :func:`cross_fit_refiner` returns.

    Attributes:
        refined: out-of-fold refined probabilities ``(T, 17)`` per video id (each from a refiner not fitted on it).
        refiner: the refiner for new videos: the fold refiners' :class:`RefinerEnsemble` (``final="ensemble"``),
            a refiner fitted on all videos (``final="refit"``) or ``None`` (``final=None``).
        fold_refiners: the refiner of each fold, in fold order.
        folds: the fold of each video id.
    """

    def __init__(
        self,
        refined: dict[str, np.ndarray],
        refiner: TemporalRefiner | RefinerEnsemble | None,
        fold_refiners: list[TemporalRefiner],
        folds: dict[str, int],
    ) -> None:
        self.refined = refined
        self.refiner = refiner
        self.fold_refiners = fold_refiners
        self.folds = folds

    def tuning_videos(self, videos: Mapping[str, Video]) -> dict[str, Video]:
        """The videos with their out-of-fold refined probabilities: the decoder's honest tuning set
        (for :func:`monai_vce.postprocessing.tune_decoder`)."""
        return {k: videos[k].replace(probs=self.refined[k]) for k in self.refined}


def cross_fit_refiner(
    videos: Mapping[str, Video],
    inputs: str = "probs",
    folds: int | Mapping[str, int] = 3,
    final: str | None = "ensemble",
    trained_on: Mapping[str, Collection[str]] | Collection[str] | None = None,
    seed: int = 0,
    log: Any = None,
    **fit_kwargs: Any,
) -> CrossFitResult:
    """Out-of-fold refined probabilities of every video, and a refiner for new videos.

    For each fold, a refiner is fitted (:func:`~monai_vce.temporal.fit_refiner`) on the videos of the other
    folds and refines the videos of the fold; the guard checks that no video is refined by a refiner fitted on
    it. Tune the decoder on :meth:`CrossFitResult.tuning_videos` and apply :attr:`CrossFitResult.refiner` (then
    the tuned decoder) to new videos.

    Args:
        videos: :class:`~monai_vce.events.Video` records with ``targets`` (and ground-truth ``events`` for
            :meth:`CrossFitResult.tuning_videos`) per video id (honest inputs: see the module
            docstring).
        inputs: the refiner's inputs (``"probs"``, ``"features"``, ``"both"``).
        folds: number of folds (a seeded assignment of whole videos) or the fold of each video id.
        final: the refiner for new videos (:data:`FINAL_REFINERS`): ``"ensemble"`` (default), the fold refiners
            together (:class:`~monai_vce.temporal.RefinerEnsemble`: the decoder tuned on their out-of-fold
            outputs fits their mean best, and no fit is added); ``"refit"``, one more fit on all videos (one
            refinement per new video instead of one per fold); ``None``, none.
        trained_on: provenance of the inputs for the guard (see :func:`check_no_leakage`); checked when given.
        seed: seed of the fold assignment and of each fit (fold ``f`` uses ``seed + f``).
        log: optional callable receiving progress lines.
        fit_kwargs: more arguments of :func:`~monai_vce.temporal.fit_refiner` (network, steps, crop_length, ...).
            A ``refiner`` (an untrained refiner, e.g. a bundle's ``_target_`` component) is deep-copied for every
            fit, so that each fold and the final refiner start from the same untrained weights and none continues
            from another's training; a callable is called for a new refiner at every fit.

    Returns:
        A :class:`CrossFitResult`.

    Raises:
        LeakageError: the inputs' provenance shows leakage, or a fold would refine its own training videos.
    """
    from .training import fit_refiner

    if final is not None and final not in FINAL_REFINERS:
        raise ValueError(f"final must be one of {FINAL_REFINERS} or None, got {final!r}")
    template = fit_kwargs.pop("refiner", None)

    def fresh() -> Any:
        if template is None:
            return None
        return copy.deepcopy(template) if hasattr(template, "state_dict") else template()

    ids = [str(k) for k in videos]
    if trained_on is not None:
        check_no_leakage(ids, trained_on, what="frame model")
    assignment = (
        kfold_videos(ids, int(folds), seed) if isinstance(folds, int) else {str(k): int(v) for k, v in folds.items()}
    )
    missing = [v for v in ids if v not in assignment]
    if missing:
        raise ValueError(f"folds: no fold for video(s) {_some(missing)}")
    fold_ids = sorted(set(assignment[v] for v in ids))
    if len(fold_ids) < 2:
        raise ValueError("cross-fitting needs at least 2 folds")
    refined: dict[str, np.ndarray] = {}
    fold_refiners = []
    for f in fold_ids:
        train_ids = [v for v in ids if assignment[v] != f]
        held = [v for v in ids if assignment[v] == f]
        if log:
            log(f"fold {f}: fitting on {len(train_ids)} videos, refining {len(held)}")
        refiner = fit_refiner(
            {v: videos[v] for v in train_ids}, inputs, refiner=fresh(), seed=seed + int(f), log=log, **fit_kwargs
        )
        check_no_leakage(held, refiner.trained_videos, what="refiner")
        for v in held:
            refined[v] = refiner.refine(videos[v].probs, videos[v].features)
        fold_refiners.append(refiner)
    final_refiner: TemporalRefiner | RefinerEnsemble | None = None
    if final == "ensemble":
        final_refiner = RefinerEnsemble(fold_refiners)
        final_refiner.fit_info = {
            "members": len(fold_refiners),
            "folds": {str(f): [v for v in ids if assignment[v] == f] for f in fold_ids},
        }
    elif final == "refit":
        if log:
            log(f"final refiner: fitting on all {len(ids)} videos")
        final_refiner = fit_refiner(
            {v: videos[v] for v in ids}, inputs, refiner=fresh(), seed=seed, log=log, **fit_kwargs
        )
    return CrossFitResult({v: refined[v] for v in ids}, final_refiner, fold_refiners, assignment)


def select_pipeline(candidates: Mapping[str, Any], baseline: str | None = None, margin: float = 0.01) -> str:
    """Choose among pipelines by the tuning objective of their decoders.

    Each candidate is the :class:`~monai_vce.postprocessing.DecoderParams` (or its dict) that
    :func:`~monai_vce.postprocessing.tune_decoder` fitted on that pipeline's probabilities of the same videos,
    which must be honest (frame outputs of videos the frame model never trained on; out-of-fold refined
    probabilities); its ``fit["objective"]`` is the composed temporal mAP the tuning reached. Every candidate
    meets the same tuning grid, so their in-sample optimism is alike and the comparison is fair.

    Args:
        candidates: tuned decoder parameters per pipeline name.
        baseline: the pipeline kept unless another beats it by more than ``margin`` (e.g. the frame outputs alone).
        margin: objective (mean AP) another pipeline must gain over ``baseline``. The objectives are in-sample
            scores of the tuning, so a lead of a few thousandths is noise: on 40 simulated Galar videos, leads of
            0.0002 and 0.0017 came with held-out differences of -0.001 and +0.014 mAP@0.5.

    Returns:
        The chosen pipeline's name.

    Raises:
        ValueError: no candidates, an unknown baseline, or parameters without a tuning record.
    """
    if not candidates:
        raise ValueError("select_pipeline needs at least one candidate")
    scores = {}
    for name, params in candidates.items():
        data = params.to_dict() if hasattr(params, "to_dict") else params
        fit = data.get("fit") if isinstance(data, Mapping) else None
        if not isinstance(fit, Mapping) or "objective" not in fit:
            raise ValueError(f"candidate {name!r}: decoder parameters without fit['objective'] (not from tune_decoder)")
        scores[name] = float(fit["objective"])
    if baseline is not None and baseline not in scores:
        raise ValueError(f"baseline {baseline!r} is not among the candidates {list(scores)}")
    best = max(scores, key=lambda k: scores[k])
    if baseline is not None and scores[best] <= scores[baseline] + margin:
        return baseline
    return best
