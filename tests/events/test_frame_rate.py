"""Time, not rows: frame rates per video (items, metadata.csv, video file, setting), probability files, decoder
windows in seconds converted per video, and the refiner resampling a video to the rate it was fitted at."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from monai_vce.data import read_frame_rates, video_frame_rates
from monai_vce.events.probabilities import Video, check_frame_rate, load_video_probs, save_video_probs
from monai_vce.labels import LABELS, NUM_LABELS
from monai_vce.postprocessing import DecoderParams, EventDecoder, decode_videos, tune_decoder
from monai_vce.temporal import TemporalRefiner
from monai_vce.temporal.refiner import refine_at_rate


def _video(vid="v", T=20, step=1, rate=None, probs=None):
    probs = np.zeros((T, NUM_LABELS), np.float32) if probs is None else probs
    number = np.arange(T, dtype=np.int64) * step
    return Video(vid, probs, np.arange(T, dtype=np.int64), number, frame_rate=rate)


def test_rows_per_second_and_duration():
    v = _video(T=11, step=5, rate=10.0)  # every 5th frame of a 10 frames/s capsule: 2 rows per second
    assert v.rows_per_second == pytest.approx(2.0)
    assert v.duration_seconds() == pytest.approx(51 / 10.0)  # frames 0..50
    assert _video().rows_per_second is None and _video().duration_seconds() is None
    for bad in (0, -1, float("nan"), float("inf"), True, "5", 20_000):
        with pytest.raises(ValueError, match="frame_rate must be a number"):
            check_frame_rate(bad, "here")


def test_probability_file_keeps_the_rate(tmp_path):
    save_video_probs(tmp_path / "a.npz", _video("a", rate=2.5))
    save_video_probs(tmp_path / "b.npz", _video("b"))
    assert load_video_probs(tmp_path / "a.npz").frame_rate == 2.5
    assert load_video_probs(tmp_path / "b.npz").frame_rate is None
    arrays = dict(np.load(tmp_path / "a.npz"))
    arrays["frame_rate"] = np.asarray(-3.0)
    np.savez(tmp_path / "c.npz", **arrays)
    with pytest.raises(ValueError, match=r"c\.npz.*frame_rate must be"):
        load_video_probs(tmp_path / "c.npz")


def test_frame_rates_from_items_metadata_video_and_setting(tmp_path):
    (tmp_path / "metadata.csv").write_text("video_id,capsule,fps\n1,PillCam SB3,2\n2,PillCam SB3,\n", "utf-8")
    assert read_frame_rates(tmp_path / "metadata.csv") == {"1": 2.0}
    datalist = [
        {"video_id": "01", "image": "a.png"},  # metadata by the id without leading zeros
        {"video_id": "2", "image": "b.png"},  # an empty cell: the setting
        {"video_id": "3", "image": "c.png", "frame_rate": 4},  # the item's own
        {"video_id": "3", "image": "d.png", "frame_rate": 4},
    ]
    assert video_frame_rates(datalist, tmp_path, frame_rate=6) == {"01": 2.0, "2": 6.0, "3": 4.0}
    assert video_frame_rates(datalist, None) == {"01": None, "2": None, "3": 4.0}
    with pytest.raises(ValueError, match="item 4: video '3' has frame_rate 5 after 4"):
        video_frame_rates([*datalist, {"video_id": "3", "image": "e.png", "frame_rate": 5}])
    (tmp_path / "metadata.csv").write_text("video_id,fps\n1,fast\n", "utf-8")
    with pytest.raises(ValueError, match=r"metadata\.csv: line 2 \(video 1\)"):
        read_frame_rates(tmp_path / "metadata.csv")
    (tmp_path / "metadata.csv").write_text("video_id,capsule\n1,PillCam SB3\n", "utf-8")
    assert read_frame_rates(tmp_path / "metadata.csv") == {}


def test_frame_rate_of_a_video_file(tmp_path):
    pytest.importorskip("av")
    from monai_vce.data.video import write_video

    path = tmp_path / "v.mp4"
    write_video(path, [np.zeros((4, 32, 32, 3), np.uint8)], fps=4)
    assert video_frame_rates([{"video_id": "v", "image": str(path)}]) == {"v": pytest.approx(4.0)}


def test_windows_in_seconds_round_trip_and_conversion():
    params = DecoderParams.paper().with_seconds(2.0)  # median 7, gaps 5, min length 3 at 2 rows/s
    ws = params["window_seconds"]
    assert ws["median_window"]["ulcer"] == 3.5 and ws["max_gap"]["ulcer"] == 2.5 and ws["min_length"]["ulcer"] == 1.5
    assert params.rows_at(2.0) == DecoderParams.paper()
    at4 = params.rows_at(4.0)
    assert "window_seconds" not in at4
    assert at4["labels"]["ulcer"]["median_window"] == 15  # 14 rows -> the odd window at or below 15
    assert at4["labels"]["ulcer"]["max_gap"] == 10 and at4["labels"]["ulcer"]["min_length"] == 6
    assert at4["anatomy"]["landmark_window"]["pylorus"] == 200  # 100 rows at 2 rows/s = 50 s
    saved = DecoderParams(params.to_dict())
    assert saved == params
    with pytest.raises(ValueError, match="window_seconds"):
        DecoderParams({"window_seconds": {"median_window": {"ulcer": -1}}})
    with pytest.raises(ValueError, match="window_seconds"):
        DecoderParams({"window_seconds": {"threshold": {"ulcer": 1}}})


def test_decoder_converts_windows_per_video():
    # one 4-row ulcer run: kept when 1.5 s is 3 rows (2 rows/s), dropped when it is 6 rows (4 rows/s)
    probs = np.zeros((40, NUM_LABELS), np.float32)
    probs[10:14, LABELS.index("ulcer")] = 0.9
    params = DecoderParams.paper(order=["threshold", "min_length"]).with_seconds(2.0, names=["min_length"])
    slow, fast = _video("slow", 40, rate=2.0, probs=probs), _video("fast", 40, rate=4.0, probs=probs)
    out = decode_videos([slow, fast], params)
    events = {v["video_id"]: v["events"] for v in out["videos"]}
    assert events["slow"] == [{"start": 10, "end": 13, "label": ["ulcer"]}]
    assert events["fast"] == []
    # every 5th frame of a 20 frames/s capsule is 4 rows/s too
    strided = _video("strided", 40, step=5, rate=20.0, probs=probs)
    assert decode_videos([strided], params)["videos"][0]["events"] == []
    # without a rate: the row windows, with one warning
    decoder = EventDecoder(params)
    with pytest.warns(UserWarning, match="has no frame rate"):
        assert decoder.decode(_video("plain", 40, probs=probs)) == events["slow"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        decoder.decode(_video("again", 40, probs=probs))  # warned once


def test_tune_decoder_records_the_rate_and_gives_seconds():
    rng = np.random.default_rng(0)
    videos = []
    for i in range(3):
        probs = rng.uniform(0, 0.2, (60, NUM_LABELS)).astype(np.float32)
        probs[20:40, LABELS.index("stomach")] = 0.9
        events = [{"start": 20, "end": 39, "label": ["stomach"]}]
        videos.append(_video(str(i), 60, rate=2.0, probs=probs).replace(events=events))
    params = tune_decoder(videos, profile="paper", window_seconds=True)
    assert params["fit"]["rows_per_second"] == 2.0
    assert params["window_seconds"]["min_length"]["stomach"] == 1.5
    with pytest.raises(ValueError, match="window_seconds: validation video '0' has no frame rate"):
        tune_decoder([v.replace(frame_rate=None) for v in videos], profile="paper", window_seconds=True)
    assert "rows_per_second" not in tune_decoder([v.replace(frame_rate=None) for v in videos], profile="paper")["fit"]


class _Box(nn.Module):
    """A moving average of the logits over 9 rows: its window is fixed in rows."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.avg_pool1d(F.pad(x, (4, 4), mode="replicate"), 9, 1)[None]


