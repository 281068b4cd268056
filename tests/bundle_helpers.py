"""Shared helpers of the bundle tests: paths, running a bundle command in this process or as a subprocess, and one
tiny training per session.

:func:`run_in_process` runs ``python -m monai.bundle ARGS`` without starting an interpreter (the same argument
parsing, captured output and exit status); :func:`run_bundle` starts the real command line, for the few tests that
check what only a subprocess shows. :func:`trained_bundle` trains once per session.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import random
import signal
import subprocess
import sys
import warnings
from collections.abc import Iterator
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
#: MONAI's published metadata schema (metadata.json's ``schema``), copied with its source: tests/testing_data/model_zoo/README.md.
SCHEMA = str(REPO / "tests" / "testing_data" / "model_zoo" / "meta_schema_20240725.json")
SCHEMA_SHA256 = "d95c74c2915faef04ff6a2d6bd865da922bc8cd5afb4a0719b2dc6e1220528e7"


def config_list(*files: str) -> str:
    """The ``--config_file`` value for several files, as users type it."""
    return "[" + ",".join(f"'{f}'" for f in files) + "]"


#: The tiny offline backbone at 64 px on the CPU, for configs resolved in-process.
TINY_NETWORK = {"backbone": "vce-tiny-vit-64", "pretrained": False, "image_size": 64, "device": "$torch.device('cpu')"}


def tiny_config_parser(files: list[str], data_dir: Path, tmp_path: Path, **override: Any) -> Any:
    """A ``monai.bundle.ConfigParser`` over ``files`` with the tiny network, ``data_dir`` as the dataset, models
    under ``tmp_path`` and no workers; ``override`` sets further ids."""
    from monai.bundle import ConfigParser

    parser = ConfigParser()
    parser.read_config(files)
    values = {**TINY_NETWORK, "dataset_dir": str(data_dir), "ckpt_dir": str(tmp_path / "models"), "num_workers": 0}
    values.update(override)
    for k, v in values.items():
        parser[k] = v
    return parser


def inference_workflow(dataset_dir: Path, tmp_path: Path, **overrides: Any) -> Any:
    """An initialised ``infer`` workflow of ``inference.json`` + ``demo.json`` over ``dataset_dir``, writing into
    ``tmp_path`` (``models``, ``out``), with config ``overrides``; nothing is run."""
    from monai.bundle import ConfigWorkflow

    wf = ConfigWorkflow(
        config_file=[INFERENCE, DEMO],
        meta_file=METADATA,
        logging_file=False,
        workflow_type="infer",
        dataset_dir=str(dataset_dir),
        ckpt_dir=str(tmp_path / "models"),
        output_dir=str(tmp_path / "out"),
        initialize=[],
        **overrides,
    )
    wf.initialize()
    return wf


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
    import torch

    # the session's thread count: 2, or 1 while the background lane takes the other core (tests/background_lane.py)
    threads = str(torch.get_num_threads())
    env = dict(os.environ, PYTHONWARNINGS="ignore", OMP_NUM_THREADS=threads, HF_HUB_OFFLINE="1")
    proc = subprocess.run(
        [sys.executable, "-m", module, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"python -m {module} {' '.join(args)} failed ({proc.returncode}):\n{(proc.stdout + proc.stderr)[-6000:]}"
        )
    return proc


class InProcessRun(subprocess.CompletedProcess):
    """The result of :func:`run_in_process`: ``args``, ``returncode``, ``stdout`` and ``stderr`` as a subprocess's."""


@contextlib.contextmanager
def _isolated(threads: int | None, env: dict[str, str]) -> Iterator[None]:
    """Run a bundle command in this process and give back the process as it was: logging handlers and levels, the
    exception hook, signal handlers, torch's threads, determinism and random states, numpy's and Python's random
    states, the working folder, ``sys.path`` and the environment; output locks the run still holds (a failed run
    skips MONAI's ``finalize``) are released, as at a process's exit."""
    import numpy as np
    import torch

    hook, cwd, path, environ = sys.excepthook, os.getcwd(), list(sys.path), dict(os.environ)
    root = logging.getLogger()
    loggers = [root, *(v for v in logging.Logger.manager.loggerDict.values() if isinstance(v, logging.Logger))]
    log_state = [(lg, lg.level, lg.disabled, lg.propagate, list(lg.handlers)) for lg in loggers]
    signals = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    torch_state = (
        torch.get_num_threads(),
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
        torch.backends.cudnn.deterministic,
        torch.backends.cudnn.benchmark,
        torch.get_default_dtype(),
        torch.get_rng_state(),
    )
    np_state, py_state = np.random.get_state(), random.getstate()
    from monai_vce.utils import OutputLock

    locks = set(OutputLock._held_here)
    os.environ.update(env)
    torch.set_num_threads(threads or torch_state[0])
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # as PYTHONWARNINGS=ignore in run_bundle's subprocesses
            yield
    finally:
        for key in set(OutputLock._held_here) - locks:
            OutputLock._held_here[key][1] = 1  # every hold of the run: the last release removes the file
            lock = object.__new__(OutputLock)
            lock._key = key
            lock.release()
        for lg, level, disabled, propagate, handlers in log_state:
            for h in lg.handlers:
                if h not in handlers:
                    h.close()
            lg.setLevel(level)
            lg.disabled, lg.propagate, lg.handlers[:] = disabled, propagate, handlers
        for s, handler in signals.items():
            signal.signal(s, handler)
        torch.set_num_threads(torch_state[0])
        torch.use_deterministic_algorithms(torch_state[1], warn_only=torch_state[2])
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = torch_state[3], torch_state[4]
        torch.set_default_dtype(torch_state[5])
        torch.set_rng_state(torch_state[6])
        np.random.set_state(np_state)
        random.setstate(py_state)
        sys.excepthook = hook
        os.chdir(cwd)
        sys.path[:] = path
        os.environ.clear()
        os.environ.update(environ)


