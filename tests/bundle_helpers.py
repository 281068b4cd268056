"""Shared helpers of the bundle tests: paths, running ``python -m monai.bundle`` and one tiny training per session.

The bundle tests run the bundle the way users do (``python -m monai.bundle ...`` in a subprocess, the configs
of ``bundle/configs`` plus ``demo.json`` and command-line overrides) on the session's tiny generated
mini-Galar with the tiny offline backbone. The trained run is shared: :func:`trained_bundle` trains once per
session and caches the result.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
BUNDLE = REPO / "bundle"
CONFIGS = BUNDLE / "configs"
TRAIN = str(CONFIGS / "train.json")
EVALUATE = str(CONFIGS / "evaluate.json")
INFERENCE = str(CONFIGS / "inference.json")
DEMO = str(CONFIGS / "demo.json")
FRAME_CACHE = str(CONFIGS / "frame_cache.json")
MULTI_GPU_TRAIN = str(CONFIGS / "multi_gpu_train.json")
METADATA = str(CONFIGS / "metadata.json")
SCHEMA = str(CONFIGS / "schema" / "meta_schema.json")


def config_list(*files: str) -> str:
    """The ``--config_file`` value for several files, as users type it."""
    return "[" + ",".join(f"'{f}'" for f in files) + "]"


def tiny_overrides(data_dir: Path, out_dir: Path, **extra: Any) -> list[str]:
    """Command-line overrides for a fast run on ``data_dir`` writing under ``out_dir``."""
    values: dict[str, Any] = {
        "bundle_root": str(BUNDLE),
        "dataset_dir": str(data_dir),
        "ckpt_dir": str(out_dir / "models"),
        "output_dir": str(out_dir / "eval"),
        "max_epochs": 2,
        "val_interval": 1,  # the real default (the demo validates only at its end)
        "samples_per_epoch": 24,
        "batch_size": 8,
        "val_batch_size": 32,
        "num_workers": 0,
        "progress": False,
    }
    values.update(extra)
    args: list[str] = []
    for k, v in values.items():
        args += [f"--{k}", str(v)]
    return args


def inference_args(
    models: Path, data_dir: Path, out: Path, *extra: str, configs: tuple[str, ...] = (INFERENCE, DEMO)
) -> list[str]:
    """Arguments of ``python -m monai.bundle run`` inferring ``data_dir`` into ``out`` with the checkpoint folder
    ``models`` at the tests' tiny size (batch 16, no workers, no progress bar); ``extra`` arguments come last."""
    return [
        "run",
        "--config_file",
        config_list(*configs),
        "--bundle_root",
        str(Path(TRAIN).parents[1]),
        "--dataset_dir",
        str(data_dir),
        "--ckpt_dir",
        str(models),
        "--output_dir",
        str(out),
        "--batch_size",
        "16",
        "--num_workers",
        "0",
        "--progress",
        "False",
        *extra,
    ]


def run_bundle(
    args: list[str], timeout: float = 300, check: bool = True, module: str = "monai.bundle"
) -> subprocess.CompletedProcess:
    """Run ``python -m monai.bundle ARGS`` from the repository root; on failure, show the output's tail."""
    env = dict(os.environ, PYTHONWARNINGS="ignore", OMP_NUM_THREADS="2", HF_HUB_OFFLINE="1")
    proc = subprocess.run(
        [sys.executable, "-m", module, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"python -m {module} {' '.join(args)} failed ({proc.returncode}):\n{(proc.stdout + proc.stderr)[-6000:]}"
        )
    return proc


def free_port() -> int:
    """A TCP port free on this machine now (for a process group's rendezvous)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


_CACHE: dict[str, dict[str, Path]] = {}


def trained_bundle(tmp_path_factory: Any, mini_galar: Path) -> dict[str, Path]:
    """Train the bundle once per session (2 epochs, tiny backbone) and return its paths.

    Returns:
        ``{"out", "models", "eval", "log"}``: the run folder, its checkpoint folder, its output folder and the
        training log file.
    """
    key = str(mini_galar)
    if key not in _CACHE:
        out = tmp_path_factory.mktemp("bundle_train")
        proc = run_bundle(
            [
                "run",
                "training",
                "--config_file",
                config_list(TRAIN, DEMO),
                *tiny_overrides(mini_galar, out),
                "--log_iterations",  # the demo logs no per-iteration lines; the log tests read the training loss
                "True",
            ]
        )
        log = out / "train.log"
        log.write_text(proc.stdout + proc.stderr)
        _CACHE[key] = {"out": out, "models": out / "models", "eval": out / "eval", "log": log}
    return _CACHE[key]


def chain_text(exc: BaseException | None) -> str:
    """The messages of an exception and of its causes / contexts, one a line (MONAI wraps errors raised in
    transforms and config expressions)."""
    parts, seen = [], set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        parts.append(f"{type(exc).__name__}: {exc}")
        exc = exc.__cause__ or exc.__context__
    return "\n".join(parts)


def require_integration(module: str, extra: str) -> Any:
    """Import an optional integration's ``module``; skip the test when it is missing, unless ``.ci/integration`` runs
    the test in the environment it installed for ``extra`` (``MONAI_VCE_INTEGRATION=extra``): then a missing module
    fails it."""
    import importlib

    import pytest

    if os.environ.get("MONAI_VCE_INTEGRATION") == extra:
        return importlib.import_module(module)
    return pytest.importorskip(
        module, reason=f"{module} is not installed (pip install 'monai-vce[{extra}]', in its own virtual environment)"
    )
