"""The training recipes: ``train.json`` alone is the project's (the bundle's default), ``paper.json`` over it the
paper's; both resolve through MONAI's ConfigParser into the components they name, and merge over inference.json."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from bundle_helpers import CONFIGS, INFERENCE, TRAIN, tiny_config_parser

from monai_vce.data import subsample_frames
from monai_vce.labels import LABELS, all_prompts
from monai_vce.losses import BinaryCrossEntropyLoss, VCEAsymmetricFocalLoss, class_positive_weights
from monai_vce.networks import DifferentialAttention, save_tiny_local_dir
from monai_vce.postprocessing import DecoderParams

PAPER = str(CONFIGS / "paper.json")
AUTHORS = str(CONFIGS / "authors.json")


@pytest.fixture(scope="module")
def text_tower(tmp_path_factory) -> str:
    """The tiny model's randomly initialised text tower: it exercises the contrastive path, nothing clinical."""
    return f"local-dir:{save_tiny_local_dir(tmp_path_factory.mktemp('tiny_text') / 'clip', seed=0)}"


def test_paper_preset_is_the_papers_recipe(mini_galar, tmp_path, text_tower):
    parser = tiny_config_parser([TRAIN, PAPER], mini_galar, tmp_path, text_model=text_tower)
    preset = json.loads(Path(PAPER).read_text())
    assert preset["seed"] == 42 and preset["batch_size"] == 128 and preset["max_epochs"] == 5
    # mixup and the EMA are the paper's in train.json already
    assert parser.get_parsed_content("mixup_alpha") == 0.3 and parser.get_parsed_content("ema_decay") == 0.999
    assert parser.get_parsed_content("train#ema").beta == 0.999
    # network: the paper's differential attention in every block, the paper's heads
    net = parser.get_parsed_content("network_def")
    blocks = net.visual.trunk.blocks
    assert all(isinstance(b.attn, DifferentialAttention) for b in blocks)
    assert all(b.attn.variant == "paper" and b.attn.lambda_init == 0.8 and not b.attn.use_sub_norm for b in blocks)
    head = net.classifier_head
    assert head.gate.fc[0].out_features == net.embed_dim // 16
    assert isinstance(head.norm, torch.nn.BatchNorm1d) and head.dropout.p == 0.4
    assert net.contrastive_head is not None and net.contrastive_head.max_logit_scale == 100.0
    # the paper's one prompt per label, "a video capsule endoscopy image showing [label]" (the label's name)
    assert net.prompt_templates == ("a video capsule endoscopy image showing {name}",)
    assert all_prompts(net.prompt_templates)["active bleeding"] == [
        "a video capsule endoscopy image showing active bleeding"
    ]
    # loss: ASL (gamma+ 1, gamma- 4) + 0.4 x BCE, both with the positive weights of the training datalist
    # the training datalist is every 5th frame of each training video (the authors' epoch)
    split_train = parser.get_parsed_content("split")[0]
    train_data = parser.get_parsed_content("train_datalist")
    assert list(train_data) == subsample_frames(split_train, 5) and 0 < len(train_data) < len(split_train)
    expected_pw = class_positive_weights(train_data, min_weight=1.0, max_weight=100.0)
    loss = parser.get_parsed_content("loss")
    con = parser.get_parsed_content("train#contrastive_loss")
    assert isinstance(loss, VCEAsymmetricFocalLoss) and (loss.gamma_pos, loss.gamma_neg) == (1.0, 4.0)
    assert isinstance(con, BinaryCrossEntropyLoss)
    assert loss.label_smoothing == con.label_smoothing == 0.05
    torch.testing.assert_close(loss.pos_weight, expected_pw)
    torch.testing.assert_close(con.pos_weight, expected_pw)
    assert float(expected_pw.min()) >= 1.0 and float(expected_pw.max()) <= 100.0
    trainer = parser.get_parsed_content("train#trainer")
    assert trainer.contrastive_weight == 0.4 and trainer.contrastive_loss_function is con
    assert trainer.grad_clip_norm == 1.0 and trainer.mixup.alpha == 0.3
    sampler = parser.get_parsed_content("train#sampler")
    assert len(sampler) == len(train_data)  # an epoch is one pass over the training frames
    # augmentation: random resized crop 0.7-1.0, flips, +-15 degrees, colour jitter, random erasing
    names = [type(t).__name__ for t in parser.get_parsed_content("train#preprocessing").transforms]
    assert {"RandResizedCropd", "RandFlipd", "RandRotated", "RandHueSaturationd", "RandErasingd"} <= set(names)
    assert "RandRotate90d" not in names and "RandGaussianNoised" not in names


