"""Inference (inference.json, standalone) and evaluation (evaluate.json over train.json) of the trained bundle."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from bundle_helpers import (
    DEMO,
    EVALUATE,
    TRAIN,
    config_list,
    inference_args,
    run_bundle,
    run_in_process,
    trained_bundle,
)


def _infer_args(run, data_dir: Path, out: Path, *extra: str) -> list[str]:
    return inference_args(run["models"], data_dir, out, *extra)


@pytest.fixture(scope="module")
def inferred(tmp_path_factory, mini_galar):
    run = trained_bundle(tmp_path_factory, mini_galar)
    out = tmp_path_factory.mktemp("inference")
    proc = run_in_process(_infer_args(run, mini_galar / "frames", out))
    return run, out, proc.stdout + proc.stderr


def test_inference_writes_probabilities_and_events(inferred, mini_galar):
    from monai_vce.labels import LABELS
    from monai_vce.metrics import load_events
    from monai_vce.workflows import inference_datalist

    _, out, log = inferred
    datalist = inference_datalist(mini_galar / "frames")
    videos = list(dict.fromkeys(d["video_id"] for d in datalist))
    assert sorted(p.stem for p in (out / "probs").glob("*.npz")) == sorted(videos)
    for vid in videos:
        frames = [d for d in datalist if d["video_id"] == vid]
        with np.load(out / "probs" / f"{vid}.npz") as z:
            assert z["probs"].dtype == np.float32 and z["probs"].shape == (len(frames), 17)
            assert ((z["probs"] >= 0) & (z["probs"] <= 1)).all()
            assert z["frame_number"].tolist() == [d["frame_number"] for d in frames]
            assert z["frame_index"].dtype == np.int64 and list(z["labels"]) == list(LABELS)
    events = load_events(out / "events.json")  # validated on load
    assert [v["video_id"] for v in events["videos"]] == videos
    assert "wrote" in log and "events.json" in log
    # the timelines of every video, without ground truth (no summary chart, which needs scores)
    assert sorted(p.stem for p in (out / "report" / "timelines").glob("*.png")) == sorted(videos)
    assert (out / "report" / "summary.md").is_file() and not (out / "report" / "summary.png").exists()
    assert not (out / ".monai_vce.lock").exists()  # the output folder's lock is released at the end


def test_inference_is_resumable_after_a_kill(inferred, mini_galar, tmp_path):
    """A run killed right after its first video's file resumes, skips that video and writes the same JSON."""
    run, reference, _ = inferred
    out = tmp_path / "resumed"
    # end the process abruptly (no cleanup, like SIGKILL) as soon as the first video's file is written
    kill = "$@evaluator.add_event_handler(ignite.engine.Events.ITERATION_COMPLETED, lambda e: os._exit(9) if @probability_writer.written else None)"
    proc = run_bundle(
        _infer_args(
            run, mini_galar / "frames", out, "--inference", f'["$import ignite", "{kill}", "$@evaluator.run()"]'
        ),
        check=False,
    )
    assert proc.returncode == 9, proc.stdout[-3000:] + proc.stderr[-3000:]
    done = sorted(p.name for p in (out / "probs").glob("*.npz"))
    assert len(done) == 1 and not (out / "events.json").exists()
    first = (out / "probs" / done[0]).stat().st_mtime_ns
    proc = run_in_process(_infer_args(run, mini_galar / "frames", out))
    assert "skipping 1 video(s) already inferred" in proc.stdout + proc.stderr
    assert (out / "probs" / done[0]).stat().st_mtime_ns == first  # not recomputed
    assert json.loads((out / "events.json").read_text()) == json.loads((reference / "events.json").read_text())
    for p in (reference / "probs").glob("*.npz"):
        with np.load(p) as a, np.load(out / "probs" / p.name) as b:
            np.testing.assert_allclose(a["probs"], b["probs"], atol=1e-6)
    # a rerun with every video done infers nothing and still writes the full JSON
    (out / "events.json").unlink()
    proc = run_in_process(_infer_args(run, mini_galar / "frames", out))
    assert json.loads((out / "events.json").read_text()) == json.loads((reference / "events.json").read_text())


