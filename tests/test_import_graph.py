"""The package's import graph: floors, no package cycles, and every deferred import accounted for.

Every module of ``monai_vce`` is parsed with ``ast`` (nothing is imported), each import of a project module is
mapped to the package it lands in (``monai_vce.events``, ``monai_vce.metrics``, ...), and the package graph must be
acyclic and must respect the floors of ``docs/architecture.md``: a package imports only from its own floor or the
floors below.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "monai_vce"

#: The floors of docs/architecture.md: a package may import from its floor and the floors below, never above.
FLOORS: dict[str, int] = {
    "monai_vce": 0,  # the package's __init__: labels only
    "monai_vce.labels": 0,
    "monai_vce.utils": 0,
    "monai_vce.cli": 0,  # the conventions every command line shares (argparse style, error lines)
    "monai_vce.events": 1,
    "monai_vce.metrics": 2,
    "monai_vce.data": 2,
    "monai_vce.networks": 2,
    "monai_vce.losses": 2,
    "monai_vce.postprocessing": 3,
    "monai_vce.engines": 4,
    "monai_vce.handlers": 4,
    "monai_vce.report": 5,
    "monai_vce.temporal": 5,
    "monai_vce.inference": 5,
    "monai_vce.review": 5,
    "monai_vce.stages": 6,
    "monai_vce.workflows": 7,
    "monai_vce.demo": 7,
    "monai_vce.text_embeddings": 7,
    "monai_vce.__main__": 7,
}

#: Project imports inside function bodies, each with the reason it is not at the top of its module.
ALLOWED_DEFERRED: dict[tuple[str, str], str] = {
    ("monai_vce.data.video", "monai_vce.data.frame_cache"): "keeps the video reader free of torch and MONAI",
    ("monai_vce.data.video", "monai_vce.data.frames"): "keeps the video reader free of torch and MONAI",
    ("monai_vce.metrics.__main__", "monai_vce.data.galar"): "the metric's command needs torch only for --metadata",
    (
        "monai_vce.temporal.protocol",
        "monai_vce.temporal.training",
    ): "training guards its inputs with the protocol's leakage check",
}


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _package(module: str) -> str:
    """The package a module belongs to: ``monai_vce.<first level>`` (or ``monai_vce`` itself)."""
    parts = module.split(".")
    return ".".join(parts[:2])


def _imports(path: Path) -> list[tuple[str, bool]]:
    """``(imported project module, inside a function)`` of every project import of a file."""
    module = _module_name(path)
    is_pkg = path.name == "__init__.py"
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out: list[tuple[str, bool]] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inner = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, ast.Import):
                out.extend((a.name, in_function) for a in child.names if a.name.split(".")[0] == "monai_vce")
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base = module.split(".") if is_pkg else module.split(".")[:-1]
                    base = base[: len(base) - child.level + 1]
                    target = ".".join(base + ([child.module] if child.module else []))
                else:
                    target = child.module or ""
                if target.split(".")[0] == "monai_vce":
                    # "from pkg import sub" may name a submodule: count it as an import of pkg.sub when it is one
                    for a in child.names:
                        sub = f"{target}.{a.name}"
                        is_sub = (ROOT.parent / Path(*sub.split("."))).with_suffix(".py").is_file() or (
                            ROOT.parent / Path(*sub.split("."))
                        ).is_dir()
                        out.append((sub if is_sub else target, in_function))
            visit(child, inner)

    visit(tree, False)
    return out


def _graph() -> tuple[dict[str, set[str]], list[tuple[str, str, str, bool]]]:
    """Package edges and every ``(module, target, package, deferred)``."""
    edges: dict[str, set[str]] = {}
    records = []
    for path in sorted(ROOT.rglob("*.py")):
        module = _module_name(path)
        src = _package(module)
        for target, deferred in _imports(path):
            dst = _package(target)
            records.append((module, target, dst, deferred))
            if dst != src:
                edges.setdefault(src, set()).add(dst)
    return edges, records


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one package (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def strongconnect(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                strongconnect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    nodes = set(edges) | {w for ws in edges.values() for w in ws}
    for v in sorted(nodes):
        if v not in index:
            strongconnect(v)
    return out


def test_no_package_cycles():
    edges, _ = _graph()
    assert not _cycles(edges), f"package import cycles: {_cycles(edges)}"


def test_packages_import_only_from_their_floor_or_below():
    _, records = _graph()
    upward = []
    for module, target, dst, _ in records:
        src = _package(module)
        if src not in FLOORS or dst not in FLOORS or src == dst:
            continue  # outside the package (test_every_package_has_a_floor keeps FLOORS complete)
        if FLOORS[dst] > FLOORS[src]:
            upward.append(f"{module} imports {target} (floor {FLOORS[src]} -> {FLOORS[dst]})")
    assert not upward, "imports from a lower floor to a higher one:\n" + "\n".join(upward)


def test_every_package_has_a_floor():
    packages = {_package(_module_name(p)) for p in ROOT.rglob("*.py")}
    assert sorted(packages - set(FLOORS)) == [], "packages without a floor: add them to FLOORS and docs/architecture.md"


def test_deferred_project_imports_are_the_listed_ones():
    _, records = _graph()
    deferred = {(m, t) for m, t, _, d in records if d}
    unlisted = sorted(f"{m} -> {t}" for m, t in deferred if (m, t) not in ALLOWED_DEFERRED)
    assert not unlisted, "project imports inside functions hide the import graph; move them to the top:\n" + "\n".join(
        unlisted
    )


def test_the_graph_walker_sees_cycles_and_relative_imports(tmp_path, monkeypatch):
    # a package pair importing each other (one of them lazily, in a function) is a cycle
    pkg = tmp_path / "monai_vce"
    for name, body in {
        "__init__.py": "",
        "a/__init__.py": "from ..b import thing\n",
        "b/__init__.py": "def f():\n    from monai_vce.a import x\n",
        "b/c.py": "from . import d\n",
        "b/d.py": "",
    }.items():
        (pkg / name).parent.mkdir(parents=True, exist_ok=True)
        (pkg / name).write_text(body)
    monkeypatch.setattr(sys.modules[__name__], "ROOT", pkg)
    edges, records = _graph()
    assert edges == {"monai_vce.a": {"monai_vce.b"}, "monai_vce.b": {"monai_vce.a"}}
    assert _cycles(edges) == [["monai_vce.a", "monai_vce.b"]]
    assert ("monai_vce.b", "monai_vce.a", "monai_vce.a", True) in records
    assert ("monai_vce.b.c", "monai_vce.b.d", "monai_vce.b", False) in records


@pytest.mark.parametrize(
    "modules",
    [
        "monai_vce, monai_vce.labels, monai_vce.utils",
        "monai_vce.cli, monai_vce.__main__",
        "monai_vce.events",
        "monai_vce.metrics, monai_vce.metrics.__main__",
        "monai_vce.data, monai_vce.data.galar, monai_vce.data.synthetic",
        "monai_vce.postprocessing",
        "monai_vce.report",
    ],
)
def test_lower_floors_import_without_torch_monai_or_ignite(modules):
    code = (
        f"import sys; import {modules}; "
        "heavy = [m for m in ('torch', 'monai', 'ignite', 'open_clip', 'timm', 'matplotlib') if m in sys.modules]; "
        "assert not heavy, heavy"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
