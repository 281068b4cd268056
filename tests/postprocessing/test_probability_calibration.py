"""Per-label temperature and Platt scaling of frame probabilities (``monai_vce.postprocessing.calibration``)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from scipy.special import expit

from monai_vce.labels import LABELS, NUM_LABELS
from monai_vce.metrics.calibration import expected_calibration_error
from monai_vce.postprocessing.calibration import CALIBRATION_METHODS, ProbabilityCalibration, load_calibration


def _frames(n: int, scale: float, shift: float, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``probs = sigmoid(z)`` with ``z ~ N(0, 1.5^2)`` and targets ~ Bernoulli(sigmoid(scale * z + shift))."""
    rng = np.random.default_rng(seed)
    z = rng.normal(0.0, 1.5, size=(n, NUM_LABELS))
    targets = (rng.random((n, NUM_LABELS)) < expit(scale * z + shift)).astype(np.float32)
    return expit(z).astype(np.float32), targets


@pytest.fixture(scope="module")
def miscalibrated() -> tuple[np.ndarray, np.ndarray]:
    return _frames(200_000, 2.0, -1.0)


@pytest.fixture(scope="module")
def platt(miscalibrated) -> ProbabilityCalibration:
    return ProbabilityCalibration.fit(*miscalibrated, method="platt")


def test_platt_fit_recovers_scale_and_shift(platt):
    assert CALIBRATION_METHODS == ("temperature", "platt")
    np.testing.assert_allclose(platt.scale, 2.0, atol=0.1)
    np.testing.assert_allclose(platt.shift, -1.0, atol=0.1)
    info = platt.fit_info
    assert info is not None and info["method"] == "platt" and info["frames"] == 200_000
    assert info["identity"] == []
    assert set(info["positives"]) == set(LABELS)
    assert all(info["nll_after"][n] < info["nll_before"][n] for n in LABELS)


def test_temperature_fit_recovers_inverse_temperature():
    probs, targets = _frames(200_000, 2.0, 0.0, seed=1)
    cal = ProbabilityCalibration.fit(probs, targets, method="temperature")
    assert cal.method == "temperature"
    np.testing.assert_allclose(cal.scale, 2.0, atol=0.1)
    assert np.all(cal.shift == 0.0)


def test_fitted_ece_is_lower(miscalibrated, platt):
    probs, targets = miscalibrated
    before = expected_calibration_error(probs, targets)
    after = expected_calibration_error(platt(probs), targets)
    assert np.all(after < before)
    assert after.max() < 0.01 < before.min()


def test_label_without_positives_stays_identity():
    probs, targets = _frames(20_000, 2.0, -1.0, seed=2)
    targets[:, 3] = 0.0  # no positive
    targets[:, 5] = 1.0  # no negative
    targets[:, 7] = 0.0
    targets[:4, 7] = 1.0  # 4 positives, fewer than min_positives
    cal = ProbabilityCalibration.fit(probs, targets, min_positives=5)
    info = cal.fit_info
    assert info is not None
    assert info["identity"] == [LABELS[3], LABELS[5], LABELS[7]]
    assert info["positives"][LABELS[3]] == 0 and info["positives"][LABELS[7]] == 4
    out = cal(probs)
    assert out.dtype == np.float32 and out.shape == probs.shape
    for c in (3, 5, 7):
        assert cal.scale[c] == 1.0 and cal.shift[c] == 0.0
        assert out[:, c].tobytes() == probs[:, c].tobytes()
        assert info["nll_after"][LABELS[c]] == info["nll_before"][LABELS[c]]
    assert not np.array_equal(out[:, 0], probs[:, 0])
    # the identity map returns everything bit for bit, even probabilities outside the clipping range
    edge = probs.copy()
    edge[:2] = [[0.0], [1.0]]
    ident = ProbabilityCalibration()
    assert ident.is_identity and not cal.is_identity
    assert ident(edge).tobytes() == edge.tobytes()


def test_calibration_keeps_the_order_within_each_label(platt):
    probs = np.random.default_rng(3).random((5000, NUM_LABELS)).astype(np.float32)
    probs[:10] = 0.0
    probs[10:20] = 1.0
    out = platt(probs)
    assert np.all((out >= 0.0) & (out <= 1.0))
    for c in range(NUM_LABELS):
        order = np.argsort(probs[:, c], kind="stable")
        assert np.all(np.diff(out[order, c]) >= 0.0), LABELS[c]


