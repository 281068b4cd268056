"""The reader's review site: a static, self-contained set of pages to review, correct and export the events.

Opens from disk, loads nothing from the network; a rerun replaces only the files of its manifest.
"""

from __future__ import annotations

import hashlib
import html
import json
import os
import re
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote

import numpy as np

from monai_vce.data.video import video_source
from monai_vce.events.metadata import events_in_common_units
from monai_vce.events.probabilities import Video, check_video_ids, probability_file, video_file_name
from monai_vce.events.units import FrameUnits
from monai_vce.labels import ANATOMY, LABELS, PATHOLOGY, SECTIONS
from monai_vce.metrics import check_events, load_events
from monai_vce.review.exams import ExamFrames, event_rows, frames_by_video, has_probs, load_exam, peak_row
from monai_vce.review.manifest import SiteManifest
from monai_vce.review.thumbnails import ImageJob, render_jobs
from monai_vce.utils import OutputLock, atomic_write_text, safe_text

__all__ = [
    "SITE_FORMAT_VERSION",
    "SECTION_COLORS",
    "exam_file_name",
    "js_data",
    "exam_data",
    "write_review_site",
]

#: Version of the data the pages read; stored in each exam's data and in the browser's saved review state.
SITE_FORMAT_VERSION = 1
#: One colour per anatomical section (the section band), as in the report's timelines.
SECTION_COLORS: dict[str, str] = {
    "mouth": "#c77cb0",
    "esophagus": "#8e6bbf",
    "stomach": "#e9c046",
    "small intestine": "#6aab6a",
    "colon": "#8a6246",
}
PathLike = str | os.PathLike
_ASSETS = Path(__file__).resolve().parent / "assets"


def exam_file_name(video_id: str) -> str:
    """The file name (without suffix) of an exam's page and folder: the video's file name
    (:func:`monai_vce.events.video_file_name`), portable and distinct for distinct ids."""
    return video_file_name(video_id, "")


def js_data(name: str, obj: Any) -> str:
    """A script assigning ``obj`` to ``window[name]``: JSON with ``<``, ``>`` and ``&`` escaped, so that no
    string in the data can close the script or start markup, whatever the page does with the file."""
    text = json.dumps(obj, ensure_ascii=True, separators=(",", ":"), allow_nan=False)
    text = text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    return f"window[{json.dumps(name)}] = {text};\n"


def _b64(arr: np.ndarray) -> str:
    import base64

    return base64.b64encode(np.ascontiguousarray(arr).tobytes()).decode("ascii")


def _int_array(a: np.ndarray) -> dict[str, Any]:
    """An int array as ``{"start", "step", "n"}`` when it is arithmetic, else base64 of little-endian int32."""
    a = np.asarray(a, dtype=np.int64)
    if len(a) <= 1 or (np.diff(a) == a[1] - a[0]).all():
        return {"start": int(a[0]) if len(a) else 0, "step": int(a[1] - a[0]) if len(a) > 1 else 1, "n": len(a)}
    if a.min() < -(2**31) or a.max() >= 2**31:
        raise ValueError("frame ids beyond the 32-bit range cannot be shown")
    return {"b64": _b64(a.astype("<i4")), "n": len(a)}


def _frame_pattern(names: Sequence[str]) -> dict[str, Any] | None:
    """``{"prefix", "width", "suffix", "numbers"}`` when every name is prefix + zero-padded number + suffix."""
    if not names:
        return None
    m = re.match(r"^(.*?)(\d+)(\.[^.]*)$", names[0])
    if not m:
        return None
    prefix, digits, suffix = m.groups()
    width = len(digits)
    pat = re.compile(rf"^{re.escape(prefix)}(\d{{{width}}})({re.escape(suffix)})$")
    numbers = []
    for n in names:
        mm = pat.match(n)
        if not mm:
            return None
        numbers.append(int(mm.group(1)))
    return {"prefix": prefix, "width": width, "suffix": suffix, "numbers": np.asarray(numbers, np.int64)}


def _url(path: Path, start: Path) -> str:
    """A relative URL from folder ``start`` to ``path`` (each segment percent-encoded), or a ``file:`` URL."""
    try:
        rel = os.path.relpath(path, start)
    except ValueError:  # another drive
        return path.resolve().as_uri()
    return "/".join(quote(part) for part in Path(rel).parts) if rel != "." else "."


