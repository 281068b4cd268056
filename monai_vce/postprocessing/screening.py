"""The screening profile of the decoder: every label shown, pathology thresholds fitted to a false-alarm budget.

:func:`tune_screening` fits, on validation videos, one operating threshold per pathology label that finds the most
lesions with at most ``false_alarms_per_exam`` false-alarm events per exam in all;
:func:`screening_operating_point` re-picks them for another budget from the recorded curves. Design:
``docs/design/decoding.md``.
"""

from __future__ import annotations

import math
import os
import time
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..events.probabilities import Video, videos_units
from ..events.runs import run_bounds, run_spans
from ..labels import LABELS, PATHOLOGY
from ..metrics.lesions import label_runs
from .chain import CHAIN_STEPS
from .core import decode_columns, section_sequence
from .decoder import DecoderParams, EventDecoder, check_probabilities

__all__ = ["SCREENING_THRESHOLDS", "tune_screening", "screening_operating_point", "load_screening_decoder"]

#: Candidate operating thresholds of a pathology label (low values: a screen shows weak evidence too).
SCREENING_THRESHOLDS: tuple[float, ...] = (
    0.01, 0.02, 0.03, 0.05, 0.07, 0.1, 0.13, 0.16, 0.2, 0.25, 0.3, 0.35, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95,
    0.97, 0.98, 0.99, 0.995, 0.999,
)  # fmt: skip

_PATHOLOGY_COLUMNS = np.array([LABELS.index(n) for n in PATHOLOGY])


def _label_curves(
    videos: Sequence[Video], base: DecoderParams, grid: np.ndarray
) -> tuple[dict[str, dict[str, Any]], int]:
    """Per pathology label and candidate threshold: false-alarm segments, lesions found and frames shown, summed
    over videos; and the videos' frames in all."""
    cols = np.repeat(_PATHOLOGY_COLUMNS, len(grid))
    values = {step.param.name: base.per_label(step.param.name)[cols] for step in CHAIN_STEPS.values()}
    values["threshold"] = np.tile(grid, len(_PATHOLOGY_COLUMNS))
    anatomy = base["anatomy"] if base["anatomy"]["enabled"] else None
    fa = np.zeros((len(PATHOLOGY), len(grid)), dtype=np.int64)
    found = np.zeros_like(fa)
    shown = np.zeros_like(fa)
    total = np.zeros(len(PATHOLOGY), dtype=np.int64)
    frames = 0
    for v in videos:
        probs, ids = check_probabilities(v.probs, v.frame_ids(), str(v.video_id))
        if probs.shape[0] == 0:
            continue
        frames += int(ids[-1] - ids[0] + 1)
        sections = section_sequence(probs, anatomy) if anatomy is not None else None
        masks = decode_columns(probs, cols, values, base["order"], anatomy, sections)
        k, start, stop = run_bounds(masks)
        first, last = run_spans(ids, start, stop)
        for j, name in enumerate(PATHOLOGY):
            lesions = label_runs(v.events or (), name)[0]
            total[j] += len(lesions)
            for g in range(len(grid)):
                sel = k == j * len(grid) + g
                s, e = first[sel], last[sel]
                shown[j, g] += int((e - s + 1).sum())  # one label's runs do not overlap
                if len(lesions) == 0:
                    fa[j, g] += len(s)
                    continue
                hit = (s[:, None] <= lesions[None, :, 1]) & (e[:, None] >= lesions[None, :, 0])
                fa[j, g] += int((~hit.any(axis=1)).sum())
                found[j, g] += int(hit.any(axis=0).sum())
    curves = {
        name: {
            "thresholds": [float(t) for t in grid],
            "false_alarms": fa[j].tolist(),
            "lesions_found": found[j].tolist(),
            "frames_shown": shown[j].tolist(),
            "lesions": int(total[j]),
        }
        for j, name in enumerate(PATHOLOGY)
    }
    return curves, frames


