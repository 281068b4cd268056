"""Fitting the decoder's parameters on validation videos by maximising the temporal mAP itself.

:func:`tune_decoder`: coordinate ascent over the step registry's grids, with cross-validated presence rules;
the fit is recorded in ``params["fit"]``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from ..events.composition import RANKINGS, confidence_order, event_json, label_codes, run_confidence
from ..events.probabilities import Video, videos_units
from ..events.runs import run_bounds, run_spans
from ..labels import LABELS, NUM_LABELS, PATHOLOGY, SECTIONS
from ..metrics.temporal_map import average_precision, temporal_map
from .anatomy import DEFAULT_ANATOMY_GRID, section_gate
from .calibration import ProbabilityCalibration
from .chain import CHAIN_STEPS, PAPER_ORDER
from .core import SECTION_COLUMNS, column_sections, decode_columns, section_mask, section_sequence
from .decoder import DecoderParams, EventDecoder, check_probabilities
from .gating import (
    DEFAULT_CANDIDATE_RULES,
    column_presence,
    cross_validate_presence,
    fit_presence_rule,
    presence_features,
    video_folds,
)
from .screening import tune_screening
from .steps import Param

__all__ = [
    "DEFAULT_GRIDS",
    "DEFAULT_ANATOMY_GRID",
    "DECODER_PROFILES",
    "default_grids",
    "tune_decoder",
    "cross_fitted_events",
    "label_segments",
    "pathology_section_candidates",
]


def default_grids(optional: bool = False) -> dict[str, tuple]:
    """Candidate values of each per-label chain parameter: the grids of :data:`CHAIN_STEPS`, in search order.

    Args:
        optional: also the grids of the steps not searched by default (``searched=False``: ``"hysteresis"``,
            ``"duration"``).
    """
    return {
        step.param.name: step.param.grid
        for step in CHAIN_STEPS.values()
        if step.param.grid and (step.searched or optional)
    }


def _params() -> dict[str, Param]:
    return {step.param.name: step.param for step in CHAIN_STEPS.values()}


#: :func:`default_grids` of the built-in steps.
DEFAULT_GRIDS: dict[str, tuple] = default_grids()

_SECTION_SET = set(SECTIONS)

#: :func:`tune_decoder`'s ``profile``s: the fixed chain orders of those that fit nothing but the thresholds of
#: ``base`` (the paper's text, and the authors' code: runs shorter than 3 frames dropped before gaps of up to 5
#: frames are filled); ``None`` for ``"challenge"`` (tunes everything) and ``"screening"`` (its own fit).
DECODER_PROFILES: dict[str, tuple[str, ...] | None] = {
    "challenge": None,
    "screening": None,
    "paper": PAPER_ORDER,
    "authors": ("threshold", "median", "min_length", "fill_gaps"),
}

Log = Callable[..., Any]


def label_segments(column: np.ndarray, breaks: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Runs of a ``(T, K)`` boolean mask, split where ``breaks`` (``(T,)``: "frame t starts a new event") is set.

    Returns:
        ``(col, first, last)`` arrays of run column, first row and last row (inclusive), ordered by column then
        time (:func:`monai_vce.events.runs.run_bounds` with the last row instead of the stop).
    """
    col, first, stop = run_bounds(column, breaks=breaks)
    return col, first, stop - 1


class _Video:
    """The tuner's working view of one :class:`~monai_vce.events.Video`: per-label ground truth and state."""

    def __init__(self, video: Video) -> None:
        self.name = name = str(video.video_id)
        if video.events is None:
            raise ValueError(f"video {name!r}: no ground-truth events to tune on (see with_ground_truth)")
        self.probs, self.frame_ids = check_probabilities(video.probs, video.frame_ids(), name)
        self.T = self.probs.shape[0]
        index = {n: i for i, n in enumerate(LABELS)}
        segs: list[list[tuple[int, int]]] = [[] for _ in LABELS]
        for j, e in enumerate(video.events):
            try:
                for n in e["label"]:
                    segs[index[n]].append((int(e["start"]), int(e["end"])))
            except (KeyError, TypeError):
                raise ValueError(f"video {name!r}: ground-truth event {j} is not a valid event: {e!r}") from None
        self.gt = [np.asarray(s, dtype=np.int64).reshape(-1, 2) for s in segs]
        self.absent = np.array([len(s) == 0 for s in segs])
        self.csum = np.zeros((self.T + 1, NUM_LABELS))
        np.cumsum(self.probs, axis=0, out=self.csum[1:])
        self.mask: np.ndarray = np.zeros((self.T, NUM_LABELS), dtype=bool)
        self.sections: np.ndarray | None = None

    def rows(self, label: int) -> np.ndarray:
        """``(T,)`` rows inside a ground-truth event of ``label``."""
        cover = np.zeros(self.T + 1, dtype=np.int64)
        seg = self.gt[label]
        np.add.at(cover, np.searchsorted(self.frame_ids, seg[:, 0], side="left"), 1)
        np.add.at(cover, np.searchsorted(self.frame_ids, seg[:, 1], side="right"), -1)
        return np.cumsum(cover[: self.T]) > 0


