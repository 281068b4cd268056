"""Landmarks never spread over a section: without anatomy decoding the decoder and the tuner keep the landmark
columns near a boundary of the decoded sections, so section events are never cut into pieces by a landmark."""

from __future__ import annotations

import itertools
import json

import numpy as np

from monai_vce.data.synthetic import builtin_timeline
from monai_vce.events import Video
from monai_vce.labels import LABELS, LANDMARKS, NUM_LABELS, SECTIONS
from monai_vce.postprocessing import (
    DecoderParams,
    EventDecoder,
    events_to_frames,
    frames_to_events,
    simulate_probabilities,
    tune_decoder,
)

WINDOW = 5
GRIDS = {"threshold": (0.1, 0.5), "median_window": (1, 9), "max_gap": (0, 5), "min_length": (0, 5)}
LANDMARK_COLUMNS = [LABELS.index(n) for n in LANDMARKS]


def _landmark_frames(events: list, label: str, T: int) -> np.ndarray:
    return events_to_frames(events, np.arange(T))[:, LABELS.index(label)]


def test_decoder_keeps_a_low_threshold_landmark_near_the_section_boundary():
    T = 400
    probs = np.full((T, NUM_LABELS), 0.02, np.float32)
    probs[:200, LABELS.index("stomach")] = 0.9
    probs[200:, LABELS.index("small intestine")] = 0.9
    probs[:, LABELS.index("pylorus")] = 0.3  # above a threshold of 0.1 on every frame of the exam
    params = DecoderParams.paper(anatomy={"enabled": False, "landmark_window": WINDOW}).with_label(
        "pylorus", threshold=0.1
    )
    events = EventDecoder(params)(probs, np.arange(T), video_id="v")
    pylorus = np.flatnonzero(_landmark_frames(events, "pylorus", T))
    assert pylorus.size and pylorus.min() >= 200 - WINDOW and pylorus.max() < 200 + WINDOW, pylorus
    # the small intestine is one event after the landmark's window, not cut into pieces along the exam
    si = [e for e in events if e["label"] == ["small intestine"]]
    assert len(si) == 1 and si[0]["end"] == T - 1
    # without the gate, the landmark spreads over the whole exam (what the gate prevents)
    ungated = EventDecoder(params.with_anatomy(gate_landmarks=False))(probs, np.arange(T), video_id="v")
    assert _landmark_frames(ungated, "pylorus", T).all()


def _check_landmarks(videos: dict, params: DecoderParams, window: int) -> None:
    """Every decoded landmark frame lies near a boundary of the sections the decoder emitted."""
    decoder = EventDecoder(params)
    sec_cols = [LABELS.index(s) for s in SECTIONS]
    for vid, v in videos.items():
        probs, ids = v.probs, v.frame_index
        frames = events_to_frames(decoder.decode(v), ids)
        emitted = frames[:, sec_cols]
        last = np.maximum.accumulate(np.where(emitted.any(1), np.arange(len(ids)), -1))
        best = np.where(emitted, probs[:, sec_cols], -1.0).argmax(1)  # overlapping sections: the most probable
        sec = np.where(last >= 0, best[np.maximum(last, 0)], -1)
        edges = np.flatnonzero(np.diff(sec) != 0) + 1
        for name in LANDMARKS:
            on = np.flatnonzero(frames[:, LABELS.index(name)])
            if on.size:
                assert edges.size, (vid, name)
                dist = np.abs(on[:, None] - edges[None, :]).min(1)
                assert dist.max() <= window + 1, (vid, name, int(dist.max()), params["labels"][name])


def _check_tuned_landmarks(videos: dict, window: int) -> None:
    """Without anatomy decoding (the demo's setting): the tuned decoder, and every chain setting of the grid the
    tuner chooses from with the landmarks emitted, keep the landmarks near the emitted section boundaries."""
    base = DecoderParams.paper(anatomy={"enabled": False, "landmark_window": window})
    tuned = tune_decoder(videos, base=base, anatomy=False, grids=GRIDS, rounds=1, presence_folds=0)
    _check_landmarks(videos, tuned, window)
    for values in itertools.product(*GRIDS.values()):
        setting = dict(zip(GRIDS, values, strict=True), presence={"feature": "none"})
        params = tuned
        for name in LANDMARKS:
            params = params.with_label(name, **setting)
        _check_landmarks(videos, params, window)


def _simulated(truths: list[np.ndarray], level: str) -> dict:
    out = {}
    for j, truth in enumerate(truths):
        ids = np.arange(truth.shape[0])
        probs = simulate_probabilities(truth, level, seed=j)
        # landmark scores that carry no location (as an undertrained model's): every threshold ties, and a low one
        # marks the landmark on every frame unless the gate keeps it near a boundary
        rng = np.random.default_rng(j)
        probs[:, LANDMARK_COLUMNS] = rng.uniform(0.2, 0.4, (truth.shape[0], len(LANDMARK_COLUMNS)))
        out[str(j)] = Video(str(j), probs, ids, ids, events=frames_to_events(truth, ids))
    return out


def test_tuner_never_spreads_landmarks_on_generated_timelines():
    truths = [builtin_timeline(600, np.random.default_rng(i)) for i in range(8)]
    _check_tuned_landmarks(_simulated(truths, "high"), WINDOW)


def test_tuner_never_spreads_landmarks_on_real_timelines(galar_events_path):
    truths = []
    for v in json.loads(galar_events_path.read_text())["videos"][:8]:
        T = max(e["end"] for e in v["events"]) + 1
        truths.append(events_to_frames(v["events"], np.unique(np.linspace(0, T - 1, 800).astype(np.int64))))
    _check_tuned_landmarks(_simulated(truths, "high"), WINDOW)
