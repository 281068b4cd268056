"""Exams stored as video files: listing, streamed decoding, the frame cache, errors."""

from __future__ import annotations

import os
import re
import warnings

import numpy as np
import pytest
import torch

pytest.importorskip("av", reason="video support needs PyAV: pip install 'monai-vce[video]'")

from monai_vce.data import FrameCacheDataset, VideoFrameDataset, build_galar_datalist, build_inference_datalist
from monai_vce.data import video as video_mod
from monai_vce.data.video import (
    iter_video_frames,
    probe_video,
    verify_video,
    write_video,
)

SIZE = 16


@pytest.fixture(scope="module")
def mp4_galar(tmp_path_factory):
    from monai_vce.data import generate_mini_galar

    out = tmp_path_factory.mktemp("mp4_galar") / "data"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return generate_mini_galar(out, videos=2, frames_per_video=40, size=32, seed=3, video_format="mp4")


def _frames(n=12, size=32, seed=0):
    rng = np.random.default_rng(seed)
    # smooth frames, so that lossy codecs keep them recognisable
    base = rng.integers(40, 216, (n, 1, 1, 3))
    ramp = np.linspace(0, 30, size)[None, :, None, None].astype(np.int64)
    return np.clip(base + ramp, 0, 255).astype(np.uint8).repeat(size, axis=2)


def test_generated_videos_are_listed_with_decoded_positions(mp4_galar):
    files = sorted(p.name for p in (mp4_galar / "frames").iterdir())
    assert files == ["1.mp4", "ukdd_navi_00002.mp4"]
    data = build_inference_datalist(mp4_galar / "frames")
    assert [d["video_id"] for d in data] == ["1"] * 40 + ["ukdd_navi_00002"] * 40
    assert [d["frame_number"] for d in data[:40]] == list(range(40))
    assert [d["frame_index"] for d in data[40:]] == list(range(40))
    assert data[0]["image"].endswith("1.mp4")
    # a single video file works as the input too
    single = build_inference_datalist(mp4_galar / "frames" / "1.mp4")
    assert len(single) == 40 and {d["video_id"] for d in single} == {"1"}
    # labels match frames by decoded position
    labelled = build_galar_datalist(mp4_galar / "frames", mp4_galar / "labels")
    assert len(labelled) == 80 and all(d["frame_number"] == d["frame_index"] for d in labelled)
    info = probe_video(mp4_galar / "frames" / "1.mp4")
    assert info.num_frames == 40 and info.fps == 5.0 and (info.width, info.height) == (32, 32)


def test_streamed_decoding_matches_the_encoded_frames(tmp_path):
    frames = _frames()
    path = write_video(tmp_path / "v.mkv", frames, codec="ffv1")  # lossless: exact round trip
    chunks = list(iter_video_frames(path, None, chunk=5))
    assert [c[0] for c in chunks] == [0, 5, 10] and [len(c[1]) for c in chunks] == [5, 5, 2]
    decoded = np.concatenate([c[1] for c in chunks]).transpose(0, 2, 3, 1)
    np.testing.assert_array_equal(decoded, frames)


@pytest.mark.parametrize("ext", ["avi", "webm"])
def test_other_containers_decode_in_order(tmp_path, ext):
    frames = _frames(8)
    path = write_video(tmp_path / f"v.{ext}", frames)
    assert probe_video(path).num_frames == 8
    decoded = np.concatenate([f for _, f in iter_video_frames(path)]).transpose(0, 2, 3, 1).astype(np.int64)
    # lossy codecs: each frame is still closest to its own source frame (order kept)
    err = np.abs(decoded[:, None] - frames[None].astype(np.int64)).mean(axis=(2, 3, 4))
    assert (err.argmin(axis=1) == np.arange(8)).all()


def test_video_frame_dataset_serves_cached_frames_and_reuses_the_cache(mp4_galar, tmp_path, monkeypatch):
    data = build_inference_datalist(mp4_galar / "frames")
    ds = VideoFrameDataset(data, cache_dir=tmp_path / "cache", image_size=SIZE, progress=False, num_workers=2)
    first = {v: np.concatenate([f for _, f in iter_video_frames(p, SIZE)]) for v, p in ds.videos.items()}
    for i in (0, 17, 39, 40, 79):
        item = ds[i]
        assert item["image"].dtype == torch.uint8 and tuple(item["image"].shape) == (3, SIZE, SIZE)
        np.testing.assert_array_equal(item["image"].numpy(), first[item["video_id"]][item["frame_number"]])
        # one name per frame for MONAI's savers
        assert item["filename_or_obj"] == f"{ds.videos[item['video_id']]}#{item['frame_number']}"
    # a second dataset decodes nothing: the cache is complete
    monkeypatch.setattr(video_mod, "iter_video_frames", lambda *a, **k: pytest.fail("decoded again"))
    len(VideoFrameDataset(data, cache_dir=tmp_path / "cache", image_size=SIZE, progress=False))
    # the training cache serves the same frames (its rows are the decoded positions)
    labelled = build_galar_datalist(mp4_galar / "frames", mp4_galar / "labels")
    fds = FrameCacheDataset(labelled, tmp_path / "cache", image_size=SIZE, progress=False)
    assert torch.equal(fds[45]["image"], ds[45]["image"])
    # frame images and video frames mix in one dataset: image items pass through for the transform to decode
    mixed = VideoFrameDataset(
        [*data[:2], {"image": "x.png", "video_id": "p", "frame_index": 0}],
        cache_dir=tmp_path / "cache",
        image_size=SIZE,
        progress=False,
    )
    assert mixed[2]["image"] == "x.png" and isinstance(mixed[1]["image"], torch.Tensor)