def pathology_section_candidates(videos: Sequence[Any], coverage: float = 0.99) -> dict[str, list[str]]:
    """For each pathology, the fewest sections holding at least ``coverage`` of its positive ground-truth frames.

    The frames are counted by their ground-truth section (frames outside every section are not counted).
    A pathology without positive frames in a section, or whose frames need all five sections, gets no entry:
    gating it by section would change nothing.

    Args:
        videos: the tuner's videos (with ``gt``, ``T`` and :meth:`_Video.rows`).
        coverage: the share of the positive frames the sections must hold.
    """
    counts = np.zeros((len(PATHOLOGY), len(SECTIONS)), dtype=np.int64)
    for v in videos:
        sec = np.stack([v.rows(LABELS.index(n)) for n in SECTIONS], axis=1)  # (T, 5)
        for i, name in enumerate(PATHOLOGY):
            pos = v.rows(LABELS.index(name))
            counts[i] += (sec & pos[:, None]).sum(axis=0)
    out: dict[str, list[str]] = {}
    for i, name in enumerate(PATHOLOGY):
        total = counts[i].sum()
        if total == 0:
            continue
        ranked = np.argsort(-counts[i], kind="stable")
        share = np.cumsum(counts[i][ranked]) / total
        keep = ranked[: int(np.searchsorted(share, coverage - 1e-12)) + 1]
        if keep.size < len(SECTIONS):
            out[name] = [SECTIONS[k] for k in sorted(keep.tolist())]
    return out


def _score_columns(
    v: _Video,
    label: int,
    cols: np.ndarray,
    breaks: np.ndarray | None,
    others: np.ndarray,
    ranking: str,
    ths: tuple[float, ...],
) -> np.ndarray:
    """AP ``(K, len(ths))`` of label ``label`` in video ``v`` for K candidate columns ``(T, K)``.

    The candidate's events are composed, ranked and given frame ids exactly as the decoder does: runs split at
    ``breaks`` (where the other labels' set changes, in label-set composition), the confidence of each run over
    its labels (``others`` at the run's first row plus the label), the gap rule for their ends.
    """
    K = cols.shape[1]
    ks, start, stop = run_bounds(cols, breaks=breaks)
    out = np.empty((K, len(ths)))
    if ks.size == 0:
        out[:] = 1.0 if v.absent[label] else 0.0
        return out
    member = others[start].copy()  # the other labels of the event (constant over a label-set run)
    member[:, label] = True
    order = confidence_order(run_confidence(v.csum, start, stop, member, ranking), start, group=ks)
    ks, start, stop = ks[order], start[order], stop[order]
    bounds = np.searchsorted(ks, np.arange(K + 1))
    segs = np.stack(run_spans(v.frame_ids, start, stop), axis=1)
    for k in range(K):
        out[k] = average_precision(v.gt[label], segs[bounds[k] : bounds[k + 1]], ths)
    return out


