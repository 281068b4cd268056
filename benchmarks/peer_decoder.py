"""The peer decoder: the temporal decoding of the best published RARE-VISION entry, as a benchmark baseline.

Reimplemented from the description of its public repository (``romilimtiaz/ResNet-50-for-GI-Events``; ideas
only, no code taken), with its published numbers:

- sections: a causal exponential moving average (``alpha`` 0.3), then a left-to-right Viterbi over the five
  sections that may only stay or step one section forward (log emissions ``log(s + 1e-6)``, start penalty -0.2
  per section, step -0.05); runs under 5 frames are absorbed into the previous run;
- the 12 other labels (landmarks included), each on its own, by one of its configurations (:data:`CONFIGS`):
  ``"published"`` (its default: causal moving average, ``alpha`` 0.1; a run opens at ``s >= 0.4`` and closes at
  the first ``s <= 0.05``; runs under 3 frames dropped), ``"balanced"`` and ``"strict"`` (per-label thresholds,
  gaps closed, the k best events per label kept, and a label left out of a video unless its raw probability
  peaks above a presence threshold with enough frames >= 0.3), or ``"hmm"``: a two-state Viterbi on the raw
  probabilities (emissions ``log p`` / ``log(1 - p)``), transitions counted on the tuning videos' ground truth
  (Laplace 1) with a stay bias per label (:data:`STAY_BIAS`) plus ``log1p(median run length) / 10`` on both
  diagonal entries, rows renormalised; run ends below 0.1 trimmed, runs under 3 frames dropped;
- optionally (``gate``, per label when fitted), pathology probabilities set to 0 outside the sections it may occur in (angiectasia:
  stomach, small intestine, colon; lymphangioectasis: small intestine; polyp: esophagus to colon; ulcer: stomach,
  small intestine; hematin: stomach), before either mode;
- one event per run and label, scored by its mean (smoothed or raw) probability, each label's events listed best
  first (the list order is the ranking the metric reads).

:func:`select_peer_decoder` picks among the eight published combinations (configuration x gate) by the mean of
mAP@0.5 and mAP@0.95 on the tuning videos, as the peer compared its configurations on validation;
:func:`fit_peer_decoder` fits the hysteresis decoder's parameters and gates per label on the tuning videos
(thresholds on this probability scale, presence tests that may leave a label out): the strongest form of the
baseline.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from scipy.signal import lfilter
from scipy.special import logsumexp

from monai_vce.events import Video
from monai_vce.labels import LABELS, SECTIONS
from monai_vce.metrics import temporal_map
from monai_vce.postprocessing.anatomy import viterbi_sections
from monai_vce.postprocessing.chain import fill_gaps, remove_short_runs, run_bounds

__all__ = [
    "CONFIGS",
    "GATES",
    "GRIDS",
    "STAY_BIAS",
    "causal_ema",
    "hysteresis_mask",
    "monotone_sections",
    "fit_two_state",
    "two_state_mask",
    "trim_run_ends",
    "PeerDecoder",
    "fit_peer_decoder",
    "select_peer_decoder",
]

OTHER = tuple(range(len(SECTIONS), len(LABELS)))  # landmarks and pathology, decoded label by label
#: Sections each gated label may occur in.
GATES: dict[str, tuple[str, ...]] = {
    "angiectasia": ("stomach", "small intestine", "colon"),
    "lymphangioectasis": ("small intestine",),
    "polyp": ("esophagus", "stomach", "small intestine", "colon"),
    "ulcer": ("stomach", "small intestine"),
    "hematin": ("stomach",),
}
#: Stay bias of the two-state model per label (others 1.2).
STAY_BIAS: dict[str, float] = {
    "blood": 1.05,
    "lymphangioectasis": 1.05,
    "erosion": 1.1,
    "erythema": 1.1,
    "polyp": 1.0,
    "ulcer": 1.0,
}
_DEFAULT_STAY = 1.2


def _config(base: dict[str, float], **per_label: dict[str, float]) -> dict[str, dict[str, float]]:
    return {name: {**base, **per_label.get(name.replace(" ", "_").replace("-", "_"), {})} for name in LABELS}


_OFF = {"th_high": 0.4, "th_low": 0.05, "gap_close": 0, "min_len": 3, "topk": 0, "presence_max": 0.0, "presence_min": 0}


def _rare(th_high: float, th_low: float, presence: float, frames: int, topk: int, min_len: int = 3) -> dict:
    keys = ("th_high", "th_low", "presence_max", "presence_min", "topk", "min_len")
    return dict(zip(keys, (th_high, th_low, presence, frames, topk, min_len), strict=True))


# the rarest labels, the same in both of the stricter configurations
_RAREST = {
    "pylorus": _rare(0.5, 0.15, 0.6, 3, 1),
    "hematin": _rare(0.5, 0.15, 0.6, 3, 2),
    "lymphangioectasis": _rare(0.5, 0.15, 0.6, 3, 2),
    "z_line": _rare(0.55, 0.2, 0.7, 2, 1, 2),
    "ileocecal_valve": _rare(0.5, 0.15, 0.6, 2, 1, 2),
    "active_bleeding": _rare(0.5, 0.15, 0.6, 3, 2),
}
#: The hysteresis configurations per label: thresholds, gap closed, shortest run, events kept (0: all), and the
#: presence test (raw probability peak, frames >= 0.3; 0: off).
CONFIGS: dict[str, dict[str, dict[str, float]]] = {
    "published": _config(_OFF),
    "balanced": _config(
        {**_OFF, "th_low": 0.08, "gap_close": 5, "topk": 8},
        **_RAREST,
        angiectasia=_rare(0.45, 0.1, 0.5, 3, 4),
        polyp=_rare(0.4, 0.08, 0.5, 3, 5),
        ulcer=_rare(0.4, 0.08, 0.5, 3, 5),
        erosion=_rare(0.4, 0.08, 0.45, 3, 8),
        erythema=_rare(0.4, 0.08, 0.45, 3, 8),
        blood={"topk": 15, "gap_close": 8, "min_len": 5, "th_high": 0.35, "th_low": 0.08},
    ),
    "strict": _config(
        {**_OFF, "th_high": 0.45, "th_low": 0.1, "gap_close": 3, "min_len": 5, "topk": 5},
        **_RAREST,
        angiectasia=_rare(0.5, 0.15, 0.55, 3, 3),
        polyp=_rare(0.45, 0.1, 0.55, 3, 3),
        ulcer=_rare(0.45, 0.1, 0.55, 3, 3),
        erosion=_rare(0.45, 0.1, 0.5, 3, 5),
        erythema=_rare(0.45, 0.1, 0.5, 3, 5),
        blood={"topk": 10, "gap_close": 5, "min_len": 5, "th_high": 0.4, "th_low": 0.1},
    ),
}
_NEG = -1e30


def causal_ema(probs: np.ndarray, alpha: float) -> np.ndarray:
    """``s[0] = p[0]``, ``s[t] = alpha * p[t] + (1 - alpha) * s[t - 1]`` along axis 0 of ``(T, C)`` probabilities."""
    p = np.asarray(probs, dtype=np.float64)
    if p.shape[0] == 0:
        return p
    out, _ = lfilter([alpha], [1.0, alpha - 1.0], p, axis=0, zi=((1.0 - alpha) * p[:1]))
    return out


def hysteresis_mask(s: np.ndarray, high: float, low: float) -> np.ndarray:
    """Runs that open at the first frame with ``s >= high`` and close at the first later frame with ``s <= low``.

    Args:
        s: ``(T, C)`` scores.
        high: opening threshold.
        low: closing threshold (the closing frame is outside the run).

    Returns:
        ``(T, C)`` bool mask.
    """
    s = np.asarray(s, dtype=np.float64)
    T = s.shape[0]
    alive = s > low  # a run can only live on frames above the closing threshold
    opens = alive & (s >= high)
    # per column, the frame where each stretch of `alive` starts, carried forward
    t = np.arange(T)[:, None]
    starts = alive & ~np.vstack([np.zeros((1, s.shape[1]), bool), alive[:-1]])
    stretch_start = np.maximum.accumulate(np.where(starts, t, 0), axis=0)
    # the last opening frame so far, carried forward: the run covers a frame once its stretch has opened
    last_open = np.maximum.accumulate(np.where(opens, t, -1), axis=0)
    return alive & (last_open >= stretch_start)


def monotone_sections(
    section_probs: np.ndarray,
    alpha: float = 0.3,
    start_penalty: float = -0.2,
    step_penalty: float = -0.05,
    min_run: int = 5,
) -> np.ndarray:
    """One section per frame: moving average, a stay-or-step-forward Viterbi, short runs absorbed.

    Args:
        section_probs: ``(T, S)`` section probabilities in gut order.
        alpha: smoothing of :func:`causal_ema`.
        start_penalty: log-score per section index of the first frame's section.
        step_penalty: log-score of moving to the next section.
        min_run: runs shorter than this join the previous run (the first run joins the next).

    Returns:
        ``(T,)`` section indices.
    """
    s = causal_ema(section_probs, alpha)
    S = s.shape[1]
    trans = np.full((S, S), _NEG)
    trans[np.arange(S), np.arange(S)] = 0.0
    trans[np.arange(S - 1), np.arange(1, S)] = step_penalty
    path = viterbi_sections(np.log(s + 1e-6), trans, initial=start_penalty * np.arange(S))
    change = np.flatnonzero(np.diff(path)) + 1
    bounds = [0, *change.tolist(), path.size]
    labels = [int(path[a]) for a in bounds[:-1]]
    runs = list(zip(bounds[:-1], bounds[1:], labels, strict=True))
    out: list[list[int]] = []
    for a, b, k in runs:  # at most one run per section: a tiny loop
        if out and (b - a < min_run or out[-1][2] == k):
            out[-1][1] = b
        else:
            out.append([a, b, k])
    if len(out) > 1 and out[0][1] - out[0][0] < min_run:
        out[1][0] = out[0][0]
        out.pop(0)
    result = np.empty_like(path)
    for a, b, k in out:
        result[a:b] = k
    return result


def fit_two_state(truths: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Log start and transition scores of the two-state model of each of the 12 decoded labels.

    Args:
        truths: ``(T, 17)`` binary ground-truth frames of each tuning video.

    Returns:
        ``(12, 2)`` log start scores and ``(12, 2, 2)`` log transitions (row = from state), stay bias included.
    """
    cols = np.asarray(OTHER)
    counts = np.ones((cols.size, 2, 2))
    starts = np.ones((cols.size, 2))
    run_lengths: list[list[np.ndarray]] = [[] for _ in cols]
    for y in truths:
        y = np.asarray(y, dtype=bool)[:, cols]
        if y.shape[0] == 0:
            continue
        starts[np.arange(cols.size), y[0].astype(int)] += 1
        for a in (0, 1):
            for b in (0, 1):
                counts[:, a, b] += np.sum((y[:-1] == a) & (y[1:] == b), axis=0)
        for j in range(cols.size):  # runs of both states, pooled
            edges = np.flatnonzero(np.diff(y[:, j].astype(np.int8))) + 1
            run_lengths[j].append(np.diff(np.concatenate([[0], edges, [y.shape[0]]])))
    log_a = np.log(counts / counts.sum(axis=2, keepdims=True))
    for j, c in enumerate(cols):
        lengths = np.concatenate(run_lengths[j]) if run_lengths[j] else np.ones(1)
        bias = STAY_BIAS.get(LABELS[c], _DEFAULT_STAY) + np.log1p(np.median(lengths)) / 10.0
        log_a[j, [0, 1], [0, 1]] += bias
    log_a -= logsumexp(log_a, axis=2, keepdims=True)
    log_pi = np.log(starts / starts.sum(axis=1, keepdims=True))
    return log_pi, log_a


