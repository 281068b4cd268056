"""The temporal workflow of the bundle: train.json + temporal_train.json, then inference.json + temporal_inference.json.

End to end at tiny size through ``python -m monai.bundle`` (the session's generated mini-Galar, the tiny backbone):
one training run trains the frame model, writes its outputs on the validation videos with their features,
cross-fits a refiner swapped in by an override file (features and probabilities, a small network) and tunes the
decoder on its out-of-fold refined probabilities; inference applies frame model -> refiner -> decoder; a rerun
with another refiner reuses the frame model's files and recomputes every refined file. In process: the configs'
components (the default refiner, a swapped network class, the leakage guard).
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import numpy as np
import pytest
from bundle_helpers import CONFIGS, DEMO, INFERENCE, TRAIN, config_list, inference_args, run_in_process, tiny_overrides

from monai_vce.events.probabilities import Video, load_video_probs, probability_file, save_video_probs
from monai_vce.labels import NUM_LABELS
from monai_vce.temporal import (
    LeakageError,
    RefinerEnsemble,
    TemporalRefiner,
    fit_temporal_stage,
    load_refiner,
    refiner_fingerprint,
)

TEMPORAL_TRAIN = str(CONFIGS / "temporal_train.json")
TEMPORAL_INFERENCE = str(CONFIGS / "temporal_inference.json")

#: a fast refiner fit at this size (2 validation videos of 60 frames)
TEMPORAL_TINY = {
    "val_fraction": 0.5,
    "max_epochs": 1,
    "temporal_folds": 2,
    "temporal_steps": 8,
    "temporal_crop_length": 60,
    "temporal_crop_context": 0,
    "temporal_batch_size": 2,
    "temporal_num_threads": 1,
}

#: the refiner swapped through JSON: features and probabilities, position inputs, a smaller network
SWAP = {
    "temporal_fit#refiner": {
        "_target_": "monai_vce.temporal.TemporalRefiner",
        "_mode_": "callable",
        "inputs": "both",
        "position": True,
        "network": {"stages": 1, "layers": 3, "channels": 8},
    }
}


def _infer_args(models: Path, data: Path, out: Path, *extra: str) -> list[str]:
    return inference_args(models, data, out, *extra, configs=(INFERENCE, TEMPORAL_INFERENCE, DEMO))


@pytest.fixture(scope="module")
def temporal_run(tmp_path_factory, mini_galar):
    out = tmp_path_factory.mktemp("bundle_temporal")
    swap = out / "swap.json"
    swap.write_text(json.dumps(SWAP))
    config = config_list(TRAIN, TEMPORAL_TRAIN, DEMO, str(swap))
    proc = run_in_process(
        ["run", "training", "--config_file", config, *tiny_overrides(mini_galar, out, **TEMPORAL_TINY)]
    )
    infer = out / "infer"
    proc_inf = run_in_process(_infer_args(out / "models", mini_galar / "frames", infer))
    return {
        "out": out,
        "models": out / "models",
        "infer": infer,
        "log": proc.stdout + proc.stderr,
        "infer_log": proc_inf.stdout + proc_inf.stderr,
    }


def test_training_fits_the_refiner_and_its_decoder_without_leakage(temporal_run):
    from monai_vce.postprocessing import DecoderParams

    models, temporal = temporal_run["models"], temporal_run["out"] / "eval" / "temporal"
    refiner = load_refiner(models / "refiner.pt")
    # the fold refiners together (temporal_final "ensemble"), each the swapped component
    assert isinstance(refiner, RefinerEnsemble) and len(refiner.members) == 2
    for member in refiner.members:
        assert member.inputs == "both" and member.position and member.feature_dim == 32
        assert member.get_config()["network"]["stages"] == 1
    stage = refiner.fit_info["stage"]
    assert stage["final"] == "ensemble" and sorted(refiner.fit_info["folds"]) == ["0", "1"]
    summary = json.loads((temporal / "temporal_fit.json").read_text())
    val_ids, train_ids = summary["videos"], stage["frame_model_training_videos"]
    assert len(val_ids) == 2 and len(train_ids) == 2 and not set(val_ids) & set(train_ids)
    assert sorted(refiner.trained_videos) == sorted(val_ids) and summary["folds"] == 2
    assert stage["protocol"] == "validation cross-fitting" and summary["selected"] in ("frame", "temporal")
    for vid in val_ids:  # the frame model's validation outputs carry their features
        video = load_video_probs(probability_file(temporal / "val_probs", vid), features=True)
        assert video.features is not None and video.features.dtype == np.float16
        assert video.features.shape == (len(video), 32)
        assert load_video_probs(probability_file(temporal / "out_of_fold_probs", vid)).probs.shape == (len(video), 17)
    params = DecoderParams.load(models / "temporal_decoder.json")
    assert params["fit"]["objective"] == pytest.approx(summary["objective"]["temporal"])
    assert (models / "decoder.json").is_file()  # the frame pipeline's decoder is kept
    assert "temporal stage: done" in temporal_run["log"]


def test_inference_applies_frame_model_refiner_and_decoder(temporal_run, mini_galar):
    from monai_vce.metrics import load_events
    from monai_vce.postprocessing import EventDecoder

    models, infer = temporal_run["models"], temporal_run["infer"]
    refiner = load_refiner(models / "refiner.pt")
    decoder = EventDecoder(models / "temporal_decoder.json")
    events = {v["video_id"]: v["events"] for v in load_events(infer / "temporal_events.json")["videos"]}
    assert sorted(events) == sorted(p.stem for p in (mini_galar / "labels").glob("*.csv"))
    fingerprint = refiner_fingerprint(models / "refiner.pt")
    for vid, evs in events.items():
        frame = load_video_probs(probability_file(infer / "probs", vid), features=True)
        assert frame.features is not None and frame.features.shape == (len(frame), 32)  # the refiner reads them
        refined = load_video_probs(probability_file(infer / "refined_probs", vid))
        assert refined.source == f"{frame.source} | {fingerprint}" and frame.source.endswith(
            ":" + str((models / "model.pt").stat().st_mtime_ns)
        )
        np.testing.assert_allclose(refined.probs, refiner.refine(frame.probs, frame.features), atol=1e-5)
        assert evs == decoder(refined.probs, refined.frame_index, video_id=vid)
    assert (infer / "temporal_report" / "summary.md").is_file()


def test_rerun_with_another_refiner_recomputes_every_refined_file(temporal_run, mini_galar, tmp_path):
    import torch

    models, infer = temporal_run["models"], temporal_run["infer"]
    other = load_refiner(models / "refiner.pt")
    with torch.no_grad():
        for p in other.parameters():
            p.add_(0.1)
    other_file = other.save(tmp_path / "other_refiner.pt")
    frame_files = {p.name: p.stat().st_mtime_ns for p in (infer / "probs").glob("*.npz")}
    proc = run_in_process(_infer_args(models, mini_galar / "frames", infer, "--refiner_file", str(other_file)))
    log = proc.stdout + proc.stderr
    assert f"skipping {len(frame_files)} video(s) already inferred" in log  # the frame model's files are reused
    assert {p.name: p.stat().st_mtime_ns for p in (infer / "probs").glob("*.npz")} == frame_files
    fingerprint = refiner_fingerprint(other_file)
    for path in (infer / "refined_probs").glob("*.npz"):
        refined = load_video_probs(path)
        frame = load_video_probs(infer / "probs" / path.name, features=True)
        assert refined.source.endswith(f" | {fingerprint}")  # none left from the first refiner
        np.testing.assert_allclose(refined.probs, other.refine(frame.probs, frame.features), atol=1e-5)


@pytest.mark.parametrize(
    "files,workflow_type", [([TRAIN, TEMPORAL_TRAIN], "train"), ([INFERENCE, TEMPORAL_INFERENCE], "infer")]
)
def test_check_properties(files, workflow_type, mini_galar, tmp_path):
    from monai.bundle import ConfigWorkflow

    models = tmp_path / "models"
    TemporalRefiner(network={"stages": 1, "layers": 1, "channels": 4}).save(models / "refiner.pt")
    override = {
        "backbone": "vce-tiny-vit-64",
        "pretrained": False,
        "image_size": 64,
        "dataset_dir": str(mini_galar),
        "ckpt_dir": str(models),
        "output_dir": str(tmp_path / "eval"),
        "initialize": [],
    }
    wf = ConfigWorkflow(files, logging_file=False, workflow_type=workflow_type, **override)
    wf.initialize()
    assert wf.check_properties() == []
    if workflow_type == "infer":  # the refiner is loaded, switches the refine stage on and is decoded from
        assert isinstance(wf.parser.get_parsed_content("refiner"), TemporalRefiner)
        assert wf.parser.get_parsed_content("refine#_disabled_") is False
        assert wf.parser.get_parsed_content("decode_dir") == str(tmp_path / "eval" / "refined_probs")
        assert wf.parser.get_parsed_content("refine#refined_dir") == str(tmp_path / "eval" / "refined_probs")
        assert wf.parser.get_parsed_content("reduced_inference").refiner is wf.parser.get_parsed_content("refiner")
        assert wf.parser.get_parsed_content("write_features") is False  # a refiner of probabilities needs none


def test_the_temporal_training_list_extends_the_frame_training():
    train = json.loads(Path(TRAIN).read_text())["training"]
    temporal = json.loads(Path(TEMPORAL_TRAIN).read_text())["training"]
    assert temporal == [*train, "$@temporal"]


def _stage_files(folder: Path, ids: list[str], features: int = 0) -> dict:
    rng = np.random.default_rng(0)
    gt = {"videos": []}
    for vid in ids:
        n = 40
        probs = rng.random((n, NUM_LABELS)).astype(np.float32)
        feats = rng.standard_normal((n, features)).astype(np.float32) if features else None
        save_video_probs(probability_file(folder, vid), Video(vid, probs, np.arange(n), np.arange(n), features=feats))
        gt["videos"].append(
            {
                "video_id": vid,
                "events": [
                    {"start": 0, "end": 19, "label": ["stomach"]},
                    {"start": 20, "end": 39, "label": ["small intestine"]},
                ],
            }
        )
    return gt


def test_refiner_component_of_the_config_and_a_swapped_network_class(tmp_path):
    from monai.bundle import ConfigParser

    parser = ConfigParser()
    parser.read_config([TRAIN, TEMPORAL_TRAIN])
    default = parser.get_parsed_content("temporal_fit#refiner")()
    assert isinstance(default, TemporalRefiner) and default.inputs == "probs"
    # any nn.Module class with a `config` of its arguments: here a built MultiStageTCN of other settings
    parser["temporal_fit#refiner#network"] = {
        "_target_": "monai_vce.temporal.MultiStageTCN",
        "in_channels": NUM_LABELS,
        "out_channels": NUM_LABELS,
        "stages": 2,
        "layers": 2,
        "channels": 4,
    }
    parser.parse()
    ids = ["v1", "v2", "v3"]
    gt = _stage_files(tmp_path / "probs", ids)
    fit = {"steps": 2, "crop_length": 40, "crop_context": 0, "batch_size": 2, "num_threads": 1}
    stage = functools.partial(
        fit_temporal_stage,
        tmp_path / "probs",
        gt,
        trained_on=["t1", "t2"],
        refiner=parser.get_parsed_content("temporal_fit#refiner"),
        folds=3,
        fit_kwargs=fit,
        decoder_tuning={"rounds": 1, "anatomy": False},
    )
    summary = stage(tmp_path / "refiner.pt", tmp_path / "decoder.json")
    saved = load_refiner(tmp_path / "refiner.pt")
    assert isinstance(saved, RefinerEnsemble) and len(saved.members) == 3  # the fold refiners, no refit
    for member in saved.members:
        assert member.get_config()["network"]["stages"] == 2 and member.get_config()["network"]["channels"] == 4
    assert summary["folds"] == 3 and summary["objective"].keys() == {"temporal"}
    # one more fit on all the videos instead: a single refiner
    stage(tmp_path / "refit.pt", tmp_path / "refit.json", final="refit")
    refit = TemporalRefiner.load(tmp_path / "refit.pt")
    assert sorted(refit.trained_videos) == ids and refit.fit_info["stage"]["final"] == "refit"
    with pytest.raises(LeakageError, match="v2"):
        fit_temporal_stage(
            tmp_path / "probs", gt, tmp_path / "r.pt", tmp_path / "d.json", trained_on=["v2"], fit_kwargs=fit
        )
    assert not (tmp_path / "r.pt").exists()