def test_one_cycle_per_group_max_lr_from_the_config(mini_galar, tmp_path):
    """AdamW (0.9, 0.999), weight decay 5e-4, OneCycle with max lr 9e-5 for the backbone and 3e-4 for the heads,
    ending at the paper's 9e-8 for the heads."""
    # 20 iterations per epoch, so that the warm-up (30 % of 5 epochs) ends on a whole step
    parser = tiny_config_parser(
        [TRAIN, PAPER], mini_galar, tmp_path, contrastive_weight=0.0, samples_per_epoch=160, batch_size=8
    )
    optimizer = parser.get_parsed_content("optimizer")
    scheduler = parser.get_parsed_content("lr_scheduler")
    epoch_length = parser.get_parsed_content("epoch_length")  # the loader's length is known only when training runs
    assert isinstance(optimizer, torch.optim.AdamW) and isinstance(scheduler, torch.optim.lr_scheduler.OneCycleLR)
    assert epoch_length == 20 and scheduler.total_steps == 5 * 20
    net = parser.get_parsed_content("network_def")
    group_of = {id(p): g for g in optimizer.param_groups for p in g["params"]}
    named = dict(net.named_parameters())
    backbone = group_of[id(named["visual.trunk.blocks.0.attn.qkv.weight"])]
    head = group_of[id(named["classifier_head.fc.weight"])]
    assert backbone["max_lr"] == pytest.approx(9e-5) and head["max_lr"] == pytest.approx(3e-4)
    assert backbone["weight_decay"] == head["weight_decay"] == 5e-4
    assert all(g["betas"] == (0.9, 0.999) for g in optimizer.param_groups)  # no momentum cycling
    assert backbone["lr"] == pytest.approx(9e-5 / 25) and head["lr"] == pytest.approx(3e-4 / 25)
    for _ in range(29):  # the peak: step 0.3 x 100 - 1
        optimizer.step()
        scheduler.step()
    assert backbone["lr"] == pytest.approx(9e-5) and head["lr"] == pytest.approx(3e-4)
    for _ in range(70):  # the last step: the paper's "decayed from 3e-4 to 9e-8"
        optimizer.step()
        scheduler.step()
    assert head["lr"] == pytest.approx(9e-8) and backbone["lr"] == pytest.approx(0.3 * 9e-8)


def test_train_json_defaults_are_the_project_recipe():
    """The bundle's default recipe is the one that won the ablation on held-out videos (``project``): train.json
    alone; paper.json changes only train.json's keys, and inference.json builds train.json's network."""
    train = json.loads(Path(TRAIN).read_text())
    infer = json.loads(Path(INFERENCE).read_text())
    paper = json.loads(Path(PAPER).read_text())
    assert set(paper) <= set(train)  # every key of the preset is a setting of train.json
    assert all(paper[k] != train[k] for k in paper)
    for key in ("attention_variant", "se_reduction", "head_batch_norm"):
        assert infer[key] == train[key], key
    # and the preset is all top-level keys, so one file also merges over inference.json and evaluate.json
    assert not any("#" in k for k in paper)


