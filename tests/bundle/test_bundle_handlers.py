"""The bundle's handlers on small hand-made engines: probability writer, decoder tuning, atomic checkpoints, frame AP."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from ignite.engine import Engine, Events

from monai_vce.events import load_video_probs
from monai_vce.handlers import AtomicCheckpointSaver, DecoderTuningHandler, ProbabilityWriter
from monai_vce.labels import LABELS
from monai_vce.postprocessing.decoder import DecoderParams
from monai_vce.stages import decode, report


def _batches(videos: dict[str, int], batch: int, seed: int = 0, labels: bool = False):
    """Batches of (probs, video ids, frame indices) with the frames of each video in order."""
    rng = np.random.default_rng(seed)
    rows = [(vid, i) for vid, n in videos.items() for i in range(n)]
    probs = rng.random((len(rows), 17)).astype(np.float32)
    target = (rng.random((len(rows), 17)) > 0.7).astype(np.float32)
    out = []
    for s in range(0, len(rows), batch):
        part = rows[s : s + batch]
        b = {
            "video_id": [r[0] for r in part],
            "frame_index": torch.tensor([r[1] for r in part]),
            "frame_number": torch.tensor([5 * r[1] + 2 for r in part]),
        }
        o = {"pred": torch.from_numpy(probs[s : s + batch])}
        if labels:
            o["label"] = torch.from_numpy(target[s : s + batch])
        out.append((b, o))
    return out, probs, target, rows


def _engine(batches):
    def step(engine, item):
        engine.state.batch = item[0]
        return item[1]

    # like MONAI's evaluators: state.batch holds the collated batch, the step returns the (batched) output
    return Engine(step)


def test_probability_writer_streams_each_video_and_decode_writes_the_json(tmp_path):
    batches, probs, _, _ = _batches({"1": 7, "2": 5, "ukdd_navi_00003": 9}, batch=4)
    writer = ProbabilityWriter(tmp_path / "probs")
    engine = _engine(batches)
    writer.attach(engine)
    seen_after_iteration = []
    engine.add_event_handler(Events.ITERATION_COMPLETED, lambda e: seen_after_iteration.append(list(writer.written)))
    engine.run(batches, max_epochs=1)
    # video 1 ends inside batch 2 and is written when batch 2 (which starts video 2) is collected
    assert seen_after_iteration[0] == [] and seen_after_iteration[1] == ["1"]
    assert writer.written == ["1", "2", "ukdd_navi_00003"]
    start = 0
    for vid, n in (("1", 7), ("2", 5), ("ukdd_navi_00003", 9)):
        v = load_video_probs(tmp_path / "probs" / f"{vid}.npz")
        np.testing.assert_array_equal(v.probs, probs[start : start + n])
        assert v.frame_index.tolist() == list(range(n)) and v.frame_number.tolist() == [5 * i + 2 for i in range(n)]
        with np.load(tmp_path / "probs" / f"{vid}.npz") as z:
            assert list(z["labels"]) == list(LABELS)
        start += n
    assert sorted(p.name for p in (tmp_path / "probs").iterdir()) == ["1.npz", "2.npz", "ukdd_navi_00003.npz"]
    decode(tmp_path / "probs", tmp_path / "events.json")
    events = json.loads((tmp_path / "events.json").read_text())
    assert [v["video_id"] for v in events["videos"]] == ["1", "2", "ukdd_navi_00003"]
    from monai_vce.postprocessing.decoder import EventDecoder

    expected = EventDecoder()(probs[:7], np.arange(7))
    assert events["videos"][0]["events"] == [{k: e[k] for k in ("start", "end", "label")} for e in expected]


def test_decode_frame_number_units_and_video_list(tmp_path):
    batches, _, _, _ = _batches({"1": 6, "2": 6}, batch=5)
    writer = ProbabilityWriter(tmp_path)
    engine = _engine(batches)
    writer.attach(engine)
    engine.run(batches, max_epochs=1)
    decode(tmp_path, tmp_path / "out.json", frame_units="frame_number", videos=["2", "1"])
    events = json.loads((tmp_path / "out.json").read_text())
    assert [v["video_id"] for v in events["videos"]] == ["2", "1"]
    starts = {e["start"] for v in events["videos"] for e in v["events"]}
    ends = {e["end"] for v in events["videos"] for e in v["events"]}
    assert starts and all(f % 5 == 2 for f in starts)  # frame numbers 5 * index + 2
    # an event ends one frame before the next row's frame number (the ground truth's gap rule), or on the last row
    assert ends and all(f % 5 == 1 or f == 5 * 5 + 2 for f in ends)


def test_probability_writer_refuses_nan_probabilities(tmp_path):
    batches, _, _, _ = _batches({"1": 4, "2": 4}, batch=4)
    batches[0][1]["pred"][2, 5] = float("nan")
    writer = ProbabilityWriter(tmp_path)
    engine = _engine(batches)
    writer.attach(engine)
    with pytest.raises(ValueError, match=r"video 1: non-finite probability .* frame_index 2"):
        engine.run(batches, max_epochs=1)
    assert not (tmp_path / "1.npz").exists()


def test_decode_reports_missing_files(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"no probability file for video\(s\) a in .*: run inference"):
        decode(tmp_path, tmp_path / "events.json", videos=["a"])
    assert not (tmp_path / "events.json").exists()


def test_decoder_tuning_handler_fits_and_saves(tmp_path):
    from monai_vce.events import ground_truth_events
    from monai_vce.handlers import ThresholdOptimizationHandler, VideoFrameCollector
    from monai_vce.postprocessing import optimize_thresholds

    batches, probs, target, _ = _batches({"1": 40, "2": 30}, batch=16, labels=True)
    calls = {}

    def fake_tune(videos, base=None):
        from monai_vce.events import videos_units
        from monai_vce.postprocessing.decoder import DecoderParams

        frame_units = videos_units(videos.values()).value  # the units of the videos' events, as tune_decoder reads
        calls["videos"], calls["kwargs"] = videos, {"base": base, "frame_units": frame_units}
        return DecoderParams({"frame_units": frame_units, "fit": {"videos": len(videos), "mAP@0.5": 0.5}})

    # the explicit data path of the bundle: one collector, the threshold optimiser handed to the tuner
    collector = VideoFrameCollector(label_key="label")
    thresholds = ThresholdOptimizationHandler(collector=collector)
    handler = DecoderTuningHandler(
        tmp_path / "decoder.json", write_on="always", tune_fn=fake_tune, collector=collector, thresholds=thresholds
    )
    engine = _engine(batches)
    handler.attach(engine)  # attaches the collector too; the thresholds handler is not even attached
    engine.run(batches, max_epochs=1)
    assert set(calls["videos"]) == {"1", "2"}
    video = calls["videos"]["1"]
    np.testing.assert_array_equal(video.probs, probs[:40])
    np.testing.assert_array_equal(video.frame_ids(calls["kwargs"]["frame_units"]), np.arange(40))
    assert video.events == ground_truth_events(np.arange(40), target[:40])
    expected = optimize_thresholds(probs, target, 0.05, 0.95)
    got = [calls["kwargs"]["base"]["labels"][n]["threshold"] for n in LABELS]
    np.testing.assert_allclose(got, expected)
    saved = json.loads((tmp_path / "decoder.json").read_text())
    assert saved["frame_units"] == "frame_index" and saved["fit"]["videos"] == 2
    assert handler.fits == 1  # nothing asked for the held-out decoding: one fit, on all videos


def test_decoder_tuning_handler_own_collector_in_the_given_units(tmp_path):
    batches, _, _, _ = _batches({"1": 40, "2": 30}, batch=16, labels=True)
    calls = {}

    def fake_tune(videos, base=None):
        calls["base"], calls["events"] = base, videos["1"].events
        return DecoderParams({"fit": {"videos": len(videos)}})

    handler = DecoderTuningHandler(
        tmp_path / "d.json", write_on="always", frame_units="frame_number", tune_fn=fake_tune
    )
    assert handler.write_on == "always" and handler.frame_units == "frame_number"
    assert handler.collector.frame_units == "frame_number"
    engine = _engine(batches)
    handler.attach(engine)
    engine.run(batches, max_epochs=1)
    assert calls["base"] is None  # no threshold handler: the fit starts from the defaults
    # the ground truth is in the collector's units (frame_number: 5 * row + 2 in these batches)
    assert calls["events"] and calls["events"][0]["start"] == 2 and calls["events"][-1]["end"] == 5 * 39 + 2
    assert json.loads((tmp_path / "d.json").read_text())["fit"]["videos"] == 2
    with pytest.raises(ValueError, match="write_on must be one of"):
        DecoderTuningHandler(tmp_path / "d.json", write_on="every")


def test_decoder_tuning_handler_best_only(tmp_path):
    batches, _, _, _ = _batches({"1": 10}, batch=5, labels=True)
    handler = DecoderTuningHandler(tmp_path / "decoder.json", tune_fn=lambda v, **k: pytest.fail("must not tune"))
    engine = _engine(batches)
    handler.attach(engine)
    engine.state.best_metric_epoch = -1  # as if the key metric had not improved
    engine.run(batches, max_epochs=1)  # best_metric_epoch != epoch: no tuning
    assert not (tmp_path / "decoder.json").exists()


def test_atomic_checkpoint_saver_keeps_a_complete_file(tmp_path, monkeypatch):
    net = torch.nn.Linear(2, 2)
    engine = Engine(lambda e, b: None)
    saver = AtomicCheckpointSaver(
        str(tmp_path), {"model": net, "trainer": engine}, save_interval=1, interval_filename="last.pt"
    )
    saver.attach(engine)
    engine.run([0], max_epochs=2)
    state = torch.load(tmp_path / "last.pt", weights_only=True)
    assert state["trainer"]["iteration"] == 2 and sorted(p.name for p in tmp_path.iterdir()) == ["last.pt"]
    # a save that dies half-way leaves the previous checkpoint in place
    import monai_vce.handlers.checkpoint as ckpt

    def boom(path, data):
        raise KeyboardInterrupt("killed while writing")

    monkeypatch.setattr(ckpt, "atomic_write_bytes", boom)
    with pytest.raises(KeyboardInterrupt):
        engine.run([0], max_epochs=3)
    assert torch.load(tmp_path / "last.pt", weights_only=True)["trainer"]["iteration"] == 2


def test_multilabel_average_precision_matches_monai():
    from monai.metrics import AveragePrecisionMetric

    from monai_vce.handlers.frame_metrics import multilabel_average_precision

    rng = np.random.default_rng(0)
    p, y = rng.random((300, 17)), (rng.random((300, 17)) > 0.8).astype(np.float64)
    y[:, 4] = 0
    ours = multilabel_average_precision(p, y)
    m = AveragePrecisionMetric(average="none")
    m(torch.tensor(p), torch.tensor(y))
    ref = np.array([float(v) for v in m.aggregate()])
    assert np.isnan(ours[4])
    np.testing.assert_allclose(ours[~np.isnan(ours)], ref[~np.isnan(ours)], rtol=1e-6)


class _Head(torch.nn.Module):
    def __init__(self, num_classes: int) -> None:
        super().__init__()
        self.num_classes = num_classes
        self.body = torch.nn.Linear(4, 8)
        self.head = torch.nn.Linear(8, num_classes)


def _load_with(path, load_dict):
    from monai_vce.handlers import VCECheckpointLoader

    engine = Engine(lambda e, b: 0)
    VCECheckpointLoader(load_path=str(path), load_dict=load_dict).attach(engine)
    engine.run([0], max_epochs=1)


def test_checkpoint_loader_names_the_file_and_class_counts(tmp_path):
    five = tmp_path / "five.pt"
    torch.save(_Head(5).state_dict(), five)
    with pytest.raises(ValueError) as info:
        _load_with(five, {"model": _Head(17)})
    msg = str(info.value)
    assert msg == (
        f"checkpoint {five} is a network of 5 classes, the configured network has 17: use a checkpoint trained "
        f"for 17 classes (or set the network's num_classes)"
    )
    # another mismatch: the file and the first problem, on one line
    partial = tmp_path / "partial.pt"
    torch.save({"head.weight": torch.zeros(17, 8), "head.bias": torch.zeros(17)}, partial)
    with pytest.raises(ValueError) as info:
        _load_with(partial, {"model": _Head(17)})
    assert str(info.value).startswith(f"checkpoint {partial} does not fit the configured network: Missing key(s)")
    assert "\n" not in str(info.value)
    # a matching checkpoint loads (nested under its key, as in a training checkpoint)
    net, ref = _Head(17), _Head(17)
    both = tmp_path / "both.pt"
    torch.save({"model": ref.state_dict(), "other": ref.state_dict()}, both)
    _load_with(both, {"model": net, "other": _Head(17)})
    assert torch.equal(net.head.weight, ref.head.weight)


def test_best_metric_state_round_trip(tmp_path):
    from monai.engines import SupervisedEvaluator

    from monai_vce.handlers import BestMetricState

    def evaluator():
        return SupervisedEvaluator(device=torch.device("cpu"), val_data_loader=[0], network=_Head(17), epoch_length=1)

    saver = AtomicCheckpointSaver(
        str(tmp_path), {"model": _Head(17)}, save_key_metric=True, key_metric_filename="model.pt"
    )
    ev = evaluator()
    ev.state.best_metric, ev.state.best_metric_epoch = 0.75, 3
    saver._key_metric_checkpoint.load_state_dict({"_saved": [(0.75, "model_key_metric=0.7500.pt")]})
    path = tmp_path / "state.pt"
    torch.save({"best": BestMetricState(ev, saver).state_dict()}, path)

    new_saver = AtomicCheckpointSaver(
        str(tmp_path), {"model": _Head(17)}, save_key_metric=True, key_metric_filename="model.pt"
    )
    new_ev = evaluator()
    assert new_ev.state.best_metric_epoch == -1
    BestMetricState(new_ev, new_saver).load_state_dict(torch.load(path, weights_only=True)["best"])
    assert (new_ev.state.best_metric, new_ev.state.best_metric_epoch) == (0.75, 3)
    assert [(i.priority, i.filename) for i in new_saver._key_metric_checkpoint._saved] == [
        (0.75, "model_key_metric=0.7500.pt")
    ]
    with pytest.raises(KeyError, match="best_metric_epoch"):
        BestMetricState(new_ev, new_saver).load_state_dict({"best_metric": 1.0})


def test_report_draws_the_timelines_or_warns_once_without_matplotlib(tmp_path, monkeypatch, caplog):
    import logging

    import monai_vce.report.summary as summary

    batches, _, _, _ = _batches({"1": 6, "2": 8}, batch=5)
    writer = ProbabilityWriter(tmp_path / "probs", name="vce")
    engine = _engine(batches)
    writer.attach(engine)
    engine.run(batches, max_epochs=1)
    decode(tmp_path / "probs", tmp_path / "events.json")
    assert report(tmp_path / "events.json", tmp_path / "report", tmp_path / "probs") == tmp_path / "report"
    assert sorted(p.name for p in (tmp_path / "report" / "timelines").iterdir()) == ["1.png", "2.png"]
    assert (tmp_path / "report" / "summary.md").is_file()

    # without matplotlib: the events are still written, the report is skipped with a one-line warning
    def missing():
        raise ImportError("monai_vce.report draws its figures with matplotlib, which is not installed")

    monkeypatch.setattr(summary, "require_matplotlib", missing)
    with caplog.at_level(logging.WARNING, logger="monai_vce.stages"):
        assert report(tmp_path / "events.json", tmp_path / "report2", tmp_path / "probs") is None
    assert not (tmp_path / "report2").exists()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "install monai-vce[report]" in warnings[0] and "\n" not in warnings[0]
