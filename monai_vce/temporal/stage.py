"""The bundle's temporal stage: :func:`fit_temporal_stage` cross-fits the refiner on the frame model's validation
outputs, tunes its decoder out of fold and writes both.
"""

from __future__ import annotations

import functools
import logging
import os
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from monai_vce.events.ground_truth import with_ground_truth
from monai_vce.events.probabilities import (
    Video,
    load_video_probs,
    probability_file,
    probability_files,
    save_video_probs,
)
from monai_vce.events.units import FrameUnits, as_frame_units
from monai_vce.events.validation import load_events
from monai_vce.labels import LABELS
from monai_vce.postprocessing.params import DecoderParams
from monai_vce.postprocessing.thresholds import optimize_thresholds
from monai_vce.postprocessing.tuning import tune_decoder
from monai_vce.utils import atomic_write_json

from .protocol import check_no_leakage, cross_fit_refiner, select_pipeline
from .refiner import INPUTS, RefinerEnsemble, TemporalRefiner, load_refiner_file

__all__ = ["load_refiner", "refiner_fingerprint", "refiner_inputs", "fit_temporal_stage"]

logger = logging.getLogger(__name__)

PathLike = str | os.PathLike


def load_refiner(path: PathLike, map_location: str | torch.device = "cpu") -> TemporalRefiner | RefinerEnsemble:
    """Read a refiner file for inference, a :class:`TemporalRefiner` or a :class:`RefinerEnsemble` (the
    temporal stage's default), the bundle's ``refiner`` component.

    Raises:
        FileNotFoundError: the file is missing (the message says how to fit one).
        ValueError: the file is not a refiner file (one line naming it).
    """
    if not Path(path).is_file():
        raise FileNotFoundError(
            f"refiner file {path} not found; fit it with the temporal stage (bundle/configs/temporal_train.json) "
            "or pass --refiner_file"
        )
    return load_refiner_file(path, map_location=map_location)


