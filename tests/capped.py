"""Running test subprocesses under a memory cap, so that a regression can never take the machine down.

A test feeding a hostile input (a decompression bomb, ``/dev/zero`` as an event file, a huge decoder window) to
code that is supposed to refuse it runs that code in a child process whose address space is limited with
``resource.setrlimit(RLIMIT_AS)``: if the refusal regresses, the child fails with a ``MemoryError`` (or is stopped by
the kernel) instead of the machine's out-of-memory killer picking a victim.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]

#: Address space of a child that imports torch and the package (importing torch alone maps about 4 GB).
TORCH_CAP_MB = 8192
#: Address space of a child that needs numpy only (the event-file and CSV readers, the metric command line).
LIGHT_CAP_MB = 1536


def memory_cap(limit_mb: int) -> Callable[[], None]:
    """A ``preexec_fn`` limiting the child's address space to ``limit_mb`` MiB (soft and hard limit)."""

    def apply() -> None:
        limit = int(limit_mb) * 1024**2
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    return apply


def run_capped(
    argv: Sequence[str], limit_mb: int = TORCH_CAP_MB, timeout: float = 300, env: dict | None = None, **kw: Any
) -> subprocess.CompletedProcess:
    """``subprocess.run(argv)`` from the repository root under a memory cap, capturing text output."""
    return subprocess.run(
        list(argv),
        cwd=REPO,
        env=env if env is not None else {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"},
        capture_output=True,
        text=True,
        timeout=timeout,
        preexec_fn=memory_cap(limit_mb),
        **kw,
    )


def python_capped(
    code: str, *args: str, limit_mb: int = TORCH_CAP_MB, timeout: float = 300
) -> subprocess.CompletedProcess:
    """Run ``python -c code args...`` under a memory cap (see :func:`run_capped`)."""
    return run_capped([sys.executable, "-c", code, *args], limit_mb=limit_mb, timeout=timeout)