@contextlib.contextmanager
def _captured(out: io.StringIO, err: io.StringIO) -> Iterator[None]:
    """Send ``sys.stdout`` / ``sys.stderr`` and the logging stream handlers already writing to them (MONAI's own
    loggers hold one) to ``out`` / ``err``; afterwards, handlers made during the run (MONAI adds one to each new
    logger) write to the process's streams, as they would have in a subprocess."""
    stdout, stderr = sys.stdout, sys.stderr
    streams = {id(s): out for s in (stdout, sys.__stdout__)} | {id(s): err for s in (stderr, sys.__stderr__)}
    moved = []
    for h in _stream_handlers():
        if id(h.stream) in streams:
            moved.append((h, h.setStream(streams[id(h.stream)])))
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            yield
    finally:
        for h, stream in moved:
            h.setStream(stream)
        for h in _stream_handlers():
            if h.stream is out or h.stream is err:
                h.setStream(stdout if h.stream is out else stderr)


def _stream_handlers() -> list[logging.StreamHandler]:
    """The plain stream handlers of every logger (file handlers and pytest's capture handlers aside)."""
    loggers = [logging.getLogger(), *logging.Logger.manager.loggerDict.values()]
    return [h for lg in loggers for h in getattr(lg, "handlers", []) if type(h) is logging.StreamHandler]


@contextlib.contextmanager
def _address_space(grow_mb: int | None) -> Iterator[None]:
    """Cap this process's address space at its current size plus ``grow_mb`` MiB (no cap for ``None``)."""
    import resource

    if grow_mb is None:
        yield
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    size = int(Path("/proc/self/statm").read_text().split()[0]) * resource.getpagesize()
    cap = size + grow_mb * 2**20
    resource.setrlimit(resource.RLIMIT_AS, (cap if hard == resource.RLIM_INFINITY else min(cap, hard), hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def run_in_process(
    args: list[str],
    check: bool = True,
    threads: int | None = None,
    memory_mb: int | None = None,
    cwd: str | Path = REPO,
    **env: str,
) -> InProcessRun:
    """Run ``python -m monai.bundle ARGS`` in this process: the command line's parsing (python-fire) and the same
    functions, with no interpreter to start; the process is restored afterwards (see :func:`_isolated`).

    Args:
        args: the command-line arguments after ``python -m monai.bundle``.
        check: raise an ``AssertionError`` showing the output's tail when the command fails.
        threads: torch's thread count during the run (``OMP_NUM_THREADS`` of a subprocess); by default the
            session's (2, or 1 while the background lane runs: tests/background_lane.py).
        memory_mb: when given, the address space may grow by at most this many MiB during the run (a subprocess's
            ``RLIMIT_AS`` cap, see tests/capped.py): a regression allocating without bound fails the run with a
            ``MemoryError`` instead of taking the machine down.
        cwd: the working folder of the run (the repository root unless given).
        env: environment variables set during the run (``HF_HUB_OFFLINE=1`` always).

    Returns:
        the command's exit status (0, the code of a ``SystemExit``, or 1 for an exception, whose traceback and the
        bundle's one-line summary are printed to ``stderr`` by the exception hook, as the interpreter does) and
        its captured output.
    """
    import fire
    import monai.bundle.__main__ as cli  # what ``python -m monai.bundle`` hands to python-fire: its globals

    commands = {k: v for k, v in vars(cli).items() if callable(v) and not k.startswith("_")}
    out, err = io.StringIO(), io.StringIO()
    code = 0
    with _isolated(threads, {"HF_HUB_OFFLINE": "1", **env}), _address_space(memory_mb), _captured(out, err):
        os.chdir(cwd)
        try:
            fire.Fire(commands, command=list(args), name="monai.bundle")
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else int(e.code is not None)  # sys.exit(): 0, a message: 1
        except Exception as e:
            code = 1
            sys.excepthook(type(e), e, e.__traceback__)
    proc = InProcessRun(args, code, out.getvalue(), err.getvalue())
    if check and code != 0:
        raise AssertionError(f"monai.bundle {' '.join(args)} failed ({code}):\n{(proc.stdout + proc.stderr)[-6000:]}")
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