def _allocate(
    curves: Mapping[str, Mapping[str, Any]], budget: float, max_frames: float | None = None
) -> dict[str, float]:
    """Thresholds that find the most lesions in all with at most ``budget`` false alarms in all (exact knapsack).

    Every label shows something: each spends at least its fewest false alarms, and the budget left is shared
    out (when the fewest already exceed the budget, every label takes its fewest). A threshold showing more than
    ``max_frames`` frames of its label is left out (one segment over a whole exam would find every lesion of
    it for one false alarm), except the one showing fewest. Ties prefer fewer false alarms, then higher
    thresholds.
    """
    names = list(curves)
    fas, fds = [], []
    for n in names:
        fa = np.asarray(curves[n]["false_alarms"], dtype=np.int64)
        fd = np.asarray(curves[n]["lesions_found"], dtype=np.int64)
        if max_frames is not None and "frames_shown" in curves[n]:
            frames = np.asarray(curves[n]["frames_shown"], dtype=np.float64)
            keep = (frames <= max_frames) | (frames == frames.min())
            fa = np.where(keep, fa, np.iinfo(np.int64).max // 4)  # never fits
        fas.append(fa)
        fds.append(fd)
    floors = [int(fa.min()) for fa in fas]
    cap = max(math.floor(budget + 1e-9) - sum(floors), 0)
    # best[b] = (lesions found, -extra false alarms, choices) over the labels so far, with at most b extra
    best: list[tuple[int, int, tuple[int, ...]]] = [(0, 0, ())] * (cap + 1)
    for fa, fd, floor in zip(fas, fds, floors, strict=True):
        extra = fa - floor
        new: list[tuple[int, int, tuple[int, ...]]] = []
        for b in range(cap + 1):
            cand: tuple[int, int, tuple[int, ...]] | None = None
            for g in range(len(fa) - 1, -1, -1):  # highest threshold first: it wins ties
                if extra[g] > b:
                    continue
                prev = best[b - int(extra[g])]
                option = (prev[0] + int(fd[g]), prev[1] - int(extra[g]), (*prev[2], g))
                if cand is None or option[:2] > cand[:2]:
                    cand = option
            assert cand is not None  # the fewest-false-alarm option always fits
            new.append(cand)
        best = new
    return {n: float(curves[n]["thresholds"][g]) for n, g in zip(names, best[cap][2], strict=True)}


def screening_operating_point(params: DecoderParams, false_alarms_per_exam: float) -> DecoderParams:
    """The screening parameters re-fitted to another false-alarm budget from the curves recorded at fitting.

    Args:
        params: parameters written by :func:`tune_screening` (``fit["screening"]`` holds the curves).
        false_alarms_per_exam: the new budget (false-alarm events per exam, all pathology labels together).

    Raises:
        ValueError: ``params`` were not fitted by :func:`tune_screening`, or the budget is negative.
    """
    fit = params.get("fit") or {}
    if fit.get("profile") != "screening" or "screening" not in fit:
        raise ValueError(f"{params.source}: not screening parameters (fit them with tune_decoder(profile='screening'))")
    if not math.isfinite(false_alarms_per_exam) or false_alarms_per_exam < 0:
        raise ValueError(f"false_alarms_per_exam must be a non-negative number, got {false_alarms_per_exam!r}")
    curves = fit["screening"]["curves"]
    max_frames = fit["screening"].get("max_frames_share", 1.0) * fit["screening"].get("frames", 0)
    chosen = _allocate(curves, false_alarms_per_exam * fit["videos"], max_frames or None)
    data = params.to_dict()
    for name, t in chosen.items():
        data["labels"][name]["threshold"] = t
    data["fit"]["false_alarms_per_exam"] = float(false_alarms_per_exam)
    data["fit"]["screening"]["expected"] = _expected(curves, chosen, fit["videos"])
    return DecoderParams(data, source=params.source)


def _expected(curves: Mapping[str, Mapping[str, Any]], chosen: Mapping[str, float], videos: int) -> dict[str, float]:
    """Validation false alarms per exam and lesion sensitivity at the chosen thresholds."""
    fa = found = lesions = 0
    for name, t in chosen.items():
        g = curves[name]["thresholds"].index(t)
        fa += curves[name]["false_alarms"][g]
        found += curves[name]["lesions_found"][g]
        lesions += curves[name]["lesions"]
    return {
        "false_alarms_per_exam": fa / max(videos, 1),
        "sensitivity": found / lesions if lesions else 0.0,
    }


def tune_screening(
    videos: Sequence[Video] | Mapping[str, Video],
    base: DecoderParams | Mapping[str, Any] | None = None,
    false_alarms_per_exam: float = 2.0,
    thresholds: Sequence[float] = SCREENING_THRESHOLDS,
    max_frames_share: float = 0.01,
) -> DecoderParams:
    """Fit the screening profile: every label shown, scored events, pathology thresholds fitted to a budget.

    From ``base`` (its chain, anatomy settings and non-pathology thresholds): presence gating off for every label,
    per-label composition, events scored (``"score"``: the logit margin of the event's mean probability over its
    label's threshold), and for each pathology label the threshold of ``thresholds`` that, jointly over the
    labels, finds the most validation lesions (overlap of one frame) with at most ``false_alarms_per_exam``
    false-alarm events per exam in all.

    Args:
        videos: validation videos with ground-truth ``events`` (in their ``units``, recorded in the parameters).
        base: starting parameters (e.g. the challenge profile's); the paper's chain when ``None``.
        false_alarms_per_exam: the false-alarm budget of the operating point.
        thresholds: candidate thresholds of each pathology label.
        max_frames_share: largest share of the validation frames one pathology label's events may cover at the
            operating point (the reading workload; the threshold showing fewest frames is always allowed).

    Returns:
        :class:`DecoderParams` with ``fit`` recording the profile, the budget, the validation curves (so that
        :func:`screening_operating_point` can move the operating point) and the expected operating point.
    """
    t0 = time.perf_counter()
    vids = list(videos.values() if isinstance(videos, Mapping) else videos)
    units = videos_units(vids)
    if not vids:
        raise ValueError("tune_screening needs at least one validation video")
    missing = [str(v.video_id) for v in vids if v.events is None]
    if missing:
        raise ValueError(f"video {missing[0]!r}: no ground-truth events to tune on (see with_ground_truth)")
    if not math.isfinite(false_alarms_per_exam) or false_alarms_per_exam < 0:
        raise ValueError(f"false_alarms_per_exam must be a non-negative number, got {false_alarms_per_exam!r}")
    grid = np.unique(np.asarray(thresholds, dtype=np.float64))
    if grid.size == 0 or grid.min() < 0 or grid.max() > 1:
        raise ValueError(f"thresholds must be numbers in [0, 1], got {list(thresholds)!r}")
    start = base if isinstance(base, DecoderParams) else DecoderParams(base)
    data = start.to_dict()
    data.pop("fit", None)
    for name in LABELS:
        data["labels"][name]["presence"] = {"feature": "none"}
    data.update(composition="per_label", ranking="mean", scores=True, frame_units=units.value)
    params = DecoderParams(data, source="screening parameters")
    if not 0 < max_frames_share <= 1:
        raise ValueError(f"max_frames_share must be in (0, 1], got {max_frames_share!r}")
    curves, frames = _label_curves(vids, params, grid)
    chosen = _allocate(curves, false_alarms_per_exam * len(vids), max_frames_share * frames)
    for name, t in chosen.items():
        data["labels"][name]["threshold"] = t
    data["fit"] = {
        "profile": "screening",
        "videos": len(vids),
        "false_alarms_per_exam": float(false_alarms_per_exam),
        "screening": {
            "curves": curves,
            "frames": frames,
            "max_frames_share": float(max_frames_share),
            "expected": _expected(curves, chosen, len(vids)),
        },
        "seconds": round(time.perf_counter() - t0, 1),
    }
    return DecoderParams(data, source="screening parameters")


def load_screening_decoder(
    path: str | os.PathLike | None, false_alarms_per_exam: float | None = None, required: bool = False
) -> EventDecoder | None:
    """The screening decoder of a parameter file, at its fitted budget or moved to ``false_alarms_per_exam``.

    Args:
        path: the file written by training (``<ckpt_dir>/screening_decoder.json``); ``None`` or ``""``: none.
        false_alarms_per_exam: another operating point (:func:`screening_operating_point`); ``None`` keeps it.
        required: a missing file (or none given) is an error; otherwise ``None`` is returned, with a warning for
            a missing file (a model trained without the screening fit still gives its challenge events).

    Raises:
        FileNotFoundError: ``required`` and the file does not exist.
        ValueError: the file is not screening parameters, or a negative budget.
    """
    if path is None or str(path) == "":
        if required:
            raise FileNotFoundError("a screening decoder file is required (e.g. models/screening_decoder.json)")
        return None
    if not os.path.isfile(path):
        msg = (
            f"screening decoder {path} not found; train or evaluate the bundle to fit it (decoder_tuner's "
            "screening_file), or pass --screening False"
        )
        if required:
            raise FileNotFoundError(msg)
        warnings.warn(msg + ": no screening events are written", stacklevel=2)
        return None
    params = DecoderParams.load(path)
    if params.get("fit", {}).get("profile") != "screening":
        raise ValueError(f"{path}: not screening parameters (fit them with tune_decoder(profile='screening'))")
    if false_alarms_per_exam is not None:
        params = screening_operating_point(params, float(false_alarms_per_exam))
    return EventDecoder(params)
