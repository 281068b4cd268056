"""No compatibility layer: the package was never released, so a renamed name has no alias, decorator, old value,
old flag or old-format reader. After a release, renames go through ``monai.utils.deprecated_arg`` / ``deprecated``
with versions (CONTRIBUTING.md)."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "monai_vce"

#: Packages whose ``__init__`` loads torch-based submodules on first use (``__getattr__`` over ``_LAZY``), so that
#: their light parts import without torch. A lazy loader returns a submodule's object of the same name, never an
#: alias: checked below.
LAZY_PACKAGES = ("monai_vce.data", "monai_vce.inference")
#: The decorators of MONAI that may mark a deprecation once the package has been released.
MONAI_DEPRECATIONS = {"deprecated", "deprecated_arg", "deprecated_arg_default"}
#: Phrases of a compatibility layer in the package's code and docstrings.
PHRASES = re.compile(
    r"deprecated and will be removed|for one (more )?release|next release|\bformerly\b|former name|"
    r"written by earlier versions|files written earlier",
    re.IGNORECASE,
)


def _modules() -> list[tuple[str, ast.Module, str]]:
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(ROOT).with_suffix("")
        parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
        text = path.read_text(encoding="utf-8")
        out.append((".".join(parts), ast.parse(text, filename=str(path)), text))
    return out


MODULES = _modules()


def _name(node: ast.expr) -> str:
    node = node.func if isinstance(node, ast.Call) else node
    if isinstance(node, ast.Attribute):
        return node.attr
    return node.id if isinstance(node, ast.Name) else ""


def test_the_scan_sees_the_package():
    names = {name for name, _, _ in MODULES}
    assert {"monai_vce", "monai_vce.metrics", "monai_vce.data", "monai_vce.events.units"} <= names
    assert len(MODULES) > 50


def test_no_module_getattr_except_lazy_loaders():
    found = {
        name
        for name, tree, _ in MODULES
        if any(isinstance(n, ast.FunctionDef) and n.name == "__getattr__" for n in tree.body)
    }
    assert found <= set(LAZY_PACKAGES), f"module __getattr__ (an alias?) in {sorted(found - set(LAZY_PACKAGES))}"


@pytest.mark.parametrize("package", LAZY_PACKAGES)
def test_lazy_loaders_return_their_own_submodules_objects(package):
    mod = importlib.import_module(package)
    lazy = getattr(mod, "_LAZY", {})
    for name, sub in lazy.items():
        assert name in mod.__all__, f"{package}.{name} is loaded lazily but not exported"
        assert "." not in sub, f"{package}.{name} comes from {sub}, not a submodule of {package}"
        source = importlib.import_module(f"{package}.{sub}")
        assert getattr(mod, name) is getattr(source, name), f"{package}.{name} is not {package}.{sub}.{name}"
    assert not hasattr(mod, "no_such_name")  # the loader raises AttributeError for any other name


def test_no_home_made_renaming_or_deprecation():
    bad = []
    for name, tree, _ in MODULES:
        monai_imports = {
            alias.asname or alias.name
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("monai.utils")
            for alias in node.names
        }
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                if re.search(r"renam|deprecat|legacy", node.name, re.IGNORECASE):
                    bad.append(f"{name}: defines {node.name}")
                for deco in getattr(node, "decorator_list", []):
                    d = _name(deco)
                    if re.search(r"renam|deprecat", d, re.IGNORECASE) and not (
                        d in MONAI_DEPRECATIONS and d in monai_imports
                    ):
                        bad.append(f"{name}: {node.name} decorated with {d}")
            if isinstance(node, ast.Call) and _name(node) == "warn":
                categories = {_name(a) for a in [*node.args[1:], *(k.value for k in node.keywords)]}
                if categories & {"DeprecationWarning", "PendingDeprecationWarning", "FutureWarning"}:
                    bad.append(f"{name}: line {node.lineno} warns of a deprecation")
    assert not bad, bad


def test_no_text_of_a_compatibility_layer():
    bad = [
        f"{name}: line {text.count(chr(10), 0, m.start()) + 1}: {m.group(0)!r}"
        for name, _, text in MODULES
        for m in PHRASES.finditer(text)
    ]
    assert not bad, bad


def test_the_checks_catch_what_they_look_for():
    tree = ast.parse(
        "def __getattr__(name):\n    pass\n"
        "@renamed_arguments(units='frame_units')\ndef f(frame_units): pass\n"
        "warnings.warn('x', DeprecationWarning)\n"
    )
    assert [n.name for n in tree.body if isinstance(n, ast.FunctionDef)] == ["__getattr__", "f"]
    assert _name(tree.body[1].decorator_list[0]) == "renamed_arguments"
    call = tree.body[2].value
    assert _name(call) == "warn" and _name(call.args[1]) == "DeprecationWarning"
    assert PHRASES.search("tIoU thresholds (formerly ``thresholds``)")
    assert PHRASES.search("is deprecated and will be removed in the next release")


def test_frame_units_have_one_spelling():
    from monai_vce.events import as_frame_units

    with pytest.raises(ValueError, match=r"frame_units must be one of \['frame_index', 'frame_number'\], got 'index'"):
        as_frame_units("index")


def test_former_names_are_gone():
    import monai_vce.metrics as metrics
    import monai_vce.metrics.temporal_map as temporal_map
    import monai_vce.networks as networks
    import monai_vce.utils as utils

    for module, name in [
        (metrics, "threshold_key"),
        (metrics, "TemporalMAPMetric"),  # a handler: monai_vce.handlers.TemporalMAPMetric
        (temporal_map, "threshold_key"),
        (networks, "CONVERSION_MODES"),
        (utils, "renamed_arguments"),
    ]:
        assert not hasattr(module, name), f"{module.__name__}.{name}"
    with pytest.raises(TypeError, match="thresholds"):
        metrics.temporal_map({"videos": []}, {"videos": []}, thresholds=(0.5,))


def test_bundle_configs_speak_the_current_vocabulary():
    configs = ROOT / "bundle" / "configs"
    text = "\n".join(p.read_text() for p in sorted(configs.glob("*.json")))
    for old in (
        r'"units"',
        r"[^_]units=",
        r'"when"',
        r'"activation"',
        "frame_key",
        "thresholds_key",
        r"'index'",
        "conversion_mode",
        r"monai_vce\.metrics\.TemporalMAPMetric",
    ):
        assert not re.search(old, text), old
    assert "decoder.params" not in text  # no reaching into another component's attributes
