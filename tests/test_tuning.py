"""Decoder tuning on simulated probabilities of real Galar timelines (truncated so that the test is fast)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from monai_vce.labels import LABELS, NUM_LABELS
from monai_vce.metrics import temporal_map
from monai_vce.postprocessing import (
    DecoderParams,
    EventDecoder,
    decode_videos,
    events_to_frames,
    frames_to_events,
    simulate_probabilities,
    tune_decoder,
)
from monai_vce.postprocessing.tuning import label_segments

GALAR = Path(__file__).resolve().parents[2] / "shared" / "data" / "galar_events.json"


def test_label_segments_with_breaks():
    m = np.array([0, 1, 1, 1, 1, 0, 1, 1], bool)[:, None]
    b = np.zeros(8, bool)
    b[3] = True
    ks, first, last = label_segments(m, b)
    assert list(zip(first.tolist(), last.tolist())) == [(1, 2), (3, 4), (6, 7)]
    assert ks.tolist() == [0, 0, 0]


def test_simulation_is_reproducible_and_informative():
    truth = np.zeros((2000, NUM_LABELS), bool)
    truth[:1000, 2] = truth[1000:, 3] = True
    truth[500:600, LABELS.index("ulcer")] = True
    a = simulate_probabilities(truth, "low", seed=3)
    np.testing.assert_array_equal(a, simulate_probabilities(truth, "low", seed=3))
    assert a.dtype == np.float32 and a.shape == truth.shape and np.isfinite(a).all()
    # positives score higher on average than negatives for every labelled class; more noise, less separation
    for level in ("low", "high"):
        p = simulate_probabilities(truth, level, seed=0)
        for c in (2, 3, LABELS.index("ulcer")):
            assert p[truth[:, c], c].mean() > p[~truth[:, c], c].mean() + 0.2
    gap = lambda p: p[truth[:, 2], 2].mean() - p[~truth[:, 2], 2].mean()  # noqa: E731
    assert gap(simulate_probabilities(truth, "low", seed=0)) > gap(simulate_probabilities(truth, "high", seed=0))
    with pytest.raises(ValueError, match="unknown noise level"):
        simulate_probabilities(truth, "extreme")


def _truncated_videos(n_videos: int, frames: int):
    """The first ``frames`` frames of real timelines (events clipped), resampled 1 in 4 to keep them small."""
    data = json.loads(GALAR.read_text())
    out = []
    for v in data["videos"][:n_videos]:
        ids = np.arange(0, frames * 4, 4)
        truth = events_to_frames(v["events"], ids)
        # ground truth of the resampled video, in index units of the resampled rows
        out.append((v["video_id"], truth, frames_to_events(truth, np.arange(frames))))
    return out


@pytest.mark.skipif(not GALAR.is_file(), reason=f"real Galar timelines not found at {GALAR}")
def test_tuned_decoder_beats_paper_chain_on_held_out_videos(tmp_path):
    videos = _truncated_videos(16, 6000)
    sim = {}
    for j, (vid, truth, events) in enumerate(videos):
        sim[vid] = (simulate_probabilities(truth, "low", seed=j), np.arange(truth.shape[0]), events)
    ids = list(sim)
    tune_ids, test_ids = ids[:10], ids[10:]
    grids = {"threshold": (0.3, 0.5, 0.7), "median_window": (1, 7, 25), "max_gap": (0, 5, 20), "min_length": (0, 5, 20)}
    params = tune_decoder([sim[k] for k in tune_ids], grids=grids, rounds=1)
    assert params["fit"]["videos"] == 10 and 0.0 <= params["fit"]["mAP@0.5"] <= 1.0
    # the fitted parameters survive a JSON round trip and decode the same
    path = params.save(tmp_path / "decoder.json")
    assert DecoderParams.load(path) == params

    gt = {"videos": [{"video_id": k, "events": sim[k][2]} for k in test_ids]}
    held_out = {k: sim[k][:2] for k in test_ids}
    paper = temporal_map(gt, decode_videos(held_out, EventDecoder(DecoderParams.paper())))
    tuned = temporal_map(gt, decode_videos(held_out, EventDecoder(path)))
    for key in ("mAP@0.5", "mAP@0.95"):
        assert tuned[key] > paper[key] + 0.05, (key, tuned[key], paper[key])


def test_tune_decoder_errors():
    with pytest.raises(ValueError, match="at least one validation video"):
        tune_decoder([])
    p = np.full((10, NUM_LABELS), 0.5)
    p[4, 2] = np.inf
    with pytest.raises(ValueError, match="video '0'.*frame 4"):
        tune_decoder([(p, np.arange(10), [])])
    with pytest.raises(ValueError, match="grids: unknown parameter"):
        tune_decoder([(np.full((10, NUM_LABELS), 0.5), np.arange(10), [])], grids={"window": (1,)})
