"""Video files as players read them (issue 25, item 5): counted by decoding, VFR / edit lists, rotation, links.

The files are made by Debian's ``ffmpeg`` inside the tests (a few dozen frames of 64 x 48 px) and the decoded
counts compared with ``ffprobe -count_frames``; without ffmpeg the tests are skipped with the install line.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import warnings

import numpy as np
import pytest

pytest.importorskip("av")

from monai_vce.data.galar import discover_videos
from monai_vce.data.video import iter_video_frames, list_video_frames, probe_video, verify_video

_FFMPEG = shutil.which("ffmpeg")
_FFPROBE = shutil.which("ffprobe")
needs_ffmpeg = pytest.mark.skipif(
    not (_FFMPEG and _FFPROBE), reason="needs Debian's ffmpeg and ffprobe: apt-get install ffmpeg"
)
_SRC = ["-f", "lavfi", "-i", "testsrc=size=64x48:rate=10"]
# frames 0..14 at 10 frames/s, then every other slot: a variable frame rate
_VFR = ["-vf", "setpts='if(lt(N,15),N,2*N-15)/10/TB'", "-fps_mode", "vfr"]


def _ffmpeg(*args: str | os.PathLike) -> None:
    cmd = [_FFMPEG, "-hide_banner", "-loglevel", "error", "-y", *map(str, args)]
    subprocess.run(cmd, check=True, capture_output=True, timeout=60)


_NB_READ = ("-show_entries", "stream=nb_read_frames", "-of", "csv=p=0")


def _count_frames(path: os.PathLike) -> int:
    """``ffprobe -count_frames``: the frames a player decodes."""
    out = subprocess.run(
        [_FFPROBE, "-v", "error", "-count_frames", "-select_streams", "v:0", *_NB_READ, str(path)],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    return int(out.strip())


def _first_frame(path: os.PathLike) -> np.ndarray:
    _, frames = next(iter_video_frames(path, chunk=1))
    return frames[0].transpose(1, 2, 0)


@pytest.fixture(scope="module")
def videos(tmp_path_factory):
    """The test files, made once per module by ffmpeg."""
    if not (_FFMPEG and _FFPROBE):
        pytest.skip("needs Debian's ffmpeg and ffprobe: apt-get install ffmpeg")
    d = tmp_path_factory.mktemp("videos")
    _ffmpeg(*_SRC, "-frames:v", "30", *_VFR, "-c:v", "mjpeg", d / "vfr.mkv")
    _ffmpeg(*_SRC, "-frames:v", "30", *_VFR, "-c:v", "libx264", d / "vfr.mp4")
    _ffmpeg(*_SRC, "-frames:v", "30", "-c:v", "libx264", "-g", "30", d / "full.mp4")
    _ffmpeg("-ss", "1.05", "-i", d / "full.mp4", "-c", "copy", d / "edit.mp4")  # an edit list cuts 11 frames
    _ffmpeg(*_SRC, "-frames:v", "30", "-c:v", "libx264", "-bf", "3", d / "bframes.mp4")
    for r in (90, 180, 270):
        _ffmpeg("-i", d / "full.mp4", "-c", "copy", "-metadata:s:v:0", f"rotate={r}", d / f"rot{r}.mp4")
    _ffmpeg(*_SRC, "-frames:v", "12", "-c:v", "ffv1", "-pix_fmt", "yuv420p10le", d / "ten_bit.mkv")
    _ffmpeg("-f", "lavfi", "-i", "testsrc=size=63x47:rate=10", "-frames:v", "12", "-c:v", "ffv1", d / "odd.mkv")
    _ffmpeg("-f", "lavfi", "-i", "sine=duration=1", d / "audio_only.mp4")
    _ffmpeg(*_SRC, "-frames:v", "0", "-c:v", "mjpeg", d / "zero.mkv")
    _ffmpeg(*_SRC, "-frames:v", "50", "-c:v", "mjpeg", d / "complete.mkv")
    # one packet of 50 dropped: the Matroska file has no frame count, only its duration and timestamps tell
    _ffmpeg(*_SRC, "-frames:v", "50", "-c:v", "mjpeg", "-bsf:v", "noise=drop='eq(n\\,20)'", d / "dropped.mkv")
    # the first key frame dropped: its 9 P-frames are in the file but decode to nothing
    _ffmpeg(
        *_SRC, "-frames:v", "30", "-c:v", "libx264", "-g", "10", "-bsf:v", "noise=drop='eq(n\\,0)'", d / "nokey.mkv"
    )
    return d


@needs_ffmpeg
@pytest.mark.parametrize("name", ["vfr.mkv", "vfr.mp4", "edit.mp4", "bframes.mp4", "ten_bit.mkv", "odd.mkv"])
def test_frames_counted_by_decoding_as_ffprobe_does(videos, name):
    path = videos / name
    expected = _count_frames(path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        numbers, paths, _ = list_video_frames(path)
        assert len(numbers) == expected and paths == [str(path)] * expected
        assert verify_video(path) == expected
        chunks = list(iter_video_frames(path, chunk=8, expected=expected))
    assert sum(len(f) for _, f in chunks) == expected
    h, w = (47, 63) if name == "odd.mkv" else (48, 64)
    assert chunks[0][1].shape[1:] == (3, h, w) and chunks[0][1].dtype == np.uint8


@needs_ffmpeg
@pytest.mark.parametrize(("name", "says"), [("vfr.mkv", "duration"), ("edit.mp4", "container lists 30")])
def test_vfr_and_edit_list_decode_completely_with_a_warning_naming_both_numbers(videos, name, says):
    path = videos / name
    decoded = _count_frames(path)
    with pytest.warns(UserWarning, match=rf"decodes to {decoded} frames, but .*{says}") as rec:
        assert len(list_video_frames(path)[0]) == decoded
    msg = str(rec[0].message)
    assert "\n" not in msg and name in msg


@needs_ffmpeg
def test_complete_cfr_file_gives_no_warning(videos):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len(list_video_frames(videos / "complete.mkv")[0]) == 50
        assert len(list_video_frames(videos / "bframes.mp4")[0]) == 30


@needs_ffmpeg
def test_mkv_missing_a_frame_is_reported_with_both_counts(videos):
    path = videos / "dropped.mkv"
    assert _count_frames(path) == 49
    with pytest.warns(UserWarning, match=r"dropped\.mkv decodes to 49 frames, but .*says about 50.*jump") as rec:
        list_video_frames(path)
    assert "first after decoded frame 19" in str(rec[0].message)


@needs_ffmpeg
def test_file_decoding_to_fewer_frames_than_its_index_lists_is_refused_with_both_counts(videos, tmp_path):
    from monai_vce.data.frame_cache import FrameCache
    from monai_vce.data.video import ensure_video_entries

    path = videos / "nokey.mkv"
    assert _count_frames(path) == 20
    with pytest.raises(
        ValueError, match=r"damaged video file .*nokey\.mkv: it decodes to 20 frames but its index lists 29"
    ):
        list_video_frames(path)
    items = [{"image": str(path), "video_id": "nokey", "frame_index": i, "frame_number": i} for i in range(29)]
    with pytest.raises(ValueError, match=r"decodes to 20 frames but its index lists 29"):
        ensure_video_entries(FrameCache(tmp_path / "cache", image_size=8), items, progress=False)
    assert not [p for p in (tmp_path / "cache").rglob("*") if p.is_file()]  # nothing allocated for a refused file


@needs_ffmpeg
@pytest.mark.parametrize("angle", [90, 180, 270])
def test_rotation_metadata_is_applied_as_players_show_it(videos, angle):
    path = videos / f"rot{angle}.mp4"
    ref = subprocess.run(
        [_FFMPEG, "-v", "error", "-i", str(path), "-frames:v", "1", "-f", "rawvideo", "-pix_fmt", "rgb24", "-"],
        check=True,
        capture_output=True,
    ).stdout  # ffmpeg turns the frame by the display matrix, as players do
    got = _first_frame(path)
    assert got.shape == ((48, 64, 3) if angle == 180 else (64, 48, 3))
    np.testing.assert_array_equal(np.frombuffer(ref, np.uint8).reshape(got.shape), got)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from monai_vce.data.video import count_video_frames

        assert count_video_frames(path).rotation in (90, 180, 270)


@needs_ffmpeg
def test_audio_only_and_zero_length_stream_are_refused_in_one_line(videos):
    with pytest.raises(ValueError, match=r"audio_only\.mp4 has no video stream"):
        list_video_frames(videos / "audio_only.mp4")
    with pytest.raises(ValueError, match=r"zero\.mkv") as e:
        list_video_frames(videos / "zero.mkv")
    assert "\n" not in str(e.value)


@needs_ffmpeg
def test_cache_entries_hold_the_decoded_frames_and_record_the_frame_rate(videos, tmp_path):
    from monai_vce.data.frame_cache import FrameCache
    from monai_vce.data.video import ensure_video_entries

    cache = FrameCache(tmp_path / "cache", image_size=16)
    items = []
    for vid in ("edit", "vfr"):
        path = videos / f"{vid}.mp4"
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            n = len(list_video_frames(path)[0])
        items += [{"image": str(path), "video_id": vid, "frame_index": i, "frame_number": i} for i in range(n)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ensure_video_entries(cache, items, progress=False)
    edit = json.loads(cache.manifest_path("edit").read_text())
    vfr = json.loads(cache.manifest_path("vfr").read_text())
    assert edit["num_frames"] == _count_frames(videos / "edit.mp4") == 19
    assert edit["fps"] == pytest.approx(10.0) and edit["rotation"] == 0
    assert vfr["fps"] == pytest.approx(probe_video(videos / "vfr.mp4").fps)
    assert cache.open("edit").shape == (19, 3, 16, 16)


def test_dangling_and_looped_links_are_reported(tmp_path):
    root = tmp_path / "frames"
    root.mkdir()
    (root / "gone.mp4").symlink_to(tmp_path / "nowhere.mp4")
    (root / "a.mkv").symlink_to(root / "b.mkv")
    (root / "b.mkv").symlink_to(root / "a.mkv")
    (root / "exam_1").mkdir()
    (root / "exam_1" / "frame_000001.png").write_bytes(b"")
    with pytest.warns(UserWarning) as rec:
        assert list(discover_videos(root)) == ["exam_1"]
    text = " | ".join(str(w.message) for w in rec)
    assert "gone.mp4 is a dangling symbolic link" in text and "nowhere.mp4" in text
    assert "a.mkv is a symbolic link loop" in text and "b.mkv is a symbolic link loop" in text
    # named explicitly: an error saying what is wrong with the link, not "not found"
    with pytest.raises(FileNotFoundError, match=r"gone\.mp4 is a dangling symbolic link"):
        discover_videos(root / "gone.mp4")
    with pytest.raises(FileNotFoundError, match=r"a\.mkv is a symbolic link loop"):
        list_video_frames(root / "a.mkv")


def test_newline_in_a_video_file_name_cannot_forge_a_log_line(tmp_path):
    bad = tmp_path / "exam\nERROR forged line.mp4"
    bad.write_bytes(b"\x00" * 2048)
    with pytest.raises(ValueError, match=r"cannot open video file") as e:
        probe_video(bad)
    msg = str(e.value)
    assert "\n" not in msg and "exam\\nERROR forged line.mp4" in msg
    gone = tmp_path / "gone\r\x1b[31m.mp4"
    with pytest.raises(FileNotFoundError) as e:
        list_video_frames(gone)
    assert "\r" not in str(e.value) and "\x1b" not in str(e.value) and "\\x1b[31m" in str(e.value)


def test_safe_text_escapes_control_characters_only():
    from monai_vce.utils import safe_text

    assert safe_text("exam é 1.mp4") == "exam é 1.mp4"
    assert safe_text("a\nb\tc\x00\x1b\u2028") == "a\\nb\\tc\\x00\\x1b\\u2028"
    assert safe_text(os.fsdecode(b"x\xff.mp4")) == "x\\udcff.mp4"