def two_state_mask(probs: np.ndarray, log_pi: np.ndarray, log_a: np.ndarray) -> np.ndarray:
    """Viterbi decode of each column of ``(T, K)`` probabilities with its two-state model: ``(T, K)`` present mask."""
    p = np.asarray(probs, dtype=np.float64)
    out = np.zeros(p.shape, dtype=bool)
    for j in range(p.shape[1]):
        em = np.stack([np.log(1.0 - p[:, j] + 1e-8), np.log(p[:, j] + 1e-8)], axis=1)
        out[:, j] = viterbi_sections(em, log_a[j], initial=log_pi[j]) == 1
    return out


def trim_run_ends(mask: np.ndarray, probs: np.ndarray, threshold: float) -> np.ndarray:
    """Shrink each run of a ``(T, C)`` mask to the span between its first and last frame with ``p >= threshold``."""
    keep = np.asarray(mask, dtype=bool) & (np.asarray(probs) >= threshold)
    out = np.zeros_like(keep)
    cls, start, stop = run_bounds(np.asarray(mask, dtype=bool), value=True)
    for c, a, b in zip(cls.tolist(), start.tolist(), stop.tolist(), strict=True):
        hit = np.flatnonzero(keep[a:b, c])
        if hit.size:
            out[a + hit[0] : a + hit[-1] + 1, c] = True
    return out