def test_refiner_resamples_a_video_to_its_fitted_rate():
    refiner = TemporalRefiner(network=_Box(), passthrough=["stomach"])
    refiner.fit_info = {"rows_per_second": 2.0}
    probs = np.full((200, NUM_LABELS), 0.05, np.float32)
    probs[100:, :] = 0.95  # one step at row 100
    plain = refiner.refine(probs)
    assert np.array_equal(refiner.refine(probs, rows_per_second=2.05), plain)  # within 5 %: as it is
    assert np.array_equal(refiner.refine(probs, rows_per_second=None), plain)
    fast = refiner.refine(probs, rows_per_second=8.0)  # 4x the rate: the window spans 4x the rows
    col = LABELS.index("ulcer")

    def ramp(x):
        return int(((x[:, col] > 0.06) & (x[:, col] < 0.94)).sum())

    assert ramp(plain) == 8 and 28 <= ramp(fast) <= 36
    assert np.array_equal(fast[:, LABELS.index("stomach")], probs[:, LABELS.index("stomach")])
    assert np.allclose(refine_at_rate(refiner, probs, None, 8.0), fast)
    assert fast.shape == probs.shape and fast.dtype == np.float32
    with pytest.raises(ValueError, match="records no rows_per_second"):
        refine_at_rate(TemporalRefiner(network=_Box()), probs, None, 8.0)
