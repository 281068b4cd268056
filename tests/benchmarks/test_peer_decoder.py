"""``benchmarks/peer_decoder.py``: the peer decoder baseline of the decoding benchmark."""

from __future__ import annotations

import numpy as np
import pytest
from benchmark_scripts import load_benchmark

from monai_vce.events import Video
from monai_vce.labels import LABELS, SECTIONS
from monai_vce.metrics import temporal_map
from monai_vce.postprocessing import events_to_frames


@pytest.fixture(scope="module")
def peer():
    return load_benchmark("peer_decoder")


def _video(truth: np.ndarray, video_id: str = "v", noise: float = 0.0, seed: int = 0) -> Video:
    rng = np.random.default_rng(seed)
    probs = np.clip(truth * 0.96 + 0.02 + noise * rng.standard_normal(truth.shape), 0.0, 1.0).astype(np.float32)
    ids = np.arange(truth.shape[0])
    return Video(video_id, probs, ids, ids)


def _events(T: int = 300) -> list[dict]:
    return [
        {"start": 0, "end": 99, "label": ["stomach"]},
        {"start": 100, "end": 299, "label": ["small intestine"]},
        {"start": 140, "end": 159, "label": ["blood"]},
        {"start": 220, "end": 229, "label": ["ulcer"]},
    ]


def test_causal_ema_is_the_recursion(peer):
    p = np.random.default_rng(0).random((50, 3))
    s = peer.causal_ema(p, 0.1)
    ref = np.empty_like(p)
    ref[0] = p[0]
    for t in range(1, 50):
        ref[t] = 0.1 * p[t] + 0.9 * ref[t - 1]
    np.testing.assert_allclose(s, ref, rtol=1e-12)


def test_hysteresis_opens_high_and_closes_at_the_first_low_frame(peer):
    s = np.array([0.0, 0.5, 0.3, 0.06, 0.04, 0.3, 0.5, 0.2])[:, None]
    got = peer.hysteresis_mask(s, 0.4, 0.05)[:, 0]
    # no backward extension: frame 5 (0.3) waits for the opening frame 6
    assert got.tolist() == [False, True, True, True, False, False, True, True]


def test_sections_only_stay_or_step_forward_and_absorb_short_runs(peer):
    T = 60
    p = np.full((T, 5), 0.01)
    p[:20, 1] = 0.99  # esophagus
    p[20:23, 0] = 0.99  # 3 mouth frames: a step backward, impossible
    p[20:23, 1] = 0.01
    p[23:, 2] = 0.99  # stomach
    path = peer.monotone_sections(p, min_run=5)
    assert np.all(np.diff(path) >= 0) and np.all(np.diff(path) <= 1)
    runs = np.diff(np.flatnonzero(np.diff(np.concatenate([[-1], path, [-2]]))))
    assert runs.min() >= 5
    assert path[0] == 1 and path[-1] == 2


def test_two_state_model_counts_transitions_with_a_stay_bias(peer):
    y = np.zeros((100, len(LABELS)))
    y[40:60, LABELS.index("blood")] = 1
    log_pi, log_a = peer.fit_two_state([y])
    np.testing.assert_allclose(np.exp(log_a).sum(axis=2), 1.0)
    j = peer.OTHER.index(LABELS.index("blood"))
    counts = np.array([[78 + 1, 1 + 1], [1 + 1, 19 + 1]], dtype=float)  # 39 + 39 absent-absent pairs
    raw = np.log(counts / counts.sum(axis=1, keepdims=True))
    lengths = np.array([40, 20, 40])
    raw[[0, 1], [0, 1]] += 1.05 + np.log1p(np.median(lengths)) / 10
    np.testing.assert_allclose(log_a[j], raw - np.log(np.exp(raw).sum(axis=1, keepdims=True)))
    assert log_pi[j, 0] > log_pi[j, 1]


@pytest.mark.parametrize("config", ["published", "balanced", "strict", "hmm"])
def test_clean_probabilities_give_the_true_events(peer, config):
    events = _events()
    truth = events_to_frames(events, np.arange(300))
    video = _video(truth)
    decoder = peer.PeerDecoder(config)
    if config == "hmm":
        decoder.fit([truth])
    pred = decoder.decode(video)
    by_label = {e["label"][0]: (e["start"], e["end"]) for e in pred}
    assert set(by_label) == {"stomach", "small intestine", "blood", "ulcer"}
    # the causal moving averages lag: events start on time only up to their delay
    assert by_label["stomach"][0] == 0 and abs(by_label["stomach"][1] - 99) <= 2
    assert abs(by_label["blood"][0] - 140) <= 6 and abs(by_label["ulcer"][0] - 220) <= 6


def test_each_label_is_listed_best_first_and_gates_drop_implausible_sections(peer):
    truth = events_to_frames(_events(), np.arange(300))
    truth[20:40, LABELS.index("ulcer")] = 1  # in the stomach: allowed
    truth[250:270, LABELS.index("hematin")] = 1  # in the small intestine: gated out
    video = _video(truth)
    video.probs[20:40, LABELS.index("ulcer")] = 0.6  # weaker than the true ulcer at 220
    pred = peer.PeerDecoder("published").decode(video)
    ulcers = [e["start"] for e in pred if e["label"] == ["ulcer"]]
    assert len(ulcers) == 2 and ulcers[0] > 200
    order = [LABELS.index(e["label"][0]) for e in pred]
    assert order == sorted(order)
    assert any(e["label"] == ["hematin"] for e in pred)
    gated = peer.PeerDecoder("published", gate=True).decode(video)
    assert not any(e["label"] == ["hematin"] for e in gated)


def test_fitting_never_scores_below_its_start_on_the_tuning_videos(peer):
    events = _events()
    videos, gts = [], []
    for i in range(4):
        truth = events_to_frames(events, np.arange(300))
        if i % 2:
            truth[:, LABELS.index("ulcer")] = 0
        videos.append(_video(truth, f"v{i}", noise=0.25, seed=i))
        gts.append({"video_id": f"v{i}", "events": [e for e in events if i % 2 == 0 or e["label"] != ["ulcer"]]})
    gt = {"videos": gts}
    start = temporal_map(gt, peer.PeerDecoder("balanced").decode_videos(videos))
    fitted, objective = peer.fit_peer_decoder(videos, gt, rounds=1)
    res = temporal_map(gt, fitted.decode_videos(videos))
    assert objective == pytest.approx((res["mAP@0.5"] + res["mAP@0.95"]) / 2)
    assert objective >= (start["mAP@0.5"] + start["mAP@0.95"]) / 2
    assert set(fitted.config) == set(LABELS) and all(n in fitted.config for n in SECTIONS)


def test_an_unknown_configuration_is_refused_and_hmm_needs_fit(peer):
    with pytest.raises(ValueError, match="config must be one of"):
        peer.PeerDecoder("loose")
    with pytest.raises(RuntimeError, match="needs fit"):
        peer.PeerDecoder("hmm").decode(_video(np.zeros((20, len(LABELS)))))
