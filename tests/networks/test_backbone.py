"""Backbone loading: tiny open_clip model through local-dir, checkpoint files and random init; offline hub errors."""

from __future__ import annotations

import time

import pytest
import torch

open_clip = pytest.importorskip("open_clip")

from monai_vce.networks import backbone as bb  # noqa: E402


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny_backbone")
    bb.save_tiny_local_dir(root / "local")
    bb.save_tiny_local_dir(root / "local_st", safetensors=True)
    bb.save_tiny_checkpoint(root / "tiny.bin")
    bb.save_tiny_checkpoint(root / "tiny.safetensors")
    return root


def _open_clip_reference(tiny) -> torch.nn.Module:
    # open_clip's own loader is the reference: same folder, full model, strict load
    return open_clip.create_model(f"local-dir:{tiny / 'local'}").eval()


def test_registration():
    assert bb.TINY_MODEL_NAME in open_clip.list_models()
    assert bb.BIOMEDCLIP_MODEL_NAME in open_clip.list_models()
    import timm

    assert timm.is_model(bb.TINY_TIMM_MODEL_NAME)
    cfg = open_clip.get_model_config(bb.BIOMEDCLIP_MODEL_NAME)
    assert cfg["vision_cfg"]["timm_model_name"] == "vit_base_patch16_224"
    assert cfg["vision_cfg"]["timm_pool"] == "" and cfg["vision_cfg"]["timm_proj"] == "linear"
    assert cfg["embed_dim"] == 512


@pytest.mark.parametrize(
    "spec, kwargs",
    [
        ("local-dir:{root}/local", {}),
        ("local-dir:{root}/local_st", {}),
        ("{root}/tiny.bin", {"model_name": bb.TINY_MODEL_NAME}),
        ("{root}/tiny.safetensors", {"model_name": bb.TINY_MODEL_NAME}),
        ("{root}/local/open_clip_pytorch_model.bin", {}),  # config found beside the file
    ],
)
def test_image_tower_matches_open_clip(tiny, spec, kwargs):
    ref = _open_clip_reference(tiny)
    with torch.no_grad():
        ref_scale = ref.logit_scale.item()
    tower = bb.build_image_tower(spec.format(root=tiny), **kwargs)
    assert tower.source.checkpoint is not None
    assert tower.embed_dim == 32 and tower.image_size == (64, 64)
    assert tower.mean == pytest.approx(open_clip.OPENAI_DATASET_MEAN)
    assert tower.logit_scale == pytest.approx(ref_scale)
    x = torch.rand(2, 3, 64, 64)
    with torch.no_grad():
        torch.testing.assert_close(tower.visual.eval()(x), ref.encode_image(x), atol=0, rtol=0)
    # the state dict is exactly the checkpoint's visual part
    for key, value in tower.visual.state_dict().items():
        assert torch.equal(value, ref.visual.state_dict()[key])


def test_random_init_from_registered_name():
    tower = bb.build_image_tower(bb.TINY_MODEL_NAME, pretrained=False)
    assert tower.source.checkpoint is None and tower.logit_scale is None
    assert tower.visual(torch.rand(1, 3, 64, 64)).shape == (1, 32)
    resized = bb.build_image_tower(bb.TINY_MODEL_NAME, pretrained=False, image_size=96)
    assert resized.image_size == (96, 96)
    assert resized.visual(torch.rand(1, 3, 96, 96)).shape == (1, 32)
    with pytest.raises(ValueError, match="without weights"):
        bb.resolve_backbone(bb.TINY_MODEL_NAME, pretrained=True)


def test_explicit_pretrained_path(tiny):
    tower = bb.build_image_tower(bb.TINY_MODEL_NAME, pretrained=str(tiny / "tiny.bin"))
    ref = _open_clip_reference(tiny)
    x = torch.rand(1, 3, 64, 64)
    with torch.no_grad():
        torch.testing.assert_close(tower.visual.eval()(x), ref.encode_image(x), atol=0, rtol=0)


def test_mismatched_checkpoint_lists_keys(tiny, tmp_path):
    state = torch.load(tiny / "tiny.bin", weights_only=True)
    state.pop("visual.trunk.blocks.1.attn.qkv.weight")
    state["visual.trunk.extra.weight"] = torch.zeros(1)
    bad = tmp_path / "bad.bin"
    torch.save(state, bad)
    with pytest.raises(ValueError) as err:
        bb.build_image_tower(str(bad), model_name=bb.TINY_MODEL_NAME)
    message = str(err.value)
    assert str(bad) in message
    assert "missing keys: trunk.blocks.1.attn.qkv.weight" in message
    assert "unexpected keys: trunk.extra.weight" in message
    # a checkpoint of another width: shape mismatches are reported, not a deep traceback
    state = torch.load(tiny / "tiny.bin", weights_only=True)
    state["visual.head.proj.weight"] = torch.zeros(16, 64)
    torch.save(state, bad)
    with pytest.raises(
        ValueError, match=r"shape mismatches \(checkpoint vs model\): head.proj.weight \(16, 64\) vs \(32, 64\)"
    ):
        bb.build_image_tower(str(bad), model_name=bb.TINY_MODEL_NAME)


def test_bad_sources(tiny, tmp_path):
    with pytest.raises(FileNotFoundError, match="not found"):
        bb.resolve_backbone(str(tmp_path / "absent.bin"))
    with pytest.raises(FileNotFoundError, match="not found"):
        bb.resolve_backbone(f"local-dir:{tmp_path / 'absent'}")
    empty = tmp_path / "config_only"
    empty.mkdir()
    (empty / "open_clip_config.json").write_text((tiny / "local" / "open_clip_config.json").read_text())
    with pytest.raises(FileNotFoundError, match="no weights file"):
        bb.resolve_backbone(f"local-dir:{empty}")
    assert bb.resolve_backbone(f"local-dir:{empty}", pretrained=False).checkpoint is None
    with pytest.raises(ValueError, match="unknown backbone"):
        bb.resolve_backbone("no-such-model")
    garbage = tmp_path / "garbage.bin"
    garbage.write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match="cannot read checkpoint"):
        bb.build_image_tower(str(garbage), model_name=bb.TINY_MODEL_NAME)


def test_hub_id_offline_names_the_alternatives(monkeypatch, tmp_path):
    huggingface_hub = pytest.importorskip("huggingface_hub")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hf_cache"))
    start = time.perf_counter()
    with pytest.raises(bb.BackboneUnavailableError) as err:
        bb.build_image_tower(bb.BIOMEDCLIP_HUB_ID)
    assert time.perf_counter() - start < 10
    message = str(err.value)
    assert bb.BIOMEDCLIP_HUB_ID in message
    assert "local-dir:" in message and "checkpoint file" in message and bb.TINY_MODEL_NAME in message
    # BiomedCLIP's architecture needs no download for random weights
    source = bb.resolve_backbone(bb.BIOMEDCLIP_HUB_ID, pretrained=False)
    assert source.checkpoint is None and source.model_cfg["vision_cfg"]["timm_model_name"] == "vit_base_patch16_224"