def _event_entries(ids: np.ndarray, probs: np.ndarray, events: Sequence[Mapping[str, Any]], thumbs: int) -> list[dict]:
    """Each event with its first and last row (``s``, ``e``); the first ``thumbs`` also with their thumbnail rows."""
    first, last = event_rows(ids, events)
    out = []
    for k, e in enumerate(events):
        s, t = int(first[k]), int(last[k])
        labels = [n for n in LABELS if n in {str(x).strip().lower() for x in e["label"]}]
        entry: dict[str, Any] = {"start": int(e["start"]), "end": int(e["end"]), "label": labels, "s": s, "e": t}
        if isinstance(e.get("score"), (int, float)):
            entry["score"] = float(e["score"])  # the screening events' rank, shown on each card
        if k < thumbs and t >= s:
            p = peak_row(probs, s, t, labels)
            between = np.linspace(s, t, 6)[1:-1].round().astype(np.int64).tolist() if t - s > 1 else []
            rows = sorted({s, t, p, *between})
            entry["peak"] = p
            entry["thumbs"] = rows
        out.append(entry)
    return out


def _full_rows(t: int, entries: Sequence[Mapping[str, Any]], budget: int, margin: int = 6) -> np.ndarray:
    """Rows (of ``t``) stored at full size for an exam stored as a video file: around each event's ends, its peak
    and evenly inside it, events in confidence order, until ``budget`` rows."""
    chosen: list[int] = []
    seen: set[int] = set()
    for e in entries:
        if "thumbs" not in e:
            break
        s, f = e["s"], e["e"]
        rows = list(range(max(0, s - margin), min(t, s + margin + 1)))
        rows += list(range(max(0, f - margin), min(t, f + margin + 1)))
        rows += list(range(max(0, e["peak"] - 2), min(t, e["peak"] + 3)))
        rows += np.linspace(s, f, min(f - s + 1, 24)).round().astype(np.int64).tolist()
        for r in rows:
            if r not in seen:
                if len(chosen) >= budget:
                    return np.asarray(sorted(chosen), np.int64)
                seen.add(r)
                chosen.append(r)
    return np.asarray(sorted(chosen), np.int64)


def _source_digest(frames: ExamFrames, frame_number: np.ndarray, params: Mapping[str, Any]) -> str:
    h = hashlib.sha256()
    if frames.video is not None:
        h.update(json.dumps(video_source(frames.video), sort_keys=True).encode())
    else:
        assert frames.images is not None
        for p in frames.images:
            h.update(p.encode("utf-8", "surrogateescape") + b"\n")
    h.update(frame_number.tobytes())
    h.update(json.dumps(dict(params), sort_keys=True).encode())
    return h.hexdigest()


def _state_key(video_id: str, units: str, events: Sequence[Mapping[str, Any]], ids: np.ndarray) -> str:
    """Identifies the review state of an exam in the browser: the same predictions on the same frames keep it."""
    h = hashlib.sha256()
    h.update(json.dumps([video_id, units, list(events)], sort_keys=True, default=str).encode())
    h.update(ids.tobytes())
    return h.hexdigest()[:16]


