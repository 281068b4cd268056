"""The imbalance components built from bundle-style JSON by MONAI's ConfigParser, and swapped by one-line overrides."""

from __future__ import annotations

import json
from pathlib import Path

import monai
import numpy as np
import pytest
import torch
from bundle_helpers import TRAIN
from monai.bundle import ConfigParser, ConfigWorkflow
from PIL import Image

from monai_vce.data import SqrtFrequencySampler
from monai_vce.engines import VCETrainer
from monai_vce.handlers import EMAWeights, ThresholdOptimizationHandler
from monai_vce.losses import VCEAsymmetricFocalLoss
from monai_vce.postprocessing import load_thresholds

#: the bundle's training pipeline (decode, augmentation, cast), as train.json writes it
BUNDLE = json.loads(Path(TRAIN).read_text())

CONFIG = {
    "imports": ["$import math", "$import torch", "$import monai", "$import monai_vce"],
    "augmentation": BUNDLE["augmentation"],
    "bundle_root": ".",
    "dataset_dir": ".",
    "device": "$torch.device('cpu')",
    "image_size": 16,
    "val_interval": 1,
    "datalist": [],
    "val_datalist": [],
    "thresholds_file": "thresholds.json",
    "network": "$torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * @image_size ** 2, 17))",
    "prepare_batch": {"_target_": "monai_vce.data.VCEPrepareBatch"},
    "train": {
        "load": BUNDLE["train"]["load"],
        "finalise": BUNDLE["train"]["finalise"],
        "preprocessing": BUNDLE["train"]["preprocessing"],
        "dataset": {"_target_": "monai.data.Dataset", "data": "@datalist", "transform": "@train#preprocessing"},
        "sampler": {
            "_target_": "monai_vce.data.SqrtFrequencySampler",
            "data": "@train#dataset#data",
            "num_samples": 24,
            "seed": 0,
        },
        "dataloader": {
            "_target_": "monai.data.DataLoader",
            "dataset": "@train#dataset",
            "sampler": "@train#sampler",
            "batch_size": 8,
            "num_workers": 0,
        },
        "inferer": {"_target_": "SimpleInferer"},
        "loss": {
            "_target_": "monai_vce.losses.VCEAsymmetricFocalLoss",
            "gamma_pos": 1.0,
            "gamma_neg": 4.0,
            "clip": 0.05,
            "label_smoothing": 0.05,
        },
        "optimizer": {"_target_": "torch.optim.SGD", "params": "$@network.parameters()", "lr": 0.1},
        "ema": {"_target_": "monai_vce.handlers.EMAWeights", "network": "@network", "beta": 0.999, "warmup_iters": 2},
        # MONAI's ConfigWorkflow.check_properties() needs every train#handlers item to be a dict, so the EMA
        # (referenced by the evaluator too) is attached in "run" instead of being listed here
        "handlers": [
            {"_target_": "ValidationHandler", "validator": "@validate#evaluator", "interval": "@val_interval"}
        ],
        "trainer": {
            "_target_": "monai_vce.engines.VCETrainer",
            "device": "@device",
            "max_epochs": 2,
            "train_data_loader": "@train#dataloader",
            "network": "@network",
            "optimizer": "@optimizer",
            "loss_function": "@loss",
            "inferer": "@train#inferer",
            "prepare_batch": "@prepare_batch",
            "mixup_alpha": 0.3,
            "mixup_prob": 1.0,
            "contrastive_weight": 1.0,
            "grad_clip_norm": 1.0,
            "amp": False,
            "amp_dtype": "bfloat16",
            "train_handlers": "@train#handlers",
            "decollate": False,
        },
    },
    "validate": {
        "preprocessing": {"_target_": "monai_vce.data.vce_val_transforms", "image_size": "@image_size"},
        "dataset": {"_target_": "monai.data.Dataset", "data": "@val_datalist", "transform": "@validate#preprocessing"},
        "dataloader": {"_target_": "monai.data.DataLoader", "dataset": "@validate#dataset", "batch_size": 8},
        "inferer": {"_target_": "SimpleInferer"},
        "postprocessing": {"_target_": "Activationsd", "keys": "pred", "sigmoid": True},
        "handlers": [
            {
                "_target_": "monai_vce.handlers.ThresholdOptimizationHandler",
                "output_path": "@thresholds_file",
                "min_threshold": 0.05,
                "max_threshold": 0.95,
            }
        ],
        "evaluator": {
            "_target_": "SupervisedEvaluator",
            "device": "@device",
            "val_data_loader": "@validate#dataloader",
            "network": "$@train#ema.ema_model",
            "inferer": "@validate#inferer",
            "postprocessing": "@validate#postprocessing",
            "val_handlers": "@validate#handlers",
            "prepare_batch": "@prepare_batch",
            "decollate": False,
        },
    },
    "run": ["$@train#ema.attach(@train#trainer)", "$@train#trainer.run()"],
    "initialize": ["$monai.utils.set_determinism(seed=0)"],
    "finalize": [],
}
# loss and optimizer at the top level, as the bundle (and the model zoo) has them
CONFIG["loss"] = CONFIG["train"].pop("loss")
CONFIG["optimizer"] = CONFIG["train"].pop("optimizer")


