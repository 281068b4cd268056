"""Tests of the capsule-frame pipelines: shapes, dtypes, ranges, exact decoding, determinism, collation."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from bundle_helpers import CONFIGS, TRAIN
from monai.data import DataLoader, Dataset
from PIL import Image

from monai_vce.data import RandHueSaturationd, vce_val_transforms

PAPER = str(CONFIGS / "paper.json")
#: ``train#finalise`` casting to float32 in [0, 1] instead of uint8
FLOAT32 = {
    "train#finalise#0": {
        "_target_": "ScaleIntensityRanged",
        "keys": "image",
        "a_min": 0.0,
        "a_max": 1.0,
        "b_min": 0.0,
        "b_max": 1.0,
        "clip": True,
    }
}


def train_transforms(image_size, *presets, override=None):
    """``train#preprocessing`` of train.json (merged with ``presets``) at ``image_size``, as the bundle builds it."""
    from monai.bundle import ConfigParser

    parser = ConfigParser()
    parser.read_config([TRAIN, *presets])
    for key, value in {"image_size": image_size, **(override or {})}.items():
        parser[key] = value
    return parser.get_parsed_content("train#preprocessing")


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
    t = train_transforms(32, override=FLOAT32 if output_dtype == "float32" else None)
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
    a = train_transforms(32).set_random_state(seed=42)
    b = train_transforms(32).set_random_state(seed=42)
    c = train_transforms(32).set_random_state(seed=43)
    xa = [a(f)["image"] for f in frames]
    xb = [b(f)["image"] for f in frames]
    xc = [c(f)["image"] for f in frames]
    assert all(torch.equal(p, q) for p, q in zip(xa, xb, strict=True))
    assert not all(torch.equal(p, q) for p, q in zip(xa, xc, strict=True))


def test_metadata_survives_collation(frames):
    ds = Dataset(frames, transform=train_transforms(32))
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


