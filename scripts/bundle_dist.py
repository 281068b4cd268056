"""Make the distributable bundle: the bundle folder, the monai-vce wheel inside it, and a zip of both.

The bundle's configs import ``monai_vce``, which is not on the package index: a model-zoo style CI installs the
bundle's ``required_packages_version`` from the index and would fail. This command builds the ``monai-vce`` wheel
from this checkout (offline: ``pip wheel --no-deps --no-build-isolation``) and writes::

    <out>/<name>/                        the bundle (configs, docs, LICENSE, large_files.yml, models/ without
                                         weights, the MONAI Label and MONAI Deploy apps)
    <out>/<name>/wheels/monai_vce-<version>-py3-none-any.whl
    <out>/<name>.zip                     the same folder, zipped (MONAI's bundle archive layout)

``required_packages_version`` of ``configs/metadata.json`` names the wheel's version (checked). Install and check it
with::

    pip install --no-index --find-links <name>/wheels monai-vce      # its dependencies from your index or cache
    cd <name> && python -m monai.bundle verify_metadata --meta_file configs/metadata.json

Usage: ``python scripts/bundle_dist.py --out dist [--name vce_event_detection]``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

__all__ = ["BUNDLE_CONTENT", "make_bundle", "main"]

REPO = Path(__file__).resolve().parents[1]
#: What the distributed bundle holds, relative to ``bundle/`` (run outputs such as ``demo/`` or ``eval/`` are not).
BUNDLE_CONTENT = ("configs", "docs", "LICENSE", "large_files.yml", "monailabel_app", "deploy_app")
# what the wheel is built from (a copy, so that the checkout gets no build/ or egg-info folders)
_SOURCE = ("pyproject.toml", "README.md", "LICENSE", "monai_vce")


def _build_wheel(out: Path) -> Path:
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "src"
        src.mkdir()
        for name in _SOURCE:
            path = REPO / name
            if path.is_dir():
                shutil.copytree(path, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
            else:
                shutil.copy2(path, src / name)
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(out),
            str(src),
        ]
        subprocess.run(cmd, check=True)
    wheels = sorted(out.glob("monai_vce-*.whl"))
    if len(wheels) != 1:
        raise RuntimeError(f"expected one monai_vce wheel in {out}, found {[w.name for w in wheels]}")
    return wheels[0]


def make_bundle(out: str | Path, name: str = "vce_event_detection", zip_it: bool = True) -> Path:
    """Write the distributable bundle ``<out>/<name>`` (and ``<out>/<name>.zip``); returns the bundle folder.

    Raises:
        FileExistsError: ``<out>/<name>`` exists (nothing is overwritten).
        RuntimeError: the wheel's version differs from the one ``metadata.json`` requires.
    """
    out = Path(out).resolve()
    root = out / name
    if root.exists():
        raise FileExistsError(f"{root} exists; remove it or choose another --out")
    out.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{name}.", dir=out))
    try:
        bundle = staging / name
        bundle.mkdir()
        for item in BUNDLE_CONTENT:
            path = REPO / "bundle" / item
            if path.is_dir():
                shutil.copytree(path, bundle / item, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
            else:
                shutil.copy2(path, bundle / item)
        (bundle / "models").mkdir()  # no weights: large_files.yml names what a release carries
        wheel = _build_wheel(bundle / "wheels")
        meta = json.loads((bundle / "configs" / "metadata.json").read_text())
        version = wheel.name.split("-")[1]
        if meta["required_packages_version"].get("monai-vce") != version:
            raise RuntimeError(
                f"metadata.json requires monai-vce {meta['required_packages_version'].get('monai-vce')}, the wheel is {version}"
            )
        bundle.rename(root)
        if zip_it:
            shutil.make_archive(str(out / name), "zip", root_dir=out, base_dir=name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return root


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "dist", help="output folder (default: dist/)")
    parser.add_argument("--name", default="vce_event_detection", help="bundle folder name")
    parser.add_argument("--no-zip", action="store_true", help="write the folder only")
    args = parser.parse_args(argv)
    root = make_bundle(args.out, args.name, zip_it=not args.no_zip)
    print(
        json.dumps(
            {
                "bundle": str(root),
                "zip": None if args.no_zip else f"{root}.zip",
                "wheel": str(next((root / "wheels").glob("*.whl"))),
            }
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
