"""Video-level splits of frame datalists (train/validation, k-fold), stratified on rare labels.

Each video stays whole on one side; the result depends only on the videos, their labels and ``seed``.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from monai_vce.labels import NUM_LABELS
from monai_vce.utils import LazySequence, natural_key

__all__ = [
    "group_by_video",
    "video_rows",
    "video_ids",
    "video_label_presence",
    "video_capsules",
    "assign_video_groups",
    "repair_video_groups",
    "split_videos",
    "kfold_videos",
    "lazy_split_videos",
    "subsample_frames",
]


def video_ids(datalist: Sequence[Mapping[str, Any]]) -> list[str]:
    """Return the distinct ``video_id`` values of a datalist in natural id order."""
    return sorted({str(d["video_id"]) for d in datalist}, key=natural_key)


def video_rows(datalist: Sequence[Mapping[str, Any]]) -> dict[str, np.ndarray]:
    """The positions of each video's items in a datalist.

    Args:
        datalist: frame dicts with a ``video_id``.

    Returns:
        ``{video_id: int64 positions}`` with videos in natural id order and positions in datalist order.
    """
    if not datalist:
        return {}
    ids, inverse = np.unique(np.array([str(d["video_id"]) for d in datalist]), return_inverse=True)
    order = np.argsort(inverse, kind="stable")
    parts = np.split(order.astype(np.int64), np.cumsum(np.bincount(inverse, minlength=ids.size))[:-1])
    rows = {str(v): r for v, r in zip(ids.tolist(), parts, strict=True)}
    return {k: rows[k] for k in sorted(rows, key=natural_key)}


def group_by_video(datalist: Sequence[Mapping[str, Any]]) -> dict[str, list[Mapping[str, Any]]]:
    """Group datalist items by ``video_id``.

    Args:
        datalist: frame dicts with a ``video_id``.

    Returns:
        ``{video_id: [items]}`` with videos in natural id order and items in datalist order.
    """
    return {vid: [datalist[i] for i in rows.tolist()] for vid, rows in video_rows(datalist).items()}


def video_label_presence(datalist: Sequence[dict]) -> tuple[list[str], np.ndarray]:
    """Which labels are present (in at least one frame) in each video.

    Args:
        datalist: frame dicts; items without ``label`` count as no label.

    Returns:
        ``(video_ids, presence)``: ids in natural order and a bool array (V, 17) in :data:`LABELS` order.
    """
    groups = group_by_video(datalist)
    ids = list(groups)
    presence = np.zeros((len(ids), NUM_LABELS), dtype=bool)
    for i, vid in enumerate(ids):
        labelled = [d["label"] for d in groups[vid] if d.get("label") is not None]
        if labelled:
            presence[i] = (np.asarray(labelled, dtype=np.float32) > 0.5).any(axis=0)
    return ids, presence


def video_capsules(datalist: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    """``{video_id: capsule}`` from a frame datalist (a video's first frame; ``"unknown"`` when not given)."""
    caps: dict[str, str] = {}
    for d in datalist:
        caps.setdefault(str(d["video_id"]), str(d.get("capsule") or "unknown"))
    return caps


def _capsule_columns(datalist: Sequence[dict], ids: list[str]) -> np.ndarray:
    caps = video_capsules(datalist)
    names = sorted({c for c in caps.values() if c != "unknown"})
    out = np.zeros((len(ids), len(names)), dtype=bool)
    for i, vid in enumerate(ids):
        if caps.get(vid) in names:
            out[i, names.index(caps[vid])] = True
    return out


def assign_video_groups(
    presence: np.ndarray,
    sizes: Sequence[int],
    seed: int = 0,
    secondary: np.ndarray | None = None,
) -> np.ndarray:
    """Assign videos to groups of given sizes, spreading each label over as many groups as possible.

    Args:
        presence: bool (V, L): which label each video carries.
        sizes: number of videos per group; must sum to V.
        seed: seed of the random visiting and tie-breaking orders.
        secondary: optional bool (V, C) of extra categories (e.g. capsule systems) stratified after all
            labels of ``presence`` have been handled.

    Returns:
        int64 (V,) group number of each video.
    """
    presence = np.asarray(presence, dtype=bool)
    n_videos = presence.shape[0]
    sizes = [int(s) for s in sizes]
    if sum(sizes) != n_videos or min(sizes) < 0:
        raise ValueError(f"group sizes {sizes} must be non-negative and sum to the number of videos ({n_videos})")
    rng = np.random.default_rng(seed)
    visit = rng.permutation(n_videos)  # random order of videos within a label
    rank = np.empty(n_videos, dtype=np.int64)
    rank[visit] = np.arange(n_videos)
    group_tie = rng.permutation(len(sizes))  # random preference between otherwise equal groups
    cols = [presence]
    if secondary is not None and np.asarray(secondary).size:
        cols.append(np.asarray(secondary, dtype=bool))
    tiers = np.concatenate([np.full(c.shape[1], t) for t, c in enumerate(cols)])
    matrix = np.concatenate(cols, axis=1)
    group = np.full(n_videos, -1, dtype=np.int64)
    room = np.array(sizes, dtype=np.int64)
    counts = np.zeros((len(sizes), matrix.shape[1]), dtype=np.int64)  # videos of each label per group

    def put(v: int, g: int) -> None:
        group[v] = g
        room[g] -= 1
        counts[g] += matrix[v]

    while True:
        unassigned = group < 0
        remaining = matrix[unassigned].sum(axis=0)
        active = np.flatnonzero(remaining > 0)
        if active.size == 0:
            break
        # rarest label first; secondary categories only after every label
        lab = active[np.lexsort((active, remaining[active], tiers[active]))[0]]
        for v in sorted(np.flatnonzero(unassigned & matrix[:, lab]), key=lambda i: rank[i]):
            open_groups = np.flatnonzero(room > 0)
            g = min(open_groups, key=lambda k: (counts[k, lab], -room[k], group_tie[k]))
            put(int(v), int(g))
    for v in sorted(np.flatnonzero(group < 0), key=lambda i: rank[i]):
        put(int(v), int(min(np.flatnonzero(room > 0), key=lambda k: (-room[k], group_tie[k]))))
    return group


def _reach(presence: np.ndarray, group: np.ndarray, n_groups: int) -> np.ndarray:
    """Number of groups holding at least one video of each label."""
    counts = np.zeros((n_groups, presence.shape[1]), dtype=np.int64)
    np.add.at(counts, group, presence.astype(np.int64))
    return (counts > 0).sum(axis=0)


def repair_video_groups(
    presence: np.ndarray, group: np.ndarray, seed: int = 0, max_swaps: int | None = None
) -> np.ndarray:
    """Swap videos between groups so that each label reaches ``min(videos with it, groups)`` groups.

    A swap exchanges a video carrying a label from a group holding several such videos with a video not
    carrying it from a group lacking the label; it is made only when no label loses a group. Group sizes are
    unchanged.

    Args:
        presence: bool (V, L) labels of each video.
        group: int (V,) group of each video (from :func:`assign_video_groups`).
        seed: seed of the order in which candidate videos are tried.
        max_swaps: stop after this many swaps (default: 4 x number of labels).

    Returns:
        The repaired group array (a copy).
    """
    presence = np.asarray(presence, dtype=bool)
    group = np.asarray(group, dtype=np.int64).copy()
    n_groups = int(group.max()) + 1 if group.size else 0
    target = np.minimum(presence.sum(axis=0), n_groups)
    order = np.random.default_rng([seed, 1]).permutation(len(group))
    skipped: set[int] = set()
    for _ in range(max_swaps if max_swaps is not None else 4 * presence.shape[1]):
        reach = _reach(presence, group, n_groups)
        todo = [c for c in np.flatnonzero(reach < target) if c not in skipped]
        if not todo:
            break
        lab = int(todo[0])
        counts = np.bincount(group[presence[:, lab]], minlength=n_groups)
        done = False
        for g in np.flatnonzero(counts == 0):
            for a in (v for v in order if presence[v, lab] and counts[group[v]] >= 2):
                for b in (v for v in order if group[v] == g and not presence[v, lab]):
                    trial = group.copy()
                    trial[a], trial[b] = group[b], group[a]
                    if (_reach(presence, trial, n_groups) >= reach).all():
                        group, done = trial, True
                        break
                if done:
                    break
            if done:
                break
        if not done:  # no swap keeps every other label's reach: leave this label as it is
            skipped.add(lab)
    return group


def _subset(datalist: Sequence[dict], keep: set[str]) -> list[dict]:
    return [d for d in datalist if str(d["video_id"]) in keep]


def split_videos(
    datalist: Sequence[dict],
    val_fraction: float = 0.2,
    seed: int = 0,
    stratify_capsule: bool = True,
    held_out_capsule: str | None = None,
) -> tuple[list[dict], list[dict]]:
    """Split a frame datalist into train and validation datalists by whole videos.

    Args:
        datalist: frame dicts with ``video_id`` (and ``label``, ``capsule`` when known).
        val_fraction: share of videos in validation; rounded, at least one video in each side when there
            are two or more videos.
        seed: split seed; the same seed and videos give the same split.
        stratify_capsule: also spread capsule systems over both sides (after the labels).
        held_out_capsule: leave one capsule system out: every video of this ``capsule`` is validation and
            every other video training (``val_fraction``, ``seed`` and ``stratify_capsule`` unused).

    Returns:
        ``(train, val)`` datalists, items in their original order.

    Raises:
        ValueError: a bad fraction, fewer than 2 videos, or a held-out capsule that no video (or every video) has.
    """
    if held_out_capsule not in (None, ""):
        caps = video_capsules(datalist)
        val_ids = {v for v, c in caps.items() if c == str(held_out_capsule)}
        if not val_ids or len(val_ids) == len(caps):
            known = sorted(set(caps.values()))
            what = "no video" if not val_ids else "every video"
            raise ValueError(
                f"held_out_capsule {held_out_capsule!r}: {what} of the datalist has it (capsules: {known}); "
                "leaving one capsule out needs videos of it and of another"
            )
        return _subset(datalist, set(caps) - val_ids), _subset(datalist, val_ids)
    if not 0.0 < val_fraction < 1.0:
        raise ValueError(f"val_fraction must be in (0, 1), got {val_fraction}")
    ids, presence = video_label_presence(datalist)
    if len(ids) < 2:
        raise ValueError(f"a train/validation split needs at least 2 videos, the datalist has {len(ids)}")
    n_val = min(max(round(val_fraction * len(ids)), 1), len(ids) - 1)
    secondary = _capsule_columns(datalist, ids) if stratify_capsule else None
    group = assign_video_groups(presence, [len(ids) - n_val, n_val], seed=seed, secondary=secondary)
    group = repair_video_groups(presence, group, seed=seed)
    val_ids = {ids[i] for i in np.flatnonzero(group == 1)}
    return _subset(datalist, set(ids) - val_ids), _subset(datalist, val_ids)


def subsample_frames(datalist: Sequence[Mapping[str, Any]], stride: int = 1) -> list[Mapping[str, Any]]:
    """Every ``stride``-th frame of each video: its 1st, ``stride + 1``-th, ... frame in frame order.

    The training datalist of a preset whose epoch is a pass over every n-th frame file (the authors' code:
    ``frame_files[::5]`` per video, sorted by frame number). Frames are ordered by ``frame_number`` (else
    ``frame_index``) within each video; the result keeps the datalist's item order.

    Args:
        datalist: frame dicts with ``video_id`` and ``frame_number`` or ``frame_index``.
        stride: keep one frame in ``stride``; 1 keeps the datalist as it is.

    Returns:
        The kept items (the same dicts).
    """
    if isinstance(stride, bool) or not isinstance(stride, (int, np.integer)) or stride < 1:
        raise ValueError(f"the frame stride must be a positive integer, got {stride!r}")
    if stride == 1:
        return list(datalist)
    keep = np.zeros(len(datalist), dtype=bool)
    for rows in video_rows(datalist).values():
        key = "frame_number" if all("frame_number" in datalist[i] for i in rows) else "frame_index"
        try:
            numbers = np.asarray([int(datalist[i][key]) for i in rows], dtype=np.int64)
        except KeyError:
            raise ValueError(
                f"video {datalist[int(rows[0])]['video_id']}: a frame has neither 'frame_number' nor 'frame_index'"
            ) from None
        keep[rows[np.argsort(numbers, kind="stable")[::stride]]] = True
    return [d for d, k in zip(datalist, keep, strict=True) if k]


def lazy_split_videos(datalist: Sequence[dict], **kwargs: Any) -> tuple[LazySequence, LazySequence]:
    """:func:`split_videos` computed on first use of either side (the bundle's ``split``), so that parsing a config
    reads no data.

    Args:
        datalist: frame dicts (a :class:`~monai_vce.utils.LazySequence` stays unread until a side is used).
        kwargs: :func:`split_videos`'s arguments.

    Returns:
        ``(train, val)``, two :class:`~monai_vce.utils.LazySequence` sharing one split.
    """
    both = LazySequence(split_videos, datalist, **kwargs)
    return LazySequence(operator.getitem, both, 0), LazySequence(operator.getitem, both, 1)


def kfold_videos(
    datalist: Sequence[dict],
    n_folds: int = 5,
    fold: int = 0,
    seed: int = 0,
    stratify_capsule: bool = True,
) -> tuple[list[dict], list[dict]]:
    """Return the train and validation datalists of one fold of a video-level k-fold split.

    The videos are split into ``n_folds`` groups of near-equal size (same seed -> same groups for every
    ``fold``), each label spread over as many folds as it has videos; fold ``fold`` is the validation side.

    Args:
        datalist: frame dicts with ``video_id`` (and ``label``, ``capsule`` when known).
        n_folds: number of folds, 2 to the number of videos.
        fold: the validation fold, ``0 <= fold < n_folds``.
        seed: split seed.
        stratify_capsule: also spread capsule systems over the folds (after the labels).

    Returns:
        ``(train, val)`` datalists, items in their original order.
    """
    ids, presence = video_label_presence(datalist)
    if not 2 <= n_folds <= len(ids):
        raise ValueError(f"n_folds must be between 2 and the number of videos ({len(ids)}), got {n_folds}")
    if not 0 <= fold < n_folds:
        raise ValueError(f"fold must be in [0, {n_folds}), got {fold}")
    sizes = [len(ids) // n_folds + (1 if k < len(ids) % n_folds else 0) for k in range(n_folds)]
    secondary = _capsule_columns(datalist, ids) if stratify_capsule else None
    group = assign_video_groups(presence, sizes, seed=seed, secondary=secondary)
    group = repair_video_groups(presence, group, seed=seed)
    val_ids = {ids[i] for i in np.flatnonzero(group == fold)}
    return _subset(datalist, set(ids) - val_ids), _subset(datalist, val_ids)
