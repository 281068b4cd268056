"""Exact tests of the sqrt-frequency samplers: analytic weights and expected class shares, empirical draws."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch.utils.data import DistributedSampler as TorchDistributedSampler

from monai_vce.data import DistributedSqrtFrequencySampler, SqrtFrequencySampler

# single-label frames: class counts (4 classes) plus all-negative frames
COUNTS = {0: 5000, 1: 1000, 2: 100, 3: 10}
N_NONE = 2000


def _single_label_datalist():
    data = []
    for c, n in COUNTS.items():
        for _ in range(n):
            lab = [0.0] * 5
            lab[c] = 1.0
            data.append({"label": lab, "video_id": "v", "frame_index": len(data)})
    for _ in range(N_NONE):
        data.append({"label": [0.0] * 5, "video_id": "v", "frame_index": len(data)})
    # class 4 never occurs
    return data


def _expected_shares():
    """For single-label frames each group g of size n_g has weight (n_g/N)^-1/2, so its share is sqrt(n_g)/sum sqrt."""
    groups = {**COUNTS, "none": N_NONE}
    total = sum(math.sqrt(n) for n in groups.values())
    return {g: math.sqrt(n) / total for g, n in groups.items()}


def test_single_label_weights_and_expected_shares_exact():
    data = _single_label_datalist()
    n = len(data)
    s = SqrtFrequencySampler(data, seed=0)
    # weights: frame of class c -> (n_c / N) ** -0.5
    w = s.weights.numpy()
    assert w[0] == pytest.approx((COUNTS[0] / n) ** -0.5)
    assert w[-1] == pytest.approx((N_NONE / n) ** -0.5)
    eff = s.effective_class_frequencies()
    expected = _expected_shares()
    for c in COUNTS:
        assert eff["original"][c] == pytest.approx(COUNTS[c] / n)
        assert eff["sampled"][c] == pytest.approx(expected[c], rel=1e-12)
        assert eff["oversampling"][c] == pytest.approx(expected[c] / (COUNTS[c] / n), rel=1e-12)
    assert eff["sampled"][4] == 0 and np.isnan(eff["oversampling"][4])
    assert eff["none_original"] == pytest.approx(N_NONE / n)
    assert eff["none_sampled"] == pytest.approx(expected["none"], rel=1e-12)
    # the rarest class is oversampled by sqrt(N / n_3) / sum_g sqrt(n_g / N) * ... i.e. by > 10x here
    assert eff["oversampling"][3] > 10


def test_empirical_draws_match_expected_within_sampling_error():
    data = _single_label_datalist()
    num = 200_000
    s = SqrtFrequencySampler(data, num_samples=num, seed=123)
    idx = np.fromiter(iter(s), dtype=np.int64)
    assert idx.shape == (num,) and len(s) == num
    labels = np.asarray([d["label"] for d in data])
    drawn = labels[idx]
    expected = _expected_shares()
    for c in COUNTS:
        p = expected[c]
        se = math.sqrt(p * (1 - p) / num)
        emp = drawn[:, c].mean()
        assert abs(emp - p) < 4 * se, (c, emp, p, se)
        # and the oversampling factor of the rare class
        assert abs(emp / (COUNTS[c] / len(data)) - p / (COUNTS[c] / len(data))) < 4 * se / (COUNTS[c] / len(data))
    p = expected["none"]
    emp = (drawn.sum(axis=1) == 0).mean()
    assert abs(emp - p) < 4 * math.sqrt(p * (1 - p) / num)


def test_multi_label_combine_max_and_mean():
    # 10 frames: f = [0.5, 0.2, 0.1]; frame weights by hand
    labels = np.zeros((10, 3))
    labels[:5, 0] = 1
    labels[[0, 1], 1] = 1
    labels[0, 2] = 1
    data = [{"label": row.tolist()} for row in labels]
    f = np.array([0.5, 0.2, 0.1])
    f_none = 5 / 10
    cw = f**-0.5
    smax = SqrtFrequencySampler(data, combine="max", seed=0)
    expected_max = np.array([cw[2], cw[1], cw[0], cw[0], cw[0]] + [f_none**-0.5] * 5)
    np.testing.assert_allclose(smax.weights.numpy(), expected_max, rtol=1e-12)
    smean = SqrtFrequencySampler(data, combine="mean", seed=0)
    expected_mean = np.array(
        [(cw[0] + cw[1] + cw[2]) / 3, (cw[0] + cw[1]) / 2, cw[0], cw[0], cw[0]] + [f_none**-0.5] * 5
    )
    np.testing.assert_allclose(smean.weights.numpy(), expected_mean, rtol=1e-12)
    eff = smax.effective_class_frequencies()
    p = expected_max / expected_max.sum()
    np.testing.assert_allclose(eff["sampled"], p @ labels, rtol=1e-12)
    # exponent 1: inverse frequency; exponent 0: uniform
    s1 = SqrtFrequencySampler(data, exponent=1.0, seed=0)
    assert s1.weights[0].item() == pytest.approx(10.0)
    s0 = SqrtFrequencySampler(data, exponent=0.0, seed=0)
    assert torch.all(s0.weights == 1)


def test_epochs_determinism_and_state():
    data = _single_label_datalist()
    a = SqrtFrequencySampler(data, num_samples=500, seed=7)
    b = SqrtFrequencySampler(data, num_samples=500, seed=7)
    a.set_epoch(3)
    b.set_epoch(3)
    ia, ib = list(a), list(b)
    assert ia == ib
    a.set_epoch(4)
    assert list(a) != ia
    # without set_epoch the epoch advances by itself
    c = SqrtFrequencySampler(data, num_samples=500, seed=7)
    first, second = list(c), list(c)
    assert first != second
    # resume: the state reproduces the next draw
    d = SqrtFrequencySampler(data, num_samples=500, seed=1)
    d.load_state_dict(c.state_dict())
    assert list(d) == list(c)
    # without replacement: a permutation subset
    e = SqrtFrequencySampler(data, num_samples=100, replacement=False, seed=0)
    assert len(set(e)) == 100


def test_bad_datalists():
    # the datalist is read on first use: the errors come with the first draw
    with pytest.raises(ValueError, match=r"item 1 .*video v1, frame 5.* no 'label'"):
        list(SqrtFrequencySampler([{"label": [1.0, 0.0]}, {"video_id": "v1", "frame_index": 5}]))
    with pytest.raises(ValueError, match="different lengths"):
        list(SqrtFrequencySampler([{"label": [1.0, 0.0]}, {"label": [1.0]}]))
    with pytest.raises(ValueError, match="empty"):
        list(SqrtFrequencySampler([]))
    with pytest.raises(ValueError, match="combine"):
        SqrtFrequencySampler([{"label": [1.0]}], combine="sum")
    with pytest.raises(ValueError, match="exceeds"):
        list(SqrtFrequencySampler([{"label": [1.0]}], num_samples=3, replacement=False))


def test_distributed_variant_exact_per_rank_expectation():
    data = _single_label_datalist()
    labels = np.asarray([d["label"] for d in data])
    w_ref = SqrtFrequencySampler(data, seed=0).weights.numpy()
    num = 60_000
    for rank in (0, 1):
        s = DistributedSqrtFrequencySampler(data, num_samples_per_rank=num, num_replicas=2, rank=rank, seed=5)
        s.set_epoch(2)
        idx = np.fromiter(iter(s), dtype=np.int64)
        assert len(s) == num and idx.shape == (num,)
        np.testing.assert_allclose(np.asarray(s.weights), w_ref)
        # the rank's share of the frames, as torch's DistributedSampler deals them
        ref = TorchDistributedSampler(data, num_replicas=2, rank=rank, shuffle=True, seed=5)
        ref.set_epoch(2)
        subset = np.asarray(list(ref))
        assert set(idx.tolist()) <= set(subset.tolist())
        p = w_ref[subset] / w_ref[subset].sum()
        expected = p @ labels[subset]
        emp = labels[idx].mean(axis=0)
        se = np.sqrt(expected * (1 - expected) / num)
        assert np.all(np.abs(emp - expected) <= 4 * se + 1e-12), (emp, expected)
        # reproducible per (seed, epoch, rank)
        again = DistributedSqrtFrequencySampler(data, num_samples_per_rank=num, num_replicas=2, rank=rank, seed=5)
        again.set_epoch(2)
        assert np.array_equal(np.fromiter(iter(again), dtype=np.int64), idx)
    eff = s.effective_class_frequencies()
    exp = _expected_shares()
    assert eff["sampled"][3] == pytest.approx(exp[3], rel=1e-12)
    assert s.state_dict() == {"seed": 5, "epoch": 2}


def test_sampler_reads_the_datalist_on_first_use_and_splits_an_epoch_among_processes():
    from monai_vce.utils import LazySequence

    data = _single_label_datalist()
    lazy = LazySequence(list, data)
    s = SqrtFrequencySampler(lazy, num_samples=400, seed=3)
    assert not lazy.computed and len(s) == 400 and not lazy.computed
    single = list(s)
    assert lazy.computed and len(single) == 400
    assert list(SqrtFrequencySampler(data, num_samples=400, seed=3, num_replicas=1, rank=0)) == single
    # two processes: 200 draws each, from their own seeds
    r0 = SqrtFrequencySampler(data, num_samples=400, seed=3, num_replicas=2, rank=0)
    r1 = SqrtFrequencySampler(data, num_samples=400, seed=3, num_replicas=2, rank=1)
    assert len(r0) == len(r1) == 200
    a, b = list(r0), list(r1)
    assert len(a) == len(b) == 200 and a != b
