"""Frame pipelines for capsule endoscopy: decoding, resizing, strong augmentation, as MONAI dictionary transforms.

The pipelines work on datalist items (``{"image": path, "label": [17 floats], "video_id", "frame_index",
"frame_number", ...}``); keys other than ``image`` and ``label`` pass through untouched, so the batch
keeps ``video_id`` (a list of strings) and ``frame_index`` / ``frame_number`` (int64 tensors).

By default the image leaves the pipeline as ``uint8`` (3, H, W): a quarter of the bytes of float32 to
collate, pin and copy to the device, where :class:`monai_vce.data.VCEPrepareBatch` turns it into float
in [0, 1] (the network's input contract). ``output_dtype="float32"`` gives float images in [0, 1] instead,
for consumers that feed the network directly (MONAI Label, MONAI Deploy, TorchScript).
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping
from typing import Any

import numpy as np
import torch
from monai.config import KeysCollection
from monai.transforms import (
    Compose,
    EnsureTyped,
    MapTransform,
    RandAdjustContrastd,
    RandFlipd,
    RandGaussianNoised,
    RandGaussianSmoothd,
    RandomizableTransform,
    RandRotate90d,
    RandRotated,
    RandScaleCropd,
    RandScaleIntensityd,
    RandScaleIntensityFixedMeand,
    RandShiftIntensityd,
    Resized,
    ScaleIntensityRanged,
)
from monai.utils import convert_to_dst_type, convert_to_tensor

from monai_vce.data.frames import LoadVCEFramed

__all__ = ["RandHueSaturationd", "vce_load_transforms", "vce_train_transforms", "vce_val_transforms"]

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


def _check_output_dtype(output_dtype: str) -> None:
    if output_dtype not in _OUTPUT_DTYPES:
        raise ValueError(f"output_dtype must be one of {_OUTPUT_DTYPES}, got {output_dtype!r}")


def vce_load_transforms(image_size: int | None = 224, image_key: str = "image") -> list:
    """Decode a frame file to a ``uint8`` (3, H, W) RGB tensor resized to ``image_size`` (``None``: keep the size).

    Decoding is :class:`monai_vce.data.LoadVCEFramed` (checked PNG decoding, antialiased ``uint8`` resize),
    so training, validation and inference see frames decoded the same way.
    """
    return [LoadVCEFramed(keys=image_key, image_size=image_size)]


def _finalise(image_key: str, label_key: str, output_dtype: str, scale: float) -> list:
    """Clip to the valid range and cast; ``scale`` is the value range of the incoming image (1 or 255)."""
    if output_dtype == "uint8":
        # map [0, scale] to [0.5, 255.5] then truncate on the cast: rounding to the nearest integer
        last = ScaleIntensityRanged(
            keys=image_key, a_min=0.0, a_max=scale, b_min=0.5, b_max=255.5, clip=True, dtype=np.uint8
        )
    else:
        last = ScaleIntensityRanged(keys=image_key, a_min=0.0, a_max=scale, b_min=0.0, b_max=1.0, clip=True)
    return [
        last,
        # plain tensors: they collate faster than MetaTensors and the frame's identity travels in its own keys
        EnsureTyped(keys=image_key, data_type="tensor", track_meta=False),
        _label_to_tensor(label_key),
    ]


def _label_to_tensor(label_key: str) -> EnsureTyped:
    # a list of 17 floats would collate into 17 tensors of shape (B,); a (17,) tensor collates into (B, 17)
    return EnsureTyped(
        keys=label_key, data_type="tensor", dtype=torch.float32, track_meta=False, allow_missing_keys=True
    )


def vce_val_transforms(
    image_size: int = 224, output_dtype: str = "uint8", image_key: str = "image", label_key: str = "label"
) -> Compose:
    """Deterministic pipeline for validation and inference: decode, resize, cast.

    Args:
        image_size: side of the square output image.
        output_dtype: ``"uint8"`` (values 0..255, converted to float on the device by
            :class:`monai_vce.data.VCEPrepareBatch`) or ``"float32"`` (values in [0, 1]).
        image_key: key of the image path.
        label_key: key of the 17 label values (converted to a float32 tensor; may be absent).

    Returns:
        A ``monai.transforms.Compose`` for datalist items.
    """
    _check_output_dtype(output_dtype)
    xforms = vce_load_transforms(image_size, image_key=image_key)
    if output_dtype == "float32":
        xforms.append(ScaleIntensityRanged(keys=image_key, a_min=0.0, a_max=255.0, b_min=0.0, b_max=1.0, clip=True))
    xforms.append(_label_to_tensor(label_key))
    return Compose(xforms)


def vce_train_transforms(
    image_size: int = 224,
    output_dtype: str = "uint8",
    crop_scale: tuple[float, float] = (0.7, 1.0),
    flip_prob: float = 0.5,
    rot90_prob: float = 0.5,
    rotate_prob: float = 0.5,
    brightness: float = 0.2,
    contrast: float = 0.2,
    gamma: tuple[float, float] = (0.8, 1.25),
    shift: float = 0.05,
    hue: float = 0.03,
    saturation: float = 0.2,
    color_prob: float = 0.5,
    blur_prob: float = 0.2,
    blur_sigma: tuple[float, float] = (0.1, 1.0),
    noise_prob: float = 0.2,
    noise_std: float = 0.02,
    image_key: str = "image",
    label_key: str = "label",
) -> Compose:
    """Strong augmentation for capsule frames (orientation is arbitrary inside the capsule).

    In order: decode; random resized crop (``RandScaleCropd`` with each side in ``crop_scale`` of the frame,
    independently, so the aspect ratio varies too, then ``Resized`` to ``image_size``); scale to [0, 1];
    flips along both axes, 90-degree rotations and a free rotation in [-pi, pi] (corners filled with black,
    like the capsule's own vignette); brightness (``RandScaleIntensityd``), contrast about the mean
    (``RandScaleIntensityFixedMeand``), gamma (``RandAdjustContrastd``), brightness shift
    (``RandShiftIntensityd``), hue and saturation (:class:`RandHueSaturationd`); Gaussian blur and noise;
    clip and cast. Call ``set_random_state(seed)`` on the result for a reproducible stream.

    Args:
        image_size: side of the square output image.
        output_dtype: ``"uint8"`` or ``"float32"`` (see :func:`vce_val_transforms`).
        crop_scale: range of the crop side as a fraction of the frame side.
        flip_prob: probability of each of the two flips.
        rot90_prob: probability of a rotation by 90, 180 or 270 degrees.
        rotate_prob: probability of a free rotation.
        brightness: multiplicative brightness jitter ``1 +- brightness``.
        contrast: contrast jitter about the image mean ``1 +- contrast``.
        gamma: gamma range.
        shift: additive brightness jitter ``+- shift`` (images in [0, 1]).
        hue: hue rotation ``+- hue`` turns.
        saturation: saturation jitter ``1 +- saturation``.
        color_prob: probability of each colour/intensity jitter.
        blur_prob: probability of a Gaussian blur.
        blur_sigma: blur sigma range in pixels.
        noise_prob: probability of Gaussian noise.
        noise_std: maximum noise standard deviation (drawn in [0, noise_std]).
        image_key: key of the image path.
        label_key: key of the label values.

    Returns:
        A ``monai.transforms.Compose`` for datalist items.
    """
    _check_output_dtype(output_dtype)
    k = image_key
    xforms = vce_load_transforms(None, image_key=k)
    xforms += [
        # crop from the full-size frame, then one resize: sharper than cropping an already resized frame
        RandScaleCropd(keys=k, roi_scale=crop_scale[0], max_roi_scale=crop_scale[1], random_size=True),
        Resized(keys=k, spatial_size=(image_size, image_size), mode="bilinear", align_corners=False),
        ScaleIntensityRanged(keys=k, a_min=0.0, a_max=255.0, b_min=0.0, b_max=1.0, clip=True),
        RandFlipd(keys=k, prob=flip_prob, spatial_axis=0),
        RandFlipd(keys=k, prob=flip_prob, spatial_axis=1),
        RandRotate90d(keys=k, prob=rot90_prob, max_k=3),
        RandRotated(keys=k, range_x=math.pi, prob=rotate_prob, keep_size=True, padding_mode="zeros"),
        RandScaleIntensityd(keys=k, factors=brightness, prob=color_prob),
        RandScaleIntensityFixedMeand(keys=k, factors=contrast, prob=color_prob),
        RandAdjustContrastd(keys=k, gamma=gamma, prob=color_prob),
        RandShiftIntensityd(keys=k, offsets=shift, prob=color_prob),
        RandHueSaturationd(keys=k, hue=hue, saturation=saturation, prob=color_prob),
        RandGaussianSmoothd(keys=k, sigma_x=blur_sigma, sigma_y=blur_sigma, prob=blur_prob),
        RandGaussianNoised(keys=k, std=noise_std, prob=noise_prob),
    ]
    xforms += _finalise(k, label_key, output_dtype, 1.0)
    return Compose(xforms)
