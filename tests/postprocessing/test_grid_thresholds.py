"""grid_thresholds against a plain transcription of the authors' grid search, and its use in the handler."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from ignite.engine import Engine

from monai_vce.handlers import ThresholdOptimizationHandler
from monai_vce.postprocessing import grid_thresholds, load_thresholds

try:
    from sklearn.metrics import f1_score
except ImportError:  # pragma: no cover

    def f1_score(y_true, y_pred, zero_division=0):
        tp = int(((y_true == 1) & (y_pred == 1)).sum())
        denom = int((y_true == 1).sum() + (y_pred == 1).sum())
        return 2 * tp / denom if denom else zero_division


def _reference(probs, labels):
    # the authors' optimize_thresholds, transcribed as given
    c_total = probs.shape[1]
    total = len(labels)
    thresholds = np.full(c_total, 0.5)
    f1s = np.zeros(c_total)
    for c in range(c_total):
        sup = labels[:, c].sum()
        if sup == 0:
            thresholds[c] = 0.2
            continue
        best_f1 = 0
        best_t = 0.5
        lo = 0.05 if sup < total * 0.01 else 0.15
        for t in np.arange(lo, 0.85, 0.02):
            f = f1_score(labels[:, c], (probs[:, c] >= t).astype(int), zero_division=0)
            if f > best_f1:
                best_f1 = f
                best_t = t
        thresholds[c] = best_t
        f1s[c] = best_f1
    return thresholds, f1s


def _data(seed=0, n=500):
    rng = np.random.default_rng(seed)
    rates = np.array([0.3, 0.1, 0.005, 0.002, 0.0, 0.2, 0.05, 0.004])
    y = (rng.random((n, len(rates))) < rates).astype(np.int64)
    y[:2, 2] = 1  # ensure rare classes have some support
    y[:1, 3] = 1
    p = np.clip(0.35 * y + 0.65 * rng.random(y.shape), 0.0, 1.0)
    p[:, 5] = np.where(y[:, 5] == 1, 0.01, 0.9)  # positives below the grid, negatives above: F1 0 everywhere
    p[:, 6] = np.round(p[:, 6] * 50) / 50  # scores on grid points: ties at >=
    return p, y


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_matches_reference(seed):
    p, y = _data(seed)
    t, f1 = grid_thresholds(p, y)
    rt, rf1 = _reference(p, y)
    np.testing.assert_allclose(t, rt, rtol=0, atol=1e-12)
    np.testing.assert_allclose(f1, rf1, rtol=0, atol=1e-12)
    assert t[4] == 0.2 and f1[4] == 0.0  # no positives
    assert t[5] == 0.5 and f1[5] == 0.0  # F1 0 at every grid point: default


def test_f1_zero_everywhere_keeps_default():
    p = np.array([[0.01, 0.9], [0.9, 0.01], [0.95, 0.02]])
    y = np.array([[1, 0], [0, 1], [0, 0]])
    t, f1 = grid_thresholds(p, y)
    rt, rf1 = _reference(p, y)
    np.testing.assert_allclose(t, [0.5, 0.5])
    np.testing.assert_allclose(f1, [0.0, 0.0])
    np.testing.assert_allclose(t, rt)
    np.testing.assert_allclose(f1, rf1)


def test_validation():
    with pytest.raises(ValueError, match="same shape"):
        grid_thresholds(np.zeros((3, 2)), np.zeros((3, 3)))
    with pytest.raises(ValueError, match="same shape"):
        grid_thresholds(np.zeros(3), np.zeros(3))
    with pytest.raises(ValueError, match="non-empty"):
        grid_thresholds(np.zeros((0, 2)), np.zeros((0, 2)))


def test_handler_uses_search(tmp_path):
    rng = np.random.default_rng(3)
    batches = []
    for _ in range(5):
        y = (rng.random((8, 17)) < 0.3).astype(np.float32)
        p = np.clip(0.4 * y + 0.6 * rng.random((8, 17)), 0.001, 0.999).astype(np.float32)
        batches.append({"pred": torch.from_numpy(p), "label": torch.from_numpy(y)})
    engine = Engine(lambda e, b: b)
    out = tmp_path / "t.json"
    ThresholdOptimizationHandler(output_path=out, metric_name="f1", search=grid_thresholds).attach(engine)
    engine.run(batches, max_epochs=1)
    p = torch.cat([b["pred"] for b in batches]).numpy().astype(np.float64)
    y = torch.cat([b["label"] for b in batches]).numpy()
    rt, rf1 = _reference(p, y.astype(np.int64))
    np.testing.assert_allclose(engine.state.thresholds, rt, atol=1e-12)
    np.testing.assert_allclose(engine.state.thresholds_f1, rf1, atol=1e-12)
    assert engine.state.metrics["f1"] == pytest.approx(float(rf1.mean()))
    np.testing.assert_allclose(load_thresholds(out), rt, atol=1e-12)


def test_rare_class_searched_from_rare_start():
    # one positive in 200 frames (rare) scoring 0.1: found only by the grid starting at 0.05
    p = np.zeros((200, 2))
    y = np.zeros((200, 2), dtype=np.int64)
    p[0], y[0] = 0.1, 1
    y[:10, 1], p[:10, 1] = 1, 0.1  # common class (5%): grid from 0.15 misses it
    t, f1 = grid_thresholds(p, y)
    rt, rf1 = _reference(p, y)
    np.testing.assert_allclose(t, rt, atol=1e-12)
    np.testing.assert_allclose(f1, rf1, atol=1e-12)
    assert t[0] == pytest.approx(0.05) and f1[0] == 1.0 and t[1] == 0.5 and f1[1] == 0.0
