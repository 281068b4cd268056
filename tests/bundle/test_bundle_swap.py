"""Swapping components as MONAI users do: any network, any sampler, and inspecting the bundle without data or hub.

The swapped networks run the shipped ``train.json`` with its default backbone settings (BiomedCLIP from the hub,
``pretrained: true``) and ``HF_HUB_OFFLINE=1``: a replaced ``network_def`` must train, evaluate and infer without
anything touching the default backbone.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from bundle_helpers import (
    EVALUATE,
    INFERENCE,
    METADATA,
    MULTI_GPU_TRAIN,
    TRAIN,
    config_list,
    free_port,
    run_in_process,
    tiny_overrides,
)

NETWORKS = {
    "monai_densenet121": {
        "_target_": "monai.networks.nets.DenseNet121",
        "spatial_dims": 2,
        "in_channels": 3,
        "out_channels": 17,
        # narrow: the same class and layers (the same weight names) at a sixteenth of the default's compute
        "init_features": 16,
        "growth_rate": 8,
    },
    "timm_resnet18": {
        "_target_": "timm.create_model",
        "model_name": "resnet18",
        "pretrained": False,
        "num_classes": 17,
    },
}


@pytest.mark.parametrize("name", sorted(NETWORKS))
def test_a_replaced_network_trains_evaluates_and_infers(name, tmp_path, mini_galar):
    swap = tmp_path / "swap.json"
    swap.write_text(json.dumps({"network_def": NETWORKS[name]}))
    out = tmp_path / "run"
    # no backbone override: the default (BiomedCLIP, pretrained) stays configured, the hub is offline
    args = tiny_overrides(mini_galar, out, max_epochs=1, image_size=64, decoder_tuning="{'anatomy': False}")
    proc = run_in_process(["run", "training", "--config_file", config_list(TRAIN, str(swap)), *args])
    log = proc.stdout + proc.stderr
    assert "one optimizer group" in log and "BiomedCLIP" not in log
    models = out / "models"
    state = torch.load(models / "model.pt", map_location="cpu", weights_only=True)
    reference = NETWORKS[name]
    assert set(state) == set(_build(reference).state_dict())  # the swapped network's own weights
    # evaluation of the trained network (held-out and in-sample scores)
    run_in_process(["run", "evaluating", "--config_file", config_list(TRAIN, EVALUATE, str(swap)), *args])
    metrics = json.loads((out / "eval" / "metrics.json").read_text())
    assert metrics["protocol"].startswith("held out") and 0.0 <= metrics["mAP@0.5"] <= 1.0
    # inference with the same network file
    infer = out / "infer"
    infer_args = ["--dataset_dir", str(mini_galar / "frames"), "--output_dir", str(infer), "--ckpt_dir", str(models)]
    infer_args += ["--image_size", "64", "--num_workers", "0", "--progress", "False", "--report", "False"]
    run_in_process(["run", "--config_file", config_list(INFERENCE, str(swap)), *infer_args])
    events = json.loads((infer / "events.json").read_text())
    assert sorted(v["video_id"] for v in events["videos"]) == sorted(p.name for p in (mini_galar / "frames").iterdir())


def _build(config: dict) -> torch.nn.Module:
    from monai.bundle import ConfigParser

    return ConfigParser({"net": config}).get_parsed_content("net")


def test_param_groups_of_any_network():
    from monai.networks.nets import DenseNet121

    from monai_vce.networks import DiffAttnCLIPClassifier, param_groups

    net = DenseNet121(spatial_dims=2, in_channels=3, out_channels=17)
    net.features.conv0.weight.requires_grad_(False)
    groups = param_groups(net, lr=1e-3, backbone_lr_mult=0.1, weight_decay=0.01)
    assert len(groups) == 1 and groups[0]["lr"] == 1e-3 and groups[0]["weight_decay"] == 0.01
    trainable = [p for p in net.parameters() if p.requires_grad]
    assert len(groups[0]["params"]) == len(trainable) and all(p.requires_grad for p in groups[0]["params"])
    torch.optim.AdamW(groups)  # a valid optimizer definition
    # the project's network keeps its own groups, also through a DataParallel-style wrapper
    own = DiffAttnCLIPClassifier(backbone="vce-tiny-vit-64", pretrained=False, image_size=64, contrastive=False)
    wrapped = torch.nn.DataParallel(own)
    names = [g["name"] for g in param_groups(wrapped, lr=1e-3)]
    assert names == [g["name"] for g in own.param_groups(lr=1e-3, layer_decay=1.0)] and len(names) > 1


def test_deferred_pretrained_weights_load_when_the_workflow_runs(tmp_path):
    """``defer_pretrained=True`` builds the same network with random weights and loads the weights later, in place."""
    from monai_vce.networks import DiffAttnCLIPClassifier, load_pretrained, save_tiny_checkpoint

    ckpt = save_tiny_checkpoint(tmp_path / "tiny.pt", seed=3)
    kwargs = {"backbone": str(ckpt), "model_name": "vce-tiny-vit-64", "image_size": 64, "contrastive": False}
    torch.manual_seed(0)
    eager = DiffAttnCLIPClassifier(**kwargs)
    torch.manual_seed(0)
    deferred = DiffAttnCLIPClassifier(**kwargs, defer_pretrained=True)
    key = "visual.trunk.blocks.0.attn.qkv.weight"
    before = deferred.state_dict()[key].clone()
    param = dict(deferred.named_parameters())[key]
    assert not torch.equal(before, eager.state_dict()[key])  # random until loaded
    assert load_pretrained(deferred) is deferred
    after = deferred.state_dict()
    for k, v in eager.state_dict().items():
        torch.testing.assert_close(after[k], v, msg=k)  # pretrained tower, same random init of the rest
    assert dict(deferred.named_parameters())[key] is param  # in place: an optimizer built before keeps working
    assert deferred.load_pretrained() is False  # once
    # any other network: nothing to load, nothing touched
    plain = torch.nn.Linear(3, 17)
    assert load_pretrained(plain) is plain


def test_the_bundle_is_inspected_without_data_hub_or_side_effects(tmp_path, monkeypatch):
    """Parsing and MONAI's check_properties on a bare machine: no dataset, no hub, nothing written, no lock."""
    from monai.bundle import ConfigWorkflow

    from monai_vce.networks import backbone

    def no_hub(*args, **kwargs):
        raise AssertionError("the hub was asked for a backbone while inspecting the bundle")

    monkeypatch.setattr(backbone, "_hub_download", no_hub)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    root = tmp_path / "bare" / "bundle"
    missing = str(tmp_path / "no_data_here")
    cases = [([TRAIN], "train"), ([TRAIN, EVALUATE], "infer"), ([INFERENCE], "infer")]
    for files, kind in cases:
        wf = ConfigWorkflow(
            config_file=files,
            meta_file=METADATA,
            logging_file=False,
            workflow_type=kind,
            bundle_root=str(root),
            dataset_dir=missing,
        )
        wf.initialize()
        assert wf.check_properties() == [], files
        # the components are built (network architecture, engines) ...
        assert wf.parser.get_parsed_content("network_def") is not None
    # ... and nothing was read or written
    assert not (tmp_path / "bare").exists() and not Path(missing).exists()


