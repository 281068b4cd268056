"""MONAI's ``ClassificationSaver`` in the bundle's inference, as model-zoo bundles configure it: one CSV row per frame
(every item names its frame as ``filename_or_obj``), with the evaluator's ``decollate`` on (the zoo's form) and off
(the bundle's default, batch form); the events do not change."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from bundle_helpers import DEMO, INFERENCE, inference_args, run_in_process

from monai_vce.networks import DiffAttnCLIPClassifier

#: the saver as a zoo bundle appends it (``+handlers``) with decollated outputs: a list of item dicts
DECOLLATED = {
    "evaluator#decollate": True,
    "+handlers": [
        {
            "_target_": "ClassificationSaver",
            "output_dir": "@output_dir",
            "filename": "predictions.csv",
            "output_transform": "$lambda x: [xx['pred'] for xx in x]",
        }
    ],
}
#: the same saver on the bundle's batch-level outputs (``decollate: false``): ``pred`` is the (B, 17) batch
BATCHED = {
    "+handlers": [
        {
            "_target_": "ClassificationSaver",
            "output_dir": "@output_dir",
            "filename": "predictions.csv",
            "output_transform": "$lambda x: x['pred']",
        }
    ]
}


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    from monai_vce.data.synthetic import main as synthetic

    root = tmp_path_factory.mktemp("savers")
    synthetic(["--out", str(root / "data"), "--num-videos", "2", "--frames-per-video", "20", "--size", "32"])
    torch.manual_seed(0)
    net = DiffAttnCLIPClassifier(backbone="vce-tiny-vit-64", pretrained=False, image_size=64, contrastive=False)
    (root / "models").mkdir()
    torch.save(net.state_dict(), root / "models" / "model.pt")
    return root


def _run(root: Path, name: str, override: dict) -> Path:
    config = root / f"{name}.json"
    config.write_text(json.dumps(override))
    out = root / name
    run_in_process(
        inference_args(
            root / "models", root / "data" / "frames", out, "--report", "False", configs=(INFERENCE, DEMO, str(config))
        )
    )
    return out


def _rows(out: Path) -> dict[str, np.ndarray]:
    with open(out / "predictions.csv", newline="") as f:
        rows = list(csv.reader(f))
    return {row[0]: np.asarray(row[1:], dtype=np.float64) for row in rows}


def test_classification_saver_writes_one_row_per_frame_decollated_or_batched(setup):
    decollated = _run(setup, "decollated", DECOLLATED)
    batched = _run(setup, "batched", BATCHED)
    rows, batch_rows = _rows(decollated), _rows(batched)
    frames = sorted(str(p) for p in (setup / "data" / "frames").rglob("*") if p.suffix.lower() == ".png")
    assert len(frames) == 40 and sorted(rows) == frames and sorted(batch_rows) == frames
    for name in frames:
        assert rows[name].shape == (17,) and np.all((rows[name] >= 0) & (rows[name] <= 1))  # the sigmoid's output
        np.testing.assert_allclose(rows[name], batch_rows[name], atol=1e-6)
    # the bundle's own outputs do not depend on the evaluator's form
    assert json.loads((decollated / "events.json").read_text()) == json.loads((batched / "events.json").read_text())
