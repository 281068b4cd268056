"""The bundle's inferer: MONAI's ``SimpleInferer`` for ``uint8`` frames."""

from __future__ import annotations

from typing import Any

import torch
from monai.inferers import SimpleInferer

__all__ = ["FrameInferer"]


class FrameInferer(SimpleInferer):
    """MONAI's ``SimpleInferer`` that also accepts ``uint8`` frames, scaling them to ``[0, 1]`` on their device.

    The bundle's frame pipeline keeps frames ``uint8`` until they reach the device (a quarter of the bytes);
    the bundle's engines convert them in ``prepare_batch``, but applications that run the bundle's
    ``preprocessing`` and ``inferer`` themselves (MONAI Label's ``BundleInferTask``) hand the ``uint8`` batch
    straight to the inferer, so the conversion happens here too. Float inputs pass unchanged.
    """

    def __call__(self, inputs: Any, network: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(inputs, torch.Tensor) and not inputs.is_floating_point():
            inputs = inputs.float().div_(255.0)
        return super().__call__(inputs, network, *args, **kwargs)