#: Coordinate grids of :func:`fit_peer_decoder` (``th_low`` as a fraction of ``th_high``; a presence peak above 1
#: leaves the label out of every video).
GRIDS: dict[str, tuple[float, ...]] = {
    "th_high": (0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9),
    "th_low": (0.125, 0.25, 0.5, 0.75),
    "gap_close": (0, 3, 8),
    "min_len": (2, 3, 5, 10),
    "presence_max": (0.0, 0.5, 0.7, 0.9, 0.97, 2.0),
    "presence_min": (0, 3, 10),
    "topk": (0, 1, 2, 5, 15),
}


class _Prepared:
    """What every configuration shares for one video: sections, their events, the other labels' probabilities and
    their moving averages, without (``[0]``) and with (``[1]``) the anatomy gates."""

    def __init__(self, video: Video) -> None:
        p = np.asarray(video.probs, dtype=np.float64)
        self.video_id, self.ids = video.video_id, video.frame_index
        self.sections = monotone_sections(p[:, : len(SECTIONS)])
        smooth = causal_ema(p[:, : len(SECTIONS)], 0.3)
        change = np.flatnonzero(np.diff(self.sections)) + 1
        self.section_events = [
            (int(self.sections[a]), float(smooth[a:b, self.sections[a]].mean()), int(self.ids[a]), int(self.ids[b - 1]))
            for a, b in zip([0, *change.tolist()], [*change.tolist(), self.sections.size], strict=True)
        ]
        plain = p[:, list(OTHER)]
        gated = plain.copy()
        for name, allowed in GATES.items():
            ok = np.isin(self.sections, [SECTIONS.index(s) for s in allowed])
            gated[~ok, OTHER.index(LABELS.index(name))] = 0.0
        self.other = (plain, gated)
        self.ema = (causal_ema(plain, 0.1), causal_ema(gated, 0.1))

    def columns(self, gates: Sequence[bool], smoothed: bool) -> np.ndarray:
        """``(T, 12)`` probabilities (or their moving averages), each label gated or not."""
        plain, gated = self.ema if smoothed else self.other
        return np.where(np.asarray(gates, dtype=bool)[None, :], gated, plain)