def exam_data(
    video: Video,
    frames: ExamFrames,
    events: Sequence[Mapping[str, Any]],
    page_dir: Path,
    strip_frames: int = 1500,
    max_event_thumbnails: int = 1000,
    max_full_frames: int = 3000,
    thumb_size: int = 128,
) -> tuple[dict[str, Any], ImageJob, dict[str, Any]]:
    """The data of one exam page, the images it needs and its index entry.

    Args:
        video: the exam's rows (:func:`~monai_vce.review.exams.load_exam`), its ``events`` the ground truth, its
            ``units`` the frame units of both event lists (the site's frame ids; ``None``: ``frame_index``).
        frames: where the rows' frames are.
        events: the predicted events (confidence order).
        page_dir: the folder of the exam's page (relative links to the frames start there).
        strip_frames: timeline thumbnails (sampled evenly).
        max_event_thumbnails: events (in confidence order) that get their own thumbnails.
        max_full_frames: full-size frames stored for an exam stored as a video file.
        thumb_size: thumbnail size.

    Returns:
        ``(data, image job, index entry)``.
    """
    units = (video.units or FrameUnits.FRAME_INDEX).value
    ids = video.frame_ids()
    t = len(video)
    name = exam_file_name(video.video_id)
    pred = [dict(e) for e in events]
    entries = _event_entries(ids, video.probs, pred, max_event_thumbnails)
    gt = _event_entries(ids, video.probs, video.events, 0) if video.events is not None else None
    strip = np.unique(np.linspace(0, t - 1, min(t, strip_frames)).round().astype(np.int64)) if t else np.zeros(0, int)
    event_thumbs = [r for e in entries for r in e.get("thumbs", [])]
    thumb_rows = np.union1d(strip, np.asarray(event_thumbs, np.int64))
    full_rows = _full_rows(t, entries, max_full_frames) if frames.video is not None else np.zeros(0, np.int64)
    if frames.video is not None:
        full_rows = np.union1d(full_rows, strip)  # the strip's frames are decoded anyway
        if len(full_rows) > max_full_frames + len(strip):
            full_rows = full_rows[: max_full_frames + len(strip)]
    where: dict[str, Any]
    if frames.video is not None:
        where = {"kind": "stored", "dir": f"{quote(name)}/frames", "rows": _b64(full_rows.astype("<i4"))}
    else:
        assert frames.images is not None
        folders = {os.path.dirname(p) for p in frames.images}
        pattern = _frame_pattern([os.path.basename(p) for p in frames.images]) if len(folders) == 1 else None
        if pattern is not None and (pattern["numbers"] == video.frame_number).all():
            where = {
                "kind": "files",
                "base": _url(Path(next(iter(folders))), page_dir),
                "prefix": pattern["prefix"],
                "width": pattern["width"],
                "suffix": pattern["suffix"],
            }
        else:
            where = {"kind": "files", "urls": [_url(Path(p), page_dir) for p in frames.images]}
    probs = None
    if has_probs(video):
        q = np.clip(np.round(video.probs * 255.0), 0, 255).astype(np.uint8)
        probs = _b64(np.ascontiguousarray(q.T))  # label-major: each lane's trace is one slice
    data = {
        "version": SITE_FORMAT_VERSION,
        "video_id": video.video_id,
        "name": name,
        "state_key": _state_key(video.video_id, units, pred, ids),
        "units": units,
        "frame_rate": frames.frame_rate,
        "duration_seconds": _duration(video, frames.frame_rate),
        "num_frames": t,
        "source": os.path.basename(frames.video) if frames.video is not None else None,
        "frame_index": _int_array(video.frame_index),
        "frame_number": _int_array(video.frame_number),
        "labels": list(LABELS),
        "anatomy": list(ANATOMY),
        "pathology": list(PATHOLOGY),
        "sections": list(SECTIONS),
        "section_colors": SECTION_COLORS,
        "probs": probs,
        "events": entries,
        "gt": gt,
        "thumbs": {"dir": f"{quote(name)}/thumbs", "rows": _b64(thumb_rows.astype("<i4")), "size": thumb_size},
        "frames": where,
    }
    job = ImageJob(
        images=frames.images,
        video=frames.video,
        thumb_rows=thumb_rows,
        full_rows=full_rows,
        thumb_dir=page_dir / name / "thumbs",
        full_dir=page_dir / name / "frames",
        num_frames=t,
    )
    found = {n for e in entries for n in e["label"]}
    entry = {
        "video_id": video.video_id,
        "page": f"exams/{quote(name)}.html",
        "state_key": data["state_key"],
        "num_frames": t,
        "frame_rate": frames.frame_rate,
        "duration_seconds": data["duration_seconds"],
        "units": units,
        "labels": [n for n in LABELS if n in found],
        "gt_events": None if gt is None else len(gt),
        "events": [{"start": e["start"], "end": e["end"], "label": e["label"]} for e in entries],
    }
    return data, job, entry


def _duration(video: Video, frame_rate: float | None) -> float | None:
    """Seconds an exam spans (first to last frame number), ``None`` without a frame rate or frames."""
    if not frame_rate or not len(video):
        return None
    return round(float(video.frame_number[-1] - video.frame_number[0] + 1) / frame_rate, 3)


