"""Hardening of the review site (issue 25): it replaces only files it wrote, takes the output lock, honours the
recorded frame units, says so on bad probabilities, remakes empty thumbnails, fails on a failed write, checks its
arguments; the Deploy app writes the units sidecar of its event file."""

from __future__ import annotations

import errno
import importlib.util
import json
import subprocess
import sys
import types
import warnings
from pathlib import Path

import numpy as np
import pytest

from monai_vce.events import save_events
from monai_vce.events.probabilities import Video, save_video_probs
from monai_vce.labels import LABELS, NUM_LABELS
from monai_vce.review import exam_file_name, write_review_site
from monai_vce.review import thumbnails as thumbnails_mod
from monai_vce.review.__main__ import main

ROOT = Path(__file__).resolve().parents[2]
N = 8  # frames of the one video


def _read_js(path: Path) -> dict:
    return json.loads(path.read_text().split("=", 1)[1].strip().rstrip(";"))


@pytest.fixture
def exam(tmp_path):
    """A frame folder of one video ``1`` (frame numbers 10, 12, ...), an event JSON and a probability file."""
    from PIL import Image

    frames = tmp_path / "frames" / "1"
    frames.mkdir(parents=True)
    rng = np.random.default_rng(0)
    numbers = np.arange(N) * 2 + 10
    for n in numbers:
        Image.fromarray(rng.integers(0, 255, (24, 24, 3), dtype=np.uint8)).save(frames / f"frame_{n:06d}.png")
    pred = tmp_path / "pred.json"
    pred.write_text(
        json.dumps({"videos": [{"video_id": "1", "events": [{"start": 1, "end": 4, "label": ["stomach"]}]}]})
    )
    probs = tmp_path / "probs"
    save_video_probs(
        probs / "1.npz",
        Video("1", np.full((N, NUM_LABELS), 0.5, np.float32), np.arange(N, dtype=np.int64), numbers),
    )
    return {"root": tmp_path, "frames": tmp_path / "frames", "pred": pred, "probs": probs, "numbers": numbers}


def _cli(exam, out, *extra):
    return main(
        [
            "--events",
            str(exam["pred"]),
            "--frames-dir",
            str(exam["frames"]),
            "--out",
            str(out),
            "--probs-dir",
            str(exam["probs"]),
            "--workers",
            "2",
            *extra,
        ]
    )


def _thumbs(out: Path) -> list[Path]:
    return sorted((out / "exams" / exam_file_name("1") / "thumbs").glob("*.jpg"))


# --- writers touch only what they wrote -------------------------------------------------------------------------


def test_a_users_files_in_an_exam_folder_are_never_deleted(exam, capsys):
    out = exam["root"] / "site"
    mine = out / "exams" / exam_file_name("1") / "notes.txt"
    mine.parent.mkdir(parents=True)
    mine.write_text("my notes")
    assert _cli(exam, out) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "notes.txt" in err and "not written by the review site" in err
    assert mine.read_text() == "my notes"


def test_a_rerun_with_new_settings_keeps_a_file_added_to_the_exam_folder(exam, capsys):
    out = exam["root"] / "site"
    assert _cli(exam, out) == 0
    mine = out / "exams" / exam_file_name("1") / "thumbs" / "mine.jpg"
    mine.write_bytes(b"user data")
    beside = out / "README.txt"
    beside.write_text("beside the site")
    assert _cli(exam, out, "--strip-frames", "3") == 2  # the exam's thumbnails must be remade
    assert "mine.jpg" in capsys.readouterr().err
    assert mine.read_bytes() == b"user data" and beside.read_text() == "beside the site"
    mine.unlink()
    assert _cli(exam, out, "--strip-frames", "3") == 0  # its own files are replaced
    assert beside.read_text() == "beside the site"
    data = _read_js(out / "exams" / exam_file_name("1") / "data.js")
    assert len(data["thumbs"]["rows"]) and len(_thumbs(out)) <= 3 + 7


