"""Hardening round 3 (issue 25), allocation and file-system faults: a full disk or a file-size limit while the
frame cache or an atomic writer writes is one line naming the file (never a bus error), earlier outputs intact;
the metric's overlap computation runs in bounded memory on 10^5 fully overlapping events per side."""

from __future__ import annotations

import errno
import importlib
import os
import sys
import textwrap

import numpy as np
import pytest

from monai_vce.data.frame_cache import FrameCache
from monai_vce.metrics import temporal_map, temporal_map_reference
from monai_vce.utils import atomic_save_npz, atomic_write_bytes, atomic_write_json, atomic_write_text
from tests.capped import LIGHT_CAP_MB, python_capped

tmm = importlib.import_module("monai_vce.metrics.temporal_map")


# --- atomic writers --------------------------------------------------------------------------------------
@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EFBIG, errno.EACCES, errno.EROFS, errno.ELOOP])
@pytest.mark.parametrize("writer", ["bytes", "text", "json", "npz"])
def test_atomic_writer_errors_name_the_file_and_keep_the_old_one(tmp_path, monkeypatch, code, writer):
    path = tmp_path / "out" / "result.bin"
    atomic_write_bytes(path, b"earlier")

    def fsync(fd):
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(os, "fsync", fsync)
    write = {
        "bytes": lambda: atomic_write_bytes(path, b"new"),
        "text": lambda: atomic_write_text(path, "new"),
        "json": lambda: atomic_write_json(path, {"a": 1}),
        "npz": lambda: atomic_save_npz(path, a=np.zeros(3)),
    }[writer]
    with pytest.raises(OSError) as info:
        write()
    message = str(info.value)
    assert info.value.errno == code and "\n" not in message
    assert message.startswith(f"cannot write {path}: ") and f"({errno.errorcode[code]})" in message
    assert "earlier outputs are intact" in message
    assert path.read_bytes() == b"earlier"
    assert sorted(p.name for p in path.parent.iterdir()) == ["result.bin"]  # temporary file removed


def test_atomic_writer_real_file_size_limit_efbig(tmp_path):
    path = tmp_path / "big.bin"
    code = textwrap.dedent(
        f"""
        import resource, signal, sys
        from monai_vce.utils import atomic_write_bytes
        atomic_write_bytes({str(path)!r}, b"earlier")
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a real file-size limit: write() fails with EFBIG
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))
        try:
            atomic_write_bytes({str(path)!r}, b"x" * (4 << 20))
        except OSError as err:
            print("ERR", err)
            sys.exit(3)
        """
    )
    res = python_capped(code, limit_mb=LIGHT_CAP_MB, timeout=120)
    assert res.returncode == 3, res.stderr[-2000:]
    assert f"ERR cannot write {path}: file too large (EFBIG); earlier outputs are intact" in res.stdout
    assert path.read_bytes() == b"earlier"
    assert [p.name for p in tmp_path.iterdir()] == ["big.bin"]


def test_atomic_writer_real_symlink_loop_in_parent(tmp_path):
    os.symlink(tmp_path / "b", tmp_path / "a")
    os.symlink(tmp_path / "a", tmp_path / "b")
    with pytest.raises(OSError, match=r"cannot write .*a/x\.json: .*a is a dangling or looped symbolic link"):
        atomic_write_text(tmp_path / "a" / "x.json", "{}")
    os.symlink(tmp_path / "absent", tmp_path / "dangling")
    with pytest.raises(OSError, match=r"dangling is a dangling or looped symbolic link"):
        atomic_write_text(tmp_path / "dangling" / "x.json", "{}")


