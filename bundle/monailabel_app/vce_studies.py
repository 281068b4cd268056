"""Which files of the studies folder the app's datastore lists (no MONAI Label import: testable without it).

MONAI Label's local datastore matches its file patterns with :func:`fnmatch.filter`, which is case-sensitive on
Linux, and its default patterns are lower-case (``*.png``, ``*.jpg``): Galar's frames (``frame_000003.PNG``) were not
listed, so the datastore held no image and every ``POST /infer`` failed. The app lists the frame formats the bundle
reads, each extension spelled in lower and in upper case.
"""

from __future__ import annotations

import re

#: Extensions of the frame files the studies folder lists: PNG (Galar's ``.PNG``) and JPEG, which the bundle reads.
FRAME_EXTENSIONS = (".png", ".jpg", ".jpeg")

# one extension as given in ``--conf extensions``: ``png``, ``.png`` or ``*.png`` (``nii.gz``: several parts)
_EXTENSION = re.compile(r"(?:\*?\.)?([A-Za-z0-9]+(?:\.[A-Za-z0-9]+)*)")


def datastore_extensions(extensions: str = "") -> list[str]:
    """The file patterns of MONAI Label's ``LocalDatastore(extensions=...)``: ``*.<ext>`` for each extension in
    lower case and in upper case (``*.png``, ``*.PNG``), as the datastore's matching is case-sensitive on Linux.
    Mixed-case spellings (``.Png``) are not listed.

    Args:
        extensions: comma-separated extensions (``png,jpg``, ``.png`` or ``*.png``; the app's ``--conf extensions``);
            empty: :data:`FRAME_EXTENSIONS`.

    Raises:
        ValueError: an extension is not letters and digits (separated by dots), such as a path or a glob pattern.
    """
    names = [e.strip() for e in extensions.split(",") if e.strip()] or list(FRAME_EXTENSIONS)
    patterns: list[str] = []
    for name in names:
        match = _EXTENSION.fullmatch(name)
        if match is None:
            raise ValueError(
                f"--conf extensions: {name!r} is not a file extension (letters and digits, e.g. png,jpg or .png)"
            )
        for spelled in (match[1].lower(), match[1].upper()):
            if f"*.{spelled}" not in patterns:
                patterns.append(f"*.{spelled}")
    return patterns
