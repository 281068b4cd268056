"""Small shared helpers: atomic writes, checked file and JSON reading, output-folder locks, checksums of weight files,
natural sort order, the bundle folder, lazy sequences and mappings, the one-line summary of a failed run.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import hashlib
import io
import json
import logging
import os
import re
import sys
import tempfile
import zipfile
import zlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, BinaryIO, ClassVar

__all__ = [
    "natural_key",
    "short_repr",
    "safe_text",
    "check_setting",
    "open_regular_file",
    "read_regular_file",
    "loads_json",
    "read_json_file",
    "atomic_write_bytes",
    "atomic_write_text",
    "atomic_write_json",
    "atomic_save_npz",
    "seal_torch_bytes",
    "check_torch_seal",
    "OutputLock",
    "error_summary",
    "report_errors_last",
    "LazySequence",
    "LazyMapping",
]

PathLike = str | os.PathLike

_UMASK = os.umask(0)
os.umask(_UMASK)


def short_repr(value: Any, limit: int = 80) -> str:
    """``repr(value)`` cut to ``limit`` characters (with ``...``), so that a hostile value never floods a message."""
    if isinstance(value, str) and len(value) > 4 * limit:
        value = value[: 4 * limit]  # repr of a huge string is never built
    text = repr(value)
    return text if len(text) <= limit else text[: max(limit - 3, 1)] + "..."


def safe_text(value: Any) -> str:
    """``str(value)`` with control characters (newlines, escapes, ...) written as ``\\n``, ``\\x1b``, ...

    For file names and other outside text in log lines and messages: a name holding a newline cannot forge a
    second log line, nor an escape sequence recolour the terminal. Printable text (any script) is kept as is.
    """
    text = os.fspath(value) if isinstance(value, os.PathLike) else str(value)
    if isinstance(text, bytes):
        text = text.decode("utf-8", "backslashreplace")
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


_SETTING_KINDS = ("path", "int", "number", "bool", "str")


def check_setting(
    name: str,
    value: Any,
    kind: str,
    *,
    minimum: float | None = None,
    maximum: float | None = None,
    choices: Sequence[Any] | None = None,
    optional: bool = False,
    exists: bool = False,
) -> Any:
    """Validate one setting where it enters (a bundle override, a keyword argument) and return it normalised.

    Args:
        name: the setting, named in the message (e.g. ``"reduction#stride"``).
        value: its value.
        kind: ``"path"`` (a non-empty ``str`` or ``os.PathLike``, returned as ``str``), ``"int"`` (an integer,
            never a bool), ``"number"`` (a finite real number, never a bool, returned as ``float``), ``"bool"``
            (``True``/``False``, or exactly the strings ``"true"``/``"false"`` in any case, which a command line
            gives) or ``"str"``.
        minimum, maximum: inclusive range of an ``"int"`` or ``"number"``.
        choices: the values allowed.
        optional: ``None`` is allowed (and returned).
        exists: a ``"path"`` must exist.

    Raises:
        ValueError: one line naming the setting, what it must be and what it is.
    """
    if kind not in _SETTING_KINDS:
        raise ValueError(f"check_setting: kind must be one of {_SETTING_KINDS}, got {kind!r}")
    if value is None and optional:
        return None
    got = f"got {short_repr(value)} ({type(value).__name__})"
    if kind == "path":
        if isinstance(value, bytes) or not isinstance(value, (str, os.PathLike)) or not os.fspath(value):
            raise ValueError(f"setting {name!r} must be a file or folder path (a non-empty string), {got}")
        value = os.fspath(value)
        if "\0" in value:
            raise ValueError(f"setting {name!r} must be a path without NUL characters, {got}")
        if exists and not os.path.lexists(value):
            raise ValueError(f"setting {name!r}: {safe_text(value)} does not exist")
    elif kind == "bool":
        if isinstance(value, str) and value.lower() in ("true", "false"):
            value = value.lower() == "true"
        # numpy's bool is not a subclass of bool; accept it by its type rather than importing numpy here
        numpy_bool = type(value).__module__ == "numpy" and type(value).__name__ in ("bool", "bool_")
        if not isinstance(value, bool) and not numpy_bool:
            raise ValueError(f"setting {name!r} must be true or false, {got}")
        value = bool(value)
    elif kind == "str":
        if not isinstance(value, str):
            raise ValueError(f"setting {name!r} must be a string, {got}")
    else:
        import math
        import numbers

        integral = isinstance(value, numbers.Integral)
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or (kind == "int" and not integral):
            what = "an integer" if kind == "int" else "a number"
            raise ValueError(f"setting {name!r} must be {what}, {got}")
        value = int(value) if kind == "int" else float(value)  # type: ignore[call-overload]
        if kind == "number" and not math.isfinite(value):
            raise ValueError(f"setting {name!r} must be a finite number, {got}")
        if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
            lo = "-inf" if minimum is None else f"{minimum:g}"
            hi = "inf" if maximum is None else f"{maximum:g}"
            raise ValueError(f"setting {name!r} must be in [{lo}, {hi}], {got}")
    if choices is not None and value not in choices:
        raise ValueError(f"setting {name!r} must be one of {', '.join(map(repr, choices))}, {got}")
    return value


def open_regular_file(
    path: PathLike, what: str = "file", max_bytes: int | None = None, too_large: str = "raise max_bytes to read it"
) -> BinaryIO:
    """Open a file for binary reading once it is known to be a regular file of at most ``max_bytes`` bytes.

    A device (``/dev/zero``), a named pipe or a folder is refused before a byte is read (reading one could hang or
    never end); opening never waits on a pipe.

    Args:
        path: the file.
        what: what the file is, for messages (e.g. ``"event file"``).
        max_bytes: refuse larger files; ``None`` for no limit.
        too_large: what the message about a file over ``max_bytes`` advises.

    Returns:
        the open file (the caller closes it).

    Raises:
        FileNotFoundError: the file does not exist (the message says when it is a broken link).
        ValueError: a folder, not a regular file, larger than ``max_bytes``, or unreadable; one line naming it.
    """
    import stat

    path = os.fspath(path)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))  # O_NONBLOCK: opening a pipe never waits
    except FileNotFoundError:
        if os.path.islink(path):
            raise FileNotFoundError(f"{what} {path} is a broken link (its target does not exist)") from None
        raise FileNotFoundError(f"{what} {path} not found") from None
    except IsADirectoryError:
        raise ValueError(f"{what} {path} is a folder, not a file") from None
    except OSError as e:
        raise ValueError(f"{what} {path}: cannot open it ({e.strerror or e})") from None
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise ValueError(f"{what} {path} is a folder, not a file")
        if not stat.S_ISREG(st.st_mode):
            raise ValueError(f"{what} {path} is not a regular file (a device, pipe or socket); give a file")
        if max_bytes is not None and st.st_size > max_bytes:
            raise ValueError(
                f"{what} {path} is {st.st_size / 1024**2:.1f} MiB, more than the limit of "
                f"{max_bytes / 1024**2:.1f} MiB ({too_large})"
            )
        return os.fdopen(os.dup(fd), "rb")
    finally:
        os.close(fd)


def read_regular_file(path: PathLike, max_bytes: int | None = None, what: str = "file") -> bytes:
    """Read a regular file with at most ``max_bytes`` bytes, with one-line errors naming it.

    The file is opened by :func:`open_regular_file` (devices, pipes and folders refused before they are read), and
    at most ``max_bytes + 1`` bytes are ever read, so memory stays bounded even when the file grows while it is read.

    Args:
        path: the file.
        max_bytes: refuse larger files; ``None`` for no limit.
        what: what the file is, for messages (e.g. ``"event file"``).

    Raises:
        FileNotFoundError: the file does not exist.
        ValueError: not a regular file, larger than ``max_bytes``, or unreadable.
    """
    chunks, total = [], 0
    budget = None if max_bytes is None else max_bytes + 1
    with open_regular_file(path, what, max_bytes) as f:
        try:
            while True:
                chunk = f.read(1 << 20 if budget is None else min(1 << 20, budget - total))
                if not chunk:
                    break
                chunks.append(chunk)
                total += len(chunk)
                if budget is not None and total >= budget:
                    raise ValueError(
                        f"{what} {path} grew beyond the limit of {(budget - 1) / 1024**2:.1f} MiB while read"
                    )
        except OSError as e:
            raise ValueError(f"{what} {path}: cannot read it ({e.strerror or e})") from None
    return b"".join(chunks)


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(key)
        out[key] = value
    return out


class _DuplicateKey(ValueError):
    """A repeated key found while parsing, re-raised with the source."""

    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def loads_json(text: str | bytes, source: str = "JSON") -> Any:
    """Parse JSON strictly, with one-line errors naming ``source``.

    Unlike :func:`json.loads`, an object with a repeated key is refused (``json`` would silently keep the last
    value, e.g. of two ``"videos"`` lists), and so is nesting deep enough to exhaust the parser's recursion.
    ``NaN`` and ``Infinity`` are read as floats: the validator of the content names the key that holds one.

    Args:
        text: the JSON text (bytes must be UTF-8).
        source: the file name or role, named in messages.

    Raises:
        ValueError: not UTF-8, not valid JSON (line and column named), a repeated key (named), or nested too
            deeply.
    """
    if isinstance(text, (bytes, bytearray)):
        try:
            text = bytes(text).decode("utf-8-sig")
        except UnicodeDecodeError as e:
            raise ValueError(f"{source} is not UTF-8 text (byte {e.start}); save it as UTF-8") from None

    try:
        return json.loads(text, object_pairs_hook=_no_duplicate_keys)
    except _DuplicateKey as e:
        raise ValueError(
            f"{source}: key {short_repr(e.key)} appears twice in one object (JSON keeps only one of them); "
            "remove the repeated key"
        ) from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{source} is not valid JSON: {e.msg} at line {e.lineno} column {e.colno}") from None
    except RecursionError:
        raise ValueError(f"{source} is nested too deeply to parse") from None
    except ValueError as e:  # e.g. an integer of thousands of digits (Python's int conversion limit)
        raise ValueError(f"{source} is not valid JSON: {short_repr(str(e), 120)}") from None


def read_json_file(
    path: PathLike, max_bytes: int | None = 512 * 1024**2, what: str = "JSON file", source: str | None = None
) -> Any:
    """Read a JSON file: a regular file of at most ``max_bytes``, parsed strictly by :func:`loads_json`.

    Args:
        path: the file.
        max_bytes: refuse larger files; ``None`` for no limit.
        what: what the file is, for messages (``"event file"``).
        source: how parse errors name the file (default ``"<what> <path>"``).

    Raises:
        FileNotFoundError: the file does not exist.
        ValueError: see :func:`read_regular_file` and :func:`loads_json`; one line naming the file.
    """
    return loads_json(read_regular_file(path, max_bytes, what), source or f"{what} {path}")


def _os_reason(err: OSError) -> str:
    """``"no space left on device (ENOSPC)"``: what went wrong, with the symbolic errno."""
    import errno

    name = errno.errorcode.get(err.errno or 0, "")
    text = (err.strerror or str(err)).lower()
    return f"{text} ({name})" if name else text


def _write_error(path: Path, err: OSError) -> OSError:
    """``err`` as one line naming the destination (ENOSPC, EFBIG, EACCES, EROFS, ELOOP, ...)."""
    out = type(err)(f"cannot write {path}: {_os_reason(err)}; earlier outputs are intact")
    out.errno = err.errno  # kept for callers that test it; the message stays free of "[Errno N]"
    return out


def _make_parent(path: Path) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        chain = [path.parent, *path.parent.parents]
        # a symlink loop or a dangling link in the way reads as "exists" to mkdir and "absent" to exists()
        link = next((p for p in reversed(chain) if p.is_symlink() and not p.exists()), None)
        if link is not None:
            raise NotADirectoryError(f"cannot write {path}: {link} is a dangling or looped symbolic link") from None
        blocker = next((p for p in chain if p.exists() and not p.is_dir()), path.parent)
        raise NotADirectoryError(f"cannot write {path}: {blocker} is a file, not a folder") from None
    except OSError as err:
        raise _write_error(path, err) from None


def atomic_write_bytes(path: PathLike, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically and durably.

    Args:
        path: destination file; its parent folders are created when missing.
        data: the complete file content.

    Returns:
        The destination path.

    Raises:
        NotADirectoryError: a file, a dangling or a looped link is in the way of the destination's folder.
        OSError: the file cannot be written (``ENOSPC``, ``EFBIG``, ``EACCES``, ``EROFS``, ``ELOOP``, ...): one
            line naming it; the temporary file is removed and an earlier file at ``path`` is intact.
    """
    path = Path(path)
    _make_parent(path)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as err:
        raise _write_error(path, err) from None
    try:
        # mkstemp creates 0600 files; give the result the permissions a plain open() would
        os.fchmod(fd, 0o666 & ~_UMASK)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as err:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(err, OSError):
            raise _write_error(path, err) from None
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

    The lock is an ``fcntl.flock`` on ``<folder>/.monai_vce.lock``; the file holds the owner's process id for
    messages. The kernel releases the lock when its process ends, however it ends, so a killed run never
    blocks the next one and two runs started together cannot both take it (no read-check-write race on a
    process id). The file is removed on release; a file left behind by a killed run holds no lock.

    The lock path must be a plain file of its own: a symbolic link (dangling or not), a folder, a pipe, a device or
    a file with other hard links is refused with one line, before anything is written (the run never writes or
    deletes through it). On release only the file this run locked is removed (same device and inode).

    Within one process the lock is shared: several workflows of one run (e.g. the demo's) may lock the same
    folder, and the file is removed when the last of them releases it.

    Args:
        folder: the output folder to lock; created when missing.

    Raises:
        RuntimeError: from :meth:`acquire`, one line naming the folder or lock path: held by another run, a lock
            path that is not a plain file, or a folder that cannot be created or written.

    Example::

        with OutputLock(out_dir):
            ...  # write outputs
    """

    name = ".monai_vce.lock"
    # lock file path -> [fd, number of OutputLock objects of this process holding it, st_dev, st_ino]
    _held_here: ClassVar[dict[str, list[int]]] = {}

    def __init__(self, folder: PathLike) -> None:
        self.folder = Path(folder)
        self.path = self.folder / self.name
        self._key: str | None = None

    @property
    def held(self) -> bool:
        """Whether this object holds the lock."""
        return self._key is not None

    def _holder(self) -> str:
        try:  # never through a link, never waiting on a pipe
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
            try:
                pid = os.read(fd, 32).decode("ascii", "replace").strip()
            finally:
                os.close(fd)
        except OSError:
            pid = ""
        return f" (process {pid})" if pid.isdigit() else ""

    def _refuse_not_a_file(self, st: os.stat_result) -> None:
        """Raise when ``st`` (of the lock path, not followed) is anything but a plain file with a single name."""
        import stat

        path = safe_text(self.path)
        advice = "it is not this program's lock; remove it or choose another output folder"
        if stat.S_ISLNK(st.st_mode):
            try:
                target = safe_text(os.readlink(self.path))
            except OSError:
                target = "?"
            raise RuntimeError(f"lock file {path} is a symbolic link (to {target}); {advice}")
        if stat.S_ISDIR(st.st_mode):
            raise RuntimeError(f"lock file {path} is a folder, not a file; {advice}")
        if not stat.S_ISREG(st.st_mode):
            kind = "named pipe" if stat.S_ISFIFO(st.st_mode) else "socket" if stat.S_ISSOCK(st.st_mode) else "device"
            raise RuntimeError(f"lock file {path} is a {kind}, not a file; {advice}")
        if st.st_nlink != 1:  # another name of the same file: writing a pid would overwrite that file
            raise RuntimeError(f"lock file {path} has {st.st_nlink} hard links (it is also another file); {advice}")

    def _open(self) -> int:
        """Open (create when missing) the lock file, never through a link and never waiting on a pipe."""
        flags = os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
        with contextlib.suppress(FileNotFoundError):
            self._refuse_not_a_file(os.lstat(self.path))
        try:
            while True:
                try:
                    fd = os.open(self.path, flags | os.O_CREAT | os.O_EXCL, 0o644)
                    break
                except FileExistsError:  # a killed run's file, or a running holder's: flock decides
                    with contextlib.suppress(FileNotFoundError):  # removed meanwhile by its holder: create it
                        fd = os.open(self.path, flags)
                        break
        except OSError as e:
            # a link or other non-file put there since the check above (ELOOP, EISDIR, ENXIO...)
            with contextlib.suppress(OSError):
                self._refuse_not_a_file(os.lstat(self.path))
            raise RuntimeError(
                f"output folder {safe_text(self.folder)} cannot be locked: {safe_text(self.path)}: {e.strerror or e}"
            ) from None
        try:
            self._refuse_not_a_file(os.fstat(fd))
        except BaseException:
            os.close(fd)
            raise
        return fd

    def acquire(self) -> OutputLock:
        """Take the lock or raise ``RuntimeError`` naming the folder and the process holding it."""
        import fcntl

        if self._key is not None:
            return self
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
        except (FileExistsError, NotADirectoryError):
            raise RuntimeError(
                f"output folder {safe_text(self.folder)} cannot be created: a file is in its way"
            ) from None
        except OSError as e:
            raise RuntimeError(f"output folder {safe_text(self.folder)} cannot be created: {e.strerror or e}") from None
        key = os.path.realpath(self.path)
        shared = self._held_here.get(key)
        if shared is not None:
            shared[1] += 1
            self._key = key
            return self
        while True:
            fd = self._open()
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                raise RuntimeError(
                    f"output folder {safe_text(self.folder)} is in use by another run{self._holder()}; "
                    "wait for it to finish or choose another output folder"
                ) from None
            # the holder we waited on may have removed the file between our open and our flock: then we
            # locked an orphaned inode, and must lock the file that is now at the path instead
            mine = os.fstat(fd)
            try:
                now = os.lstat(self.path)
                same = (mine.st_dev, mine.st_ino) == (now.st_dev, now.st_ino)
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        try:
            os.ftruncate(fd, 0)
            os.write(fd, str(os.getpid()).encode())
        except OSError as e:
            os.close(fd)
            raise RuntimeError(
                f"output folder {safe_text(self.folder)} cannot be locked: {safe_text(self.path)}: {e.strerror or e}"
            ) from None
        self._held_here[key] = [fd, 1, mine.st_dev, mine.st_ino]
        self._key = key
        # a run that fails after acquiring (MONAI skips `finalize` on an error) still removes its lock file
        atexit.register(self.release)
        return self

    def release(self) -> None:
        """Release this object's hold on the lock; the last hold in the process removes the file it locked."""
        if self._key is None:
            return
        key, self._key = self._key, None
        shared = self._held_here.get(key)
        if shared is None:
            return
        shared[1] -= 1
        if shared[1] > 0:
            return
        del self._held_here[key]
        fd, _, dev, ino = shared
        # removed while still locked, so no other run can lock this inode meanwhile; only the very file this run
        # created or took over: whatever else has been put at the path since is left alone
        with contextlib.suppress(OSError):
            st = os.lstat(key)
            if (st.st_dev, st.st_ino) == (dev, ino):
                os.unlink(key)
        os.close(fd)

    def __enter__(self) -> OutputLock:
        return self.acquire()

    def __exit__(self, *exc: Any) -> None:
        self.release()


class _Lazy:
    """The value of ``func(*args, **kwargs)``, computed on first use and kept."""

    def __init__(self, func: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        self.func, self.args, self.kwargs = func, args, kwargs
        self._value: Any = None
        self._computed = False

    @property
    def computed(self) -> bool:
        """Whether the value has been computed (any use computes it)."""
        return self._computed

    @property
    def value(self) -> Any:
        """The value, computed now on first use."""
        if not self._computed:
            self._value = self.func(*self.args, **self.kwargs)
            self._computed = True
        return self._value

    def __repr__(self) -> str:
        name = getattr(self.func, "__qualname__", repr(self.func))
        return f"{type(self).__name__}({name}, {'computed' if self._computed else 'not computed yet'})"


class LazySequence(_Lazy, Sequence):
    """A sequence computed by ``func(*args, **kwargs)`` on first use (``len``, indexing, iteration).

    The bundle's configs build their datalists, splits and video lists with it, so that parsing a config and
    MONAI's ``check_properties`` read no data: the dataset folder is read when a workflow runs. Errors (a missing
    dataset folder, for instance) are raised then, by ``func``, with its message.

    Example::

        "datalist": "$monai_vce.utils.LazySequence(monai_vce.workflows.galar_datalist, @dataset_dir)"
    """

    def __len__(self) -> int:
        return len(self.value)

    def __getitem__(self, index: Any) -> Any:
        return self.value[index]

    def __iter__(self) -> Iterator[Any]:
        return iter(self.value)

    def __eq__(self, other: object) -> bool:
        return list(self) == list(other) if isinstance(other, Sequence) else NotImplemented

    __hash__ = None  # type: ignore[assignment]


class LazyMapping(_Lazy, Mapping):
    """A mapping computed by ``func(*args, **kwargs)`` on first use (see :class:`LazySequence`).

    Example::

        "val_ground_truth": "$monai_vce.utils.LazyMapping(monai_vce.workflows.galar_ground_truth, @dataset_dir)"
    """

    def __len__(self) -> int:
        return len(self.value)

    def __getitem__(self, key: Any) -> Any:
        return self.value[key]

    def __iter__(self) -> Iterator[Any]:
        return iter(self.value)


def natural_key(text: str) -> tuple:
    """Sort key ordering embedded numbers numerically (``"2"`` before ``"10"``, ``"ukdd_navi_00051"`` by 51)."""
    return tuple((0, int(p), p) if p.isdigit() else (1, 0, p) for p in re.split(r"(\d+)", str(text)) if p != "")


def error_summary(exc: BaseException) -> str:
    """The root cause of an exception chain in one line: ``"Type: message"`` of its innermost exception.

    MONAI wraps an error raised while a bundle config is instantiated or evaluated (``RuntimeError: Failed to
    instantiate component ...``, ``Failed to evaluate ConfigExpression ...``); the project's own message is the
    innermost exception of that chain (``__cause__``, else ``__context__``).
    """
    seen = {id(exc)}
    inner = exc
    while True:
        nxt = (
            inner.__cause__
            if inner.__cause__ is not None
            else (None if inner.__suppress_context__ else inner.__context__)
        )
        if nxt is None or id(nxt) in seen:
            break
        seen.add(id(nxt))
        inner = nxt
    message = str(inner).strip()
    worker = _worker_cause(message)
    if worker is not None:
        return worker
    return f"{type(inner).__name__}: {message}" if message else type(inner).__name__


# the first exception line of a traceback's text: the innermost cause of a chain comes first
_EXCEPTION_LINE = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Warning)): (.+)$", re.MULTILINE)


