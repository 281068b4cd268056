"""The explicit data path of validation: one collector read by the key metric, the F1 thresholds and the decoder
tuner; the decoder fitted once per fold and once for the saved parameters; nothing depends on handler order."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from monai.data import DataLoader
from monai.engines import SupervisedEvaluator

from monai_vce.handlers import (
    DecoderTuningHandler,
    MultiLabelAveragePrecision,
    TemporalMAPMetric,
    ThresholdOptimizationHandler,
    VideoFrameCollector,
)
from monai_vce.labels import LABELS
from monai_vce.metrics import temporal_map
from monai_vce.postprocessing import optimize_thresholds, tune_decoder, video_folds
from monai_vce.postprocessing.tuning import cross_fitted_events

L = {n: i for i, n in enumerate(LABELS)}
TUNE = {"grids": {"threshold": (0.5, 0.8)}, "anatomy": False, "rounds": 1, "presence_folds": 0}


def _videos(n: int = 4, T: int = 60, seed: int = 0) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(seed)
    out = {}
    for k in range(n):
        y = np.zeros((T, 17), np.float32)
        y[: T // 2, L["stomach"]] = 1
        y[T // 2 :, L["small intestine"]] = 1
        y[20 + k : 26 + k, L["blood"]] = 1
        p = np.clip(0.55 + 0.4 * y + rng.normal(0, 0.03, y.shape), 0, 1).astype(np.float32)
        out[f"v{k}"] = (p, y)
    return out


def _loader(videos: dict[str, tuple[np.ndarray, np.ndarray]]) -> DataLoader:
    items = [
        {"image": torch.from_numpy(p[t]), "label": torch.from_numpy(y[t]), "video_id": vid, "frame_index": t}
        for vid, (p, y) in videos.items()
        for t in range(len(p))
    ]
    return DataLoader(items, batch_size=16, shuffle=False, num_workers=0)


def _evaluator(tmp_path, videos, order: str = "bundle", epochs_best: bool = True):
    """A validation as the bundle wires it: the probabilities are the 'images' (identity network)."""
    calls: list[list[str]] = []

    def counting_tune(inputs, **kwargs):
        calls.append(sorted(inputs))
        return tune_decoder(inputs, **kwargs)

    collector = VideoFrameCollector(label_key="label")
    thresholds = ThresholdOptimizationHandler(collector=collector, output_path=tmp_path / "thr.json", write_on="best")
    tuner = DecoderTuningHandler(
        tmp_path / "decoder.json", collector=collector, thresholds=thresholds, tune_fn=counting_tune, tune_kwargs=TUNE
    )
    handlers = [collector, thresholds, tuner] if order == "bundle" else [tuner, thresholds, collector]
    evaluator = SupervisedEvaluator(
        device=torch.device("cpu"),
        val_data_loader=_loader(videos),
        network=torch.nn.Identity(),
        key_val_metric={"tmap": TemporalMAPMetric(collector=collector, decoder=tuner)},
        additional_metrics={"ap": MultiLabelAveragePrecision(collector=collector)},
        val_handlers=handlers,
        decollate=False,
    )
    return evaluator, collector, thresholds, tuner, calls


def test_one_collector_feeds_the_metric_the_thresholds_and_the_tuner(tmp_path):
    videos = _videos()
    evaluator, collector, thresholds, tuner, calls = _evaluator(tmp_path, videos)
    evaluator.run()
    # the decoder is fitted once per fold for the metric and once on all videos for the saved parameters
    fold = video_folds(4, 2, seed=0)
    train = [[v for v, f in zip(sorted(videos), fold, strict=True) if f != k] for k in (0, 1)]
    assert calls == [*train, ["v0", "v1", "v2", "v3"]] and tuner.fits == 3
    inputs = collector.labelled_videos()
    assert collector.labelled_videos() is inputs  # the same records for every consumer of the epoch
    # every consumer read the collector's arrays: the metric's score is the held-out decoding of them ...
    held_out = tuner.held_out_events(inputs)
    gt = {"videos": [{"video_id": v, "events": inputs[v].events} for v in inputs]}
    expected = temporal_map(gt, {"videos": [{"video_id": v, "events": held_out[v]} for v in inputs]})
    assert evaluator.state.metrics["tmap"] == pytest.approx(expected["mAP@0.5"])
    assert tuner.fits == 3  # asking again did not fit again
    # ... the thresholds are the F1 thresholds of the same frames, and the saved decoder started from them
    probs, targets = collector.frames()
    np.testing.assert_array_equal(probs, np.concatenate([videos[v][0] for v in sorted(videos)]))
    np.testing.assert_array_equal(thresholds.thresholds(), optimize_thresholds(probs, targets))
    assert json.loads((tmp_path / "thr.json").read_text())["blood"] == pytest.approx(
        thresholds.thresholds()[L["blood"]]
    )
    saved = json.loads((tmp_path / "decoder.json").read_text())
    assert saved["fit"]["videos"] == 4
    # the held-out decoding is the documented cross-fitting of the tuner's own fit
    again = cross_fitted_events(inputs, folds=2, fit=tuner._fold_fit)
    assert again == held_out
    # the frame-level AP came from the same frames
    assert evaluator.state.metrics["ap"] == pytest.approx(
        float(np.nanmean(list(evaluator.state.metric_details["ap"].values())))
    )


def test_handler_order_does_not_matter(tmp_path):
    videos = _videos(seed=1)
    results = []
    for order in ("bundle", "reversed"):
        out = tmp_path / order
        evaluator, _, _, _, calls = _evaluator(out, videos, order=order)
        evaluator.run()
        results.append((evaluator.state.metrics["tmap"], json.loads((out / "decoder.json").read_text()), len(calls)))
    (m1, d1, n1), (m2, d2, n2) = results
    d1["fit"].pop("seconds"), d2["fit"].pop("seconds")
    assert m1 == m2 and d1 == d2 and n1 == n2 == 3


def test_decoder_fitted_once_per_validation_across_epochs(tmp_path):
    videos = _videos(seed=2)
    evaluator, collector, _, tuner, calls = _evaluator(tmp_path, videos)
    evaluator.run()
    first = len(calls)
    evaluator.run(global_epoch=2)  # a second validation of the same model: not better, so nothing is saved
    assert first == 3 and len(calls) - first == 2 and tuner.fits == 2  # the two fold fits of the metric only
    assert collector.generation >= 2


def test_bundle_config_wires_one_collector_explicitly(mini_galar, tmp_path):
    from pathlib import Path

    from monai.bundle import ConfigParser

    configs = Path(__file__).resolve().parents[2] / "bundle" / "configs"
    parser = ConfigParser()
    parser.read_config([str(configs / "train.json"), str(configs / "demo.json")])
    parser.update({"dataset_dir": str(mini_galar), "bundle_root": str(tmp_path)})
    collector = parser.get_parsed_content("validate#collector")
    metric = parser.get_parsed_content("validate#key_metric")["val_temporal_mAP"]
    tuner = parser.get_parsed_content("validate#decoder_tuner")
    thresholds = parser.get_parsed_content("validate#threshold_optimizer")
    handlers = parser.get_parsed_content("validate#handlers")
    assert metric.collector is collector and tuner.collector is collector and thresholds.collector is collector
    assert metric.decoder is tuner and tuner.thresholds is thresholds
    assert parser.get_parsed_content("validate#additional_metrics")["val_mean_AP"].collector is collector
    assert collector in handlers and thresholds in handlers and tuner in handlers
    # the ground truth of validation is that of the labels CSVs of the validation videos
    val_ids = sorted({d["video_id"] for d in parser.get_parsed_content("split")[1]})
    assert sorted(collector.ground_truth) == val_ids