def _hysteresis(prep: _Prepared, config: Mapping[str, Mapping[str, float]]) -> tuple[np.ndarray, np.ndarray]:
    """``(T, 12)`` masks of the other labels by a hysteresis configuration (:data:`CONFIGS`), and their scores."""
    per = [config[LABELS[c]] for c in OTHER]
    gates = [bool(c.get("gate", 0)) for c in per]
    ema, raw = prep.columns(gates, smoothed=True), prep.columns(gates, smoothed=False)
    high, low = (np.array([c[k] for c in per])[None, :] for k in ("th_high", "th_low"))
    mask = hysteresis_mask(ema, high, low)
    mask = remove_short_runs(fill_gaps(mask, [int(c["gap_close"]) for c in per]), [int(c["min_len"]) for c in per])
    peak = raw.max(axis=0, initial=0.0)
    support = np.sum(raw >= 0.3, axis=0)
    absent = [c["presence_max"] > 0 and (peak[j] < c["presence_max"] or support[j] < c["presence_min"])
              for j, c in enumerate(per)]  # fmt: skip
    mask[:, np.flatnonzero(absent)] = False
    return mask, ema


def _events(prep: _Prepared, mask: np.ndarray, scores: np.ndarray, topk: Sequence[int]) -> list[dict[str, Any]]:
    """Section events, then each other label's runs best first (at most ``topk[j]``; 0: all), in label order."""
    ids = prep.ids
    cls, start, stop = run_bounds(mask, value=True)
    # mean score of each run from the cumulative sums of its column
    cum = np.vstack([np.zeros((1, scores.shape[1])), np.cumsum(scores, axis=0)])
    means = (cum[stop, cls] - cum[start, cls]) / np.maximum(stop - start, 1)
    runs = [(OTHER[j], m, int(ids[a]), int(ids[b - 1]), j) for j, m, a, b in
            zip(cls.tolist(), means.tolist(), start.tolist(), stop.tolist(), strict=True)]  # fmt: skip
    runs.sort(key=lambda e: (e[0], -e[1]))
    kept = np.zeros(len(OTHER), dtype=np.int64)
    events = list(prep.section_events)
    for c, score, a, b, j in runs:
        kept[j] += 1
        if not topk[j] or kept[j] <= topk[j]:
            events.append((c, score, a, b))
    events.sort(key=lambda e: (e[0], -e[1]))
    return [{"start": s, "end": e, "label": [LABELS[c]]} for c, _, s, e in events]


