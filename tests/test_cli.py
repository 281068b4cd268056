"""The command line ``python -m monai_vce <command>``: one parser per command, one error style, and each package's
``python -m monai_vce.<package>`` the same parser."""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import logging
import os
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

from monai_vce.__main__ import COMMANDS, main
from monai_vce.cli import BAD_INPUT, command_main, print_error, run_command
from monai_vce.events.probabilities import Video, probability_file, save_video_probs
from monai_vce.labels import NUM_LABELS
from monai_vce.stages import decode

REPO = Path(__file__).resolve().parents[1]

#: command -> the module of its own entry point ``python -m <module>``
ENTRY_POINTS = {
    "metrics": "monai_vce.metrics.__main__",
    "report": "monai_vce.report.__main__",
    "review": "monai_vce.review.__main__",
    "temporal": "monai_vce.temporal.__main__",
    "synthetic": "monai_vce.data.synthetic",
    "text-embeddings": "monai_vce.text_embeddings",
    "check-backbone": "monai_vce.networks.check",
    "demo": "monai_vce.demo",
}


def _cli(*argv: object, entry=main) -> tuple[int, str, str]:
    """``entry(argv)`` in this process: ``(exit code, stdout, stderr)``."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = entry([str(a) for a in argv])
    return code, out.getvalue(), err.getvalue()


def _probs(folder: Path, videos=("a", "b")) -> Path:
    """Probability files with two sections each (frame numbers = 2 * index + 7)."""
    rng = np.random.default_rng(0)
    for i, vid in enumerate(videos):
        T = 120 + 20 * i
        probs = np.full((T, NUM_LABELS), 0.02, np.float32)
        probs[: T // 2, 2], probs[T // 2 :, 3] = 0.95, 0.95
        probs += 0.03 * rng.random(probs.shape, dtype=np.float32)
        index = np.arange(T)
        save_video_probs(probability_file(folder, vid), Video(vid, probs, index, 2 * index + 7))
    return folder


def test_help_lists_every_command():
    code, out, err = _cli("--help")
    assert code == 0 and err == ""
    for name, (_, line) in COMMANDS.items():
        assert f"    {name}" in out and line.split()[0] in out
    assert set(COMMANDS) == {*ENTRY_POINTS, "decode", "refine"}


@pytest.mark.parametrize("command", sorted(ENTRY_POINTS))
def test_each_package_entry_point_is_the_same_parser(command):
    entry = importlib.import_module(ENTRY_POINTS[command]).main
    prog = f"python -m {ENTRY_POINTS[command].removesuffix('.__main__')}"
    action = ["fit"] if command == "temporal" else []
    code, unified, _ = _cli(command, *action, "--help")
    code_alone, alone, _ = _cli(*action, "--help", entry=entry)
    assert code == code_alone == 0
    assert unified.startswith(f"usage: python -m monai_vce {' '.join([command, *action])}")
    assert alone.startswith(f"usage: {' '.join([prog, *action])}")

    def words(text: str, prog: str) -> list[str]:  # argparse wraps the usage lines after the program's name
        return text.replace(prog, "PROG").split()

    assert words(unified, f"python -m monai_vce {command}") == words(alone, prog)
    assert len(words(unified, command)) > 20  # a description and the flags' help


@pytest.mark.parametrize("command", sorted(set(COMMANDS) - {"demo"}))
def test_usage_errors_are_one_line_with_exit_code_2(command):
    code, out, err = _cli(command)  # every command but demo has required arguments
    lines = err.strip().splitlines()
    assert code == BAD_INPUT and out == "" and len(lines) == 1, err
    assert lines[0].startswith(f"error: python -m monai_vce {command}") and "--help" in lines[0]


def test_unknown_command_and_flag_spelt_out():
    code, _, err = _cli("bogus")
    assert code == BAD_INPUT and err.startswith("error: python -m monai_vce: ") and "'bogus'" in err
    # no abbreviations: --probs is not read as --probs-dir
    code, _, err = _cli("metrics", "--gt", "g.json", "--events", "e.json", "--probs", "p")
    assert code == BAD_INPUT and "unrecognized arguments: --probs p" in err


@pytest.mark.parametrize(
    "argv, flag",
    [
        (["metrics", "--gt", "g", "--events", "e", "--pred", "p"], "--pred"),
        (["metrics", "--gt", "g", "--events", "e", "--thresholds", "0.5"], "--thresholds"),
        (["report", "--events", "e", "--out", "o", "--units", "frame_index"], "--units"),
        (["report", "--events", "e", "--out", "o", "--pred", "p"], "--pred"),
        (["review", "--events", "e", "--frames-dir", "f", "--out", "o", "--frames", "f"], "--frames"),
        (["temporal", "fit", "--probs-dir", "p", "--gt", "g", "--out", "o", "--units", "frame_index"], "--units"),
        (["temporal", "fit", "--probs-dir", "p", "--gt", "g", "--out", "o", "--val-probs", "v"], "--val-probs"),
        (["synthetic", "--out", "o", "--videos", "2"], "--videos"),
        (["synthetic", "--out", "o", "--events", "g"], "--events"),
        (["refine", "--probs-dir", "p", "--refiner", "r", "--out", "o", "--model", "m"], "--model"),
    ],
)
def test_removed_flags_are_refused(argv, flag):
    code, out, err = _cli(*argv)
    assert code == BAD_INPUT and out == "" and len(err.strip().splitlines()) == 1
    assert f"unrecognized arguments: {flag}" in err


def test_temporal_refine_moved_to_the_refine_command():
    code, _, err = _cli("temporal", "refine", "--probs-dir", "p")
    assert code == BAD_INPUT and "invalid choice: 'refine'" in err


def test_metrics_thresholds_and_compact_output(tmp_path):
    gt = {"videos": [{"video_id": "a", "events": [{"start": 0, "end": 9, "label": ["colon"]}]}]}
    pred = {"videos": [{"video_id": "a", "events": [{"start": 0, "end": 7, "label": ["colon"]}]}]}
    (tmp_path / "gt.json").write_text(json.dumps(gt))
    (tmp_path / "pred.json").write_text(json.dumps(pred))
    argv = [
        "metrics",
        "--gt",
        tmp_path / "gt.json",
        "--events",
        tmp_path / "pred.json",
        "--tiou-thresholds",
        "0.5",
        "0.9",
    ]
    code, out, err = _cli(*argv, "--indent", "-1")
    assert code == 0 and err == "" and len(out.splitlines()) == 1, err
    result = json.loads(out)
    assert result["per_label"]["colon"]["0.5"] == 1.0 and result["per_label"]["colon"]["0.9"] == 0.0
    code, indented, _ = _cli(*argv)
    assert code == 0 and len(indented.splitlines()) > 1 and json.loads(indented) == result


def test_decode_writes_the_stage_output(tmp_path):
    probs = _probs(tmp_path / "probs")
    code, out, err = _cli("decode", "--probs-dir", probs, "--out", tmp_path / "events.json")
    assert code == 0, err
    summary = json.loads(out)
    expected = decode(probs, tmp_path / "expected.json")
    assert (tmp_path / "events.json").read_bytes() == expected.read_bytes()
    n_events = sum(len(v["events"]) for v in json.loads(expected.read_text())["videos"])
    assert n_events > 0
    assert summary == {
        "out": str(tmp_path / "events.json"),
        "videos": 2,
        "events": n_events,
        "frame_units": "frame_index",
    }
    assert "wrote" in err and "error" not in err  # the stage's summary line on stderr
    # --videos and --frame-units reach the stage
    code, out, err = _cli(
        "decode", "--probs-dir", probs, "--out", tmp_path / "b.json", "--videos", "b", "--frame-units", "frame_number"
    )
    assert code == 0, err
    assert json.loads(out)["videos"] == 1 and json.loads(out)["frame_units"] == "frame_number"
    decode(probs, tmp_path / "b_expected.json", videos=["b"], frame_units="frame_number")
    assert (tmp_path / "b.json").read_bytes() == (tmp_path / "b_expected.json").read_bytes()


def test_decode_bad_input_is_one_line(tmp_path):
    probs = _probs(tmp_path / "probs")
    cases = [
        (["--probs-dir", probs, "--videos", "a", "nope"], "nope"),
        (["--probs-dir", probs, "--decoder", tmp_path / "missing_decoder.json"], "missing_decoder.json"),
        (["--probs-dir", tmp_path / "no_such_folder"], "no_such_folder"),
    ]
    for argv, expected in cases:
        code, out, err = _cli("decode", *argv, "--out", tmp_path / "e.json")
        lines = err.strip().splitlines()
        assert code == BAD_INPUT and out == "" and len(lines) == 1, err
        assert lines[0].startswith("error: ") and expected in lines[0], lines
    assert not (tmp_path / "e.json").exists()


def test_run_command_prints_results_warnings_and_errors(capsys):
    def ok(args):
        warnings.warn("first thing\nwith a forged line", UserWarning, stacklevel=1)
        logging.getLogger("monai_vce.some.module").warning("a logged warning")
        return {"out": "x"}

    assert run_command(_namespace(ok)) == 0
    out, err = capsys.readouterr()
    assert json.loads(out) == {"out": "x"}
    assert err.splitlines() == ["warning: first thing\\nwith a forged line", "warning: a logged warning"]

    def bad(args):
        raise FileNotFoundError("input.json not found")

    assert run_command(_namespace(bad)) == BAD_INPUT
    assert capsys.readouterr() == ("", "error: input.json not found\n")

    def bug(args):
        raise KeyError("a bug keeps its traceback")

    with pytest.raises(KeyError):
        run_command(_namespace(bug))
    assert run_command(_namespace(lambda args: 3)) == 3
    assert print_error("two\nlines") == BAD_INPUT and capsys.readouterr().err == "error: two\\nlines\n"


def test_command_main_returns_the_exit_code_of_help_and_usage_errors(capsys):
    def add_parser(subparsers):
        p = subparsers.add_parser("thing", description="A thing.")
        p.add_argument("--out", required=True)
        p.set_defaults(run=lambda args: {"out": args.out})
        return p

    assert command_main(add_parser, ["--help"], "python -m thing") == 0
    assert capsys.readouterr().out.startswith("usage: python -m thing ")
    assert command_main(add_parser, [], "python -m thing") == BAD_INPUT
    assert capsys.readouterr().err.startswith("error: python -m thing: the following arguments are required: --out")
    assert command_main(add_parser, ["--out", "o"], "python -m thing") == 0
    assert json.loads(capsys.readouterr().out) == {"out": "o"}


def _namespace(run):
    import argparse

    return argparse.Namespace(run=run)


@pytest.mark.background
def test_end_to_end_processes(tmp_path):
    """The two real processes: ``python -m monai_vce --help`` and one decode."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "monai_vce", "--help"], capture_output=True, text=True, cwd=REPO, env=env, timeout=120
    )
    assert proc.returncode == 0 and all(name in proc.stdout for name in COMMANDS), proc.stderr
    probs = _probs(tmp_path / "probs")
    out = tmp_path / "events.json"
    proc = subprocess.run(
        [sys.executable, "-m", "monai_vce", "decode", "--probs-dir", str(probs), "--out", str(out)],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["out"] == str(out)
    assert out.read_bytes() == decode(probs, tmp_path / "expected.json").read_bytes()
    sidecar = json.loads(out.with_suffix(".meta.json").read_text())
    expected = json.loads((tmp_path / "expected.meta.json").read_text())
    assert sidecar.pop("events_file") == "events.json" and expected.pop("events_file") == "expected.json"
    assert sidecar == expected


def test_decode_with_a_screening_decoder_keeps_scores_and_moves_its_operating_point(tmp_path):
    from monai_vce.events import Video
    from monai_vce.labels import LABELS
    from monai_vce.postprocessing import DecoderParams, tune_screening

    probs = _probs(tmp_path / "probs")
    T, ulcer = 300, LABELS.index("ulcer")
    p = np.full((T, len(LABELS)), 0.01, dtype=np.float32)
    p[100:120, ulcer], p[200:205, ulcer] = 0.8, 0.3
    video = Video("v", p, np.arange(T), np.arange(T), events=[{"start": 100, "end": 119, "label": ["ulcer"]}])
    tune_screening([video], false_alarms_per_exam=0.0, max_frames_share=1.0).save(tmp_path / "screening.json")
    code, out, err = _cli("decode", "--probs-dir", probs, "--decoder", tmp_path / "screening.json", "--out",
                          tmp_path / "s.json")  # fmt: skip
    assert code == 0, err
    events = [e for v in json.loads((tmp_path / "s.json").read_text())["videos"] for e in v["events"]]
    assert events and all(isinstance(e["score"], float) for e in events)
    argv = ["decode", "--probs-dir", probs, "--out", tmp_path / "m.json", "--false-alarms-per-exam"]
    code, out, err = _cli(*argv, "4", "--decoder", tmp_path / "screening.json")
    assert code == 0 and json.loads(out)["events"] >= 0, err
    DecoderParams().save(tmp_path / "challenge.json")
    code, out, err = _cli(*argv, "4", "--decoder", tmp_path / "challenge.json")
    assert code == BAD_INPUT and out == "" and "not screening parameters" in err and len(err.strip().splitlines()) == 1
    code, out, err = _cli(*argv, "4")  # no --decoder: the budget cannot be ignored silently
    assert code == BAD_INPUT and out == "" and "screening decoder file is required" in err
