"""LoadVCEFramed: decoding, resizing, conversions of unusual PNGs and clear errors for broken files."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from monai_vce.data import LoadVCEFramed, VCEPrepareBatch, load_vce_frame
from monai_vce.data.frames import reset_frame_warnings


@pytest.fixture(autouse=True)
def _fresh_warnings():
    reset_frame_warnings()
    yield
    reset_frame_warnings()


def _rgb(h=40, w=50, seed=0):
    return np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)


def _save(path, arr, **kw):
    Image.fromarray(arr).save(path, **kw)
    return str(path)


def _user_warnings(rec):
    return [
        str(w.message)
        for w in rec
        if issubclass(w.category, UserWarning) and not issubclass(w.category, DeprecationWarning)
    ]


def test_rgb_shape_dtype_and_exact_content(tmp_path):
    arr = _rgb()
    p = _save(tmp_path / "f.png", arr)
    out = LoadVCEFramed(keys="image", image_size=None)({"image": p, "video_id": "v"})
    assert out["video_id"] == "v"
    img = out["image"]
    assert img.dtype == torch.uint8 and tuple(img.shape) == (3, 40, 50) and img.is_contiguous()
    np.testing.assert_array_equal(img.permute(1, 2, 0).numpy(), arr)


@pytest.mark.parametrize("size,expected", [(224, (3, 224, 224)), ((32, 48), (3, 32, 48))])
def test_resize_in_uint8(tmp_path, size, expected):
    arr = np.full((336, 336, 3), (10, 120, 250), dtype=np.uint8)
    p = _save(tmp_path / "f.png", arr)
    img = load_vce_frame(p, size)
    assert tuple(img.shape) == expected and img.dtype == torch.uint8
    # a constant image stays exactly constant through the antialiased bilinear resize
    assert img[0].unique().tolist() == [10] and img[1].unique().tolist() == [120] and img[2].unique().tolist() == [250]


def test_frames_of_different_sizes_batch_together(tmp_path):
    t = LoadVCEFramed(keys="image", image_size=64)
    a = t({"image": _save(tmp_path / "a.png", _rgb(336, 336))})["image"]
    b = t({"image": _save(tmp_path / "b.png", _rgb(512, 512, seed=1))})["image"]
    assert torch.stack([a, b]).shape == (2, 3, 64, 64)


def test_grayscale_rgba_16bit_palette_converted_with_one_warning_each(tmp_path):
    arr = _rgb()
    gray = _save(tmp_path / "gray.png", arr[..., 0])
    gray2 = _save(tmp_path / "gray2.png", arr[..., 1])
    rgba = _save(tmp_path / "rgba.png", np.dstack([arr, np.full(arr.shape[:2], 7, np.uint8)]))
    g16 = np.asarray(arr[..., 0], dtype=np.uint16) * 257  # 8-bit value v -> 16-bit v * 257
    p16 = _save(tmp_path / "g16.png", g16)
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        x_gray = load_vce_frame(gray, None)
        load_vce_frame(gray2, None)  # same kind: no second warning
        x_rgba = load_vce_frame(rgba, None)
        x_16 = load_vce_frame(p16, None)
    msgs = _user_warnings(rec)
    assert len(msgs) == 3, msgs
    assert "gray.png" in msgs[0] and "grayscale" in msgs[0]
    assert "rgba.png" in msgs[1] and "rgba" in msgs[1]
    assert "g16.png" in msgs[2] and "16-bit" in msgs[2]
    for x in (x_gray, x_rgba, x_16):
        assert x.dtype == torch.uint8 and tuple(x.shape) == (3, 40, 50)
    np.testing.assert_array_equal(x_gray.numpy(), np.broadcast_to(arr[..., 0], (3, 40, 50)))
    np.testing.assert_array_equal(x_rgba.permute(1, 2, 0).numpy(), arr)  # alpha dropped, colours kept
    np.testing.assert_array_equal(x_16.numpy(), np.broadcast_to(arr[..., 0], (3, 40, 50)))  # exact 16 -> 8 bit


def test_zero_byte_frame_names_file(tmp_path):
    p = tmp_path / "frame_000007.PNG"
    p.write_bytes(b"")
    with pytest.raises(ValueError, match=r"empty frame file \(0 bytes\): .*frame_000007\.PNG"):
        LoadVCEFramed(keys="image")({"image": str(p)})


@pytest.mark.parametrize("keep", [0.5, 0.97, 30])
def test_truncated_png_names_file(tmp_path, keep):
    src = tmp_path / "full.png"
    _save(src, _rgb(64, 64))
    data = src.read_bytes()
    n = keep if isinstance(keep, int) else int(len(data) * keep)
    p = tmp_path / "frame_000123.PNG"
    p.write_bytes(data[:n])
    with pytest.raises(ValueError, match=r"truncated or corrupted PNG frame .*frame_000123\.PNG"):
        load_vce_frame(p)


def test_jpeg_renamed_png_decoded_with_warning_or_rejected(tmp_path):
    arr = np.full((48, 48, 3), 128, dtype=np.uint8)
    p = tmp_path / "frame_000009.PNG"
    Image.fromarray(arr).save(p, format="JPEG", quality=95)
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        img = load_vce_frame(p, 32)
        load_vce_frame(p, 32)
    msgs = _user_warnings(rec)
    assert len(msgs) == 1 and "JPEG" in msgs[0] and "frame_000009.PNG" in msgs[0]
    assert tuple(img.shape) == (3, 32, 32) and abs(int(img.float().mean()) - 128) <= 2
    with pytest.raises(ValueError, match=r"frame .*frame_000009\.PNG is a JPEG file, not a PNG"):
        LoadVCEFramed(keys="image", allow_jpeg=False)({"image": str(p)})


def test_non_png_content_and_missing_file(tmp_path):
    p = tmp_path / "notes.png"
    p.write_text("hello, not an image")
    with pytest.raises(ValueError, match=r"notes\.png is not a PNG file"):
        load_vce_frame(p)
    with pytest.raises(FileNotFoundError, match=r"frame file .*missing\.png not found"):
        load_vce_frame(tmp_path / "missing.png")


def test_prepare_batch_scales_on_device():
    batch = {
        "image": torch.tensor([0, 51, 255], dtype=torch.uint8).view(1, 3, 1, 1).repeat(2, 1, 2, 2),
        "label": [torch.tensor([1.0, 0.0]), torch.tensor([0.0, 1.0])],  # default collation of lists of floats
    }
    image, label = VCEPrepareBatch()(batch, device="cpu")
    assert image.dtype == torch.float32
    assert image[0, :, 0, 0].tolist() == pytest.approx([0.0, 0.2, 1.0])
    assert label.tolist() == [[1.0, 0.0], [0.0, 1.0]]
    image, label = VCEPrepareBatch()({"image": torch.zeros(1, 3, 2, 2, dtype=torch.uint8)}, "cpu")
    assert label is None and image.dtype == torch.float32


def test_checked_decoder_gives_the_pixels_of_torchvision(tmp_path):
    """The checked Pillow decoding of valid frames equals torchvision's ``decode_png`` (used before; it crashes the
    process on damaged files, see tests/hardening/test_hardening.py), for 8-bit RGB and 16-bit grayscale frames."""
    from torchvision.io import ImageReadMode, decode_png

    from monai_vce.data.frames import _to_uint8, resize_frame

    arr = _rgb()
    p_rgb = _save(tmp_path / "rgb.png", arr)
    p16 = _save(tmp_path / "g16.png", np.asarray(arr[..., 2], dtype=np.uint16) * 257)
    for p in (p_rgb, p16):
        raw = torch.frombuffer(bytearray(Path(p).read_bytes()), dtype=torch.uint8)
        reference = resize_frame(_to_uint8(decode_png(raw, mode=ImageReadMode.RGB)), 24)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            assert torch.equal(load_vce_frame(p, 24), reference), p
    bad = tmp_path / "bad.png"
    bad.write_bytes((tmp_path / "rgb.png").read_bytes()[:200])
    with pytest.raises(ValueError, match=r"truncated or corrupted PNG frame .*bad\.png"):
        load_vce_frame(bad)
