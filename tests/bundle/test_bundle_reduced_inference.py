"""Reduced inference through the bundle (inference.json's ``reduction`` keys, set on the command line).

Reduction off is today's path (the evaluator), byte for byte; strided inference writes a file per video with the
``inferred`` mask and events over every frame id; refinement keeps to its budget; resume reuses full-inference
files in a reduced run but not the other way round; two processes (gloo) split the videos.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from bundle_helpers import (
    DEMO,
    INFERENCE,
    REPO,
    free_port,
    inference_args,
    run_in_process,
    trained_bundle,
)

from monai_vce.events import load_video_probs
from monai_vce.inference import reduced_source, reduction_tag, strided_rows
from monai_vce.metrics import load_events
from monai_vce.postprocessing import EventDecoder
from monai_vce.temporal import TemporalRefiner, refiner_fingerprint
from monai_vce.workflows import inference_datalist, model_fingerprint

MULTI_GPU_INFERENCE = str(Path(INFERENCE).parent / "multi_gpu_inference.json")
TEMPORAL_INFERENCE = str(Path(INFERENCE).parent / "temporal_inference.json")

#: the inference run list before reduced inference existed: the evaluator, then the decode stage
EVALUATOR_ONLY = json.dumps(
    [
        "$torch.autocast('cpu', dtype=getattr(torch, @amp_dtype), enabled=@cpu_amp)"
        "(torch.inference_mode()(@evaluator.run))()",
        "@decode",
    ]
)


def _args(run, data_dir: Path, out: Path, *extra: str, configs: tuple[str, ...] = (INFERENCE, DEMO)) -> list[str]:
    return inference_args(run["models"], data_dir, out, "--report", "False", *extra, configs=configs)


def _log(proc: subprocess.CompletedProcess) -> str:
    return proc.stdout + proc.stderr


def _files(out: Path) -> dict[str, Path]:
    return {p.stem: p for p in sorted((out / "probs").glob("*.npz"))}


@pytest.fixture(scope="module")
def runs(tmp_path_factory, mini_galar):
    """The trained bundle, a full inference (the defaults) and a strided one (stride 4, no refinement)."""
    run = trained_bundle(tmp_path_factory, mini_galar)
    full = tmp_path_factory.mktemp("full")
    run_in_process(_args(run, mini_galar / "frames", full))
    strided = tmp_path_factory.mktemp("strided")
    proc = run_in_process(
        _args(run, mini_galar / "frames", strided, "--reduction#stride", "4", "--reduction#refine", "False")
    )
    return run, full, strided, proc.stdout + proc.stderr


def test_reduction_off_is_todays_inference(runs, mini_galar, tmp_path):
    """The default (stride 1) runs the evaluator path: the same events.json bytes and the same files as today's
    inference expression."""
    run, full, _, _ = runs
    out = tmp_path / "evaluator"
    run_in_process(_args(run, mini_galar / "frames", out, "--inference", EVALUATOR_ONLY))
    assert (out / "events.json").read_bytes() == (full / "events.json").read_bytes()
    for vid, path in _files(full).items():
        with np.load(path) as a, np.load(out / "probs" / path.name) as b:
            assert sorted(a.files) == sorted(b.files) and "inferred" not in a.files, vid
            assert all(np.array_equal(a[k], b[k]) for k in a.files), vid


def test_strided_inference_writes_every_frame_and_the_inferred_mask(runs, mini_galar):
    run, full, strided, log = runs
    datalist = inference_datalist(mini_galar / "frames")
    decoder = EventDecoder(run["models"] / "decoder.json")
    source = reduced_source(model_fingerprint(run["models"] / "model.pt"), reduction_tag(4, None, False, 0.3, 0.0))
    events = {v["video_id"]: v["events"] for v in load_events(strided / "events.json")["videos"]}
    assert list(events) == list(dict.fromkeys(d["video_id"] for d in datalist))
    for vid, path in _files(strided).items():
        frames = [d for d in datalist if d["video_id"] == vid]
        video = load_video_probs(path)
        assert video.frame_number.tolist() == [d["frame_number"] for d in frames]  # a row for every frame
        assert video.source == source
        assert video.inferred is not None and np.array_equal(np.flatnonzero(video.inferred), strided_rows(60, 4))
        reference = load_video_probs(full / "probs" / path.name)
        np.testing.assert_allclose(video.probs[video.inferred], reference.probs[video.inferred], atol=1e-6)
        assert np.isfinite(video.probs).all() and not np.array_equal(video.probs, reference.probs)
        # the events are decoded from the filled-in probabilities of every frame, in the videos' own frame ids
        assert events[vid] == decoder(video.probs, video.frame_index, video_id=vid)
        assert f"video {vid}: inferred {video.inferred.sum()} of 60 frames" in log
    k = strided_rows(60, 4).size
    assert f"reduced inference: inferred {4 * k} of 240 frames ({100 * k / 60:.1f}%)" in log


def test_refinement_keeps_to_its_budget(runs, mini_galar, tmp_path):
    run, _, _, _ = runs
    out = tmp_path / "budget"
    args = ["--reduction#stride", "8", "--reduction#budget", "0.25", "--reduction#options", "{'score_tolerance': 0.1}"]
    proc = run_in_process(_args(run, mini_galar / "frames", out, *args))
    counts = {vid: int(load_video_probs(p).inferred.sum()) for vid, p in _files(out).items()}
    assert len(counts) == 4 and all(strided_rows(60, 8).size <= k <= math.ceil(0.25 * 60) for k in counts.values())
    assert max(counts.values()) > strided_rows(60, 8).size, counts  # the refinement took frames
    assert "score_tolerance=0.1" in load_video_probs(next(iter(_files(out).values()))).source
    assert "reduced inference: inferred" in proc.stdout + proc.stderr


def test_resume_reuses_full_and_same_setting_files(runs, mini_galar, tmp_path):
    """A reduced run interrupted after two videos, in a folder that also holds a full inference of a third one:
    the rerun infers only the fourth video (full inference never reuses reduced files: see
    tests/inference/test_inference_driver.py)."""
    run, full, strided, _ = runs
    out = tmp_path / "resumed"
    (out / "probs").mkdir(parents=True)
    vids = list(_files(strided))
    for vid in vids[:2]:
        shutil.copy2(_files(strided)[vid], out / "probs")
    shutil.copy2(_files(full)[vids[2]], out / "probs")
    mtimes = {vid: (out / "probs" / f"{vid}.npz").stat().st_mtime_ns for vid in vids[:3]}
    log = _log(
        run_in_process(_args(run, mini_galar / "frames", out, "--reduction#stride", "4", "--reduction#refine", "False"))
    )
    assert f"skipping 3 video(s) already inferred in {out / 'probs'}" in log
    assert {vid: (out / "probs" / f"{vid}.npz").stat().st_mtime_ns for vid in vids[:3]} == mtimes
    assert f"video {vids[3]}: inferred" in log and all(f"video {v}: inferred" not in log for v in vids[:3])
    # every video's events, decoded from the file it has (the full-inference one for the third video)
    decoder = EventDecoder(run["models"] / "decoder.json")
    events = {v["video_id"]: v["events"] for v in load_events(out / "events.json")["videos"]}
    assert list(events) == vids
    for vid, path in _files(out).items():
        video = load_video_probs(path)
        assert (video.inferred is None) == (vid == vids[2])
        assert events[vid] == decoder(video.probs, video.frame_index, video_id=vid)


@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed is not available")
@pytest.mark.parametrize("reduced", [True, False], ids=["reduced", "full"])
def test_two_processes(runs, mini_galar, tmp_path, reduced):
    """``torchrun`` with multi_gpu_inference.json (gloo on CPU): reduced inference splits the videos between the
    ranks, full inference the frames; rank 0 writes the events, equal to the single-process run's."""
    run, full, strided, _ = runs
    out = tmp_path / "ddp"
    torchrun = shutil.which("torchrun", path=os.path.dirname(sys.executable)) or "torchrun"
    extra = ("--reduction#stride", "4", "--reduction#refine", "False") if reduced else ()
    args = _args(run, mini_galar / "frames", out, *extra, configs=(INFERENCE, DEMO, MULTI_GPU_INFERENCE))
    cmd = [torchrun, "--nproc_per_node=2", f"--master_port={free_port()}", "-m", "monai.bundle", *args]
    env = dict(os.environ, PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-6000:]
    reference = strided if reduced else full
    assert (out / "events.json").read_bytes() == (reference / "events.json").read_bytes()
    assert sorted(_files(out)) == sorted(_files(reference))
    for vid, path in _files(reference).items():
        a, b = load_video_probs(path), load_video_probs(out / "probs" / path.name)
        np.testing.assert_allclose(a.probs, b.probs, atol=1e-6)  # batches are composed otherwise on two ranks
        assert a.source == b.source and ((a.inferred is None) == (b.inferred is None) == (not reduced)), vid
    assert (out / "screening_events.json").read_bytes() == (reference / "screening_events.json").read_bytes()
    # each event file is written once (rank 0): the challenge events and the screening events
    assert log.count(" events of 4 videos: ") == 2 and log.count("/screening_events.json (") == 1
    if reduced:  # every video inferred once, by one rank: one line per video, one summary of all ranks
        k = strided_rows(60, 4).size
        for vid in _files(out):
            assert log.count(f"video {vid}: inferred {k} of 60 frames") == 1, vid
        assert log.count(f"reduced inference: inferred {4 * k} of 240 frames") == 1