def _datalist(root, n, seed):
    rng = np.random.default_rng(seed)
    items = []
    for i in range(n):
        path = root / f"f{seed}_{i:04d}.PNG"
        Image.fromarray(rng.integers(0, 256, (20, 20, 3), dtype=np.uint8)).save(path)
        label = [0.0] * 17
        label[0] = 1.0  # anatomy: common
        if i % 6 == 0:
            label[16] = 1.0  # a rare pathology
        items.append({"image": str(path), "label": label, "video_id": f"v{seed}", "frame_index": i, "frame_number": i})
    return items


def _write(tmp_path, name, obj):
    path = tmp_path / name
    path.write_text(json.dumps(obj))
    return str(path)


@pytest.fixture()
def config_file(tmp_path):
    cfg = json.loads(json.dumps(CONFIG))
    cfg["datalist"] = _datalist(tmp_path, 24, 0)
    cfg["val_datalist"] = _datalist(tmp_path, 12, 1)
    cfg["thresholds_file"] = str(tmp_path / "models" / "thresholds.json")
    cfg["bundle_root"] = cfg["dataset_dir"] = str(tmp_path)
    return _write(tmp_path, "train.json", cfg)


def test_components_built_by_config_parser(config_file):
    parser = ConfigParser()
    parser.read_config(config_file)
    loss = parser.get_parsed_content("loss")
    assert isinstance(loss, VCEAsymmetricFocalLoss) and loss.gamma_neg == 4.0 and loss.clip == 0.05
    sampler = parser.get_parsed_content("train#sampler")
    assert isinstance(sampler, SqrtFrequencySampler) and len(sampler) == 24
    # the sampler weights come from the datalist: 4 of 24 frames carry the rare label
    eff = sampler.effective_class_frequencies()
    assert eff["original"][16] == pytest.approx(4 / 24)
    assert eff["sampled"][16] > eff["original"][16]
    assert isinstance(parser.get_parsed_content("train#ema"), EMAWeights)
    assert isinstance(parser.get_parsed_content("validate#handlers")[0], ThresholdOptimizationHandler)
    trainer = parser.get_parsed_content("train#trainer")
    assert isinstance(trainer, VCETrainer) and trainer.grad_clip_norm == 1.0 and trainer.amp_dtype == torch.bfloat16
    assert trainer.mixup.alpha == 0.3


def test_datalist_override_reaches_the_sampler(config_file, tmp_path):
    parser = ConfigParser()
    parser.read_config(config_file)
    parser["train#dataset#data"] = _datalist(tmp_path, 10, 5)  # what MONAI Label does with its own datalist
    sampler = parser.get_parsed_content("train#sampler")
    assert sampler.labels.shape == (10, 17)
    assert sampler.class_frequencies[16] == pytest.approx(2 / 10)


def test_one_line_overrides_swap_loss_and_sampler(config_file, tmp_path):
    override = _write(
        tmp_path,
        "override.json",
        {
            "loss": {"_target_": "torch.nn.BCEWithLogitsLoss"},
            "train#sampler": {"_target_": "torch.utils.data.RandomSampler", "data_source": "@train#dataset"},
        },
    )
    parser = ConfigParser()
    parser.read_config([config_file, override])
    assert isinstance(parser.get_parsed_content("loss"), torch.nn.BCEWithLogitsLoss)
    assert isinstance(parser.get_parsed_content("train#sampler"), torch.utils.data.RandomSampler)

    # or plain shuffling without a sampler object
    parser = ConfigParser()
    parser.read_config(config_file)
    parser.update({"train#sampler": None, "train#dataloader#shuffle": True})
    loader = parser.get_parsed_content("train#dataloader")
    assert isinstance(loader.sampler, torch.utils.data.RandomSampler)
    # the trainer runs with the swapped loss
    parser["loss"] = {"_target_": "torch.nn.BCEWithLogitsLoss"}
    parser["train#trainer#max_epochs"] = 1
    trainer = parser.get_parsed_content("train#trainer")
    trainer.run()
    assert torch.isfinite(trainer.state.output["loss"])


def test_workflow_properties_and_full_run(config_file, tmp_path):
    meta = _write(
        tmp_path,
        "metadata.json",
        {
            "version": "0.0.1",
            "monai_version": monai.__version__,
            "pytorch_version": torch.__version__,
            "numpy_version": np.__version__,
        },
    )
    wf = ConfigWorkflow(config_file=config_file, meta_file=meta, workflow_type="train")
    wf.initialize()
    assert wf.check_properties() in (None, [])
    wf.run()
    trainer = wf.parser.get_parsed_content("train#trainer")
    assert trainer.state.epoch == 2 and trainer.state.iteration == 6
    sampler = wf.parser.get_parsed_content("train#sampler")
    assert sampler.state_dict()["epoch"] == 3  # set_epoch(2), then that epoch's draw
    evaluator = wf.parser.get_parsed_content("validate#evaluator")
    ema = wf.parser.get_parsed_content("train#ema")
    assert evaluator.network is ema.ema_model
    thresholds = load_thresholds(tmp_path / "models" / "thresholds.json")
    np.testing.assert_array_equal(thresholds, evaluator.state.thresholds)
    assert thresholds.shape == (17,) and np.all((thresholds >= 0.05) & (thresholds <= 0.95))
    wf.finalize()
