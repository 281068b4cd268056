"""Multi-process training: ``torchrun -m monai.bundle run training`` with multi_gpu_train.json, 2 CPU processes (gloo)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
import torch
from bundle_helpers import DEMO, MULTI_GPU_TRAIN, REPO, TRAIN, config_list, free_port, tiny_overrides


@pytest.mark.background
@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed is not available")
def test_two_process_training(tmp_path, mini_galar):
    out = tmp_path / "ddp"
    torchrun = shutil.which("torchrun", path=os.path.dirname(sys.executable)) or "torchrun"
    cmd = [
        torchrun,
        "--nproc_per_node=2",
        f"--master_port={free_port()}",
        "-m",
        "monai.bundle",
        "run",
        "training",
        "--config_file",
        config_list(TRAIN, MULTI_GPU_TRAIN, DEMO),
        *tiny_overrides(mini_galar, out, max_epochs=1, samples_per_epoch=32),
    ]
    env = dict(os.environ, PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-6000:]
    last = torch.load(out / "models" / "checkpoint_last.pt", map_location="cpu", weights_only=True)
    # 32 samples over 2 ranks, 16 per rank, batches of 8: 2 iterations per rank and epoch
    assert last["trainer"]["epoch_length"] == 2 and last["trainer"]["iteration"] == 2
    assert not any(k.startswith("module.") for k in last["model"])  # saved without the DDP wrapper
    assert (out / "models" / "model.pt").is_file() and (out / "models" / "decoder.json").is_file()
    # the validation metrics are computed on all frames gathered from both ranks, and logged once (rank 0)
    assert len([line for line in log.splitlines() if "Metrics -- " in line and "val_temporal_mAP:" in line]) == 1
