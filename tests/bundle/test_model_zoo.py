"""The distributable bundle (``scripts/bundle_dist.py``) passes model-zoo's own checks, offline.

What model-zoo runs on a bundle (Project-MONAI/model-zoo at dfae206: ``ci/run_premerge_cpu.sh``,
``ci/verify_bundle.py``, ``ci/unit_tests/runner.py``, ``runtests.sh --codeformat`` with its ``setup.cfg`` and
``pyproject.toml``, ``.pre-commit-config.yaml``), done here on one bundle made once for the module, in a folder laid out
as model-zoo's root (``<root>/models/vce_event_detection``):

1. ``verify_metadata`` against MONAI's published schema (tests/testing_data/model_zoo, checked by its sha256).
2. ``verify_bundle_directory``'s file checks, on a copy holding demo-sized weights in ``models/model.pt``.
3. ``verify_net_in_out`` as ``verify_bundle.py`` calls it.
4. ``ckpt_export`` (scripted) as ``verify_bundle.py`` calls it, and the exported module against the eager network.
5. isort, black and flake8 with model-zoo's settings (tests/testing_data/model_zoo/setup.cfg) on the Python files that go
   into model-zoo, and the file hooks of its pre-commit configuration.
6. the bundle's model-zoo unit test (bundle/ci/unit_tests/test_vce_event_detection.py), run by ``unittest`` from the
   model-zoo-like root, as model-zoo's ``runner.py`` runs it.

Steps 3, 4 and 6 use the demo's tiny network (``configs/demo.json`` and ``configs/demo_metadata.json`` over
``inference.json`` and ``metadata.json``): the BiomedCLIP-size network takes minutes to script and to run on 2 CPU
cores (model-zoo runs these checks, its "full" mode, on a GPU), and the bundle ships no weights. The shipped
network's shape check runs in tests/bundle/test_bundle_dist.py.

Not done here, because they need the network (each replaced by what can be checked offline):

* ``ci/prepare_schema.py`` downloads the schema into ``eval/schema.json``: the published copy is put there instead.
* ``verify_bundle_directory`` first downloads ``large_files.yml``'s files (BiomedCLIP's, from the Hugging Face hub):
  each entry is checked to make a valid ``monai.apps.download_url`` call, nothing is downloaded.
* ``ci/get_bundle_requirements.py`` and ``pip install`` of the metadata's packages from the package index:
  ``monai-vce`` is not on the index (the bundle carries its wheel in ``wheels/``), so model-zoo's CI cannot install
  it this way; tests/bundle/test_bundle_dist.py installs the wheel offline.
* ``verify_version_changes`` compares the version with model-zoo's ``models/model_info.json`` (its release
  history, not shipped): only the version's changelog entry is checked.

``verify_bundle_properties`` looks for properties files in model-zoo folders named after ``supported_apps``
(``monai-label``, ``monai-deploy``), which model-zoo does not have, so it checks nothing there; the unit test checks
the inference workflow's properties (MONAI's own list).

The code format tools, ``parameterized`` and flake8's plugins come with the ``dev`` extra; without them those two
tests are skipped with the reason shown.
"""

from __future__ import annotations

import configparser
import contextlib
import importlib.util
import inspect
import io
import json
import os
import shutil
import unittest
import warnings
from collections import OrderedDict
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch
from bundle_helpers import REPO, SCHEMA, SCHEMA_SHA256, _isolated

NAME = "vce_event_detection"
ZOO = REPO / "tests" / "testing_data" / "model_zoo"
ZOO_SETTINGS = ZOO / "setup.cfg"
#: The bundle's model-zoo unit test (model-zoo's ci/unit_tests/test_vce_event_detection.py); not in the bundle.
ZOO_UNIT_TEST = REPO / "bundle" / "ci" / "unit_tests" / "test_vce_event_detection.py"
#: The tiny network's overrides (the demo's), in the order the bundle's documentation passes them.
DEMO_CONFIGS = ("configs/inference.json", "configs/demo.json")
DEMO_META = ("configs/metadata.json", "configs/demo_metadata.json")
#: What model-zoo's format check needs beyond the three tools: its flake8 selection includes B, C and N codes.
FORMAT_MODULES = ("isort", "black", "flake8", "bugbear", "flake8_comprehensions", "pep8ext_naming")
DEV = "pip install -e '.[dev]'"