class PeerDecoder:
    """The peer's decoding of ``(T, 17)`` frame probabilities into per-label events (module docstring).

    Args:
        config: a configuration of :data:`CONFIGS` by name or as ``{label: parameters}`` (e.g. fitted by
            :func:`fit_peer_decoder`; a ``"gate"`` parameter per label), or ``"hmm"`` (needs :meth:`fit`).
        gate: for a configuration by name, zero every gated label's probabilities outside its sections first.
        name: how tables name it (the configuration's name by default).
    """

    def __init__(
        self, config: str | Mapping[str, Mapping[str, float]] = "published", gate: bool = False, name: str = ""
    ) -> None:
        if isinstance(config, str) and config not in (*CONFIGS, "hmm"):
            raise ValueError(f"config must be one of {[*CONFIGS, 'hmm']} or a mapping, got {config!r}")
        self.hmm = config == "hmm"
        self.gate = gate
        if isinstance(config, str):
            self.config = (
                {n: {**CONFIGS["published"][n], "gate": int(gate)} for n in LABELS}
                if self.hmm
                else {n: {**params, "gate": int(gate)} for n, params in CONFIGS[config].items()}
            )
            self.name = config + (" + gates" if gate else "")
        else:
            self.config = {n: dict(params) for n, params in config.items()}
            gated = sum(bool(self.config[n].get("gate", 0)) for n in GATES)
            self.name = (name or "fitted") + (f" + gates on {gated} labels" if gated else "")
        self.log_pi: np.ndarray | None = None
        self.log_a: np.ndarray | None = None

    def fit(self, truths: Sequence[np.ndarray]) -> PeerDecoder:
        """Count the two-state transitions on ground-truth frames (``(T, 17)`` per tuning video)."""
        self.log_pi, self.log_a = fit_two_state(truths)
        return self

    def decode_prepared(self, prep: _Prepared) -> list[dict[str, Any]]:
        if not self.hmm:
            topk = [int(self.config[LABELS[c]]["topk"]) for c in OTHER]
            mask, scores = _hysteresis(prep, self.config)
            return _events(prep, mask, scores, topk)
        if self.log_pi is None or self.log_a is None:
            raise RuntimeError("PeerDecoder('hmm') needs fit() on the tuning videos' ground truth first")
        other = prep.other[int(self.gate)]
        mask = trim_run_ends(two_state_mask(other, self.log_pi, self.log_a), other, 0.1)
        return _events(prep, remove_short_runs(mask, 3), other, [0] * len(OTHER))

    def decode(self, video: Video) -> list[dict[str, Any]]:
        """Per-label events of one video in ``frame_index`` units, each label's best first."""
        return self.decode_prepared(_Prepared(video))

    def decode_videos(self, videos: Sequence[Video]) -> dict[str, Any]:
        """The event file of several videos."""
        return {"videos": [{"video_id": v.video_id, "events": self.decode(v)} for v in videos]}