def test_project_recipe(mini_galar, tmp_path):
    parser = tiny_config_parser([TRAIN], mini_galar, tmp_path)
    net = parser.get_parsed_content("network_def")
    blocks = net.visual.trunk.blocks
    assert all(b.attn.variant == "diff_transformer" and b.attn.use_sub_norm for b in blocks)
    assert [b.attn.lambda_init for b in blocks] == pytest.approx([0.2, 0.8 - 0.6 * math.exp(-0.3)])
    assert net.classifier_head.gate.fc[0].out_features == net.embed_dim // 4
    assert isinstance(net.classifier_head.norm, torch.nn.Identity) and net.classifier_head.dropout.p == 0.1
    assert net.contrastive_head is None  # contrastive weight 0: the path is not built
    assert parser.get_parsed_content("train#pos_weight") is None
    assert parser.get_parsed_content("loss").pos_weight is None
    trainer = parser.get_parsed_content("train#trainer")
    assert trainer.grad_clip_norm is None and trainer.contrastive_weight == 0.0
    groups = parser.get_parsed_content("optimizer").param_groups
    assert sorted({g["max_lr"] for g in groups}) == pytest.approx([1e-5, 1e-4])
    assert parser.get_parsed_content("lr_scheduler").total_steps == 10 * parser.get_parsed_content("epoch_length")


@pytest.mark.parametrize("preset", [None, PAPER, AUTHORS])
def test_presets_merge_over_inference_json(preset, mini_galar, tmp_path):
    """The inference network built with a preset has the training network's architecture (same state dict)."""
    extra = {None: [], PAPER: [PAPER], AUTHORS: [PAPER, AUTHORS]}[preset]
    train_net = tiny_config_parser([TRAIN, *extra], mini_galar, tmp_path, contrastive_weight=0.0).get_parsed_content(
        "network_def"
    )
    infer_net = tiny_config_parser([INFERENCE, *extra], mini_galar, tmp_path).get_parsed_content("network_def")
    shapes = {k: tuple(v.shape) for k, v in train_net.state_dict().items()}
    assert shapes == {k: tuple(v.shape) for k, v in infer_net.state_dict().items()}
    assert train_net.attention_variant == infer_net.attention_variant
    infer_net.load_state_dict(train_net.state_dict())


def test_resumable_one_cycle_follows_the_configured_length():
    from monai_vce.engines import ResumableOneCycleLR

    def make(total, cls=ResumableOneCycleLR):
        param = torch.nn.Parameter(torch.zeros(1))
        opt = torch.optim.AdamW([{"params": [param], "lr": 1e-3}], lr=1e-3)
        return opt, cls(opt, max_lr=[1e-3], total_steps=total, cycle_momentum=False)

    opt, first = make(11)
    for _ in range(11):
        opt.step()
        first.step()
    # same length: exactly torch's scheduler
    _, same = make(11)
    same.load_state_dict(first.state_dict())
    assert same.last_epoch == 11 and same.get_last_lr() == first.get_last_lr()
    # resumed with twice the epochs: continues to the new end without "Tried to step" errors
    opt_long, longer = make(22)
    longer.load_state_dict(first.state_dict())
    assert longer.total_steps == 22 and longer.last_epoch == 11
    for _ in range(10):
        opt_long.step()
        longer.step()
    assert longer.get_last_lr()[0] == pytest.approx(1e-3 / 25 / 1e4)  # the end of the 22-step cycle
    opt_long.step()
    longer.step()  # the last allowed step
    _, plain = make(22, torch.optim.lr_scheduler.OneCycleLR)
    plain.load_state_dict(first.state_dict())
    assert plain.total_steps == 11  # what torch's own scheduler would do: the old length comes back


def test_paper_preset_training_writes_the_papers_decoding_chain(mini_galar, tmp_path, text_tower):
    """The paper's post-processing with the F1 thresholds of validation: ``decoder.json`` of a paper-preset run."""
    parser = tiny_config_parser(
        [TRAIN, PAPER],
        mini_galar,
        tmp_path,
        text_model=text_tower,
        max_epochs=1,
        samples_per_epoch=16,
        batch_size=8,
        val_interval=1,
        val_fraction=0.5,
        progress=False,
    )
    for key in ("initialize", "training", "finalize"):
        parser.get_parsed_content(key)
    params = DecoderParams.load(tmp_path / "models" / "decoder.json")
    f1_thresholds = parser.get_parsed_content("validate#threshold_optimizer").thresholds()
    np.testing.assert_allclose(params.per_label("threshold"), f1_thresholds)
    assert not np.allclose(f1_thresholds, 0.5)  # fitted, not the chain's default
    assert list(params["order"]) == ["threshold", "median", "fill_gaps", "min_length"]
    for key, value in {"median_window": 7, "max_gap": 5, "min_length": 3}.items():
        assert params.per_label(key).tolist() == [value] * len(f1_thresholds)
    assert params["ranking"] == "none" and not params["anatomy"]["enabled"]
    assert params["fit"]["profile"] == "paper"