def test_save_load_round_trip(tmp_path: Path, platt, miscalibrated):
    path = platt.save(tmp_path / "calibration.json")
    data = json.loads(path.read_text())
    assert data["format"] == "monai-vce probability calibration" and data["version"] == 1
    assert list(data["labels"]) == list(LABELS) and data["fit"] == platt.fit_info
    loaded = ProbabilityCalibration.load(path)
    assert loaded.to_dict() == platt.to_dict()
    probs = miscalibrated[0][:1000]
    assert loaded(probs).tobytes() == platt(probs).tobytes()
    assert load_calibration(path).to_dict() == platt.to_dict()
    # an unfitted map round-trips too, with "fit": null
    plain = ProbabilityCalibration(scale=[0.5] * NUM_LABELS, method="temperature")
    assert ProbabilityCalibration.load(plain.save(tmp_path / "t.json")).to_dict() == plain.to_dict()


def _broken(tmp_path: Path, platt: ProbabilityCalibration, edit) -> Path:
    data = platt.to_dict()
    edit(data)
    path = tmp_path / "broken.json"
    path.write_text(json.dumps(data))  # json writes NaN as NaN
    return path


@pytest.mark.parametrize(
    "edit, key",
    [
        (lambda d: d["labels"].update({"tumour": {"scale": 1.0, "shift": 0.0}}), "unknown label 'tumour'"),
        (lambda d: d["labels"].pop("polyp"), "missing label 'polyp'"),
        (lambda d: d["labels"]["ulcer"].update(scale=float("nan")), "labels.ulcer.scale must be a finite number"),
        (lambda d: d["labels"]["ulcer"].update(shift=float("inf")), "labels.ulcer.shift must be a finite number"),
        (lambda d: d["labels"]["ulcer"].update(scale=0.0), "labels.ulcer.scale must be > 0"),
        (lambda d: d["labels"]["ulcer"].update(scale=-2.0), "labels.ulcer.scale must be > 0"),
        (lambda d: d["labels"]["ulcer"].update(slope=1.0), "labels.ulcer: unknown key 'slope'"),
        (lambda d: d.update(format="monai-vce thresholds"), "format must be"),
        (lambda d: d.update(version=2), "version must be 1"),
        (lambda d: d.update(method="isotonic"), "method must be one of"),
        (lambda d: d.update(extra=1), "unknown key 'extra'"),
        (lambda d: d.pop("labels"), "missing key 'labels'"),
        (lambda d: d["fit"]["nll_after"].update(polyp=float("nan")), "fit.nll_after.polyp must be a finite number"),
        (lambda d: d["fit"].update(method="temperature"), "fit.method must be"),
    ],
)
def test_load_refuses_invalid_files(tmp_path: Path, platt, edit, key):
    path = _broken(tmp_path, platt, edit)
    with pytest.raises(ValueError, match=re.escape(str(path))) as err:
        ProbabilityCalibration.load(path)
    assert key in str(err.value) and "\n" not in str(err.value)


def test_load_refuses_non_json_and_non_objects(tmp_path: Path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match=re.escape(str(bad))):
        ProbabilityCalibration.load(bad)
    bad.write_text("[1, 2]")
    with pytest.raises(ValueError, match=re.escape(str(bad)) + ".*must be an object"):
        ProbabilityCalibration.load(bad)


def test_load_calibration_optional_and_required(tmp_path: Path):
    missing = tmp_path / "none.json"
    assert load_calibration(None) is None
    assert load_calibration("") is None
    assert load_calibration(missing) is None
    with pytest.raises(FileNotFoundError, match=re.escape(str(missing))):
        load_calibration(missing, required=True)
    with pytest.raises(FileNotFoundError, match="required"):
        load_calibration(None, required=True)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"scale": [1.0] * 16}, "scale must be 17 numbers"),
        ({"shift": [0.0] * 18}, "shift must be 17 numbers"),
        ({"scale": "1"}, "scale must be 17 numbers"),
        ({"scale": [1.0] * 16 + [float("nan")]}, "scale of label 'ulcer' must be finite"),
        ({"scale": [1.0] + [0.0] + [1.0] * 15}, "scale of label 'esophagus' must be > 0"),
        ({"shift": [0.0] * 16 + [0.5], "method": "temperature"}, "shift of label 'ulcer' must be 0"),
        ({"method": "isotonic"}, "method must be one of 'temperature', 'platt'"),
        ({"fit": {"method": "platt"}}, "fit: missing key 'frames'"),
    ],
)
def test_constructor_errors(kwargs, match):
    with pytest.raises(ValueError, match=re.escape(match)):
        ProbabilityCalibration(**kwargs)


