"""The paper's post-processing chain on hand-made sequences."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.ndimage import median_filter

from monai_vce.postprocessing.chain import (
    PAPER_ORDER,
    apply_chain,
    fill_gaps,
    median_mask,
    median_probs,
    remove_short_runs,
    run_bounds,
    threshold_mask,
)


def col(bits: str) -> np.ndarray:
    """'0110' -> (T, 1) bool."""
    return np.array([b == "1" for b in bits])[:, None]


def bits(mask: np.ndarray) -> str:
    return "".join("1" if b else "0" for b in mask[:, 0])


def test_threshold_per_class():
    p = np.array([[0.2, 0.2], [0.5, 0.5], [0.8, 0.8]])
    out = threshold_mask(p, [0.5, 0.7])
    assert out.tolist() == [[False, False], [True, False], [True, True]]
    with pytest.raises(ValueError, match="2 per-class values"):
        threshold_mask(p, [0.5, 0.5, 0.5])


def test_median_mask_is_majority_vote():
    assert bits(median_mask(col("0010000111011100"), 3)) == "0000000111111100"
    # window 1 leaves the class unchanged; windows per class
    m = np.concatenate([col("0101010"), col("0101010")], axis=1)
    out = median_mask(m, [1, 3])
    assert bits(out[:, :1]) == "0101010" and bits(out[:, 1:]) == "0010100"
    with pytest.raises(ValueError, match="odd"):
        median_mask(m, 4)


def test_median_mask_matches_scipy():
    rng = np.random.default_rng(0)
    m = rng.random((300, 17)) < 0.4
    w = rng.choice([1, 3, 5, 7, 11], size=17)
    ref = np.stack([median_filter(m[:, c].astype(np.uint8), size=int(w[c]), mode="nearest") for c in range(17)], 1)
    np.testing.assert_array_equal(median_mask(m, w), ref.astype(bool))


def test_median_probs():
    p = np.array([[0.1], [0.9], [0.2], [0.3], [0.95]])
    np.testing.assert_allclose(median_probs(p, 3)[:, 0], [0.1, 0.2, 0.3, 0.3, 0.95])


def test_fill_gaps_interior_only():
    assert bits(fill_gaps(col("110011000111"), 2)) == "111111000111"  # gap 3 > 2 stays
    assert bits(fill_gaps(col("110011000111"), 3)) == "111111111111"
    assert bits(fill_gaps(col("001100"), 5)) == "001100"  # edge gaps are never filled
    assert bits(fill_gaps(col("1101"), 0)) == "1101"


def test_remove_short_runs():
    assert bits(remove_short_runs(col("1011011100111"), 3)) == "0000011100111"
    assert bits(remove_short_runs(col("101"), 0)) == "101"
    m = np.concatenate([col("110111"), col("110111")], axis=1)
    out = remove_short_runs(m, [3, 2])
    assert bits(out[:, :1]) == "000111" and bits(out[:, 1:]) == "110111"


def test_run_bounds():
    cls, start, stop = run_bounds(np.concatenate([col("0110"), col("1001")], axis=1))
    assert list(zip(cls.tolist(), start.tolist(), stop.tolist(), strict=False)) == [(0, 1, 3), (1, 0, 1), (1, 3, 4)]


def test_order_matters():
    # a 2-frame run and a 1-frame gap: filling first joins them into a kept run; removing first deletes both
    p = col("0110100000").astype(float)
    fill_first = apply_chain(p, 0.5, 1, 1, 3, order=("threshold", "fill_gaps", "min_length"))
    remove_first = apply_chain(p, 0.5, 1, 1, 3, order=("threshold", "min_length", "fill_gaps"))
    assert bits(fill_first) == "0111100000"
    assert bits(remove_first) == "0000000000"


def test_paper_chain_end_to_end():
    p = col("0000111101111111000000100000").astype(float) * 0.9 + 0.05
    out = apply_chain(p)  # 0.5, median 7, gaps 5, min length 3
    assert PAPER_ORDER == ("threshold", "median", "fill_gaps", "min_length")
    # the median removes the isolated frame and closes the 1-frame hole; nothing else changes
    assert bits(out) == "0000111111111111000000000000"


def test_median_before_threshold_filters_probabilities():
    p = np.array([[0.1], [0.6], [0.45], [0.6], [0.1]])
    # medians of the probabilities: 0.1, 0.45, 0.6, 0.45, 0.1 -> only the middle frame passes 0.5
    assert bits(median_probs(p, 3) >= 0.5) == "00100"
    assert bits(apply_chain(p, 0.5, 3, 0, 0, order=("median", "threshold"))) == "00100"
    # the median commutes with a threshold, so both placements give the same mask
    rng = np.random.default_rng(1)
    q = rng.random((500, 17))
    w = rng.choice([1, 3, 7, 15], size=17)
    thr = rng.uniform(0.2, 0.8, size=17)
    a = apply_chain(q, thr, w, 4, 3, order=("median", "threshold", "fill_gaps", "min_length"))
    b = apply_chain(q, thr, w, 4, 3, order=("threshold", "median", "fill_gaps", "min_length"))
    np.testing.assert_array_equal(a, b)
    with pytest.raises(ValueError, match="after 'threshold'"):
        apply_chain(p, order=("fill_gaps", "threshold"))
    with pytest.raises(ValueError, match="unknown chain step"):
        apply_chain(p, order=("threshold", "smooth"))


def test_median_mask_windows_longer_than_the_video_match_scipy_and_allocate_nothing_big():
    from scipy.ndimage import median_filter

    rng = np.random.default_rng(5)
    for T in (1, 2, 7, 40):
        mask = rng.random((T, 4)) < 0.5
        for w in (1, 3, 2 * T - 1, 2 * T + 1, 2 * T + 5, 6 * T + 1):
            expected = median_filter(mask.astype(np.uint8), size=(w, 1), mode="nearest").astype(bool)
            np.testing.assert_array_equal(median_mask(mask, w), expected, err_msg=f"T={T} w={w}")
    # the largest window the decoder parameters allow, on a long video: counted, not padded (the edge copies
    # outvote the video: both ends active -> all active, both inactive -> none, one of them -> a cut in between)
    long = rng.random((130_000, 6)) < 0.3
    long[0], long[-1] = [True, False, True, False, True, False], [True, False, False, True, True, False]
    out = median_mask(long, 9_999_999)
    assert out[:, 0].all() and not out[:, 1].any() and out[:, 4].all() and not out[:, 5].any()
    total = long.sum(axis=0)
    np.testing.assert_array_equal(np.flatnonzero(out[:, 2]), np.arange(min(total[2], 130_000)))  # total > t
    np.testing.assert_array_equal(np.flatnonzero(~out[:, 3]), np.arange(130_000 - total[3]))