class _Tuner:
    def __init__(
        self,
        videos: list[_Video],
        params: DecoderParams,
        ths: tuple[float, ...],
        weights: np.ndarray,
        rules: list[dict[str, Any]],
        grids: Mapping[str, Sequence],
        log: Log,
    ) -> None:
        self.videos = videos
        self.order = params["order"]
        self.composition = params["composition"]
        self.ranking = params["ranking"]
        # the pathologies' section gates being fitted (the anatomy step reads them from this dict)
        self.pathology_sections: dict[str, list[str]] = {
            k: list(v) for k, v in params["anatomy"]["pathology_sections"].items()
        }
        self.anatomy_params: dict[str, Any] | None = None
        if params["anatomy"]["enabled"]:
            self.anatomy_params = {**params["anatomy"], "pathology_sections": self.pathology_sections}
        self.gate_candidates: dict[str, list[str]] = {}
        # parameters put back to their (off) default, and gates dropped, for a label never emitted
        self.silent_defaults: dict[str, Any] = {}
        # without anatomy decoding, landmarks are gated near the boundaries of the decoded section columns
        self.gate = params["anatomy"] if self.anatomy_params is None and params["anatomy"]["gate_landmarks"] else None
        # the per-label parameters being fitted (the rest of the parameters is fixed during the ascent)
        self.labels: dict[str, dict[str, Any]] = {n: dict(params["labels"][n]) for n in LABELS}
        self.ths = ths
        self.weights = np.asarray(weights, dtype=np.float64) / np.sum(weights)
        self.rules = rules
        self.grids = grids
        self.log = log
        self.anatomy = self.anatomy_params is not None
        self.min_gain = 0.0
        self.folds: np.ndarray | None = None
        self.cv_margin = 0.0
        self.cv_z = 0.0
        self.candidates: list = []
        self.decisions: dict[str, dict[str, Any]] = {}

    def _candidates(self, v: _Video, label: int, key: str | None, values: Sequence) -> np.ndarray:
        """(T, K) columns of one label for candidate values of one parameter (others at their current value)."""
        name = LABELS[label]
        lp = self.labels[name]
        if key == "pathology_sections":
            # one decoding without the label's section gate, then each candidate gate (None: ungated)
            saved = self.pathology_sections.pop(name, None)
            try:
                col = self._candidates(v, label, None, ())
            finally:
                if saved is not None:
                    self.pathology_sections[name] = saved
            cols = np.repeat(col, len(values), axis=1)
            for k, sections in enumerate(values):
                if sections is not None and v.sections is not None:
                    cols[:, k] &= section_gate(v.sections, sections)
            return cols
        K = len(values) if key else 1
        per = {p: np.full(K, lp[p]) for p in _params()}
        if key:
            per[key] = np.asarray(values)
        return decode_columns(v.probs, np.full(K, label), per, self.order, self.anatomy_params, v.sections, self.gate)

    def _fixed_features(self, label: int) -> list[tuple[dict, np.ndarray]]:
        out = []
        for rule in self.rules:
            if rule["feature"] == "support":
                continue
            vals = np.array([presence_features(v.probs, None, rule, [label])[0] for v in self.videos])
            out.append((rule, vals))
        return out

    def context(self, label: int) -> list[tuple[np.ndarray, np.ndarray | None]]:
        """Per video: the labels an event of ``label`` shares (the others' current mask in label-set
        composition, none in per-label composition) and where the others' label set changes."""
        out = []
        for v in self.videos:
            others = v.mask.copy()
            others[:, label] = False
            breaks = None
            if self.composition == "label_set":
                code = label_codes(others)
                breaks = np.r_[False, code[1:] != code[:-1]]
            else:
                others[:] = False
            out.append((others, breaks))
        return out

    def step(self, label: int, key: str | None, values: Sequence, fixed: list, ctx: list) -> tuple[Any, dict, float]:
        """Best value of one parameter of one label (with its presence rule) and its objective.

        Every candidate's presence features and per-tIoU-threshold APs are appended to ``self.candidates`` for the
        cross-validated emission decision (:meth:`decide`).
        """
        K = len(values) if key else 1
        ap3 = np.empty((K, len(self.videos), len(self.ths)))
        support = np.empty((K, len(self.videos)))
        for j, v in enumerate(self.videos):
            others, breaks = ctx[j]
            cols = self._candidates(v, label, key, values)
            if cols.shape[1] == 1 and K > 1:
                cols = np.repeat(cols, K, axis=1)
            support[:, j] = cols.sum(0)
            ap3[:, j] = _score_columns(v, label, cols, breaks, others, self.ranking, self.ths)
        ap = ap3 @ self.weights
        absent = np.array([v.absent[label] for v in self.videos])
        use_support = any(r["feature"] == "support" for r in self.rules)
        best: tuple[float, Any, Any] = (-np.inf, None, None)
        for k in range(K):
            feats = [*list(fixed), ({"feature": "support"}, support[k])] if use_support else list(fixed)
            self.candidates.append((feats, ap3[k]))
            rule, score = fit_presence_rule(feats, ap[k], absent, self.min_gain)
            if score > best[0] + 1e-9:
                best = (score, values[k] if key else None, rule)
        return best[1], best[2], best[0]

    def decide(self, label: int) -> tuple[bool, np.ndarray, np.ndarray, float, float]:
        """Whether emitting the label beats never emitting it out of fold.

        The label is emitted when its weighted out-of-fold gain over "never" (weights of the tIoU thresholds)
        exceeds its margin and no scored tIoU threshold loses by more than its own margin. A tie at one tIoU threshold
        (e.g. no gain at tIoU 0.95 on short videos) therefore does not veto a clear gain at another.

        Returns:
            ``(emit, gain, need, combined, combined_need)``: the decision, the ``(N,)`` out-of-fold gain in mean
            AP over "never", the ``(N,)`` margin of each tIoU threshold, and the weighted gain and its margin.
        """
        absent = np.array([v.absent[label] for v in self.videos])
        if self.folds is None or not self.candidates:
            return True, np.full(len(self.ths), np.nan), np.full(len(self.ths), np.nan), np.nan, np.nan
        oof = cross_validate_presence(self.candidates, absent, self.weights, self.folds, self.min_gain)
        diff = oof - absent[:, None]  # (V, N) per-video gain over never emitting
        n = diff.shape[0]

        def margin(d: np.ndarray) -> np.ndarray:
            se = d.std(axis=0, ddof=1) / np.sqrt(n) if n > 1 else np.zeros(d.shape[1:])
            return np.maximum(self.cv_margin, self.cv_z * se)

        gain, need = diff.mean(axis=0), margin(diff)
        scored = self.weights > 0
        w = self.weights[scored] / self.weights[scored].sum()
        combined = diff[:, scored] @ w  # (V,) per-video weighted gain
        combined_gain, combined_need = float(combined.mean()), float(margin(combined[:, None])[0])
        emit = bool(combined_gain > combined_need and np.all(gain[scored] >= -need[scored]))
        return emit, gain, need, combined_gain, combined_need

    def refresh(self, label: int) -> None:
        """Recompute one label's column of every video's current mask with the current parameters."""
        rule = self.labels[LABELS[label]]["presence"]
        for v in self.videos:
            col = self._candidates(v, label, None, ())
            present = column_presence(v.probs, col, [label], [rule])[0]
            v.mask[:, label] = col[:, 0] & present
            if self.gate is not None and label in SECTION_COLUMNS:
                v.sections = column_sections(v.probs, v.mask[:, SECTION_COLUMNS])

    def run(self, rounds: int) -> float:
        score = 0.0
        params = _params()
        for r in range(rounds):
            total = []
            for label in range(NUM_LABELS):
                name = LABELS[label]
                fixed = self._fixed_features(label)
                ctx = self.context(label)
                lp = self.labels[name]
                self.candidates = []
                if self.anatomy and name in _SECTION_SET:
                    _, rule, score = self.step(label, None, (None,), fixed, ctx)
                    lp["presence"] = rule
                else:
                    for key, values in self.grids.items():
                        value, rule, score = self.step(label, key, tuple(values), fixed, ctx)
                        lp[key] = float(value) if params[key].kind == "number" else int(value)
                        lp["presence"] = rule
                    if self.anatomy and name in self.gate_candidates:
                        # gate by the sections the label occurs in, kept only where it raises the objective
                        values = (self.pathology_sections.get(name), self.gate_candidates[name])
                        value, rule, score = self.step(label, "pathology_sections", values, fixed, ctx)
                        if value is None:
                            self.pathology_sections.pop(name, None)
                        else:
                            self.pathology_sections[name] = list(value)
                        lp["presence"] = rule
                if lp["presence"]["feature"] != "never":
                    emit, gain, need, combined, combined_need = self.decide(label)
                    self.decisions[name] = {
                        "gain": [round(float(g), 4) for g in gain],
                        "needed": [round(float(n), 4) for n in need],
                        "weighted_gain": round(combined, 4),
                        "weighted_needed": round(combined_need, 4),
                        "emit": emit,
                    }
                    if not emit:
                        lp["presence"] = {"feature": "never"}
                        score = float(np.mean([v.absent[label] for v in self.videos]))
                else:
                    self.decisions.pop(name, None)
                if lp["presence"]["feature"] == "never":
                    # nothing of a silent label is decoded: leave what it does not need off, as before the search
                    lp.update(self.silent_defaults)
                    if name in self.gate_candidates:
                        self.pathology_sections.pop(name, None)
                self.candidates = []
                self.refresh(label)
                total.append(score)
                gated = self.pathology_sections.get(name)
                self.log(f"round {r + 1} {name}: objective {score:.4f} {lp}" + (f" sections {gated}" if gated else ""))
            score = float(np.mean(total))
            self.log(f"round {r + 1}: mean per-label objective {score:.4f}")
        return score


