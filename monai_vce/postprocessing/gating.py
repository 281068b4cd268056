"""Presence gating: per video and label, whether the label is emitted at all (rules ``"peak"``, ``"quantile"``,
``"support"``, ``"none"``, ``"never"``), fitted and cross-validated on validation videos.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from .steps import MAX_FRAMES, Param

__all__ = [
    "PRESENCE_FEATURES",
    "PRESENCE_PARAMS",
    "DEFAULT_CANDIDATE_RULES",
    "presence_features",
    "column_presence",
    "apply_presence_rules",
    "fit_presence_rule",
    "video_folds",
    "cross_validate_presence",
]

PRESENCE_FEATURES: tuple[str, ...] = ("none", "never", "peak", "quantile", "support")
#: Features compared with a ``cutoff``.
_CUTOFF_FEATURES: tuple[str, ...] = ("peak", "quantile", "support")
#: The settings of a presence rule besides ``feature``.
PRESENCE_PARAMS: dict[str, Param] = {
    p.name: p
    for p in (
        Param("cutoff", "number", None, -1e9, 1e9, doc="the label is present when feature >= cutoff"),
        Param("window", "integer", 1, 1, MAX_FRAMES, doc="frames averaged by the 'peak' feature"),
        Param("q", "number", 0.99, 0.0, 1.0, doc="quantile of the 'quantile' feature"),
    )
}

#: Feature settings tried by :func:`fit_presence_rule` (the cutoff is fitted for each).
DEFAULT_CANDIDATE_RULES: tuple[dict[str, Any], ...] = (
    {"feature": "peak", "window": 1},
    {"feature": "peak", "window": 9},
    {"feature": "peak", "window": 31},
    {"feature": "quantile", "q": 0.99},
    {"feature": "quantile", "q": 0.999},
    {"feature": "support"},
)


def _moving_mean_max(probs: np.ndarray, window: int) -> np.ndarray:
    """Per-class maximum over time of the running mean over ``window`` frames (all frames when shorter)."""
    T = probs.shape[0]
    w = int(max(1, min(window, T)))
    if w == 1:
        return probs.max(axis=0)
    csum = np.zeros((T + 1, probs.shape[1]))
    np.cumsum(probs, axis=0, out=csum[1:])
    return ((csum[w:] - csum[:-w]) / w).max(axis=0)


def presence_features(
    probs: np.ndarray,
    mask: np.ndarray | None,
    rule: Mapping[str, Any],
    columns: Sequence[int] | np.ndarray | None = None,
) -> np.ndarray:
    """Compute one rule's feature for some classes of a video.

    Args:
        probs: ``(T, C)`` probabilities.
        mask: ``(T, C)`` activity mask after the chain (used by ``"support"``).
        rule: a rule dict with ``"feature"`` and its settings (``"window"``, ``"q"``).
        columns: the classes to compute; all when ``None``.

    Returns:
        ``(len(columns),)`` feature values (``inf`` for ``"none"``); ``-inf`` for an empty video.
    """
    cols = np.arange(probs.shape[1]) if columns is None else np.asarray(columns)
    feature = rule.get("feature", "none")
    if feature == "none":
        return np.full(cols.size, np.inf)
    if feature == "never":
        return np.full(cols.size, -np.inf)
    if probs.shape[0] == 0:
        return np.full(cols.size, -np.inf)
    p = probs[:, cols]
    if feature == "peak":
        return _moving_mean_max(p.astype(np.float64), int(rule.get("window", 1)))
    if feature == "quantile":
        return np.quantile(p, float(rule.get("q", 0.99)), axis=0)
    if feature == "support":
        if mask is None:
            raise ValueError("the 'support' presence feature needs the decoded mask")
        return mask[:, cols].sum(axis=0).astype(np.float64)
    raise ValueError(f"unknown presence feature {feature!r}; expected one of {list(PRESENCE_FEATURES)}")


def column_presence(
    probs: np.ndarray, mask: np.ndarray, labels: Sequence[int] | np.ndarray, rules: Sequence[Mapping[str, Any]]
) -> np.ndarray:
    """Presence of ``K`` decoded columns of one video, each under its own rule (the one presence kernel).

    Columns sharing a rule setting are computed together. ``"support"`` counts the active frames of the
    column itself (the chain's mask after anatomy gating, i.e. the frames the label would be emitted on); the
    other features read the column's label in ``probs``.

    Args:
        probs: ``(T, 17)`` probabilities.
        mask: ``(T, K)`` decoded columns.
        labels: ``(K,)`` the label (column of ``probs``) of each decoded column.
        rules: ``K`` presence rules.

    Returns:
        ``(K,)`` booleans.
    """
    labels = np.asarray(labels, dtype=np.int64)
    K = labels.size
    if len(rules) != K or mask.shape[1] != K:
        raise ValueError(f"expected {mask.shape[1]} presence rules and labels, got {len(rules)} and {K}")
    present = np.ones(K, dtype=bool)
    groups: dict[tuple, list[int]] = {}
    for k, rule in enumerate(rules):
        feature = rule.get("feature", "none")
        if feature == "none":
            continue
        if feature == "never":
            present[k] = False
            continue
        groups.setdefault((feature, rule.get("window"), rule.get("q")), []).append(k)
    for cols in groups.values():
        rule = rules[cols[0]]
        if rule["feature"] == "support":
            f = presence_features(probs, mask, rule, cols)
        else:
            f = presence_features(probs, None, rule, labels[cols])
        cut = np.array([float(rules[c]["cutoff"]) for c in cols])
        present[cols] = f >= cut
    return present


def apply_presence_rules(probs: np.ndarray, mask: np.ndarray, rules: Sequence[Mapping[str, Any]]) -> np.ndarray:
    """Return the ``(C,)`` boolean presence of each class of one video under per-class ``rules``
    (:func:`column_presence` of the columns of ``mask``, column ``c`` being label ``c``)."""
    C = probs.shape[1]
    if len(rules) != C:
        raise ValueError(f"expected {C} presence rules, got {len(rules)}")
    return column_presence(probs, mask, np.arange(C), rules)


def fit_presence_rule(
    features: Mapping[str, np.ndarray] | Sequence[tuple[Mapping[str, Any], np.ndarray]],
    ap_present: np.ndarray,
    absent: np.ndarray,
    min_gain: float = 0.0,
) -> tuple[dict[str, Any], float]:
    """Fit one label's presence rule on validation videos.

    Args:
        features: pairs ``(rule settings, (V,) feature values)``, one per candidate feature.
        ap_present: ``(V,)`` AP of the label in each video when it is emitted (not gated).
        absent: ``(V,)`` True where the video's ground truth lacks the label (AP 1.0 when gated out).
        min_gain: how much a rule with a cutoff must beat the better of ``"never"`` and ``"none"`` (in mean
            AP) to be chosen, and ``"none"`` must beat ``"never"``; a guard against cutoffs fitted to a few
            validation videos.

    Returns:
        ``(rule, mean AP)``: the best rule with its cutoff half-way between the two validation values it
        separates, and the mean validation AP it reaches.
    """
    ap_present = np.asarray(ap_present, dtype=np.float64)
    gated_ap = np.asarray(absent, dtype=np.float64)
    V = ap_present.size
    if V == 0:
        return {"feature": "none"}, 0.0
    never, none = float(gated_ap.mean()), float(ap_present.mean())
    best_rule: dict[str, Any]
    if none > never + min_gain:
        best_rule, best = {"feature": "none"}, none
    else:
        best_rule, best = {"feature": "never"}, never
    base = max(never, none)
    items: Iterable[tuple[Any, np.ndarray]] = features.items() if isinstance(features, Mapping) else features
    for settings, values in items:
        settings = dict(settings) if isinstance(settings, Mapping) else {"feature": str(settings)}
        f = np.asarray(values, dtype=np.float64)
        order = np.argsort(f, kind="stable")
        fs = f[order]
        # cutoff between fs[k-1] and fs[k]: videos order[:k] are gated out, order[k:] emitted
        gained = np.concatenate([[0.0], np.cumsum(gated_ap[order])])
        kept = np.concatenate([np.cumsum(ap_present[order][::-1])[::-1], [0.0]])
        score = (gained + kept) / V
        # only interior cuts between distinct values (the ends are "none" and "never")
        valid = np.zeros(V + 1, dtype=bool)
        valid[1:V] = fs[1:] > fs[:-1]
        if not valid.any():
            continue
        score = np.where(valid, score, -np.inf)
        k = int(np.argmax(score))
        if score[k] > max(best, base + min_gain) + 1e-12:
            best = float(score[k])
            best_rule = {**dict(settings), "cutoff": float(0.5 * (fs[k - 1] + fs[k]))}
    return best_rule, best


def video_folds(num_videos: int, folds: int = 5, seed: int = 0) -> np.ndarray:
    """``(V,)`` fold index of each video: a seeded shuffle dealt round-robin into ``min(folds, V)`` folds."""
    k = max(1, min(int(folds), int(num_videos)))
    out = np.empty(num_videos, dtype=np.int64)
    out[np.random.default_rng(seed).permutation(num_videos)] = np.arange(num_videos) % k
    return out


def _rule_present(
    rule: Mapping[str, Any], feats: Sequence[tuple[Mapping[str, Any], np.ndarray]], idx: np.ndarray
) -> np.ndarray:
    """Presence of videos ``idx`` under a fitted rule, reading its feature from the candidate's features."""
    feature = rule["feature"]
    if feature == "none":
        return np.ones(idx.size, dtype=bool)
    if feature == "never":
        return np.zeros(idx.size, dtype=bool)
    settings = {k: v for k, v in rule.items() if k != "cutoff"}
    for s, values in feats:
        if dict(s) == settings:
            return np.asarray(values, dtype=np.float64)[idx] >= float(rule["cutoff"])
    raise ValueError(f"presence rule {rule!r} has no matching feature among the candidates")


def cross_validate_presence(
    candidates: Sequence[tuple[Sequence[tuple[Mapping[str, Any], np.ndarray]], np.ndarray]],
    absent: np.ndarray,
    weights: Sequence[float] | np.ndarray,
    folds: np.ndarray,
    min_gain: float = 0.0,
) -> np.ndarray:
    """Out-of-fold AP of fitting one label's decoding and presence rule, per video and tIoU threshold.

    For each fold, every candidate decoding gets its presence rule fitted (:func:`fit_presence_rule`) on the
    videos of the other folds; the candidate with the best in-fold objective is applied, with its rule, to
    the videos of the held-out fold. Comparing the result with ``absent`` (the AP of never emitting the label)
    tells whether emitting the label generalises.

    Args:
        candidates: per candidate decoding, ``(features, ap)``: the presence features as for
            :func:`fit_presence_rule` (``(V,)`` values each) and the ``(V, N)`` AP of the emitted label at
            each of ``N`` tIoU thresholds.
        absent: ``(V,)`` True where the video lacks the label.
        weights: ``(N,)`` weight of each tIoU threshold in the fitting objective.
        folds: ``(V,)`` fold index of each video (:func:`video_folds`).
        min_gain: passed to :func:`fit_presence_rule`.

    Returns:
        ``(V, N)`` out-of-fold AP (a video whose fold's fit says "never" scores its ``absent`` value).
    """
    absent = np.asarray(absent, dtype=bool)
    folds = np.asarray(folds)
    w = np.asarray(weights, dtype=np.float64)
    w = w / w.sum()
    V = absent.size
    N = w.size
    out = np.tile(absent.astype(np.float64)[:, None], (1, N))
    if not candidates or V < 2:
        return out
    for f in np.unique(folds):
        test = np.flatnonzero(folds == f)
        train = np.flatnonzero(folds != f)
        if train.size == 0:
            continue
        best = None
        for c, (feats, ap) in enumerate(candidates):
            ap = np.asarray(ap, dtype=np.float64)
            sub = [(s, np.asarray(values)[train]) for s, values in feats]
            rule, score = fit_presence_rule(sub, ap[train] @ w, absent[train], min_gain)
            if best is None or score > best[0] + 1e-12:
                best = (score, c, rule)
        assert best is not None  # at least one candidate
        _, c, rule = best
        feats, ap = candidates[c]
        present = _rule_present(rule, feats, test)
        out[test] = np.where(present[:, None], np.asarray(ap, dtype=np.float64)[test], out[test])
    return out