def refiner_fingerprint(path: PathLike) -> str:
    """The refiner's part of a refined probability file's ``source``: its path and a hash of its content
    (:meth:`TemporalRefiner.fingerprint`), so that a resumed run never reuses another refiner's outputs.

    Raises:
        FileNotFoundError: the file is missing.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"refiner file {path} not found; fit it with bundle/configs/temporal_train.json")
    return f"{path.resolve()} {TemporalRefiner.fingerprint(path)}"


def refiner_inputs(refiner: Any) -> str:
    """The input kind (``"probs"``, ``"features"``, ``"both"``) of a refiner, of a callable building one (a
    ``functools.partial``, as ``"_mode_": "callable"`` makes in a bundle config), or ``"probs"`` for ``None``."""
    if refiner is None:
        return "probs"
    if isinstance(refiner, functools.partial):
        return str(refiner.keywords.get("inputs", "probs"))
    return str(getattr(refiner, "inputs", "probs"))


def _ground_truth(ground_truth: PathLike | Mapping[str, Any]) -> dict[str, list[dict[str, Any]]]:
    gt = load_events(ground_truth) if not isinstance(ground_truth, Mapping) else ground_truth
    out: dict[str, list[dict[str, Any]]] = {}
    for v in gt.get("videos", []):
        out.setdefault(str(v["video_id"]), []).extend(v["events"])
    return out


def _read_videos(
    probs_dir: Path, video_ids: Sequence[str], gt: Mapping[str, list], units: FrameUnits, features: bool
) -> dict[str, Video]:
    videos = {}
    for vid in video_ids:
        path = probability_file(probs_dir, vid)
        if vid not in gt:
            raise ValueError(f"video {vid!r} ({path}): not in the ground truth of the validation videos")
        video = load_video_probs(path, features=features)
        if features and video.features is None:
            raise ValueError(
                f"probability file {path} has no 'features' array, which the refiner's inputs need: write the "
                "validation outputs with write_features true"
            )
        videos[vid] = with_ground_truth(video, gt[vid], units)
    return videos


def fit_temporal_stage(
    probs_dir: PathLike,
    ground_truth: PathLike | Mapping[str, Any],
    refiner_file: PathLike,
    decoder_file: PathLike,
    trained_on: Collection[str],
    refiner: Any = None,
    videos: Sequence[str] | None = None,
    folds: int = 3,
    final: str = "ensemble",
    frame_units: FrameUnits | str = FrameUnits.FRAME_INDEX,
    fit_kwargs: Mapping[str, Any] | None = None,
    decoder_tuning: Mapping[str, Any] | None = None,
    frame_decoder: PathLike | None = None,
    oof_dir: PathLike | None = None,
    summary_file: PathLike | None = None,
    seed: int = 0,
    log: Callable[[str], Any] | None = None,
) -> dict[str, Any]:
    """Fit the refiner by validation cross-fitting and tune its decoder (see ``docs/design/temporal.md``).

    Args:
        probs_dir: folder of the frame model's ``<video_id>.npz`` files of the validation videos.
        ground_truth: their ground-truth event JSON (object or path), in ``frame_units``.
        refiner_file: where to write the refiner for inference (e.g. ``models/refiner.pt``).
        decoder_file: where to write the decoder parameters tuned on refined probabilities (e.g.
            ``models/temporal_decoder.json``).
        trained_on: the frame model's training video ids: the leakage guard refuses any of them here.
        refiner: the refiner to fit: an untrained :class:`TemporalRefiner` (deep-copied for every fit), a callable
            returning one (a bundle's ``"_mode_": "callable"`` component; it receives ``feature_dim``, the width of
            the files' features, when its inputs need features and it does not set it), or ``None`` for a
            default :class:`TemporalRefiner` of probabilities.
        videos: the video ids to use (default every file of ``probs_dir``).
        folds: cross-fitting folds (at most the number of videos).
        final: the refiner written to ``refiner_file``: ``"ensemble"``, the fold refiners together (no more fit;
            inference refines once per fold), or ``"refit"``, one more refiner fitted on all the videos (see
            :func:`cross_fit_refiner`).
        frame_units: the frame ids the ground truth and the decoder count in.
        fit_kwargs: more arguments of :func:`~monai_vce.temporal.fit_refiner` (steps, crop_length, batch_size,
            learning_rate, num_threads, ...).
        decoder_tuning: more arguments of :func:`~monai_vce.postprocessing.tune_decoder` (as the frame decoder's
            ``decoder_tuning``).
        frame_decoder: the frame pipeline's decoder parameters (``models/decoder.json``), tuned on the same
            videos; when it exists, :func:`select_pipeline` compares the two pipelines and the verdict is logged.
        oof_dir: optional folder for the out-of-fold refined probability files (for inspection and reports).
        summary_file: optional JSON file of the summary below.
        seed: seed of the fold assignment and the fits.
        log: callable receiving progress lines (default: this module's logger).

    Returns:
        A summary: ``videos``, ``folds``, ``inputs``, ``feature_dim``, ``objective`` per pipeline, ``selected``,
        ``refiner_file``, ``decoder_file``, ``seconds``.

    Raises:
        LeakageError: a video was a training video of the frame model.
        ValueError: fewer than 2 videos, a file or ground truth missing a video, features missing (one line
            naming the file or video).
    """
    say = log if log is not None else logger.info
    t0 = time.perf_counter()
    probs_dir = Path(probs_dir)
    units = as_frame_units(frame_units)
    ids = [str(v) for v in videos] if videos is not None else list(probability_files(probs_dir))
    if len(ids) < 2:
        raise ValueError(
            f"the temporal stage cross-fits the refiner over the validation videos and needs at least 2, got "
            f"{len(ids)} in {probs_dir}"
        )
    check_no_leakage(ids, trained_on, what="frame model")
    inputs = refiner_inputs(refiner)
    if inputs not in INPUTS:
        raise ValueError(f"refiner inputs must be one of {INPUTS}, got {inputs!r}")
    needs_features = inputs != "probs"
    data = arrays = _read_videos(probs_dir, ids, _ground_truth(ground_truth), units, needs_features)
    feature_dim = int(next(iter(data.values())).features.shape[1]) if needs_features else 0  # type: ignore[union-attr]
    factory: Any = refiner
    if refiner is None:
        factory = functools.partial(TemporalRefiner, inputs="probs")
    elif isinstance(refiner, functools.partial) and needs_features and "feature_dim" not in refiner.keywords:
        factory = functools.partial(refiner, feature_dim=feature_dim)

    def seeded() -> Any:
        # every fit starts from the same seeded initialisation, as deep copies of one refiner would
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            return factory()

    template = factory if hasattr(factory, "state_dict") else seeded
    kwargs = dict(fit_kwargs or {})
    n_folds = min(int(folds), len(ids))
    say(f"temporal stage: cross-fitting the refiner ({inputs}) over {n_folds} folds of {len(ids)} validation videos")
    fit = cross_fit_refiner(
        data,
        inputs,
        folds=n_folds,
        final=final,
        trained_on=trained_on,
        seed=seed,
        refiner=template,
        **kwargs,
    )
    assert fit.refiner is not None
    tuning_videos = fit.tuning_videos(data)
    tune_kwargs = dict(decoder_tuning or {})
    if "base" not in tune_kwargs:
        refined = np.concatenate([tuning_videos[v].probs for v in ids])
        targets = np.concatenate([tuning_videos[v].targets for v in ids])  # type: ignore[misc]
        thresholds = np.asarray(optimize_thresholds(refined, targets))
        tune_kwargs["base"] = DecoderParams.from_thresholds(dict(zip(LABELS, thresholds.tolist(), strict=True)))
    say(f"temporal stage: tuning the decoder on the out-of-fold refined probabilities of {len(ids)} videos")
    params = tune_decoder(tuning_videos, **tune_kwargs)
    objectives: dict[str, float] = {"temporal": float(params["fit"]["objective"])}
    selected = "temporal"
    if frame_decoder is not None and Path(frame_decoder).is_file():
        frame_params = DecoderParams.load(frame_decoder)
        if isinstance(frame_params.get("fit"), Mapping) and "objective" in frame_params["fit"]:
            objectives["frame"] = float(frame_params["fit"]["objective"])
            selected = select_pipeline({"frame": frame_params, "temporal": params}, baseline="frame")
    if oof_dir is not None:
        for vid in ids:
            a = arrays[vid]
            video = a.replace(probs=fit.refined[vid], features=None, inferred=None, targets=None, events=None)
            save_video_probs(probability_file(oof_dir, vid), video, source=f"{a.source} | out-of-fold refiner")
    chosen = fit.refiner.to("cpu")
    chosen.fit_info = {
        **chosen.fit_info,
        "stage": {
            "protocol": "validation cross-fitting",
            "folds": n_folds,
            "final": final,
            "frame_model_training_videos": sorted(str(v) for v in trained_on),
            "frame_source": arrays[ids[0]].source,
            "objectives": objectives,
            "selected": selected,
        },
    }
    refiner_path = chosen.save(refiner_file)
    decoder_path = params.save(decoder_file)
    summary = {
        "videos": ids,
        "folds": n_folds,
        "inputs": inputs,
        "feature_dim": feature_dim,
        "objective": objectives,
        "selected": selected,
        "refiner_file": str(refiner_path),
        "decoder_file": str(decoder_path),
        "seconds": round(time.perf_counter() - t0, 1),
    }
    if summary_file is not None:
        atomic_write_json(summary_file, summary)
    scores = ", ".join(f"{k} {v:.4f}" for k, v in objectives.items())
    say(f"temporal stage: decoder tuning objective (composed mAP) {scores}; refiner: {refiner_path}")
    if selected != "temporal":
        logger.warning(
            "temporal stage: the refined probabilities did not beat the frame outputs by the selection margin on the "
            "validation videos (tuning objectives: %s); inference with the temporal stage may not help here",
            scores,
        )
    say(f"temporal stage: done in {summary['seconds']:.1f} s")
    return summary
