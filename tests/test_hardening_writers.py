"""Issue 25, item 2 (writers touch only what they wrote): the output lock, the generator and the report.

Every case uses real files in ``tmp_path``: a lock path that is a link, folder, pipe or hard link; a folder the
generator did not write; PNGs a report did not write; a report folder another run holds locked.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

from monai_vce.utils import OutputLock

REPO = Path(__file__).resolve().parents[1]


def _one_line(text: str, *parts: str) -> None:
    assert "\n" not in text.strip() and "Traceback" not in text, text
    for part in parts:
        assert part in text, (part, text)


# --------------------------------------------------------------------------------------------------- the lock
@pytest.mark.parametrize("dangling", [False, True])
def test_lock_never_writes_or_deletes_through_a_symlink(tmp_path: Path, dangling: bool) -> None:
    outside = tmp_path / "outside" / "precious.txt"
    outside.parent.mkdir()
    if not dangling:
        outside.write_text("keep me")
    out = tmp_path / "out"
    out.mkdir()
    (out / OutputLock.name).symlink_to(outside)
    lock = OutputLock(out)
    with pytest.raises(RuntimeError) as e:
        lock.acquire()
    _one_line(str(e.value), str(out / OutputLock.name), "symbolic link", str(outside))
    lock.release()
    assert not lock.held
    assert (out / OutputLock.name).is_symlink()  # left as it was
    if dangling:
        assert not outside.exists()  # not created through the link
    else:
        assert outside.read_text() == "keep me"


def test_lock_refuses_a_folder_a_pipe_and_a_hard_link(tmp_path: Path) -> None:
    cases = {}
    folder = tmp_path / "folder"
    (folder / OutputLock.name).mkdir(parents=True)
    (folder / OutputLock.name / "inside.txt").write_text("x")
    cases[folder] = "is a folder"
    pipe = tmp_path / "pipe"
    pipe.mkdir()
    os.mkfifo(pipe / OutputLock.name)
    cases[pipe] = "is a named pipe"
    linked = tmp_path / "linked"
    linked.mkdir()
    other = tmp_path / "other.txt"
    other.write_text("another name of the same file")
    os.link(other, linked / OutputLock.name)
    cases[linked] = "hard links"
    for out, what in cases.items():
        with pytest.raises(RuntimeError) as e:
            OutputLock(out).acquire()  # a pipe must not block: no reader ever comes
        _one_line(str(e.value), str(out / OutputLock.name), what)
    assert (folder / OutputLock.name / "inside.txt").read_text() == "x"
    assert other.read_text() == "another name of the same file"


def test_lock_release_removes_only_the_file_it_locked(tmp_path: Path) -> None:
    out = tmp_path / "out"
    lock = OutputLock(out).acquire()
    path = out / OutputLock.name
    # the file is replaced behind the run's back (by a user, another tool): release leaves the new one alone
    path.unlink()
    path.write_text("someone else's")
    lock.release()
    assert path.read_text() == "someone else's"
    # a link put in place of the file: neither the link nor its target goes
    path.unlink()
    target = tmp_path / "target.txt"
    target.write_text("keep")
    lock = OutputLock(out).acquire()
    path.unlink()
    path.symlink_to(target)
    lock.release()
    assert path.is_symlink() and target.read_text() == "keep"


def test_lock_in_a_read_only_folder_is_one_line(tmp_path: Path) -> None:
    if os.geteuid() == 0:
        pytest.skip("root writes into read-only folders")
    out = tmp_path / "ro"
    out.mkdir()
    out.chmod(0o555)
    try:
        with pytest.raises(RuntimeError) as e:
            OutputLock(out).acquire()
        _one_line(str(e.value), str(out), "cannot be locked")
    finally:
        out.chmod(0o755)


# ------------------------------------------------------------------------------------------------ the generator
def _generate(out: Path, **kwargs):
    from monai_vce.data import generate_mini_galar

    args = {"videos": 2, "frames_per_video": 3, "size": 8, "use_real_timelines": False, **kwargs}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return generate_mini_galar(out, **args)


def _tree(root: Path) -> dict[str, bytes | str]:
    return {
        str(p.relative_to(root)): (f"-> {os.readlink(p)}" if p.is_symlink() else p.read_bytes())
        for p in sorted(root.rglob("*"))
        if p.is_symlink() or p.is_file()
    }


def test_generator_cli_refuses_a_look_alike_folder_without_its_manifest(tmp_path: Path, capsys) -> None:
    from monai_vce.data.synthetic import main

    out = tmp_path / "mine"
    (out / "frames" / "1").mkdir(parents=True)
    (out / "frames" / "1" / "frame_000000.PNG").write_bytes(b"my own scan")
    (out / "labels").mkdir()
    (out / "labels" / "1.csv").write_text("my labels")
    (out / "metadata.csv").write_text("my metadata")
    (out / "ground_truth.json").write_text('{"videos": []}')
    before = _tree(out)
    assert (
        main(["--out", str(out), "--num-videos", "1", "--frames-per-video", "3", "--size", "8", "--builtin-timelines"])
        == 2
    )
    err = capsys.readouterr().err
    _one_line(err, str(out), "frames/1/frame_000000.PNG", "did not write")
    assert _tree(out) == before


def test_generator_rerun_replaces_only_its_files(tmp_path: Path) -> None:
    out = _generate(tmp_path / "g", naming="galar")
    manifest = json.loads((out / ".monai_vce_manifest.json").read_text())
    assert set(manifest["files"]) == {k for k in _tree(out) if k != ".monai_vce_manifest.json"}
    # a foreign file anywhere, even among the frames: refused, nothing removed
    for foreign in (out / "notes.txt", out / "frames" / "1" / "frame_000099.PNG", out / "labels" / "extra.csv"):
        foreign.write_text("mine")
        before = _tree(out)
        with pytest.raises(FileExistsError) as e:
            _generate(out, videos=1)
        _one_line(str(e.value), str(out), str(foreign.relative_to(out)), "did not write")
        assert _tree(out) == before
        foreign.unlink()
    # a link among its files to a file outside: refused, the target kept
    outside = tmp_path / "outside.txt"
    outside.write_text("keep")
    (out / "frames" / "1" / "link.PNG").symlink_to(outside)
    with pytest.raises(FileExistsError, match=r"link\.PNG"):
        _generate(out, videos=1)
    (out / "frames" / "1" / "link.PNG").unlink()
    # its own files only: replaced (no stale video), as before
    _generate(out, videos=1)
    assert sorted(p.name for p in (out / "frames").iterdir()) == ["1"]
    assert outside.read_text() == "keep"


def test_generator_manifest_cannot_name_files_outside(tmp_path: Path) -> None:
    out = _generate(tmp_path / "g")
    victim = tmp_path / "victim.txt"
    victim.write_text("keep")
    (out / ".monai_vce_manifest.json").write_text(
        json.dumps({"writer": "monai_vce.data.synthetic", "files": ["../victim.txt", "metadata.csv"]})
    )
    with pytest.raises(ValueError) as e:
        _generate(out)
    _one_line(str(e.value), ".monai_vce_manifest.json", "../victim.txt")
    assert victim.read_text() == "keep"


def test_generator_takes_over_its_killed_writes_and_refuses_a_folder_without_manifest(tmp_path: Path) -> None:
    out = _generate(tmp_path / "g", videos=3)
    (out / "labels" / ".1.csv.k2j4x.tmp").write_text("half a file of a killed write")
    _generate(out, videos=1)
    assert sorted(p.name for p in (out / "frames").iterdir()) == ["1"]
    assert not (out / "labels" / ".1.csv.k2j4x.tmp").exists()
    # no manifest (e.g. only the marker file of an early generator): nothing in it is the generator's
    (out / ".monai_vce_manifest.json").unlink()
    (out / ".mini_galar").write_text("generated by monai_vce.data.synthetic\n")
    with pytest.raises(FileExistsError, match=r"holds no manifest"):
        _generate(out, videos=1)
    assert (out / ".mini_galar").exists() and (out / "metadata.csv").exists()


def test_ensure_mini_galar_never_removes_a_folder_of_other_files(tmp_path: Path) -> None:
    from monai_vce.data import ensure_mini_galar

    out = tmp_path / "data"
    out.mkdir()
    (out / "study.csv").write_text("mine")  # no ground_truth.json: not a complete dataset
    with pytest.raises(FileExistsError, match=r"study\.csv"):
        ensure_mini_galar(out, videos=1, frames_per_video=3, size=8, use_real_timelines=False, progress=False)
    assert (out / "study.csv").read_text() == "mine"
    assert [p.name for p in tmp_path.iterdir()] == ["data"]  # no temporary sibling left


# --------------------------------------------------------------------------------------------------- the report
def _events(*vids: str) -> dict:
    ev = [{"start": 0, "end": 9, "label": ["stomach"]}, {"start": 10, "end": 19, "label": ["colon"]}]
    return {"videos": [{"video_id": v, "events": ev} for v in vids]}


@pytest.fixture
def pred_file(tmp_path: Path) -> Path:
    pytest.importorskip("matplotlib")
    path = tmp_path / "pred.json"
    path.write_text(json.dumps(_events("a", "b")))
    return path


def test_report_leaves_foreign_files_and_replaces_only_its_own(tmp_path: Path, pred_file: Path) -> None:
    from monai_vce.report import write_report

    out = tmp_path / "r"
    (out / "timelines").mkdir(parents=True)
    (out / "timelines" / "mine.png").write_bytes(b"a PNG of mine")
    (out / "summary.png").write_bytes(b"my summary chart")
    res = write_report(pred_file, out, videos=["a", "b"])  # no ground truth: draws no summary.png
    assert set(res["timelines"]) == {"a", "b"} and res["summary_png"] is None
    assert (out / "timelines" / "mine.png").read_bytes() == b"a PNG of mine"
    assert (out / "summary.png").read_bytes() == b"my summary chart"
    manifest = json.loads((out / ".monai_vce_manifest.json").read_text())
    assert manifest["files"] == ["summary.json", "summary.md", "timelines/a.png", "timelines/b.png"]
    # a narrower report removes its own stale timeline, and only that
    write_report(pred_file, out, videos=["a"])
    assert not (out / "timelines" / "b.png").exists() and (out / "timelines" / "a.png").is_file()
    assert (out / "timelines" / "mine.png").read_bytes() == b"a PNG of mine"
    assert (out / "summary.png").read_bytes() == b"my summary chart"
    # a summary.png a report would draw over, that no report wrote: one line, nothing written
    before = _tree(out)
    with pytest.raises(FileExistsError) as e:
        write_report(pred_file, out, gt=pred_file)
    _one_line(str(e.value), str(out), "summary.png", "no earlier report wrote")
    assert _tree(out) == before


def test_report_cli_refuses_to_overwrite_a_foreign_timeline(tmp_path: Path, pred_file: Path, capsys) -> None:
    from monai_vce.report.__main__ import main

    out = tmp_path / "r"
    (out / "timelines").mkdir(parents=True)
    (out / "timelines" / "a.png").write_bytes(b"my own picture of video a")
    assert main(["--events", str(pred_file), "--out", str(out)]) == 2
    _one_line(capsys.readouterr().err, str(out), "timelines/a.png", "no earlier report wrote")
    assert (out / "timelines" / "a.png").read_bytes() == b"my own picture of video a"
    assert sorted(p.name for p in out.iterdir()) == ["timelines"]


def test_report_without_its_manifest_is_not_taken_over(tmp_path: Path, pred_file: Path) -> None:
    from monai_vce.report import write_report

    out = tmp_path / "r"
    write_report(pred_file, out, gt=pred_file)
    (out / ".monai_vce_manifest.json").unlink()  # only the manifest says what a report wrote
    before = _tree(out)
    with pytest.raises(FileExistsError) as e:
        write_report(pred_file, out, videos=["b"])
    _one_line(str(e.value), str(out), "no earlier report wrote")
    assert _tree(out) == before


def test_report_manifest_and_timelines_link_cannot_reach_outside(tmp_path: Path, pred_file: Path) -> None:
    from monai_vce.report import write_report

    victim = tmp_path / "victim.png"
    victim.write_bytes(b"keep")
    out = tmp_path / "r"
    out.mkdir()
    (out / ".monai_vce_manifest.json").write_text(
        json.dumps({"writer": "monai_vce.report", "files": ["../victim.png"]})
    )
    with pytest.raises(ValueError) as e:
        write_report(pred_file, out)
    _one_line(str(e.value), ".monai_vce_manifest.json", "../victim.png")
    (out / ".monai_vce_manifest.json").unlink()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "a.png").write_bytes(b"not a report's")
    (out / "timelines").symlink_to(elsewhere)
    with pytest.raises(FileExistsError, match="is a link"):
        write_report(pred_file, out)
    assert victim.read_bytes() == b"keep" and _tree(elsewhere) == {"a.png": b"not a report's"}


def test_report_cli_refuses_a_folder_another_run_holds(tmp_path: Path, pred_file: Path, capsys) -> None:
    from monai_vce.report.__main__ import main

    out = tmp_path / "r"
    code = (
        "import sys\nfrom monai_vce.utils import OutputLock\nOutputLock(sys.argv[1]).acquire()\n"
        "print('locked', flush=True)\nsys.stdin.read()\n"
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", code, str(out)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=REPO
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        assert main(["--events", str(pred_file), "--out", str(out)]) == 2
        _one_line(capsys.readouterr().err, str(out), "in use by another run", f"process {holder.pid}")
        assert sorted(p.name for p in out.iterdir()) == [OutputLock.name]  # nothing written
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(timeout=60)
    assert main(["--events", str(pred_file), "--out", str(out)]) == 0  # free again
    assert not (out / OutputLock.name).exists()


def test_refined_folder_never_replaces_a_file_it_did_not_write(tmp_path: Path) -> None:
    """``refine_folder`` pointed at a folder holding another run's probability file refuses, leaving it intact;
    its own files (recorded in the folder's manifest before they are written) are still replaced and resumed."""
    from monai_vce.events import Video, probability_file, save_video_probs
    from monai_vce.temporal import TemporalRefiner
    from monai_vce.temporal.files import MANIFEST, refine_folder

    probs, out = tmp_path / "probs", tmp_path / "refined"
    refiner = TemporalRefiner(network={"stages": 1, "layers": 1, "channels": 4})
    ids = np.arange(10, dtype=np.int64)
    rows = np.random.default_rng(0).random((10, 17)).astype(np.float32)
    save_video_probs(probability_file(probs, "1"), Video("1", rows, ids, ids), source="m")
    save_video_probs(probability_file(out, "1"), Video("1", rows, ids, ids), source="other run")
    before = probability_file(out, "1").read_bytes()
    with pytest.raises(ValueError, match="which the refinement did not write") as e:
        refine_folder(refiner, probs, out, source="r")
    assert "\n" not in str(e.value)
    assert probability_file(out, "1").read_bytes() == before
    probability_file(out, "1").unlink()
    assert refine_folder(refiner, probs, out, source="r")["written"] == ["1"]
    assert refine_folder(refiner, probs, out, source="r")["kept"] == ["1"]
    assert refine_folder(refiner, probs, out, source="r2")["written"] == ["1"]  # its own file is replaced
    (out / MANIFEST).write_text('{"writer": "monai_vce.temporal.refine_folder", "files": ["../x.npz"]}')
    with pytest.raises(ValueError, match="outside its folder"):
        refine_folder(refiner, probs, out, source="r")
