"""The bundle's configs: MONAI's required properties, metadata schema, network I/O, components, swapping."""

from __future__ import annotations

import copy
import importlib
import json
from pathlib import Path

import pytest
import torch
from bundle_helpers import (
    CONFIGS,
    DEMO,
    EVALUATE,
    FRAME_CACHE,
    INFERENCE,
    METADATA,
    MULTI_GPU_TRAIN,
    SCHEMA,
    SCHEMA_SHA256,
    TRAIN,
    config_list,
    free_port,
    run_in_process,
)

TINY = {"backbone": "vce-tiny-vit-64", "pretrained": False, "image_size": 64}


def _workflow(files, workflow_type, **override):
    from monai.bundle import ConfigWorkflow

    wf = ConfigWorkflow(
        config_file=files, meta_file=METADATA, logging_file=False, workflow_type=workflow_type, **override
    )
    wf.initialize()
    return wf


@pytest.mark.parametrize(
    "files,workflow_type",
    [
        ([TRAIN], "train"),
        ([TRAIN, DEMO], "train"),
        ([TRAIN, MULTI_GPU_TRAIN], "train"),
        ([INFERENCE], "infer"),
        ([INFERENCE, DEMO], "infer"),
        ([TRAIN, EVALUATE], "infer"),
        ([TRAIN, DEMO, FRAME_CACHE], "train"),
    ],
)
def test_check_properties(files, workflow_type, mini_galar, monkeypatch, tmp_path):
    # properties are parsed (datasets built), so the tiny data and backbone keep this fast and offline
    override = {**TINY, "dataset_dir": str(mini_galar), "ckpt_dir": str(tmp_path / "models")}
    if FRAME_CACHE in files:
        override.update(frame_cache_dir=str(tmp_path / "cache"), frame_cache_size=64, num_workers=0, progress=False)
    if MULTI_GPU_TRAIN in files:
        # the multi-GPU config starts a process group in initialize: a one-process gloo group here
        for k, v in {
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(free_port()),
            "RANK": "0",
            "WORLD_SIZE": "1",
            "LOCAL_RANK": "0",
        }.items():
            monkeypatch.setenv(k, v)
    else:
        override["initialize"] = []
    wf = _workflow(files, workflow_type, **override)
    try:
        assert wf.check_properties() == []
        if FRAME_CACHE in files:  # the training dataset reads the cache built at construction
            from monai_vce.data import FrameCacheDataset

            dataset = wf.parser.get_parsed_content("train#dataset")
            assert isinstance(dataset, FrameCacheDataset)
            assert sorted(p.name for p in (tmp_path / "cache" / "64px").glob("*.npy")) == sorted(
                f"{v}.npy" for v in dict.fromkeys(d["video_id"] for d in dataset.data)
            )
    finally:
        if torch.distributed.is_initialized():
            import ignite.distributed as idist

            idist.finalize()  # ignite caches the distributed context: reset it with the process group
            if torch.distributed.is_initialized():
                torch.distributed.destroy_process_group()


def test_required_ids_present():
    train = json.loads(Path(TRAIN).read_text())
    for key in ("bundle_root", "device", "dataset_dir", "network_def", "network", "val_interval", "run", "training"):
        assert key in train, key
    for key in ("trainer", "dataset", "inferer", "handlers", "preprocessing"):
        assert key in train["train"], key
    assert "max_epochs" in train["train"]["trainer"] and "data" in train["train"]["dataset"]
    for key in ("evaluator", "handlers", "dataset"):
        assert key in train["validate"], key
    assert [h for h in train["train"]["handlers"] if isinstance(h, dict) and h["_target_"] == "ValidationHandler"]
    infer = json.loads(Path(INFERENCE).read_text())
    for key in ("dataset", "evaluator", "inferer", "preprocessing", "postprocessing", "handlers", "network_def", "run"):
        assert key in infer, key


def _targets(obj):
    if isinstance(obj, dict):
        if "_target_" in obj:
            yield obj["_target_"]
        for v in obj.values():
            yield from _targets(v)
    elif isinstance(obj, list):
        for v in obj:
            yield from _targets(v)


