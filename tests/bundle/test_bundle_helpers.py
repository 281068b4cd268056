"""The in-process bundle runner of the tests (``bundle_helpers.run_in_process``): the command line's output and exit
status, and the process given back as it was."""

from __future__ import annotations

import json
import logging
import os
import sys

import monai.bundle.__main__  # noqa: F401 - imported before the state is compared: imports set environment variables
import pytest
import torch
from bundle_helpers import CONFIGS, run_in_process

#: A bundle config changing what a run may change in a process: threads, exception hook, folder, environment.
_CONFIG = {
    "imports": ["$import logging", "$import os", "$import sys", "$import torch"],
    "initialize": [
        "$torch.set_num_threads(1)",
        "$setattr(sys, 'excepthook', lambda *e: sys.__excepthook__(*e))",
        "$os.chdir('/')",
    ],
    "run": [
        "$os.environ.__setitem__('MONAI_VCE_RUNNER_TEST', '1')",
        "$logging.getLogger('monai_vce.runner_test').info('logged in the run')",
        "$print('printed in the run')",
        "$torch.rand(1).item()",
        "$1 / 0 if @fail else None",
    ],
    "finalize": [],
    "fail": False,
}


def _state() -> tuple:
    root = logging.getLogger()
    return (
        list(root.handlers),
        root.level,
        sys.excepthook,
        os.getcwd(),
        dict(os.environ),
        list(sys.path),
        torch.get_num_threads(),
    )


def test_in_process_run_captures_its_output_and_gives_the_process_back(tmp_path):
    config = tmp_path / "config.json"
    config.write_text(json.dumps(_CONFIG))
    args = ["run", "--config_file", str(config), "--logging_file", str(CONFIGS / "logging.conf")]
    before, rng = _state(), torch.get_rng_state()
    proc = run_in_process(args)
    assert proc.returncode == 0 and "printed in the run" in proc.stdout
    assert "monai_vce.runner_test - INFO - logged in the run" in proc.stdout  # the bundle's logging.conf applied
    assert _state() == before and torch.equal(torch.get_rng_state(), rng)
    # a failing run: the exit status and the traceback on stderr, as the interpreter prints them
    failed = run_in_process([*args, "--fail", "True"], check=False)
    assert failed.returncode == 1 and failed.stderr.startswith("Traceback (most recent call last)")
    assert "ZeroDivisionError: division by zero" in failed.stderr
    with pytest.raises(AssertionError, match="ZeroDivisionError"):
        run_in_process([*args, "--fail", "True"])
    assert _state() == before
    # argument errors of the command line (python-fire) are its exit status 2
    assert run_in_process(["no_such_command"], check=False).returncode == 2
