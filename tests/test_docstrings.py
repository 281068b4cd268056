"""Docstrings are contracts: short module docstrings, and every design page linked from ``docs/architecture.md``.

Every module of ``monai_vce`` is parsed with ``ast`` (nothing is imported). The design rationale lives in
``docs/design/<subsystem>.md``, one page per subsystem.
"""

from __future__ import annotations

import ast
import re
import statistics
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "monai_vce"
DOCS = REPO / "docs"

#: The median word count of the module docstrings may not exceed this (MONAI's is 10, timm's 31).
MAX_MEDIAN_WORDS = 40
#: No module docstring may be longer than this many lines.
MAX_LINES = 25


def module_docstrings() -> dict[str, str]:
    """``{path relative to the repository: module docstring ("" when none)}`` of every module of the package."""
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        out[path.relative_to(REPO).as_posix()] = ast.get_docstring(tree, clean=False) or ""
    return out


def test_modules_found():
    docs = module_docstrings()
    assert len(docs) > 50, "the package's modules were not found"
    assert "monai_vce/__init__.py" in docs


def docstring_problems(docs: dict[str, str]) -> list[str]:
    """What breaks the limits: a median over :data:`MAX_MEDIAN_WORDS` words, a docstring over :data:`MAX_LINES` lines."""
    problems = []
    median = statistics.median(len(doc.split()) for doc in docs.values())
    if median > MAX_MEDIAN_WORDS:
        problems.append(f"median module docstring is {median} words (at most {MAX_MEDIAN_WORDS})")
    for path, doc in docs.items():
        if len(doc.splitlines()) > MAX_LINES:
            problems.append(f"{path}: module docstring of {len(doc.splitlines())} lines (at most {MAX_LINES})")
    return problems


def test_module_docstrings_are_short():
    problems = docstring_problems(module_docstrings())
    assert not problems, "move the rationale to docs/design/<subsystem>.md:\n" + "\n".join(problems)


def test_limits_are_enforced():
    short = {f"m{i}.py": "What it is." for i in range(3)}
    assert docstring_problems(short) == []
    essay = " ".join(["word"] * 41)
    assert len(docstring_problems({"a.py": essay, "b.py": essay, "c.py": "Short."})) == 1
    long = "\n".join(["line"] * (MAX_LINES + 1))
    assert docstring_problems({**short, "long.py": long}) == [
        f"long.py: module docstring of {MAX_LINES + 1} lines (at most {MAX_LINES})"
    ]


def _links(markdown: str) -> set[str]:
    return set(re.findall(r"\]\(([^)#\s]+)", markdown))


def test_every_design_page_is_linked_from_architecture():
    pages = sorted(p.relative_to(DOCS).as_posix() for p in (DOCS / "design").glob("*.md"))
    assert pages, "docs/design/ holds no page"
    links = _links((DOCS / "architecture.md").read_text(encoding="utf-8"))
    missing = [page for page in pages if page not in links]
    assert not missing, f"docs/design pages not linked from docs/architecture.md: {missing}"


def test_architecture_links_resolve():
    links = _links((DOCS / "architecture.md").read_text(encoding="utf-8"))
    local = [link for link in links if "://" not in link]
    assert local
    broken = [link for link in local if not (DOCS / link).is_file()]
    assert not broken, f"docs/architecture.md links to missing files: {broken}"


def architecture_floors() -> dict[str, int]:
    """``{package: floor}`` of the floor table of ``docs/architecture.md`` (rows ``| floor | `pkg`, ... | ... |``)."""
    floors: dict[str, int] = {}
    for line in (DOCS / "architecture.md").read_text(encoding="utf-8").splitlines():
        m = re.match(r"^\| (\d+) \| ([^|]+) \|", line)
        if m:
            for pkg in re.findall(r"`([\w.]+)`", m.group(2)):
                floors[pkg] = int(m.group(1))
    return floors


def test_architecture_floors_equal_the_import_graph_test():
    tree = ast.parse((REPO / "tests" / "test_import_graph.py").read_text(encoding="utf-8"))
    floors = next(
        ast.literal_eval(node.value)
        for node in tree.body
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == "FLOORS"
    )
    assert architecture_floors() == floors
