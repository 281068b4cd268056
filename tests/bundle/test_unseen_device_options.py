"""The unseen-capsule remedies as bundle options: exam normalisation (its colour reference), TTA, per-exam
recalibration in the decode stage, and the validation score distribution training writes for it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from bundle_helpers import CONFIGS, DEMO, EVALUATE, TRAIN, config_list, inference_args, run_in_process, tiny_overrides
from bundle_helpers import trained_bundle as _trained_bundle
from scipy.special import expit, logit

from monai_vce.data import color_reference, generate_mini_galar
from monai_vce.labels import LABELS, NUM_LABELS
from monai_vce.postprocessing import DecoderParams, EventDecoder, ReferenceQuantiles, recalibrate_decoder

EXAM_NORM_TRAIN = str(CONFIGS / "exam_norm_train.json")
EXAM_NORM_EVALUATE = str(CONFIGS / "exam_norm_evaluate.json")
EXAM_NORM_INFERENCE = str(CONFIGS / "exam_norm_inference.json")
TTA = str(CONFIGS / "tta.json")
RECALIBRATION = str(CONFIGS / "recalibration.json")
INFERENCE = str(CONFIGS / "inference.json")


# --- the colour reference ----------------------------------------------------------------------------------------
def _stats(values: dict[str, float]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    return {v: (np.full(3, m), np.full(3, m / 2)) for v, m in values.items()}


def test_color_reference_is_written_once_and_read_back(tmp_path):
    path = tmp_path / "models" / "color_reference.json"
    with pytest.raises(FileNotFoundError, match=r"exam_norm_train\.json"):
        color_reference(path)
    stats = _stats({"a": 0.2, "b": 0.4, "c": 0.9})
    mean, std = color_reference(path, stats, videos=["a", "b"])  # the training split only
    np.testing.assert_allclose(mean, 0.3)
    np.testing.assert_allclose(std, 0.15)
    assert json.loads(path.read_text())["videos"] == ["a", "b"]
    # read back as written; a later call with other exams (an evaluation) keeps the model's reference
    np.testing.assert_array_equal(color_reference(path)[0], mean)
    np.testing.assert_array_equal(color_reference(path, _stats({"x": 0.8}))[0], mean)
    # a new training recomputes it
    np.testing.assert_allclose(color_reference(path, stats, overwrite=True)[0], 0.5)
    with pytest.raises(ValueError, match="no exam statistics for videos"):
        color_reference(path, stats, videos=["a", "zz"], overwrite=True)


def test_color_reference_refuses_a_malformed_file(tmp_path):
    bad = tmp_path / "ref.json"
    bad.write_text(json.dumps({"format": "monai-vce colour reference", "mean": [0.1, 0.2], "std": [0.1, 0.0]}))
    with pytest.raises(ValueError, match=r"ref\.json"):
        color_reference(bad)
    bad.write_text(json.dumps({"mean": [0.1], "std": [0.1]}))
    with pytest.raises(ValueError, match="not a colour reference"):
        color_reference(bad)


# --- per-exam recalibration in the decoder ---------------------------------------------------------------------
def _exam(n: int = 3000, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    z = rng.normal(loc=-3.0, scale=1.0, size=(n, NUM_LABELS))
    z[n // 3 : n // 3 + 200] += 5.0  # one long event of every label
    return expit(z)


def _device(p: np.ndarray) -> np.ndarray:
    """The same frames seen by another capsule: logits shrunk and shifted (a monotone change of every score)."""
    return expit(0.6 * logit(p) - 2.0)


def test_recalibrated_decoder_decodes_a_shifted_exam_like_the_reference():
    ref_probs = _exam(seed=0)
    reference = ReferenceQuantiles.from_probabilities(ref_probs)
    params = DecoderParams.from_thresholds(dict.fromkeys(LABELS, 0.5))
    exam = _exam(seed=1)
    expected = EventDecoder(params).masks(exam)
    shifted = _device(exam)
    # the fitted thresholds miss most of the shifted exam's active frames; recalibrated to it, they find them
    plain = EventDecoder(params).masks(shifted)
    assert plain.sum() < 0.5 * expected.sum()
    recalibrated = EventDecoder(recalibrate_decoder(params, shifted, reference)).masks(shifted)
    assert (recalibrated == expected).mean() > 0.99


def test_recalibration_moves_presence_cutoffs_and_keeps_other_rules():
    reference = ReferenceQuantiles.from_probabilities(_exam(seed=0))
    d = DecoderParams.from_thresholds(dict.fromkeys(LABELS, 0.5)).to_dict()
    d["labels"][LABELS[9]]["presence"] = {"feature": "peak", "window": 9, "cutoff": 0.6}
    d["labels"][LABELS[10]]["presence"] = {"feature": "support", "cutoff": 20.0}
    params = DecoderParams(d)
    shifted = _device(_exam(seed=1))
    new = recalibrate_decoder(params, shifted, reference)
    peak = new.presence_rules()[9]
    assert peak["feature"] == "peak" and peak["window"] == 9 and peak["cutoff"] < 0.6  # the exam scores lower
    assert new.presence_rules()[10] == {"feature": "support", "cutoff": 20.0}
    unchanged = recalibrate_decoder(params, shifted, reference, presence=False)
    assert unchanged.presence_rules()[9]["cutoff"] == 0.6


def test_decode_stage_recalibrates_each_exam(tmp_path):
    from monai_vce.events.probabilities import Video, save_video_probs
    from monai_vce.stages import decode

    reference = ReferenceQuantiles.from_probabilities(_exam(seed=0))
    reference_file = reference.save(tmp_path / "reference_quantiles.json")
    probs_dir = tmp_path / "probs"
    shifted = _device(_exam(seed=1)).astype(np.float32)
    ids = np.arange(len(shifted))
    save_video_probs(probs_dir / "v1.npz", Video("v1", shifted, ids, ids))
    params = DecoderParams.from_thresholds(dict.fromkeys(LABELS, 0.5))
    plain = json.loads(decode(probs_dir, tmp_path / "plain.json", params).read_text())
    recal = json.loads(decode(probs_dir, tmp_path / "recal.json", params, recalibration=reference_file).read_text())
    n_plain, n_recal = (sum(len(v["events"]) for v in obj["videos"]) for obj in (plain, recal))
    assert n_recal > n_plain
    with pytest.raises(ValueError, match="needs an EventDecoder"):
        decode(probs_dir, tmp_path / "x.json", lambda p, f, **k: [], recalibration=reference)


# --- the bundle options, end to end --------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def trained(tmp_path_factory, mini_galar):
    return _trained_bundle(tmp_path_factory, mini_galar)


def _probs(folder: Path) -> dict[str, np.ndarray]:
    out = {}
    for f in sorted(folder.glob("*.npz")):
        with np.load(f) as z:
            out[f.stem] = z["probs"]
    return out


def test_training_writes_the_validation_score_distribution(trained):
    from monai_vce.postprocessing import load_reference_quantiles

    reference = load_reference_quantiles(trained["models"] / "reference_quantiles.json")
    assert reference.counts.min() > 0 and reference.values.shape[1] == NUM_LABELS


def test_tta_and_recalibration_options_run_in_the_bundle(trained, mini_galar, tmp_path):
    plain = tmp_path / "plain"
    run_in_process(inference_args(trained["models"], mini_galar / "frames", plain, "--report", "False"))
    tta = tmp_path / "tta"
    configs = (INFERENCE, DEMO, TTA, RECALIBRATION)
    proc = run_in_process(
        inference_args(trained["models"], mini_galar / "frames", tta, "--report", "False", configs=configs)
    )
    p0, p1 = _probs(plain / "probs"), _probs(tta / "probs")
    assert p0.keys() == p1.keys() and p0
    assert any(not np.allclose(p0[v], p1[v]) for v in p0)  # the views' average is another prediction
    for obj in (json.loads((tta / n).read_text()) for n in ("events.json", "screening_events.json")):
        assert [v["video_id"] for v in obj["videos"]] == sorted(p1)
    assert proc.returncode == 0


def _recoloured_copy(src: Path, dst: Path, gain: tuple[float, float, float]) -> Path:
    """A copy of a Galar-layout folder whose frames are seen through another colour response."""
    from PIL import Image

    shutil.copytree(src, dst)
    for f in (dst / "frames").rglob("*"):
        if f.suffix.lower() == ".png":
            x = np.asarray(Image.open(f).convert("RGB"), dtype=np.float64)
            Image.fromarray(np.clip(x * np.asarray(gain), 0, 255).round().astype(np.uint8)).save(f)
    return dst


def test_exam_normalisation_trains_and_infers_invariant_to_the_colour_response(mini_galar, tmp_path):
    out = tmp_path / "run"
    args = ["run", "training", "--config_file", config_list(TRAIN, DEMO, EXAM_NORM_TRAIN)]
    run_in_process([*args, *tiny_overrides(mini_galar, out, max_epochs=1)])
    reference = json.loads((out / "models" / "color_reference.json").read_text())
    assert len(reference["mean"]) == 3 and 0 < len(reference["videos"]) < len(list((mini_galar / "frames").iterdir()))
    recoloured = _recoloured_copy(mini_galar, tmp_path / "recoloured", (0.8, 0.95, 0.7))
    configs = (INFERENCE, DEMO, EXAM_NORM_INFERENCE)
    probs = {}
    for name, folder in (("original", mini_galar), ("recoloured", recoloured)):
        for cfg in (configs, (INFERENCE, DEMO)):
            o = tmp_path / f"{name}_{len(cfg)}"
            run_in_process(inference_args(out / "models", folder / "frames", o, "--report", "False", configs=cfg))
            probs[name, len(cfg)] = _probs(o / "probs")
    normalised = max(np.abs(probs["original", 3][v] - probs["recoloured", 3][v]).max() for v in probs["original", 3])
    plain = max(np.abs(probs["original", 2][v] - probs["recoloured", 2][v]).max() for v in probs["original", 2])
    assert normalised < plain  # normalisation undoes most of the colour change
    # exams given as video files are normalised with statistics of their decoded frames
    videos = tmp_path / "videos"
    generate_mini_galar(videos, videos=2, frames_per_video=40, size=32, seed=5, video_format="mp4", progress=False)
    o = tmp_path / "video_files"
    run_in_process(inference_args(out / "models", videos / "frames", o, "--report", "False", configs=configs))
    assert len(_probs(o / "probs")) == 2
    # an evaluation reads the model's reference and never rewrites it
    before = (out / "models" / "color_reference.json").read_bytes()
    eval_args = ["run", "evaluating", "--config_file", config_list(TRAIN, EVALUATE, DEMO, EXAM_NORM_EVALUATE)]
    run_in_process([*eval_args, *tiny_overrides(recoloured, out, report=False, review=False)])
    assert (out / "models" / "color_reference.json").read_bytes() == before