def tune_decoder(
    videos: Sequence[Video] | Mapping[str, Video],
    base: DecoderParams | Mapping[str, Any] | None = None,
    composition: str | None = None,
    anatomy: bool = True,
    grids: Mapping[str, Sequence] | None = None,
    rounds: int = 2,
    tiou_thresholds: Sequence[float] = (0.5, 0.95),
    weights: Sequence[float] | None = None,
    presence_rules: Sequence[Mapping[str, Any]] = DEFAULT_CANDIDATE_RULES,
    rankings: Sequence[str] = ("mean", "max", "min"),
    presence_min_gain: float | None = None,
    anatomy_grid: Sequence[Mapping[str, Any]] | None = DEFAULT_ANATOMY_GRID,
    presence_folds: int = 5,
    presence_cv_margin: float = 0.0,
    presence_cv_z: float = 1.0,
    seed: int = 0,
    profile: str = "challenge",
    false_alarms_per_exam: float = 2.0,
    window_seconds: bool = False,
    calibration: str | None = None,
    pathology_gating: float | None = None,
    verbose: bool = False,
) -> DecoderParams:
    """Fit the decoder's parameters on validation videos by maximising temporal mAP (see ``docs/design/decoding.md``).

    Args:
        videos: the validation videos (:class:`~monai_vce.events.Video` with ground-truth ``events``), or a
            mapping of them; the frame units of their events (:func:`~monai_vce.events.videos_units`) are recorded
            in the parameters (``frame_units``).
        base: starting parameters (order, anatomy settings, ...); the paper's chain when ``None``.
            With ``profile`` ``"paper"`` or ``"authors"`` only its per-label thresholds are kept (e.g. the F1
            thresholds of :meth:`DecoderParams.from_thresholds`).
        composition: ``"label_set"`` or ``"per_label"`` event composition, fixed during tuning; ``None``: the
            profile's own, ``"per_label"`` for ``"challenge"`` (a false run of one label never splits another
            label's event), ``"label_set"`` for ``"paper"`` and ``"authors"`` (their chains).
        anatomy: turn anatomy decoding on (sections by Viterbi, landmarks near boundaries).
        grids: candidate values per chain parameter (keys of :data:`DEFAULT_GRIDS`); a key left out is not tuned.
            ``default_grids(optional=True)`` adds the steps that are off by default (``"hysteresis"``, ``"duration"``).
        rounds: coordinate-ascent rounds over all labels.
        tiou_thresholds: tIoU thresholds of the objective.
        weights: weight of each tIoU threshold in the objective (equal when ``None``).
        presence_rules: candidate presence features (see :mod:`~monai_vce.postprocessing.gating`).
        rankings: ranking rules compared by the composed validation score at the end.
        presence_min_gain: margin (mean AP) a presence cutoff must win by over emitting always / never
            (see :func:`~monai_vce.postprocessing.gating.fit_presence_rule`); ``1 / number of videos`` when
            ``None``: a cutoff must be worth at least one whole video's AP.
        anatomy_grid: candidate Viterbi settings (keys of the ``anatomy`` parameters), compared by the mean
            AP of the five sections (events of the decoded sections alone) on the validation videos; the best
            one is used. An entry without ``lead_in_logit`` is tried with the lead-in at 0 and at the mean logit
            of the sections' thresholds in ``base`` (where the frame model's sections are decided: a shifted
            or compressed model moves it). ``None`` or empty keeps ``base``'s settings.
        presence_folds: folds (over videos) of the cross-validated emission decision: a label is emitted only
            when fitting its decoding and presence rule on the other folds beats never emitting it on the
            held-out fold, in mean AP at every tIoU threshold of positive weight, by more than
            ``max(presence_cv_margin, presence_cv_z * standard error)`` (the standard error of the mean
            per-video gain); otherwise its rule is ``"never"`` (what the empty submission does).
            ``0`` or ``1`` turns the check off (not recommended: in-sample rules overfit).
        presence_cv_margin: the smallest margin of that decision, in mean AP.
        presence_cv_z: how many standard errors the out-of-fold gain must exceed (a gain measured on a few
            videos, driven by one or two of them, is not trusted).
        seed: seed of the fold assignment.
        profile: ``"challenge"``: tune as above; ``"paper"``: the paper's chain (``base``'s thresholds, median 7,
            gaps <= 5 filled, runs < 3 frames dropped, label-set runs in time order, no anatomy decoding or
            gating), nothing tuned; ``"authors"``: the same steps in the authors' code's order
            (:data:`DECODER_PROFILES`). Both only score the chain on ``videos``; the tuning arguments are unused.
            ``"screening"``: :func:`~monai_vce.postprocessing.tune_screening` from ``base`` (no label silenced,
            scored events, pathology thresholds fitted to ``false_alarms_per_exam``).
        false_alarms_per_exam: the screening profile's false-alarm budget (events per exam, all pathology labels).
        window_seconds: also give the tuned windows in seconds (``window_seconds``, :meth:`DecoderParams.with_seconds`)
            at the videos' median row rate, so that a video recorded at another rate converts them; every video
            needs its ``frame_rate``.
        calibration: ``"platt"`` or ``"temperature"``: fit a per-label :class:`ProbabilityCalibration` on the
            videos' frame targets, tune on the calibrated probabilities (``base``'s thresholds mapped through it)
            and record it in the parameters (``calibration``), which the decoder then applies first. ``None``:
            ``base``'s calibration, if any, is kept.
        pathology_gating: with anatomy decoding, try gating each pathology by the fewest sections that hold this
            share of its positive ground-truth frames (e.g. ``0.99``; :func:`pathology_section_candidates`,
            ``anatomy``'s ``pathology_sections``), kept for a label only where it raises its objective; ``None``
            (default): not tried, ``base``'s gates are kept.
        verbose: print progress.

    Returns:
        The fitted :class:`DecoderParams`, with ``fit`` recording the profile, the composed validation mAP and,
        when every video's frame rate is known, their median ``rows_per_second``.
    """
    listed = list(videos.values() if isinstance(videos, Mapping) else videos)
    rates = [r for r in (v.rows_per_second for v in listed) if r is not None]
    rate = float(np.median(rates)) if rates and len(rates) == len(listed) else None
    if window_seconds and rate is None:
        missing = next(str(v.video_id) for v in listed if v.rows_per_second is None) if listed else None
        raise ValueError(
            f"window_seconds: validation video {missing!r} has no frame rate; give the videos' frame rates "
            "(metadata.csv frame_rate column or the bundle's frame_rate) or leave the windows in rows"
        )
    listed, base, calib = _calibrated_inputs(listed, base, calibration)
    params = _tune_decoder(
        listed,
        base,
        composition=composition,
        anatomy=anatomy,
        grids=grids,
        rounds=rounds,
        tiou_thresholds=tiou_thresholds,
        weights=weights,
        presence_rules=presence_rules,
        rankings=rankings,
        presence_min_gain=presence_min_gain,
        anatomy_grid=anatomy_grid,
        presence_folds=presence_folds,
        presence_cv_margin=presence_cv_margin,
        presence_cv_z=presence_cv_z,
        seed=seed,
        profile=profile,
        false_alarms_per_exam=false_alarms_per_exam,
        pathology_gating=pathology_gating,
        verbose=verbose,
    )
    if calib is not None:
        params = params.replace(calibration=calib.to_dict())
    if rate is None:
        return params
    params = params.replace(fit={**dict(params.get("fit") or {}), "rows_per_second": round(rate, 6)})
    return params.with_seconds(rate) if window_seconds else params


