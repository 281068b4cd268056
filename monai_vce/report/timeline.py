"""Per-video timeline figures: one lane per label with predicted events, ground truth and max-pooled frame
probabilities (matplotlib's Agg canvas, imported when drawing).
"""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from monai_vce.events.units import FrameUnits, as_frame_units
from monai_vce.labels import ANATOMY, LABELS, NUM_LABELS, SECTIONS

__all__ = [
    "UNITS",
    "PRED_COLOR",
    "GT_COLOR",
    "PROB_COLOR",
    "PROB_LINE_COLOR",
    "SECTION_COLORS",
    "require_matplotlib",
    "label_intervals",
    "label_cuts",
    "max_pool_trace",
    "draw_timeline",
    "figure_to_png",
]

#: Frame units of event files and of the frame axis (the two id columns of a probability file).
UNITS: tuple[str, ...] = tuple(u.value for u in FrameUnits)
PRED_COLOR = "#1f5fa8"
GT_COLOR = "#e8862a"
PROB_COLOR = "#6f93bf"
PROB_LINE_COLOR = "#2f5f95"
#: One colour per anatomical section, used by the section band.
SECTION_COLORS: dict[str, str] = {
    "mouth": "#c77cb0",
    "esophagus": "#8e6bbf",
    "stomach": "#e9c046",
    "small intestine": "#6aab6a",
    "colon": "#8a6246",
}
_INSTALL_HINT = "pip install 'monai-vce[report]'"


def require_matplotlib() -> tuple[Any, Any]:
    """Import matplotlib's ``Figure`` and Agg canvas, or raise an ``ImportError`` that says how to install it.

    Returns:
        ``(Figure, FigureCanvasAgg)``.
    """
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as e:
        raise ImportError(
            f"monai_vce.report draws its figures with matplotlib, which is not installed; install monai-vce[report]: "
            f"{_INSTALL_HINT}"
        ) from e
    return Figure, FigureCanvasAgg


def _merge_intervals(iv: np.ndarray) -> np.ndarray:
    """Merge inclusive ``(start, end)`` rows that overlap or touch; returns sorted disjoint rows."""
    if len(iv) == 0:
        return iv.reshape(0, 2)
    iv = iv[np.argsort(iv[:, 0], kind="stable")]
    reach = np.maximum.accumulate(iv[:, 1])
    new = np.ones(len(iv), dtype=bool)
    new[1:] = iv[1:, 0] > reach[:-1] + 1
    first = np.flatnonzero(new)
    return np.stack([iv[first, 0], np.maximum.reduceat(iv[:, 1], first)], axis=1)


def label_intervals(events: Sequence[Mapping[str, Any]]) -> dict[str, np.ndarray]:
    """Return, per label, the merged inclusive frame intervals covered by the events that list it.

    Args:
        events: challenge-format events (``start``, ``end`` inclusive, ``label`` a list of names).

    Returns:
        ``{label: int64 array (n, 2)}`` for the 17 labels in :data:`LABELS` order (``n`` may be 0).
    """
    rows: dict[str, list[tuple[int, int]]] = {name: [] for name in LABELS}
    for ev in events:
        names = ev["label"]
        if isinstance(names, str):
            names = [names]
        for name in names:
            rows[str(name).strip().lower()].append((int(ev["start"]), int(ev["end"])))
    return {name: _merge_intervals(np.asarray(r, dtype=np.int64).reshape(-1, 2)) for name, r in rows.items()}


def label_cuts(events: Sequence[Mapping[str, Any]]) -> dict[str, np.ndarray]:
    """Return, per label, the frames where one event of the label ends and the next one starts right after.

    These boundaries disappear when a label's events are drawn as merged bars (:func:`label_intervals`),
    yet they matter for the score: every event is matched on its own, so a section split into several
    events by a pathology starting inside it is several segments to match.

    Args:
        events: challenge-format events.

    Returns:
        ``{label: int64 array}`` of the start frames of events that begin inside or right after another event
        of the same label, for the 17 labels in :data:`LABELS` order.
    """
    rows: dict[str, list[tuple[int, int]]] = {name: [] for name in LABELS}
    for ev in events:
        names = [ev["label"]] if isinstance(ev["label"], str) else ev["label"]
        for name in names:
            rows[str(name).strip().lower()].append((int(ev["start"]), int(ev["end"])))
    out = {}
    for name, r in rows.items():
        iv = np.asarray(r, dtype=np.int64).reshape(-1, 2)
        if len(iv) < 2:
            out[name] = np.zeros(0, dtype=np.int64)
            continue
        iv = iv[np.argsort(iv[:, 0], kind="stable")]
        reach = np.maximum.accumulate(iv[:, 1])
        out[name] = iv[1:, 0][iv[1:, 0] <= reach[:-1] + 1]
    return out


