"""Per-exam colour normalisation: exam statistics, reference statistics and the dictionary transform."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from monai_vce.data import (
    ExamColorNormalized,
    ExamStatsLoader,
    datalist_exam_stats,
    exam_color_stats,
    reference_color_stats,
)

REF_MEAN = np.array([0.55, 0.35, 0.25])
REF_STD = np.array([0.12, 0.09, 0.07])


def _exam(mean, std, n=12, size=32, seed=0, border=True) -> torch.Tensor:
    """``uint8`` frames ``(n, 3, size, size)`` of the given channel statistics, with a black circular vignette."""
    rng = np.random.default_rng(seed)
    x = rng.normal(np.asarray(mean)[None, :, None, None], np.asarray(std)[None, :, None, None], (n, 3, size, size))
    x = np.clip(x, 0.1, 1.0)
    if border:
        yy, xx = np.mgrid[:size, :size]
        outside = (yy - size / 2 + 0.5) ** 2 + (xx - size / 2 + 0.5) ** 2 > (size / 2 - 1) ** 2
        x[:, :, outside] = 0.0
    return torch.from_numpy(np.round(x * 255)).to(torch.uint8)


def _normalize(frames: torch.Tensor, xform: ExamColorNormalized, video="v") -> torch.Tensor:
    return torch.stack([xform({"image": f, "video_id": video})["image"] for f in frames])


def test_stats_ignore_the_border_and_accept_both_layouts():
    frames = _exam([0.5, 0.4, 0.3], [0.05, 0.05, 0.05], border=True)
    mean, std = exam_color_stats(frames)
    assert mean.shape == std.shape == (3,) and mean.dtype == np.float64
    np.testing.assert_allclose(mean, [0.5, 0.4, 0.3], atol=0.01)
    np.testing.assert_allclose(std, [0.05, 0.05, 0.05], atol=0.01)
    last = exam_color_stats(frames.permute(0, 2, 3, 1).numpy())
    np.testing.assert_allclose(last[0], mean, atol=1e-9)
    chunked = exam_color_stats(frames.float() / 255.0, chunk_size=5)
    np.testing.assert_allclose(chunked[0], mean, atol=1e-6)
    np.testing.assert_allclose(chunked[1], std, atol=1e-6)
    with pytest.raises(ValueError, match="no pixel"):
        exam_color_stats(torch.zeros(2, 3, 8, 8))


def test_colour_cast_exam_is_mapped_to_the_reference():
    cast = _exam([0.75, 0.3, 0.4], [0.2, 0.05, 0.1], seed=1)
    stats = {"new": exam_color_stats(cast)}
    xform = ExamColorNormalized("image", stats, REF_MEAN, REF_STD)
    out = _normalize(cast, xform, "new")
    assert out.dtype == torch.uint8 and out.shape == cast.shape
    mean, std = exam_color_stats(out)
    np.testing.assert_allclose(mean, REF_MEAN, atol=0.01)
    np.testing.assert_allclose(std, REF_STD, atol=0.01)
    # the vignette stays black
    assert int(out[:, :, 0, 0].max()) == 0


def test_reference_exam_is_left_almost_unchanged():
    ref = _exam(REF_MEAN, REF_STD, seed=2)
    mean, std = exam_color_stats(ref)
    xform = ExamColorNormalized("image", {"v": (mean, std)}, mean, std)
    out = _normalize(ref, xform)
    assert (out.int() - ref.int()).abs().max() <= 1


def test_float_frames_keep_their_dtype():
    cast = _exam([0.7, 0.3, 0.3], [0.1, 0.05, 0.05], seed=3).float() / 255.0
    xform = ExamColorNormalized("image", {"v": exam_color_stats(cast)}, REF_MEAN, REF_STD)
    out = _normalize(cast, xform)
    assert out.dtype == torch.float32 and float(out.min()) >= 0.0 and float(out.max()) <= 1.0
    np.testing.assert_allclose(exam_color_stats(out)[0], REF_MEAN, atol=0.01)
    item = xform({"image": cast[0].numpy(), "video_id": "v"})
    assert isinstance(item["image"], np.ndarray) and item["image"].dtype == np.float32


def test_grey_world_balances_the_channel_means():
    cast = _exam([0.6, 0.3, 0.45], [0.05, 0.05, 0.05], seed=4)
    out = _normalize(cast, ExamColorNormalized("image", {"v": exam_color_stats(cast)}, mode="grey_world"))
    mean = exam_color_stats(out)[0]
    np.testing.assert_allclose(mean, np.full(3, 0.45), atol=0.01)
    to_ref = ExamColorNormalized("image", {"v": exam_color_stats(cast)}, REF_MEAN, mode="grey_world")
    np.testing.assert_allclose(exam_color_stats(_normalize(cast, to_ref))[0], REF_MEAN, atol=0.01)


def test_unknown_video_is_named_or_skipped():
    frame = _exam(REF_MEAN, REF_STD, n=1)[0]
    xform = ExamColorNormalized("image", {"known": (REF_MEAN, REF_STD)}, REF_MEAN, REF_STD)
    with pytest.raises(KeyError, match="ukdd_navi_00099"):
        xform({"image": frame, "video_id": "ukdd_navi_00099"})
    with pytest.raises(KeyError, match="video_id"):
        xform({"image": frame})
    skip = ExamColorNormalized("image", {}, REF_MEAN, REF_STD, on_missing="skip")
    assert torch.equal(skip({"image": frame, "video_id": "x"})["image"], frame)
    with pytest.raises(ValueError, match="reference_mean"):
        ExamColorNormalized("image", {}, mode="mean_std")
    with pytest.raises(ValueError, match="mode"):
        ExamColorNormalized("image", {}, REF_MEAN, REF_STD, mode="bogus")


def test_callable_stats_are_computed_once_per_video():
    exams = {"a": _exam([0.7, 0.3, 0.3], [0.1, 0.05, 0.05], seed=5), "b": _exam(REF_MEAN, REF_STD, seed=6)}
    calls = []

    def stats(vid):
        calls.append(vid)
        return exam_color_stats(exams[vid])

    xform = ExamColorNormalized("image", stats, REF_MEAN, REF_STD)
    for vid, frames in exams.items():
        out = _normalize(frames, xform, vid)
        np.testing.assert_allclose(exam_color_stats(out)[0], REF_MEAN, atol=0.01)
    assert calls == ["a", "b"]


def test_datalist_stats_and_reference(tmp_path):
    exams = {"a": _exam([0.7, 0.3, 0.3], [0.1, 0.05, 0.05], n=6, seed=7), "b": _exam(REF_MEAN, REF_STD, n=6, seed=8)}
    datalist = []
    for vid, frames in exams.items():
        (tmp_path / vid).mkdir()
        for i, f in enumerate(frames):
            path = tmp_path / vid / f"frame_{i:06d}.png"
            Image.fromarray(f.permute(1, 2, 0).numpy()).save(path)
            datalist.append({"image": str(path), "video_id": vid, "frame_index": i})
    per_exam = datalist_exam_stats(datalist, frames_per_exam=4, image_size=None)
    assert set(per_exam) == {"a", "b"}
    np.testing.assert_allclose(per_exam["b"][0], exam_color_stats(exams["b"][[0, 2, 3, 5]])[0], atol=1e-9)
    mean, std = reference_color_stats(per_exam)
    np.testing.assert_allclose(mean, (per_exam["a"][0] + per_exam["b"][0]) / 2)
    np.testing.assert_allclose(std, (per_exam["a"][1] + per_exam["b"][1]) / 2)
    with pytest.raises(KeyError, match="'zz'"):
        ExamStatsLoader(datalist)("zz")
    with pytest.raises(ValueError, match="no exam"):
        reference_color_stats({})