def _worker_cause(message: str) -> str | None:
    """The innermost ``"Type: message"`` of the traceback text that torch's DataLoader puts in the message of an
    error re-raised from a worker process (``Caught RuntimeError in DataLoader worker process 0. Original
    Traceback ...``, whose chain of causes is otherwise lost), ``None`` for any other message."""
    if not message.startswith("Caught ") or "\nOriginal Traceback" not in message:
        return None
    found = _EXCEPTION_LINE.search(message.split("\nOriginal Traceback", 1)[1])
    return f"{found.group(1).rsplit('.', 1)[-1]}: {found.group(2).strip()}" if found else None


def report_errors_last() -> None:
    """Print the root cause of an uncaught error as the last line, after the traceback (``error: Type: message``).

    Installed by the bundle configs' ``initialize`` step, so that under ``python -m monai.bundle run ...`` a
    failing run ends with the project's one-line message rather than with MONAI's wrapping ``RuntimeError``
    forty lines below it. Python's traceback is printed first, as before. Idempotent; errors without a cause
    (whose last traceback line is already their message) and interruptions (Ctrl-C) add nothing.
    """
    previous = sys.excepthook
    if getattr(previous, "_monai_vce_errors_last", False):
        return

    def hook(exc_type: type[BaseException], exc: BaseException, tb: Any) -> None:
        previous(exc_type, exc, tb)
        chained = exc.__cause__ is not None or (exc.__context__ is not None and not exc.__suppress_context__)
        if isinstance(exc, Exception) and (chained or _worker_cause(str(exc).strip()) is not None):
            print(f"error: {error_summary(exc)}", file=sys.stderr, flush=True)

    hook._monai_vce_errors_last = True  # type: ignore[attr-defined]
    sys.excepthook = hook


