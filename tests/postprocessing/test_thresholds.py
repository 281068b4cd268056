"""Tests of per-class threshold optimisation: exact small cases, brute force, file I/O, the ignite handler."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from ignite.engine import Engine

from monai_vce.handlers import ThresholdOptimizationHandler
from monai_vce.labels import LABELS
from monai_vce.postprocessing import f1_at_thresholds, load_thresholds, optimize_thresholds, save_thresholds


def test_hand_made_example():
    # sorted scores with targets: cuts k=1..6 give F1 0.5, 0.4, 0.667, 0.857, 0.75, 0.667 -> cut after 0.6
    s = np.array([0.9, 0.8, 0.7, 0.6, 0.3, 0.2])
    y = np.array([1, 0, 1, 1, 0, 0])
    t, f1 = optimize_thresholds(s[:, None], y[:, None], 0.05, 0.95, return_f1=True)
    assert t[0] == pytest.approx(0.45)  # midpoint of 0.6 and 0.3
    assert f1[0] == pytest.approx(6 / 7)
    # the best cut is still realisable inside [0.05, 0.4]: threshold clipped to 0.4
    assert optimize_thresholds(s[:, None], y[:, None], 0.05, 0.4)[0] == pytest.approx(0.4)
    # with min 0.65 the cut after 0.6 is out of range: best in range is after 0.7 (F1 2/3), at 0.65
    t2, f2 = optimize_thresholds(s[:, None], y[:, None], 0.65, 0.95, return_f1=True)
    assert t2[0] == pytest.approx(0.65) and f2[0] == pytest.approx(2 / 3)
    # ties cannot be split: [0.8, 0.8, 0.5] with one positive among the tie -> cut after both 0.8 (F1 2/3)
    t3, f3 = optimize_thresholds([[0.8], [0.8], [0.5]], [[1], [0], [0]], 0.0, 1.0, return_f1=True)
    assert t3[0] == pytest.approx(0.65) and f3[0] == pytest.approx(2 / 3)
    # every frame positive: keep all, threshold half the lowest score (then clipped)
    t4 = optimize_thresholds([[0.9], [0.4]], [[1], [1]], 0.0, 1.0)
    assert t4[0] == pytest.approx(0.2)
    # several columns at once; column 1 keeps a tie [0.6 (1), 0.6 (0)] together -> cut above 0.2
    t5 = optimize_thresholds([[0.9, 0.6], [0.8, 0.6], [0.7, 0.2]], [[1, 1], [0, 0], [1, 0]], 0.0, 1.0)
    assert t5[0] == pytest.approx(0.35) and t5[1] == pytest.approx(0.4)
    # equal F1 (2/3 after 0.9 and after 0.6): the highest threshold wins
    t6 = optimize_thresholds([[0.9], [0.8], [0.7], [0.6], [0.1]], [[1], [0], [0], [1], [0]], 0.0, 1.0)
    assert t6[0] == pytest.approx(0.85)


def test_classes_without_positives_get_default():
    p = np.array([[0.9, 0.2], [0.1, 0.3]])
    y = np.array([[1, 0], [0, 0]])
    t = optimize_thresholds(p, y, 0.1, 0.8)
    assert t[1] == 0.5  # default: the neutral 0.5, not an end of the range
    assert optimize_thresholds(p, y, 0.1, 0.8, default_threshold=0.7)[1] == 0.7
    assert optimize_thresholds(p, y, 0.6, 0.8)[1] == 0.6  # 0.5 clipped into the range
    # positives only below the range: no F1 > 0 reachable -> default
    t2 = optimize_thresholds([[0.01], [0.02], [0.5]], [[1], [1], [0]], 0.05, 0.95)
    assert t2[0] == 0.5


def _f1(p, y, t):
    pred = p >= t
    tp = np.sum(pred & y)
    d = pred.sum() + y.sum()
    return 2 * tp / d if d else 0.0


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_brute_force_on_random_data(seed):
    rng = np.random.default_rng(seed)
    n, c = 300, 6
    y = rng.random((n, c)) < rng.uniform(0.02, 0.4, size=c)
    # informative scores with ties (rounded), some outside the range
    p = np.clip(0.35 * y + rng.random((n, c)) * 0.7, 0, 1).round(2)
    lo, hi = (0.05, 0.95) if seed % 2 == 0 else (0.3, 0.6)
    t, f1 = optimize_thresholds(p, y, lo, hi, return_f1=True)
    assert np.all((t >= lo) & (t <= hi))
    np.testing.assert_allclose(f1, f1_at_thresholds(p, y, t))
    for j in range(c):
        # every threshold that can make a difference: the distinct scores, just above them, and the bounds
        cands = np.unique(np.concatenate([p[:, j], np.nextafter(p[:, j], 2.0), [lo, hi]]))
        cands = cands[(cands >= lo) & (cands <= hi)]
        best = max(_f1(p[:, j], y[:, j], tt) for tt in cands)
        assert _f1(p[:, j], y[:, j], t[j]) == pytest.approx(best, abs=1e-12)
        assert f1[j] == pytest.approx(best, abs=1e-12)


def test_invalid_inputs():
    with pytest.raises(ValueError, match="same shape"):
        optimize_thresholds(np.zeros((3, 2)), np.zeros((3, 3)))
    with pytest.raises(ValueError, match="non-finite"):
        optimize_thresholds(np.array([[np.nan]]), np.array([[1]]))
    with pytest.raises(ValueError, match="must not exceed"):
        optimize_thresholds(np.zeros((3, 2)), np.zeros((3, 2)), 0.9, 0.1)


def test_save_load_round_trip_and_errors(tmp_path):
    t = np.linspace(0.05, 0.95, 17)
    path = save_thresholds(tmp_path / "models" / "thresholds.json", t)
    obj = json.loads(path.read_text())
    assert list(obj) == list(LABELS)
    assert obj["ulcer"] == pytest.approx(0.95)
    np.testing.assert_array_equal(load_thresholds(path), t)
    # a mapping keyed by name works too
    save_thresholds(tmp_path / "b.json", dict(zip(LABELS, t[::-1], strict=False)))
    np.testing.assert_array_equal(load_thresholds(tmp_path / "b.json"), t[::-1])

    with pytest.raises(FileNotFoundError, match=r"nope.json"):
        load_thresholds(tmp_path / "nope.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match=r"bad.json is not valid JSON"):
        load_thresholds(bad)
    bad.write_text(json.dumps([0.5] * 17))
    with pytest.raises(ValueError, match=r"bad.json must hold a JSON object"):
        load_thresholds(bad)
    d = dict(zip(LABELS, [0.5] * 17, strict=False))
    del d["polyp"]
    d["tumour"] = 0.4
    d["ulcer"] = 1.5
    bad.write_text(json.dumps(d))
    with pytest.raises(
        ValueError, match=r"bad.json.*unknown labels \['tumour'\].*missing labels \['polyp'\].*'ulcer': 1.5"
    ):
        load_thresholds(bad)
    with pytest.raises(ValueError, match="expected 17 thresholds"):
        save_thresholds(tmp_path / "c.json", [0.5] * 3)
    with pytest.raises(ValueError, match="'mouth': nan"):
        save_thresholds(tmp_path / "c.json", [float("nan")] + [0.5] * 16)
    assert not (tmp_path / "c.json").exists()


def _val_batches(seed=0, n_batches=5, b=8, logits=False):
    rng = np.random.default_rng(seed)
    batches = []
    for _ in range(n_batches):
        y = (rng.random((b, 17)) < 0.3).astype(np.float32)
        p = np.clip(0.4 * y + 0.6 * rng.random((b, 17)), 0.001, 0.999).astype(np.float32)
        out = np.log(p / (1 - p)) if logits else p
        batches.append({"pred": torch.from_numpy(out), "label": torch.from_numpy(y)})
    return batches


@pytest.mark.parametrize("decollated", [False, True])
def test_handler_on_tiny_engine(tmp_path, decollated):
    batches = _val_batches()

    def step(engine, batch):
        if decollated:  # MONAI's decollated output: a list of per-item dicts
            return [{"pred": p, "label": y} for p, y in zip(batch["pred"], batch["label"], strict=False)]
        return batch

    engine = Engine(step)
    out = tmp_path / "thresholds.json"
    ThresholdOptimizationHandler(output_path=out, metric_name="threshold_f1").attach(engine)
    engine.run(batches, max_epochs=2)
    p = torch.cat([b["pred"] for b in batches]).numpy()
    y = torch.cat([b["label"] for b in batches]).numpy()
    expected, f1 = optimize_thresholds(p, y, return_f1=True)
    np.testing.assert_array_equal(engine.state.thresholds, expected)  # per epoch: collected anew, not doubled
    np.testing.assert_array_equal(engine.state.thresholds_f1, f1)
    assert engine.state.metrics["threshold_f1"] == pytest.approx(float(f1.mean()))
    np.testing.assert_array_equal(load_thresholds(out), expected)


def test_handler_logits_best_only_and_range_check(tmp_path):
    batches = _val_batches(seed=1, logits=True)
    engine = Engine(lambda e, b: b)
    out = tmp_path / "t.json"
    ThresholdOptimizationHandler(output_path=out, sigmoid=True, write_on="best").attach(engine)
    engine.state.best_metric_epoch = -1
    engine.run(batches, max_epochs=1)
    assert not out.exists()  # not the best epoch: nothing written
    p = torch.sigmoid(torch.cat([b["pred"] for b in batches])).numpy()
    y = torch.cat([b["label"] for b in batches]).numpy()
    np.testing.assert_array_equal(engine.state.thresholds, optimize_thresholds(p, y))

    engine2 = Engine(lambda e, b: b)
    ThresholdOptimizationHandler(output_path=out).attach(engine2)
    with pytest.raises(ValueError, match="sigmoid=True"):
        engine2.run(batches, max_epochs=1)