def _load(path: Path, name: str) -> ModuleType:
    """Import a file that is not in a package (the bundle script and model-zoo's unit test)."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _files(bundle: Path, names: tuple[str, ...]) -> list[str]:
    return [str(bundle / n) for n in names]


@contextlib.contextmanager
def _monai_call() -> Iterator[None]:
    """A MONAI bundle call in this process, which is given back as it was (logging, threads, random states)."""
    with _isolated(threads=2, env={"HF_HUB_OFFLINE": "1"}):
        yield


@pytest.fixture(scope="module")
def zoo_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder laid out as model-zoo's root, with the distributable bundle at ``models/vce_event_detection``."""
    root = tmp_path_factory.mktemp("model_zoo")
    bundle_dist = _load(REPO / "scripts" / "bundle_dist.py", "bundle_dist")
    bundle_dist.make_bundle(root / "models", NAME, zip_it=False)  # the folder is what model-zoo receives
    return root


@pytest.fixture(scope="module")
def dist(zoo_root: Path) -> Path:
    """The distributable bundle as made (read-only: the checks that write use :func:`prepared`)."""
    return zoo_root / "models" / NAME


@pytest.fixture(scope="module")
def prepared(dist: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the bundle as ``verify_bundle.py`` sees it after its downloads: the schema in ``eval/schema.json``
    (prepare_schema.py's place) and demo-sized random weights in ``models/model.pt`` (no weights are shipped)."""
    from monai_vce.networks import DiffAttnCLIPClassifier

    bundle = tmp_path_factory.mktemp("prepared") / NAME
    shutil.copytree(dist, bundle)
    (bundle / "eval").mkdir()
    shutil.copy(SCHEMA, bundle / "eval" / "schema.json")
    torch.manual_seed(0)
    net = DiffAttnCLIPClassifier(backbone="vce-tiny-vit-64", pretrained=False, image_size=64, contrastive=False)
    torch.save(net.state_dict(), bundle / "models" / "model.pt")
    return bundle


def _directory_problems(bundle: Path) -> list[str]:
    """The files ``verify_bundle_directory`` requires that ``bundle`` lacks (necessary: ``configs/metadata.json``
    and ``LICENSE``; preferred: ``models/model.pt`` and ``configs/inference`` as .json, .yaml or .yml)."""
    missing = [f for f in ("configs/metadata.json", "LICENSE", "models/model.pt") if not (bundle / f).is_file()]
    if not any((bundle / "configs" / f"inference.{ext}").is_file() for ext in ("json", "yaml", "yml")):
        missing.append("configs/inference.json")
    return missing


def test_verify_metadata(prepared: Path) -> None:
    """``verify_metadata`` as verify_bundle.py calls it (the schema at ``eval/schema.json``), the published copy's
    hash checked; and the demo's metadata override, which steps 3 and 4 use, against the same schema."""
    from monai.bundle import verify_metadata

    schema = str(prepared / "eval" / "schema.json")
    with _monai_call():
        for meta in (str(prepared / "configs" / "metadata.json"), _files(prepared, DEMO_META)):
            verify_metadata(meta_file=meta, filepath=schema, hash_val=SCHEMA_SHA256, hash_type="sha256")


def test_verify_bundle_directory_and_version(dist: Path, prepared: Path) -> None:
    """``verify_bundle_directory`` and ``verify_version_changes``, offline.

    The shipped bundle lacks only ``models/model.pt`` (model-zoo's check fails on it until a release lists the
    trained weights in ``large_files.yml``, which verify_bundle.py downloads first); with demo-sized weights in
    ``models/`` the check passes. ``large_files.yml`` is read as model-zoo's ``download_large_files`` reads it, and
    every entry must make a valid ``download_url`` call (not made: it downloads).
    """
    from monai.apps.utils import download_url
    from monai.bundle import ConfigParser

    assert _directory_problems(dist) == ["models/model.pt"]
    assert _directory_problems(prepared) == []

    large = sorted(f.name for f in dist.iterdir() if f.stem == "large_files" and f.suffix in (".json", ".yaml", ".yml"))
    assert large == ["large_files.yml"]
    parser = ConfigParser()
    parser.read_config(str(dist / "large_files.yml"))
    entries = parser.get()["large_files"]
    assert entries, "large_files.yml lists no files"
    for entry in entries:
        kwargs = {k: v for k, v in entry.items() if k != "path" and v != ""}  # empty hashes are dropped, as there
        inspect.signature(download_url).bind(filepath=str(dist / entry["path"]), fuzzy=True, **kwargs)
        assert entry["url"].startswith("https://"), entry
        assert (dist / entry["path"]).resolve().is_relative_to(dist.resolve()), entry

    meta = json.loads((dist / "configs" / "metadata.json").read_text())
    assert meta["version"] in meta["changelog"]


def test_verify_net_in_out(prepared: Path) -> None:
    """``verify_net_in_out`` as verify_bundle.py calls it (``network_def``, ``bundle_root``), with the demo's tiny
    network: its overrides of the network and of the input's spatial shape (see the module docstring)."""
    from monai.bundle import verify_net_in_out

    with _monai_call():
        verify_net_in_out(
            net_id="network_def",
            meta_file=_files(prepared, DEMO_META),
            config_file=_files(prepared, DEMO_CONFIGS),
            bundle_root=str(prepared),
        )


def test_ckpt_export_scripted_matches_the_eager_network(prepared: Path, tmp_path: Path) -> None:
    """``ckpt_export`` as verify_bundle.py calls it (scripted: ``use_trace`` left at its default, False) from the
    demo-sized ``models/model.pt``; the TorchScript module gives the eager network's output, within 1e-5, on a
    float frame in [0, 1] and on a ``uint8`` frame (the network scales it itself).

    ``ckpt_export`` takes one metadata file (MONAI checks ``os.path.exists(meta_file)``): ``metadata.json`` as in
    model-zoo; the demo's metadata override changes only the input's spatial shape, which scripting does not use.
    """
    from monai.bundle import ConfigParser, ckpt_export
    from monai.data import load_net_with_metadata

    ts_file = tmp_path / "verify_model.ts"  # verify_bundle.py writes models/verify_model.ts into the bundle
    with _monai_call():
        ckpt_export(
            net_id="network_def",
            filepath=str(ts_file),
            ckpt_file=str(prepared / "models" / "model.pt"),
            meta_file=str(prepared / "configs" / "metadata.json"),
            config_file=_files(prepared, DEMO_CONFIGS),
            bundle_root=str(prepared),
        )
    scripted, meta, _ = load_net_with_metadata(str(ts_file))
    assert isinstance(scripted, torch.jit.ScriptModule)
    assert meta["version"] == json.loads((prepared / "configs" / "metadata.json").read_text())["version"]

    parser = ConfigParser()
    parser.read_config(_files(prepared, DEMO_CONFIGS))
    parser.read_meta(_files(prepared, DEMO_META))
    parser["bundle_root"] = str(prepared)
    eager = parser.get_parsed_content("network_def")
    eager.load_state_dict(torch.load(prepared / "models" / "model.pt", weights_only=True))
    eager.eval()
    generator = torch.Generator().manual_seed(0)
    inputs = {
        "float": torch.rand(2, 3, 64, 64, generator=generator),
        "uint8": torch.randint(0, 256, (2, 3, 64, 64), generator=generator, dtype=torch.uint8),
    }
    with torch.no_grad():
        for kind, x in inputs.items():
            expected, got = eager(x), scripted(x)
            assert got.shape == (2, 17), kind
            torch.testing.assert_close(got, expected, atol=1e-5, rtol=0, msg=lambda m, k=kind: f"{k} input: {m}")


def _zoo_python_files(dist: Path) -> list[Path]:
    """The Python files a model-zoo pull request adds: the bundle's and its unit test."""
    files = sorted(dist.rglob("*.py"))
    names = {p.relative_to(dist).as_posix() for p in files}
    assert {"deploy_app/app.py", "monailabel_app/main.py", "monailabel_app/vce_studies.py"} <= names, names
    return [*files, ZOO_UNIT_TEST]


def _black_config(out: Path) -> Path:
    """The ``[black]`` section of the settings file as the ``[tool.black]`` table black reads (TOML only)."""
    section = configparser.ConfigParser()
    section.read(ZOO_SETTINGS)
    lines = ["[tool.black]"]
    for key, value in section["black"].items():
        if value.isdigit() or value in ("true", "false"):
            lines.append(f"{key} = {value}")
        else:
            lines.append(f"{key} = {json.dumps([v.strip() for v in value.split(',')])}")
    out.write_text("\n".join(lines) + "\n")
    return out


def _cli(main: Callable[..., Any], argv: list[str], **kwargs: Any) -> tuple[int, str]:
    """Run a tool's command line in this process; returns its exit status and output."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out), warnings.catch_warnings():
        # black's use of pathspec's old pattern name: a notice of the installed versions, not of the files checked
        warnings.filterwarnings("ignore", "GitWildMatchPattern", DeprecationWarning)
        try:
            code = main(argv, **kwargs)
        except SystemExit as e:
            code = e.code
    return int(code or 0), out.getvalue()


def test_code_format_with_model_zoo_settings(dist: Path, tmp_path: Path) -> None:
    """``runtests.sh --codeformat`` of model-zoo on the files it would get: ``isort --check``,
    ``black --skip-magic-trailing-comma --check`` and ``flake8`` with model-zoo's settings, each given the settings
    file explicitly (tests/testing_data/model_zoo/setup.cfg). isort places ``monai_vce`` among the third-party packages (it
    is not under the settings file's folder), as in model-zoo, where it is an installed package."""
    for module in FORMAT_MODULES:
        pytest.importorskip(module, reason=f"{module} (model-zoo's code format check) is not installed: {DEV}")
    import black
    import isort.main
    from flake8.main.application import Application

    files = [str(p) for p in _zoo_python_files(dist)]
    code, out = _cli(isort.main.main, ["--check-only", "--diff", "--settings-path", str(ZOO_SETTINGS), *files])
    assert code == 0, f"isort:\n{out}"
    config = _black_config(tmp_path / "black.toml")
    for path in files:  # one file a call: no process pool
        code, out = _cli(black.main, ["--check", "--diff", "--config", str(config), path], standalone_mode=False)
        assert code == 0, f"black:\n{out}"
    report = tmp_path / "flake8.txt"
    app = Application()
    app.run(["--config", str(ZOO_SETTINGS), "--jobs", "1", "--output-file", str(report), *files])
    assert app.result_count == 0, f"flake8:\n{report.read_text()}"


def test_pre_commit_file_hooks(dist: Path) -> None:
    """The file hooks of model-zoo's .pre-commit-config.yaml on the bundle: ``pretty-format-json``
    (``--indent=4 --no-sort-keys``), ``end-of-file-fixer``, ``trailing-whitespace`` (not on .pt/.ts),
    ``mixed-line-ending``, ``check-added-large-files`` (1024 kB) and ``check-executables-have-shebangs``."""
    problems = []
    for path in sorted(p for p in dist.rglob("*") if p.is_file()):
        rel = path.relative_to(dist).as_posix()
        if path.stat().st_size > 1024 * 1024:
            problems.append(f"{rel}: larger than 1024 kB")
        if os.access(path, os.X_OK) and not path.read_bytes().startswith(b"#!"):
            problems.append(f"{rel}: executable without a shebang")
        if path.suffix in (".whl", ".png", ".jpg", ".pt", ".ts"):
            continue
        text = path.read_bytes().decode()
        if text and (not text.endswith("\n") or text.endswith("\n\n")):
            problems.append(f"{rel}: not ended by one newline")
        if "\r" in text:
            problems.append(f"{rel}: not LF line endings")
        if any(line != line.rstrip() for line in text.split("\n")):
            problems.append(f"{rel}: trailing whitespace")
        if path.suffix == ".json":
            loaded = json.loads(text, object_pairs_hook=OrderedDict)
            if text != json.dumps(loaded, indent=4, ensure_ascii=True, separators=(",", ": ")) + "\n":
                problems.append(f"{rel}: not as pretty-format-json writes it")
    assert not problems, "\n".join(problems)


def test_model_zoo_unit_test_on_the_dist_bundle(zoo_root: Path) -> None:
    """The bundle's model-zoo unit test (``ci/unit_tests/test_vce_event_detection.py`` there), loaded and run by
    ``unittest`` from the model-zoo-like root as model-zoo's runner.py does (its ``bundle_root`` is relative to that
    folder): inference of the distributable bundle with the demo's tiny network and random weights on 2 generated
    videos of 30 frames."""
    pytest.importorskip("parameterized", reason=f"parameterized (model-zoo's unit tests) is not installed: {DEV}")
    module = _load(ZOO_UNIT_TEST, "test_vce_event_detection")
    suite = unittest.defaultTestLoader.loadTestsFromModule(module)
    stream = io.StringIO()
    with _monai_call(), contextlib.redirect_stdout(stream):
        os.chdir(zoo_root)  # given back by _monai_call
        result = unittest.TextTestRunner(stream=stream, verbosity=2).run(suite)
    assert result.testsRun == 1 and result.wasSuccessful(), stream.getvalue()[-6000:]
