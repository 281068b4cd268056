"""The training bar spans the whole run: one bar whose total is every epoch's frames (its estimate is the run's)."""

from __future__ import annotations

import io
import sys

import torch
from ignite.engine import Engine
from monai.data import Dataset

from monai_vce.handlers import FrameProgressHandler


def test_run_scope_draws_one_bar_over_all_epochs(monkeypatch):
    err = io.StringIO()
    err.isatty = lambda: True  # type: ignore[method-assign]
    monkeypatch.setattr(sys, "stderr", err)
    data = [{"video_id": "a", "image": f"{i}.png"} for i in range(8)]
    dataset = Dataset(data, transform=lambda d: {"video_id": d["video_id"], "image": torch.zeros(3, 2, 2)})
    engine = Engine(lambda e, b: None)
    handler = FrameProgressHandler(desc="training", count_videos=False, scope="run", log_summary=False)
    handler.attach(engine)
    engine.run(torch.utils.data.DataLoader(dataset, batch_size=4), max_epochs=3)
    drawn = err.getvalue()
    assert "24/24" in drawn and "/8 " not in drawn  # one bar of 3 x 8 frames, never a per-epoch one
    assert drawn.count("training:   0%") == 1 and handler.frames == 8  # the last epoch's count