def _textured_frame(path, size=512, seed=0):
    """A PNG with fine texture (where resizes with and without antialiasing differ) and smooth shading."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:size, 0:size] / size
    base = np.stack([200 * xx, 150 * yy, 100 * (1 - xx)], axis=-1)
    arr = np.clip(base + rng.integers(-40, 41, size=(size, size, 3)), 0, 255).astype(np.uint8)
    Image.fromarray(arr).save(path)
    return str(path)


def test_one_resize_for_training_validation_and_inference(tmp_path):
    """A training crop of the whole frame, validation and inference give the same bytes: one antialiased resize."""
    from monai.bundle import ConfigParser

    from monai_vce.data.frames import load_vce_frame, resize_frame

    item = {"image": _textured_frame(tmp_path / "frame_000001.PNG"), "label": [0.0] * 17}
    # train.json's pipeline with the augmentation reduced to a crop of the whole frame and the scaling to [0, 1]
    whole = {"_target_": "monai_vce.data.RandResizedCropd", "keys": "image", "image_size": "@image_size"}
    whole.update(scale=[1.0, 1.0], ratio=[1.0, 1.0])
    no_aug = {"augmentation": [whole, json.loads(Path(TRAIN).read_text())["augmentation"][1]]}
    train = train_transforms(224, override=no_aug).set_random_state(0)(item)["image"]
    val = vce_val_transforms(image_size=224)(item)["image"]
    # inference.json's preprocessing, built as the bundle builds it
    parser = ConfigParser({"preprocessing": {"_target_": "monai_vce.data.vce_val_transforms", "image_size": 224}})
    infer = parser.get_parsed_content("preprocessing")(item)["image"]
    assert train.dtype == val.dtype == infer.dtype == torch.uint8
    assert torch.equal(train, val) and torch.equal(val, infer)
    full = load_vce_frame(item["image"], None)
    assert torch.equal(val, resize_frame(full, 224))
    # the resize is antialiased: a plain bilinear resize of this frame differs by several grey levels
    plain = torch.nn.functional.interpolate(full[None].float(), size=(224, 224), mode="bilinear", antialias=False)
    assert (plain[0] - val.float()).abs().mean() > 3.0


def test_random_resized_crop_draws_like_torchvision():
    """Area in scale x frame area, aspect ratio in range, inside the frame; reproducible from the random state."""
    from monai_vce.data.transforms import RandResizedCropd

    crop = RandResizedCropd(keys="x", image_size=16, scale=(0.7, 1.0), ratio=(3 / 4, 4 / 3)).set_random_state(3)
    boxes = [crop.crop_box(120, 160) for _ in range(300)]
    top, left, h, w = np.asarray(boxes).T
    area = h * w / (120 * 160)
    assert area.min() >= 0.7 - 0.02 and area.max() <= 1.0 + 1e-9
    assert (w / h).min() >= 3 / 4 - 0.02 and (w / h).max() <= 4 / 3 + 0.02
    assert (top >= 0).all() and (left >= 0).all() and (top + h <= 120).all() and (left + w <= 160).all()
    assert len(set(boxes)) > 100  # not a fixed crop
    again = RandResizedCropd(keys="x", image_size=16, scale=(0.7, 1.0)).set_random_state(3)
    assert [again.crop_box(120, 160) for _ in range(300)] == boxes
    img = torch.arange(3 * 120 * 160, dtype=torch.float32).reshape(3, 120, 160)
    assert crop({"x": img})["x"].shape == (3, 16, 16)


def test_random_erasing():
    from monai_vce.data.transforms import RandErasingd

    img = torch.full((3, 64, 64), 0.5)
    areas = []
    eraser = RandErasingd(keys="x", prob=1.0, scale=(0.02, 0.33), ratio=(0.3, 3.3)).set_random_state(0)
    for _ in range(50):
        out = eraser({"x": img})["x"]
        zero = out == 0
        assert zero.any() and torch.equal(zero[0], zero[1])  # one rectangle through all channels
        assert (out[~zero] == 0.5).all()
        areas.append(float(zero[0].float().mean()))
    assert min(areas) >= 0.015 and max(areas) <= 0.34
    assert torch.equal(RandErasingd(keys="x", prob=0.0)({"x": img})["x"], img)


def test_paper_augmentation():
    """The paper's augmentation (paper.json): crop 0.7-1.0, flips, +-15 degrees, colour jitter, random erasing;
    train.json's is the project's."""
    from monai.transforms import RandAdjustContrastd, RandFlipd, RandGaussianNoised, RandRotate90d, RandRotated

    from monai_vce.data.transforms import RandErasingd, RandResizedCropd

    t = train_transforms(32, PAPER).transforms
    kinds = [type(x) for x in t]
    crop = next(x for x in t if isinstance(x, RandResizedCropd))
    assert crop.scale == (0.7, 1.0) and crop.ratio == pytest.approx((0.75, 4 / 3))
    assert kinds.count(RandFlipd) == 2 and RandErasingd in kinds and RandHueSaturationd in kinds
    rotate = next(x for x in t if isinstance(x, RandRotated))
    assert rotate.rand_rotate.range_x == pytest.approx((-np.pi / 12, np.pi / 12)) and rotate.prob == 1.0
    for absent in (RandRotate90d, RandAdjustContrastd, RandGaussianNoised):
        assert absent not in kinds
    # train.json alone: the project's augmentation
    project = [type(x) for x in train_transforms(32).transforms]
    assert {RandRotate90d, RandAdjustContrastd, RandGaussianNoised} <= set(project) and RandErasingd not in project


def test_train_pipeline_in_order():
    """train.json's pipeline: decode at full size, the augmentation (``augmentation``), the cast to uint8."""
    names = [type(t).__name__ for t in train_transforms(32).transforms]
    augmentation = ["RandResizedCropd", "ScaleIntensityRanged", "RandFlipd", "RandFlipd", "RandRotate90d"]
    augmentation += ["RandRotated", "RandScaleIntensityd", "RandScaleIntensityFixedMeand", "RandAdjustContrastd"]
    augmentation += ["RandShiftIntensityd", "RandHueSaturationd", "RandGaussianSmoothd", "RandGaussianNoised"]
    assert names == ["LoadVCEFramed", *augmentation, "ScaleIntensityRanged", "EnsureTyped", "EnsureTyped"]
    paper = [type(t).__name__ for t in train_transforms(32, PAPER).transforms]
    assert paper[0] == "LoadVCEFramed" and paper[-3:] == names[-3:] and "RandErasingd" in paper
