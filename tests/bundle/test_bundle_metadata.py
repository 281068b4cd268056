"""The bundle's metadata.json and large_files.yml against MONAI's bundle specification and model-zoo's conventions.

Offline by default: the schema is MONAI's published one, copied (tests/testing_data/model_zoo/README.md). ``MONAI_VCE_NETWORK_TESTS=1`` adds the check that
the pinned versions install together (``pip install --dry-run``) on each Python version pyproject.toml accepts
(up to 3.13).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml
from bundle_helpers import BUNDLE, CONFIGS, METADATA, REPO, SCHEMA
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

DEMO_METADATA = str(CONFIGS / "demo_metadata.json")
LARGE_FILES = BUNDLE / "large_files.yml"
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]

#: The display ``name``: every model-zoo bundle's metadata has it (the zoo's listing reads it); the schema does not.
SPEC_EXTRA_KEYS = {"name"}
#: ``network_data_format`` keys of the specification (``post_processed_outputs``: the output after postprocessing).
DATA_FORMAT_KEYS = {"inputs", "outputs", "post_processed_outputs"}
#: Tensor ``type`` values the specification defines.
SPEC_TENSOR_TYPES = {"image", "series", "tuples", "probabilities"}
#: The trained files inference and evaluation read from models/ (inference.json, evaluate.json).
TRAINED_FILES = (
    "models/model.pt",
    "models/model.ts",
    "models/decoder.json",
    "models/thresholds.json",
    "models/screening_decoder.json",
)
#: metadata key -> distribution it pins (the required packages pin themselves).
VERSION_KEYS = {"monai_version": "monai", "pytorch_version": "torch", "numpy_version": "numpy"}
NETWORK = os.environ.get("MONAI_VCE_NETWORK_TESTS") == "1"


def _metadata() -> dict[str, Any]:
    return json.loads(Path(METADATA).read_text())


def _demo_metadata() -> dict[str, Any]:
    """metadata.json with the demo's override applied, as ``--meta_file "[metadata.json, demo_metadata.json]"``."""
    from monai.bundle import ConfigParser

    return ConfigParser.load_config_files([METADATA, DEMO_METADATA])


def _dependencies() -> dict[str, Requirement]:
    reqs = [Requirement(d) for d in PYPROJECT["dependencies"]]
    return {canonicalize_name(r.name): r for r in reqs}


def _pins(meta: dict[str, Any]) -> dict[str, str]:
    """``{distribution: version}`` of every version the metadata pins."""
    pins = {VERSION_KEYS[k]: meta[k] for k in VERSION_KEYS}
    pins.update(meta["required_packages_version"])
    return pins


def _python_versions() -> list[str]:
    """The Python minor versions pyproject.toml's ``requires-python`` accepts, up to 3.13."""
    accepted = SpecifierSet(PYPROJECT["requires-python"])
    return [f"3.{minor}" for minor in range(8, 14) if accepted.contains(f"3.{minor}")]


def _schema() -> dict[str, Any]:
    return json.loads(Path(SCHEMA).read_text())


@pytest.mark.parametrize("load", [_metadata, _demo_metadata], ids=["metadata", "demo_metadata"])
def test_metadata_validates_against_the_published_schema(load):
    jsonschema = pytest.importorskip("jsonschema")
    jsonschema.validate(load(), _schema())


@pytest.mark.parametrize("load", [_metadata, _demo_metadata], ids=["metadata", "demo_metadata"])
def test_no_custom_top_level_keys(load):
    known = set(_schema()["properties"]) | SPEC_EXTRA_KEYS
    meta = load()
    custom = {k for k in meta if k not in known and not k.endswith("_data_format")}
    assert not custom, f"keys outside the bundle specification: {sorted(custom)}"
    assert set(meta["network_data_format"]) <= DATA_FORMAT_KEYS


def test_demo_override_only_changes_metadata_keys():
    """demo_metadata.json overrides keys of metadata.json (``a#b`` paths into it) and adds none."""
    meta = _metadata()
    for key in json.loads(Path(DEMO_METADATA).read_text()):
        node: Any = meta
        for part in key.split("#"):
            assert isinstance(node, dict) and part in node, f"demo_metadata.json key {key!r} is not in metadata.json"
            node = node[part]


