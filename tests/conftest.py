"""Shared fixtures: a tiny generated mini-Galar and the real Galar ground-truth timelines; the ``background`` lane
(tests/background_lane.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from background_lane import (
    pytest_collection_modifyitems,
    pytest_runtest_logreport,
    pytest_sessionfinish,
    pytest_terminal_summary,
)

#: The real Galar annotations: ``MONAI_VCE_GALAR_EVENTS`` when set, else beside the repository
#: (``<repo>/../shared/data/galar_events.json``).
GALAR_EVENTS = Path(
    os.environ.get("MONAI_VCE_GALAR_EVENTS")
    or Path(__file__).resolve().parents[2] / "shared" / "data" / "galar_events.json"
)
#: Why the tests on the real timelines are skipped, and how to run them.
GALAR_MISSING = (
    f"real Galar timelines not found at {GALAR_EVENTS}: they are the RARE-VISION challenge's sample ground truth "
    "galar_events.json (80 videos, CC BY 4.0, from the challenge's public repository); set "
    "MONAI_VCE_GALAR_EVENTS=/path/to/galar_events.json to run these tests"
)


@pytest.fixture(scope="session")
def galar_events_path() -> Path:
    """Path of the real ``galar_events.json``; skips the test when the file is not there."""
    if not GALAR_EVENTS.is_file():
        pytest.skip(GALAR_MISSING)
    return GALAR_EVENTS


@pytest.fixture(scope="session")
def mini_galar(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A generated mini-Galar shared by the whole session: 4 videos x 60 frames x 32 px, seed 0.

    Layout: ``frames/<video_id>/frame_*.PNG|png``, ``labels/<video_id>.csv``, ``metadata.csv``,
    ``ground_truth.json``. Videos ``2`` and ``ukdd_navi_00004`` use ``frame = 5 * index + offset``;
    ``ukdd_navi_00004`` uses 7-digit lower-case file names. Treat it as read-only.
    """
    import warnings

    from monai_vce.data import generate_mini_galar

    out = tmp_path_factory.mktemp("mini_galar") / "data"
    with warnings.catch_warnings():
        # without the real annotations the built-in timelines are used; that is fine for a fixture
        warnings.simplefilter("ignore")
        return generate_mini_galar(out, videos=4, frames_per_video=60, size=32, seed=0)


__all__ = [
    "galar_events_path",
    "mini_galar",
    "pytest_collection_modifyitems",
    "pytest_runtest_logreport",
    "pytest_sessionfinish",
    "pytest_terminal_summary",
]