def _calibrated_inputs(
    videos: list[Video], base: DecoderParams | Mapping[str, Any] | None, method: str | None
) -> tuple[list[Video], DecoderParams | None, ProbabilityCalibration | None]:
    """The videos and ``base`` in the probability space the tuning works in, and the calibration that maps the
    frame model's probabilities there (fitted with ``method``, else ``base``'s); ``base`` is returned without it,
    so that the tuning's decoders do not apply it a second time."""
    start = None if base is None else base if isinstance(base, DecoderParams) else DecoderParams(base)
    calib = None if start is None else start.calibration
    if start is not None and calib is not None:
        start = DecoderParams({k: v for k, v in start.to_dict().items() if k != "calibration"}, source=start.source)
    if method is not None:
        missing = next((v for v in videos if v.targets is None), None)
        if missing is not None:
            raise ValueError(f"calibration: validation video {missing.video_id!r} has no frame targets to fit it on")
        if calib is not None:
            raise ValueError("calibration: base already carries a calibration; give one or the other")
        probs = np.concatenate([v.probs for v in videos]) if videos else np.zeros((0, NUM_LABELS), np.float32)
        targets = np.concatenate([v.targets for v in videos]) if videos else probs  # type: ignore[misc]
        calib = ProbabilityCalibration.fit(probs, targets, method=method)
        if start is not None:
            # an increasing map: thresholding the mapped probabilities at the mapped thresholds is the same mask
            mapped = calib(start.per_label("threshold")[None, :].astype(np.float64))[0]
            labels = start.to_dict()["labels"]
            for name, t in zip(LABELS, mapped, strict=True):
                labels[name]["threshold"] = float(t)
            start = start.replace(labels=labels)
    if calib is None:
        return videos, start, None
    return [v.replace(probs=calib(v.probs)) for v in videos], start, calib