def max_pool_trace(frame_ids: np.ndarray, probs: np.ndarray, max_bins: int = 2000) -> tuple[np.ndarray, np.ndarray]:
    """Max-pool frame probabilities into at most ``max_bins`` equal bins along the frame axis.

    Max (not mean) pooling keeps a one-frame peak visible in a 130,000-frame video.

    Args:
        frame_ids: (T,) frame ids in the axis units, increasing.
        probs: (T, C) probabilities.
        max_bins: the most bins drawn.

    Returns:
        ``(edges, values)``: ``edges`` (B + 1,) left edges of the B bins plus the right end, ``values`` (B, C),
        ready for a ``step="post"`` drawing (the last value is repeated once to close the last step).
    """
    frame_ids = np.asarray(frame_ids, dtype=np.int64)
    probs = np.asarray(probs, dtype=np.float32)
    lo, hi = int(frame_ids[0]), int(frame_ids[-1])
    span = hi - lo + 1
    if len(frame_ids) <= max_bins:
        edges = np.append(frame_ids, hi + 1).astype(np.float64)
        return edges, np.concatenate([probs, probs[-1:]], axis=0)
    bins = (frame_ids - lo) * max_bins // span
    first = np.flatnonzero(np.r_[True, bins[1:] != bins[:-1]])
    pooled = np.maximum.reduceat(probs, first, axis=0)
    edges = lo + bins[first] * (span / max_bins)
    edges = np.append(edges, hi + 1)
    return edges, np.concatenate([pooled, pooled[-1:]], axis=0)


def _section_intervals(events: Sequence[Mapping[str, Any]]) -> dict[str, np.ndarray]:
    ivs = label_intervals(events)
    return {s: ivs[s] for s in SECTIONS}


def _bars(iv: np.ndarray) -> list[tuple[int, int]]:
    # inclusive [start, end] -> (x, width); a one-frame event is 1 frame wide
    return [(int(s), int(e) - int(s) + 1) for s, e in iv]


def _fmt_score(v: Any) -> str:
    return "–" if v is None else f"{float(v):.2f}"