def test_monai_vce_components_use_full_dotted_paths():
    seen = set()
    for path in sorted(CONFIGS.glob("*.json")):
        for target in _targets(json.loads(path.read_text())):
            if "monai_vce" in target or "." not in target:
                if "." not in target:
                    # a short name must be a MONAI component, never one of ours
                    assert not any(target == n for n in ("ProbabilityWriter", "DecoderTuningHandler")), target
                    continue
                module, name = target.rsplit(".", 1)
                assert target.startswith("monai_vce."), target
                assert hasattr(importlib.import_module(module), name), f"{path.name}: {target} does not exist"
                seen.add(target)
    assert "monai_vce.networks.DiffAttnCLIPClassifier" in seen
    assert "monai_vce.losses.VCEAsymmetricFocalLoss" in seen
    assert "monai_vce.handlers.ProbabilityWriter" in seen
    assert {"monai_vce.stages.decode", "monai_vce.stages.refine", "monai_vce.stages.write_events"} <= seen


def test_defaults_point_at_real_use():
    train = json.loads(Path(TRAIN).read_text())
    assert train["backbone"].startswith("hf-hub:microsoft/BiomedCLIP")
    assert train["image_size"] == 224 and train["pretrained"] is True
    assert train["optimizer"]["_target_"] == "torch.optim.AdamW"
    assert train["lr_scheduler"]["_target_"] == "monai_vce.engines.ResumableOneCycleLR"
    assert train["ema_decay"] == 0.999 and train["amp"] == "$torch.cuda.is_available()"


def test_verify_metadata_against_the_published_schema(tmp_path):
    """metadata.json against MONAI's published schema (the copy in tests/testing_data/model_zoo, checked by its hash)."""
    from monai.bundle import verify_metadata

    meta = json.loads(Path(METADATA).read_text())
    assert meta["schema"].rsplit("/", 1)[-1] == Path(SCHEMA).name
    verify_metadata(meta_file=METADATA, filepath=SCHEMA, hash_val=SCHEMA_SHA256, hash_type="sha256")
    fmt = meta["network_data_format"]
    assert fmt["inputs"]["image"]["num_channels"] == 3 and fmt["inputs"]["image"]["spatial_shape"] == [224, 224]
    assert fmt["inputs"]["image"]["value_range"] == [0, 1] and fmt["inputs"]["image"]["dtype"] == "float32"
    assert "uint8" in meta["image_classes"]  # what preprocessing emits, before the inferer scales it
    assert "sigmoid" in meta["pred_classes"]  # the network returns logits; the sigmoid is the postprocessing
    assert "monai-vce" in meta["required_packages_version"]
    # a metadata file without a mandatory key fails
    bad = copy.deepcopy(meta)
    del bad["network_data_format"]["outputs"]["pred"]["dtype"]
    bad_file = tmp_path / "metadata.json"
    bad_file.write_text(json.dumps(bad))
    with pytest.raises(ValueError, match="dtype"):
        verify_metadata(meta_file=str(bad_file), filepath=SCHEMA)


def test_demo_metadata_override_passes_verify_net_in_out():
    """The documented command for the demo's 64 px network (its own metadata override)."""
    demo_meta = str(CONFIGS / "demo_metadata.json")
    proc = run_in_process(
        [
            "verify_net_in_out",
            "network_def",
            "--meta_file",
            config_list(METADATA, demo_meta),
            "--config_file",
            config_list(INFERENCE, DEMO),
        ]
    )
    assert "data shape of network is verified with no error" in proc.stdout + proc.stderr
    proc = run_in_process(["verify_metadata", "--meta_file", config_list(METADATA, demo_meta), "--filepath", SCHEMA])
    assert "metadata is verified with no error" in proc.stdout + proc.stderr


def test_verify_metadata_command_line():
    proc = run_in_process(["verify_metadata", "--meta_file", METADATA, "--filepath", SCHEMA])
    assert "metadata is verified with no error" in proc.stdout + proc.stderr


def test_verify_net_in_out():
    from monai.bundle import verify_net_in_out

    # the tiny backbone at 64 px; the metadata's 224 px belongs to BiomedCLIP
    verify_net_in_out(
        net_id="network_def",
        meta_file=METADATA,
        config_file=INFERENCE,
        device="cpu",
        **{f"{k}": v for k, v in TINY.items()},
        **{"_meta_#network_data_format#inputs#image#spatial_shape": [64, 64], "network_def#pretrained": False},
    )


