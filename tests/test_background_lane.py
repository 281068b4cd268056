"""The session's background lane (tests/background_lane.py): marked tests run in the child and report its result."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from background_lane import LANE_ENV

TESTS = Path(__file__).resolve().parent

SAMPLE = """
import os
import pytest

def test_here():
    assert LANE not in os.environ

@pytest.mark.background
def test_passes_in_the_child():
    assert os.environ[LANE]

@pytest.mark.background
def test_fails_in_the_child():
    assert 1 == 2, "the child's own message"

@pytest.mark.background
def test_skips_in_the_child():
    pytest.skip("the child's reason")

@pytest.mark.background
@pytest.mark.parametrize("n", [1, 2])
def test_parametrized(n):
    assert n in (1, 2)

@pytest.mark.background
def test_kills_the_child():
    os._exit(3)
"""


@pytest.mark.background
@pytest.mark.background
def test_marked_tests_report_the_childs_outcome(tmp_path):
    (tmp_path / "conftest.py").write_text(
        f"import sys\nsys.path.insert(0, {str(TESTS)!r})\nfrom background_lane import *  # noqa: F403\n"
    )
    (tmp_path / "test_sample.py").write_text(f"LANE = {LANE_ENV!r}\n" + SAMPLE)
    env = {k: v for k, v in os.environ.items() if k != LANE_ENV}  # this test may itself run in a lane's child
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-v", "-rA", "-p", "no:cacheprovider", "-o", "markers=background"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = proc.stdout + proc.stderr
    assert re.search(r"\b2 failed, 4 passed, 1 skipped\b", out), out
    assert "PASSED test_sample.py::test_here" in out
    assert "PASSED test_sample.py::test_passes_in_the_child" in out and "test_parametrized[2]" in out
    assert "FAILED test_sample.py::test_fails_in_the_child" in out and "the child's own message" in out
    assert "SKIPPED" in out and "the child's reason" in out
    assert "FAILED test_sample.py::test_kills_the_child" in out and "ended without a result" in out
    # the stand-ins run after the foreground tests, in their order
    order = [
        re.search(rf"::{name}\S* (PASSED|FAILED|SKIPPED)", out) for name in ("test_here", "test_passes", "test_kills")
    ]
    assert all(order) and order[0].start() < order[1].start() < order[2].start(), out