def _tune_decoder(
    videos: Sequence[Video],
    base: DecoderParams | Mapping[str, Any] | None,
    composition: str | None,
    anatomy: bool,
    grids: Mapping[str, Sequence] | None,
    rounds: int,
    tiou_thresholds: Sequence[float],
    weights: Sequence[float] | None,
    presence_rules: Sequence[Mapping[str, Any]],
    rankings: Sequence[str],
    presence_min_gain: float | None,
    anatomy_grid: Sequence[Mapping[str, Any]] | None,
    presence_folds: int,
    presence_cv_margin: float,
    presence_cv_z: float,
    seed: int,
    profile: str,
    false_alarms_per_exam: float,
    pathology_gating: float | None,
    verbose: bool,
) -> DecoderParams:
    log: Log = print if verbose else (lambda *_: None)
    t0 = time.perf_counter()
    if profile not in DECODER_PROFILES:
        raise ValueError(f"profile: unknown decoder profile {profile!r}; expected one of {list(DECODER_PROFILES)}")
    units = videos_units(videos)
    if profile == "screening":
        return tune_screening(videos, base, false_alarms_per_exam)
    vids = [_Video(v) for v in videos]
    if not vids:
        raise ValueError("tune_decoder needs at least one validation video")
    ths = tuple(float(t) for t in tiou_thresholds)
    weights_arr = np.ones(len(ths)) if weights is None else np.asarray(weights, dtype=np.float64)
    order = DECODER_PROFILES[profile]
    if composition is None:
        composition = "label_set" if order is not None else "per_label"
    if order is not None:
        start = DecoderParams(base) if not isinstance(base, DecoderParams) else base
        chain = DecoderParams.from_thresholds(
            {name: float(t) for name, t in zip(LABELS, start.per_label("threshold"), strict=True)},
            order=list(order),
            composition=composition,
            ranking="none",
            frame_units=units.value,
        )
        objective, scores = _composed_score(vids, chain, ths, weights_arr)
        fit = {"profile": profile, "videos": len(vids), "objective": objective, **scores}
        return chain.replace(fit={**fit, "seconds": round(time.perf_counter() - t0, 1)})
    data = DecoderParams(base).to_dict() if not isinstance(base, DecoderParams) else base.to_dict()
    data.pop("fit", None)
    data["composition"] = composition
    data["frame_units"] = units.value
    data["anatomy"]["enabled"] = bool(anatomy)
    if pathology_gating is not None and not 0.0 < float(pathology_gating) <= 1.0:
        raise ValueError(f"pathology_gating: must be a share in (0, 1] or None, got {pathology_gating!r}")
    for r in rankings:
        if r not in RANKINGS:
            raise ValueError(f"rankings: unknown ranking {r!r}; expected names from {list(RANKINGS)}")
    known = _params()
    grids = dict(default_grids() if grids is None else grids)
    for key in grids:
        if key not in known:
            raise ValueError(f"grids: unknown parameter {key!r}; expected keys from {list(known)}")
        bad = [x for x in grids[key] if not known[key].is_valid(x)]
        if bad:
            raise ValueError(f"grids: {key}: {bad[0]!r} is not {known[key].describe()}")
    # a searched step that the order lacks runs just before "threshold" (a step on the probabilities) or just
    # after it (a step reading the threshold's input) while tuning, off for every label but the one under study;
    # it stays in the order only if some label turns it on
    added = [
        s.name
        for s in CHAIN_STEPS.values()
        if (s.needs_probs or s.context)
        and s.name not in data["order"]
        and any(x != s.param.default for x in grids.get(s.param.name, ()))
    ]
    if added:
        th = data["order"].index("threshold")
        before = [n for n in added if CHAIN_STEPS[n].needs_probs]
        after = [n for n in added if not CHAIN_STEPS[n].needs_probs]
        data["order"] = [*data["order"][:th], *before, "threshold", *after, *data["order"][th + 1 :]]
    params = DecoderParams(data, source="tuned parameters")

    # labels not tuned yet split nothing: the first round starts from empty masks (the untuned chain's
    # many false-positive runs would fragment every candidate); the sections are decoded once
    anatomy_fit = None
    if anatomy and anatomy_grid:
        grid = _with_lead_in(anatomy_grid, params)
        params, anatomy_fit = _fit_anatomy(vids, params, grid, ths, weights_arr, log)
    for v in vids:
        v.mask = np.zeros((v.T, NUM_LABELS), dtype=bool)
        v.sections = section_sequence(v.probs, params["anatomy"]) if anatomy and v.T else None
    tuner = _Tuner(vids, params, ths, weights_arr, [dict(r) for r in presence_rules], grids, log)
    tuner.min_gain = 1.0 / len(vids) if presence_min_gain is None else float(presence_min_gain)
    if presence_folds >= 2 and len(vids) >= 2:
        tuner.folds = video_folds(len(vids), presence_folds, seed)
    tuner.cv_margin = float(presence_cv_margin)
    tuner.cv_z = float(presence_cv_z)
    tuner.silent_defaults = {CHAIN_STEPS[n].param.name: CHAIN_STEPS[n].param.default for n in added}
    if anatomy and pathology_gating is not None:
        tuner.gate_candidates = pathology_section_candidates(vids, float(pathology_gating))
    tuner.run(rounds)
    unused = [
        n
        for n in added
        if all(tuner.labels[lab][CHAIN_STEPS[n].param.name] == CHAIN_STEPS[n].param.default for lab in LABELS)
    ]
    params = params.replace(
        labels=tuner.labels,
        order=[n for n in params["order"] if n not in unused],
        anatomy={**params.to_dict()["anatomy"], "pathology_sections": dict(sorted(tuner.pathology_sections.items()))},
    )

    # choose the ranking by the composed score of the full decoder
    best: tuple[float, str, dict[str, float]] | None = None
    for ranking in rankings or (params["ranking"],):
        obj, scores = _composed_score(vids, params.replace(ranking=ranking), ths, weights_arr)
        log(f"ranking {ranking!r}: composed validation objective {obj:.4f}")
        if best is None or obj > best[0] + 1e-12:
            best = (obj, ranking, scores)
    assert best is not None
    fit = {
        "profile": profile,
        "videos": len(vids),
        "objective": best[0],
        **best[2],
        "rounds": rounds,
        **({"anatomy_objective": anatomy_fit} if anatomy_fit is not None else {}),
        "presence_folds": 0 if tuner.folds is None else int(tuner.folds.max() + 1),
        "out_of_fold_gain": tuner.decisions,
        "seconds": round(time.perf_counter() - t0, 1),
    }
    return params.replace(ranking=best[1], fit=fit)


