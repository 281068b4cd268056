"""Checked decoding of capsule endoscopy frames (PNG, JPEG) to ``uint8`` (3, S, S) tensors, in the loader workers.

Frames stay ``uint8`` until the device, where :class:`VCEPrepareBatch` makes them float32 in [0, 1]. Bad frames
raise a ``ValueError`` naming the file.
"""

from __future__ import annotations

import numbers
import os
import warnings
from collections.abc import Hashable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from monai.config import KeysCollection
from monai.engines.utils import PrepareBatch
from monai.transforms import MapTransform, Transform
from monai.utils import ImageMetaKey
from torchvision.transforms import InterpolationMode
from torchvision.transforms.v2 import functional as TF

from monai_vce.data.frame_checks import JPEG_SIGNATURE, PNG_SIGNATURE, check_png, decode_rgb, read_frame_bytes
from monai_vce.utils import safe_text, short_repr

__all__ = [
    "check_image_size",
    "load_vce_frame",
    "resize_frame",
    "LoadVCEFrame",
    "LoadVCEFramed",
    "VCEPrepareBatch",
    "reset_frame_warnings",
]

# extensions of monai_vce.data.video.VIDEO_EXTENSIONS (not imported: that module imports this one)
_VIDEO_EXTENSIONS = (".mp4", ".m4v", ".mov", ".avi", ".mkv", ".webm", ".mpg", ".mpeg", ".wmv", ".ogv")


# largest side of a resized frame (a config's image_size): beyond it one frame alone would take gigabytes
_MAX_SIDE = 8192

# kinds of conversion already reported in this process: each kind warns once
_WARNED: set[str] = set()


def reset_frame_warnings() -> None:
    """Forget which conversions were reported, so that the next frame of each kind warns again."""
    _WARNED.clear()


def _warn_once(kind: str, message: str) -> None:
    if kind not in _WARNED:
        _WARNED.add(kind)
        warnings.warn(message, UserWarning, stacklevel=3)


def _read_bytes(path: str) -> bytes:
    return read_frame_bytes(path)


