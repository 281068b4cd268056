"""Fast, checked decoding of capsule endoscopy frames (PNG) to small ``uint8`` tensors.

A capsule exam is 50,000-130,000 frames; the loader must keep an accelerator fed, so each frame is decoded
and resized *in the DataLoader worker*, in ``uint8``, and crosses the bus as ``uint8`` (4x fewer bytes than
``float32``). The conversion to float in ``[0, 1]`` (``/ 255``) happens on the device, in the engine's
``prepare_batch`` (:class:`VCEPrepareBatch`) or in the network; no CPU transform after the loader touches
floats.

**Frame dtype at each stage** (the one place this is stated; the rest of the package and the bundle refer here):

====================================================  =====================================================
stage                                                 frame
====================================================  =====================================================
decoding + resize (``preprocessing``, loader workers)  ``uint8`` (3, S, S), values 0-255
host -> device                                        ``uint8`` batch (B, 3, S, S)
``prepare_batch`` (:class:`VCEPrepareBatch`),         ``float32`` in [0, 1] (``/ 255`` on the device); float
``inferer`` (``monai_vce.engines.FrameInferer``)      input passes unchanged
network (``DiffAttnCLIPClassifier``)                   accepts both ``uint8`` (scaled inside) and float in
                                                      [0, 1]; normalises with the CLIP mean/std itself
bundle metadata (``network_data_format.inputs``)      ``uint8``, [0, 255]: what ``preprocessing`` emits and
                                                      what MONAI Label / Deploy hand the network
====================================================  =====================================================

A replaced ``network_def`` receives ``float32`` in [0, 1] from the bundle's engines (``prepare_batch``); only
applications that call the network on the ``preprocessing`` output themselves hand it ``uint8``.

Decoding uses ``torchvision.io.decode_png`` and the resize :func:`resize_frame`
(``torchvision.transforms.v2.functional.resize`` on the ``uint8`` tensor, bilinear, antialiased): the one resize of
training (after the random crop, :class:`monai_vce.data.transforms.RandResizedCropd`), validation and inference, so
that the network sees frames resized the same way in all three. Measured on one core of the project's CPU machine, per frame
to 224 px: 1.4 ms for a 336 px PNG (PIL decode + the same resize 1.6 ms, PIL decode and resize 2.0 ms) and
3.0-3.5 ms for a 512 px PNG (3.8-3.9 ms, 4.5 ms). ``Image.draft`` does not help: it only applies to JPEG.
Where torchvision's decoders are unavailable (they are deprecated in favour of torchcodec), PIL takes over.

Input handling (every frame is resized to ``image_size``, so frames of different sizes within one video
are fine and batch together):

- grayscale, grayscale + alpha, palette, RGBA and 16-bit PNGs are converted to 8-bit RGB (alpha is
  dropped, 16-bit values are scaled to 8 bit); the first frame of each kind in a process triggers one
  warning naming the file, later ones convert silently.
- a JPEG renamed ``.png`` is decoded as JPEG with one warning per process (``allow_jpeg=True``, the default:
  the content is a valid image, only the name is wrong) or rejected with a ``ValueError`` naming the file
  (``allow_jpeg=False``).
- a zero-byte file, a truncated or corrupted PNG, or content that is neither PNG nor JPEG raises a
  ``ValueError`` naming the file; a missing file raises ``FileNotFoundError`` naming it.
"""

from __future__ import annotations

import os
import re
import warnings
from collections.abc import Hashable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from monai.config import KeysCollection
from monai.engines.utils import PrepareBatch
from monai.transforms import MapTransform, Transform
from torchvision.transforms import InterpolationMode
from torchvision.transforms.v2 import functional as TF

__all__ = ["load_vce_frame", "resize_frame", "LoadVCEFrame", "LoadVCEFramed", "VCEPrepareBatch", "reset_frame_warnings"]

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
JPEG_SIGNATURE = b"\xff\xd8\xff"

# extensions of monai_vce.data.video.VIDEO_EXTENSIONS (not imported: that module imports this one)
_VIDEO_EXTENSIONS = (".mp4", ".m4v", ".mov", ".avi", ".mkv", ".webm", ".mpg", ".mpeg", ".wmv", ".ogv")

# PNG IHDR colour types (PNG spec, section 11.2.2)
_COLOR_TYPES = {0: "grayscale", 2: "rgb", 3: "palette", 4: "grayscale+alpha", 6: "rgba"}


def _decode_pil(raw: torch.Tensor, fmt: str) -> torch.Tensor:
    """PIL decoding to RGB ``(3, H, W)`` (``uint16`` for 16-bit grayscale); raises ``RuntimeError`` on bad data."""
    import io

    from PIL import Image

    try:
        im = Image.open(io.BytesIO(raw.numpy().tobytes()))
        im.load()
    except (OSError, SyntaxError, ValueError) as e:
        raise RuntimeError(str(e)) from None
    if im.mode.startswith("I"):  # 16-bit grayscale: PIL's own RGB conversion clips instead of scaling
        a = torch.from_numpy(np.asarray(im, dtype=np.int32))
        return a.expand(3, *a.shape).to(torch.uint16).contiguous()
    return torch.from_numpy(np.array(im.convert("RGB"))).permute(2, 0, 1).contiguous()


try:  # fastest path; torchvision marks its decoders deprecated in favour of torchcodec, PIL takes over then
    from torchvision.io import ImageReadMode, decode_jpeg, decode_png

    def _decode(raw: torch.Tensor, fmt: str) -> torch.Tensor:
        return (decode_png if fmt == "png" else decode_jpeg)(raw, mode=ImageReadMode.RGB)

