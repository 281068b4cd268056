"""The demo's log file holds the full log whether or not the console is a terminal: MONAI's logging config, applied
whenever a workflow starts, closes every handler, and the file must keep receiving records afterwards."""

from __future__ import annotations

import logging
import logging.config

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
