"""The summary page of an evaluation: overall and per-video mAP, per-class AP, lesion-level sensitivity, per-capsule
rows and presence decisions, laid out from :func:`monai_vce.metrics.temporal_map`, :func:`~monai_vce.metrics.lesion_froc`
and :func:`~monai_vce.metrics.metrics_by_group`; durations in seconds where the frame rate is known.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote

import numpy as np

from monai_vce.events.metadata import events_in_common_units
from monai_vce.events.probabilities import Video, load_video_probs, probability_file, probability_files, video_file_name
from monai_vce.events.units import FrameUnits, as_frame_units
from monai_vce.events.validation import check_events, load_events
from monai_vce.labels import ANATOMY, LABELS, NUM_LABELS, PATHOLOGY
from monai_vce.metrics.groups import metrics_by_group
from monai_vce.metrics.lesions import lesion_froc
from monai_vce.metrics.temporal_map import temporal_map
from monai_vce.report.timeline import GT_COLOR, PRED_COLOR, draw_timeline, figure_to_png, require_matplotlib
from monai_vce.utils import (
    OutputLock,
    atomic_write_bytes,
    atomic_write_json,
    atomic_write_text,
    read_json_file,
    safe_text,
    short_repr,
)

__all__ = [
    "PRESENCE_CODES",
    "PRESENCE_COLORS",
    "LABEL_ABBREVIATIONS",
    "present_labels",
    "presence_matrix",
    "per_label_ap",
    "format_seconds",
    "flagged_seconds",
    "summary_markdown",
    "draw_summary",
    "write_report",
    "REPORT_MANIFEST",
]

#: The report's record of the files it wrote in its folder: a later report replaces or removes only those.
REPORT_MANIFEST = ".monai_vce_manifest.json"
_WRITER = "monai_vce.report"
_SUMMARY_FILES = ("summary.md", "summary.json", "summary.png")

#: Presence decision codes: predicted and in ground truth, predicted only, missed, absent from both.
PRESENCE_CODES: tuple[str, ...] = ("TP", "FP", "FN", "TN")
PRESENCE_COLORS: dict[str, str] = {"TP": "#4c9a4c", "FP": "#d0443e", "FN": "#f0a13a", "TN": "#eeeeee"}
_PRESENCE_MEANING = {
    "TP": "predicted and present in the ground truth",
    "FP": "predicted but absent from the ground truth",
    "FN": "present in the ground truth but not predicted",
    "TN": "absent from both",
}
#: Short column names of the Markdown presence table, in :data:`LABELS` order.
LABEL_ABBREVIATIONS: dict[str, str] = {
    "mouth": "mou",
    "esophagus": "eso",
    "stomach": "sto",
    "small intestine": "SI",
    "colon": "col",
    "z-line": "zl",
    "pylorus": "pyl",
    "ileocecal valve": "icv",
    "active bleeding": "AB",
    "angiectasia": "ang",
    "blood": "bld",
    "erosion": "ero",
    "erythema": "ery",
    "hematin": "hem",
    "lymphangioectasis": "lym",
    "polyp": "pol",
    "ulcer": "ulc",
}


def present_labels(events: Sequence[Mapping[str, Any]]) -> list[str]:
    """Return the labels listed by at least one event, in :data:`LABELS` order."""
    found = {str(n).strip().lower() for ev in events for n in ev["label"]}
    return [name for name in LABELS if name in found]


def presence_matrix(
    pred_videos: Mapping[str, Sequence[Mapping[str, Any]]], gt_videos: Mapping[str, Sequence[Mapping[str, Any]]]
) -> dict[str, dict[str, str]]:
    """Return the video-level presence decision of every label: ``{video_id: {label: "TP"|"FP"|"FN"|"TN"}}``.

    Args:
        pred_videos: ``{video_id: predicted events}``; a video missing here predicts nothing.
        gt_videos: ``{video_id: ground-truth events}``; defines the videos, in its order.
    """
    out: dict[str, dict[str, str]] = {}
    for vid, gt_events in gt_videos.items():
        gt = set(present_labels(gt_events))
        pr = set(present_labels(pred_videos.get(vid, [])))
        out[vid] = {
            name: ("TP" if name in pr else "FN") if name in gt else ("FP" if name in pr else "TN") for name in LABELS
        }
    return out


def per_label_ap(metrics: Mapping[str, Any]) -> dict[str, dict[str, float]]:
    """Return ``{label: {"0.5": AP, "0.95": AP}}`` over all videos, from a :func:`temporal_map` result.

    Raises:
        ValueError: the result lacks the ``"per_label"`` entry at both thresholds.
    """
    own: Any = metrics.get("per_label")
    try:
        return {name: {t: float(own[name][t]) for t in ("0.5", "0.95")} for name in LABELS}
    except (KeyError, TypeError):
        raise ValueError(
            "the metric result has no 'per_label' AP at tIoU 0.5 and 0.95; compute it with "
            "monai_vce.metrics.temporal_map(gt, pred, tiou_thresholds=(0.5, 0.95))"
        ) from None


# characters that could start Markdown or HTML markup inside a table cell
_MD_SPECIAL = frozenset("\\`*_[]()|~!$")
_MD_ENTITIES = {"&": "&amp;", "<": "&lt;", ">": "&gt;"}


def _md_text(value: Any) -> str:
    """A video id (or any data) as literal Markdown text for one table cell: markup characters escaped, HTML
    characters as entities, line breaks and other control characters as blanks."""
    out = []
    for c in str(value):
        if c in _MD_ENTITIES:
            out.append(_MD_ENTITIES[c])
        elif c in _MD_SPECIAL:
            out.append("\\" + c)
        elif not c.isprintable():
            out.append(" ")
        else:
            out.append(c)
    return "".join(out)


def _md_code(value: Any) -> str:
    """``value`` as a Markdown code span (a path) on one line, fenced by more backticks than it holds."""
    text = " ".join(str(value).splitlines())
    longest = max((len(m) for m in re.findall(r"`+", text)), default=0)
    fence, pad = "`" * (longest + 1), " " if longest else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def _md_link(text: str, target: str) -> str:
    """A Markdown link to a relative file path: each path segment percent-encoded (file names may hold ``%``)."""
    return f"[{text}](" + "/".join(quote(part) for part in str(target).split("/")) + ")"


def _md_table(header: Sequence[str], rows: Sequence[Sequence[Any]], align: Sequence[str] | None = None) -> str:
    align = align or ["l"] + ["r"] * (len(header) - 1)
    sep = [":--" if a == "l" else ("--:" if a == "r" else ":-:") for a in align]
    lines = ["| " + " | ".join(map(str, header)) + " |", "|" + "|".join(sep) + "|"]
    lines += ["| " + " | ".join(map(str, r)) + " |" for r in rows]
    return "\n".join(lines)


def _f(v: Any) -> str:
    return f"{float(v):.3f}"


def _opt(v: Any) -> str:
    return "-" if v is None else _f(v)


def _lesion_section(lesions: Mapping[str, Any]) -> list[str]:
    """The lesion-level table: per pathology label and overall, sensitivity at each false-alarm rate (events
    matched by overlap), sensitivity and false alarms of all events, and the reading workload."""
    rates = [str(r) if not float(r).is_integer() else str(int(r)) for r in lesions["false_alarm_rates"]]
    out = [
        "## Lesions (pathology events)",
        "",
        "A ground-truth event is found when a predicted event of its label overlaps it by a frame; sensitivity at "
        "k false-alarm events per exam keeps the most confident events up to that cost ('-': not reached).",
        "",
    ]
    blocks = [("all pathology", lesions["overall"]["overlap"])]
    blocks += [(name, lesions["per_label"][name]["overlap"]) for name in lesions["labels"]]
    rows = []
    for name, b in blocks:
        alle = b["all_events"]
        rows.append(
            [
                name,
                b["lesions"],
                *(_opt(b["sensitivity"].get(r)) for r in rates),
                _opt(b.get("froc_score")),
                _opt(alle["sensitivity"]),
                _f(alle["false_alarms_per_exam"]),
            ]
        )
    header = ["label", "lesions", *(f"sens@{r}FA" for r in rates), "FROC", "sens (all events)", "FA/exam"]
    return [*out, _md_table(header, rows), ""]


def format_seconds(seconds: float | None) -> str:
    """``h:mm:ss`` (``m:ss`` under an hour) of a duration, ``"-"`` when unknown."""
    if seconds is None or not np.isfinite(seconds):
        return "-"
    total = round(float(seconds))
    h, rest = divmod(total, 3600)
    return f"{h}:{rest // 60:02d}:{rest % 60:02d}" if h else f"{rest // 60}:{rest % 60:02d}"


def flagged_seconds(video: Video, events: Sequence[Mapping[str, Any]]) -> float | None:
    """Seconds of a video under at least one predicted pathology event (what a reader must look at): the rows
    covered over the video's row rate; ``None`` when its frame rate is unknown. The events count in the video's
    :attr:`~monai_vce.events.Video.units`."""
    rate = video.rows_per_second
    if rate is None:
        return None
    ids = video.frame_ids()
    spans = [(int(e["start"]), int(e["end"])) for e in events if any(n in PATHOLOGY for n in e["label"])]
    if not spans or not len(ids):
        return 0.0
    starts, ends = np.asarray(spans, dtype=np.int64).T
    first, stop = np.searchsorted(ids, starts, side="left"), np.searchsorted(ids, ends, side="right")
    cover = np.zeros(len(ids) + 1, dtype=np.int64)
    np.add.at(cover, first, 1)
    np.add.at(cover, stop, -1)
    return float((np.cumsum(cover[:-1]) > 0).sum()) / rate


def summary_markdown(
    pred_videos: Mapping[str, Sequence[Mapping[str, Any]]],
    gt_videos: Mapping[str, Sequence[Mapping[str, Any]]] | None = None,
    metrics: Mapping[str, Any] | None = None,
    timelines: Mapping[str, str] | None = None,
    summary_png: str | None = None,
    sources: Mapping[str, Any] | None = None,
    frame_units: FrameUnits | str = FrameUnits.FRAME_INDEX,
    lesions: Mapping[str, Any] | None = None,
    per_group: Mapping[str, Mapping[str, Any]] | None = None,
    durations: Mapping[str, Mapping[str, float | None]] | None = None,
) -> str:
    """Compose the summary page in Markdown.

    With ground truth: the overall mAP, a per-video table, a per-class table, the lesion-level table, the
    per-capsule rows and the presence matrix. Without it (inference): the predicted labels per video, no scores.

    Args:
        pred_videos: ``{video_id: predicted events}`` of the videos reported, in report order.
        gt_videos: ``{video_id: ground-truth events}`` or ``None``.
        metrics: the :func:`monai_vce.metrics.temporal_map` result on these videos (required with ground truth).
        timelines: ``{video_id: path of the timeline PNG relative to the Markdown file}``.
        summary_png: path of the summary PNG relative to the Markdown file.
        sources: ``{"pred": .., "gt": .., "probs": ..}`` descriptions of the inputs, listed on the page.
        frame_units: frame units of the event files.
        lesions: the :func:`~monai_vce.metrics.lesion_froc` result of these videos (with ground truth).
        per_group: the :func:`~monai_vce.metrics.metrics_by_group` result by capsule (with ground truth).
        durations: ``{video_id: {"duration": s, "flagged": s}}`` (seconds, ``None`` when the rate is unknown):
            columns of the per-video tables when any is known.
    """
    timelines = timelines or {}
    timed = bool(durations) and any(d.get("duration") is not None for d in durations.values())  # type: ignore[union-attr]

    def times(vid: str) -> list[str]:
        d = (durations or {}).get(vid, {})
        return [format_seconds(d.get("duration")), format_seconds(d.get("flagged"))] if timed else []

    time_cols = ["duration", "flagged (pathology)"] if timed else []
    out = ["# Evaluation report" if gt_videos is not None else "# Inference report", ""]
    for key, name in (("pred", "Prediction"), ("gt", "Ground truth"), ("probs", "Frame probabilities")):
        if sources and sources.get(key):
            out.append(f"- {name}: {_md_code(sources[key])}")
    out.append(
        f"- Videos: {len(pred_videos) if gt_videos is None else len(gt_videos)}; frame units: `{as_frame_units(frame_units).value}`"
    )
    out.append("")

    if gt_videos is None:
        out += ["## Predicted labels per video", ""]
        rows: list[list[Any]] = []
        for vid, events in pred_videos.items():
            labels = present_labels(events)
            link = _md_link("timeline", timelines[vid]) if vid in timelines else ""
            rows.append([_md_text(vid), *times(vid), len(events), ", ".join(labels) if labels else "(none)", link])
        header = ["video", *time_cols, "events", "predicted labels", "timeline"]
        out += [_md_table(header, rows, ["l", *["r"] * len(time_cols), "r", "l", "l"]), ""]
        return "\n".join(out)

    if metrics is None:
        raise ValueError("a summary with ground truth needs the temporal_map result")
    presence = presence_matrix(pred_videos, gt_videos)
    out += [
        "## Temporal mAP",
        "",
        _md_table(["", "mAP@0.5", "mAP@0.95"], [["all videos", _f(metrics["mAP@0.5"]), _f(metrics["mAP@0.95"])]]),
        "",
    ]
    if summary_png:
        out += [f"![summary]({summary_png})", ""]

    out += ["## Per video", ""]
    rows = []
    for vid in gt_videos:
        pv = metrics["per_video"][vid]
        codes = list(presence[vid].values())
        link = _md_link("timeline", timelines[vid]) if vid in timelines else ""
        rows.append(
            [
                _md_text(vid),
                *times(vid),
                _f(pv["mAP@0.5"]),
                _f(pv["mAP@0.95"]),
                codes.count("TP"),
                codes.count("FP"),
                codes.count("FN"),
                link,
            ]
        )
    out += [
        _md_table(
            ["video", *time_cols, "mAP@0.5", "mAP@0.95", "TP labels", "FP labels", "FN labels", "timeline"],
            rows,
            ["l", *["r"] * len(time_cols), "r", "r", "r", "r", "r", "l"],
        ),
        "",
    ]
    if per_group:
        out += ["## Per capsule", ""]
        rates = list(next(iter(per_group.values()))["lesion_sensitivity"])
        rows = [
            [
                _md_text(name),
                g["videos"],
                _f(g["mAP@0.5"]),
                _f(g["mAP@0.95"]),
                g["lesions"],
                *(_opt(g["lesion_sensitivity"][r]) for r in rates),
                _f(g["false_alarms_per_exam_all_events"]),
            ]
            for name, g in per_group.items()
        ]
        header = ["capsule", "videos", "mAP@0.5", "mAP@0.95", "lesions", *(f"sens@{r}FA" for r in rates)]
        out += [_md_table([*header, "FA/exam (all events)"], rows), ""]
    if lesions:
        out += _lesion_section(lesions)

    out += [
        "## Per class",
        "",
        "AP of each label averaged over the videos (a video without the label scores 1 "
        "when nothing predicts it there, else 0).",
        "",
    ]
    ap = per_label_ap(metrics)
    rows = []
    for name in LABELS:
        codes = [presence[v][name] for v in gt_videos]
        rows.append(
            [
                name,
                _f(ap[name]["0.5"]),
                _f(ap[name]["0.95"]),
                codes.count("TP") + codes.count("FN"),
                codes.count("TP") + codes.count("FP"),
                codes.count("TP"),
                codes.count("FP"),
                codes.count("FN"),
            ]
        )
    out += [
        _md_table(["label", "AP@0.5", "AP@0.95", "videos with it", "predicted in", "TP", "FP", "FN"], rows),
        "",
    ]

    out += ["## Presence decisions", ""]
    out.append(
        "Per video and label: "
        + "; ".join(f"`{c if c != 'TN' else '.'}` {_PRESENCE_MEANING[c]}" for c in PRESENCE_CODES)
        + ". Columns: "
        + ", ".join(f"{LABEL_ABBREVIATIONS[n]} = {n}" for n in LABELS)
        + "."
    )
    out.append("")
    rows = [[_md_text(vid), *(c if c != "TN" else "." for c in presence[vid].values())] for vid in gt_videos]
    out += [_md_table(["video"] + [LABEL_ABBREVIATIONS[n] for n in LABELS], rows, ["l"] + ["c"] * NUM_LABELS), ""]
    return "\n".join(out)


def draw_summary(
    metrics: Mapping[str, Any],
    presence: Mapping[str, Mapping[str, str]],
    figsize: tuple[float, float] = (16.0, 9.0),
    dpi: int = 100,
    title: str = "Evaluation summary",
) -> Any:
    """Draw the summary chart and return the matplotlib ``Figure``.

    Left: each label's AP at tIoU 0.5 and 0.95 (horizontal bars, labels in :data:`LABELS` order). Right, top:
    each video's mAP at both thresholds; right, below: the presence matrix (labels x videos, one colour per
    decision), sharing its rows with the per-class bars and its columns with the per-video bars.

    Args:
        metrics: a :func:`monai_vce.metrics.temporal_map` result.
        presence: ``{video_id: {label: "TP"|"FP"|"FN"|"TN"}}`` (see :func:`presence_matrix`); its order is
            the column order.
        figsize: figure size in inches; the PNG is ``figsize * dpi`` pixels.
        dpi: resolution used for the figure.
        title: the figure title (the overall mAP is appended).

    Returns:
        A ``matplotlib.figure.Figure`` attached to an Agg canvas; its axes carry the labels ``"overview"``,
        ``"per_label"``, ``"per_video"`` and ``"presence"``.
    """
    Figure, FigureCanvasAgg = require_matplotlib()
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch

    videos = list(presence)
    n = len(videos)
    ap = per_label_ap(metrics)
    fig = Figure(figsize=figsize, dpi=dpi)
    FigureCanvasAgg(fig)
    gs = fig.add_gridspec(
        2,
        2,
        width_ratios=[1, 2.6],
        height_ratios=[1, 2.4],
        wspace=0.04,
        hspace=0.08,
        left=0.115,
        right=0.985,
        top=0.86,
        bottom=0.1,
    )
    ax_lab = fig.add_subplot(gs[1, 0])
    ax_pres = fig.add_subplot(gs[1, 1], sharey=ax_lab)
    ax_vid = fig.add_subplot(gs[0, 1], sharex=ax_pres)
    ax_lab.set_label("per_label")
    ax_vid.set_label("per_video")
    ax_pres.set_label("presence")

    ys = np.arange(NUM_LABELS)
    h = 0.38
    a5 = [ap[name]["0.5"] for name in LABELS]
    a95 = [ap[name]["0.95"] for name in LABELS]
    ax_lab.barh(ys - h / 2, a5, height=h, color=PRED_COLOR, label="AP@0.5")
    ax_lab.barh(ys + h / 2, a95, height=h, color=GT_COLOR, label="AP@0.95")
    ax_lab.set_yticks(ys, list(LABELS), fontsize=9)
    for tick, name in zip(ax_lab.get_yticklabels(), LABELS, strict=False):
        tick.set_color("#1a1a1a" if name in ANATOMY else "#7a1f1f")
    ax_lab.set_ylim(NUM_LABELS - 0.5, -0.5)
    ax_lab.set_xlim(0.0, 1.0)
    ax_lab.yaxis.tick_left()
    ax_lab.set_xlabel("AP per label (mean over videos)", fontsize=9)
    ax_lab.axhline(len(ANATOMY) - 0.5, color="#999999", lw=0.8)
    ax_lab.grid(axis="x", color="#dddddd", lw=0.6)
    ax_lab.set_axisbelow(True)
    ax_lab.tick_params(axis="x", labelsize=8)
    ax_lab.legend(fontsize=8, loc="lower left", bbox_to_anchor=(0.0, 1.0), ncol=2, frameon=False)
    for i in range(NUM_LABELS):
        for value, y in ((a5[i], i - h / 2), (a95[i], i + h / 2)):
            inside = value > 0.85  # near 1 the value is written inside the bar, clear of the presence matrix
            ax_lab.text(
                value,
                y,
                f" {value:.2f} ",
                va="center",
                ha="right" if inside else "left",
                fontsize=6.5,
                color="white" if inside else "#333333",
            )

    # presence matrix: rows = labels, columns = videos
    codes = np.array([[PRESENCE_CODES.index(presence[v][name]) for v in videos] for name in LABELS]).reshape(
        NUM_LABELS, n
    )
    cmap = ListedColormap([PRESENCE_COLORS[c] for c in PRESENCE_CODES])
    ax_pres.imshow(
        codes,
        cmap=cmap,
        vmin=-0.5,
        vmax=len(PRESENCE_CODES) - 0.5,
        aspect="auto",
        interpolation="nearest",
        extent=(-0.5, n - 0.5, NUM_LABELS - 0.5, -0.5),
    )
    if 0 < n <= 40:
        for (i, j), c in np.ndenumerate(codes):
            code = PRESENCE_CODES[c]
            if code == "TN":
                continue
            text = code
            if code == "TP" and n <= 12:  # FP and FN score 0 by definition; a TP's AP is the timing
                text += f"  {float(metrics['per_video'][videos[j]]['AP'][LABELS[i]]['0.5']):.2f}"
            ax_pres.text(
                j,
                i,
                text,
                ha="center",
                va="center",
                fontsize=7 if n <= 20 else 5,
                color="white" if code in ("TP", "FP") else "#333333",
            )
    ax_pres.set_xticks(
        np.arange(n),
        [v if len(v) <= 40 else v[:37] + "..." for v in map(str, videos)],
        fontsize=8 if n <= 30 else 6,
        rotation=0 if n <= 20 else 90,
    )
    for tick in ax_pres.get_xticklabels():  # video ids are data, never mathtext ("$...$")
        tick.set_parse_math(False)
    ax_pres.set_xlabel("video", fontsize=9)
    ax_pres.tick_params(axis="y", labelleft=False, length=0)
    ax_pres.axhline(len(ANATOMY) - 0.5, color="#555555", lw=1.0)
    if n > 1:
        ax_pres.set_xticks(np.arange(n + 1) - 0.5, minor=True)
        ax_pres.grid(which="minor", axis="x", color="white", lw=0.8 if n <= 40 else 0.3)
    ax_pres.set_xlim(-0.5, n - 0.5)

    # per-video mAP
    xs = np.arange(n)
    w = 0.38
    m5 = [float(metrics["per_video"][v]["mAP@0.5"]) for v in videos]
    m95 = [float(metrics["per_video"][v]["mAP@0.95"]) for v in videos]
    ax_vid.bar(xs - w / 2, m5, width=w, color=PRED_COLOR, label="mAP@0.5")
    ax_vid.bar(xs + w / 2, m95, width=w, color=GT_COLOR, label="mAP@0.95")
    ax_vid.axhline(float(metrics["mAP@0.5"]), color=PRED_COLOR, lw=0.8, ls="--", label="overall mAP@0.5")
    ax_vid.axhline(float(metrics["mAP@0.95"]), color=GT_COLOR, lw=0.8, ls="--", label="overall mAP@0.95")
    ax_vid.set_ylim(0, 1)
    ax_vid.set_ylabel("mAP per video", fontsize=9)
    ax_vid.tick_params(axis="x", labelbottom=False)
    ax_vid.tick_params(axis="y", labelsize=8)
    ax_vid.grid(axis="y", color="#dddddd", lw=0.6)
    ax_vid.set_axisbelow(True)
    ax_vid.legend(fontsize=8, loc="lower right", ncol=4, frameon=False, bbox_to_anchor=(1.0, 1.0))
    for side in ("top", "right"):
        ax_vid.spines[side].set_visible(False)
        ax_lab.spines[side if side == "top" else "left"].set_visible(False)

    # top left: the headline numbers and the presence decision counts
    ax_txt = fig.add_subplot(gs[0, 0])
    ax_txt.set_label("overview")
    ax_txt.axis("off")
    counts = {c: sum(list(p.values()).count(c) for p in presence.values()) for c in PRESENCE_CODES}
    lines = [
        ("mAP@0.5", f"{float(metrics['mAP@0.5']):.3f}"),
        ("mAP@0.95", f"{float(metrics['mAP@0.95']):.3f}"),
        ("videos", f"{n}"),
        ("presence TP / FP", f"{counts['TP']} / {counts['FP']}"),
        ("presence FN / TN", f"{counts['FN']} / {counts['TN']}"),
    ]
    for row, (caption, figure) in enumerate(lines):
        y = 0.9 - 0.18 * row
        ax_txt.text(0.02, y, caption, fontsize=10, ha="left", va="center", transform=ax_txt.transAxes)
        ax_txt.text(
            0.8,
            y,
            figure,
            fontsize=10,
            fontweight="bold",
            ha="right",
            va="center",
            family="monospace",
            transform=ax_txt.transAxes,
        )

    fig.text(
        0.01,
        0.955,
        f"{title}    mAP@0.5 = {float(metrics['mAP@0.5']):.3f}    mAP@0.95 = {float(metrics['mAP@0.95']):.3f}"
        f"    ({n} video{'s' if n != 1 else ''})",
        fontsize=13,
        fontweight="bold",
        ha="left",
        va="center",
    )
    fig.legend(
        handles=[
            Patch(facecolor=PRESENCE_COLORS[c], edgecolor="#bbbbbb", label=f"{c}: {_PRESENCE_MEANING[c]}")
            for c in PRESENCE_CODES
        ],
        loc="center left",
        bbox_to_anchor=(0.005, 0.91),
        ncol=4,
        fontsize=8.5,
        frameon=False,
        title="presence decisions (video x label)",
        title_fontsize=8.5,
        alignment="left",
    )
    return fig


def _load_event_json(obj: Any, role: str) -> tuple[dict[str, Any], str]:
    if isinstance(obj, Mapping):
        # in-memory decoder output may carry extra keys (an event's "score"); drawing ignores them
        return check_events(obj, source=role, strict=False), role
    path = Path(obj)
    return load_events(path), str(path)


def _check_range(
    path: Path, vid: str, ids: np.ndarray, events: Sequence[Mapping[str, Any]], role: str, units: FrameUnits
) -> None:
    if not events or not len(ids):
        return
    starts = np.fromiter((e["start"] for e in events), dtype=np.int64, count=len(events))
    ends = np.fromiter((e["end"] for e in events), dtype=np.int64, count=len(events))
    lo, hi = int(ids.min()), int(ids.max())
    if starts.min() < lo or ends.max() > hi:
        raise ValueError(
            f"video {vid!r}: the {role} events span frames {int(starts.min())} to {int(ends.max())} but the "
            f"probabilities in {path} cover {units.value} {lo} to {hi}; the files do not match (wrong video or "
            "--frame-units?)"
        )


def _report_file(rel: Any) -> bool:
    """Whether ``rel`` is a name the report writes: a summary file or ``timelines/<name>.png``."""
    if not isinstance(rel, str) or rel in _SUMMARY_FILES:
        return isinstance(rel, str)
    head, _, name = rel.partition("/")
    return head == "timelines" and name.endswith(".png") and "/" not in name and "\\" not in name and name[0] != "."


def _report_owned(out: Path) -> set[str]:
    """The files an earlier report wrote in ``out`` (relative paths), as its manifest lists them (none without one).

    Names other than the report's own are never taken from the manifest.
    """
    manifest = out / REPORT_MANIFEST
    if os.path.lexists(manifest):
        obj = read_json_file(manifest, max_bytes=64 * 1024**2, what="report manifest")
        files = obj.get("files") if isinstance(obj, dict) else None
        if not (isinstance(obj, dict) and obj.get("writer") == _WRITER and isinstance(files, list)):
            raise ValueError(f"{manifest} is not a manifest of {_WRITER}; choose another report folder")
        bad = next((f for f in files if not _report_file(f)), None)
        if bad is not None:
            raise ValueError(
                f"{manifest} lists {short_repr(bad)}, not a file of a report; choose another report folder"
            )
        return set(files)
    return set()


def _check_report_folder(out: Path, planned: set[str], owned: set[str]) -> None:
    """Refuse, before anything is written, to replace a file of ``out`` that no earlier report wrote."""
    timelines = out / "timelines"
    if timelines.is_symlink():  # its PNGs would be written (and stale ones removed) wherever it points
        raise FileExistsError(
            f"report folder {safe_text(out)}: {safe_text(timelines)} is a link, not a folder the report wrote; "
            "remove it or choose another report folder"
        )
    for rel in sorted(planned):
        if rel not in owned and os.path.lexists(out / rel):
            raise FileExistsError(
                f"report folder {safe_text(out)} holds {safe_text(rel)}, which no earlier report wrote (not in its "
                f"manifest {REPORT_MANIFEST}); move it away or choose another report folder"
            )


def _record_report(out: Path, files: set[str]) -> None:
    atomic_write_json(out / REPORT_MANIFEST, {"writer": _WRITER, "files": sorted(files)}, indent=None)


def write_report(
    pred: str | os.PathLike | Mapping[str, Any],
    out_dir: str | os.PathLike,
    gt: str | os.PathLike | Mapping[str, Any] | None = None,
    probs_dir: str | os.PathLike | None = None,
    frame_units: FrameUnits | str | None = None,
    videos: Sequence[str] | None = None,
    groups: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Write the report of a prediction: one timeline PNG per video and a summary (Markdown, PNG, JSON).

    Output layout::

        out_dir/timelines/<video_id>.png   one per video
        out_dir/summary.md                 scores, per-video and per-class tables, presence matrix
        out_dir/summary.png                the chart of the same numbers (only with ground truth)
        out_dir/summary.json               the temporal_map result, the presence decisions, the paths

    With ground truth, the scores are those of :func:`monai_vce.metrics.temporal_map` on the reported videos
    (all of them unless ``videos`` narrows it). Without it (inference), the timelines and the list of
    predicted labels per video are written, with no score. Every file is written atomically, under the folder's
    :class:`~monai_vce.utils.OutputLock`. The files written are recorded in ``out_dir/.monai_vce_manifest.json``
    (before they are written): a later report in the same folder removes the files of an earlier one it does not
    write again (timelines of other videos, a ``summary.png`` without ground truth), and only those; a file it
    would replace that no report wrote is refused with one line, and other files are left alone.

    Frame units: those recorded beside the event files (``<name>.meta.json``, :mod:`monai_vce.events.metadata`)
    are checked against ``frame_units``. When the prediction and the ground truth record different units, the
    prediction is converted into the ground truth's units with the frame ids of ``probs_dir`` (which hold both ids
    of every frame), or refused without it.

    Args:
        pred: the prediction event JSON (path or parsed object; an object may carry extra event keys such as
            the decoder's ``score``).
        out_dir: the report folder; created when missing.
        gt: optional ground-truth event JSON (path or object) with exactly the prediction's video ids.
        probs_dir: optional folder of per-video probability files ``<video_id>.npz``, drawn as traces; every
            reported video needs one and every file must belong to a video of the prediction.
        frame_units: frame units of the event files, ``"frame_index"`` or ``"frame_number"``; selects the id
            column of the probability files and names the frame axis. ``None``: the units recorded beside the
            files, else ``"frame_index"``.
        videos: optional subset of video ids to report, in this order; default all, in ground-truth order
            (prediction order without ground truth).
        groups: ``{video_id: capsule}`` (:func:`monai_vce.data.video_capsules`): with ground truth, the summary
            has a row of scores per capsule.

    Returns:
        ``{"timelines": {video_id: Path}, "summary_md": Path, "summary_png": Path | None,
        "summary_json": Path, "metrics": dict | None, "frame_units": str}``.

    Raises:
        ImportError: matplotlib is not installed (``pip install monai-vce[report]``); nothing is written.
        FileNotFoundError: an input file or a video's probability file is missing.
        ValueError: invalid event JSON, video ids that differ between the files, an unknown video,
            probabilities that do not match the events, or frame units that differ (from ``frame_units`` or
            between the files, without ``probs_dir`` to convert); the message names the file and video.
        FileExistsError: ``out_dir`` holds a file this report would replace that no earlier report wrote.
        RuntimeError: another run holds ``out_dir`` locked, or the folder cannot be created or locked.
    """
    require_matplotlib()

    pred_obj, pred_src = _load_event_json(pred, "prediction")
    gt_obj, gt_src = _load_event_json(gt, "ground truth") if gt is not None else (None, None)
    pred_obj, units = events_in_common_units(pred, pred_obj, gt, frame_units, probs_dir, pred_src)
    if gt_obj is not None:
        check_events(pred_obj, gt=gt_obj, source=f"{pred_src} (against the ground truth {gt_src})", strict=False)
    pred_videos = {v["video_id"]: v["events"] for v in pred_obj["videos"]}
    gt_videos = {v["video_id"]: v["events"] for v in gt_obj["videos"]} if gt_obj is not None else None
    order = list(gt_videos if gt_videos is not None else pred_videos)
    if videos is not None:
        videos = [str(v) for v in videos]
        unknown = [v for v in videos if v not in pred_videos]
        if unknown:
            plural = "s" if len(unknown) > 1 else ""
            raise ValueError(f"video{plural} {', '.join(map(repr, unknown))} not in {pred_src}")
        order = list(dict.fromkeys(videos))

    probs_path = Path(probs_dir) if probs_dir is not None else None
    if probs_path is not None:
        if not probs_path.is_dir():
            raise FileNotFoundError(f"probability folder {probs_path} not found")
        strays = sorted(p.name for vid, p in probability_files(probs_path).items() if vid not in pred_videos)
        if strays:
            raise ValueError(
                f"probability folder {probs_path} has files of videos that are not in {pred_src}: "
                f"{', '.join(strays[:10])}{' ...' if len(strays) > 10 else ''}"
            )

    metrics = None
    if gt_videos is not None:
        sub_gt = {"videos": [{"video_id": v, "events": gt_videos[v]} for v in order]}
        sub_pred = {"videos": [{"video_id": v, "events": pred_videos[v]} for v in order]}
        metrics = temporal_map(sub_gt, sub_pred)
        metrics["lesions"] = lesion_froc(sub_gt, sub_pred, validate=False)
        if groups:
            metrics["per_capsule"] = metrics_by_group(sub_gt, sub_pred, groups, validate=False)

    out = Path(out_dir)
    # the folder is locked (no other run writes there meanwhile) and every file of this report is recorded in the
    # manifest before it is written, so that a later report replaces or removes only what a report wrote
    with OutputLock(out):
        planned = {f"timelines/{video_file_name(vid, '.png')}" for vid in order}
        planned |= {"summary.md", "summary.json"} | ({"summary.png"} if metrics is not None else set())
        owned = _report_owned(out)
        _check_report_folder(out, planned, owned)
        _record_report(out, {f for f in owned if os.path.lexists(out / f)} | planned)
        result = _write_report_files(
            out, order, pred_videos, gt_videos, metrics, probs_path, units, {"pred": pred_src, "gt": gt_src}
        )
        # an earlier report's files that this one does not write: timelines of other videos, a summary.png of a
        # report with scores; only those, never a file a report did not write
        for stale in sorted(owned - planned):
            (out / stale).unlink(missing_ok=True)
        _record_report(out, planned)
    return result


