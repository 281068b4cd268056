"""Decoder parameters: the step registry they derive from, the JSON schema's bounds and errors, immutability, and
loading and saving files."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest

from monai_vce.events import Video, frames_to_events
from monai_vce.labels import LABELS
from monai_vce.postprocessing import (
    CHAIN_STEPS,
    MAX_FRAMES,
    ChainStep,
    DecoderParams,
    EventDecoder,
    Param,
    decoder_params_schema,
    run_chain,
    tune_decoder,
)
from monai_vce.postprocessing.chain import remove_short_runs
from monai_vce.postprocessing.tuning import default_grids

L = {n: i for i, n in enumerate(LABELS)}


def _remove_long_runs(mask: np.ndarray, max_lengths: np.ndarray) -> np.ndarray:
    """Kernel of the test step: active runs longer than max_length frames are removed (0: off)."""
    long = remove_short_runs(mask, max_lengths + 1)  # the runs of at least max_length + 1 frames
    return np.where((max_lengths > 0)[None, :], mask & ~long, mask)


MAX_LENGTH = ChainStep(
    "max_length",
    Param("max_length", "integer", 0, 0, MAX_FRAMES, grid=(0, 20)),
    _remove_long_runs,
    needs_mask=True,
    doc="active runs longer than max_length frames are removed (0: off)",
)


def test_a_new_decoding_step_is_one_definition(monkeypatch):
    monkeypatch.setitem(CHAIN_STEPS, "max_length", MAX_LENGTH)
    # defaults, schema and validation derive from the definition
    params = DecoderParams()
    assert params["labels"]["ulcer"]["max_length"] == 0
    assert "max_length" in decoder_params_schema()["properties"]["labels"]["properties"]["ulcer"]["properties"]
    with pytest.raises(ValueError, match=r"labels.ulcer.max_length: must be an integer in \[0, 10000000\], got -1"):
        DecoderParams({"labels": {"ulcer": {"max_length": -1}}})
    with pytest.raises(ValueError, match="'max_length' works on the binary mask and must come after 'threshold'"):
        DecoderParams({"order": ["max_length", "threshold"]})
    # the decoder runs its kernel: a 60-frame false run of polyp goes, the 10-frame one stays
    probs = np.full((200, 17), 0.01)
    probs[20:80, L["polyp"]] = 0.9
    probs[120:130, L["polyp"]] = 0.9
    order = ["threshold", "max_length"]
    with_step = DecoderParams({"order": order, "labels": {"polyp": {"max_length": 20}}, "ranking": "none"})
    events = EventDecoder(with_step)(probs, np.arange(200))
    assert events == [{"start": 120, "end": 129, "label": ["polyp"]}]
    assert len(EventDecoder(DecoderParams({"order": order, "ranking": "none"}))(probs, np.arange(200))) == 2
    np.testing.assert_array_equal(
        run_chain(probs, {"max_length": 20}, order)[:, L["polyp"]], np.isin(np.arange(200), np.arange(120, 130))
    )
    # the tuner searches its grid: on videos whose true polyp events are short, it picks max_length 20
    assert default_grids()["max_length"] == (0, 20)
    videos = []
    for k in range(4):
        p = np.full((200, 17), 0.01)
        p[20:80, L["polyp"]] = 0.9  # a long false run in every video
        p[120 + k : 130 + k, L["polyp"]] = 0.9
        gt = [{"start": 120 + k, "end": 129 + k, "label": ["polyp"]}]
        videos.append(Video(f"v{k}", p, np.arange(200), np.arange(200), events=gt))
    grids = {"threshold": (0.5,), "max_length": (0, 20)}
    tuned = tune_decoder(videos, base={"order": order}, grids=grids, anatomy=False, rounds=1, presence_folds=0)
    assert tuned["labels"]["polyp"]["max_length"] == 20


def test_numeric_parameters_are_bounded_with_one_line_errors(tmp_path):
    good = DecoderParams.paper(anatomy={"enabled": True}).to_dict()
    cases = {
        ("labels", "ulcer", "median_window"): (1_000_000_001, r"labels.ulcer.median_window: must be an odd integer"),
        ("labels", "ulcer", "max_gap"): (10**30, r"labels.ulcer.max_gap: must be an integer in \[0, 10000000\]"),
        ("labels", "ulcer", "min_length"): (True, r"labels.ulcer.min_length: must be an integer"),
        ("labels", "ulcer", "threshold"): (
            float("nan"),
            r"labels.ulcer.threshold: must be a finite number in \[0, 1\]",
        ),
        ("anatomy", "emission_weight"): (1e308, r"anatomy.emission_weight: must be a finite number in \[0, 1000\]"),
        ("anatomy", "switch_cost"): (float("inf"), r"anatomy.switch_cost: must be a finite number"),
        ("anatomy", "landmark_window", "pylorus"): (10**20, r"anatomy.landmark_window.pylorus: must be an integer"),
        ("labels", "polyp", "presence"): ({"feature": "peak", "window": 0, "cutoff": 0.5}, r"presence.window"),
    }
    for keys, (value, match) in cases.items():
        d = json.loads(json.dumps(good))
        node = d
        for k in keys[:-1]:
            node = node[k]
        node[keys[-1]] = value
        path = tmp_path / "decoder.json"
        path.write_text(json.dumps(d))
        with pytest.raises(ValueError, match=match) as err:
            DecoderParams.load(path)
        message = str(err.value)
        assert message.startswith(f"{path}: ") and "\n" not in message, message


def test_unknown_and_missing_keys(tmp_path):
    d = DecoderParams.paper().to_dict()
    d["labels"]["ulcer"]["treshold"] = 0.3
    path = tmp_path / "decoder.json"
    path.write_text(json.dumps(d))
    with pytest.raises(ValueError, match=r"labels.ulcer.treshold: unknown key"):
        DecoderParams.load(path)
    with pytest.raises(ValueError, match=r"anatomy.viterbi: unknown key"):
        DecoderParams({"anatomy": {"viterbi": True}})
    with pytest.raises(ValueError, match=r"colour: unknown key"):
        DecoderParams({"colour": "red"})
    # a file missing a label is an error naming it (no silent defaults) ...
    d = DecoderParams.paper().to_dict()
    del d["labels"]["polyp"]
    path.write_text(json.dumps(d))
    with pytest.raises(ValueError, match=r"labels: missing label 'polyp'"):
        DecoderParams.load(path)
    # ... a missing per-label key (e.g. of a step added later) takes the step's default, with a warning naming it
    d = DecoderParams.paper().to_dict()
    d["labels"]["ulcer"]["threshold"] = 0.3
    del d["labels"]["polyp"]["max_gap"]
    path.write_text(json.dumps(d))
    with pytest.warns(UserWarning, match=r"labels.polyp.max_gap not given: using the default \(max_gap=5\)"):
        loaded = DecoderParams.load(path)
    assert loaded["labels"]["polyp"]["max_gap"] == 5 and loaded["labels"]["ulcer"]["threshold"] == 0.3


def test_parameters_are_immutable():
    params = DecoderParams.paper()
    with pytest.raises(TypeError):
        params["labels"]["ulcer"]["threshold"] = 0.2  # type: ignore[index]
    with pytest.raises(TypeError):
        params.data["ranking"] = "max"  # type: ignore[index]
    changed = params.with_label("ulcer", threshold=0.2).replace(ranking="max").with_anatomy(enabled=True)
    assert params["labels"]["ulcer"]["threshold"] == 0.5 and params["ranking"] == "mean"
    assert changed["labels"]["ulcer"]["threshold"] == 0.2 and changed["ranking"] == "max"
    assert changed["anatomy"]["enabled"] and changed != params
    assert DecoderParams(changed.to_dict()) == changed
    with pytest.raises(ValueError, match=r"labels.ulcer.threshold"):
        params.with_label("ulcer", threshold=2.0)


FULL_FILE = {
    "version": 1,
    "labels": {
        n: {"threshold": 0.4, "median_window": 5, "max_gap": 2, "min_length": 3, "presence": {"feature": "none"}}
        for n in LABELS
    },
    "order": ["threshold", "median", "fill_gaps", "min_length"],
    "composition": "label_set",
    "ranking": "min",
    "frame_units": "frame_index",
    "anatomy": {
        "enabled": True,
        "emission_weight": 0.1,
        "switch_cost": 1.25,
        "skip_cost": 1.25,
        "backward_cost": 3.75,
        "entry_cost": 0.0,
        "landmark_window": {"z-line": 100, "pylorus": 100, "ileocecal valve": 100},
        "gate_landmarks": True,
        "pathology_sections": {},
    },
    "fit": {"videos": 12, "objective": 0.5, "out_of_fold_gain": {"colon": {"emit": True}}},
}


def test_a_full_file_loads_decodes_and_saves_again(tmp_path):
    FULL_FILE["labels"]["ulcer"]["presence"] = {"feature": "peak", "window": 9, "cutoff": 0.31}
    path = tmp_path / "decoder.json"
    path.write_text(json.dumps({**FULL_FILE, "frame_units": "index"}))
    with pytest.raises(ValueError, match=r"decoder.json: frame_units: must be one of .*got 'index'"):
        DecoderParams.load(path)  # no value outside the current vocabulary is read
    path.write_text(json.dumps(FULL_FILE))
    params = DecoderParams.load(path)
    assert params["frame_units"] == "frame_index" and params.frame_units == "frame_index"
    assert params["labels"]["ulcer"]["presence"]["cutoff"] == 0.31 and params["fit"]["videos"] == 12
    rng = np.random.default_rng(0)
    events = EventDecoder(params)(rng.random((300, 17)), np.arange(300))
    assert events and all(isinstance(e["start"], int) for e in events)
    # what is saved loads again, without a warning
    params.save(tmp_path / "new.json")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert DecoderParams.load(tmp_path / "new.json") == params
    assert json.loads((tmp_path / "new.json").read_text())["frame_units"] == "frame_index"


def test_decoding_with_the_unified_kernels_matches_the_composition_of_events():
    """The decoder's confidence order and the tuner's segment scoring use one kernel: check the decoder's events
    against a composition of its own mask, ranked by the documented rule."""
    rng = np.random.default_rng(3)
    probs = np.clip(rng.normal(0.3, 0.3, (400, 17)), 0, 1)
    for ranking in ("mean", "max", "min"):
        dec = EventDecoder(DecoderParams.paper(ranking=ranking))
        events = dec(probs, np.arange(400))
        mask = dec.masks(probs)
        by_time = frames_to_events(mask, np.arange(400))
        assert sorted(map(json.dumps, events)) == sorted(map(json.dumps, by_time))
        scores = [
            {"mean": np.mean, "max": np.max, "min": np.min}[ranking](
                [probs[e["start"] : e["end"] + 1, L[n]].mean() for n in e["label"]]
            )
            for e in events
        ]
        assert np.all(np.diff(scores) <= 1e-12)


def test_parameters_pickle_and_deep_copy():
    import copy
    import pickle

    params = DecoderParams.paper(anatomy={"enabled": True}).with_label("ulcer", threshold=0.2)
    assert pickle.loads(pickle.dumps(params)) == params
    clone = copy.deepcopy(params)
    assert clone == params and clone.source == params.source
