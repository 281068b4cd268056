"""The conventions every command line of the package shares: one parser class, one error line, one exit code.

A command module defines ``add_parser(subparsers)``, returning its parser with ``run`` set as a default
(``run(args)`` returns a JSON-able result, printed as one line, or an exit code), and ``main(argv) -> int``
calling :func:`command_main`. Bad input: ``error: <what>`` on stderr, exit code :data:`BAD_INPUT`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import sys
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NoReturn

from monai_vce.utils import safe_text

__all__ = ["BAD_INPUT", "INPUT_ERRORS", "CommandParser", "print_error", "warning_lines", "run_command", "command_main"]

#: exit code of a run refused for bad input (a missing or malformed file, a wrong argument), as argparse's
BAD_INPUT = 2

#: the exceptions that mean bad input: printed as one line, no traceback (``FileNotFoundError`` is an ``OSError``)
INPUT_ERRORS: tuple[type[BaseException], ...] = (ImportError, OSError, RuntimeError, ValueError)

#: ``add_parser(subparsers) -> parser`` of one command
AddParser = Callable[[Any], argparse.ArgumentParser]


class CommandParser(argparse.ArgumentParser):
    """An :class:`argparse.ArgumentParser` whose usage errors are one line, ``error: <prog>: <what>``, exit code 2.

    Flags are spelt out in full (no abbreviations): a removed flag is refused, not read as a longer one.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        self.exit(BAD_INPUT, f"error: {self.prog}: {message} (see {self.prog} --help)\n")


def print_error(message: object) -> int:
    """Print ``error: <message>`` (one line) on stderr; returns :data:`BAD_INPUT`."""
    print(f"error: {safe_text(message)}", file=sys.stderr, flush=True)
    return BAD_INPUT


def _one_line_warning(message: Any, category: type[Warning], *args: Any, **kwargs: Any) -> None:
    # a warning is one line naming what is wrong; no source line of ours under it
    print(f"warning: {safe_text(message)}", file=sys.stderr, flush=True)


class _WarningLines(logging.Handler):
    """Prints the package's logged warnings as ``warning: <message>`` lines on stderr."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)

    def emit(self, record: logging.LogRecord) -> None:
        print(f"{record.levelname.lower()}: {safe_text(record.getMessage())}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def warning_lines() -> Iterator[None]:
    """Within: warnings (``warnings.warn`` and the package's logged ones) print as ``warning: <message>`` lines."""
    handler, logger = _WarningLines(), logging.getLogger("monai_vce")
    logger.addHandler(handler)
    try:
        with warnings.catch_warnings():  # restored after the run: main() may be called in-process
            warnings.showwarning = _one_line_warning
            yield
    finally:
        logger.removeHandler(handler)


def run_command(args: argparse.Namespace, errors: tuple[type[BaseException], ...] = INPUT_ERRORS) -> int:
    """Run ``args.run(args)``: warnings as ``warning: ...`` lines, ``errors`` as one ``error: ...`` line.

    A command that keeps its own console (``own_console`` set by its ``add_parser``, e.g. ``demo``) is run as is.

    Args:
        args: parsed arguments holding ``run`` (set by the command's ``add_parser``).
        errors: the exceptions reported as bad input (exit code :data:`BAD_INPUT`).

    Returns:
        the exit code: ``run``'s when it returns an int, else 0 after printing its result as one JSON line.
    """
    if getattr(args, "own_console", False):
        return int(args.run(args))
    with warning_lines():
        try:
            result = args.run(args)
        except errors as e:
            return print_error(e)
    if isinstance(result, int):
        return result
    if result is not None:
        print(json.dumps(result), flush=True)
    return 0


def parse(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace | int:
    """``parser.parse_args(argv)``, or the exit code of ``--help`` (0) or of a usage error (2)."""
    try:
        return parser.parse_args(argv)
    except SystemExit as e:  # main(argv) returns its exit code, in-process too
        return e.code if isinstance(e.code, int) else BAD_INPUT


class _Alone:
    """Stands in for ``subparsers``: the command's parser is built on its own, named ``prog``."""

    def __init__(self, prog: str) -> None:
        self.prog = prog
        self._subparsers = CommandParser(prog=prog).add_subparsers()

    def add_parser(self, name: str, **kwargs: Any) -> argparse.ArgumentParser:
        return self._subparsers.add_parser(name, **{**kwargs, "prog": self.prog})


def command_main(add_parser: AddParser, argv: Sequence[str] | None, prog: str) -> int:
    """The ``main`` of one command run on its own (``python -m monai_vce.<package>``).

    Args:
        add_parser: the command's ``add_parser``; the parser it builds is used alone, named ``prog``.
        argv: the arguments (default ``sys.argv[1:]``).
        prog: the command line shown in usage and error lines.

    Returns:
        the exit code (0 success, 2 bad input).
    """
    args = parse(add_parser(_Alone(prog)), argv)
    return args if isinstance(args, int) else run_command(args)