except ImportError:  # pragma: no cover - depends on the torchvision build
    _decode = _decode_pil


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
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        raise FileNotFoundError(f"frame file not found: {path}") from None
    except IsADirectoryError:
        raise ValueError(f"frame path is a folder, not a PNG file: {path}") from None


def _png_kind(data: bytes, path: str) -> tuple[int, str]:
    """Bit depth and colour type name from the IHDR chunk (always the first chunk of a PNG)."""
    if len(data) < 33 or data[12:16] != b"IHDR":
        raise ValueError(f"truncated or corrupted PNG frame (no complete IHDR header, {len(data)} bytes): {path}")
    return data[24], _COLOR_TYPES.get(data[25], f"colour type {data[25]}")


def _reason(e: Exception) -> str:
    """The decoder's message without the C++ source location torchvision puts in front of it."""
    text = str(e).strip()
    return re.sub(r"^.*?\.(?:cpp|h):\d+,\s*", "", text.splitlines()[-1]) if text else type(e).__name__


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
) -> torch.Tensor:
    """Decode one frame file to an 8-bit RGB ``uint8`` tensor ``(3, H, W)``, resized to ``image_size``.

    Args:
        path: the frame file (PNG).
        image_size: output size, an int for a square ``(S, S)`` frame or ``(H, W)``; ``None`` keeps the
            decoded size.
        allow_jpeg: decode JPEG content saved under a ``.png`` name (warning once per process) instead of
            raising.
        antialias: antialiased bilinear resize (matters when shrinking 512 px frames to 224 px).

    Returns:
        ``torch.uint8`` tensor of shape ``(3, H, W)``, contiguous.

    Raises:
        FileNotFoundError: the file does not exist.
        ValueError: the file is empty, truncated, corrupted, not a PNG (or a JPEG with ``allow_jpeg=False``);
            the message names the file.
    """
    path = os.fspath(path)
    if os.path.splitext(path)[1].lower() in _VIDEO_EXTENSIONS:
        raise ValueError(
            f"{path} is a video file: its frames are decoded once into a frame cache and served from there "
            f"(monai_vce.data.VideoFrameDataset, or FrameCacheDataset), not loaded one by one"
        )
    data = _read_bytes(path)
    if not data:
        raise ValueError(f"empty frame file (0 bytes): {path}")
    raw = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    if data.startswith(PNG_SIGNATURE):
        depth, color = _png_kind(data, path)
        if depth == 16:
            _warn_once("16-bit", f"16-bit PNG frame {path}: converting to 8-bit RGB (reported once per process)")
        if color != "rgb":
            _warn_once(color, f"{color} PNG frame {path}: converting to 8-bit RGB (reported once per process)")
        try:
            img = _decode(raw, "png")
        except RuntimeError as e:
            raise ValueError(f"truncated or corrupted PNG frame {path}: {_reason(e)}") from None
    elif data.startswith(JPEG_SIGNATURE):
        if not allow_jpeg:
            raise ValueError(f"frame {path} is a JPEG file, not a PNG (pass allow_jpeg=True to decode it anyway)")
        _warn_once(
            "jpeg", f"frame {path} holds JPEG data under a PNG name: decoding it as JPEG (reported once per process)"
        )
        try:
            img = _decode(raw, "jpeg")
        except RuntimeError as e:
            raise ValueError(f"truncated or corrupted JPEG frame {path}: {_reason(e)}") from None
    else:
        raise ValueError(f"frame {path} is not a PNG file (first bytes {data[:8]!r})")
    return resize_frame(_to_uint8(img), image_size, antialias)


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
        size = [int(image_size)] * 2 if isinstance(image_size, int) else [int(s) for s in image_size]
        if list(img.shape[-2:]) != size:
            img = TF.resize(img, size, interpolation=InterpolationMode.BILINEAR, antialias=antialias)
    return img.contiguous()


class LoadVCEFrame(Transform):
    """Array transform: frame path -> ``uint8`` RGB tensor ``(3, S, S)``; see :func:`load_vce_frame`.

    Args:
        image_size: output size (int or ``(H, W)``); ``None`` keeps the decoded size.
        allow_jpeg: decode JPEG content under a ``.png`` name with a warning instead of raising.
        antialias: antialiased bilinear resize.
    """

    def __init__(self, image_size: int | Sequence[int] | None = 224, allow_jpeg: bool = True, antialias: bool = True):
        self.image_size = image_size
        self.allow_jpeg = allow_jpeg
        self.antialias = antialias

    def __call__(self, path: str | os.PathLike | torch.Tensor | np.ndarray) -> torch.Tensor:
        if isinstance(path, (torch.Tensor, np.ndarray)):
            # already decoded (e.g. read from a FrameCacheDataset): only the size is brought in line
            return resize_frame(torch.as_tensor(path), self.image_size, self.antialias)
        return load_vce_frame(path, self.image_size, allow_jpeg=self.allow_jpeg, antialias=self.antialias)


class LoadVCEFramed(MapTransform):
    """Dictionary transform: replaces each frame path under ``keys`` with its decoded, resized ``uint8`` tensor.

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
    ) -> None:
        super().__init__(keys, allow_missing_keys)
        self.loader = LoadVCEFrame(image_size=image_size, allow_jpeg=allow_jpeg, antialias=antialias)

    def __call__(self, data: Mapping[Hashable, Any]) -> dict[Hashable, Any]:
        d = dict(data)
        for key in self.key_iterator(d):
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