def test_swap_network_loss_sampler_with_one_override_file(tmp_path, mini_galar):
    """One override file swaps the network (plain ViT attention), the loss, the optimizer (top-level keys, as in the
    model zoo) and the sampler."""
    from monai.bundle import ConfigParser

    override = {
        "attention": "plain",
        "loss": {"_target_": "torch.nn.BCEWithLogitsLoss"},
        "optimizer": {"_target_": "torch.optim.SGD", "params": "$@network.parameters()", "lr": 0.01},
        "train#sampler": {"_target_": "torch.utils.data.RandomSampler", "data_source": "@train#dataset"},
    }
    swap = tmp_path / "swap.json"
    swap.write_text(json.dumps(override))
    parser = ConfigParser()
    parser.read_config([TRAIN, DEMO, str(swap)])
    parser.read_meta(METADATA)
    parser.update({"dataset_dir": str(mini_galar), "bundle_root": str(CONFIGS.parent), **TINY})
    net = parser.get_parsed_content("network_def")
    assert net.diff_blocks == [] and type(net).__name__ == "DiffAttnCLIPClassifier"
    loss = parser.get_parsed_content("loss")
    assert isinstance(loss, torch.nn.BCEWithLogitsLoss)
    sampler = parser.get_parsed_content("train#sampler")
    assert isinstance(sampler, torch.utils.data.RandomSampler)
    loader = parser.get_parsed_content("train#dataloader")
    assert loader.sampler is sampler
    trainer = parser.get_parsed_content("train#trainer")
    assert trainer.loss_function is loss
    assert isinstance(trainer.optimizer, torch.optim.SGD) and trainer.optimizer is parser.get_parsed_content(
        "optimizer"
    )
    assert parser.get_parsed_content("lr_scheduler").optimizer is trainer.optimizer
    # one real step of the swapped pipeline
    batch = next(iter(loader))
    x, y = trainer.prepare_batch(batch, torch.device("cpu"), False)
    out = trainer.network(x)
    assert out.shape == (x.shape[0], 17) and torch.isfinite(loss(out, y))
    # and the default one builds the differential-attention network and the imbalance components
    parser = ConfigParser()
    parser.read_config([TRAIN, DEMO])
    parser.update({"dataset_dir": str(mini_galar), "bundle_root": str(CONFIGS.parent), **TINY})
    assert parser.get_parsed_content("network_def").diff_blocks == [0, 1]
    assert type(parser.get_parsed_content("loss")).__name__ == "VCEAsymmetricFocalLoss"
    assert type(parser.get_parsed_content("train#sampler")).__name__ == "SqrtFrequencySampler"


def test_missing_dataset_folder_is_a_clear_error(tmp_path):
    from monai_vce.workflows import galar_datalist, inference_datalist

    with pytest.raises(FileNotFoundError, match="--dataset_dir"):
        galar_datalist(tmp_path / "nope")
    with pytest.raises(FileNotFoundError, match="nope"):
        inference_datalist(tmp_path / "nope")


def test_hub_failure_message_names_the_alternatives(monkeypatch):
    from monai_vce.networks import backbone as bb
    from monai_vce.workflows import check_backbone

    assert check_backbone("vce-tiny-vit-64", pretrained=False) == "vce-tiny-vit-64"

    def fail(*a, **k):
        raise bb.BackboneUnavailableError("cannot load 'hf-hub:x/y' from the Hugging Face Hub")

    monkeypatch.setattr(bb, "resolve_backbone", fail)
    with pytest.raises(RuntimeError) as e:
        check_backbone("hf-hub:x/y")
    msg = str(e.value)
    assert "--backbone local-dir:" in msg and "open_clip_pytorch_model.bin" in msg and "monai_vce.demo" in msg


