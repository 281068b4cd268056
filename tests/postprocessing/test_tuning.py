"""Decoder tuning on simulated probabilities of real Galar timelines (truncated so that the test is fast)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import GALAR_EVENTS as GALAR
from conftest import GALAR_MISSING

from monai_vce.events import Video
from monai_vce.labels import LABELS, NUM_LABELS, SECTIONS
from monai_vce.metrics import temporal_map
from monai_vce.postprocessing import (
    DEFAULT_ANATOMY_GRID,
    DecoderParams,
    EventDecoder,
    decode_videos,
    events_to_frames,
    frames_to_events,
    simulate_probabilities,
    tune_decoder,
)
from monai_vce.postprocessing.gating import cross_validate_presence, video_folds
from monai_vce.postprocessing.tuning import label_segments


def test_label_segments_with_breaks():
    m = np.array([0, 1, 1, 1, 1, 0, 1, 1], bool)[:, None]
    b = np.zeros(8, bool)
    b[3] = True
    ks, first, last = label_segments(m, b)
    assert list(zip(first.tolist(), last.tolist(), strict=False)) == [(1, 2), (3, 4), (6, 7)]
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


def _resampled_videos(n_videos: int, frames: int):
    """Whole real timelines resampled to about ``frames`` rows each (every section and the lead-in kept)."""
    data = json.loads(GALAR.read_text())
    out = []
    for v in data["videos"][:n_videos]:
        T = max(e["end"] for e in v["events"]) + 1
        ids = np.unique(np.linspace(0, T - 1, frames).astype(np.int64))
        truth = events_to_frames(v["events"], ids)
        # ground truth of the resampled video, in index units of the resampled rows
        out.append((v["video_id"], truth, frames_to_events(truth, np.arange(ids.size))))
    return out


@pytest.mark.skipif(not GALAR.is_file(), reason=GALAR_MISSING)
@pytest.mark.parametrize("level", ["low", "medium", "high"])
def test_tuned_decoder_beats_paper_chain_and_empty_on_held_out_videos(tmp_path, level):
    videos = _resampled_videos(36, 2500)
    sim = {}
    for j, (vid, truth, events) in enumerate(videos):
        rows = np.arange(truth.shape[0])
        sim[vid] = Video(vid, simulate_probabilities(truth, level, seed=j), rows, rows, events=events)
    ids = list(sim)
    tune_ids, test_ids = ids[:20], ids[20:]
    grids = {"threshold": (0.3, 0.5, 0.7), "median_window": (1, 9, 25), "max_gap": (0, 5, 20), "min_length": (0, 5, 20)}
    params = tune_decoder([sim[k] for k in tune_ids], grids=grids, rounds=1)
    fit = params["fit"]
    assert fit["videos"] == 20 and fit["presence_folds"] == 5 and 0.0 <= fit["mAP@0.5"] <= 1.0
    assert len(fit["anatomy_objective"]) == len(DEFAULT_ANATOMY_GRID) and params["anatomy"]["entry_cost"] == 0.0
    assert params["composition"] == "per_label"  # the challenge profile's own
    # a label is emitted only when it won out of fold (weighted over the thresholds) and lost at none
    for name, record in fit["out_of_fold_gain"].items():
        emitted = params["labels"][name]["presence"]["feature"] != "never"
        assert emitted == record["emit"], (name, record)
        if abs(record["weighted_gain"] - record["weighted_needed"]) > 1e-3:  # recorded values are rounded
            wins = record["weighted_gain"] > record["weighted_needed"] and all(
                g >= -n - 1e-3 for g, n in zip(record["gain"], record["needed"], strict=False)
            )
            assert emitted == wins, (name, record)
    # the fitted parameters survive a JSON round trip and decode the same
    path = params.save(tmp_path / "decoder.json")
    assert DecoderParams.load(path) == params

    gt = {"videos": [{"video_id": k, "events": sim[k].events} for k in test_ids]}
    held_out = [sim[k] for k in test_ids]
    paper = temporal_map(gt, decode_videos(held_out, EventDecoder(DecoderParams.paper())))
    empty = temporal_map(gt, {"videos": [{"video_id": k, "events": []} for k in test_ids]})
    tuned = temporal_map(gt, decode_videos(held_out, EventDecoder(path)))
    for key in ("mAP@0.5", "mAP@0.95"):
        assert tuned[key] > paper[key] + 0.05, (key, tuned[key], paper[key])
        assert tuned[key] >= empty[key], (key, tuned[key], empty[key])
    # the anatomy alone carries information here: the sections beat leaving them out
    assert tuned["mAP@0.5"] > empty["mAP@0.5"] + 0.02


def test_cross_validated_emission_rejects_chance_rules():
    # a label absent from half the videos, with a feature unrelated to presence: in-sample a cutoff finds
    # chance wins, out of fold it does not beat leaving the label out
    rng = np.random.default_rng(0)
    V = 40
    absent = np.arange(V) % 2 == 0
    ap = np.where(absent, 0.0, rng.uniform(0.0, 0.3, V))[:, None].repeat(2, axis=1)
    noise = [({"feature": "peak", "window": 1}, rng.random(V))]
    folds = video_folds(V, 5, seed=0)
    oof = cross_validate_presence([(noise, ap)], absent, [1.0, 1.0], folds)
    assert oof.mean(0).max() <= absent.mean()
    # an informative feature (higher where the label is present) wins out of fold
    informative = [({"feature": "peak", "window": 1}, np.where(absent, 0.2, 0.8) + 0.05 * rng.random(V))]
    oof = cross_validate_presence([(informative, ap)], absent, [1.0, 1.0], folds)
    assert np.all(oof.mean(0) > absent.mean() + 0.05)
    assert sorted(np.bincount(folds).tolist()) == [8] * 5


def test_tune_decoder_errors():
    with pytest.raises(ValueError, match="at least one validation video"):
        tune_decoder([])
    p = np.full((10, NUM_LABELS), 0.5)
    p[4, 2] = np.inf
    with pytest.raises(ValueError, match=r"video '0'.*frame 4"):
        tune_decoder([Video("0", p, np.arange(10), np.arange(10), events=[])])
    with pytest.raises(ValueError, match="grids: unknown parameter"):
        tune_decoder(
            [Video("0", np.full((10, NUM_LABELS), 0.5), np.arange(10), np.arange(10), events=[])],
            grids={"window": (1,)},
        )
    with pytest.raises(ValueError, match="video '0': no ground-truth events"):
        tune_decoder([Video("0", np.full((10, NUM_LABELS), 0.5), np.arange(10), np.arange(10))])


def _authors_chain(probs, thresholds, smooth_w=7, min_len=3, merge_gap=5):
    """The authors' ``process_predictions`` transcribed loop by loop: the reference of the ``authors`` profile."""
    from scipy.ndimage import median_filter

    bp = (probs >= thresholds).astype(int)
    for c in range(bp.shape[1]):
        bp[:, c] = (median_filter(bp[:, c].astype(float), size=smooth_w) > 0.5).astype(int)
    for c in range(bp.shape[1]):
        in_ev, st = False, 0
        for i in range(len(bp)):
            if bp[i, c] == 1 and not in_ev:
                in_ev, st = True, i
            elif bp[i, c] == 0 and in_ev:
                in_ev = False
                if i - st < min_len:
                    bp[st:i, c] = 0
        if in_ev and len(bp) - st < min_len:
            bp[st:, c] = 0
    for c in range(bp.shape[1]):
        in_ev, last_end = False, 0
        for i in range(len(bp)):
            if bp[i, c] == 1:
                if not in_ev and i - last_end <= merge_gap and last_end > 0:
                    bp[last_end:i, c] = 1
                in_ev = True
            elif in_ev:
                last_end, in_ev = i, False
    events, cur, start = [], None, 0
    for i in range(len(bp) + 1):
        s = tuple(sorted(LABELS[c] for c in np.flatnonzero(bp[i]))) if i < len(bp) else None
        if s != cur:
            if cur:  # the authors also write the label-free runs, which score nothing
                events.append((start, i - 1, cur))
            cur, start = s, i
    return events