def _composed_score(
    vids: list[_Video], params: DecoderParams, ths: tuple[float, ...], weights: np.ndarray
) -> tuple[float, dict[str, float]]:
    """The weighted temporal mAP of the full decoder on ``vids``, and the mAP at each tIoU threshold."""
    gt = {"videos": [{"video_id": v.name, "events": _gt_events(v)} for v in vids]}
    decoder = EventDecoder(params)
    pred = event_json({v.name: decoder(v.probs, v.frame_ids, video_id=v.name) for v in vids})
    res = temporal_map(gt, pred, tiou_thresholds=ths, validate=False)
    w = weights / weights.sum()
    scores = {f"mAP@{t:g}": res[f"mAP@{t:g}"] for t in ths}
    return float(sum(wt * scores[f"mAP@{t:g}"] for wt, t in zip(w, ths, strict=True))), scores


def _with_lead_in(grid: Sequence[Mapping[str, Any]], params: DecoderParams) -> list[dict[str, Any]]:
    """``grid`` with each entry that leaves ``lead_in_logit`` out tried at 0 and at the mean logit of the
    sections' thresholds (once when they round to the same value)."""
    th = np.clip([params["labels"][n]["threshold"] for n in SECTIONS], 1e-6, 1.0 - 1e-6)
    levels = sorted({0.0, round(float(np.mean(np.log(th) - np.log1p(-th))), 4)}, key=abs)
    return [
        {**e, "lead_in_logit": level} if "lead_in_logit" not in e else dict(e)
        for e in grid
        for level in (levels if "lead_in_logit" not in e else levels[:1])
    ]