def _authors_positive_weights(data) -> torch.Tensor:
    """The authors' ``compute_class_weights``: ``pos = count + 1; neg = N - pos + 1; clip(neg / pos, 1, 100)``."""
    labels = np.stack([np.asarray(d["label"]) >= 0.5 for d in data]).astype(np.float64)
    pos = labels.sum(axis=0) + 1
    neg = len(labels) - pos + 1
    return torch.as_tensor(np.clip(neg / pos, 1.0, 100.0), dtype=torch.float32)


def test_authors_preset_is_the_authors_code(mini_galar, tmp_path, text_tower):
    """``paper.json`` + ``authors.json``: what the authors' code ran where the paper is silent or differs."""
    parser = tiny_config_parser(
        [TRAIN, PAPER, AUTHORS], mini_galar, tmp_path, text_model=text_tower, samples_per_epoch=160, batch_size=8
    )
    net = parser.get_parsed_content("network_def")
    blocks = net.visual.trunk.blocks
    assert all(b.attn.variant == "authors" and b.attn.lambda_init == 0.8 for b in blocks)
    assert float(net.contrastive_head.logit_scale) == pytest.approx(math.log(1 / 0.07))
    # every 5th frame per video, one mixup lambda per batch
    split_train = parser.get_parsed_content("split")[0]
    train_data = parser.get_parsed_content("train_datalist")
    assert list(train_data) == subsample_frames(split_train, 5)
    trainer = parser.get_parsed_content("train#trainer")
    assert trainer.mixup.per_batch and trainer.mixup.alpha == 0.3
    # their positive weights, applied to the smoothed target (ASL) and as torch's BCE pos_weight (contrastive)
    loss = parser.get_parsed_content("loss")
    con = parser.get_parsed_content("train#contrastive_loss")
    torch.testing.assert_close(loss.pos_weight, _authors_positive_weights(train_data))
    assert loss.pos_weight_mode == "smoothed" and loss.label_smoothing == 0.05
    assert con.pos_weight_mode == "positive_term" and con.label_smoothing == 0.0
    # OneCycle: div_factor 10, final_div_factor 100, pct_start 0.15, momentum cycled
    optimizer = parser.get_parsed_content("optimizer")
    scheduler = parser.get_parsed_content("lr_scheduler")
    assert scheduler.total_steps == 5 * 20
    head = next(g for g in optimizer.param_groups if g["max_lr"] == pytest.approx(3e-4))
    assert head["lr"] == pytest.approx(3e-4 / 10) and head["betas"][0] == pytest.approx(0.95)
    for _ in range(14):  # the peak: step 0.15 x 100 - 1
        optimizer.step()
        scheduler.step()
    assert head["lr"] == pytest.approx(3e-4) and head["betas"][0] == pytest.approx(0.85)
    for _ in range(85):
        optimizer.step()
        scheduler.step()
    assert head["lr"] == pytest.approx(3e-4 / 10 / 100)
    # their validation share and decoding order
    assert parser.get_parsed_content("val_fraction") == 0.15
    assert parser.get_parsed_content("decoder_tuning") == {"profile": "authors"}
    # their threshold grid: 0.15 (0.05 for labels under 1 % of the frames) to 0.85 by 0.02, 0.2 without support
    search = parser.get_parsed_content("validate#threshold_optimizer").search
    probs = np.tile(np.linspace(0.0, 1.0, 200)[:, None], (1, len(LABELS)))
    targets = np.zeros_like(probs)
    targets[150:, 0] = 1  # the scores above 0.75 are the positives of the first label
    thresholds, _ = search(probs, targets)
    assert thresholds[0] == pytest.approx(0.75, abs=0.01) and thresholds[1] == pytest.approx(0.2)
