"""FrameCache / FrameCacheDataset: build, reuse, interruption safety and invalidation."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch
from PIL import Image

from monai_vce.data import FrameCache, FrameCacheDataset, load_vce_frame

SIZE = 16


def _make_videos(root, videos=(("v1", 5), ("v2", 3)), px=24):
    data = []
    rng = np.random.default_rng(0)
    for vid, n in videos:
        d = root / "frames" / vid
        d.mkdir(parents=True, exist_ok=True)
        for i in range(n):
            p = d / f"frame_{i:06d}.PNG"
            Image.fromarray(rng.integers(0, 256, (px, px, 3), dtype=np.uint8)).save(p)
            data.append({"image": str(p), "video_id": vid, "frame_index": i, "label": [float(i % 2)] * 17})
    return data


class _FailingLoader:
    """Decodes frames until ``n`` have been loaded, then raises like a killed run."""

    def __init__(self, inner, n):
        self.inner, self.n = inner, n

    def __call__(self, path):
        if self.n <= 0:
            raise KeyboardInterrupt("simulated interruption")
        self.n -= 1
        return self.inner(path)


@pytest.mark.parametrize("workers", [0, 2])
def test_build_contents_match_decoder_and_dataset_items(tmp_path, workers):
    data = _make_videos(tmp_path)
    # batches of 3 straddle the two videos
    ds = FrameCacheDataset(data, tmp_path / "cache", image_size=SIZE, batch_size=3, num_workers=workers, progress=False)
    cache = FrameCache(tmp_path / "cache", image_size=SIZE)
    for vid, n in (("v1", 5), ("v2", 3)):
        arr = cache.open(vid)
        assert arr.shape == (n, 3, SIZE, SIZE) and arr.dtype == np.uint8
        manifest = json.loads(cache.manifest_path(vid).read_text())
        assert manifest["num_frames"] == n and manifest["image_size"] == SIZE and manifest["video_id"] == vid
    assert len(ds) == len(data)
    for i, item in enumerate(data):
        out = ds[i]
        assert out["video_id"] == item["video_id"] and out["label"] == item["label"]
        assert out["image"].dtype == torch.uint8
        assert torch.equal(out["image"], load_vce_frame(item["image"], SIZE)), i


def test_dataset_transform_and_worker_processes(tmp_path):
    data = _make_videos(tmp_path)
    ds = FrameCacheDataset(
        data,
        tmp_path / "cache",
        image_size=SIZE,
        progress=False,
        transform=lambda d: {**d, "image": d["image"].flip(-1)},
    )
    ds[0]  # opens a memory map in this process; it must not travel to the workers
    loader = torch.utils.data.DataLoader(ds, batch_size=4, num_workers=2)
    images = torch.cat([b["image"] for b in loader])
    expected = torch.stack([load_vce_frame(d["image"], SIZE).flip(-1) for d in data])
    assert torch.equal(images, expected)


def test_reuse_does_not_decode_again(tmp_path):
    data = _make_videos(tmp_path)
    FrameCache(tmp_path / "cache", SIZE).build(data, progress=False)
    cache = FrameCache(tmp_path / "cache", SIZE)
    mtimes = {p: p.stat().st_mtime_ns for p in cache.root.iterdir()}
    cache.loader = _FailingLoader(cache.loader, 0)  # any decode would raise
    cache.build(data, progress=False)
    assert {p: p.stat().st_mtime_ns for p in cache.root.iterdir()} == mtimes
    FrameCacheDataset(data, tmp_path / "cache", image_size=SIZE, build=False)


def test_interrupted_build_is_never_read_as_complete_and_is_rebuilt(tmp_path):
    data = _make_videos(tmp_path)
    cache = FrameCache(tmp_path / "cache", SIZE)
    cache.loader = _FailingLoader(cache.loader, 6)  # v1 (5 frames) completes, v2 stops after 1 frame
    with pytest.raises(KeyboardInterrupt):
        cache.build(data, batch_size=1, progress=False)
    v1 = [d["image"] for d in data if d["video_id"] == "v1"]
    v2 = [d["image"] for d in data if d["video_id"] == "v2"]
    assert cache.is_complete("v1", v1)
    assert cache.partial_path("v2").exists() and not cache.array_path("v2").exists()
    assert not cache.is_complete("v2", v2)
    with pytest.raises(FileNotFoundError, match="v2"):
        FrameCacheDataset(data, tmp_path / "cache", image_size=SIZE, build=False)
    # killed between the rename and the manifest: an array without manifest is not complete either
    os.replace(cache.partial_path("v2"), cache.array_path("v2"))
    assert not cache.is_complete("v2", v2)

    v1_mtime = cache.array_path("v1").stat().st_mtime_ns
    fresh = FrameCache(tmp_path / "cache", SIZE)
    fresh.build(data, progress=False)
    assert cache.array_path("v1").stat().st_mtime_ns == v1_mtime  # finished video reused
    assert fresh.is_complete("v2", v2)
    np.testing.assert_array_equal(fresh.open("v2")[2], load_vce_frame(v2[2], SIZE).numpy())


def test_invalidation_on_frame_list_content_and_size(tmp_path):
    data = _make_videos(tmp_path)
    cache = FrameCache(tmp_path / "cache", SIZE)
    cache.build(data, progress=False)
    v2 = [d for d in data if d["video_id"] == "v2"]
    paths = [d["image"] for d in v2]
    assert cache.is_complete("v2", paths)
    assert not cache.is_complete("v2", paths[:-1])  # frame removed
    assert not cache.is_complete("v2", paths[::-1])  # reordered
    assert not FrameCache(tmp_path / "cache", SIZE + 8).is_complete("v2", paths)  # other size
    # a frame re-exported with other content (other file size) invalidates the entry
    Image.fromarray(np.zeros((40, 40, 3), np.uint8)).save(paths[1])
    assert not cache.is_complete("v2", paths)
    cache.build(data, progress=False)
    assert cache.is_complete("v2", paths)
    np.testing.assert_array_equal(cache.open("v2")[1], np.zeros((3, SIZE, SIZE), np.uint8))
    # a corrupted manifest is not trusted
    cache.manifest_path("v2").write_text("{not json")
    assert not cache.is_complete("v2", paths)


def test_bad_inputs_name_the_problem(tmp_path):
    with pytest.raises(ValueError, match="empty"):
        FrameCacheDataset([], tmp_path / "cache")
    with pytest.raises(ValueError, match="video_id"):
        FrameCache(tmp_path / "cache").build([{"image": "x.png"}], progress=False)
    with pytest.raises(FileNotFoundError, match=r"missing.png"):
        FrameCache(tmp_path / "cache").build(
            [{"image": str(tmp_path / "missing.png"), "video_id": "v"}], progress=False
        )


def test_pipeline_starting_with_the_loader_runs_on_cached_frames(tmp_path):
    from monai.transforms import Compose

    from monai_vce.data import LoadVCEFramed

    data = _make_videos(tmp_path, videos=(("v1", 2),))
    keep = FrameCacheDataset(
        data, tmp_path / "cache", image_size=SIZE, transform=Compose([LoadVCEFramed(image_size=None)])
    )
    assert torch.equal(keep[1]["image"], load_vce_frame(data[1]["image"], SIZE))
    small = FrameCacheDataset(
        data, tmp_path / "cache", image_size=SIZE, transform=Compose([LoadVCEFramed(image_size=8)])
    )
    assert small[1]["image"].shape == (3, 8, 8) and small[1]["image"].dtype == torch.uint8