def _fit_anatomy(
    vids: list[_Video],
    params: DecoderParams,
    grid: Sequence[Mapping[str, Any]],
    ths: tuple[float, ...],
    weights: np.ndarray,
    log: Log,
) -> tuple[DecoderParams, list[float]]:
    """Choose the Viterbi settings from ``grid`` by the sections' mean AP.

    Returns:
        The parameters with the best settings, and the objective of each grid entry, in grid order.
    """
    w = np.asarray(weights, dtype=np.float64) / np.sum(weights)
    cols = [LABELS.index(n) for n in SECTIONS]
    scores = []
    for setting in grid:
        trial = DecoderParams(params, source=f"anatomy_grid entry {dict(setting)}").with_anatomy(**dict(setting))
        total = 0.0
        for v in vids:
            sec = section_sequence(v.probs, trial["anatomy"]) if v.T else None
            ks, start, stop = run_bounds(section_mask(sec, v.T))
            segs = np.stack(run_spans(v.frame_ids, start, stop), axis=1)
            for k, c in enumerate(cols):
                pred = segs[ks == k]
                if v.absent[c]:
                    total += float(pred.shape[0] == 0)
                else:
                    total += float(average_precision(v.gt[c], pred, ths) @ w)
        scores.append(total / (len(vids) * len(cols)))
        log(f"anatomy {dict(setting)}: sections' objective {scores[-1]:.4f}")
    best = int(np.argmax(scores))
    return params.with_anatomy(**dict(grid[best])), [round(x, 4) for x in scores]


def _gt_events(v: _Video) -> list[dict[str, Any]]:
    """The validation video's ground truth as per-label events (per-label AP only depends on these)."""
    return [
        {"start": int(s), "end": int(e), "label": [LABELS[c]]} for c in range(NUM_LABELS) for s, e in v.gt[c].tolist()
    ]


def cross_fitted_events(
    videos: Mapping[str, Video],
    folds: int = 2,
    seed: int = 0,
    fit: Callable[[dict[str, Video]], Any] | None = None,
    **tune_kwargs: Any,
) -> dict[str, list[dict[str, Any]]] | None:
    """Decode every video with a decoder fitted on the other videos only: the honest held-out decoding.

    The videos (sorted by id) are dealt into ``folds`` folds (:func:`video_folds`); each fold is decoded by the
    decoder fitted on the other folds. Scoring the result with the ground truth estimates what the fitting
    procedure gives on new videos, which an in-sample fit overstates.

    Args:
        videos: ``{video_id: Video}`` with ground-truth ``events``.
        folds: number of folds.
        seed: seed of the fold assignment.
        fit: ``{video_id: Video} -> DecoderParams`` (or anything :class:`EventDecoder` accepts); default
            :func:`tune_decoder` with ``tune_kwargs``.
        tune_kwargs: keyword arguments of :func:`tune_decoder` when ``fit`` is ``None``.

    Returns:
        ``{video_id: events}`` (most confident first), or ``None`` when there are fewer than ``max(2, folds)``
        videos to cross-fit.
    """
    vids = sorted(videos)
    if len(vids) < max(2, int(folds)):
        return None
    fit_fn = fit if fit is not None else (lambda train: tune_decoder(train, **tune_kwargs))
    fold = video_folds(len(vids), folds, seed)
    pred: dict[str, list[dict[str, Any]]] = {}
    for k in range(int(fold.max()) + 1):
        train = {v: videos[v] for v, f in zip(vids, fold, strict=True) if f != k}
        decoder = EventDecoder(fit_fn(train))
        for v, f in zip(vids, fold, strict=True):
            if f == k:
                pred[v] = list(decoder.decode(videos[v]))
    return pred