def draw_timeline(
    video_id: str,
    pred_events: Sequence[Mapping[str, Any]],
    gt_events: Sequence[Mapping[str, Any]] | None = None,
    probs: np.ndarray | None = None,
    frame_ids: np.ndarray | None = None,
    frame_units: FrameUnits | str = FrameUnits.FRAME_INDEX,
    scores: Mapping[str, Any] | None = None,
    figsize: tuple[float, float] = (16.0, 7.0),
    dpi: int = 100,
    max_bins: int = 2000,
) -> Any:
    """Draw one video's timeline and return the matplotlib ``Figure`` (not yet rendered).

    Layout: a section colour band on top (from the ground-truth sections when given, else from the predicted
    ones), then one lane per label in :data:`LABELS` order, top to bottom (anatomy in gut order, then
    pathology). In each lane the predicted events are a thick bar, the ground-truth events a thin bar below
    it, and the frame probability a faint max-pooled trace behind both. Touching events of a label are
    drawn as one bar with a thin white line at each boundary (see :func:`label_cuts`). With ``scores`` the
    title names the video's mAP and the right axis gives each label's AP at both thresholds.

    The lane axes carry the label ``"lanes"`` (``fig.axes``) and its y tick labels are the 17 label names in
    order; the band axes carry the label ``"sections"``.

    Args:
        video_id: the video id, named in the title.
        pred_events: the video's predicted events (challenge format, in ``frame_units``).
        gt_events: the video's ground-truth events, or ``None`` (inference).
        probs: optional (T, 17) frame probabilities in :data:`LABELS` order.
        frame_ids: (T,) frame ids of ``probs`` in ``frame_units``; required with ``probs``.
        frame_units: ``"frame_index"`` or ``"frame_number"``; names the frame axis.
        scores: optional per-video entry of :func:`monai_vce.metrics.temporal_map` (``"mAP@0.5"``,
            ``"mAP@0.95"``, ``"AP"``).
        figsize: figure size in inches; the PNG is ``figsize * dpi`` pixels.
        dpi: resolution used for the figure.
        max_bins: the most bins of each probability trace.

    Returns:
        A ``matplotlib.figure.Figure`` attached to an Agg canvas.

    Raises:
        ImportError: when matplotlib is not installed.
        ValueError: on probabilities and frame ids of different lengths or of the wrong width.
    """
    Figure, FigureCanvasAgg = require_matplotlib()
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch
    from matplotlib.ticker import FuncFormatter, MaxNLocator

    units = as_frame_units(frame_units)
    axis_name = "frame index" if units is FrameUnits.FRAME_INDEX else "frame number"
    pred_iv = label_intervals(pred_events)
    gt_iv = label_intervals(gt_events) if gt_events is not None else None

    trace = None
    if probs is not None:
        probs = np.asarray(probs)
        if frame_ids is None:
            raise ValueError(f"video {video_id}: probabilities given without their frame ids")
        frame_ids = np.asarray(frame_ids)
        if probs.ndim != 2 or probs.shape[1] != NUM_LABELS or len(frame_ids) != probs.shape[0]:
            raise ValueError(
                f"video {video_id}: probabilities of shape {tuple(probs.shape)} do not match "
                f"{len(frame_ids)} frame ids x {NUM_LABELS} labels"
            )
        if len(frame_ids):
            order = np.argsort(frame_ids, kind="stable")
            trace = max_pool_trace(frame_ids[order], probs[order], max_bins=max_bins)

    # frame range: everything drawn; the frame count is that of the video's frames when known (frame ids may skip)
    n_frames = len(frame_ids) if probs is not None and frame_ids is not None else None
    lo_hi = [iv for ivs in (pred_iv, gt_iv or {}) for iv in ivs.values() if len(iv)]
    lo = min([int(iv[0, 0]) for iv in lo_hi], default=None)
    hi = max([int(iv[:, 1].max()) + 1 for iv in lo_hi], default=None)
    if trace is not None:
        lo = int(trace[0][0]) if lo is None else min(lo, int(trace[0][0]))
        hi = int(trace[0][-1]) if hi is None else max(hi, int(trace[0][-1]))
    if lo is None or hi is None or hi <= lo:
        lo, hi = 0, max(1, hi or 1)

    fig = Figure(figsize=figsize, dpi=dpi)
    FigureCanvasAgg(fig)
    gs = fig.add_gridspec(
        2, 1, height_ratios=[0.75, NUM_LABELS], hspace=0.06, left=0.105, right=0.925, top=0.875, bottom=0.085
    )
    band = fig.add_subplot(gs[0])
    ax = fig.add_subplot(gs[1], sharex=band)
    band.set_label("sections")
    ax.set_label("lanes")

    # section band
    sec_iv = _section_intervals(gt_events if gt_events is not None else pred_events)
    for name in SECTIONS:
        if len(sec_iv[name]):
            band.broken_barh(_bars(sec_iv[name]), (0, 1), facecolors=SECTION_COLORS[name], edgecolor="none")
    band.set_ylim(0, 1)
    band.set_yticks([0.5], ["sections (GT)" if gt_events is not None else "sections (pred.)"], fontsize=8)
    band.tick_params(axis="y", length=0)
    band.tick_params(axis="x", labelbottom=False, length=0)
    for side in ("top", "right", "left", "bottom"):
        band.spines[side].set_visible(False)

    # lanes: lane i spans [i - 0.5, i + 0.5]; the y axis is inverted so LABELS[0] is on top
    ys = np.arange(NUM_LABELS)
    ax.axhspan(len(ANATOMY) - 0.5, NUM_LABELS - 0.5, color="#f4f4f4", zorder=0, lw=0)
    ax.axhline(len(ANATOMY) - 0.5, color="#999999", lw=0.8, zorder=1)
    if trace is not None:
        edges, values = trace
        for i in range(len(LABELS)):
            base = i + 0.45
            top = base - 0.85 * values[:, i]
            ax.fill_between(edges, base, top, step="post", color=PROB_COLOR, alpha=0.45, lw=0, zorder=2)
            # the outline keeps low, flat probabilities readable at a glance
            ax.step(edges, top, where="post", color=PROB_LINE_COLOR, lw=0.7, zorder=2)
    # event boundaries inside merged bars: one line collection per lane and source
    pred_cuts = label_cuts(pred_events)
    gt_cuts = label_cuts(gt_events) if gt_events is not None else None
    for i, name in enumerate(LABELS):
        if len(pred_cuts[name]):
            ax.vlines(pred_cuts[name], i - 0.32, i + 0.1, colors="white", lw=0.6, zorder=4)
        if gt_cuts is not None and len(gt_cuts[name]):
            ax.vlines(gt_cuts[name], i + 0.17, i + 0.37, colors="white", lw=0.6, zorder=4)
    for i, name in enumerate(LABELS):
        if len(pred_iv[name]):
            # the edge line keeps one-frame events visible when a pixel spans dozens of frames
            ax.broken_barh(
                _bars(pred_iv[name]), (i - 0.32, 0.42), facecolors=PRED_COLOR, edgecolor=PRED_COLOR, lw=0.6, zorder=3
            )
        if gt_iv is not None and len(gt_iv[name]):
            ax.broken_barh(
                _bars(gt_iv[name]), (i + 0.17, 0.2), facecolors=GT_COLOR, edgecolor=GT_COLOR, lw=0.6, zorder=3
            )
    ax.set_ylim(NUM_LABELS - 0.5, -0.5)
    ax.set_yticks(ys, list(LABELS), fontsize=9)
    for tick, name in zip(ax.get_yticklabels(), LABELS, strict=False):
        tick.set_color("#1a1a1a" if name in ANATOMY else "#7a1f1f")
    ax.tick_params(axis="y", length=0)
    ax.set_xlim(lo, hi)
    ax.xaxis.set_major_locator(MaxNLocator(nbins=12, integer=True))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{round(v):,}"))
    ax.set_xlabel(axis_name, fontsize=10)
    ax.grid(axis="x", color="#dddddd", lw=0.6, zorder=0)
    ax.set_axisbelow(True)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)

    # right axis: per-label AP of this video at both thresholds
    # a video id is data: cut to a readable length, and never parsed as mathtext ("$...$") or markup
    vid_text = str(video_id) if len(str(video_id)) <= 80 else str(video_id)[:77] + "..."
    title = f"video {vid_text}"
    if scores is not None:
        title += f"    mAP@0.5 = {float(scores['mAP@0.5']):.3f}    mAP@0.95 = {float(scores['mAP@0.95']):.3f}"
        ap = scores.get("AP", {})
        right = ax.twinx()
        right.set_label("ap")
        right.set_ylim(ax.get_ylim())
        right.set_yticks(
            ys,
            [f"{_fmt_score(ap.get(n, {}).get('0.5'))} / {_fmt_score(ap.get(n, {}).get('0.95'))}" for n in LABELS],
            fontsize=8,
            family="monospace",
        )
        right.tick_params(axis="y", length=0)
        right.set_ylabel("AP@0.5 / AP@0.95", fontsize=9)
        for side in ("top", "left"):
            right.spines[side].set_visible(False)
    fig.text(0.01, 0.965, title, fontsize=13, fontweight="bold", ha="left", va="center", parse_math=False)
    fig.text(
        0.01,
        0.925,
        (f"{n_frames:,} frames, " if n_frames is not None else "") + f"{axis_name} {lo:,} to {hi - 1:,}",
        fontsize=9,
        color="#555555",
        ha="left",
        va="center",
    )

    handles: list[Any] = [Patch(facecolor=PRED_COLOR, label="predicted events")]
    if gt_events is not None:
        handles.append(Patch(facecolor=GT_COLOR, label="ground truth"))
    if trace is not None:
        handles.append(Line2D([], [], color=PROB_LINE_COLOR, lw=1.5, label="frame probability (max-pooled)"))
    handles += [Patch(facecolor=SECTION_COLORS[s], label=s) for s in SECTIONS]
    fig.text(
        0.925,
        0.895,
        "white line: boundary between two consecutive events of a label",
        fontsize=7.5,
        color="#777777",
        ha="right",
        va="center",
    )
    fig.legend(
        handles=handles,
        loc="center right",
        bbox_to_anchor=(0.995, 0.945),
        ncol=len(handles),
        fontsize=8.5,
        frameon=False,
        handlelength=1.6,
        columnspacing=1.2,
    )
    return fig


def figure_to_png(fig: Any, palette: bool = True) -> bytes:
    """Render a figure to PNG bytes at its own size and dpi (no tight cropping, so the size is fixed).

    Args:
        fig: a figure attached to an Agg canvas (as returned by :func:`draw_timeline`).
        palette: store the image with an adaptive 256-colour palette; flat-coloured charts look the same and
            the file is several times smaller.
    """
    fig.canvas.draw()
    rgba = np.asarray(fig.canvas.buffer_rgba())
    from PIL import Image

    image = Image.fromarray(np.ascontiguousarray(rgba[..., :3]))
    if palette:
        image = image.quantize(colors=256, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE)
    buf = io.BytesIO()
    image.save(buf, format="PNG", optimize=True)
    return buf.getvalue()