def test_optimizer_uses_the_network_param_groups():
    """train.json's optimizer takes its groups from ``DiffAttnCLIPClassifier.param_groups`` (one definition)."""
    from monai.bundle import ConfigParser

    import monai_vce.workflows as wf

    assert not hasattr(wf, "param_groups")
    parser = ConfigParser()
    parser.read_config(TRAIN)
    for k, v in {**TINY, "device": "$torch.device('cpu')", "learning_rate": 1e-3, "backbone_lr_mult": 0.1}.items():
        parser[k] = v
    for key in ("backbone", "pretrained", "image_size"):
        parser[f"network_def#{key}"] = f"@{key}"
    optimizer = parser.get_parsed_content("optimizer")
    net = parser.get_parsed_content("network")
    groups = optimizer.param_groups
    ids = {id(p): g for g in groups for p in g["params"]}
    named = {n: p for n, p in net.named_parameters() if p.requires_grad}
    assert len(ids) == len(named)  # every trainable parameter exactly once
    head = next(n for n in named if n.startswith("classifier_head.") and n.endswith("weight") and named[n].ndim == 2)
    trunk = next(n for n in named if n.startswith("visual.") and "qkv.weight" in n)
    bias = next(n for n in named if n.endswith(".bias"))
    wd = json.loads(Path(TRAIN).read_text())["weight_decay"]
    assert ids[id(named[head])]["lr"] == pytest.approx(1e-3) and ids[id(named[head])]["weight_decay"] == wd
    # layer_decay 1.0 (the default): one multiplier for the whole pretrained tower
    assert ids[id(named[trunk])]["lr"] == pytest.approx(1e-4)
    assert ids[id(named[bias])]["weight_decay"] == 0.0
    # the same groups as the network's own method
    expected = net.param_groups(lr=1e-3, backbone_lr_mult=0.1, layer_decay=1.0, weight_decay=wd)
    assert [(g["name"], g["lr"], len(g["params"])) for g in expected] == [
        (g["name"], g["lr"], len(g["params"])) for g in groups
    ]


def test_config_file_list_syntax_matches_docs():
    assert config_list(TRAIN, DEMO) == f"['{TRAIN}','{DEMO}']"


def test_inference_datalist_from_folder_or_json_and_pending_frames(tmp_path, mini_galar):
    import numpy as np

    from monai_vce.events import Video, probability_file, save_video_probs
    from monai_vce.workflows import completed_videos, galar_datalist, inference_datalist, pending_frames, video_ids

    from_root = inference_datalist(mini_galar)  # <dir>/frames/<video_id>/ is found
    from_frames = inference_datalist(mini_galar / "frames")
    files = lambda dl: [(d["image"], d["video_id"], d["frame_number"]) for d in dl]  # noqa: E731
    assert files(from_root) == files(from_frames) and all("label" not in d for d in from_root)
    # label CSVs beside the frames give frame_index (the ground truth's units); a bare frames folder the file number
    assert [d["frame_index"] for d in from_root] == [d["frame_index"] for d in galar_datalist(mini_galar)]
    assert all(d["frame_index"] == d["frame_number"] for d in from_frames)
    assert {d["capsule"] for d in from_root} != {"unknown"}  # metadata.csv beside frames/ is read
    listed = tmp_path / "datalist.json"
    listed.write_text(json.dumps({"testing": from_root[:70]}))
    assert inference_datalist(listed) == from_root[:70]
    vids = video_ids(from_root)
    first = [d for d in from_root if d["video_id"] == vids[0]]
    probs = tmp_path / "probs"

    def write(vid: str, n: int, index=None, number=None) -> None:
        ids = np.arange(n, dtype=np.int64)
        index, number = (ids if a is None else np.asarray(a, np.int64) for a in (index, number))
        save_video_probs(probability_file(probs, vid), Video(vid, np.zeros((n, 17), np.float32), index, number))

    write(vids[0], len(first), [d["frame_index"] for d in first], [d["frame_number"] for d in first])
    # a file with the wrong number of frames (the video folder changed) does not count as complete
    write(vids[1], 3)
    assert completed_videos(from_root, probs) == [vids[0]]
    todo = pending_frames(from_root, probs)
    assert video_ids(todo) == vids[1:] and len(todo) == len(from_root) - len(first)
    assert pending_frames(from_root, probs, resume=False) == from_root


def test_readme_override_trains_without_a_sampler(tmp_path, mini_galar):
    """The README's swap example (plain BCE loss, no sampler, shuffling) trains, checkpoints and resumes."""
    from bundle_helpers import config_list, run_in_process, tiny_overrides

    override = {
        "attention": "plain",
        "loss": {"_target_": "torch.nn.BCEWithLogitsLoss"},
        "train#sampler": None,
        "train#dataloader#shuffle": True,
    }
    swap = tmp_path / "swap.json"
    swap.write_text(json.dumps(override))
    out = tmp_path / "run"
    args = ["run", "training", "--config_file", config_list(TRAIN, DEMO, str(swap))]
    run_in_process(args + tiny_overrides(mini_galar, out, max_epochs=1))
    last = torch.load(out / "models" / "checkpoint_last.pt", map_location="cpu", weights_only=True)
    assert "sampler" not in last and {"model", "optimizer", "trainer"} <= set(last)
    run_in_process(args + tiny_overrides(mini_galar, out, max_epochs=2, resume=True))
    last = torch.load(out / "models" / "checkpoint_last.pt", map_location="cpu", weights_only=True)
    assert last["trainer"]["max_epochs"] == 2 and last["trainer"]["iteration"] == 2 * last["trainer"]["epoch_length"]


