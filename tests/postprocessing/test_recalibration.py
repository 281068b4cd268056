"""Per-exam recalibration by quantile matching: thresholds mapped to the exam, or the exam mapped to the reference."""

from __future__ import annotations

import json

import numpy as np
import pytest
from scipy.special import expit, logit

from monai_vce.events.probabilities import Video, save_video_probs
from monai_vce.labels import LABELS, NUM_LABELS
from monai_vce.postprocessing import (
    DecoderParams,
    ReferenceQuantiles,
    load_reference_quantiles,
    quantile_match,
    recalibrate_decoder,
    recalibrate_thresholds,
)


def _reference_probs(n: int = 4000, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    z = rng.normal(loc=np.linspace(-4, 0, NUM_LABELS), scale=1.5, size=(n, NUM_LABELS))
    return expit(z)


def _shifted(p: np.ndarray, shift: float = -1.0, scale: float = 0.8) -> np.ndarray:
    """A monotone transform of the scores: the same frames from a device whose logits are shrunk and shifted."""
    return expit(scale * logit(p) + shift)


def _thresholds(p: np.ndarray) -> np.ndarray:
    # thresholds flagging 2 % to 40 % of the reference frames, halfway between two reference scores
    s = np.sort(p, axis=0)
    k = np.linspace(0.6, 0.98, NUM_LABELS)
    i = (k * (len(p) - 1)).astype(int)
    cols = np.arange(NUM_LABELS)
    return (s[i, cols] + s[i + 1, cols]) / 2


def test_monotone_transform_keeps_the_flagged_fraction():
    p_ref = _reference_probs()
    t = _thresholds(p_ref)
    ref_flagged = (p_ref >= t).mean(axis=0)
    exam = _shifted(p_ref)
    # every order statistic stored: the mapping is exact
    exact = ReferenceQuantiles.from_probabilities(p_ref, levels=np.linspace(0, 1, len(p_ref)))
    t_exam = recalibrate_thresholds(t, exam, exact, max_shift=None)
    np.testing.assert_array_equal((exam >= t_exam).mean(axis=0), ref_flagged)
    # the default levels: within a few frames
    ref = ReferenceQuantiles.from_probabilities(p_ref)
    t_exam, reasons = recalibrate_thresholds(t, exam, ref, max_shift=None, return_reasons=True)
    assert reasons == {}
    np.testing.assert_allclose((exam >= t_exam).mean(axis=0), ref_flagged, atol=3 / len(p_ref))
    # the unchanged thresholds would flag much less on the shifted exam
    assert ((exam >= t).mean(axis=0) < ref_flagged - 0.01).all()


def test_exam_of_other_frames_from_the_shifted_device():
    ref = ReferenceQuantiles.from_probabilities([_reference_probs(3000, 0), _reference_probs(3000, 1)])
    p_ref = np.concatenate([_reference_probs(3000, 0), _reference_probs(3000, 1)])
    t = _thresholds(p_ref)
    exam = _shifted(_reference_probs(5000, seed=2))
    t_exam = recalibrate_thresholds(t, exam, ref, max_shift=None)
    # sampling error of a fraction f over 5000 frames: about sqrt(f(1-f)/5000) <= 0.007
    np.testing.assert_allclose((exam >= t_exam).mean(axis=0), (p_ref >= t).mean(axis=0), atol=0.03)


def test_identity_when_the_exam_is_the_reference():
    p_ref = _reference_probs()
    t = _thresholds(p_ref)
    exact = ReferenceQuantiles.from_probabilities(p_ref, levels=np.linspace(0, 1, len(p_ref)))
    np.testing.assert_allclose(recalibrate_thresholds(t, p_ref, exact), t, rtol=0, atol=1e-12)
    ref = ReferenceQuantiles.from_probabilities(p_ref)
    t_same = recalibrate_thresholds(t, p_ref, ref)
    # the default levels interpolate between stored quantiles: within a few frames
    np.testing.assert_allclose((p_ref >= t_same).mean(axis=0), (p_ref >= t).mean(axis=0), atol=3 / len(p_ref))
    np.testing.assert_allclose(quantile_match(p_ref, exact), p_ref.astype(np.float32), atol=1e-6)


def test_quantile_match_gives_the_reference_distribution():
    p_ref = _reference_probs()
    ref = ReferenceQuantiles.from_probabilities(p_ref)
    raw = _shifted(_reference_probs(3000, seed=3))
    matched = quantile_match(raw, ref)
    assert matched.dtype == np.float32 and matched.shape == raw.shape
    levels = np.linspace(0.01, 0.99, 99)
    np.testing.assert_allclose(np.quantile(matched, levels, axis=0), np.quantile(p_ref, levels, axis=0), atol=0.02)
    # frame order within each class is kept (strictly increasing stays non-decreasing)
    order = np.argsort(raw, axis=0)
    assert (np.diff(np.take_along_axis(matched, order, axis=0), axis=0) >= 0).all()
    # the thresholds tuned on the reference flag the reference's fraction on the matched exam
    t = _thresholds(p_ref)
    np.testing.assert_allclose((matched >= t).mean(axis=0), (p_ref >= t).mean(axis=0), atol=0.04)
    # ties stay tied
    tied = raw.copy()
    tied[:10, 0] = tied[0, 0]
    out = quantile_match(tied, ref)
    assert np.unique(out[:10, 0]).size == 1
    # only chosen classes, and a bounded move
    some = quantile_match(raw, ref, classes=[LABELS[0]])
    np.testing.assert_array_equal(some[:, 1:], raw[:, 1:].astype(np.float32))
    bounded = quantile_match(raw, ref, max_shift=0.5)
    assert np.abs(logit(np.clip(bounded, 1e-6, 1 - 1e-6)) - logit(np.clip(raw, 1e-6, 1 - 1e-6))).max() <= 0.5 + 1e-3


def test_safeguards():
    p_ref = _reference_probs()
    ref = ReferenceQuantiles.from_probabilities(p_ref)
    t = _thresholds(p_ref)
    exam = _shifted(_reference_probs(500, seed=4))
    # too few frames: everything kept
    out, reasons = recalibrate_thresholds(t, exam[:50], ref, min_frames=100, return_reasons=True)
    np.testing.assert_array_equal(out, t)
    assert set(reasons) == set(LABELS) and "50 frames" in reasons[LABELS[0]]
    np.testing.assert_array_equal(quantile_match(exam[:50], ref, min_frames=100), exam[:50].astype(np.float32))
    # a constant class keeps its threshold / its scores
    const = exam.copy()
    const[:, 3] = 0.2
    out, reasons = recalibrate_thresholds(t, const, ref, max_shift=None, return_reasons=True)
    assert out[3] == t[3] and "constant exam scores" in reasons[LABELS[3]]
    assert out[4] != t[4]
    np.testing.assert_array_equal(quantile_match(const, ref)[:, 3], np.float32(0.2))
    # a threshold above every reference score, or one the exam cannot resolve
    t_high = t.copy()
    t_high[5] = 1.0
    t_high[6] = np.sort(p_ref[:, 6])[-2]  # 1 reference frame above: fewer than min_tail
    out, reasons = recalibrate_thresholds(t_high, exam, ref, return_reasons=True)
    assert out[5] == 1.0 and out[6] == t_high[6]
    assert "reference frames" in reasons[LABELS[5]] and "reference frames" in reasons[LABELS[6]]
    # a bounded move, in logits
    out = recalibrate_thresholds(t, exam, ref, max_shift=0.25)
    assert np.abs(logit(out) - logit(t)).max() <= 0.25 + 1e-9
    assert np.all((out >= 0) & (out <= 1))
    # a constant reference class
    flat_ref = p_ref.copy()
    flat_ref[:, 2] = 0.5
    out, reasons = recalibrate_thresholds(t, exam, ReferenceQuantiles.from_probabilities(flat_ref), return_reasons=True)
    assert out[2] == t[2] and "constant reference" in reasons[LABELS[2]]
    with pytest.raises(ValueError, match="min_frames"):
        recalibrate_thresholds(t, exam, ref, min_frames=1)
    with pytest.raises(ValueError, match="non-finite"):
        recalibrate_thresholds(t, np.full((200, NUM_LABELS), np.nan), ref)
    with pytest.raises(ValueError, match="thresholds"):
        recalibrate_thresholds(t[:5], exam, ref)


def test_thresholds_by_label_and_decoder_params():
    p_ref = _reference_probs()
    ref = ReferenceQuantiles.from_probabilities(p_ref)
    t = _thresholds(p_ref)
    exam = _shifted(_reference_probs(2000, seed=5))
    by_name = recalibrate_thresholds(dict(zip(LABELS, t.tolist(), strict=True)), exam, ref)
    np.testing.assert_array_equal(by_name, recalibrate_thresholds(t, exam, ref))
    params = DecoderParams.from_thresholds(dict(zip(LABELS, t.tolist(), strict=True)))
    new = recalibrate_decoder(params, exam, ref)
    np.testing.assert_allclose(new.per_label("threshold"), by_name)
    assert new["order"] == params["order"]


def test_reference_round_trip(tmp_path):
    p_ref = _reference_probs(500)
    ref = ReferenceQuantiles.from_probabilities(p_ref, levels=np.linspace(0, 1, 101))
    path = ref.save(tmp_path / "sub" / "reference.json")
    loaded = load_reference_quantiles(path)
    assert loaded == ref and loaded.counts.tolist() == [500] * NUM_LABELS
    np.testing.assert_array_equal(loaded.cdf(_thresholds(p_ref)), ref.cdf(_thresholds(p_ref)))
    assert not list(path.parent.glob("*.tmp*"))
    # malformed files are refused with the file and the field named
    obj = json.loads(path.read_text())
    obj["labels"][LABELS[0]]["values"][5] = -1.0
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(obj))
    with pytest.raises(ValueError, match=r"bad\.json"):
        ReferenceQuantiles.load(bad)
    obj = json.loads(path.read_text())
    obj["levels"] = obj["levels"][::-1]
    bad.write_text(json.dumps(obj))
    with pytest.raises(ValueError, match="levels"):
        ReferenceQuantiles.load(bad)
    bad.write_text('{"format": 1}')
    with pytest.raises(ValueError, match=r"bad\.json"):
        ReferenceQuantiles.load(bad)
    with pytest.raises(FileNotFoundError):
        ReferenceQuantiles.load(tmp_path / "missing.json")


def test_reference_from_probability_files(tmp_path):
    parts = [_reference_probs(300, seed) for seed in range(3)]
    for i, p in enumerate(parts):
        idx = np.arange(len(p), dtype=np.int64)
        save_video_probs(tmp_path / f"v{i}.npz", Video(f"v{i}", p.astype(np.float32), idx, idx))
    from_files = ReferenceQuantiles.from_probs_dir(tmp_path)
    direct = ReferenceQuantiles.from_probabilities([p.astype(np.float32) for p in parts])
    assert from_files == direct and int(from_files.counts[0]) == 900
    with pytest.raises(ValueError, match="at least one frame"):
        ReferenceQuantiles.from_probabilities([])
