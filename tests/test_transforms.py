"""Tests of the capsule-frame pipelines: shapes, dtypes, ranges, exact decoding, determinism, collation."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from monai.data import DataLoader, Dataset
from PIL import Image

from monai_vce.data import RandHueSaturationd, vce_train_transforms, vce_val_transforms


@pytest.fixture(scope="module")
def frames(tmp_path_factory):
    root = tmp_path_factory.mktemp("frames")
    rng = np.random.RandomState(0)
    items = []
    for i in range(6):
        arr = rng.randint(0, 256, size=(48, 48, 3), dtype=np.uint8)
        arr[:10, :, 0] = 255  # a red band on top: orientation marker
        path = root / f"frame_{i:06d}.PNG"
        Image.fromarray(arr).save(path)
        label = [0.0] * 17
        label[i % 17] = 1.0
        items.append(
            {"image": str(path), "label": label, "video_id": f"vid{i % 2}", "frame_index": 10 * i, "frame_number": i}
        )
    return items


def test_val_uint8_is_exact_pixels_channel_first(frames):
    out = vce_val_transforms(image_size=48)(frames[0])
    ref = np.asarray(Image.open(frames[0]["image"]).convert("RGB")).transpose(2, 0, 1)
    assert out["image"].dtype == torch.uint8 and out["image"].shape == (3, 48, 48)
    # same size: resizing is the identity, rows stay rows (no transposition by the reader)
    np.testing.assert_array_equal(out["image"].numpy(), ref)
    assert out["label"].dtype == torch.float32 and out["label"].shape == (17,)
    assert out["video_id"] == "vid0" and out["frame_index"] == 0


def test_val_float32_range_and_resize(frames):
    out = vce_val_transforms(image_size=32, output_dtype="float32")(frames[1])
    img = out["image"]
    assert img.dtype == torch.float32 and img.shape == (3, 32, 32)
    assert float(img.min()) >= 0.0 and float(img.max()) <= 1.0
    # the red band survives resizing on top of the image
    assert float(img[0, :4].mean()) > 0.99
    u8 = vce_val_transforms(image_size=32)(frames[1])["image"]
    np.testing.assert_allclose(u8.numpy() / 255.0, img.numpy(), atol=0.5 / 255 + 1e-6)


def test_unlabelled_items_pass(frames):
    item = {k: v for k, v in frames[2].items() if k != "label"}
    out = vce_val_transforms(image_size=24)(item)
    assert "label" not in out and out["image"].shape == (3, 24, 24)


@pytest.mark.parametrize("output_dtype", ["uint8", "float32"])
def test_train_shapes_dtype_range(frames, output_dtype):
    t = vce_train_transforms(image_size=32, output_dtype=output_dtype)
    t.set_random_state(1)
    outs = [t(f)["image"] for f in frames]
    for img in outs:
        assert img.shape == (3, 32, 32)
        assert img.dtype == (torch.uint8 if output_dtype == "uint8" else torch.float32)
        if output_dtype == "float32":
            assert float(img.min()) >= 0.0 and float(img.max()) <= 1.0
    # augmentation changes the frame compared with the plain resize
    plain = vce_val_transforms(image_size=32, output_dtype=output_dtype)(frames[0])["image"]
    assert not torch.equal(outs[0], plain)


def test_train_determinism_with_set_random_state(frames):
    a = vce_train_transforms(image_size=32).set_random_state(seed=42)
    b = vce_train_transforms(image_size=32).set_random_state(seed=42)
    c = vce_train_transforms(image_size=32).set_random_state(seed=43)
    xa = [a(f)["image"] for f in frames]
    xb = [b(f)["image"] for f in frames]
    xc = [c(f)["image"] for f in frames]
    assert all(torch.equal(p, q) for p, q in zip(xa, xb, strict=False))
    assert not all(torch.equal(p, q) for p, q in zip(xa, xc, strict=False))


def test_metadata_survives_collation(frames):
    ds = Dataset(frames, transform=vce_train_transforms(image_size=32))
    batch = next(iter(DataLoader(ds, batch_size=4, shuffle=False, num_workers=0)))
    assert batch["image"].shape == (4, 3, 32, 32) and batch["image"].dtype == torch.uint8
    assert batch["label"].shape == (4, 17) and batch["label"].dtype == torch.float32
    assert list(batch["video_id"]) == ["vid0", "vid1", "vid0", "vid1"]
    assert batch["frame_index"].tolist() == [0, 10, 20, 30]
    assert batch["frame_number"].tolist() == [0, 1, 2, 3]
    np.testing.assert_array_equal(batch["label"].numpy(), np.asarray([f["label"] for f in frames[:4]]))


def test_hue_saturation_exact_properties():
    g = torch.Generator().manual_seed(0)
    img = torch.rand(3, 8, 8, generator=g) * 0.5 + 0.25  # away from the clip bounds
    luma = torch.tensor([0.299, 0.587, 0.114])
    ident = RandHueSaturationd(keys="x", prob=1.0, hue=0.0, saturation=(1.0, 1.0))
    torch.testing.assert_close(ident({"x": img})["x"], img, atol=1e-6, rtol=0)
    grey = RandHueSaturationd(keys="x", prob=1.0, hue=0.0, saturation=(0.0, 0.0))({"x": img})["x"]
    y = torch.einsum("c,chw->hw", luma, img)
    torch.testing.assert_close(grey, y.expand(3, -1, -1), atol=1e-6, rtol=0)
    # a hue rotation keeps luma and changes colour
    rot = RandHueSaturationd(keys="x", prob=1.0, hue=(0.1, 0.1), saturation=(1.0, 1.0))({"x": img})["x"]
    torch.testing.assert_close(torch.einsum("c,chw->hw", luma, rot), y, atol=1e-5, rtol=0)
    assert (rot - img).abs().max() > 0.01
    # prob 0: untouched
    assert torch.equal(RandHueSaturationd(keys="x", prob=0.0)({"x": img})["x"], img)
    with pytest.raises(ValueError, match="3-channel"):
        RandHueSaturationd(keys="x", prob=1.0)({"x": torch.rand(1, 4, 4)})


def test_bad_output_dtype():
    with pytest.raises(ValueError, match="output_dtype"):
        vce_val_transforms(output_dtype="float16")
