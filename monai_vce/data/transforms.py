"""Frame pipelines for capsule endoscopy as MONAI dictionary transforms: decoding, resizing, augmentation.

Keys other than ``image`` and ``label`` pass through; the image leaves as ``uint8`` (3, H, W) unless
``output_dtype="float32"``.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from monai.config import KeysCollection
from monai.transforms import (
    Compose,
    EnsureTyped,
    MapTransform,
    RandomizableTransform,
    ScaleIntensityRanged,
)
from monai.utils import convert_to_dst_type, convert_to_tensor
from torchvision.transforms.v2 import functional as TF

from monai_vce.data.frames import LoadVCEFramed, resize_frame

__all__ = [
    "RandErasingd",
    "RandHueSaturationd",
    "RandResizedCropd",
    "vce_load_transforms",
    "vce_val_transforms",
]

_OUTPUT_DTYPES = ("uint8", "float32")

# RGB <-> YIQ (NTSC): hue is the angle of the (I, Q) chroma vector, saturation its length
_RGB2YIQ = np.array([[0.299, 0.587, 0.114], [0.596, -0.274, -0.322], [0.211, -0.523, 0.312]], dtype=np.float64)
_YIQ2RGB = np.linalg.inv(_RGB2YIQ)


class RandHueSaturationd(RandomizableTransform, MapTransform):
    """Random hue rotation and saturation scaling of channel-first RGB images in [0, 1].

    MONAI has intensity transforms (brightness, contrast, gamma) but no colour ones; this is the missing
    piece of colour jitter. With probability ``prob`` the image is mapped by one 3x3 matrix: to YIQ, the chroma
    ``(I, Q)`` rotated by ``2*pi*h`` and scaled by ``s``, back to RGB; luma is unchanged. ``h`` is drawn from
    ``hue`` (in turns: 0.05 = 18 degrees), ``s`` from ``saturation``. The result is clipped to [0, 1].

    Args:
        keys: keys of the RGB images (3, H, W) to transform.
        prob: probability of applying the transform.
        hue: ``(min, max)`` hue rotation in turns, or ``h`` for ``(-h, h)``.
        saturation: ``(min, max)`` saturation factor, or ``s`` for ``(1 - s, 1 + s)``.
        allow_missing_keys: do not raise when a key is missing.
    """

    def __init__(
        self,
        keys: KeysCollection,
        prob: float = 0.5,
        hue: tuple[float, float] | float = 0.03,
        saturation: tuple[float, float] | float = 0.2,
        allow_missing_keys: bool = False,
    ) -> None:
        MapTransform.__init__(self, keys, allow_missing_keys)
        RandomizableTransform.__init__(self, prob)
        self.hue = (-float(hue), float(hue)) if isinstance(hue, (int, float)) else tuple(map(float, hue))
        self.saturation = (
            (1.0 - float(saturation), 1.0 + float(saturation))
            if isinstance(saturation, (int, float))
            else tuple(map(float, saturation))
        )
        if self.saturation[0] < 0:
            raise ValueError(f"saturation factors must be >= 0, got {self.saturation}")
        self._matrix = np.eye(3)

    def randomize(self, data: Any = None) -> None:
        super().randomize(None)
        if not self._do_transform:
            return
        theta = 2.0 * math.pi * self.R.uniform(self.hue[0], self.hue[1])
        s = self.R.uniform(self.saturation[0], self.saturation[1])
        c, sn = math.cos(theta), math.sin(theta)
        chroma = np.array([[1.0, 0.0, 0.0], [0.0, s * c, -s * sn], [0.0, s * sn, s * c]])
        self._matrix = _YIQ2RGB @ chroma @ _RGB2YIQ

    def __call__(self, data: Mapping[Hashable, Any]) -> dict[Hashable, Any]:
        d = dict(data)
        self.randomize()
        if not self._do_transform:
            return d
        for key in self.key_iterator(d):
            img = d[key]
            if img.shape[0] != 3:
                raise ValueError(f"RandHueSaturationd expects 3-channel RGB images, got {tuple(img.shape)} for {key!r}")
            t = convert_to_tensor(img, track_meta=False)
            m = torch.as_tensor(self._matrix, dtype=t.dtype if t.is_floating_point() else torch.float32)
            out = torch.einsum("ij,j...->i...", m, t.to(m.dtype)).clamp_(0.0, 1.0)
            d[key] = convert_to_dst_type(out, img, dtype=out.dtype)[0]
        return d


def _pair(value: tuple[float, float] | Sequence[float], name: str, low: float = 0.0) -> tuple[float, float]:
    a, b = (float(v) for v in value)
    if not low <= a <= b:
        raise ValueError(f"{name} must be (min, max) with {low} <= min <= max, got {tuple(value)}")
    return a, b


class RandResizedCropd(RandomizableTransform, MapTransform):
    """Random resized crop of channel-first frames: torchvision's ``RandomResizedCrop`` draw, the project's resize.

    A crop of ``scale`` (fraction of the frame's area) and ``ratio`` (width / height, drawn log-uniformly) is drawn
    as ``torchvision.transforms.v2.RandomResizedCrop`` draws it (up to 10 tries, then the largest central crop of
    an allowed aspect ratio), from this transform's random state (``set_random_state`` makes it reproducible),
    then resized to ``image_size`` by :func:`monai_vce.data.frames.resize_frame`, the antialiased resize of
    validation and inference. With probability ``1 - prob`` the whole frame is resized.

    Args:
        keys: keys of the ``(C, H, W)`` frames (``uint8`` or float).
        image_size: side of the square output (or ``(H, W)``).
        scale: range of the crop's area as a fraction of the frame's.
        ratio: range of the crop's aspect ratio (width / height).
        prob: probability of cropping.
        allow_missing_keys: do not raise when a key is missing.
    """

    def __init__(
        self,
        keys: KeysCollection,
        image_size: int | Sequence[int] = 224,
        scale: tuple[float, float] | Sequence[float] = (0.7, 1.0),
        ratio: tuple[float, float] | Sequence[float] = (3.0 / 4.0, 4.0 / 3.0),
        prob: float = 1.0,
        allow_missing_keys: bool = False,
    ) -> None:
        MapTransform.__init__(self, keys, allow_missing_keys)
        RandomizableTransform.__init__(self, prob)
        self.image_size = image_size
        self.scale = _pair(scale, "scale")
        self.ratio = _pair(ratio, "ratio", low=1e-6)
        if self.scale[1] > 1.0 or self.scale[0] <= 0.0:
            raise ValueError(f"scale must lie in (0, 1], got {self.scale}")
        self._box: tuple[int, int, int, int] | None = None

    def crop_box(self, height: int, width: int) -> tuple[int, int, int, int]:
        """Draw ``(top, left, crop_height, crop_width)`` for a ``height x width`` frame."""
        area = height * width
        log_ratio = (math.log(self.ratio[0]), math.log(self.ratio[1]))
        for _ in range(10):
            target_area = area * self.R.uniform(self.scale[0], self.scale[1])
            aspect = math.exp(self.R.uniform(log_ratio[0], log_ratio[1]))
            w = round(math.sqrt(target_area * aspect))
            h = round(math.sqrt(target_area / aspect))
            if 0 < w <= width and 0 < h <= height:
                return int(self.R.randint(0, height - h + 1)), int(self.R.randint(0, width - w + 1)), h, w
        in_ratio = width / height
        if in_ratio < self.ratio[0]:
            w, h = width, round(width / self.ratio[0])
        elif in_ratio > self.ratio[1]:
            h, w = height, round(height * self.ratio[1])
        else:
            h, w = height, width
        return (height - h) // 2, (width - w) // 2, h, w

    def randomize(self, data: Any = None) -> None:
        super().randomize(None)
        self._box = self.crop_box(*data) if self._do_transform and data is not None else None

    def __call__(self, data: Mapping[Hashable, Any]) -> dict[Hashable, Any]:
        d = dict(data)
        first = next(self.key_iterator(d), None)
        self.randomize(None if first is None else tuple(d[first].shape[-2:]))
        for key in self.key_iterator(d):
            img = convert_to_tensor(d[key], track_meta=False)
            if self._box is not None:
                top, left, h, w = self._box
                img = img[..., top : top + h, left : left + w]
            d[key] = resize_frame(img, self.image_size)
        return d


class RandErasingd(RandomizableTransform, MapTransform):
    """Random erasing (Zhong et al., AAAI 2020) of channel-first images: one rectangle set to ``value``.

    The rectangle is drawn as ``torchvision.transforms.v2.RandomErasing`` draws it (area ``scale`` of the image,
    aspect ratio ``ratio`` log-uniform, up to 10 tries, else nothing is erased) from this transform's random state,
    and erased with ``torchvision.transforms.v2.functional.erase``.

    Args:
        keys: keys of the ``(C, H, W)`` images.
        prob: probability of erasing.
        scale: range of the erased area as a fraction of the image's.
        ratio: range of the rectangle's aspect ratio.
        value: fill value (0: black, like the capsule's vignette).
        allow_missing_keys: do not raise when a key is missing.
    """

    def __init__(
        self,
        keys: KeysCollection,
        prob: float = 0.5,
        scale: tuple[float, float] | Sequence[float] = (0.02, 0.33),
        ratio: tuple[float, float] | Sequence[float] = (0.3, 3.3),
        value: float = 0.0,
        allow_missing_keys: bool = False,
    ) -> None:
        MapTransform.__init__(self, keys, allow_missing_keys)
        RandomizableTransform.__init__(self, prob)
        self.scale = _pair(scale, "scale")
        self.ratio = _pair(ratio, "ratio", low=1e-6)
        self.value = float(value)
        self._box: tuple[int, int, int, int] | None = None

    def randomize(self, data: Any = None) -> None:
        super().randomize(None)
        self._box = None
        if not self._do_transform or data is None:
            return
        height, width = data
        log_ratio = (math.log(self.ratio[0]), math.log(self.ratio[1]))
        for _ in range(10):
            erase_area = height * width * self.R.uniform(self.scale[0], self.scale[1])
            aspect = math.exp(self.R.uniform(log_ratio[0], log_ratio[1]))
            h = round(math.sqrt(erase_area * aspect))
            w = round(math.sqrt(erase_area / aspect))
            if 0 < h < height and 0 < w < width:
                self._box = (int(self.R.randint(0, height - h + 1)), int(self.R.randint(0, width - w + 1)), h, w)
                return

    def __call__(self, data: Mapping[Hashable, Any]) -> dict[Hashable, Any]:
        d = dict(data)
        first = next(self.key_iterator(d), None)
        self.randomize(None if first is None else tuple(d[first].shape[-2:]))
        if self._box is None:
            return d
        top, left, h, w = self._box
        for key in self.key_iterator(d):
            img = convert_to_tensor(d[key], track_meta=False)
            fill = torch.tensor(self.value, dtype=img.dtype)
            d[key] = convert_to_dst_type(TF.erase(img, top, left, h, w, fill), d[key])[0]
        return d


def _check_output_dtype(output_dtype: str) -> None:
    if output_dtype not in _OUTPUT_DTYPES:
        raise ValueError(f"output_dtype must be one of {_OUTPUT_DTYPES}, got {output_dtype!r}")


def vce_load_transforms(image_size: int | None = 224, image_key: str = "image", max_pixels: int | None = None) -> list:
    """Decode a frame file to a ``uint8`` (3, H, W) RGB tensor resized to ``image_size`` (``None``: keep the size).

    Decoding is :class:`monai_vce.data.LoadVCEFramed` (checked PNG decoding, the antialiased ``uint8`` resize of
    :func:`monai_vce.data.frames.resize_frame`), so training, validation and inference see frames decoded and
    resized the same way. ``max_pixels`` is the largest accepted frame (default 4096 x 4096 pixels).
    """
    return [LoadVCEFramed(keys=image_key, image_size=image_size, max_pixels=max_pixels)]


def _label_to_tensor(label_key: str) -> EnsureTyped:
    # a list of 17 floats would collate into 17 tensors of shape (B,); a (17,) tensor collates into (B, 17)
    return EnsureTyped(
        keys=label_key, data_type="tensor", dtype=torch.float32, track_meta=False, allow_missing_keys=True
    )


def vce_val_transforms(
    image_size: int = 224,
    output_dtype: str = "uint8",
    image_key: str = "image",
    label_key: str = "label",
    max_pixels: int | None = None,
) -> Compose:
    """Deterministic pipeline for validation and inference: decode, resize, cast.

    Args:
        image_size: side of the square output image.
        output_dtype: ``"uint8"`` (values 0..255, converted to float on the device by
            :class:`monai_vce.data.VCEPrepareBatch`) or ``"float32"`` (values in [0, 1]).
        image_key: key of the image path.
        label_key: key of the 17 label values (converted to a float32 tensor; may be absent).
        max_pixels: largest accepted frame in pixels (default 4096 x 4096), checked before decoding (in a bundle:
            ``--preprocessing#max_pixels N``).

    Returns:
        A ``monai.transforms.Compose`` for datalist items.
    """
    _check_output_dtype(output_dtype)
    xforms = vce_load_transforms(image_size, image_key=image_key, max_pixels=max_pixels)
    if output_dtype == "float32":
        xforms.append(ScaleIntensityRanged(keys=image_key, a_min=0.0, a_max=255.0, b_min=0.0, b_max=1.0, clip=True))
    xforms.append(_label_to_tensor(label_key))
    return Compose(xforms)