# --- frame cache / video cache on a full disk ----------------------------------------------------------------
def test_frame_cache_real_file_size_limit_is_one_line_not_bus_error(tmp_path):
    """A memory map over a sparse file dies with SIGBUS (exit 135) when its blocks cannot be had."""
    code = textwrap.dedent(
        f"""
        import resource, signal, sys
        import numpy as np
        from monai_vce.data.frame_cache import FrameCache
        cache = FrameCache({str(tmp_path / "cache")!r}, image_size=64)
        cache.root.mkdir(parents=True)
        done = cache.open_partial("v1", 2)
        done[:] = 7
        del done
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (200_000, 200_000))
        try:
            arr = cache.open_partial("v2", 1000)  # 12 MB
            arr[:] = 1
        except OSError as err:
            print("ERR", err)
            sys.exit(3)
        """
    )
    res = python_capped(code, timeout=240)
    assert res.returncode == 3, (res.returncode, res.stderr[-2000:])
    cache = FrameCache(tmp_path / "cache", image_size=64)
    line = res.stdout.strip().splitlines()[-1]
    assert line.startswith(f"ERR cannot write frame cache file {cache.partial_path('v2')}"), line
    assert "(EFBIG)" in line and "video 'v2'" in line and "finished cache entries are intact" in line
    assert not cache.partial_path("v2").exists()
    assert (np.load(cache.partial_path("v1"), mmap_mode="r") == 7).all()  # the earlier file untouched


def test_frame_cache_disk_full_on_allocation_removes_the_partial_file(tmp_path, monkeypatch):
    cache = FrameCache(tmp_path / "cache", image_size=32)
    cache.root.mkdir(parents=True)
    calls = []

    def fallocate(fd, offset, length):
        calls.append(length)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "posix_fallocate", fallocate)
    with pytest.raises(OSError, match=r"no space left on device \(ENOSPC\); finished cache entries are intact"):
        cache.open_partial("v1", 10)
    assert calls and calls[0] >= 10 * 3 * 32 * 32  # every frame's bytes reserved before any is written
    assert not cache.partial_path("v1").exists()


# --- metric in bounded memory -------------------------------------------------------------------------------
def test_metric_100k_fully_overlapping_events_bounded_memory_and_time():
    code = textwrap.dedent(
        """
        import importlib, time
        import numpy as np
        tmm = importlib.import_module("monai_vce.metrics.temporal_map")
        n = 100_000
        t0 = time.time()
        same = np.tile([[0, 99_999]], (n, 1))
        print("same", tmm._average_precision(same, same.copy(), (0.5, 0.95)).tolist())
        i = np.arange(n)
        shifted = np.stack([i % 50, 99_999 - i % 50], 1)  # all overlapping, all qualifying at 0.5
        print("shifted", tmm._average_precision(shifted, shifted[::-1].copy(), (0.5,)).tolist())
        print("seconds", time.time() - t0)
        """
    )
    res = python_capped(code, limit_mb=LIGHT_CAP_MB, timeout=240)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "same [1.0, 1.0]" in res.stdout and "shifted [1.0]" in res.stdout
    assert float(res.stdout.split("seconds")[1]) < 120


def _random_doc(rng, n_videos, max_events, span):
    labels = ["blood", "colon", "ulcer"]
    videos = []
    for v in range(n_videos):
        events = []
        for _ in range(int(rng.integers(0, max_events))):
            s = int(rng.integers(0, span))
            e = s + int(rng.integers(0, max(1, span // 3)))
            events.append(
                {
                    "start": s,
                    "end": e,
                    "label": [str(x) for x in rng.choice(labels, int(rng.integers(1, 3)), replace=False)],
                }
            )
        videos.append({"video_id": f"v{v}", "events": events})
    return {"videos": videos}


@pytest.mark.parametrize(("chunk", "block"), [(1, 1), (3, 7), (17, 50), (256, 1 << 20)])
def test_metric_chunked_greedy_equals_reference(monkeypatch, chunk, block):
    monkeypatch.setattr(tmm, "_GT_CHUNK", chunk)  # many chunks of ground truth, many blocks of predictions
    monkeypatch.setattr(tmm, "_PAIR_BLOCK", block)
    rng = np.random.default_rng(chunk)
    thresholds = (0.0, 0.1, 0.3, 0.5, 0.7, 0.95, 1.0)
    for case in range(40):
        span = int(rng.integers(5, 80))
        gt = _random_doc(rng, 2, 25, span)
        pred = _random_doc(rng, 2, 30, span)
        if case % 3 == 0:  # duplicates compete for the same ground truth
            for v in pred["videos"]:
                v["events"] = v["events"] + v["events"][: len(v["events"]) // 2]
        assert temporal_map(gt, pred, tiou_thresholds=thresholds) == temporal_map_reference(
            gt, pred, tiou_thresholds=thresholds
        )


if sys.platform != "linux":  # RLIMIT_FSIZE / posix_fallocate semantics
    pytestmark = pytest.mark.skip("Linux only")
