"""A cheap per-frame signature computed in the loader: a small ``uint8`` grey thumbnail under ``"signature"``
(:class:`FrameSignatured`).
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from monai.config import KeysCollection
from monai.transforms import MapTransform

__all__ = ["SIGNATURE_KEY", "frame_signature", "FrameSignatured"]

#: Datalist / batch key of the frame signature.
SIGNATURE_KEY = "signature"

_GREY = torch.tensor([0.299, 0.587, 0.114])


def frame_signature(image: torch.Tensor | np.ndarray, size: int = 16) -> torch.Tensor:
    """Signature of one decoded frame: its ``size x size`` grey thumbnail, flattened, ``uint8``.

    Args:
        image: ``(3, H, W)`` RGB frame, ``uint8`` (0-255) or float in ``[0, 1]``.
        size: thumbnail side in pixels.

    Returns:
        ``torch.uint8`` tensor of shape ``(size * size,)``.
    """
    x = torch.as_tensor(image)
    if x.ndim != 3 or x.shape[0] != 3:
        raise ValueError(f"frame_signature: expected a (3, H, W) RGB frame, got shape {tuple(x.shape)}")
    scale = 1.0 if x.is_floating_point() else 1.0 / 255.0
    grey = torch.tensordot(_GREY.to(x.device), x.float() * scale, dims=1)
    thumb = F.adaptive_avg_pool2d(grey[None, None], size)[0, 0]
    return (thumb * 255.0).round_().clamp_(0, 255).to(torch.uint8).reshape(-1).cpu()


class FrameSignatured(MapTransform):
    """Dictionary transform adding the signature of a decoded frame (:func:`frame_signature`) to each frame dict.

    Put it after :class:`~monai_vce.data.LoadVCEFramed` in the loader's transform chain; the image is left as
    it is.

    Args:
        keys: key of the decoded frame, usually ``"image"``.
        signature_key: key the signature is written to.
        size: thumbnail side in pixels.
        allow_missing_keys: do not raise when the key is absent.

    Example::

        Compose([LoadVCEFramed(keys="image", image_size=64), FrameSignatured(keys="image")])(item)["signature"]
    """

    def __init__(
        self,
        keys: KeysCollection = "image",
        signature_key: str = SIGNATURE_KEY,
        size: int = 16,
        allow_missing_keys: bool = False,
    ) -> None:
        super().__init__(keys, allow_missing_keys)
        if int(size) < 1:
            raise ValueError(f"signature size must be >= 1, got {size!r}")
        self.signature_key = signature_key
        self.size = int(size)

    def __call__(self, data: Mapping[Hashable, Any]) -> dict[Hashable, Any]:
        d = dict(data)
        for key in self.key_iterator(d):
            d[self.signature_key] = frame_signature(d[key], self.size)
        return d
