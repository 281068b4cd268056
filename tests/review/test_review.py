"""The review site's files: command line, frame units, thumbnails, escaping, video exams, reuse."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest

from monai_vce.__main__ import main
from monai_vce.labels import LABELS
from monai_vce.review import exam_file_name, js_data, write_review_site, write_run_review


def _read_js(path: Path) -> dict:
    text = path.read_text()
    assert text.startswith("window[")
    return json.loads(text.split("=", 1)[1].strip().rstrip(";"))


@pytest.fixture(scope="module")
def probs_dir(tmp_path_factory, mini_galar):
    """Probability files of the session's mini-Galar (labels with noise), in the datalist's rows."""
    from monai_vce.data import build_galar_datalist
    from monai_vce.events import Video, save_video_probs

    out = tmp_path_factory.mktemp("review_probs")
    data = build_galar_datalist(mini_galar / "frames", mini_galar / "labels")
    rng = np.random.default_rng(1)
    for vid in dict.fromkeys(d["video_id"] for d in data):
        items = [d for d in data if d["video_id"] == vid]
        lab = np.asarray([d["label"] for d in items], np.float32)
        p = np.clip(0.7 * lab + 0.3 * rng.random(lab.shape), 0, 1).astype(np.float32)
        idx = np.asarray([d["frame_index"] for d in items])
        num = np.asarray([d["frame_number"] for d in items])
        save_video_probs(out / f"{vid}.npz", Video(vid, p, idx, num))
    return out


def test_command_line_site_maps_index_units_onto_the_frame_files(tmp_path, mini_galar, probs_dir, capsys):
    gt = mini_galar / "ground_truth.json"
    code = main(
        ["review", "--events", str(gt), "--frames-dir", str(mini_galar / "frames"), "--probs-dir", str(probs_dir),
         "--gt", str(gt), "--out", str(tmp_path / "site"), "--frame-rate", "4", "--strip-frames", "20"]
    )  # fmt: skip
    out = capsys.readouterr()
    assert code == 0, out.err
    index = Path(json.loads(out.out.strip().splitlines()[-1])["index"])
    assert index == (tmp_path / "site" / "index.html").resolve()
    listing = _read_js(tmp_path / "site" / "index.js")
    events = json.loads(gt.read_text())["videos"]
    assert [e["video_id"] for e in listing["exams"]] == [v["video_id"] for v in events]
    # video 2: frame = 5 * index + offset; events count in index units
    exam_dir = tmp_path / "site" / "exams"
    data = _read_js(exam_dir / exam_file_name("2") / "data.js")
    with np.load(probs_dir / "2.npz") as z:
        index_ids, numbers, probs = z["frame_index"], z["frame_number"], z["probs"]
    assert data["units"] == "frame_index" and data["frame_rate"] == 4.0 and data["num_frames"] == len(index_ids)
    assert data["frame_number"]["step"] == 5 and data["frame_number"]["start"] == int(numbers[0])
    for e, ref in zip(data["events"], events[1]["events"], strict=True):
        assert (e["start"], e["end"], e["label"]) == (
            ref["start"],
            ref["end"],
            [n for n in LABELS if n in ref["label"]],
        )
        assert index_ids[e["s"]] == e["start"] and index_ids[e["e"]] == e["end"]
        cols = [LABELS.index(n) for n in e["label"]]
        assert e["peak"] == e["s"] + int(np.argmax(probs[e["s"] : e["e"] + 1, cols].max(axis=1)))
        for row in e["thumbs"]:
            assert (exam_dir / data["thumbs"]["dir"] / f"{row}.jpg").is_file()
    # the frame viewer's links lead to the real frame files
    frames = data["frames"]
    first = exam_dir / frames["base"] / f"{frames['prefix']}{int(numbers[0]):0{frames['width']}d}{frames['suffix']}"
    assert first.resolve() == (mini_galar / "frames" / "2" / f"frame_{int(numbers[0]):06d}.PNG").resolve()
    # probabilities: 8-bit, label-major
    import base64

    q = np.frombuffer(base64.b64decode(data["probs"]), np.uint8).reshape(len(LABELS), -1)
    np.testing.assert_allclose(q.T / 255.0, probs, atol=0.5 / 255 + 1e-6)
    thumbs = list((exam_dir / data["thumbs"]["dir"]).glob("*.jpg"))
    assert len(thumbs) <= 20 + 7 * len(data["events"])
    from PIL import Image

    with Image.open(thumbs[0]) as im:
        assert im.format == "JPEG" and max(im.size) <= 128


def test_command_line_errors_are_one_line_and_exit_2(tmp_path, mini_galar, capsys):
    gt = mini_galar / "ground_truth.json"
    base = ["review", "--events", str(gt), "--frames-dir", str(mini_galar / "frames")]
    assert main([*base, "--probs-dir", str(tmp_path), "--out", str(tmp_path / "s")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "probability file" in err[0] and "not found" in err[0]
    assert main([*base, "--videos", "nope", "--out", str(tmp_path / "s")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "'nope'" in err[0]


def test_data_files_cannot_inject_markup():
    text = js_data("VCE_EXAM", {"video_id": "</script><script>alert(1)</script>&", "n": [1, 2]})
    assert "<" not in text and ">" not in text and "&" not in text.split("=", 1)[1]
    assert json.loads(text.split("=", 1)[1].strip().rstrip(";"))["video_id"].startswith("</script>")
    names = {exam_file_name(v) for v in ("a b", "a_b", "a/b", "../a", "<b>")}
    safe = set("abcdefghijklmnopqrstuvwxyzABCDEF0123456789_-.%")
    assert len(names) == 5 and all(set(n) <= safe and not n.startswith(".") for n in names)


def test_unchanged_thumbnails_are_reused_and_changed_frames_redrawn(tmp_path, mini_galar):
    import shutil

    frames = tmp_path / "frames"
    shutil.copytree(mini_galar / "frames" / "1", frames / "1")
    pred = {"videos": [json.loads((mini_galar / "ground_truth.json").read_text())["videos"][0]]}
    write_review_site(pred, frames, tmp_path / "site", frame_units="frame_number", progress=False)
    thumb = next((tmp_path / "site" / "exams").rglob("thumbs/0.jpg"))
    stamp = thumb.stat().st_mtime_ns
    write_review_site(pred, frames, tmp_path / "site", frame_units="frame_number", progress=False)
    assert thumb.stat().st_mtime_ns == stamp
    (frames / "1" / "frame_000030.PNG").unlink()  # the frame list changed
    write_review_site(pred, frames, tmp_path / "site", frame_units="frame_number", progress=False)
    assert not (thumb.is_file() and thumb.stat().st_mtime_ns == stamp)


def test_video_exam_stores_full_frames_around_its_events(tmp_path):
    pytest.importorskip("av")
    from monai_vce.data import generate_mini_galar

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        data = generate_mini_galar(tmp_path / "d", videos=1, frames_per_video=80, size=32, seed=2, video_format="mp4")
    gt = data / "ground_truth.json"
    write_review_site(gt, data / "frames", tmp_path / "site", max_full_frames=30, strip_frames=10, progress=False)
    exam = _read_js(next((tmp_path / "site" / "exams").glob("*/data.js")))
    assert exam["frames"]["kind"] == "stored" and exam["frame_rate"] == 5.0 and exam["source"] == "1.mp4"
    stored = sorted(int(p.stem) for p in (tmp_path / "site" / "exams" / exam["frames"]["dir"]).glob("*.jpg"))
    assert 10 <= len(stored) <= 30 + 10
    first = exam["events"][0]
    assert first["s"] in stored and first["e"] in stored  # the ends of the most confident event
    from PIL import Image

    with Image.open(tmp_path / "site" / "exams" / exam["frames"]["dir"] / f"{stored[0]}.jpg") as im:
        assert im.size == (32, 32)  # full size


def test_run_review_writes_nothing_when_off(tmp_path, mini_galar):
    assert write_run_review(None, mini_galar / "ground_truth.json", []) is None
    assert not any(tmp_path.iterdir())


def test_events_beyond_the_frames_are_refused(tmp_path, mini_galar):
    pred = {"videos": [{"video_id": "1", "events": [{"start": 10, "end": 999, "label": ["ulcer"]}]}]}
    with pytest.raises(
        ValueError, match=r"video '1': the predicted events span frame_index 10 to 999 .* --frame-units"
    ):
        write_review_site(pred, mini_galar / "frames", tmp_path / "site", progress=False)


def test_an_exam_takes_the_frame_rate_inference_recorded(tmp_path, mini_galar, probs_dir):
    from monai_vce.events import load_video_probs, probability_file, save_video_probs
    from monai_vce.review import frames_by_video, load_exam

    # video 2 is annotated every 5th frame: at 10 frames/s its rows are 2 per second
    rated = tmp_path / "probs"
    for vid in ("1", "2", "3", "ukdd_navi_00004"):
        record = load_video_probs(probability_file(probs_dir, vid))
        save_video_probs(probability_file(rated, vid), record.replace(frame_rate=10.0))
    frames = frames_by_video(mini_galar / "frames")["2"]
    video, where = load_exam("2", frames, probs_file=probability_file(rated, "2"))
    assert where.frame_rate == 10.0 and video.rows_per_second == pytest.approx(2.0)
    assert load_exam("2", frames, probs_file=probability_file(rated, "2"), frame_rate=4)[1].frame_rate == 4.0
    pred = {"videos": [{"video_id": v, "events": []} for v in ("1", "2", "3", "ukdd_navi_00004")]}
    write_review_site(pred, mini_galar / "frames", tmp_path / "site", probs_dir=rated, progress=False)
    exam = next(e for e in _read_js(tmp_path / "site" / "index.js")["exams"] if e["video_id"] == "2")
    span = int(video.frame_number[-1] - video.frame_number[0] + 1)
    assert exam["frame_rate"] == 10.0 and exam["duration_seconds"] == pytest.approx(span / 10.0)
    data = _read_js(tmp_path / "site" / "exams" / exam_file_name("2") / "data.js")
    assert data["duration_seconds"] == exam["duration_seconds"]


def test_an_exam_is_one_video_record_and_its_frames(mini_galar, probs_dir):
    from monai_vce.events import Video, load_video_probs
    from monai_vce.review import ExamFrames, frames_by_video, has_probs, load_exam

    frames = frames_by_video(mini_galar / "frames")["2"]
    gt = json.loads((mini_galar / "ground_truth.json").read_text())["videos"][1]["events"]
    video, where = load_exam("2", frames, gt_events=gt, probs_file=probs_dir / "2.npz", frame_rate=4)
    ref = load_video_probs(probs_dir / "2.npz")
    assert isinstance(video, Video) and isinstance(where, ExamFrames) and has_probs(video)
    np.testing.assert_array_equal(video.probs, ref.probs)
    np.testing.assert_array_equal(video.frame_index, ref.frame_index)
    assert video.events == gt and where.frame_rate == 4.0 and where.video is None
    assert where.images is not None and len(where.images) == len(video)
    assert where.images[0].endswith(f"{int(ref.frame_number[0]):06d}.PNG")
    # without a probability file: the frames on disk are the rows, and the record has no probability columns
    bare, _ = load_exam("2", frames)
    assert not has_probs(bare) and bare.probs.shape == (len(frames["images"]), 0) and bare.events is None


def test_units_are_resolved_once_from_the_sidecars(tmp_path, probs_dir):
    from monai_vce.events import save_events
    from monai_vce.events.metadata import convert_events, events_in_common_units, frame_id_maps

    with np.load(probs_dir / "2.npz") as z:
        index, number = z["frame_index"], z["frame_number"]
    ev = {"videos": [{"video_id": "2", "events": [{"start": int(index[3]), "end": int(index[9]), "label": ["colon"]}]}]}
    as_number = convert_events(ev, "frame_index", "frame_number", frame_id_maps(probs_dir, ev))
    assert as_number["videos"][0]["events"][0]["start"] == int(number[3]) != int(index[3])
    gt = save_events(tmp_path / "gt.json", ev, frame_units="frame_index")
    pred = save_events(tmp_path / "pred.json", as_number, frame_units="frame_number")
    plain = save_events(tmp_path / "plain.json", ev)
    # no sidecar: the override, else frame_index; the ground truth's units come first, the prediction's next
    assert events_in_common_units(plain, ev, None, "frame_number")[1].value == "frame_number"
    assert events_in_common_units(plain, ev)[1].value == "frame_index"
    assert events_in_common_units(pred, as_number)[1].value == "frame_number"
    got, units = events_in_common_units(pred, as_number, gt, probs_dir=probs_dir)
    assert units.value == "frame_index" and got == ev  # converted into the ground truth's units
    with pytest.raises(ValueError, match=r"frame units differ: .*frame_number units.*--probs-dir"):
        events_in_common_units(pred, as_number, gt)
    with pytest.raises(ValueError, match="not in frame_index units"):
        events_in_common_units(pred, as_number, None, "frame_index")