def _to_uint8(img: torch.Tensor) -> torch.Tensor:
    if img.dtype == torch.uint8:
        return img
    # 16-bit: round to the nearest 8-bit level (65535 -> 255)
    return ((img.to(torch.int32) * 255 + 32767) // 65535).to(torch.uint8)


def load_vce_frame(
    path: str | os.PathLike,
    image_size: int | Sequence[int] | None = 224,
    allow_jpeg: bool = True,
    antialias: bool = True,
    max_pixels: int | None = None,
) -> torch.Tensor:
    """Decode one frame file to an 8-bit RGB ``uint8`` tensor ``(3, H, W)``, resized to ``image_size``.

    Args:
        path: the frame file (PNG).
        image_size: output size, an int for a square ``(S, S)`` frame or ``(H, W)``; ``None`` keeps the
            decoded size.
        allow_jpeg: decode JPEG content saved under a ``.png`` name (warning once per process) instead of
            raising.
        antialias: antialiased bilinear resize (matters when shrinking 512 px frames to 224 px).
        max_pixels: largest accepted frame in pixels (default
            :data:`~monai_vce.data.frame_checks.MAX_FRAME_PIXELS`, 4096 x 4096), checked from the header before
            decoding.

    Returns:
        ``torch.uint8`` tensor of shape ``(3, H, W)``, contiguous.

    Raises:
        FileNotFoundError: the file does not exist (or is a broken link).
        ValueError: the file is empty, truncated, corrupted (a PNG chunk whose CRC does not match), too large,
            not a PNG (or a JPEG with ``allow_jpeg=False``); the message names the file.
    """
    path = os.fspath(path)
    if os.path.splitext(path)[1].lower() in _VIDEO_EXTENSIONS:
        raise ValueError(
            f"{safe_text(path)} is a video file: its frames are decoded once into a frame cache and served from there "
            f"(monai_vce.data.VideoFrameDataset, or FrameCacheDataset), not loaded one by one"
        )
    data = _read_bytes(path)
    if not data:
        raise ValueError(f"empty frame file (0 bytes): {safe_text(path)}")
    if data.startswith(PNG_SIGNATURE):
        # the whole file is checked (structure, every chunk's CRC, pixel count) before a decoder sees it
        depth, color = check_png(data, path, max_pixels)
        if depth == 16:
            _warn_once(
                "16-bit", f"16-bit PNG frame {safe_text(path)}: converting to 8-bit RGB (reported once per process)"
            )
        if color != "rgb":
            _warn_once(
                color, f"{color} PNG frame {safe_text(path)}: converting to 8-bit RGB (reported once per process)"
            )
        rgb = decode_rgb(data, path, "png", max_pixels)
    elif data.startswith(JPEG_SIGNATURE):
        if not allow_jpeg:
            raise ValueError(
                f"frame {safe_text(path)} is a JPEG file, not a PNG (pass allow_jpeg=True to decode it anyway)"
            )
        _warn_once(
            "jpeg",
            f"frame {safe_text(path)} holds JPEG data under a PNG name: decoding it as JPEG (reported once per process)",
        )
        rgb = decode_rgb(data, path, "jpeg", max_pixels)
    else:
        # the content itself is never echoed: a datalist may point anywhere
        raise ValueError(f"frame {safe_text(path)} is not a PNG file (its content is neither PNG nor JPEG)")
    img = torch.from_numpy(rgb).permute(2, 0, 1)
    return resize_frame(_to_uint8(img), image_size, antialias)


def check_image_size(image_size: Any, name: str = "image_size") -> list[int]:
    """``image_size`` as ``[H, W]``: an int (a square) or two ints, each in ``[1, 8192]`` (never a bool, a float
    or a string), checked before anything of that size is allocated.

    Raises:
        ValueError: one line naming the setting (``image_size must be one or two sides in [1, 8192] pixels, got
            100000``).
    """
    sides = [image_size] if isinstance(image_size, numbers.Integral) else image_size
    if (
        not isinstance(sides, Sequence)
        or isinstance(sides, (str, bytes))
        or len(sides) not in (1, 2)
        or not all(
            isinstance(s, numbers.Integral) and not isinstance(s, bool) and 1 <= int(s) <= _MAX_SIDE for s in sides
        )
    ):
        raise ValueError(f"{name} must be one or two sides in [1, {_MAX_SIDE}] pixels, got {short_repr(image_size)}")
    return [int(s) for s in sides] * (3 - len(sides))


def resize_frame(img: torch.Tensor, image_size: int | Sequence[int] | None, antialias: bool = True) -> torch.Tensor:
    """Resize a channel-first frame (``uint8`` or float) with bilinear, antialiased interpolation.

    The single resize of the frame pipelines: decoding for validation and inference, and the random resized crop
    of training, so that a frame cropped to its full extent is resized exactly as in validation.

    Args:
        img: ``(C, H, W)`` tensor; ``uint8`` stays ``uint8`` (rounded by torchvision's kernel).
        image_size: output size, an int for a square ``(S, S)`` frame or ``(H, W)``; ``None`` keeps the size.
        antialias: antialiased bilinear resize (matters when shrinking 512 px frames to 224 px).

    Returns:
        The resized frame, contiguous (the input itself when the size already matches).
    """
    if image_size is not None:
        size = check_image_size(image_size)
        if list(img.shape[-2:]) != size:
            img = TF.resize(img, size, interpolation=InterpolationMode.BILINEAR, antialias=antialias)
    return img.contiguous()


class LoadVCEFrame(Transform):
    """Array transform: frame path -> ``uint8`` RGB tensor ``(3, S, S)``; see :func:`load_vce_frame`.

    Args:
        image_size: output size (int or ``(H, W)``); ``None`` keeps the decoded size.
        allow_jpeg: decode JPEG content under a ``.png`` name with a warning instead of raising.
        antialias: antialiased bilinear resize.
        max_pixels: largest accepted frame in pixels (default 4096 x 4096), checked before decoding.
    """

    def __init__(
        self,
        image_size: int | Sequence[int] | None = 224,
        allow_jpeg: bool = True,
        antialias: bool = True,
        max_pixels: int | None = None,
    ):
        self.image_size = image_size
        self.allow_jpeg = allow_jpeg
        self.antialias = antialias
        self.max_pixels = max_pixels

    def __call__(self, path: str | os.PathLike | torch.Tensor | np.ndarray) -> torch.Tensor:
        if isinstance(path, (torch.Tensor, np.ndarray)):
            # already decoded (e.g. read from a FrameCacheDataset): only the size is brought in line
            return resize_frame(torch.as_tensor(path), self.image_size, self.antialias)
        return load_vce_frame(
            path, self.image_size, allow_jpeg=self.allow_jpeg, antialias=self.antialias, max_pixels=self.max_pixels
        )


class LoadVCEFramed(MapTransform):
    """Dictionary transform: replaces each frame path under ``keys`` with its decoded, resized ``uint8`` tensor, and
    records the path as ``filename_or_obj`` (the first key's, unless the item has one), which MONAI's savers read.

    A value that is already an image (tensor or array ``(3, H, W)``, e.g. from
    :class:`~monai_vce.data.FrameCacheDataset`) is only resized, so the same pipeline runs on cached frames.

    Run it first in the DataLoader workers' transform chain; it returns a plain ``torch.uint8`` tensor of shape
    ``(3, S, S)`` (no ``MetaTensor``: nothing downstream needs spatial metadata of a video frame and plain
    tensors collate faster). Convert to float on the device (:class:`VCEPrepareBatch`).

    Args:
        keys: keys of the frame paths, usually ``"image"``.
        image_size: output size (int or ``(H, W)``); ``None`` keeps the decoded size.
        allow_jpeg: decode JPEG content under a ``.png`` name with a warning instead of raising.
        antialias: antialiased bilinear resize.
        max_pixels: largest accepted frame in pixels (default 4096 x 4096), checked before decoding.
        allow_missing_keys: do not raise when a key is absent.

    Example::

        LoadVCEFramed(keys="image", image_size=224)({"image": "frames/v1/frame_000001.PNG"})["image"].shape
        # torch.Size([3, 224, 224]), torch.uint8
    """

    def __init__(
        self,
        keys: KeysCollection = "image",
        image_size: int | Sequence[int] | None = 224,
        allow_jpeg: bool = True,
        antialias: bool = True,
        allow_missing_keys: bool = False,
        max_pixels: int | None = None,
    ) -> None:
        super().__init__(keys, allow_missing_keys)
        self.loader = LoadVCEFrame(
            image_size=image_size, allow_jpeg=allow_jpeg, antialias=antialias, max_pixels=max_pixels
        )

    def __call__(self, data: Mapping[Hashable, Any]) -> dict[Hashable, Any]:
        d = dict(data)
        for key in self.key_iterator(d):
            if isinstance(d[key], (str, os.PathLike)):
                # the frame's file, as MONAI's savers read it (ClassificationSaver: one CSV row per frame)
                d.setdefault(ImageMetaKey.FILENAME_OR_OBJ, os.fspath(d[key]))
            d[key] = self.loader(d[key])
        return d


class VCEPrepareBatch(PrepareBatch):
    """``prepare_batch`` for MONAI engines: moves ``uint8`` frames to the device, *then* scales to ``[0, 1]``.

    Frames travel host -> device as ``uint8`` (with ``non_blocking=True`` from pinned memory) and become
    ``float32`` only on the device, so the bus and the loader carry a quarter of the bytes. Float inputs
    pass through unchanged. Returns ``(image, label)``; ``label`` is ``None`` when the batch has none
    (inference on unlabeled frames).

    Args:
        image_key: batch key of the frames.
        label_key: batch key of the targets.
        channels_last: return the image in ``torch.channels_last`` memory format (faster convolutions/patch
            embedding on some devices).
    """

    def __init__(self, image_key: str = "image", label_key: str = "label", channels_last: bool = False) -> None:
        self.image_key = image_key
        self.label_key = label_key
        self.channels_last = channels_last

    def __call__(
        self,
        batchdata: Mapping[str, Any],
        device: str | torch.device | None = None,
        non_blocking: bool = False,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        image = torch.as_tensor(batchdata[self.image_key]).to(device=device, non_blocking=non_blocking)
        if not image.is_floating_point():
            image = image.float().div_(255.0)
        if self.channels_last and image.ndim == 4:
            image = image.contiguous(memory_format=torch.channels_last)
        label = batchdata.get(self.label_key)
        if isinstance(label, (list, tuple)) and label and isinstance(label[0], torch.Tensor):
            # default collation of per-item lists of floats gives one (B,) tensor per class
            label = torch.stack(list(label), dim=-1)
        if label is not None:
            label = torch.as_tensor(label).to(device=device, non_blocking=non_blocking)
        return image, label
