"""Small shared helpers: atomic file writing and exclusive output-folder locks.

Every file the project writes goes through :func:`atomic_write_bytes` (temporary file in the same folder,
``fsync``, ``os.replace``), so a file that exists under its final name is complete, and a run killed at
any moment leaves either the previous version or the new one, never half of one.
"""

from __future__ import annotations

import io
import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["atomic_write_bytes", "atomic_write_text", "atomic_write_json", "atomic_save_npz", "OutputLock"]

PathLike = str | os.PathLike

_UMASK = os.umask(0)
os.umask(_UMASK)


def atomic_write_bytes(path: PathLike, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically and durably.

    Args:
        path: destination file; its parent folders are created when missing.
        data: the complete file content.

    Returns:
        The destination path.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        # mkstemp creates 0600 files; give the result the permissions a plain open() would
        os.fchmod(fd, 0o666 & ~_UMASK)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    # the rename itself is durable only once the folder entry is flushed
    try:
        dfd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError:
        pass
    return path


def atomic_write_text(path: PathLike, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically (see :func:`atomic_write_bytes`)."""
    return atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(
    path: PathLike, obj: Any, indent: int | None = 2, validate: Callable[[Any], Any] | None = None
) -> Path:
    """Serialise ``obj`` as JSON and write it atomically.

    Args:
        path: destination file.
        obj: a JSON-serialisable object.
        indent: JSON indentation; ``None`` for the most compact form.
        validate: optional callable run on ``obj`` before anything is written; it raises on invalid
            content so that an invalid file never replaces a valid one.
    """
    if validate is not None:
        validate(obj)
    return atomic_write_text(path, json.dumps(obj, indent=indent) + "\n")


def atomic_save_npz(path: PathLike, **arrays: Any) -> Path:
    """Save arrays to an ``.npz`` file atomically: a file that exists under ``path`` is complete."""
    buf = io.BytesIO()
    import numpy as np

    np.savez(buf, **arrays)
    return atomic_write_bytes(path, buf.getvalue())


class OutputLock:
    """An exclusive lock on an output folder, so that two runs never write into the same folder at once.

    The lock is a file ``<folder>/.monai_vce.lock`` holding the owner's process id, created with
    ``O_EXCL``. A lock left by a process that no longer exists (a killed run) is taken over.

    Args:
        folder: the output folder to lock; created when missing.

    Example::

        with OutputLock(out_dir):
            ...  # write outputs
    """

    name = ".monai_vce.lock"

    def __init__(self, folder: PathLike) -> None:
        self.folder = Path(folder)
        self.path = self.folder / self.name
        self._held = False

    @staticmethod
    def _alive(pid: int) -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True

    def acquire(self) -> OutputLock:
        """Take the lock or raise ``RuntimeError`` naming the folder and the process holding it."""
        self.folder.mkdir(parents=True, exist_ok=True)
        for _ in range(2):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                try:
                    pid = int(self.path.read_text().strip() or "0")
                except (OSError, ValueError):
                    pid = 0
                if pid and pid != os.getpid() and self._alive(pid):
                    raise RuntimeError(
                        f"output folder {self.folder} is in use by another run (process {pid}); "
                        f"wait for it to finish or choose another output folder (if no run uses it, e.g. after a "
                        f"restart, delete {self.path})"
                    ) from None
                # stale lock of a dead process: take it over
                try:
                    self.path.unlink()
                except FileNotFoundError:
                    pass
                continue
            with os.fdopen(fd, "w") as f:
                f.write(str(os.getpid()))
            self._held = True
            return self
        raise RuntimeError(f"could not lock output folder {self.folder}")

    def release(self) -> None:
        """Release the lock if this object holds it."""
        if self._held:
            try:
                self.path.unlink()
            except FileNotFoundError:
                pass
            self._held = False

    def __enter__(self) -> OutputLock:
        return self.acquire()

    def __exit__(self, *exc: Any) -> None:
        self.release()
