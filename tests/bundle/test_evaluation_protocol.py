"""Evaluation scores held-out events and says so; a decoder's score on the videos it was tuned on is labelled apart."""

from __future__ import annotations

import json

import torch
from monai.engines import SupervisedEvaluator
from test_validation_outputs import TUNE, _loader, _videos

from monai_vce.handlers import DecoderTuningHandler, TemporalMAPMetric, VideoFrameCollector
from monai_vce.metrics import load_events, temporal_map
from monai_vce.postprocessing import EventDecoder, tune_decoder
from monai_vce.stages import write_events
from monai_vce.utils import natural_key


def _evaluate(tmp_path, videos, decoder_factory):
    collector = VideoFrameCollector(label_key="label")
    tuner = DecoderTuningHandler(tmp_path / "never_written.json", collector=collector, tune_kwargs=TUNE)
    held_out = TemporalMAPMetric(collector=collector, decoder=tuner)
    in_sample = TemporalMAPMetric(collector=collector, decoder=decoder_factory(collector))
    evaluator = SupervisedEvaluator(
        device=torch.device("cpu"),
        val_data_loader=_loader(videos),
        network=torch.nn.Identity(),
        key_val_metric={"held_out": held_out},
        additional_metrics={"in_sample": in_sample},
        val_handlers=[collector],  # the tuner is only asked for held-out events: it writes nothing
        decollate=False,
    )
    evaluator.run()
    return evaluator, collector, tuner, held_out, in_sample


def test_held_out_events_are_written_scored_and_labelled(tmp_path):
    videos = _videos(n=4)
    # the decoder of decoder.json: tuned on all four videos, i.e. in sample
    inputs_holder = {}

    def tuned_on_all(collector):
        def decode(probs, frame_ids):
            if "params" not in inputs_holder:
                inputs_holder["params"] = tune_decoder(collector.labelled_videos(), **TUNE)
            return EventDecoder(inputs_holder["params"])(probs, frame_ids)

        return decode

    evaluator, collector, tuner, held_out, in_sample = _evaluate(tmp_path, videos, tuned_on_all)
    assert held_out.protocol.startswith("held out: each video decoded by a decoder tuned on the other folds")
    assert in_sample.protocol.startswith("decoded with the given decoder")
    assert not (tmp_path / "never_written.json").exists()
    # the written events are those the key metric scored: the same score from the file
    path = write_events(held_out.events, tmp_path / "val_events.json")
    written = load_events(path)
    assert [v["video_id"] for v in written["videos"]] == sorted(held_out.events, key=natural_key)
    gt = {"videos": [{"video_id": vid, "events": v.events} for vid, v in collector.labelled_videos().items()]}
    rescored = temporal_map(gt, written)["mAP@0.5"]
    assert rescored == evaluator.state.metrics["held_out"]
    held = tuner.held_out_events(collector.labelled_videos())
    assert {v["video_id"]: v["events"] for v in written["videos"]} == {
        vid: [{k: e[k] for k in ("start", "end", "label")} for e in events] for vid, events in held.items()
    }
    assert json.loads(path.read_text())["videos"][0]["video_id"] == "v0"


def test_too_few_videos_to_cross_fit_is_said(tmp_path):
    _, _, _, held_out, _ = _evaluate(tmp_path, _videos(n=1), lambda collector: EventDecoder())
    assert "too few to cross-fit" in held_out.protocol and "untuned" in held_out.protocol
