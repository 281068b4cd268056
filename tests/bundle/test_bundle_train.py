"""Training through ``python -m monai.bundle run training`` (train.json + demo.json + command-line overrides)."""

from __future__ import annotations

import json

import pytest
import torch
from bundle_helpers import DEMO, TRAIN, require_integration, trained_bundle


@pytest.fixture(scope="module")
def run(tmp_path_factory, mini_galar):
    return trained_bundle(tmp_path_factory, mini_galar)


def test_training_writes_best_and_last_state(run):
    models = run["models"]
    last = torch.load(models / "checkpoint_last.pt", map_location="cpu", weights_only=True)
    assert set(last) >= {"model", "ema", "optimizer", "lr_scheduler", "sampler", "trainer"}
    # --max_epochs 2 on the command line reached the trainer
    trainer = last["trainer"]  # ignite's state dict: the epoch is iteration // epoch_length
    assert trainer["max_epochs"] == 2 and trainer["iteration"] == 2 * trainer["epoch_length"] == 6
    assert set(last["sampler"]) == {"seed", "epoch"}
    # model.pt is the EMA network as a plain state dict (what MONAI bundles, Label and Deploy load)
    best = torch.load(models / "model.pt", map_location="cpu", weights_only=True)
    assert all(isinstance(v, torch.Tensor) for v in best.values())
    assert set(best) == set(last["ema"])
    from monai_vce.networks import DiffAttnCLIPClassifier

    net = DiffAttnCLIPClassifier(backbone="vce-tiny-vit-64", pretrained=False, image_size=64)
    net.load_state_dict(best)
    # the EMA weights differ from the trained ones (they are an average)
    assert any(
        not torch.equal(last["ema"][k], last["model"][k]) for k in last["model"] if last["model"][k].is_floating_point()
    )
    no_tmp = [p.name for p in models.iterdir() if p.name.startswith(".")]
    assert no_tmp == [], f"temporary files left behind: {no_tmp}"


def test_training_tunes_thresholds_and_decoder(run):
    from monai_vce.labels import LABELS
    from monai_vce.postprocessing.decoder import DecoderParams

    params = DecoderParams.load(run["models"] / "decoder.json")
    assert params["frame_units"] == "frame_index" and set(params["labels"]) >= set(LABELS)
    assert params.data["fit"]["videos"] >= 1
    thresholds = json.loads((run["models"] / "thresholds.json").read_text())
    assert set(LABELS) <= set(thresholds.get("thresholds", thresholds))


def test_training_log_reports_validation_metrics(run):
    log = run["log"].read_text()
    for name in ("val_temporal_mAP", "val_mean_AP", "val_macro_F1", "train_loss"):
        assert name in log, name
    assert "decoder tuned on" in log
    # the progress handlers' summaries: every sampled training frame (3 batches of 8), every validation frame
    import re

    assert re.findall(r"VCETrainer - INFO - training: (\d+) frames in", log) == ["24", "24"]
    val = re.findall(r"SupervisedEvaluator - INFO - validation: (\d+) frames, (\d+) videos in", log)
    assert len(val) == 2 and val[0] == val[1] and int(val[0][0]) > 0 and int(val[0][1]) >= 1


def test_tracking_flag_needs_mlflow(tmp_path, mini_galar):
    """``--tracking mlflow`` (MONAI's experiment tracking) works with the bundle where mlflow is installed."""
    require_integration("mlflow", "mlflow")
    from bundle_helpers import config_list, run_in_process, tiny_overrides

    out = tmp_path / "run"
    args = ["run", "training", "--config_file", config_list(TRAIN, DEMO), "--tracking", "mlflow"]
    run_in_process(
        args + tiny_overrides(mini_galar, out, max_epochs=1, tracking_uri=f"sqlite:///{tmp_path / 'mlruns.db'}")
    )
    assert (out / "models" / "model.pt").is_file()
    assert (tmp_path / "mlruns.db").is_file()  # the run was tracked


def test_training_from_the_frame_cache(tmp_path, mini_galar):
    """frame_cache.json: the training frames are decoded once into the cache, then read from it."""
    from bundle_helpers import FRAME_CACHE, config_list, run_in_process, tiny_overrides

    out, cache = tmp_path / "run", tmp_path / "cache"
    args = ["run", "training", "--config_file", config_list(TRAIN, DEMO, FRAME_CACHE)]
    extra = {"max_epochs": 1, "frame_cache_dir": cache, "frame_cache_size": 64}
    run_in_process(args + tiny_overrides(mini_galar, out, **extra))
    arrays = sorted(cache.glob("64px/*.npy"))
    manifests = sorted(cache.glob("64px/*.json"))
    assert arrays and len(arrays) == len(manifests)
    assert (out / "models" / "model.pt").is_file() and (out / "models" / "checkpoint_last.pt").is_file()
    # a second run reuses the cache: the arrays are not rewritten
    stamps = [p.stat().st_mtime_ns for p in arrays]
    run_in_process(args + tiny_overrides(mini_galar, tmp_path / "run2", **extra))
    assert [p.stat().st_mtime_ns for p in arrays] == stamps
