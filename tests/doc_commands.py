"""The command lines of the documentation, as printed, and a runner that executes them in one process.

Every fenced ``bash`` block of ``README.md``, ``bundle/docs/README.md`` and ``bundle/docs/details.md`` is read. Its info string says what its
commands are:

- ```` ```bash ```` (no tag): the commands run exactly as printed from the repository root once the demo has run
  (``python -m monai_vce.demo``); ``tests/test_doc_commands.py`` runs every one of them;
- ```` ```bash your-data ````: commands for the user's own data, weights or hardware (``/data/galar``, BiomedCLIP
  from the hub, GPUs); each must have a variant in an untagged block: the same program, module, sub-command and
  configs (``bundle/configs/demo.json`` aside);
- ```` ```bash setup ````: installing and testing (not run by the test);
- ```` ```bash external ````: another application's commands (MONAI Label's server, a MONAI Deploy application, the
  distributable bundle), run by ``tests/bundle/test_integrations.py`` in their own environments.

A ```` ```json NAME.json ```` block is a file that commands below it use: the test writes it under that name.
Any other tag is an error, so that a new command is never silently left out.

``python doc_commands.py COMMANDS.json`` (run by the test in a copy of the repository's configs) executes each
command in this one process where it can (``python -m MODULE ...`` through :func:`runpy.run_module`, which saves
the import of torch and MONAI per command) and through ``bash`` otherwise, and prints one JSON line per command (after :data:`RESULT`).
"""

from __future__ import annotations

import ast
import json
import os
import re
import runpy
import shlex
import subprocess
import sys
import time
import traceback
from pathlib import Path

TAGS = {"", "your-data", "setup", "external"}
_FENCE = re.compile(r"^```(\S*)\s*(.*?)\s*$")
_SHELL = re.compile(r"[|&;<>`]|\$\(")


def blocks(path: Path) -> list[tuple[str, str, str, int]]:
    """``(language, tag, text, line)`` of every fenced block of a Markdown file."""
    out = []
    lines = path.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if m and lines[i].startswith("```") and m.group(1):
            start = i
            i += 1
            body = []
            while i < len(lines) and not lines[i].startswith("```"):
                body.append(lines[i])
                i += 1
            out.append((m.group(1), m.group(2), "\n".join(body), start + 1))
        i += 1
    return out


def commands(text: str) -> list[str]:
    """The commands of a bash block: comment and empty lines dropped, backslash continuations joined."""
    out, cur = [], ""
    for line in text.splitlines():
        if not cur and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.rstrip().endswith("\\"):
            cur += line.rstrip()[:-1].rstrip() + " "
            continue
        out.append((cur + line.strip()).strip())
        cur = ""
    if cur:
        out.append(cur.strip())
    return out


def doc_commands(paths: list[Path]) -> dict[str, list]:
    """``{"run": [...], "your-data": [...], "setup": [...], "files": {name: text}, "errors": [...]}`` of the docs."""
    found: dict[str, list] = {"run": [], "your-data": [], "setup": [], "external": [], "errors": []}
    files: dict[str, str] = {}
    for path in paths:
        for lang, tag, text, line in blocks(path):
            where = f"{path.parent.name}/{path.name}:{line}"
            if lang == "json" and tag.endswith(".json"):
                files[tag] = text
                continue
            if lang != "bash":
                continue
            if tag not in TAGS:
                found["errors"].append(f"{where}: unknown tag {tag!r} of a bash block (expected one of {sorted(TAGS)})")
                continue
            for cmd in commands(text):
                found["run" if tag == "" else tag].append((where, cmd))
    found["files"] = files  # type: ignore[assignment]
    return found


def entry(cmd: str) -> tuple:
    """What a command runs: program, module, sub-commands and the set of bundle configs (demo.json aside)."""
    tokens = shlex.split(cmd)  # not comments=True: it would end "--reduction#stride" at its "#"
    tokens = tokens[: next((i for i, t in enumerate(tokens) if t.startswith("#")), len(tokens))]  # trailing comment
    while tokens and re.match(r"^\w+=", tokens[0]):  # VAR=value prefixes
        tokens = tokens[1:]
    prog = Path(tokens[0]).name if tokens else ""
    rest = tokens[1:]
    if prog == "torchrun":
        while rest and rest[0].startswith("-") and rest[0] != "-m":
            rest = rest[1:]
    module = ""
    if rest[:1] == ["-m"]:
        module, rest = rest[1], rest[2:]
    positional = []
    for t in rest:
        if t.startswith("-"):
            break
        positional.append(t)
    configs: list[str] = []
    if "--config_file" in rest:
        value = rest[rest.index("--config_file") + 1]
        parsed = ast.literal_eval(value) if value.startswith("[") else [value]
        configs = [Path(c).name for c in parsed]
    return (prog if prog != "python3" else "python", module, tuple(positional), frozenset(configs) - {"demo.json"})


def _run_in_process(tokens: list[str]) -> int:
    module, args = tokens[2], tokens[3:]
    argv, cwd = sys.argv, os.getcwd()
    sys.argv = [module, *args]
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as e:
        return 0 if e.code in (None, 0) else (e.code if isinstance(e.code, int) else 1)
    finally:
        sys.argv = argv
        os.chdir(cwd)
    return 0


def _innermost(exc: BaseException) -> str:
    """The traceback of the exception a chain started from (MONAI's config errors wrap the cause), then the outer
    message: the cause is what a reader of a failing test needs."""
    inner = exc
    while inner.__cause__ is not None or inner.__context__ is not None:
        inner = inner.__cause__ or inner.__context__  # type: ignore[assignment]
    cause = "".join(traceback.format_exception(type(inner), inner, inner.__traceback__))[-2500:]
    return cause if inner is exc else f"{cause}\n... raised as: {type(exc).__name__}: {str(exc)[:400]}"


def run(cmd: str) -> dict:
    """Run one documented command from the working folder; ``{"cmd", "rc", "seconds", "error"}``."""
    t0 = time.perf_counter()
    tokens = shlex.split(cmd)
    error = ""
    in_process = (
        not _SHELL.search(cmd)
        and len(tokens) > 2
        and Path(tokens[0]).name in ("python", "python3")
        and tokens[1] == "-m"
    )
    if in_process:
        try:
            rc = _run_in_process(tokens)
        except Exception as e:
            rc, error = 1, _innermost(e)
    else:
        res = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True)
        rc, error = res.returncode, (res.stderr[-3000:] if res.returncode else "")
    return {"cmd": cmd, "rc": rc, "seconds": round(time.perf_counter() - t0, 1), "error": error}


#: Prefix of the result lines (the commands print JSON of their own).
RESULT = "doc-command-result: "


def main(argv: list[str]) -> int:
    cmds = json.loads(Path(argv[0]).read_text())
    for cmd in cmds:
        print(RESULT + json.dumps(run(cmd)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