def test_temporal_stage_on_reduced_inference(runs, mini_galar, tmp_path):
    """inference.json + temporal_inference.json with a reduction: the refiner of probabilities refines the filled-in
    probabilities, the temporal events are decoded from them, and the refined files record the reduction, so a full
    inference in the same folder recomputes every refined file."""
    run, _, _, _ = runs
    models = tmp_path / "models"
    shutil.copytree(run["models"], models)
    torch.manual_seed(0)
    TemporalRefiner(network={"stages": 1, "layers": 2, "channels": 8}).save(models / "refiner.pt")
    shutil.copy2(models / "decoder.json", models / "temporal_decoder.json")
    refiner, decoder = TemporalRefiner.load(models / "refiner.pt"), EventDecoder(models / "temporal_decoder.json")
    fingerprint = refiner_fingerprint(models / "refiner.pt")
    out = tmp_path / "out"
    configs = (INFERENCE, TEMPORAL_INFERENCE, DEMO)
    strided = ("--reduction#stride", "4", "--reduction#refine", "False")
    for extra, reduced in ((strided, True), ((), False)):  # then full inference in the same folder
        run_in_process(_args({"models": models}, mini_galar / "frames", out, *extra, configs=configs))
        events = {v["video_id"]: v["events"] for v in load_events(out / "temporal_events.json")["videos"]}
        assert len(events) == 4
        for vid, path in _files(out).items():
            frame = load_video_probs(path)
            refined = load_video_probs(out / "refined_probs" / path.name)
            assert (frame.inferred is not None) == reduced and ("|reduced(stride=4," in frame.source) == reduced
            assert refined.source == f"{frame.source} | {fingerprint}", vid
            np.testing.assert_allclose(refined.probs, refiner.refine(frame.probs), atol=1e-5)
            assert events[vid] == decoder(refined.probs, refined.frame_index, video_id=vid)


