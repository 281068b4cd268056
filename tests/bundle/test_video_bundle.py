"""Bundle inference on a folder of video files (.mp4), with its review site, resume and frame cache."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest
from bundle_helpers import inference_args, run_in_process, trained_bundle

pytest.importorskip("av", reason="video support needs PyAV: pip install 'monai-vce[video]'")


def _args(run, data_dir: Path, out: Path, *extra: str) -> list[str]:
    return inference_args(run["models"], data_dir, out, "--report", "False", *extra)


def test_inference_on_video_files_gives_events_and_a_review_site(tmp_path_factory, mini_galar):
    from monai_vce.data import generate_mini_galar
    from monai_vce.metrics import load_events

    run = trained_bundle(tmp_path_factory, mini_galar)
    videos = tmp_path_factory.mktemp("mp4_exams") / "data"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        generate_mini_galar(videos, videos=3, frames_per_video=40, size=32, seed=5, video_format="mp4")
    out = tmp_path_factory.mktemp("mp4_inference")
    proc = run_in_process(_args(run, videos, out, "--review", "True"))
    events = load_events(out / "events.json")
    ids = [v["video_id"] for v in events["videos"]]
    assert ids == ["1", "2", "ukdd_navi_00003"]
    assert sum(len(v["events"]) for v in events["videos"]) > 0
    for vid in ids:
        with np.load(out / "probs" / f"{vid}.npz") as z:
            # frame numbers of a video file are its decoded positions
            assert z["frame_number"].tolist() == list(range(40)) and z["probs"].shape == (40, 17)
        assert (out / "video_frames" / "64px" / f"{vid}.json").is_file()  # decoded once, at the network's size
    index = out / "review" / "index.html"
    assert index.is_file() and "review site:" in proc.stdout
    exam = json.loads((out / "review" / "exams" / "1" / "data.js").read_text().split("=", 1)[1].rstrip(";\n"))
    assert exam["num_frames"] == 40 and exam["frames"]["kind"] == "stored" and exam["frame_rate"] == 5.0
    # the site shows the screening candidates by default, with their scores
    screening = {v["video_id"]: v["events"] for v in load_events(out / "screening_events.json")["videos"]}
    assert sum(len(v) for v in screening.values()) > 0
    shown = [(e["start"], e["end"], e["label"], e["score"]) for e in exam["events"]]
    assert shown == [(e["start"], e["end"], e["label"], e["score"]) for e in screening["1"]]

    # a rerun resumes: every video is done, nothing is decoded or inferred again, the same events come out
    first = (out / "video_frames" / "64px" / "1.npy").stat().st_mtime_ns
    proc = run_in_process(_args(run, videos, out))
    assert "skipping 3 video(s) already inferred" in proc.stdout + proc.stderr
    assert load_events(out / "events.json") == events
    assert (out / "video_frames" / "64px" / "1.npy").stat().st_mtime_ns == first
