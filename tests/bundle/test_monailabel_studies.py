"""The MONAI Label app's datastore patterns (``bundle/monailabel_app/vce_studies.py``), without MONAI Label: Galar's
``frame_000003.PNG`` frames are listed on a case-sensitive file system (the server test in test_integrations.py runs
where MONAI Label is installed)."""

from __future__ import annotations

import fnmatch
import importlib.util

import pytest
from bundle_helpers import BUNDLE

_spec = importlib.util.spec_from_file_location("vce_studies", BUNDLE / "monailabel_app" / "vce_studies.py")
assert _spec is not None and _spec.loader is not None
vce_studies = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(vce_studies)

#: MONAI Label 0.8.5's ``MONAI_LABEL_DATASTORE_FILE_EXT``: lower-case only.
MONAI_LABEL_DEFAULTS = ["*.nii.gz", "*.nii", "*.nrrd", "*.jpg", "*.png", "*.tif", "*.svs", "*.xml"]

NAMES = ["frame_000003.PNG", "frame_0000004.png", "frame_000005.JPG", "frame_000006.jpg", "frame_000007.JPEG"]
OTHERS = ["frame_000008.csv", "datastore_v2.json", ".lock", "notes.txt", "frame_000009.PNG.tmp", "scan.nii.gz"]


def _listed(patterns: list[str], names: list[str]) -> set[str]:
    """What LocalDatastore._list_files keeps (``fnmatch.filter`` per pattern), with Linux's case-sensitive matching
    whatever the platform running the test."""
    return {name for name in names for pattern in patterns if fnmatch.fnmatchcase(name, pattern)}


def test_default_patterns_list_galar_upper_case_frames_on_a_case_sensitive_file_system():
    patterns = vce_studies.datastore_extensions()
    assert patterns == ["*.png", "*.PNG", "*.jpg", "*.JPG", "*.jpeg", "*.JPEG"]
    assert _listed(patterns, NAMES + OTHERS) == set(NAMES)
    # the bug: MONAI Label's default patterns miss Galar's frames
    assert "frame_000003.PNG" not in _listed(MONAI_LABEL_DEFAULTS, NAMES)


def test_patterns_give_the_datastore_id_without_the_extension():
    # LocalDatastore._to_id: the last listed extension the name ends with is removed (else pathlib's suffixes)
    suffixes = [p.replace("*", "") for p in vce_studies.datastore_extensions()]
    for name in NAMES:
        ext = [s for s in suffixes if name.endswith(s)][-1]
        assert name.replace(ext, "") == name.split(".")[0], name


@pytest.mark.parametrize(
    ("conf", "expected"),
    [
        ("", ["*.png", "*.PNG", "*.jpg", "*.JPG", "*.jpeg", "*.JPEG"]),
        (" , ", ["*.png", "*.PNG", "*.jpg", "*.JPG", "*.jpeg", "*.JPEG"]),
        ("png", ["*.png", "*.PNG"]),
        ("PNG, .jpg", ["*.png", "*.PNG", "*.jpg", "*.JPG"]),
        ("*.png,png,*.PNG", ["*.png", "*.PNG"]),
        ("nii.gz", ["*.nii.gz", "*.NII.GZ"]),
    ],
)
def test_conf_extensions_are_listed_in_both_cases(conf, expected):
    assert vce_studies.datastore_extensions(conf) == expected


@pytest.mark.parametrize("conf", ["*", "*.*", "../x", "a/b.png", "*.[pP][nN][gG]", ".", "png*", "p ng"])
def test_conf_extensions_refuse_what_is_not_an_extension(conf):
    with pytest.raises(ValueError, match="not a file extension"):
        vce_studies.datastore_extensions(conf)