def test_evaluation_scores_the_validation_videos(tmp_path_factory, mini_galar):
    from monai_vce.metrics import load_events

    run = trained_bundle(tmp_path_factory, mini_galar)
    out = tmp_path_factory.mktemp("evaluation")
    proc = run_in_process(
        [
            "run",
            "--config_file",
            config_list(TRAIN, EVALUATE, DEMO),
            "--bundle_root",
            str(Path(TRAIN).parents[1]),
            "--dataset_dir",
            str(mini_galar),
            "--ckpt_dir",
            str(run["models"]),
            "--output_dir",
            str(out),
            "--num_workers",
            "0",
            "--frame_rate",
            "4",
        ]
    )
    metrics = json.loads((out / "metrics.json").read_text())
    gt = load_events(out / "ground_truth.json")
    pred = load_events(out / "val_events.json")  # beside an inference's events.json and probs/, never over them
    assert [v["video_id"] for v in pred["videos"]] == [v["video_id"] for v in gt["videos"]]
    assert 0.0 <= metrics["mAP@0.5"] <= 1.0 and set(metrics["per_video"]) == {v["video_id"] for v in gt["videos"]}
    assert f'"mAP@0.5": {metrics["mAP@0.5"]}' in proc.stdout
    assert sorted(p.stem for p in (out / "val_probs").glob("*.npz")) == sorted(metrics["per_video"])
    from monai_vce.labels import LABELS

    assert list(metrics["frame_AP"]) == list(LABELS)
    assert all(v is None or 0.0 <= v <= 1.0 for v in metrics["frame_AP"].values())
    assert list(metrics["frame_ECE"]) == list(LABELS) and all(0.0 <= v <= 1.0 for v in metrics["frame_ECE"].values())
    # held out by default, and said so; decoder.json's own (in-sample) score apart, labelled
    assert metrics["protocol"].startswith("held out")
    in_sample = json.loads((out / "in_sample" / "metrics.json").read_text())
    assert in_sample["protocol"].startswith("in sample") and 0.0 <= in_sample["mAP@0.5"] <= 1.0
    assert load_events(out / "in_sample" / "val_events.json")["videos"]
    # lesion-level metrics in every report; the screening events scored apart, in sample and said so
    from monai_vce.metrics import lesion_froc

    assert metrics["lesions"] == json.loads(json.dumps(lesion_froc(gt, pred)))
    assert "lesion_sensitivity@4FA" in proc.stdout
    screening = json.loads((out / "in_sample" / "screening" / "metrics.json").read_text())
    assert screening["protocol"].startswith("in sample: decoded with models/screening_decoder.json")
    scored = load_events(out / "in_sample" / "screening_val_events.json")
    assert all("score" in e for v in scored["videos"] for e in v["events"])
    assert screening["lesions"]["overall"]["overlap"]["lesions"] == metrics["lesions"]["overall"]["overlap"]["lesions"]
    # every metric split by capsule system too (the generator's metadata names them)
    from monai_vce.data.synthetic import CAPSULES

    assert metrics["per_capsule"] and set(metrics["per_capsule"]) <= set(CAPSULES)
    assert sum(g["videos"] for g in metrics["per_capsule"].values()) == len(gt["videos"])
    # the frame rate setting is recorded in every probability file, and the report counts seconds
    from monai_vce.events import load_video_probs

    assert {load_video_probs(p).frame_rate for p in (out / "val_probs").glob("*.npz")} == {4.0}
    summary = (out / "val_report" / "summary.md").read_text()
    assert "## Per capsule" in summary and "## Lesions (pathology events)" in summary
    assert "| duration | flagged (pathology) |" in summary


def test_resume_never_reuses_probabilities_of_another_model(tmp_path):
    """A probability file counts as done only when it was written from the same model file."""
    import os

    from monai_vce.events import Video, save_video_probs
    from monai_vce.workflows import model_fingerprint, pending_frames

    model = tmp_path / "model.pt"
    model.write_bytes(b"weights v1")
    data = [{"image": f"f{i}.png", "video_id": "1", "frame_index": i, "frame_number": i} for i in range(3)]
    probs = tmp_path / "probs"
    video = Video("1", np.zeros((3, 17), np.float32), np.arange(3), np.arange(3))
    save_video_probs(probs / "1.npz", video, source=model_fingerprint(model))
    assert pending_frames(data, probs, source=model_fingerprint(model)) == []
    # the model is retrained: same path, new content
    model.write_bytes(b"weights v2, retrained")
    os.utime(model, ns=(1, 1))
    assert len(pending_frames(data, probs, source=model_fingerprint(model))) == 3
    # a file written without a source (an older file, another tool) is not taken for this model's either
    save_video_probs(probs / "1.npz", video)
    assert len(pending_frames(data, probs, source=model_fingerprint(model))) == 3


def test_training_fits_the_screening_decoder_and_inference_writes_both_event_files(inferred, mini_galar, tmp_path):
    from monai_vce.metrics import load_events
    from monai_vce.postprocessing import DecoderParams

    run, out, log = inferred
    screening = DecoderParams.load(run["models"] / "screening_decoder.json")
    assert screening["fit"]["profile"] == "screening" and screening["fit"]["false_alarms_per_exam"] == 2.0
    assert screening["scores"] is True
    challenge = load_events(out / "events.json")
    assert all(set(e) == {"start", "end", "label"} for v in challenge["videos"] for e in v["events"])
    scored = load_events(out / "screening_events.json")  # validated on load: 'score' is a finite number
    assert [v["video_id"] for v in scored["videos"]] == [v["video_id"] for v in challenge["videos"]]
    events = [e for v in scored["videos"] for e in v["events"]]
    assert events and all(isinstance(e["score"], float) and len(e["label"]) == 1 for e in events)
    assert (out / "screening_events.meta.json").is_file() and "screening_events.json" in log

    # another operating point from the recorded curves, and the screening file switched off
    moved = tmp_path / "moved"
    run_in_process(_infer_args(run, mini_galar / "frames", moved, "--false_alarms_per_exam", "8"))
    assert load_events(moved / "screening_events.json")["videos"]
    off = tmp_path / "off"
    run_in_process(_infer_args(run, mini_galar / "frames", off, "--screening", "false"))
    assert (off / "events.json").is_file() and not (off / "screening_events.json").exists()