def test_a_page_the_site_did_not_write_is_not_overwritten(exam, capsys):
    out = exam["root"] / "site"
    out.mkdir()
    (out / "index.html").write_text("<p>the user's page</p>")
    assert _cli(exam, out) == 2
    assert "index.html" in capsys.readouterr().err
    assert (out / "index.html").read_text() == "<p>the user's page</p>"


def test_a_manifest_naming_files_outside_the_site_is_refused(exam, capsys):
    out = exam["root"] / "site"
    out.mkdir()
    victim = exam["root"] / "victim.txt"
    victim.write_text("keep me")
    manifest = {"format": "monai-vce review site manifest", "version": 1, "files": ["../victim.txt"]}
    (out / ".monai_vce_review.json").write_text(json.dumps(manifest))
    assert _cli(exam, out) == 2
    assert ".monai_vce_review.json" in capsys.readouterr().err
    assert victim.read_text() == "keep me" and not (out / "index.html").exists()


def test_the_site_folder_is_locked_while_written(exam, capsys):
    out = exam["root"] / "site"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from monai_vce.utils import OutputLock; "
         "l = OutputLock(sys.argv[1]).acquire(); print('held', flush=True); time.sleep(60)", str(out)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        assert _cli(exam, out) == 2
        err = capsys.readouterr().err
        assert "in use" in err and len(err.strip().splitlines()) == 1
        assert not (out / "index.html").exists()
    finally:
        holder.kill()
        holder.wait()


# --- frame units recorded beside the event file -----------------------------------------------------------------


def test_an_event_file_recorded_in_other_units_is_refused(exam, capsys):
    pred = exam["root"] / "numbered.json"
    save_events(pred, json.loads(exam["pred"].read_text()), frame_units="frame_number")
    exam = dict(exam, pred=pred)
    assert _cli(exam, exam["root"] / "site", "--frame-units", "frame_index") == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "numbered.json" in err and "frame_number" in err and "frame_index" in err
    assert not (exam["root"] / "site" / "index.html").exists()


def test_the_recorded_units_are_adopted_without_frame_units(exam):
    pred = exam["root"] / "numbered.json"
    # frame numbers 12..18 are rows 1..4
    events = {"videos": [{"video_id": "1", "events": [{"start": 12, "end": 18, "label": ["stomach"]}]}]}
    save_events(pred, events, frame_units="frame_number")
    assert _cli(dict(exam, pred=pred), exam["root"] / "site") == 0
    data = _read_js(exam["root"] / "site" / "exams" / exam_file_name("1") / "data.js")
    assert data["units"] == "frame_number"
    assert (data["events"][0]["s"], data["events"][0]["e"]) == (1, 4)


# --- probabilities that cannot be drawn -------------------------------------------------------------------------


@pytest.mark.parametrize("value", [float("nan"), float("inf"), 1.5, -0.25])
def test_non_finite_or_out_of_range_probabilities_are_reported(exam, value):
    p = np.full((N, NUM_LABELS), 0.5, np.float32)
    p[3, LABELS.index("ulcer")] = value
    save_video_probs(exam["probs"] / "1.npz", Video("1", p, np.arange(N, dtype=np.int64), exam["numbers"]))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        write_review_site(
            exam["pred"], exam["frames"], exam["root"] / "site", probs_dir=exam["probs"], num_workers=2, progress=False
        )
    msgs = [str(w.message) for w in caught if "probabilit" in str(w.message)]
    assert len(msgs) == 1 and "\n" not in msgs[0], [str(w.message) for w in caught]
    assert "'1'" in msgs[0] and "frame_index 3" in msgs[0] and "'ulcer'" in msgs[0]


# --- thumbnails -------------------------------------------------------------------------------------------------


def test_empty_or_cut_thumbnails_are_written_again(exam):
    out = exam["root"] / "site"
    write_review_site(exam["pred"], exam["frames"], out, probs_dir=exam["probs"], num_workers=2, progress=False)
    thumbs = _thumbs(out)
    good = {p.name: p.read_bytes() for p in thumbs}
    for p in thumbs[:-1]:
        p.write_bytes(b"")  # what a full disk left
    thumbs[-1].write_bytes(good[thumbs[-1].name][:40])  # cut
    write_review_site(exam["pred"], exam["frames"], out, probs_dir=exam["probs"], num_workers=2, progress=False)
    assert {p.name: p.read_bytes() for p in _thumbs(out)} == good