_EXAM_PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title}</title>
<link rel="icon" href="data:,">
<link rel="stylesheet" href="../assets/review.css">
</head>
<body class="exam-page">
<noscript>This review page needs JavaScript.</noscript>
<script src="{name}/data.js"></script>
<script src="../assets/review.js"></script>
</body>
</html>
"""

_INDEX_PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>VCE review: {count} exams</title>
<link rel="icon" href="data:,">
<link rel="stylesheet" href="assets/review.css">
</head>
<body class="index-page">
<noscript>This review page needs JavaScript.</noscript>
<script src="index.js"></script>
<script src="assets/review.js"></script>
</body>
</html>
"""


def _load_events_arg(obj: Any, role: str) -> tuple[dict[str, Any], str]:

    if isinstance(obj, Mapping):
        return check_events(obj, source=role, strict=False), role
    return load_events(Path(obj)), str(obj)


def write_review_site(
    pred: PathLike | Mapping[str, Any],
    frames: PathLike | Sequence[Mapping[str, Any]],
    out_dir: PathLike,
    probs_dir: PathLike | None = None,
    gt: PathLike | Mapping[str, Any] | None = None,
    frame_units: FrameUnits | str | None = None,
    frame_rate: float | None = None,
    videos: Sequence[str] | None = None,
    strip_frames: int = 1500,
    max_event_thumbnails: int = 1000,
    max_full_frames: int = 3000,
    thumb_size: int = 128,
    num_workers: int | None = None,
    progress: bool = True,
) -> Path:
    """Write the review site of a prediction (see ``docs/design/report-review.md`` for the layout).

    Args:
        pred: the predicted event JSON (path or object); its event order is the confidence order.
        frames: the frames root (video folders and/or video files, as inference reads it) or the frame
            datalist of the run.
        out_dir: the site folder (created; files of an earlier site there are replaced, thumbnails of unchanged
            exams reused).
        probs_dir: folder of the per-video ``<video_id>.npz`` probability files (traces, mean/max probability,
            the most probable frame of each event); every shown video needs one when given.
        gt: optional ground-truth event JSON (path or object), drawn in each lane.
        frame_units: frame units of the event files, ``"frame_index"`` or ``"frame_number"`` (the site shows frames in
            these units; the frame viewer also names the frame's file and the other id). ``None``: the units
            recorded beside the event files (``<name>.meta.json``; the ground truth's first), else ``frame_index``.
            An event file recorded in other units is refused, or converted with ``probs_dir`` for the prediction.
        frame_rate: frame rate of every exam, for durations in seconds; ``None``: each probability file's own
            (:func:`monai_vce.data.video_frame_rates`), else a video file's.
        videos: video ids to include, in this order (default: every video of ``pred``, in its order).
        strip_frames: timeline thumbnails per exam.
        max_event_thumbnails: events per exam with their own thumbnails (confidence order).
        max_full_frames: full-size frames stored per exam stored as a video file.
        thumb_size: thumbnail size in pixels (longer side).
        num_workers: threads writing thumbnails (default: one per core).
        progress: a progress bar on terminals.

    Returns:
        The path of ``index.html``.

    Raises:
        FileNotFoundError: a frames folder, a video's frames or a probability file is missing.
        FileExistsError: a file the site would replace was not written by it (see :mod:`.manifest`).
        ValueError: invalid event files or settings, unknown videos, frames and probabilities that do not match,
            or event files recorded in other frame units; the message names the file and the video.
        RuntimeError: another run holds the site folder.
        OSError: a file could not be written (named in the message); files written before are intact.

    Warns:
        UserWarning: non-finite or out-of-range probabilities (one line naming the video, frame and label).
    """
    if videos is not None and (isinstance(videos, (str, bytes)) or not isinstance(videos, Sequence)):
        raise ValueError(f"videos must be a list of video ids, got {videos!r}")
    if not isinstance(progress, bool):
        raise ValueError(f"progress must be true or false, got {progress!r}")
    _check_settings(
        strip_frames=strip_frames,
        max_event_thumbnails=max_event_thumbnails,
        max_full_frames=max_full_frames,
        thumb_size=thumb_size,
        num_workers=num_workers,
        frame_rate=frame_rate,
    )
    if probs_dir is not None and not Path(probs_dir).is_dir():
        raise FileNotFoundError(f"probability folder {safe_text(probs_dir)} not found (or not a folder)")
    pred_obj, pred_src = _load_events_arg(pred, "prediction")
    gt_obj = _load_events_arg(gt, "ground truth")[0] if gt is not None else None
    pred_obj, units = events_in_common_units(pred, pred_obj, gt, frame_units, probs_dir, pred_src)
    pred_videos = {str(v["video_id"]): list(v["events"]) for v in pred_obj["videos"]}
    gt_videos = {str(v["video_id"]): list(v["events"]) for v in gt_obj["videos"]} if gt_obj is not None else None
    order = check_video_ids(pred_videos if videos is None else videos, str(pred_src))
    unknown = [v for v in order if v not in pred_videos]
    if unknown:
        raise ValueError(f"video(s) {', '.join(map(repr, unknown))} not in {pred_src}")
    if isinstance(frames, (str, os.PathLike)) and not Path(frames).exists():
        raise FileNotFoundError(f"frames folder {frames} not found")
    by_video = frames_by_video(frames)
    missing = [v for v in order if v not in by_video]
    if missing:
        where = frames if isinstance(frames, (str, os.PathLike)) else "the datalist"
        raise FileNotFoundError(f"no frames of video(s) {', '.join(map(repr, missing))} in {where}")
    out = Path(out_dir)
    exams_dir = out / "exams"
    params = {
        "strip_frames": strip_frames,
        "max_event_thumbnails": max_event_thumbnails,
        "max_full_frames": max_full_frames,
        "thumb_size": thumb_size,
    }
    pages: list[tuple[str, dict[str, Any]]] = []
    jobs: list[ImageJob] = []
    entries: list[dict[str, Any]] = []
    digests: list[str] = []
    for vid in order:
        npz = None
        if probs_dir is not None:
            npz = probability_file(probs_dir, vid)
            if not npz.is_file():
                raise FileNotFoundError(f"probability file {npz} of video {vid!r} not found")
        video, exam_frames = load_exam(
            vid,
            by_video[vid],
            gt_events=None if gt_videos is None else gt_videos.get(vid, []),
            probs_file=npz,
            frame_rate=frame_rate,
        )
        video = video.replace(units=units)  # the units read beside the event files, chosen once here
        ids = video.frame_ids()
        _check_range(vid, ids, pred_videos[vid], "predicted", units)
        if video.events is not None:
            _check_range(vid, ids, video.events, "ground-truth", units)
        if npz is not None:
            video.probs = _checked_probs(video.probs, ids, npz, vid, units)
        data, job, entry = exam_data(video, exam_frames, pred_videos[vid], exams_dir, **params)
        pages.append((data["name"], data))
        jobs.append(job)
        entries.append(entry)
        digests.append(_source_digest(exam_frames, video.frame_number, params))
    try:
        lock = OutputLock(out).acquire()
    except (FileExistsError, NotADirectoryError):
        raise NotADirectoryError(f"cannot write the review site into {out}: a file is in its way") from None
    try:
        return _write_site(out, pages, jobs, entries, digests, pred_src, units.value, thumb_size, num_workers, progress)
    finally:
        lock.release()