@pytest.mark.parametrize("profile", ["paper", "authors"])
def test_fixed_profiles_keep_the_thresholds_and_decode_the_chain(profile):
    rng = np.random.default_rng(1)
    T = 600
    # runs of random lengths with flicker; the first and last frames empty (the authors' median reflects there)
    probs = np.where(rng.random((T // 6, NUM_LABELS)) < 0.3, 0.8, 0.1).repeat(6, axis=0)
    probs = np.clip(probs + rng.normal(0, 0.25, probs.shape), 0, 1)
    probs[:4] = probs[-4:] = 0.0
    thresholds = {name: float(t) for name, t in zip(LABELS, rng.uniform(0.3, 0.7, NUM_LABELS), strict=True)}
    rows = np.arange(T)
    video = Video("v", probs, rows, rows, events=[{"start": 10, "end": 40, "label": ["ulcer"]}])
    params = tune_decoder([video], base=DecoderParams.from_thresholds(thresholds), profile=profile)
    assert dict(zip(LABELS, params.per_label("threshold").tolist(), strict=True)) == pytest.approx(thresholds)
    for key, value in {"median_window": 7, "max_gap": 5, "min_length": 3}.items():
        assert params.per_label(key).tolist() == [value] * NUM_LABELS
    assert params["ranking"] == "none" and not params["anatomy"]["enabled"] and params["composition"] == "label_set"
    assert params["fit"]["profile"] == profile and 0.0 <= params["fit"]["mAP@0.5"] <= 1.0
    assert [p["feature"] for p in params.presence_rules()] == ["none"] * NUM_LABELS
    events = EventDecoder(params)(probs, rows)
    got = [(e["start"], e["end"], tuple(sorted(e["label"]))) for e in events]
    if profile == "authors":
        assert got == _authors_chain(probs, np.array(list(thresholds.values())))
    else:
        assert list(params["order"]) == ["threshold", "median", "fill_gaps", "min_length"]
        assert got == sorted(got)  # time order
    with pytest.raises(ValueError, match="unknown decoder profile"):
        tune_decoder([video], profile="leaderboard")


def test_anatomy_grid_tries_the_lead_in_where_the_sections_are_decided():
    from monai_vce.postprocessing.tuning import _with_lead_in

    grid = [{"switch_cost": 1.0}, {"switch_cost": 2.0, "lead_in_logit": 0.5}]
    calibrated = DecoderParams.from_thresholds({"ulcer": 0.2})  # sections at 0.5: one level, 0
    assert _with_lead_in(grid, calibrated) == [{"switch_cost": 1.0, "lead_in_logit": 0.0}, grid[1]]
    shifted = DecoderParams.from_thresholds(dict.fromkeys(SECTIONS, 0.25))
    level = round(float(np.log(0.25 / 0.75)), 4)
    assert _with_lead_in(grid, shifted) == [
        {"switch_cost": 1.0, "lead_in_logit": 0.0},
        {"switch_cost": 1.0, "lead_in_logit": level},
        grid[1],
    ]