def test_a_failed_thumbnail_write_fails_the_run_naming_the_file(exam, capsys, monkeypatch):
    class FullDisk:
        def __init__(self, path, mode):
            self.f = open(path, mode)  # noqa: SIM115

        def write(self, data):
            self.f.write(data[: len(data) // 2])
            raise OSError(errno.ENOSPC, "No space left on device")

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

    monkeypatch.setattr(thumbnails_mod, "open", FullDisk, raising=False)
    out = exam["root"] / "site"
    assert _cli(exam, out) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "No space left" in err and "thumbs" in err and ".jpg" in err
    assert _thumbs(out) == []  # no cut thumbnail is left to be kept by a rerun
    assert not (out / "index.html").exists()
    monkeypatch.undo()
    assert _cli(exam, out) == 0 and _thumbs(out)


# --- arguments --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, name", [({"videos": "1"}, "videos"), ({"progress": "yes"}, "progress"), ({"videos": 1}, "videos")]
)
def test_bad_arguments_are_refused_naming_them(exam, kwargs, name):
    with pytest.raises(ValueError, match=name) as info:
        write_review_site(
            exam["pred"], exam["frames"], exam["root"] / "site", probs_dir=exam["probs"], num_workers=2, **kwargs
        )
    assert "\n" not in str(info.value)
    assert not (exam["root"] / "site").exists()


# --- the Deploy app's units sidecar -----------------------------------------------------------------------------


def _import_deploy_app(monkeypatch):
    """bundle/deploy_app/app.py with stand-ins for holoscan and MONAI Deploy (not installed in the main venv):
    only its event writer's ``write`` is exercised, which uses neither."""

    class Stub:
        def __init__(self, *args, **kwargs):
            pass

    names = {
        "holoscan": {},
        "holoscan.conditions": {"CountCondition": Stub},
        "monai.deploy": {},
        "monai.deploy.core": dict.fromkeys(["AppContext", "Application", "Fragment", "IOType", "Operator", "OperatorSpec"], Stub),
        "monai.deploy.operators": {},
        "monai.deploy.operators.monai_bundle_inference_operator": {"IOMapping": Stub, "MonaiBundleInferenceOperator": Stub},
    }  # fmt: skip
    for name, attrs in names.items():
        mod = types.ModuleType(name)
        mod.__dict__.update(attrs)
        monkeypatch.setitem(sys.modules, name, mod)
    spec = importlib.util.spec_from_file_location(
        "vce_deploy_app_under_test", ROOT / "bundle" / "deploy_app" / "app.py"
    )
    assert spec is not None and spec.loader is not None
    app = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(app)
    return app


@pytest.mark.parametrize("units", ["frame_index", "frame_number"])
def test_the_deploy_app_writes_the_units_sidecar(tmp_path, monkeypatch, units):
    from monai_vce.events import read_events_meta
    from monai_vce.postprocessing import load_decoder

    app = _import_deploy_app(monkeypatch)
    writer = object.__new__(app.EventWriterOperator)
    writer.output_dir = tmp_path / "out"
    from monai_vce.postprocessing import EventDecoder

    writer.decoder = EventDecoder(load_decoder(None).params.replace(frame_units=units))
    rng = np.random.default_rng(0)
    writer.probs = list(rng.random((30, NUM_LABELS), dtype=np.float32))
    writer.frames = [{"video_id": "v", "frame_index": i, "frame_number": 100 + 3 * i} for i in range(30)]
    path = writer.write()
    meta = read_events_meta(path)
    assert meta is not None and meta["frame_units"].value == units
    first = 0 if units == "frame_index" else 100
    assert meta["videos"] == {"v": {"frames": 30, "first": first, "last": first + (29 if first == 0 else 87)}}
