"""Test-time augmentation of frame classification: logits averaged over flips and right-angle rotations."""

from __future__ import annotations

import pytest
import torch
from monai.bundle import ConfigParser
from torch import nn

from monai_vce.engines import TTA_VIEWS, FrameInferer, FrameTTAInferer, tta_view

NUM_CLASSES = 17


class PooledNet(nn.Module):
    """Invariant to flips and rotations: a linear map of the global average pool."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(3, NUM_CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x.mean(dim=(-2, -1)))


class FlatNet(nn.Module):
    """Not invariant: a linear map of the flattened pixels."""

    def __init__(self, size: int = 8) -> None:
        super().__init__()
        self.fc = nn.Linear(3 * size * size, NUM_CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x.flatten(1))


@pytest.fixture
def images() -> torch.Tensor:
    return torch.rand(4, 3, 8, 8, generator=torch.Generator().manual_seed(0))


def test_views():
    x = torch.arange(6.0).view(1, 1, 2, 3)
    assert torch.equal(tta_view(x, "hflip")[0, 0, 0], torch.tensor([2.0, 1.0, 0.0]))
    assert torch.equal(tta_view(x, "vflip")[0, 0, 0], torch.tensor([3.0, 4.0, 5.0]))
    assert tta_view(x, "rot90").shape == (1, 1, 3, 2)
    assert torch.equal(tta_view(tta_view(x, "rot90"), "rot270"), x)
    assert torch.equal(tta_view(x, "rot180"), x.flip(-1).flip(-2))
    with pytest.raises(ValueError, match="'spin'"):
        tta_view(x, "spin")


@pytest.mark.parametrize("views_per_pass", [1, 2, 0])
def test_invariant_network_equals_plain(images, views_per_pass):
    torch.manual_seed(0)
    net = PooledNet().eval()
    with torch.no_grad():
        plain = FrameInferer()(images, net)
        tta = FrameTTAInferer(views_per_pass=views_per_pass)(images, net)
    assert tta.shape == plain.shape == (4, NUM_CLASSES) and tta.dtype == plain.dtype
    torch.testing.assert_close(tta, plain, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("views_per_pass", [1, 3, 0])
def test_mean_over_views(images, views_per_pass):
    torch.manual_seed(0)
    net = FlatNet().eval()
    with torch.no_grad():
        expected = torch.stack(
            [
                net(images),
                net(images.flip(-1)),
                net(images.flip(-2)),
                net(torch.rot90(images, 1, (-2, -1))),
                net(torch.rot90(images, 2, (-2, -1))),
                net(torch.rot90(images, 3, (-2, -1))),
            ]
        ).mean(0)
        out = FrameTTAInferer(views_per_pass=views_per_pass)(images, net)
    assert not torch.allclose(out, net(images).detach(), atol=1e-3)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-6)


def test_identity_only_equals_plain_and_uint8_is_scaled(images):
    torch.manual_seed(0)
    net = FlatNet().eval()
    frames = (images * 255).round().to(torch.uint8)
    with torch.no_grad():
        torch.testing.assert_close(FrameTTAInferer(views=("identity",))(images, net), net(images))
        torch.testing.assert_close(FrameTTAInferer(views=["identity"])(frames, net), FrameInferer()(frames, net))


def test_non_square_frames_and_half_precision_outputs():
    torch.manual_seed(0)
    net = PooledNet().eval()
    x = torch.rand(2, 3, 6, 10)
    with torch.no_grad():
        out = FrameTTAInferer(views_per_pass=0)(x, net)
        torch.testing.assert_close(out, net(x), rtol=1e-5, atol=1e-6)
        half = FrameTTAInferer(views=("identity", "hflip"))(x, lambda t: net(t).half())
    assert half.dtype == torch.float16 and half.shape == (2, NUM_CLASSES)


def test_bad_views():
    with pytest.raises(ValueError, match="'mirror'"):
        FrameTTAInferer(views=("identity", "mirror"))
    with pytest.raises(ValueError, match="repeated"):
        FrameTTAInferer(views=("hflip", "hflip"))
    with pytest.raises(ValueError, match="at least one"):
        FrameTTAInferer(views=())


def test_bundle_construction(images):
    parser = ConfigParser(
        {
            "inferer": {
                "_target_": "monai_vce.engines.FrameTTAInferer",
                "views": ["identity", "hflip", "vflip", "rot90", "rot180", "rot270"],
                "inferer": {"_target_": "monai_vce.engines.FrameInferer"},
            }
        }
    )
    inferer = parser.get_parsed_content("inferer")
    assert isinstance(inferer, FrameTTAInferer) and inferer.views == TTA_VIEWS
