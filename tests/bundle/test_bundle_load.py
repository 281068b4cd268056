"""``monai.bundle.load`` and MONAI's ``copy_model_state`` on the bundle's network: a checkpoint that does not fit
fails with the counts (MONAI copies the tensors that fit and only logs the rest); the documented call loads the
demo's weights exactly."""

from __future__ import annotations

import sys

import pytest
import torch
from bundle_helpers import BUNDLE

from monai_vce.networks import DiffAttnCLIPClassifier

TINY = {"backbone": "vce-tiny-vit-64", "pretrained": False, "image_size": 64}


@pytest.fixture
def demo_weights(tmp_path):
    """A ``model.pt`` of the demo's network (the tiny backbone at 64 px, no contrastive path), and the network."""
    torch.manual_seed(0)
    net = DiffAttnCLIPClassifier(**TINY, contrastive=False).eval()
    path = tmp_path / "model.pt"
    torch.save(net.state_dict(), path)
    return path, net


@pytest.fixture(autouse=True)
def _excepthook(monkeypatch):
    monkeypatch.setattr(sys, "excepthook", sys.excepthook)  # the configs' initialize sets its own


@pytest.mark.parametrize("workflow_type", ["train", "inference"])
def test_load_with_a_checkpoint_of_another_size_fails_with_the_counts(demo_weights, workflow_type):
    from monai.bundle import load

    path, _ = demo_weights
    # the configs' default network (BiomedCLIP's size): the demo's tensors fit almost none of it
    with pytest.raises(ValueError, match=r"only \d+ of \d+ tensors of the state dict come from the checkpoint"):
        load(name=BUNDLE.name, bundle_dir=str(BUNDLE.parent), model_file=str(path), workflow_type=workflow_type)


def test_documented_load_of_the_demo_model_is_exact(demo_weights):
    from monai.bundle import load

    path, net = demo_weights
    model = load(
        name=BUNDLE.name,
        bundle_dir=str(BUNDLE.parent),
        model_file=str(path),
        workflow_type="inference",
        net_override={"backbone": "vce-tiny-vit-64", "image_size": 64},
        device="cpu",
    ).eval()
    x = torch.rand(2, 3, 64, 64)
    with torch.no_grad():
        assert torch.equal(model(x), net(x))


def test_copy_model_state_partial_fails_and_strict_false_allows_an_intended_partial_load(demo_weights):
    from monai.networks.utils import copy_model_state

    _, net = demo_weights
    other = DiffAttnCLIPClassifier(**TINY, contrastive=False, num_classes=5)  # another head: 2 tensors differ
    with pytest.raises(ValueError, match=r"kept their initial values"):
        copy_model_state(other, net)
    state, updated, unchanged = copy_model_state(other, net, inplace=False)
    assert unchanged and updated
    other.load_state_dict(state, strict=False)  # intended: a new head on the trained backbone
    # a full checkpoint, or the network's own state, loads as before
    same = DiffAttnCLIPClassifier(**TINY, contrastive=False)
    same.load_state_dict(net.state_dict())
    copy_model_state(same, net)