def test_output_formats_follow_the_specification():
    from monai_vce.labels import LABELS

    fmt = _metadata()["network_data_format"]
    raw, post = fmt["outputs"]["pred"], fmt["post_processed_outputs"]["pred"]
    for spec in (*fmt["inputs"].values(), raw, post):
        assert spec["type"] in SPEC_TENSOR_TYPES
    # raw network scores (logits): unbounded; the sigmoid of the postprocessing maps them to [0, 1]
    assert raw["value_range"] == [] and post["value_range"] == [0, 1]
    for spec in (raw, post):
        assert spec["format"] == "classes" and spec["num_channels"] == len(LABELS) == 17
        assert list(spec["channel_def"].values()) == list(LABELS)
    inference = json.loads((CONFIGS / "inference.json").read_text())
    steps = inference["postprocessing"]["transforms"]
    assert any(s.get("_target_") == "Activationsd" and s.get("sigmoid") and s.get("keys") == "pred" for s in steps)


def test_supported_apps_references_and_authors():
    meta = _metadata()
    assert meta["supported_apps"] == {"monai-label": "", "monai-deploy": ""}
    assert (BUNDLE / "monailabel_app").is_dir() and (BUNDLE / "deploy_app").is_dir()
    assert any(r.startswith("Chary & Ganapathy (2026)") and "RARE-VISION" in r for r in meta["references"])
    authors = ", ".join(a["name"] for a in PYPROJECT["authors"])
    assert meta["authors"] == authors and authors in meta["copyright"]
    assert meta["version"] in meta["changelog"]


def test_pinned_versions_satisfy_pyproject():
    meta, deps = _metadata(), _dependencies()
    for name, version in _pins(meta).items():
        parsed = Version(version)
        assert not parsed.local and not parsed.is_prerelease, f"{name} {version}: not a final release"
        key = canonicalize_name(name)
        if key == canonicalize_name(PYPROJECT["name"]):
            assert version == PYPROJECT["version"], f"{name} {version} is not this project's version"
            continue
        assert key in deps, f"{name} is pinned in metadata.json but is no dependency in pyproject.toml"
        assert deps[key].specifier.contains(parsed), f"{name} {version} is outside pyproject's {deps[key]}"


@pytest.mark.slow
@pytest.mark.skipif(not NETWORK, reason="set MONAI_VCE_NETWORK_TESTS=1 to check the pins against the package index")
@pytest.mark.parametrize("python", _python_versions())
def test_pinned_versions_install_together_on_every_python(python):
    """``pip install --dry-run --python-version X`` resolves all pinned versions together, dependencies included,
    from wheels (what a model-zoo environment of that Python would install), and installs exactly the pins."""
    own = canonicalize_name(PYPROJECT["name"])  # built by scripts/bundle_dist.py, not on the index
    pins = {canonicalize_name(n): v for n, v in _pins(_metadata()).items() if canonicalize_name(n) != own}
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        cmd = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--only-binary=:all:"]
        cmd += ["--python-version", python, "--target", str(Path(tmp) / "target"), "--quiet", "--report"]
        cmd += [str(report), *(f"{n}=={v}" for n, v in pins.items())]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
        assert proc.returncode == 0, f"Python {python}: the pins do not install together:\n{proc.stderr[-3000:]}"
        resolved = {
            canonicalize_name(item["metadata"]["name"]): item["metadata"]["version"]
            for item in json.loads(report.read_text())["install"]
        }
    assert {n: resolved.get(n) for n in pins} == pins


def test_large_files_follow_model_zoo_form():
    from monai.bundle import ConfigParser

    data = yaml.safe_load(LARGE_FILES.read_text())
    assert set(data) == {"large_files"}, f"keys no tool reads: {sorted(set(data) - {'large_files'})}"
    entries = ConfigParser.load_config_file(str(LARGE_FILES))["large_files"]  # how MONAI reads it
    assert entries == data["large_files"] and entries
    paths = [e["path"] for e in entries]
    assert len(paths) == len(set(paths))
    for entry in entries:
        assert set(entry) == {"path", "url", "hash_val", "hash_type"}, entry
        path = Path(entry["path"])
        assert not path.is_absolute() and ".." not in path.parts
        # download_large_files and model-zoo's verification download every entry: each needs a url
        assert entry["url"].startswith("https://"), entry
        assert isinstance(entry["hash_val"], str) and entry["hash_type"] in {"md5", "sha1", "sha256", "sha512"}
    # the trained files inference needs have no public url yet: described (comments), listed once released
    text = LARGE_FILES.read_text()
    for name in TRAINED_FILES:
        assert name in text, f"{name} is not described in large_files.yml"