def test_a_changed_video_is_decoded_again(mp4_galar, tmp_path):
    vid = tmp_path / "frames" / "a.mp4"
    vid.parent.mkdir()
    vid.write_bytes((mp4_galar / "frames" / "1.mp4").read_bytes())
    data = build_inference_datalist(vid)
    len(VideoFrameDataset(data, cache_dir=tmp_path / "cache", image_size=SIZE, progress=False))
    stamp = (tmp_path / "cache" / f"{SIZE}px" / "a.json").stat().st_mtime_ns
    os.utime(vid, ns=(1, 1))  # same bytes, new modification time: the entry is stale
    len(VideoFrameDataset(data, cache_dir=tmp_path / "cache", image_size=SIZE, progress=False))
    assert (tmp_path / "cache" / f"{SIZE}px" / "a.json").stat().st_mtime_ns != stamp


def test_an_interrupted_decode_leaves_no_partial_entry(mp4_galar, tmp_path, monkeypatch):
    data = build_inference_datalist(mp4_galar / "frames")
    real = video_mod.iter_video_frames

    def killed(path, *a, **k):
        for n, chunk in enumerate(real(path, *a, **k)):
            if n == 0 and str(path).endswith("ukdd_navi_00002.mp4"):
                raise KeyboardInterrupt("simulated kill")
            yield chunk

    monkeypatch.setattr(video_mod, "iter_video_frames", killed)
    with pytest.raises(KeyboardInterrupt):
        len(VideoFrameDataset(data, cache_dir=tmp_path / "cache", image_size=SIZE, progress=False))
    root = tmp_path / "cache" / f"{SIZE}px"
    assert not list(root.glob(".*.partial")) and not (root / "ukdd_navi_00002.json").exists()
    monkeypatch.setattr(video_mod, "iter_video_frames", real)
    ds = VideoFrameDataset(data, cache_dir=tmp_path / "cache", image_size=SIZE, progress=False)
    assert len(ds) == len(data)
    assert (root / "ukdd_navi_00002.json").is_file() and ds[79]["image"].shape[-1] == SIZE


def test_truncated_and_corrupt_videos_name_the_file_and_last_good_frame(tmp_path):
    frames = np.random.default_rng(1).integers(0, 256, (60, 32, 32, 3), dtype=np.uint8)
    good = write_video(tmp_path / "good.mkv", frames, codec="ffv1")
    data = good.read_bytes()
    cut = tmp_path / "cut.mkv"
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError) as e:
        verify_video(cut)
    msg = str(e.value)
    assert "\n" not in msg and str(cut) in msg
    last = int(re.search(r"last good frame:? (\d+)", msg).group(1))
    assert 0 <= last < 59
    # a frame count in the container (MP4) with data missing: decoding stops at the last good frame
    mp4 = write_video(tmp_path / "good.mp4", frames)
    raw = bytearray(mp4.read_bytes())
    raw[len(raw) // 2 : len(raw) // 2 + 4000] = bytes(4000)
    broken = tmp_path / "broken.mp4"
    broken.write_bytes(bytes(raw))
    with pytest.raises(ValueError) as e:
        verify_video(broken)
    msg = str(e.value)
    assert "\n" not in msg and str(broken) in msg and re.search(r"after frame \d+ \(last good frame", msg), msg
    bad = tmp_path / "bad.mp4"
    bad.write_bytes(b"\x00" * 2048)
    with pytest.raises(ValueError, match=r"cannot open video file .*bad\.mp4"):
        probe_video(bad)
    # the dataset stops with the same one-line message and keeps no partial entry
    items = [{"image": str(cut), "video_id": "cut", "frame_index": i, "frame_number": i} for i in range(60)]
    with pytest.raises(ValueError, match=r"corrupt or truncated video file .*cut\.mkv"):
        len(VideoFrameDataset(items, cache_dir=tmp_path / "cache", image_size=8, progress=False))
    assert not list((tmp_path / "cache").rglob("*.partial"))


def test_frame_loader_and_missing_pyav_say_what_to_do(tmp_path, monkeypatch):
    import sys

    from monai_vce.data import load_vce_frame

    with pytest.raises(ValueError, match=r"is a video file: .*VideoFrameDataset"):
        load_vce_frame(tmp_path / "exam.mp4")
    monkeypatch.setitem(sys.modules, "av", None)
    with pytest.raises(ImportError, match=r"monai-vce\[video\]"):
        video_mod.require_av()