def _expressions(obj):
    if isinstance(obj, str) and obj.startswith("$"):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _expressions(v)
    elif isinstance(obj, list):
        for v in obj:
            yield from _expressions(v)


@pytest.mark.parametrize("path", sorted(CONFIGS.glob("*.json")), ids=lambda p: p.name)
def test_configs_read_in_one_pass(path):
    """Every config file: no expression over 100 characters, and one name per class (the engines' FrameInferer)."""
    text = path.read_text()
    long = [e for e in _expressions(json.loads(text)) if len(e) > 100]
    assert not long, f"{path.name}: expressions over 100 characters: {long}"
    assert "monai_vce.workflows.FrameInferer" not in text, path.name


#: each preset or overlay file -> the files it is merged over, as the documented commands merge them
OVERLAYS = {
    "paper.json": ["train.json"],
    "authors.json": ["train.json", "paper.json"],
    "demo.json": ["train.json", "paper.json"],  # the widest documented merge: its contrastive_weight undoes paper's
    "frame_cache.json": ["train.json"],
    "multi_gpu_train.json": ["train.json"],
    "evaluate.json": ["train.json"],
    "temporal_train.json": ["train.json"],
    "multi_gpu_evaluate.json": ["train.json", "evaluate.json"],
    "multi_gpu_inference.json": ["inference.json"],
    "temporal_inference.json": ["inference.json"],
    "demo_metadata.json": ["metadata.json"],
    "exam_norm_train.json": ["train.json"],
    "exam_norm_evaluate.json": ["train.json", "evaluate.json"],
    "exam_norm_inference.json": ["inference.json"],
    "tta.json": ["inference.json"],
    "recalibration.json": ["inference.json"],
    "adabn.json": ["inference.json"],
    "adapt.json": ["inference.json"],
}


def test_overlays_cover_every_config():
    bases = {"train.json", "inference.json", "metadata.json"}
    assert {p.name for p in CONFIGS.glob("*.json")} == bases | set(OVERLAYS)


@pytest.mark.parametrize("name", sorted(OVERLAYS))
def test_presets_hold_only_what_differs(name):
    """A preset sets only what differs from the files it is merged over: no key repeats their value, and a
    ``+key`` (MONAI's merge: append to a list) adds only new items."""
    from monai.bundle import ConfigParser

    base = ConfigParser()
    base.read_config([str(CONFIGS / f) for f in OVERLAYS[name]])
    repeated = []
    for key, value in json.loads((CONFIGS / name).read_text()).items():
        if key.startswith("+"):
            current = base.get(key[1:], [])
            repeated += [f"{key}: {v}" for v in value if v in current]
        elif base.get(key, KeyError) == value:
            repeated.append(key)
    assert not repeated, f"{name} repeats {repeated}"


def test_short_names_resolve_to_the_packages_components_without_ambiguity():
    """MONAI's component locator scans every ``monai*`` package: the package's short names are its own."""
    import warnings

    from monai.bundle import ConfigParser

    from monai_vce.data import VCEDataLoader
    from monai_vce.losses import VCEAsymmetricFocalLoss

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # MONAI warns when a short name matches several components
        parser = ConfigParser(
            {
                "loss": {"_target_": "VCEAsymmetricFocalLoss"},
                "loader": {"_target_": "VCEDataLoader", "dataset": [1, 2, 3], "batch_size": 2},
            }
        )
        assert type(parser.get_parsed_content("loss")) is VCEAsymmetricFocalLoss
        assert type(parser.get_parsed_content("loader")) is VCEDataLoader


def test_ddp_wrapper_is_a_component_whose_arguments_override():
    from monai.bundle import ConfigParser

    parser = ConfigParser()
    parser.read_config([TRAIN, MULTI_GPU_TRAIN])
    parser["network#find_unused_parameters"] = True  # --network#find_unused_parameters True
    config = parser.get("network")
    assert config["_target_"] == "torch.nn.parallel.DistributedDataParallel"
    assert config["find_unused_parameters"] is True and config["module"] == "$@network_def.to(@device)"
