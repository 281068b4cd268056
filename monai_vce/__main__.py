"""The package's command line: ``python -m monai_vce <command> ...`` (``monai-vce <command>``), one command per stage.

Each command's parser is built by the ``add_parser`` of the module it runs (:data:`COMMANDS`), imported only
when that command runs; conventions in :mod:`monai_vce.cli`.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from typing import Any

from monai_vce.cli import AddParser, CommandParser, parse, run_command

__all__ = ["COMMANDS", "build_parser", "main"]

PROG = "python -m monai_vce"


#: command -> (``module:function`` building its parser, imported when the command runs; one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "decode": ("monai_vce.stages.commands:add_decode_parser", "decode a probability folder into an event JSON"),
    "refine": ("monai_vce.stages.commands:add_refine_parser", "refine a probability folder with a temporal refiner"),
    "report": (
        "monai_vce.report.__main__:add_parser",
        "draw event timelines and an evaluation summary of an event JSON",
    ),
    "review": ("monai_vce.review.__main__:add_parser", "write a static review site of an event JSON"),
    "metrics": ("monai_vce.metrics.__main__:add_parser", "score an event JSON against a ground truth (temporal mAP)"),
    "temporal": ("monai_vce.temporal.__main__:add_parser", "train a temporal refiner (temporal fit)"),
    "synthetic": (
        "monai_vce.data.synthetic:add_parser",
        "generate a mini-Galar: real Galar label timelines, synthetic frames",
    ),
    "text-embeddings": ("monai_vce.networks.text_embeddings:add_parser", "compute the label-prompt text embeddings"),
    "check-backbone": (
        "monai_vce.networks.check:add_parser",
        "check a backbone snapshot offline: image tower, attention conversions, text tower and tokenizer",
    ),
    "demo": ("monai_vce.demo:add_parser", "run the offline demo: train, tune, export and infer on generated data"),
}


def _add_parser(command: str) -> AddParser:
    module, function = COMMANDS[command][0].split(":")
    return getattr(importlib.import_module(module), function)  # type: ignore[no-any-return]


class _Help:
    """Stands in for ``subparsers`` while one command's parser is built: it takes the registry's help line."""

    def __init__(self, subparsers: Any) -> None:
        self._subparsers = subparsers

    def add_parser(self, name: str, **kwargs: Any) -> argparse.ArgumentParser:
        return self._subparsers.add_parser(name, **{**kwargs, "help": COMMANDS[name][1]})


def build_parser(command: str | None = None) -> CommandParser:
    """The parser of ``python -m monai_vce``.

    Args:
        command: the command whose full parser is built (its module is imported); the others list their help
            line only. ``None``: only the help lines (nothing is imported).
    """
    parser = CommandParser(prog=PROG, description="Capsule endoscopy events: the stages after the frame model.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="<command>")
    for name, (_, line) in COMMANDS.items():
        if name == command:
            _add_parser(name)(_Help(sub))
        else:
            sub.add_parser(name, help=line, add_help=False)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``python -m monai_vce <command> ...``; returns the exit code (0 success, 2 bad input)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    command = argv[0] if argv and argv[0] in COMMANDS else None
    args = parse(build_parser(command), argv)
    return args if isinstance(args, int) else run_command(args)


if __name__ == "__main__":
    sys.exit(main())