def test_call_and_fit_errors():
    cal = ProbabilityCalibration(scale=[2.0] * NUM_LABELS)
    for bad in (np.zeros((4, 16)), np.zeros(17), np.zeros((2, 3, 17))):
        with pytest.raises(ValueError, match=re.escape(str(bad.shape))):
            cal(bad)
    assert cal(np.zeros((0, NUM_LABELS))).shape == (0, NUM_LABELS)
    probs, targets = _frames(100, 1.0, 0.0)
    with pytest.raises(ValueError, match="shape"):
        ProbabilityCalibration.fit(probs, targets[:50])
    with pytest.raises(ValueError, match="no frame"):
        ProbabilityCalibration.fit(probs[:0], targets[:0])
    logits = probs.copy()
    logits[7, 2] = 3.5
    with pytest.raises(ValueError, match=r"frame 7 \(row\), label 'stomach'"):
        ProbabilityCalibration.fit(logits, targets)
    with pytest.raises(ValueError, match="min_positives"):
        ProbabilityCalibration.fit(probs, targets, min_positives=0)
    with pytest.raises(ValueError, match="max_frames"):
        ProbabilityCalibration.fit(probs, targets, max_frames=0)
    with pytest.raises(ValueError, match="method"):
        ProbabilityCalibration.fit(probs, targets, method="isotonic")


def test_fit_never_worse_than_identity_on_calibrated_input():
    probs, targets = _frames(50_000, 1.0, 0.0, seed=4)
    for method in CALIBRATION_METHODS:
        cal = ProbabilityCalibration.fit(probs, targets, method=method)
        info = cal.fit_info
        assert info is not None
        assert all(info["nll_after"][n] <= info["nll_before"][n] for n in LABELS)
        np.testing.assert_allclose(cal.scale, 1.0, atol=0.05)
        np.testing.assert_allclose(cal.shift, 0.0, atol=0.05)
        # checked independently: the cross-entropy of the output
        out = np.clip(cal(probs).astype(np.float64), 1e-6, 1 - 1e-6)
        p = np.clip(probs.astype(np.float64), 1e-6, 1 - 1e-6)
        bce = lambda q: -(targets * np.log(q) + (1 - targets) * np.log1p(-q)).mean(axis=0)  # noqa: E731
        assert np.all(bce(out) <= bce(p) + 1e-6)


def test_subsample_is_deterministic(miscalibrated):
    probs, targets = miscalibrated
    a = ProbabilityCalibration.fit(probs, targets, max_frames=20_000, seed=5)
    b = ProbabilityCalibration.fit(probs, targets, max_frames=20_000, seed=5)
    c = ProbabilityCalibration.fit(probs, targets, max_frames=20_000, seed=6)
    assert a.to_dict() == b.to_dict() and a.to_dict() != c.to_dict()
    assert a.fit_info is not None and a.fit_info["frames"] == 20_000
    np.testing.assert_allclose(a.scale, 2.0, atol=0.25)


# --- the calibration travels with the decoder parameters ------------------------------------------------------