#: Name of the checksum record added to the zip archive of a ``torch.save`` file (``<archive>/.data/<name>``):
#: ``torch.load`` ignores records it does not know, so MONAI's loaders and ``ckpt_export`` read sealed files as is.
SEAL_RECORD = "monai_vce_sha256"


def _seal_digest(archive: Any, skip: str) -> str:
    """sha256 over every record of a zip archive but ``skip``, in name order (name, size and bytes of each)."""
    digest = hashlib.sha256()
    for name in sorted(n for n in archive.namelist() if n != skip):
        digest.update(name.encode() + b"\0")
        with archive.open(name) as f:  # zipfile checks each record's CRC-32 as it reads it
            for block in iter(functools.partial(f.read, 1 << 20), b""):
                digest.update(block)
        digest.update(b"\0" + str(archive.getinfo(name).file_size).encode() + b"\0")
    return digest.hexdigest()


def seal_torch_bytes(data: bytes) -> bytes:
    """The bytes of a ``torch.save`` file with a sha256 of its records (pickle and tensors) added as one more record.

    :func:`check_torch_seal` recomputes it on load, so a file damaged after it was written (one flipped byte) is
    refused instead of silently computing something else. A legacy (non-zip) file is returned unchanged.
    """
    if not data.startswith(b"PK"):
        return data
    buf = io.BytesIO(data)
    with zipfile.ZipFile(buf, "a") as archive:
        names = archive.namelist()
        prefix = names[0].split("/", 1)[0] if names else "archive"
        record = f"{prefix}/.data/{SEAL_RECORD}"
        if record in names:  # already sealed (a file re-saved as is)
            return data
        archive.writestr(record, _seal_digest(archive, record))
    return buf.getvalue()


