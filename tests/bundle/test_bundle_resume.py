"""A training run killed after epoch 1 resumes from its last checkpoint and ends like an uninterrupted one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from bundle_helpers import DEMO, TRAIN, config_list, run_bundle, run_in_process, tiny_overrides


@pytest.mark.background
def test_training_killed_after_epoch_1_resumes(tmp_path, mini_galar):
    out = tmp_path / "run"
    base = ["run", "training", "--config_file", config_list(TRAIN, DEMO)]
    overrides = tiny_overrides(mini_galar, out, max_epochs=2)
    # end the process abruptly (no cleanup, like SIGKILL: a subprocess) once epoch 1 is validated and checkpointed
    training = json.loads(Path(TRAIN).read_text())["training"]
    kill = "$@train#trainer.add_event_handler(ignite.engine.Events.EPOCH_COMPLETED, lambda e: os._exit(9) if e.state.epoch == 1 else None)"
    killed = ["$import ignite", *training[:-1], kill, training[-1]]
    proc = run_bundle(base + overrides + ["--training", json.dumps(killed)], check=False)
    assert proc.returncode == 9, (proc.stdout + proc.stderr)[-3000:]
    last = torch.load(out / "models" / "checkpoint_last.pt", map_location="cpu", weights_only=True)
    epoch_length = last["trainer"]["epoch_length"]
    assert last["trainer"]["iteration"] == epoch_length  # one epoch done
    assert (out / "models" / "model.pt").is_file()
    # the validator's best metric and the best-model saver's memory are in the checkpoint
    best_state = last["best"]
    assert best_state["best_metric_epoch"] == 1 and 0.0 <= best_state["best_metric"] <= 1.0
    assert [p for p, _ in best_state["saved"]] == [best_state["best_metric"]]
    # make the epoch-1 model unbeatable (mAP <= 1): a resumed run that forgot it would overwrite model.pt
    best_state["best_metric"] = 2.0
    best_state["saved"] = [(2.0, name) for _, name in best_state["saved"]]
    torch.save(last, out / "models" / "checkpoint_last.pt")
    kept = {name: (out / "models" / name).read_bytes() for name in ("model.pt", "decoder.json", "thresholds.json")}

    proc = run_in_process(base + overrides + ["--resume", "True", "--log_iterations", "True"])  # the demo logs none
    log = proc.stdout + proc.stderr
    (tmp_path / "resume.log").write_text(log)
    assert f"Restored all variables from {out / 'models' / 'checkpoint_last.pt'}" in log
    # only the second epoch ran (and its validation)
    assert "VCETrainer - INFO - Epoch[2] Complete" in log and "Epoch[1] Complete" not in log
    assert "Epoch: 2/2, Iter: 1/" in log and "Epoch: 1/2" not in log
    last = torch.load(out / "models" / "checkpoint_last.pt", map_location="cpu", weights_only=True)
    assert last["trainer"]["iteration"] == 2 * epoch_length and last["trainer"]["max_epochs"] == 2
    # epoch 2 did not beat the restored best: the best model, its decoder and thresholds are untouched
    assert (last["best"]["best_metric"], last["best"]["best_metric_epoch"]) == (2.0, 1)
    assert "Got new best metric" not in log
    for name, data in kept.items():
        assert (out / "models" / name).read_bytes() == data, f"{name} was overwritten after resuming"
    best = torch.load(out / "models" / "model.pt", map_location="cpu", weights_only=True)
    assert all(torch.isfinite(v).all() for v in best.values() if v.is_floating_point())
    from monai_vce.networks import DiffAttnCLIPClassifier

    DiffAttnCLIPClassifier(backbone="vce-tiny-vit-64", pretrained=False, image_size=64).load_state_dict(best)