def _write_report_files(
    out: Path,
    order: list[str],
    pred_videos: dict[str, Any],
    gt_videos: dict[str, Any] | None,
    metrics: dict[str, Any] | None,
    probs_path: Path | None,
    units: FrameUnits,
    srcs: dict[str, str | None],
) -> dict[str, Any]:
    """Draw and write the files of :func:`write_report` (its inputs checked) into the locked folder ``out``."""
    pred_src, gt_src = srcs["pred"], srcs["gt"]
    timelines: dict[str, Path] = {}
    durations: dict[str, dict[str, float | None]] = {}
    for vid in order:
        probs = ids = None
        if probs_path is not None:
            npz = probability_file(probs_path, vid)
            if not npz.is_file():
                raise FileNotFoundError(f"probability file {npz} of video {vid!r} not found")
            video = load_video_probs(npz).replace(units=units)  # the units of the event files, chosen once
            probs, ids = video.probs, video.frame_ids()
            flagged = flagged_seconds(video, pred_videos[vid])
            durations[vid] = {"duration": video.duration_seconds(), "flagged": flagged}
            _check_range(npz, vid, ids, pred_videos[vid], "predicted", units)
            if gt_videos is not None:
                _check_range(npz, vid, ids, gt_videos[vid], "ground-truth", units)
        fig = draw_timeline(
            vid,
            pred_videos[vid],
            gt_events=gt_videos[vid] if gt_videos is not None else None,
            probs=probs,
            frame_ids=ids,
            frame_units=units,
            scores=metrics["per_video"][vid] if metrics is not None else None,
        )
        timelines[vid] = atomic_write_bytes(out / "timelines" / video_file_name(vid, ".png"), figure_to_png(fig))

    rel = {vid: f"timelines/{p.name}" for vid, p in timelines.items()}
    summary_png = None
    presence = None
    if metrics is not None:
        assert gt_videos is not None  # metrics are computed only with a ground truth
        presence = presence_matrix({v: pred_videos[v] for v in order}, {v: gt_videos[v] for v in order})
        fig = draw_summary(metrics, presence)
        summary_png = atomic_write_bytes(out / "summary.png", figure_to_png(fig))
    sources: dict[str, Any] = {
        "pred": pred_src,
        "gt": gt_src,
        "probs": str(probs_path) if probs_path is not None else None,
    }
    md = summary_markdown(
        {v: pred_videos[v] for v in order},
        {v: gt_videos[v] for v in order} if gt_videos is not None else None,
        metrics=metrics,
        timelines=rel,
        summary_png="summary.png" if summary_png is not None else None,
        sources=sources,
        frame_units=units,
        lesions=metrics.get("lesions") if metrics is not None else None,
        per_group=metrics.get("per_capsule") if metrics is not None else None,
        durations=durations,
    )
    summary_md = atomic_write_text(out / "summary.md", md)
    summary_json = atomic_write_json(
        out / "summary.json",
        {
            "sources": sources,
            "frame_units": units.value,
            "videos": order,
            "metrics": metrics,
            "presence": presence,
            "predicted_labels": {v: present_labels(pred_videos[v]) for v in order},
            "durations_seconds": durations or None,
            "timelines": rel,
        },
    )
    return {
        "timelines": timelines,
        "summary_md": summary_md,
        "summary_png": summary_png,
        "summary_json": summary_json,
        "metrics": metrics,
        "frame_units": units.value,
    }