def _workflow(mini_galar, tmp_path, **overrides):
    from bundle_helpers import inference_workflow

    return inference_workflow(mini_galar / "frames", tmp_path, **overrides)


def test_reduction_keys_and_the_temporal_refiner_in_the_config(mini_galar, tmp_path):
    """The reduction keys reach the reduced inference; the temporal refiner (of probabilities) is what the
    refinement aims at, and its refined files record the reduction settings."""
    wf = _workflow(
        mini_galar,
        tmp_path,
        **{
            "reduction#stride": 8,
            "reduction#duplicate_tolerance": 2.5,
            "reduction#options": {"max_rounds": 3},
            "refiner": "$monai_vce.temporal.TemporalRefiner()",
            "refiner_source": "refiner-a",
        },
    )
    writer = wf.parser.get_parsed_content("probability_writer")
    refiner = wf.parser.get_parsed_content("refiner")
    reduced = wf.parser.get_parsed_content("reduced_inference")
    assert reduced.reduced and reduced.settings == {"stride": 8, "budget": None, "refine": True, "margin": 0.3}
    assert reduced.duplicate_tolerance == 2.5 and reduced.options == {"max_rounds": 3}
    assert reduced.refiner is refiner and reduced.probs_transform == refiner.refine
    assert wf.parser.get_parsed_content("refine#_disabled_") is False
    assert len(reduced.predictor.data) == 240 and reduced.predictor.dataset is wf.parser.get_parsed_content("dataset")
    # refined files of reduced probabilities are never taken for refined files of full inference (nor the reverse)
    assert writer.source == reduced.stored_source != reduced.source
    assert wf.parser.get_parsed_content("refine#source") == reduced.stored_source + " | refiner-a"
    full = _workflow(mini_galar, tmp_path)
    assert full.parser.get_parsed_content("probability_writer").source == full.parser.get_parsed_content("probs_source")
    assert full.parser.get_parsed_content("refine#_disabled_") is True  # no refiner: the refine stage is off


def test_reduced_inference_refuses_per_frame_features(mini_galar, tmp_path):
    """Reduced inference infers some frames only: a run that asks for per-frame features is refused in one line."""
    wf = _workflow(mini_galar, tmp_path, **{"reduction#stride": 4, "write_features": True})
    with pytest.raises(ValueError, match=r"reduced inference \(reduced\(stride=4.*write_features"):
        wf.parser.get_parsed_content("reduced_inference").run()