def test_epoch_length_does_not_depend_on_the_sampler(tmp_path, mini_galar):
    """``--train#sampler '$None'`` on the command line (MONAI drops a bare ``None``): plain shuffling, and an epoch is
    still ``samples_per_epoch // batch_size`` iterations."""
    out = tmp_path / "run"
    args = ["run", "training", "--config_file", TRAIN, "--train#sampler", "$None", "--train#dataloader#shuffle", "True"]
    extra = {"backbone": "vce-tiny-vit-64", "pretrained": False, "image_size": 64, "max_epochs": 1}
    run_in_process(args + tiny_overrides(mini_galar, out, samples_per_epoch=40, batch_size=8, **extra))
    last = torch.load(out / "models" / "checkpoint_last.pt", map_location="cpu", weights_only=True)
    assert "sampler" not in last  # the sampler is gone ...
    assert last["trainer"]["epoch_length"] == 40 // 8 and last["trainer"]["iteration"] == 5  # ... the epoch is not


def test_multi_gpu_config_keeps_the_users_sampler(mini_galar, monkeypatch):
    from monai.bundle import ConfigParser

    assert "train#sampler" not in json.loads(Path(MULTI_GPU_TRAIN).read_text())
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "RANK": "0", "WORLD_SIZE": "1"}
    for k, v in {**env, "LOCAL_RANK": "0"}.items():
        monkeypatch.setenv(k, v)
    torch.distributed.init_process_group("gloo")
    try:
        parser = ConfigParser()
        parser.read_config([TRAIN, MULTI_GPU_TRAIN])
        user_sampler = {"_target_": "torch.utils.data.RandomSampler", "data_source": "@train#dataset"}
        parser.update(
            {
                "dataset_dir": str(mini_galar),
                "backbone": "vce-tiny-vit-64",
                "pretrained": False,
                "image_size": 64,
                "train#sampler": user_sampler,
                "samples_per_epoch": 48,
                "batch_size": 8,
            }
        )
        assert isinstance(parser.get_parsed_content("train#sampler"), torch.utils.data.RandomSampler)
        assert parser.get_parsed_content("epoch_length") == 48 // 8
        assert parser.get_parsed_content("train#trainer").state.epoch_length == 6
    finally:
        import ignite.distributed as idist

        idist.finalize()  # ignite caches the distributed context: reset it with the process group
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