def _write_site(
    out: Path,
    pages: Sequence[tuple[str, dict[str, Any]]],
    jobs: Sequence[ImageJob],
    entries: Sequence[dict[str, Any]],
    digests: Sequence[str],
    pred_src: str,
    frame_units: str,
    thumb_size: int,
    num_workers: int | None,
    progress: bool,
) -> Path:
    """Write the site's files (the folder locked), replacing only files listed in its manifest."""
    exams_dir = out / "exams"
    try:
        exams_dir.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise NotADirectoryError(f"cannot write the review site into {out}: a file is in its way") from None
    manifest = SiteManifest(out)
    top = [out / "index.html", out / "index.js", out / "assets" / "review.js", out / "assets" / "review.css"]
    manifest.check_writable(top + [exams_dir / f"{name}.html" for name, _ in pages])
    for (name, _), digest in zip(pages, digests, strict=True):
        folder = exams_dir / name
        manifest.check_folder(folder)  # before anything is deleted: a foreign file refuses the run
        # thumbnails of an earlier site are reused only when they were made from the same frames and settings
        stamp = folder / "source.txt"
        try:
            same = stamp.is_file() and stamp.read_text().strip() == digest
        except (OSError, UnicodeDecodeError):
            same = False
        if not same:
            manifest.clear_folder(folder)
    planned: list[Path] = list(top)
    for (name, _), job in zip(pages, jobs, strict=True):
        planned += [exams_dir / f"{name}.html", exams_dir / name / "data.js", exams_dir / name / "source.txt"]
        planned += [job.thumb_dir / f"{int(r)}.jpg" for r in job.thumb_rows]
        planned += [job.full_dir / f"{int(r)}.jpg" for r in job.full_rows]
    manifest.add(planned)  # listed before written: a killed run leaves only files the rerun knows
    for (name, _), digest in zip(pages, digests, strict=True):
        stamp = exams_dir / name / "source.txt"
        if not stamp.is_file():
            atomic_write_text(stamp, digest + "\n")
    render_jobs(jobs, thumb_size=thumb_size, num_workers=num_workers, progress=progress)
    _copy_assets(out / "assets")
    for (name, data), entry in zip(pages, entries, strict=True):
        atomic_write_text(exams_dir / name / "data.js", js_data("VCE_EXAM", data))
        title = html.escape(f"VCE review: {entry['video_id']}", quote=True)
        atomic_write_text(exams_dir / f"{name}.html", _EXAM_PAGE.format(title=title, name=quote(name)))
    index = {
        "version": SITE_FORMAT_VERSION,
        "prediction": os.path.basename(pred_src),
        "units": frame_units,
        "labels": list(LABELS),
        "exams": list(entries),
    }
    atomic_write_text(out / "index.js", js_data("VCE_INDEX", index))
    return atomic_write_text(out / "index.html", _INDEX_PAGE.format(count=len(entries)))