def check_torch_seal(path: PathLike, what: str = "file") -> bool:
    """Check the checksum that :func:`seal_torch_bytes` put in a ``torch.save`` file.

    Returns:
        ``True`` when the file carries a checksum and it matches; ``False`` (after one logged note) when it carries
        none: a file written elsewhere (e.g. a downloaded checkpoint).

    Raises:
        ValueError: the checksum does not match the content, or a record is damaged (one line naming the file).
    """
    path = Path(path)
    try:
        with open(path, "rb") as f:
            if f.read(2) != b"PK":
                raise zipfile.BadZipFile  # a legacy pickle: no place for a checksum
            f.seek(0)
            with zipfile.ZipFile(f) as archive:
                names = archive.namelist()
                record = next((n for n in names if n.endswith(f"/.data/{SEAL_RECORD}")), None)
                if record is None:
                    raise zipfile.BadZipFile
                stored = archive.read(record).decode("ascii", "replace").strip()
                actual = _seal_digest(archive, record)
    except zipfile.BadZipFile as e:
        if str(e).startswith("Bad CRC-32") or "Bad magic number" in str(e):
            raise ValueError(
                f"{what} {path} is damaged ({str(e).splitlines()[0]}); use an intact copy of the file"
            ) from None
        logging.getLogger("monai_vce").warning(
            "note: %s %s carries no monai_vce checksum (written elsewhere); it is read without an integrity check",
            what,
            safe_text(str(path)),
        )
        return False
    except (OSError, EOFError, zlib.error) as e:
        raise ValueError(f"{what} {path} is damaged or unreadable ({str(e).splitlines()[0]})") from None
    if stored != actual:
        raise ValueError(
            f"{what} {path} is damaged: its content does not match the checksum written with it "
            "(a corrupted or altered copy); use an intact copy of the file"
        )
    return True
