"""A second lane for the test session: the tests marked ``background`` run in one child pytest process, started as
soon as the session's tests are known, while this process runs the others; each marked test then reports the
child's result for it (pass, skip, or failure with the child's traceback and captured output).

The marked tests spend their time in subprocesses of their own, so the child mostly waits and the second core does
their work. The child has its own environment, working folder and ``--basetemp``, so nothing a foreground test
changes reaches it; this process's torch uses one thread from then on. Delegation happens only in the parent and
only when both kinds of tests are selected; the child (``MONAI_VCE_TEST_LANE`` names its results file) runs its
tests as usual and writes one JSON line per report.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

__all__ = [
    "pytest_collection_modifyitems",
    "pytest_runtest_logreport",
    "pytest_sessionfinish",
    "pytest_terminal_summary",
]

#: Set in the child: the file its reports go to.
LANE_ENV = "MONAI_VCE_TEST_LANE"
MARKER = "background"


class LaneFailure(Exception):
    """A delegated test failed in the child (or the child ended without its result); ``str`` is the report."""


class Lane:
    """The child pytest process and the reports it has written so far."""

    def __init__(self, config: pytest.Config, nodeids: list[str]) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="monai-vce-lane-"))
        self.results = self.folder / "results.jsonl"
        self.log = self.folder / "lane.log"
        self.results.touch()
        env = dict(os.environ, **{LANE_ENV: str(self.results)})
        args = ["-q", "-p", "no:cacheprovider", "--basetemp", str(self.folder / "tmp"), *nodeids]
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "pytest", *args], cwd=config.rootpath, env=env, stdout=log, stderr=log
            )
        self.reports: dict[str, list[dict[str, Any]]] = {}
        self._offset = 0
        self.failed = False
        self.started = time.time()
        self.foreground_done: float | None = None  # when the first stand-in ran: the foreground tests were over

    def _read(self) -> None:
        with open(self.results, "rb") as f:
            f.seek(self._offset)
            data = f.read()
        complete = data[: data.rfind(b"\n") + 1]  # a line still being written is read next time
        self._offset += len(complete)
        for line in complete.decode().splitlines():
            report = json.loads(line)
            self.reports.setdefault(report["nodeid"], []).append(report)

    def wait(self, nodeid: str) -> list[dict[str, Any]]:
        """The child's setup, call and teardown reports of ``nodeid``, once its teardown is reported."""
        while True:
            ended = self.proc.poll() is not None
            self._read()
            reports = self.reports.get(nodeid, [])
            if reports and reports[-1]["when"] == "teardown":
                return reports
            if ended:
                self.failed = True
                tail = self.log.read_text(errors="replace")[-3000:]
                raise LaneFailure(
                    f"the background lane (exit status {self.proc.returncode}) ended without a result for {nodeid}; "
                    f"its log, {self.log}:\n{tail}"
                )
            time.sleep(0.2)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        if not self.failed:
            shutil.rmtree(self.folder, ignore_errors=True)


class BackgroundItem(pytest.Item):
    """Stands for a ``background`` test in the parent: same node id, markers and location; the test runs in the lane."""

    def __init__(self, *, original: pytest.Item, lane: Lane, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.original, self.lane = original, lane
        self.own_markers.extend(original.own_markers)  # skipif and friends are evaluated here as in the child
        self.keywords.update(original.keywords)

    def runtest(self) -> None:
        self.lane.foreground_done = self.lane.foreground_done or time.time()
        reports = self.lane.wait(self.nodeid)
        failed = [r for r in reports if r["outcome"] == "failed"]
        if failed:
            self.lane.failed = True
            raise LaneFailure(
                "\n\n".join(_text(r) for r in failed) + f"\n(run in the background lane: {self.lane.log})"
            )
        skipped = [r for r in reports if r["outcome"] == "skipped"]
        if skipped:
            pytest.skip(skipped[0]["text"])

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> Any:
        if isinstance(excinfo.value, LaneFailure):
            return str(excinfo.value)
        return super().repr_failure(excinfo)

    def reportinfo(self) -> Any:
        return self.original.reportinfo()


def _text(report: dict[str, Any]) -> str:
    sections = "".join(f"\n----- {title} -----\n{content}" for title, content in report["sections"])
    return f"[{report['when']}] {report['text']}{sections}"


_lane: Lane | None = None


@pytest.hookimpl(trylast=True)  # after -m / -k / deselection
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    """In the parent: start the lane with the selected ``background`` tests and run their stand-ins last."""
    global _lane
    if os.environ.get(LANE_ENV) or config.option.collectonly:
        return
    marked = [item for item in items if item.get_closest_marker(MARKER)]
    if not marked or len(marked) == len(items):
        return
    _lane = Lane(config, [item.nodeid for item in marked])
    import torch

    # the child's work takes the other core; one thread here for the whole session keeps results reproducible
    torch.set_num_threads(1)
    stand_ins = [
        BackgroundItem.from_parent(item.parent, name=item.name, nodeid=item.nodeid, original=item, lane=_lane)
        for item in marked
    ]
    items[:] = [item for item in items if not item.get_closest_marker(MARKER)] + stand_ins


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """In the child: one JSON line per report, for the parent's stand-in."""
    path = os.environ.get(LANE_ENV)
    if not path:
        return
    longrepr = report.longrepr
    text = longrepr[2] if isinstance(longrepr, tuple) else report.longreprtext
    if isinstance(longrepr, tuple) and text.startswith("Skipped: "):
        text = text[len("Skipped: ") :]
    line = {"nodeid": report.nodeid, "when": report.when, "outcome": report.outcome, "text": text, "time": time.time()}
    line["sections"] = [list(s) for s in report.sections]
    with open(path, "a") as f:
        f.write(json.dumps(line) + "\n")


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """In the parent: how long each lane took, to keep the two balanced."""
    if _lane is None or _lane.foreground_done is None or not _lane.reports:
        return
    ended = max(r["time"] for reports in _lane.reports.values() for r in reports)
    terminalreporter.write_line(
        f"background lane: {len(_lane.reports)} tests in {ended - _lane.started:.0f} s; "
        f"the foreground tests took {_lane.foreground_done - _lane.started:.0f} s"
    )


def pytest_sessionfinish(session: pytest.Session) -> None:
    """In the parent: the lane ends with the session (killed if the session was cut short)."""
    if _lane is not None:
        _lane.close()
