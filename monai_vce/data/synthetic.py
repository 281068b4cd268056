"""A generated mini-Galar: real Galar label timelines, synthetic frames, in the Galar file layout.

``python -m monai_vce synthetic --out DIR ...``; the same arguments give byte-identical files.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import io
import logging
import os
import shutil
import sys
import tempfile
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from monai_vce.cli import command_main
from monai_vce.data.render import CAPSULES, DEVICES, FrameNuisances, capsule_device, iter_render_video
from monai_vce.data.video import require_av, write_video
from monai_vce.events.composition import events_to_frames
from monai_vce.events.ground_truth import ground_truth_events
from monai_vce.events.metadata import events_meta_path
from monai_vce.events.runs import value_runs
from monai_vce.events.units import FrameUnits
from monai_vce.events.validation import load_events, save_events
from monai_vce.labels import LABELS, NUM_LABELS, PATHOLOGY, SECTIONS
from monai_vce.utils import (
    OutputLock,
    atomic_write_json,
    atomic_write_text,
    natural_key,
    read_json_file,
    safe_text,
    short_repr,
)

__all__ = [
    "EVENTS_ENV",
    "EXTRA_COLUMNS",
    "find_galar_events",
    "load_timelines",
    "events_to_matrix",
    "resample_timeline",
    "select_source_videos",
    "builtin_timeline",
    "generate_mini_galar",
    "ensure_mini_galar",
    "main",
]

PathLike = str | os.PathLike
logger = logging.getLogger(__name__)

#: Environment variable naming the real ``galar_events.json`` when it is not at its default place.
EVENTS_ENV = "MONAI_VCE_GALAR_EVENTS"
#: Label columns written beyond the 17 (as the real CSVs carry more labels): frames showing bubbles/debris.
EXTRA_COLUMNS: tuple[str, ...] = ("bubbles", "dirt")
# column order of the written CSVs: not the LABELS order, with the extra labels in between, so readers
# must match columns by name
_CSV_LABELS: tuple[str, ...] = (
    *SECTIONS,
    "z-line",
    "pylorus",
    "ileocecal valve",
    "bubbles",
    "dirt",
    *sorted(PATHOLOGY, reverse=True),
)
#: The generator's record of the files it wrote in its output folder: a rerun replaces only those.
MANIFEST = ".monai_vce_manifest.json"
_WRITER = "monai_vce.data.synthetic"
#: Video file formats the generator can write (``video_format``).
_VIDEO_FORMATS: tuple[str, ...] = ("mp4", "avi", "mkv", "webm")
_N_SEC = len(SECTIONS)


def find_galar_events(path: str | os.PathLike | None = None) -> Path | None:
    """Locate the real Galar ground truth ``galar_events.json``.

    Args:
        path: an explicit file; else the ``MONAI_VCE_GALAR_EVENTS`` environment variable; else
            ``shared/data/galar_events.json`` beside the source checkout (``<checkout>/../shared/data``), then
            under the current folder's parent.

    Returns:
        The file, or ``None`` when not found (an explicit ``path`` that does not exist raises).
    """
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise FileNotFoundError(f"Galar events file not found: {p}")
        return p
    env = os.environ.get(EVENTS_ENV)
    if env:
        p = Path(env)
        if not p.is_file():
            raise FileNotFoundError(f"{EVENTS_ENV}={env} does not name a file")
        return p
    candidates = [
        Path(__file__).resolve().parents[3] / "shared" / "data" / "galar_events.json",
        Path.cwd().parent / "shared" / "data" / "galar_events.json",
    ]
    return next((c for c in candidates if c.is_file()), None)


#: Longest source timeline read (frames): it is expanded to a dense (frames x 17) matrix before resampling.
_MAX_TIMELINE_FRAMES = 10_000_000


def load_timelines(path: str | os.PathLike) -> dict[str, list[dict]]:
    """Read an event JSON (challenge format) into ``{video_id: events}`` in natural video order."""
    # bounded size, and one-line errors naming the file for missing, non-JSON, hostile (deeply nested) or invalid
    # files
    obj = load_events(path)
    videos = {str(v["video_id"]): list(v["events"]) for v in obj["videos"]}
    for vid, events in videos.items():
        last = max((int(e["end"]) for e in events), default=0)
        if last >= _MAX_TIMELINE_FRAMES:  # a timeline becomes a dense (frames x 17) matrix
            raise ValueError(
                f"{path}: video {vid!r} has an event ending at frame {last}, beyond the {_MAX_TIMELINE_FRAMES:,} "
                "frames a timeline may span (Galar's longest video has about 130,000)"
            )
    return dict(sorted(videos.items(), key=lambda kv: natural_key(kv[0])))


def events_to_matrix(events: Sequence[dict], n_frames: int | None = None) -> np.ndarray:
    """Dense bool (T, 17) label matrix of an event list (``start``/``end`` inclusive, T = last end + 1)."""
    t = int(n_frames if n_frames is not None else max((e["end"] for e in events), default=-1) + 1)
    return events_to_frames(events, np.arange(t))


def _allocate(lengths: np.ndarray, minimum: np.ndarray, total: int) -> np.ndarray:
    """Integer bins per run: proportional to ``lengths``, at least ``minimum``, summing to ``total``."""
    target = lengths * total / lengths.sum()
    n = np.maximum(np.floor(target).astype(np.int64), minimum)
    while n.sum() < total:  # largest remainders first
        n[np.argmax(target - n)] += 1
    while n.sum() > total:  # take from the runs most above their share
        slack = np.where(n > minimum, n - target, -np.inf)
        n[np.argmax(slack)] -= 1
    return n


def resample_timeline(matrix: np.ndarray, n_frames: int, min_event_frames: int = 2) -> np.ndarray:
    """Resample a real label timeline (T, 17) to ``n_frames`` frames, keeping short events.

    Sections are resampled as a sequence of runs: each run gets a share of the frames proportional to its
    length, the longest run of every section present gets at least ``min_event_frames`` frames (so a
    20-frame mouth survives in a 30,000-frame video), and the runs keep their real order. This defines a
    piecewise-linear map from output frames to real frame intervals; every other label is on in an output
    frame when it covers at least half of that frame's real interval. An event of a landmark or pathology
    that would vanish this way is kept as ``min_event_frames`` frames at its mapped position, longest
    events first, up to about twice the label's real share of the video (at least two such events).

    Args:
        matrix: bool (T, 17) real label timeline.
        n_frames: output length M.
        min_event_frames: shortest length kept for short sections and events.

    Returns:
        bool (M, 17).
    """
    real = np.asarray(matrix, dtype=bool)
    t, m = real.shape[0], int(n_frames)
    if m < 1 or t < 1:
        raise ValueError(f"cannot resample a timeline of {t} frames to {m} frames")
    k = max(1, int(min_event_frames))
    if m >= t:  # upsampling: nearest real frame
        return real[np.minimum(((np.arange(m) + 0.5) * t / m).astype(np.int64), t - 1)].copy()

    # section of each real frame (first section when several, -1 when none)
    has_sec = real[:, :_N_SEC].any(axis=1)
    sec = np.where(has_sec, real[:, :_N_SEC].argmax(axis=1), -1)
    starts, stops, values = value_runs(sec)
    lengths = stops - starts
    minimum = np.zeros(len(starts), dtype=np.int64)
    for v in np.unique(values[values >= 0]):
        idx = np.flatnonzero(values == v)
        minimum[idx[np.argmax(lengths[idx])]] = k
    if minimum.sum() > m:  # too few frames for every section: keep the longest ones
        keep = np.argsort(-lengths * (minimum > 0), kind="stable")[: m // k]
        minimum[:] = 0
        minimum[keep] = k
    bins = _allocate(lengths.astype(np.float64), minimum, m)

    # real interval [lo, hi) of every output frame
    run_of_bin = np.repeat(np.arange(len(starts)), bins)
    pos_in_run = np.arange(m) - np.repeat(np.cumsum(bins) - bins, bins)
    scale = lengths[run_of_bin] / bins[run_of_bin]
    lo = starts[run_of_bin] + pos_in_run * scale
    hi = lo + scale
    out = np.zeros((m, NUM_LABELS), dtype=bool)
    sec_out = values[run_of_bin]
    out[np.flatnonzero(sec_out >= 0), sec_out[sec_out >= 0]] = True

    # other labels: majority of the real interval
    cs = np.vstack([np.zeros((1, NUM_LABELS), np.int64), np.cumsum(real, axis=0)])
    ilo = np.clip(np.floor(lo).astype(np.int64), 0, t - 1)
    ihi = np.clip(np.maximum(np.ceil(hi).astype(np.int64), ilo + 1), 1, t)
    cover = (cs[ihi] - cs[ilo]) / (ihi - ilo)[:, None]
    out[:, _N_SEC:] = cover[:, _N_SEC:] >= 0.5

    # output position of a real frame boundary x: monotone interpolation through the bin intervals
    xs = np.stack([lo, hi], axis=1).ravel()
    ys = np.stack([np.arange(m), np.arange(1, m + 1)], axis=1).ravel().astype(np.float64)
    for c in range(_N_SEC, NUM_LABELS):
        col = real[:, c]
        if not col.any():
            continue
        s, stop, val = value_runs(col.astype(np.int8))
        ln = stop - s
        s, ln = s[val == 1], ln[val == 1]
        p0 = np.interp(s, xs, ys)
        p1 = np.interp(s + ln, xs, ys)
        a = np.clip(np.floor(p0).astype(np.int64), 0, m - 1)
        b = np.clip(np.ceil(p1).astype(np.int64), a + 1, m)
        on = np.concatenate([[0], np.cumsum(out[:, c])])
        lost = np.flatnonzero(on[b] - on[a] == 0)
        if not lost.size:
            continue
        budget = max(2 * k, int(np.ceil(2 * col.mean() * m)))
        for i in sorted(lost, key=lambda i: (-ln[i], s[i])):
            if budget <= 0:
                break
            centre = 0.5 * (p0[i] + p1[i])
            first = int(np.clip(np.round(centre - k / 2), 0, m - k))
            new = ~out[first : first + k, c]
            out[first : first + k, c] = True
            budget -= int(new.sum())
    return out


def select_source_videos(timelines: dict[str, list[dict]], n: int, seed: int) -> list[str]:
    """Choose ``n`` real videos in a seed-dependent order, each adding a pathology not yet covered if any can.

    Args:
        timelines: ``{video_id: events}``.
        n: number of videos wanted; when larger than the number available, videos are reused.
        seed: selection seed.

    Returns:
        Source video ids, in the order they were chosen.
    """
    ids = list(timelines)
    if not ids:
        raise ValueError("no video timeline to choose from")
    rng = np.random.default_rng([seed, 7])
    path_set = set(PATHOLOGY)
    has = {v: {lab for e in timelines[v] for lab in e["label"]} & path_set for v in ids}
    chosen: list[str] = []
    covered: set[str] = set()
    while len(chosen) < n:
        order = [ids[i] for i in rng.permutation(len(ids))]
        pool = [v for v in order if v not in chosen] or order  # more videos wanted than exist: reuse
        if covered >= set().union(*(has[v] for v in pool)):
            covered = set()  # everything reachable is covered: start a new round
        # the first video in the random order that adds a pathology not covered yet
        best = next((v for v in pool if has[v] - covered), pool[0])
        chosen.append(best)
        covered |= has[best]
    return chosen


def builtin_timeline(n_frames: int, rng: np.random.Generator, min_event_frames: int = 2) -> np.ndarray:
    """A simple timeline when the real annotations are unavailable.

    Sections in gut order with random shares (mouth and esophagus about 1% each, stomach about 10%, small
    intestine about half, colon the rest), a landmark of ``min_event_frames`` frames at each section
    boundary, and 2-4 pathology events of 2 to ~4% of the video each, of random pathology labels.

    Args:
        n_frames: length M.
        rng: random generator.
        min_event_frames: length of landmarks and shortest events.

    Returns:
        bool (M, 17).
    """
    m = int(n_frames)
    k = max(1, int(min_event_frames))
    share = rng.dirichlet([1, 1, 10, 50, 38]) * 0.5 + np.array([1, 1, 10, 50, 38]) / 200
    bins = _allocate(share * 1000.0, np.full(5, min(k, max(1, m // 5))), m)
    out = np.zeros((m, NUM_LABELS), dtype=bool)
    edges = np.concatenate([[0], np.cumsum(bins)])
    for i in range(5):
        out[edges[i] : edges[i + 1], i] = True
    for j, name in enumerate(("z-line", "pylorus", "ileocecal valve")):
        b = int(edges[j + 2])
        out[max(0, b - k // 2) : min(m, b - k // 2 + k), LABELS.index(name)] = True
    for _ in range(int(rng.integers(2, 5))):
        c = LABELS.index(PATHOLOGY[int(rng.integers(len(PATHOLOGY)))])
        length = max(k, int(m * rng.uniform(0.02, 0.04)))
        s = int(rng.integers(edges[2], max(edges[2] + 1, m - length)))
        out[s : s + length, c] = True
    return out


def _leftover(rel: str, owned: set[str]) -> bool:
    """Whether ``rel`` is the temporary file of an owned file left by a killed write (``.<name>.*.tmp|partial``)."""
    head, _, name = rel.rpartition("/")
    if not name.startswith(".") or not (name.endswith(".tmp") or ".partial." in name):
        return False
    stem = name[1:]
    return any(f"{head}/{stem[:i]}".lstrip("/") in owned for i in range(1, len(stem)) if stem[i] == ".")


def _read_manifest(out: Path) -> set[str] | None:
    """The files the generator recorded in ``out`` (relative paths), or ``None`` when it has no manifest."""
    path = out / MANIFEST
    if not os.path.lexists(path):
        return None
    obj = read_json_file(path, max_bytes=512 * 1024**2, what="generator manifest")
    files = obj.get("files") if isinstance(obj, dict) else None
    if not (isinstance(obj, dict) and obj.get("writer") == _WRITER and isinstance(files, list)):
        raise ValueError(f"{path} is not a manifest of {_WRITER}; choose an empty or new folder")
    for rel in files:
        parts = rel.split("/") if isinstance(rel, str) else [".."]
        if rel.startswith("/") or any(p in ("", ".", "..") for p in parts) or "\\" in rel:
            raise ValueError(f"{path} lists {short_repr(rel)}, not a path inside {out}; choose an empty or new folder")
    return set(files)


def _owned_files(out: Path) -> set[str]:
    """Check that ``out`` holds only what the generator wrote there and return those files (relative paths).

    What it wrote is what its manifest lists. The output lock, the manifest and the temporary files of a killed
    write of an owned file count as its own too.

    Raises:
        FileExistsError: one line naming the first file (or link, or anything else) it did not write.
    """
    manifest = _read_manifest(out)
    owned = manifest if manifest is not None else set()
    found: set[str] = set()
    for root, dirs, files in os.walk(out):
        top = Path(root).relative_to(out).as_posix()
        for name in sorted(files) + sorted(d for d in dirs if os.path.islink(os.path.join(root, d))):
            found.add(name if top == "." else f"{top}/{name}")
        dirs[:] = [d for d in dirs if not os.path.islink(os.path.join(root, d))]  # never walk into a link
    mine = {OutputLock.name, MANIFEST} | owned
    for rel in sorted(found, key=natural_key):
        if rel not in mine and not _leftover(rel, mine):
            how = (
                f"not in the manifest {MANIFEST} of an earlier generation"
                if manifest is not None
                else f"the folder is not empty and holds no manifest {MANIFEST}"
            )
            raise FileExistsError(
                f"output folder {safe_text(out)} holds {safe_text(rel)}, which the generator did not write ({how}); "
                "move it away or choose an empty or new folder"
            )
    return owned | {rel for rel in found if _leftover(rel, mine)}


def _prepare_out(out: Path) -> None:
    """Remove an earlier generation in ``out``, file by file, after checking that the folder holds nothing else."""
    if out.exists() and not out.is_dir():
        raise FileExistsError(f"output path {out} exists and is not a folder")
    out.mkdir(parents=True, exist_ok=True)
    owned = _owned_files(out)
    # a previous mini-Galar is replaced entirely so no stale frames or videos remain; ground_truth.json, which marks
    # a complete dataset, goes first; the manifest still lists every file until they are all gone
    folders: set[Path] = set()
    for rel in sorted(owned, key=lambda r: (r != "ground_truth.json", r)):
        path = out / rel
        path.unlink(missing_ok=True)  # a link is removed, never what it points to
        folders.update(p for p in path.parents if out in p.parents)
    for folder in sorted(folders, key=lambda p: -len(p.parts)):  # only folders that held its files, when empty
        with contextlib.suppress(OSError):
            folder.rmdir()
    (out / MANIFEST).unlink(missing_ok=True)


def _record(out: Path, files: list[str]) -> None:
    """Write the manifest: the files written (or about to be) by this generation, before they are written."""
    atomic_write_json(out / MANIFEST, {"writer": _WRITER, "files": sorted(files, key=natural_key)}, indent=None)


def _csv_text(index: np.ndarray, frame: np.ndarray, labels: np.ndarray, extras: dict[str, np.ndarray]) -> str:
    cols = {name: labels[:, i] for i, name in enumerate(LABELS)}
    cols.update(extras)
    table = np.column_stack([index] + [cols[name].astype(np.int64) for name in _CSV_LABELS] + [frame])
    body = "\n".join(",".join(map(str, row)) for row in table.tolist())
    return ",".join(("index", *_CSV_LABELS, "frame")) + "\n" + body + "\n"


def generate_mini_galar(
    out_dir: str | os.PathLike,
    videos: int = 8,
    frames_per_video: int = 300,
    size: int = 64,
    seed: int = 0,
    *,
    events_path: str | os.PathLike | None = None,
    use_real_timelines: bool = True,
    naming: str = "mixed",
    min_event_frames: int = 2,
    video_format: str | None = None,
    video_fps: int = 5,
    progress: bool = False,
    capsules: Sequence[str] | None = None,
) -> Path:
    """Generate a mini-Galar dataset in the Galar layout.

    Args:
        out_dir: output folder; created, or replaced when it holds a previous mini-Galar: only the files listed in
            its manifest ``.monai_vce_manifest.json`` are removed, and a folder holding any other file is refused
            with one line naming it.
        videos: number of videos N.
        frames_per_video: frames per video M (label rows = images = M).
        size: image side S in pixels (at least 8).
        seed: seed; the same arguments give byte-identical files.
        events_path: the real ``galar_events.json``; ``None`` looks for it (see :func:`find_galar_events`).
        use_real_timelines: ``False`` forces the built-in timeline generator.
        naming: ``"mixed"`` (default: the last of two or more videos uses the challenge test naming,
            ``ukdd_navi_<n>`` with 7-digit lower-case ``frame_XXXXXXX.png``; the others Galar's 6-digit
            ``frame_XXXXXX.PNG``), ``"galar"`` (all 6-digit) or ``"challenge"`` (all 7-digit).
        min_event_frames: shortest length of short sections and events after resampling.
        video_format: ``None`` (default) writes frame folders; ``"mp4"`` (H.264), ``"avi"`` (Motion-JPEG),
            ``"mkv"`` (H.264) or ``"webm"`` (VP9) writes each video as one file ``frames/<video_id>.<ext>``
            instead, as exams leave vendor software (needs PyAV, ``pip install "monai-vce[video]"``; ``size`` must
            be even). A video file's frame numbers are its decoded positions, so the labels' ``frame`` column
            equals ``index`` in every video.
        video_fps: frame rate stored in the video files.
        progress: draw a progress bar over the videos (on a terminal only).
        capsules: capsule systems (names in :data:`~monai_vce.data.render.DEVICES`); video ``v`` is rendered
            with the full appearance of ``capsules[v % len(capsules)]`` (resolution, colour response, vignetting,
            field of view, noise, compression, overlay; see :class:`~monai_vce.data.render.CapsuleDevice`) and
            ``metadata.csv`` gains an ``fps`` column (the system's frame rate). ``["NaviCam"]`` writes a set of the
            unseen test-set system. ``None`` (default): a random system of
            :data:`~monai_vce.data.render.CAPSULES` per video with a colour cast and field of view only. The
            labels, timelines and nuisances of a video do not depend on ``capsules``.

    Returns:
        ``out_dir`` as a :class:`~pathlib.Path`.

    Raises:
        ValueError: invalid arguments, e.g. an unknown capsule system (the message names it and the known ones).
    """
    if videos < 1 or frames_per_video < 1:
        raise ValueError(f"videos and frames_per_video must be positive, got {videos} and {frames_per_video}")
    if videos > 10_000 or frames_per_video > 1_000_000 or size > 1024:
        raise ValueError(
            f"at most 10,000 videos of 1,000,000 frames of 1024 pixels are generated, got {videos} videos of "
            f"{frames_per_video} frames of {size} pixels (a mini-Galar is small; a typo?)"
        )
    if naming not in ("mixed", "galar", "challenge"):
        raise ValueError(f"naming must be 'mixed', 'galar' or 'challenge', got {naming!r}")
    if size < 8:
        raise ValueError(f"size must be at least 8 pixels, got {size}")
    if video_format is not None:
        video_format = video_format.lower().lstrip(".")
        if video_format not in _VIDEO_FORMATS:
            raise ValueError(f"video_format must be one of {', '.join(_VIDEO_FORMATS)} or None, got {video_format!r}")
        if size % 2:
            raise ValueError(f"video files need an even frame size, got {size}")

        require_av()
    if capsules is not None:
        if isinstance(capsules, str):
            capsules = [capsules]
        if not capsules:
            raise ValueError(f"capsules must name at least one capsule system; known: {', '.join(DEVICES)}")
        devices = [capsule_device(name) for name in capsules]
    from PIL import Image

    out = Path(out_dir)
    timelines: dict[str, list[dict]] = {}
    if use_real_timelines:
        found = find_galar_events(events_path)
        if found is None:
            warnings.warn(
                "galar_events.json not found (pass its path: --events on the command line, events_path in Python; "
                "or set MONAI_VCE_GALAR_EVENTS); "
                "using the built-in timeline generator instead of real Galar timelines",
                stacklevel=2,
            )
        else:
            timelines = load_timelines(found)
    sources = select_source_videos(timelines, videos, seed) if timelines else ["builtin"] * videos
    capsule_names = list(CAPSULES)
    if out.exists() and not out.is_dir():
        raise FileExistsError(f"output path {out} exists and is not a folder")
    # the lock first: a second generation into a folder in use is refused before anything there is touched
    with OutputLock(out):
        _prepare_out(out)
        written: list[str] = []  # every file is in the manifest before it is written
        _record(out, written)
        gt_videos, meta_rows = [], []
        bar = tqdm(
            total=videos,
            desc=f"generating {out.name.lstrip('.').split('.')[0]}",
            unit="video",
            disable=not (progress and sys.stderr.isatty()),
            dynamic_ncols=True,
        )
        for v in range(videos):
            bar.update(0 if v == 0 else 1)
            rng = np.random.default_rng([seed, v])
            challenge = naming == "challenge" or (naming == "mixed" and videos >= 2 and v == videos - 1)
            vid = f"ukdd_navi_{v + 1:05d}" if challenge else str(v + 1)
            if timelines:
                labels = resample_timeline(events_to_matrix(timelines[sources[v]]), frames_per_video, min_event_frames)
            else:
                labels = builtin_timeline(frames_per_video, rng, min_event_frames)
            capsule = capsule_names[int(rng.integers(len(capsule_names)))]  # drawn always: same rng stream
            device = None if capsules is None else devices[v % len(devices)]
            index = np.arange(frames_per_video, dtype=np.int64)
            if video_format is not None:  # frames of a video file are numbered by decoded position
                frame = index.copy()
                rule = "frame = decoded position in the video file"
            elif v % 2 == 1:
                offset = int(rng.integers(0, 5))
                frame = 5 * index + offset
                rule = f"frame = 5 * index + {offset}"
            else:
                frame = index.copy()
                rule = "frame = index"
            name = "frame_{:07d}.png" if challenge else "frame_{:06d}.PNG"
            if video_format is not None:
                written.append(f"frames/{vid}.{video_format}")
            else:
                written.extend(f"frames/{vid}/{name.format(int(f))}" for f in frame)
            written.append(f"labels/{vid}.csv")
            _record(out, written)
            nuisances = FrameNuisances(frames_per_video, rng)
            if device is None:
                chunks = iter_render_video(labels, size, rng, capsule, nuisances)
            else:
                capsule = device.name
                chunks = iter_render_video(labels, size, rng, None, nuisances, device=device)
            if video_format is not None:
                (out / "frames").mkdir(parents=True, exist_ok=True)
                write_video(out / "frames" / f"{vid}.{video_format}", (images for _, images in chunks), fps=video_fps)
            else:
                folder = out / "frames" / vid
                folder.mkdir(parents=True, exist_ok=True)
                for start, images in chunks:
                    for j, im in enumerate(images):
                        buf = io.BytesIO()
                        Image.fromarray(im).save(buf, format="PNG", compress_level=1)
                        # plain writes: frames are many and small; ground_truth.json, written last, marks completion
                        (folder / name.format(int(frame[start + j]))).write_bytes(buf.getvalue())
            extras = {"bubbles": nuisances.bubbles, "dirt": nuisances.dirt}
            atomic_write_text(out / "labels" / f"{vid}.csv", _csv_text(index, frame, labels, extras))
            gt_videos.append({"video_id": vid, "events": ground_truth_events(index, labels, video_id=vid)})
            meta_rows.append([vid, capsule, sources[v], rule] + ([] if device is None else [f"{device.fps:g}"]))
        bar.update(1)
        bar.close()
        # csv quoting: a source video id of the events file may hold a comma or a line break
        meta = io.StringIO()
        csv.writer(meta, lineterminator="\n").writerows(
            [["video_id", "capsule", "source_video", "frame_rule", *([] if capsules is None else ["fps"])], *meta_rows]
        )
        written += ["metadata.csv", "ground_truth.json", events_meta_path("ground_truth.json").name]
        _record(out, written)
        atomic_write_text(out / "metadata.csv", meta.getvalue())
        save_events(out / "ground_truth.json", {"videos": gt_videos}, frame_units=FrameUnits.FRAME_INDEX)
    return out


def ensure_mini_galar(
    out_dir: PathLike, videos: int = 8, frames_per_video: int = 120, size: int = 64, seed: int = 0, **kwargs: Any
) -> str:
    """Generate a mini-Galar dataset into ``out_dir`` unless a complete one is already there.

    The data is generated into a temporary sibling folder and renamed into place, so an interrupted
    generation never leaves a half-made dataset behind; ``out_dir/ground_truth.json`` marks a complete one.
    ``kwargs`` go to :func:`monai_vce.data.synthetic.generate_mini_galar` (e.g. ``use_real_timelines``, or
    ``capsules`` for per-system appearance; its ``progress`` bar is on by default here, drawn on a terminal only).

    Returns:
        ``out_dir`` as a string.
    """
    kwargs.setdefault("progress", True)
    out = Path(out_dir)
    if (out / "ground_truth.json").is_file():
        return str(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.is_dir():
        _owned_files(out)  # an incomplete earlier generation is replaced; a folder of other files is refused now
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        generate_mini_galar(tmp, videos=videos, frames_per_video=frames_per_video, size=size, seed=seed, **kwargs)
        if out.is_dir():
            with OutputLock(out):
                _prepare_out(out)  # only what an earlier generation wrote, checked again
            out.rmdir()
        os.replace(tmp, out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    logger.info(f"generated mini-Galar ({videos} videos x {frames_per_video} frames, {size} px): {out}")
    return str(out)


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``synthetic`` command to ``subparsers``; returns its parser."""
    p = subparsers.add_parser(
        "synthetic",
        description="Generate a mini-Galar (real Galar label timelines, synthetic frames) in the Galar layout: "
        "OUT/frames/, OUT/labels/, OUT/metadata.csv and OUT/ground_truth.json; the same arguments give "
        "byte-identical files.",
    )
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--num-videos", type=int, default=8, help="number of videos (default 8)")
    p.add_argument("--frames-per-video", type=int, default=300, help="frames per video (default 300)")
    p.add_argument("--size", type=int, default=64, help="image side in pixels (default 64)")
    p.add_argument("--seed", type=int, default=0, help="seed (default 0)")
    p.add_argument(
        "--galar-events",
        default=None,
        help="the real Galar ground truth galar_events.json (default: found automatically)",
    )
    p.add_argument("--builtin-timelines", action="store_true", help="do not use real Galar timelines")
    p.add_argument("--naming", default="mixed", choices=("mixed", "galar", "challenge"), help="frame file naming")
    p.add_argument("--min-event-frames", type=int, default=2, help="shortest kept event length (default 2)")
    p.add_argument(
        "--video-format",
        default=None,
        choices=_VIDEO_FORMATS,
        help="write each video as one video file frames/<video_id>.<format> instead of a frame folder",
    )
    p.add_argument("--video-fps", type=int, default=5, help="frame rate of the video files (default 5)")
    p.add_argument(
        "--capsules",
        default=None,
        help="comma-separated capsule systems rendered round robin over the videos with their full appearance, "
        f"e.g. 'PillCam SB3,Olympus' or 'NaviCam' (the unseen test-set system); known: {', '.join(DEVICES)}; "
        "default: a random Galar system per video with a colour cast only",
    )
    p.set_defaults(run=run)
    return p


def run(args: argparse.Namespace) -> int:
    """Generate the mini-Galar of ``args`` and print where its files are; returns the exit code 0."""
    out = generate_mini_galar(
        args.out,
        videos=args.num_videos,
        frames_per_video=args.frames_per_video,
        size=args.size,
        seed=args.seed,
        events_path=args.galar_events,
        use_real_timelines=not args.builtin_timelines,
        naming=args.naming,
        min_event_frames=args.min_event_frames,
        video_format=args.video_format,
        video_fps=args.video_fps,
        capsules=None if args.capsules is None else [c.strip() for c in args.capsules.split(",") if c.strip()],
    )
    out = out.resolve()
    meta = list(csv.reader((out / "metadata.csv").read_text().splitlines()))[1:]
    sources = sorted({row[2] for row in meta}, key=natural_key)
    print(f"mini-Galar: {args.num_videos} videos x {args.frames_per_video} frames of {args.size} px (seed {args.seed})")
    print(f"timelines: {'built-in generator' if sources == ['builtin'] else 'real Galar videos ' + ', '.join(sources)}")
    if args.capsules is not None:
        print(f"capsules: {', '.join(sorted({row[1] for row in meta}))} (full per-system appearance)")
    print(f"frames:       {out / 'frames'}")
    print(f"labels:       {out / 'labels'}")
    print(f"metadata:     {out / 'metadata.csv'}")
    print(f"ground truth: {out / 'ground_truth.json'}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m monai_vce.data.synthetic``, the same as ``python -m monai_vce synthetic``; returns the exit code."""
    return command_main(add_parser, argv, "python -m monai_vce.data.synthetic")


if __name__ == "__main__":
    sys.exit(main())
