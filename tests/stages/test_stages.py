"""The stages after the probability folder (monai_vce.stages): decode, write_events, refine, report, review."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

import numpy as np
import pytest

from monai_vce.events import Video, load_events, probability_file, read_events_meta, read_frame_units, save_video_probs
from monai_vce.labels import LABELS, NUM_LABELS
from monai_vce.postprocessing import DecoderParams, EventDecoder
from monai_vce.stages import decode, events_units, refine, report, review, write_events
from monai_vce.temporal import TemporalRefiner


def _files(folder: Path, videos: dict[str, int], seed: int = 0) -> dict[str, Video]:
    """Probability files with frame numbers ``3 * index + 1``; a long run of one label per video."""
    rng = np.random.default_rng(seed)
    out = {}
    for vid, n in videos.items():
        probs = rng.uniform(0, 0.1, (n, NUM_LABELS)).astype(np.float32)
        probs[: n // 2, LABELS.index("stomach")] = 0.95
        probs[n // 2 :, LABELS.index("small intestine")] = 0.95
        index = np.arange(n, dtype=np.int64) + 10
        out[vid] = Video(vid, probs, index, 3 * index + 1)
        save_video_probs(probability_file(folder, vid), out[vid], source="model-a")
    return out


def _fitted(units: str) -> DecoderParams:
    return DecoderParams({**DecoderParams.from_thresholds({}), "frame_units": units, "fit": {"objective": 0.5}})


def test_decode_writes_the_json_its_units_and_frame_ranges(tmp_path):
    videos = _files(tmp_path / "probs", {"v2": 12, "v10": 8, "empty": 0})
    path = decode(tmp_path / "probs", tmp_path / "events.json", videos=["v10", "v2", "empty"])
    events = load_events(path)
    assert [v["video_id"] for v in events["videos"]] == ["v10", "v2", "empty"]  # the order asked for
    for vid in ("v10", "v2"):
        video = videos[vid]
        expected = EventDecoder()(video.probs, video.frame_index, video_id=vid)
        assert events["videos"][[v["video_id"] for v in events["videos"]].index(vid)]["events"] == [
            {k: e[k] for k in ("start", "end", "label")} for e in expected
        ]
    assert events["videos"][2]["events"] == []  # a video without frames has no events
    meta = read_events_meta(path)
    assert read_frame_units(path).value == "frame_index"
    assert meta["videos"] == {
        "v10": {"frames": 8, "first": 10, "last": 17},
        "v2": {"frames": 12, "first": 10, "last": 21},
    }
    # without videos: every file of the folder, in natural order
    assert [v["video_id"] for v in load_events(decode(tmp_path / "probs", tmp_path / "all.json"))["videos"]] == [
        "empty",
        "v2",
        "v10",
    ]
    # an empty folder decodes to no videos (a run whose dataset was empty and wrote nothing)
    assert load_events(decode(tmp_path / "none", tmp_path / "none.json")) == {"videos": []}


def test_decode_frame_units_follow_fitted_parameters_and_refuse_others(tmp_path):
    _files(tmp_path / "probs", {"a": 10})
    assert events_units(None).value == "frame_index"
    assert events_units(_fitted("frame_number")).value == "frame_number"  # None takes the fitted units
    assert events_units(DecoderParams.from_thresholds({}), "frame_number").value == "frame_number"  # unfitted: any
    path = decode(tmp_path / "probs", tmp_path / "n.json", decoder=_fitted("frame_number"))
    assert read_frame_units(path).value == "frame_number"
    assert all(e["start"] % 3 == 1 for v in load_events(path)["videos"] for e in v["events"])
    with pytest.raises(ValueError, match=r"fitted in frame_number units, but the run decodes in frame_index units"):
        decode(tmp_path / "probs", tmp_path / "x.json", decoder=_fitted("frame_number"), frame_units="frame_index")
    with pytest.raises(ValueError, match="frame_units must be one of"):
        decode(tmp_path / "probs", tmp_path / "x.json", frame_units="frames")
    assert not (tmp_path / "x.json").exists()


def test_decode_refuses_missing_files_in_one_line(tmp_path):
    _files(tmp_path / "probs", {"a": 4})
    with pytest.raises(FileNotFoundError) as err:
        decode(tmp_path / "probs", tmp_path / "e.json", videos=["a", *[f"m{i}" for i in range(12)]])
    message = str(err.value)
    assert "\n" not in message and "m0, m1" in message and "m11" not in message and " ..." in message
    assert not (tmp_path / "e.json").exists()
    with pytest.raises(ValueError, match="the stage's videos"):
        decode(tmp_path / "probs", tmp_path / "e.json", videos=["a", "A"])  # one file on case-insensitive disks


def test_write_events_is_the_writer_of_decoded_events(tmp_path):
    events = {"b": [{"start": 3, "end": 5, "label": ["colon"], "score": 0.9}], "a": []}
    path = write_events(events, tmp_path / "e.json")
    assert json.loads(path.read_text()) == {
        "videos": [
            {"video_id": "b", "events": [{"start": 3, "end": 5, "label": ["colon"]}]},
            {"video_id": "a", "events": []},
        ]
    }
    assert read_frame_units(path) is None  # no units given: no sidecar
    assert (
        read_frame_units(write_events(events, tmp_path / "u.json", frame_units="frame_number")).value == "frame_number"
    )
    with pytest.raises(ValueError):
        write_events({"a": [{"start": 9, "end": 4, "label": ["colon"]}]}, tmp_path / "bad.json")
    assert not (tmp_path / "bad.json").exists()


def test_stages_write_on_the_main_process_only(tmp_path, monkeypatch):
    _files(tmp_path / "probs", {"a": 4})
    for name in ("_common", "decode", "refine", "report", "review"):
        monkeypatch.setattr(sys.modules[f"monai_vce.stages.{name}"], "main_process", lambda: False)
    assert decode(tmp_path / "probs", tmp_path / "e.json") is None
    assert write_events({"a": []}, tmp_path / "w.json") is None
    assert refine(tmp_path / "probs", tmp_path / "r", TemporalRefiner()) == {
        "written": [],
        "kept": [],
        "trained_videos": [],
    }
    assert report(tmp_path / "e.json", tmp_path / "report") is None
    assert review(tmp_path / "site", tmp_path / "e.json", []) is None
    assert sorted(p.name for p in tmp_path.iterdir()) == ["probs"]


def test_refine_keeps_its_files_and_warns_about_training_videos(tmp_path, caplog):
    videos = _files(tmp_path / "probs", {"a": 20, "b": 16})
    refiner = TemporalRefiner(network={"stages": 1, "layers": 1, "channels": 4})
    refiner.fit_info = {**refiner.fit_info, "videos": ["b"]}
    lines: list[str] = []
    with caplog.at_level(logging.WARNING, logger="monai_vce.stages"):
        result = refine(tmp_path / "probs", tmp_path / "refined", refiner, source="model-a | r", log=lines.append)
    assert result == {"written": ["a", "b"], "kept": [], "trained_videos": ["b"]}
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "1 video(s) were among the refiner's training videos (e.g. 'b')" in warnings[0]
    refined = EventDecoder()  # the refined files are drop-in replacements: the decode stage reads them
    path = decode(tmp_path / "refined", tmp_path / "events.json")
    from monai_vce.events import load_video_probs

    for vid, video in videos.items():
        r = load_video_probs(probability_file(tmp_path / "refined", vid))
        assert r.source == "model-a | r" and np.array_equal(r.frame_number, video.frame_number)
        np.testing.assert_allclose(r.probs, refiner.refine(video.probs), atol=1e-6)
        got = {v["video_id"]: v["events"] for v in load_events(path)["videos"]}[vid]
        assert got == [{k: e[k] for k in ("start", "end", "label")} for e in refined(r.probs, r.frame_index)]
    again = refine(
        tmp_path / "probs", tmp_path / "refined", refiner, source="model-a | r", videos=["b"], log=lines.append
    )
    assert again["written"] == [] and again["kept"] == ["b"]
    assert "kept 1 video(s) already refined by the same refiner" in lines
    with pytest.raises(FileNotFoundError, match=r"no probability file for video\(s\) c in"):
        refine(tmp_path / "probs", tmp_path / "refined", refiner, videos=["c"])
    with pytest.raises(ValueError, match="is the folder of the frame model's probability files"):
        refine(tmp_path / "probs", tmp_path / "probs", refiner)
    # nothing to refine: no folder is made
    assert refine(tmp_path / "none", tmp_path / "none_refined", refiner)["written"] == []
    assert not (tmp_path / "none_refined").exists()


def test_report_draws_with_probabilities_unless_the_folder_holds_other_videos(tmp_path, caplog):
    _files(tmp_path / "probs", {"a": 12, "b": 10})
    path = decode(tmp_path / "probs", tmp_path / "events.json")
    assert report(path, None, tmp_path / "probs") is None  # no report asked
    assert report(path, tmp_path / "report", tmp_path / "probs") == tmp_path / "report"
    assert sorted(p.name for p in (tmp_path / "report" / "timelines").iterdir()) == ["a.png", "b.png"]
    # an earlier run on more videos left a file of another video: the events are drawn without probabilities
    _files(tmp_path / "probs", {"stray": 5})
    with caplog.at_level(logging.WARNING, logger="monai_vce.stages"):
        assert report(path, tmp_path / "report2", tmp_path / "probs") == tmp_path / "report2"
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "stray.npz" in warnings[0] and "without probabilities" in warnings[0]
    assert sorted(p.name for p in (tmp_path / "report2" / "timelines").iterdir()) == ["a.png", "b.png"]


def test_review_writes_nothing_without_a_folder_and_passes_its_arguments_on(tmp_path, monkeypatch):
    review_module = sys.modules["monai_vce.stages.review"]
    _files(tmp_path / "probs", {"a": 6})
    path = decode(tmp_path / "probs", tmp_path / "events.json", decoder=_fitted("frame_number"))
    seen = {}

    def fake(review_dir, events_file, datalist, **kwargs):
        seen.update(kwargs, review_dir=review_dir, events_file=events_file, datalist=datalist)
        return Path(review_dir) / "index.html"

    monkeypatch.setattr(review_module, "write_run_review", fake)
    assert review(None, path, []) is None and not seen
    site = review(
        tmp_path / "site", path, [{"video_id": "a"}], tmp_path / "probs", tmp_path / "gt.json", frame_rate=5.0
    )
    assert site == tmp_path / "site" / "index.html"
    assert seen["events_file"] == path and seen["datalist"] == [{"video_id": "a"}]
    assert seen["probs_dir"] == tmp_path / "probs" and seen["gt"] == tmp_path / "gt.json" and seen["frame_rate"] == 5.0