def _sim_videos(seed, n=6, T=300, scale=0.5, shift=-1.0):
    """Videos whose probabilities are miscalibrated (logits x ``scale`` + ``shift``), with targets and events."""
    from monai_vce.events import Video
    from monai_vce.events.ground_truth import ground_truth_events

    rng = np.random.default_rng(seed)
    videos = []
    for i in range(n):
        targets = np.zeros((T, NUM_LABELS), np.float32)
        targets[: T // 2, LABELS.index("stomach")] = 1
        targets[T // 2 :, LABELS.index("small intestine")] = 1
        start = int(rng.integers(160, 260))
        targets[start : start + int(rng.integers(3, 20)), LABELS.index("ulcer")] = 1
        z = np.where(targets > 0, 3.0, -3.0) + rng.normal(0, 1.5, targets.shape)
        probs = (1 / (1 + np.exp(-(scale * z + shift)))).astype(np.float32)
        index = np.arange(T, dtype=np.int64)
        events = ground_truth_events(index, targets, video_id=str(i))
        videos.append(Video(str(i), probs, index, index, targets=targets, events=events))
    return videos


def test_decoder_applies_its_calibration_first():
    from monai_vce.postprocessing import DecoderParams, EventDecoder

    videos = _sim_videos(0)
    probs = np.concatenate([v.probs for v in videos])
    targets = np.concatenate([v.targets for v in videos])
    cal = ProbabilityCalibration.fit(probs, targets, method="platt")
    base = DecoderParams.paper(composition="per_label")
    with_cal = base.replace(calibration=cal.to_dict())
    assert with_cal.calibration is not None and np.allclose(with_cal.calibration.scale, cal.scale)
    v = videos[0]
    assert EventDecoder(with_cal)(v.probs, v.frame_index) == EventDecoder(base)(cal(v.probs), v.frame_index)
    np.testing.assert_array_equal(EventDecoder(with_cal).masks(v.probs), EventDecoder(base).masks(cal(v.probs)))
    assert DecoderParams(with_cal.to_dict()) == with_cal  # a parameter file keeps it
    broken = with_cal.to_dict()
    broken["calibration"]["labels"]["ulcer"]["scale"] = 0
    with pytest.raises(ValueError, match=r"calibration: labels\.ulcer\.scale must be > 0"):
        DecoderParams(broken)


def test_tuning_with_calibration_maps_the_base_thresholds():
    from monai_vce.postprocessing import DecoderParams, decode_videos, tune_decoder

    videos = _sim_videos(1)
    base = DecoderParams.from_thresholds({name: 0.3 for name in LABELS})
    plain = tune_decoder(videos, base=base, profile="paper", composition="per_label")
    calibrated = tune_decoder(videos, base=base, profile="paper", composition="per_label", calibration="platt")
    assert calibrated["calibration"]["method"] == "platt" and "calibration" not in plain
    # an increasing map with mapped thresholds decodes the raw probabilities to the same events
    assert decode_videos(videos, calibrated) == decode_videos(videos, plain)
    assert calibrated["fit"]["objective"] == pytest.approx(plain["fit"]["objective"])
    cal = calibrated.calibration
    assert cal is not None
    t = calibrated["labels"]["ulcer"]["threshold"]
    assert t == pytest.approx(float(cal(np.full((1, NUM_LABELS), 0.3, np.float32))[0, LABELS.index("ulcer")]))
    with pytest.raises(ValueError, match="has no frame targets"):
        tune_decoder([v.replace(targets=None) for v in videos], profile="paper", calibration="platt")
    with pytest.raises(ValueError, match="already carries a calibration"):
        tune_decoder(videos, base=calibrated, profile="paper", calibration="platt")


def test_screening_fitted_on_calibrated_probabilities():
    from monai_vce.postprocessing import decode_videos, tune_decoder

    videos = _sim_videos(2)
    screening = tune_decoder(videos, profile="screening", false_alarms_per_exam=1.0, calibration="temperature")
    assert screening["calibration"]["method"] == "temperature" and screening["scores"] is True
    events = decode_videos(videos, screening)["videos"]
    assert all("score" in e for v in events for e in v["events"])
    # the recorded expectation was computed on the calibrated validation probabilities: decoding the raw ones
    # with the parameters (which calibrate first) scores the same
    from monai_vce.events import event_json
    from monai_vce.metrics import lesion_froc

    gt = event_json({v.video_id: v.events for v in videos})
    found = lesion_froc(gt, {"videos": events})["overall"]["overlap"]["all_events"]
    expected = screening["fit"]["screening"]["expected"]
    assert found["sensitivity"] == pytest.approx(expected["sensitivity"])
    assert found["false_alarms_per_exam"] == pytest.approx(expected["false_alarms_per_exam"])