def _objective(result: Mapping[str, Any]) -> np.ndarray:
    """Mean of the AP at tIoU 0.5 and 0.95 of each of the 12 labels (the mAP is their mean with the sections')."""
    return np.array([(result["per_label"][LABELS[c]]["0.5"] + result["per_label"][LABELS[c]]["0.95"]) / 2
                     for c in OTHER])  # fmt: skip


def _score(
    prepared: Sequence[_Prepared], config: Mapping[str, Mapping[str, float]], gt: Mapping[str, Any]
) -> tuple[np.ndarray, float]:
    """Each other label's objective and the mean of mAP@0.5 and mAP@0.95 of a hysteresis configuration."""
    topk = [int(config[LABELS[c]]["topk"]) for c in OTHER]
    pred = {"videos": [{"video_id": p.video_id, "events": _events(p, *_hysteresis(p, config), topk)}
                       for p in prepared]}  # fmt: skip
    res = temporal_map(gt, pred, validate=False)
    return _objective(res), (res["mAP@0.5"] + res["mAP@0.95"]) / 2


def fit_peer_decoder(
    videos: Sequence[Video], gt: Mapping[str, Any], rounds: int = 2, start: str = "balanced"
) -> tuple[PeerDecoder, float]:
    """The peer's hysteresis decoder with its parameters fitted per label on the tuning videos.

    Coordinate ascent over :data:`GRIDS` (and the anatomy gate of each gated label) from the ``start``
    configuration, each label's parameters by its own AP: labels do not interact in the metric.

    Returns:
        The fitted decoder and its tuning objective (mean of mAP@0.5 and mAP@0.95 on the tuning videos).
    """
    prepared = [_Prepared(v) for v in videos]
    config = {name: {**params, "gate": 0} for name, params in CONFIGS[start].items()}
    current, total = _score(prepared, config, gt)
    for _ in range(rounds):
        for key, grid in {**GRIDS, "gate": (0, 1)}.items():
            for value in grid:
                cand = {name: dict(params) for name, params in config.items()}
                for c in OTHER:
                    params = cand[LABELS[c]]
                    params[key] = value * params["th_high"] if key == "th_low" else value
                    if params["th_low"] >= params["th_high"]:
                        params["th_low"] = params["th_high"] / 2
                per_label, _ = _score(prepared, cand, gt)
                for j, c in enumerate(OTHER):
                    if per_label[j] > current[j] + 1e-12:
                        config[LABELS[c]], current[j] = cand[LABELS[c]], per_label[j]
        current, total = _score(prepared, config, gt)
    return PeerDecoder(config, name="fitted"), total


def select_peer_decoder(
    videos: Sequence[Video], truths: Mapping[str, np.ndarray], gt: Mapping[str, Any]
) -> tuple[PeerDecoder, dict[str, float]]:
    """The published configuration (:data:`CONFIGS` or ``"hmm"``, with or without gates) best on the tuning videos.

    Args:
        videos: the tuning videos.
        truths: their ``(T, 17)`` ground-truth frames by video id (for the two-state model's transitions).
        gt: their ground-truth event file.

    Returns:
        The chosen decoder and each candidate's tuning objective (mean of mAP@0.5 and mAP@0.95) by name.
    """
    scores: dict[str, float] = {}
    best: tuple[float, PeerDecoder] | None = None
    for config in (*CONFIGS, "hmm"):
        for gate in (False, True):
            peer = PeerDecoder(config, gate)
            if config == "hmm":
                peer.fit([truths[v.video_id] for v in videos])
            res = temporal_map(gt, peer.decode_videos(videos))
            scores[peer.name] = objective = (res["mAP@0.5"] + res["mAP@0.95"]) / 2
            if best is None or objective > best[0]:
                best = (objective, peer)
    assert best is not None
    return best[1], scores
