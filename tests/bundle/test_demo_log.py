"""The demo's log file holds the full log whether or not the console is a terminal: MONAI's logging config, applied
whenever a workflow starts, closes every handler, and the file must keep receiving records afterwards."""

from __future__ import annotations

import logging
import logging.config
from pathlib import Path

from bundle_helpers import CONFIGS

from monai_vce.demo import _Console


def test_demo_log_survives_monais_logging_config(tmp_path, monkeypatch):
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    log = tmp_path / "demo" / "demo.log"
    console = _Console(log, verbose=False)
    try:
        monkeypatch.setattr("sys.stderr.isatty", lambda: False, raising=False)
        for step in range(3):  # three workflows, each applying the bundle's logging.conf as MONAI does
            logging.config.fileConfig(str(CONFIGS / "logging.conf"), disable_existing_loggers=False)
            console.apply()
            logging.getLogger("monai_vce.test").info("step %d", step)
    finally:
        console.close()
        root.handlers[:] = handlers
        root.setLevel(level)
    lines = log.read_text().splitlines()
    assert [line.rsplit(" - ", 1)[-1] for line in lines] == ["step 0", "step 1", "step 2"]


def test_demo_runs_the_bundle_of_the_working_folder(tmp_path, monkeypatch):
    from monai_vce.demo import DEMO_BUNDLE, demo_bundle

    checkout = tmp_path / "checkout"
    (checkout / "bundle" / "configs").mkdir(parents=True)
    (checkout / "bundle" / "configs" / "metadata.json").write_text("{}")
    monkeypatch.chdir(checkout)  # a checkout's root: the commands after the demo read bundle/demo/
    assert demo_bundle() == Path("bundle")
    monkeypatch.chdir(checkout / "bundle")  # the bundle folder itself (model-zoo style commands)
    assert demo_bundle() == Path(".")
    monkeypatch.chdir(tmp_path)  # anywhere else: this package's own bundle
    assert demo_bundle() == DEMO_BUNDLE
