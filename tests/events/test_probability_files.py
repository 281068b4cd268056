"""The per-video probability files: one writer, one reader with every check, one place naming the files."""

from __future__ import annotations

import numpy as np
import pytest

from monai_vce.events import (
    Video,
    completed_videos,
    load_video_probs,
    npz_record,
    probability_file,
    probability_files,
    save_video_probs,
    video_file_name,
)
from monai_vce.labels import LABELS
from monai_vce.utils import atomic_save_npz


def _video(vid: str = "7", T: int = 5, features: bool = False) -> Video:
    rng = np.random.default_rng(0)
    return Video(
        vid,
        rng.random((T, 17), dtype=np.float32),
        np.arange(T, dtype=np.int64) + 20,
        5 * np.arange(T, dtype=np.int64) + 100,
        features=rng.random((T, 8)).astype(np.float16) if features else None,
        source="model.pt:1:2",
    )


def test_round_trip_with_and_without_features(tmp_path):
    plain, rich = _video("1"), _video("2", features=True)
    for v in (plain, rich):
        save_video_probs(probability_file(tmp_path, v.video_id), v)
    a = load_video_probs(tmp_path / "1.npz", features=True)
    assert a.video_id == "1" and a.features is None and a.source == "model.pt:1:2"
    np.testing.assert_array_equal(a.probs, plain.probs)
    np.testing.assert_array_equal(a.frame_ids("frame_number"), plain.frame_number)
    b = load_video_probs(tmp_path / "2.npz", features=True)
    assert b.features is not None and b.features.dtype == np.float16 and b.features.shape == (5, 8)
    assert load_video_probs(tmp_path / "2.npz").features is None  # read only when asked for
    assert list(probability_files(tmp_path)) == ["1", "2"] and npz_record(tmp_path / "1.npz") == (5, "model.pt:1:2")


def test_every_key_is_checked_with_the_file_and_key_named(tmp_path):
    good = {
        "probs": np.zeros((4, 17), np.float32),
        "frame_index": np.arange(4),
        "frame_number": np.arange(4),
        "labels": np.asarray(LABELS),
        "video_id": np.asarray("v"),
        "source": np.asarray(""),
    }
    cases = {
        "probs": ({"probs": np.zeros((4, 16), np.float32)}, r"'probs' must be a float \(T, 17\) array"),
        "index": ({"frame_index": np.arange(3)}, r"'frame_index' must be 4 integers"),
        "number": ({"frame_number": np.arange(4.0)}, r"'frame_number' must be 4 integers"),
        "labels": ({"labels": np.asarray(LABELS[::-1])}, r"'labels' are not the 17 LABELS in order"),
        "features": ({"features": np.zeros((3, 8), np.float16)}, r"'features' must be a float \(T=4, D\) array"),
    }
    for name, (change, match) in cases.items():
        path = atomic_save_npz(tmp_path / f"{name}.npz", **{**good, **change})
        with pytest.raises(ValueError, match=rf"probability file .*{name}\.npz: {match}"):
            load_video_probs(path, features=True)
        assert npz_record(path) is None or name == "features"  # the record does not read the features
    missing = atomic_save_npz(tmp_path / "missing.npz", probs=good["probs"], frame_index=good["frame_index"])
    with pytest.raises(ValueError, match=r"missing\.npz: missing keys frame_number, labels, video_id, source$"):
        load_video_probs(missing)
    with pytest.raises(FileNotFoundError, match=r"absent\.npz not found"):
        load_video_probs(tmp_path / "absent.npz")
    # a resumed inference recomputes a video whose file fails the checks
    assert completed_videos([{"video_id": "missing", "frame_index": i} for i in range(4)], tmp_path) == []


def test_one_place_names_the_files_of_a_video(tmp_path):
    assert video_file_name("ukdd_navi_00051") == "ukdd_navi_00051.npz"
    assert video_file_name("1", ".png") == "1.png"
    # any other id is made safe, never a path, and two ids never share a name
    safe = {bad: video_file_name(bad) for bad in (".", "..", "../x", "a/b", "a_b", "a\\b", "a\0b", "v 1", "%")}
    assert safe["a/b"] == "a%2Fb.npz" and safe["../x"] == "%2E.%2Fx.npz" and safe["%"] == "%25.npz"
    assert len(set(safe.values())) == len(safe) and not any("/" in n or n.startswith(".") for n in safe.values())
    assert probability_file(tmp_path, "v 1") == tmp_path / "v%201.npz"
    for bad in ("", "x" * 201):
        with pytest.raises(ValueError, match=r"non-empty|too long"):
            video_file_name(bad)


def test_the_inferred_mask_of_reduced_inference(tmp_path):
    video = _video("3", T=6)
    assert load_video_probs(save_video_probs(tmp_path / "3.npz", video)).inferred is None  # full inference
    video.inferred = np.array([1, 0, 0, 1, 0, 1], dtype=bool)
    back = load_video_probs(save_video_probs(tmp_path / "3.npz", video, source="model|reduced(stride=2)"))
    assert back.inferred is not None and back.inferred.dtype == np.bool_
    np.testing.assert_array_equal(back.inferred, video.inferred)
    video.inferred = np.ones(5, dtype=bool)
    with pytest.raises(ValueError, match=r"video '3': 'inferred' must be 6 booleans"):
        save_video_probs(tmp_path / "bad.npz", video)
    good = {"probs": video.probs, "frame_index": video.frame_index, "frame_number": video.frame_number}
    good.update(video_id=np.asarray("3"), source=np.asarray(""))
    path = atomic_save_npz(tmp_path / "mask.npz", **good, labels=np.asarray(LABELS), inferred=np.ones(6, np.int64))
    with pytest.raises(ValueError, match=r"mask\.npz: 'inferred' must be 6 booleans"):
        load_video_probs(path)
    # resume accepts one source or any of several
    items = [{"video_id": "3", "frame_index": 20 + i, "frame_number": 100 + 5 * i} for i in range(6)]
    assert completed_videos(items, tmp_path, source="model") == []
    assert completed_videos(items, tmp_path, source="model|reduced(stride=2)") == ["3"]
    assert completed_videos(items, tmp_path, source=("model", "model|reduced(stride=2)")) == ["3"]
    assert completed_videos(items, tmp_path, source=["model", "model|reduced(stride=4)"]) == []
