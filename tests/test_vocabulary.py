"""One name per idea: FrameUnits, tiou_thresholds, write_on, sigmoid, frame_units; the former names keep working for
one release with a DeprecationWarning."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import numpy as np
import pytest

from monai_vce.events import FrameUnits, Video, as_frame_units
from monai_vce.labels import LABELS
from monai_vce.metrics import temporal_map, tiou_key, video_average_precision
from monai_vce.postprocessing import tune_decoder

GT = {"videos": [{"video_id": "v", "events": [{"start": 0, "end": 9, "label": ["colon"]}]}]}
PRED = {"videos": [{"video_id": "v", "events": [{"start": 0, "end": 7, "label": ["colon"]}]}]}


def test_frame_units_are_the_datalist_keys():
    item = {"frame_index": 20, "frame_number": 100}
    assert [item[u] for u in FrameUnits] == [20, 100]
    assert FrameUnits.FRAME_INDEX == "frame_index" and str(FrameUnits.FRAME_NUMBER) == "frame_number"
    assert json.dumps({"u": FrameUnits.FRAME_INDEX}) == '{"u": "frame_index"}'
    assert as_frame_units("frame_number") is FrameUnits.FRAME_NUMBER
    with pytest.raises(ValueError, match=r"frame_units must be one of \['frame_index', 'frame_number'\], got 'idx'"):
        as_frame_units("idx")
    with pytest.warns(DeprecationWarning, match="'index' is deprecated.*'frame_index'"):
        assert as_frame_units("index") is FrameUnits.FRAME_INDEX
    video = Video("v", np.zeros((2, 17)), np.array([3, 4]), np.array([15, 20]))
    assert video.frame_ids("frame_number").tolist() == [15, 20]
    with pytest.warns(DeprecationWarning):
        assert video.frame_ids("index").tolist() == [3, 4]


def test_tiou_thresholds_everywhere():
    new = temporal_map(GT, PRED, tiou_thresholds=(0.5, 0.9))
    assert new["tiou_thresholds"] == [0.5, 0.9] and new["mAP@0.5"] == 1.0
    assert new["per_label"]["colon"] == {"0.5": 1.0, "0.9": 0.0}  # tIoU 0.8
    with pytest.warns(DeprecationWarning, match="'thresholds' is deprecated.*'tiou_thresholds'"):
        old = temporal_map(GT, PRED, thresholds=(0.5, 0.9))
    assert old == new
    with pytest.raises(TypeError, match="both 'thresholds'"):
        temporal_map(GT, PRED, thresholds=(0.5,), tiou_thresholds=(0.5,))
    with pytest.warns(DeprecationWarning):
        video_average_precision(GT["videos"][0]["events"], [], thresholds=(0.5,))
    assert tiou_key(0.95) == "0.95"
    import monai_vce.metrics as metrics

    with pytest.warns(DeprecationWarning, match="tiou_key"):
        assert metrics.threshold_key(0.5) == "0.5"
    p = np.zeros((20, 17))
    p[:10, LABELS.index("colon")] = 0.9
    videos = [(p, np.arange(20), GT["videos"][0]["events"])]
    kwargs = {"grids": {"threshold": (0.5,)}, "anatomy": False, "rounds": 1, "presence_folds": 0}
    with pytest.warns(DeprecationWarning, match="tune_decoder\\(\\): argument 'thresholds'"):
        old_fit = tune_decoder(videos, thresholds=(0.5,), **kwargs)
    new_fit = tune_decoder(videos, tiou_thresholds=(0.5,), **kwargs)
    assert old_fit.replace(fit={}) == new_fit.replace(fit={})


def test_metric_and_report_command_lines_take_the_new_and_the_old_names(tmp_path):
    gt, pred = tmp_path / "gt.json", tmp_path / "pred.json"
    gt.write_text(json.dumps(GT))
    pred.write_text(json.dumps(PRED))
    run = lambda *a: subprocess.run(  # noqa: E731
        [sys.executable, "-m", "monai_vce.metrics", "--gt", str(gt), "--pred", str(pred), *a],
        capture_output=True,
        text=True,
    )
    new = run("--tiou-thresholds", "0.5", "0.9", "--indent", "-1")
    old = run("--thresholds", "0.5", "0.9", "--indent", "-1")
    assert new.returncode == 0 and old.returncode == 0, old.stderr
    assert json.loads(new.stdout)["per_label"]["colon"]["0.9"] == 0.0 and new.stdout == old.stdout
    assert "--thresholds is deprecated" in old.stderr and "deprecated" not in new.stderr


def test_handlers_take_the_new_and_the_old_names(tmp_path):
    from monai_vce.handlers import TemporalEventWriter, TemporalMAPMetric

    with pytest.warns(DeprecationWarning) as record:
        metric = TemporalMAPMetric(threshold=0.95, thresholds=(0.5,), frame_key="frame_number")
    messages = " ".join(str(w.message) for w in record)
    assert all(f"'{old}' is deprecated" in messages for old in ("threshold", "thresholds", "frame_key"))
    assert metric.tiou_threshold == 0.95 and metric.tiou_thresholds == (0.95, 0.5)
    assert metric.collector.frame_units is FrameUnits.FRAME_NUMBER
    with pytest.warns(DeprecationWarning, match="'units' is deprecated"):
        writer = TemporalEventWriter(tmp_path, units="frame_number")
    assert writer.frame_units is FrameUnits.FRAME_NUMBER
    with pytest.raises(ValueError, match="frame_units must be one of"):
        TemporalEventWriter(tmp_path, frame_units="frames")


def test_bundle_configs_speak_the_new_vocabulary():
    from pathlib import Path

    configs = Path(__file__).resolve().parents[1] / "bundle" / "configs"
    text = "\n".join(p.read_text() for p in sorted(configs.glob("*.json")))
    for old in (r'"units"', r"[^_]units=", r'"when"', r'"activation"', "frame_key", "thresholds_key", r"'index'"):
        assert not re.search(old, text), old
    assert "decoder.params" not in text  # no reaching into another component's attributes
