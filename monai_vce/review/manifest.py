"""The manifest of a review site (``.monai_vce_review.json``): the files the site wrote, so that a rerun replaces
only those.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable
from pathlib import Path

from monai_vce.utils import atomic_write_json, read_json_file, safe_text

__all__ = ["MANIFEST_NAME", "SiteManifest"]

#: File name of the manifest in the site folder.
MANIFEST_NAME = ".monai_vce_review.json"
_FORMAT = "monai-vce review site manifest"
_VERSION = 1
_MAX_BYTES = 256 << 20


class SiteManifest:
    """The files of one review site folder that the site wrote.

    Args:
        root: the site folder.

    Raises:
        ValueError: the manifest exists but is not one (naming it).
    """

    def __init__(self, root: str | os.PathLike) -> None:
        self.root = Path(root)
        self.path = self.root / MANIFEST_NAME
        self.files: set[str] = set()
        if self.path.is_symlink() or (self.path.exists() and not self.path.is_file()):
            raise ValueError(f"review site manifest {safe_text(self.path)} is not a regular file; remove it")
        if self.path.exists():
            obj = read_json_file(self.path, _MAX_BYTES, what="review site manifest")
            files = obj.get("files") if isinstance(obj, dict) else None
            if (
                not isinstance(obj, dict)
                or obj.get("format") != _FORMAT
                or not isinstance(files, list)
                or not all(isinstance(f, str) and _safe_rel(f) for f in files)
            ):
                raise ValueError(
                    f"{safe_text(self.path)} is not a review site manifest; remove it or choose another --out"
                )
            self.files = set(files)

    def rel(self, path: str | os.PathLike) -> str:
        """``path`` relative to the site folder, ``/``-separated."""
        return Path(os.path.relpath(path, self.root)).as_posix()

    def owns(self, path: str | os.PathLike) -> bool:
        """Whether the site wrote ``path`` (a listed file, or the temporary file of one)."""
        rel = self.rel(path)
        if rel in self.files:
            return True
        name, parent = Path(rel).name, Path(rel).parent
        if not (name.startswith(".") and name.endswith(".tmp")):
            return False
        core = name[1:-4]  # ".<file>.tmp" (thumbnails) or ".<file>.<random>.tmp" (monai_vce.utils)
        return any((parent / c).as_posix() in self.files for c in (core, core.rpartition(".")[0]) if c)

    def check_writable(self, paths: Iterable[str | os.PathLike]) -> None:
        """Refuse (one line naming it) the first of ``paths`` that exists and was not written by the site."""
        for p in paths:
            if os.path.lexists(p) and not self.owns(p):
                raise FileExistsError(_foreign(p))

    def check_folder(self, folder: str | os.PathLike) -> None:
        """Refuse (one line naming it) the first file under ``folder`` that the site did not write."""
        folder = Path(folder)
        if folder.is_symlink() or (folder.exists() and not folder.is_dir()):
            raise FileExistsError(_foreign(folder))
        for dirpath, dirnames, filenames in os.walk(folder):
            for name in sorted(filenames) + sorted(d for d in dirnames if os.path.islink(os.path.join(dirpath, d))):
                p = os.path.join(dirpath, name)
                if not self.owns(p):
                    raise FileExistsError(_foreign(p))

    def clear_folder(self, folder: str | os.PathLike) -> None:
        """Delete the site's files under ``folder`` (after :meth:`check_folder`) and the folders left empty."""
        folder = Path(folder)
        for dirpath, _, filenames in os.walk(folder, topdown=False):
            for name in filenames:
                p = os.path.join(dirpath, name)
                if self.owns(p):  # never a file the site did not write
                    os.unlink(p)
                    self.files.discard(self.rel(p))
            with contextlib.suppress(OSError):  # a folder holding something else is left as it is
                os.rmdir(dirpath)

    def add(self, paths: Iterable[str | os.PathLike]) -> None:
        """List ``paths`` and write the manifest (before the files are written)."""
        self.files.update(self.rel(p) for p in paths)
        self.save()

    def save(self) -> None:
        """Write the manifest atomically."""
        atomic_write_json(self.path, {"format": _FORMAT, "version": _VERSION, "files": sorted(self.files)}, indent=None)


def _safe_rel(rel: str) -> bool:
    # a manifest never names a file outside its folder: a hostile one cannot make a rerun delete elsewhere
    parts = rel.split("/")
    return bool(rel) and not rel.startswith("/") and ".." not in parts and "" not in parts and "\\" not in rel


def _foreign(path: str | os.PathLike) -> str:
    return (
        f"{safe_text(path)} was not written by the review site (not in its manifest {MANIFEST_NAME}); it is left as "
        "it is: move it or choose another --out"
    )
