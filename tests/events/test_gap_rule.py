"""The gap rule (:func:`monai_vce.events.runs.run_spans`) against a row-by-row reference, on the 80 real timelines."""

from __future__ import annotations

import json

import numpy as np
import pytest

from monai_vce.data.synthetic import find_galar_events
from monai_vce.events import Video, events_to_frames, ground_truth_events
from monai_vce.events.runs import run_bounds, run_spans
from monai_vce.labels import LABELS, NUM_LABELS
from monai_vce.postprocessing import DecoderParams, EventDecoder, decode_videos

_BITS = 1 << np.arange(NUM_LABELS, dtype=np.int64)


def _reference_events(ids: np.ndarray, active: np.ndarray, keep_empty: bool = True) -> list[dict]:
    """The challenge's rule, one row at a time: consecutive rows with one label set form an event, which ends one
    frame before the next row's id (the last event at the last row's id)."""
    codes = (active.astype(np.int64) * _BITS).sum(axis=1).tolist()
    out, i, n = [], 0, len(codes)
    while i < n:
        j = i
        while j + 1 < n and codes[j + 1] == codes[i]:
            j += 1
        end = int(ids[j + 1]) - 1 if j + 1 < n else int(ids[-1])
        labels = sorted(LABELS[c] for c in range(NUM_LABELS) if codes[i] >> c & 1)
        if labels or keep_empty:
            out.append({"start": int(ids[i]), "end": end, "label": labels})
        i = j + 1
    return out


def _reference_spans(ids: np.ndarray, start: np.ndarray, stop: np.ndarray) -> tuple[list[int], list[int]]:
    first = [int(ids[a]) for a in start]
    last = [int(ids[b]) - 1 if b < len(ids) else int(ids[-1]) for b in stop]
    return first, last


def _frame_ids(rng: np.random.Generator, length: int) -> np.ndarray:
    """Random strictly increasing frame ids inside ``[0, length)``: a few rows or many, with gaps of every size
    (single missing frames, long holes, a dense stretch)."""
    kind = rng.integers(3)
    if kind == 0:  # sparse: a few hundred rows anywhere
        ids = rng.choice(length, size=min(length, int(rng.integers(2, 400))), replace=False)
    elif kind == 1:  # dense with random single-frame and short gaps
        lo = int(rng.integers(0, max(1, length - 3000)))
        ids = np.arange(lo, min(length, lo + 3000))
        ids = ids[rng.random(ids.size) > rng.uniform(0.01, 0.3)]
    else:  # steps of 1 to 40 frames from a random start
        ids = int(rng.integers(0, 50)) + np.cumsum(rng.integers(1, 41, size=int(rng.integers(2, 2000))))
        ids = ids[ids < length]
    ids = np.unique(ids).astype(np.int64)
    return ids if ids.size else np.array([0], np.int64)


@pytest.fixture(scope="module")
def timelines() -> list[dict]:
    path = find_galar_events()
    if path is None:
        pytest.skip("the real Galar timelines (galar_events.json) are not available; set MONAI_VCE_GALAR_EVENTS")
    videos = json.loads(path.read_text())["videos"]
    assert len(videos) == 80
    return videos


def test_run_spans_equals_the_reference_on_random_runs():
    rng = np.random.default_rng(0)
    for _ in range(500):
        ids = _frame_ids(rng, int(rng.integers(1, 5000)))
        cuts = np.unique(rng.integers(0, ids.size + 1, size=int(rng.integers(0, 20))))
        bounds = np.unique(np.r_[0, cuts, ids.size])
        start, stop = bounds[:-1], bounds[1:]
        first, last = run_spans(ids, start, stop)
        assert (first.tolist(), last.tolist()) == _reference_spans(ids, start, stop)
    empty = run_spans(np.arange(5), np.zeros(0, np.int64), np.zeros(0, np.int64))
    assert empty[0].size == 0 and empty[1].size == 0


def test_gap_rule_equals_the_reference_on_the_real_timelines(timelines):
    """Ground truth, decoder and tuner spans on many frame-id arrays with gaps drawn over each of the 80 videos."""
    rng = np.random.default_rng(26)
    raw = EventDecoder(DecoderParams({"order": ["threshold"], "ranking": "none"}).with_anatomy(gate_landmarks=False))
    draws = 0
    for v in timelines:
        length = max(e["end"] for e in v["events"]) + 1
        for _ in range(4):
            ids = _frame_ids(rng, length)
            active = events_to_frames(v["events"], ids)
            # the ground-truth builder, with and without the events of unlabelled rows
            for keep in (True, False):
                want = _reference_events(ids, active, keep_empty=keep)
                assert ground_truth_events(ids, active, keep_empty=keep, video_id=v["video_id"]) == want
            # the decoder's composition (label sets of the thresholded rows) ends its events by the same rule
            probs = active.astype(np.float32)
            decoded = decode_videos([Video(v["video_id"], probs, ids, ids)], raw)["videos"][0]["events"]
            assert [{k: e[k] for k in ("start", "end", "label")} for e in decoded] == _reference_events(
                ids, active, keep_empty=False
            )
            # per-label runs, as the tuner scores them
            col, start, stop = run_bounds(active)
            first, last = run_spans(ids, start, stop)
            assert (first.tolist(), last.tolist()) == _reference_spans(ids, start, stop)
            assert col.size == 0 or np.all(np.diff(col) >= 0)
            draws += 1
    assert draws == 320


def test_gap_free_rows_rebuild_the_real_ground_truth(timelines):
    """On every frame of a video (no gaps) the rule gives back the challenge's own events of the 80 videos."""
    for v in timelines:
        ids = np.arange(max(e["end"] for e in v["events"]) + 1)
        rebuilt = ground_truth_events(ids, events_to_frames(v["events"], ids), keep_empty=False)
        labelled = [e for e in v["events"] if e["label"]]
        assert rebuilt == [{**e, "label": sorted(e["label"])} for e in labelled], v["video_id"]
