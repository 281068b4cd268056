"""The commands of README.md and bundle/docs/README.md work as printed: every command for the user's own data has a
variant on the demo's outputs, and those variants run, exactly as printed, after the demo (at a tiny size: the test
writes a smaller ``demo.json`` into a copy of the bundle; the command strings are not changed)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from doc_commands import RESULT, doc_commands, entry

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", ROOT / "bundle" / "docs" / "README.md", ROOT / "bundle" / "docs" / "details.md"]
DEMO = "python -m monai_vce.demo"
#: Commands for the user's data without a demo variant (program, module, sub-commands), and why.
NO_DEMO_VARIANT = {
    ("python", "monai_vce", ("text-embeddings",)): "needs a CLIP text tower (BiomedCLIP from the hub or a local copy)",
}
#: The demo at the smallest size that still runs every stage (the test's copy of the bundle only).
TINY_DEMO = {
    "dataset_dir": "$monai_vce.workflows.ensure_mini_galar(os.path.join(@demo_dir, 'mini_galar'), videos=6, "
    "frames_per_video=40, size=64, seed=0, use_real_timelines=False)",
    "test_dir": "$monai_vce.workflows.ensure_mini_galar(os.path.join(@demo_dir, 'mini_galar_test'), videos=2, "
    "frames_per_video=40, size=64, seed=1, use_real_timelines=False)",
    "max_epochs": 1,
    "samples_per_epoch": 64,
    "val_fraction": 0.34,
    "temporal_steps": 3,
    "temporal_crop_length": 40,
    "batch_size": 16,
    "val_batch_size": 32,
}


def test_every_command_for_your_data_has_a_variant_on_the_demo():
    found = doc_commands(DOCS)
    assert not found["errors"], found["errors"]
    runnable = {entry(cmd) for _, cmd in found["run"]}
    missing = [
        f"{where}: {cmd}"
        for where, cmd in found["your-data"]
        if entry(cmd) not in runnable and entry(cmd)[:3] not in NO_DEMO_VARIANT
    ]
    assert not missing, "commands without a variant on the demo's outputs:\n" + "\n".join(missing)
    assert (DEMO in [c for _, c in found["run"]]) and len(found["run"]) > 20


@pytest.mark.background
@pytest.mark.slow  # about 30 bundle runs at a tiny size: 3 to 5 min on 2 busy cores
def test_documented_commands_run_as_printed_on_the_demo(tmp_path):
    found = doc_commands(DOCS)
    repo = tmp_path / "repo"
    shutil.copytree(
        ROOT / "bundle", repo / "bundle", ignore=shutil.ignore_patterns("demo", "eval", "*.pt", "*.ts", "__pycache__")
    )
    # the schema copy the offline verify_metadata command names
    shutil.copytree(ROOT / "tests" / "testing_data" / "model_zoo", repo / "tests" / "testing_data" / "model_zoo")
    demo_json = repo / "bundle" / "configs" / "demo.json"
    demo_json.write_text(json.dumps({**json.loads(demo_json.read_text()), **TINY_DEMO}, indent=4))
    for name, text in found["files"].items():
        (repo / name).write_text(text)
    cmds = [DEMO] + [c for _, c in found["run"] if c != DEMO]
    (repo / "commands.json").write_text(json.dumps(list(dict.fromkeys(cmds))))
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"  # python, torchrun of this venv
    res = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "doc_commands.py"), "commands.json"],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
        timeout=1500,
    )
    results = [json.loads(line[len(RESULT) :]) for line in res.stdout.splitlines() if line.startswith(RESULT)]
    failed = [f"{r['cmd']}\n{r['error']}" for r in results if r["rc"] != 0]
    assert res.returncode == 0 and len(results) == len(set(cmds)), res.stderr[-3000:]
    assert not failed, "\n\n".join(failed)
    assert (repo / "bundle" / "demo" / "eval" / "events.meta.json").is_file()