def _checked_probs(p: np.ndarray, ids: np.ndarray, source: PathLike, video_id: str, units: FrameUnits) -> np.ndarray:
    """``p``, or with a warning (one line: video, first bad frame, label, count) a copy where probabilities that
    are not finite numbers in [0, 1] are 0 (non-finite) or clipped, never silently."""
    bad = ~np.isfinite(p) | (p < 0) | (p > 1)
    if not bad.any():
        return p
    row, col = (int(x[0]) for x in np.nonzero(bad))
    warnings.warn(
        f"probability file {safe_text(source)}: video {safe_text(repr(video_id))} has {int(bad.sum())} "
        f"probabilities that are not finite numbers in [0, 1] (first: {units.value} {int(ids[row])}, "
        f"label {LABELS[col]!r}, value {float(p[row, col])!r}); drawn as 0 or clipped to [0, 1]",
        stacklevel=3,
    )
    return np.clip(np.nan_to_num(p, nan=0.0, posinf=1.0, neginf=0.0), 0.0, 1.0).astype(np.float32)


#: Accepted range of each numeric setting of :func:`write_review_site` (inclusive).
_SETTINGS: dict[str, tuple[int, int]] = {
    "strip_frames": (0, 100_000),
    "max_event_thumbnails": (0, 100_000),
    "max_full_frames": (0, 1_000_000),
    "thumb_size": (16, 2048),
    "num_workers": (1, 1024),
}


def _check_settings(frame_rate: float | None, **values: Any) -> None:
    """One line naming the setting when a number is out of its range (before anything is written)."""
    for name, value in values.items():
        if value is None and name == "num_workers":
            continue
        lo, hi = _SETTINGS[name]
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not lo <= value <= hi:
            raise ValueError(f"{name} must be an integer in [{lo}, {hi}], got {value!r}")
    if frame_rate is not None and not (
        isinstance(frame_rate, (int, float)) and np.isfinite(frame_rate) and 0 < frame_rate <= 10_000
    ):
        raise ValueError(f"frame_rate must be in (0, 10000] frames per second, got {frame_rate!r}")


def _check_range(
    video_id: str, ids: np.ndarray, events: Sequence[Mapping[str, Any]], role: str, units: FrameUnits
) -> None:
    """Events beyond the exam's frames mean the wrong video or the wrong frame units: say so rather than draw nothing."""
    if not events or not len(ids):
        return
    frame_units = units.value
    lo = min(int(e["start"]) for e in events)
    hi = max(int(e["end"]) for e in events)
    if lo < int(ids[0]) or hi > int(ids[-1]):
        raise ValueError(
            f"video {video_id!r}: the {role} events span {frame_units} {lo} to {hi} but its frames cover {frame_units} "
            f"{int(ids[0])} to {int(ids[-1])}; the files do not match (wrong video, frames or --frame-units?)"
        )


def _copy_assets(dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    for name in ("review.js", "review.css"):
        atomic_write_text(dest / name, (_ASSETS / name).read_text(encoding="utf-8"))
