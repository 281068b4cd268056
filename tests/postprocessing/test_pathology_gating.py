"""The tuner's choice of section gates for pathologies (``anatomy.pathology_sections``)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from monai_vce.events import Video
from monai_vce.labels import LABELS
from monai_vce.postprocessing import DecoderParams, EventDecoder, tune_decoder
from monai_vce.postprocessing.tuning import _Video, pathology_section_candidates

L = {n: i for i, n in enumerate(LABELS)}
GRIDS = {"threshold": (0.5,), "median_window": (1,), "max_gap": (0,), "min_length": (0,), "hysteresis": (0.0,)}


def _videos(false_bursts: bool, n: int = 4) -> list[Video]:
    """Stomach then small intestine; ulcers in the small intestine, and (optionally) more confident false ulcer
    bursts in the stomach."""
    out = []
    for k in range(n):
        T = 300
        p = np.full((T, 17), 0.01)
        p[:100, L["stomach"]] = 0.95
        p[100:, L["small intestine"]] = 0.95
        s = 150 + 10 * k
        p[s : s + 20, L["ulcer"]] = 0.7
        if false_bursts:
            p[30 + k : 45 + k, L["ulcer"]] = 0.9
        gt = [
            {"start": 0, "end": 99, "label": ["stomach"]},
            {"start": 100, "end": s - 1, "label": ["small intestine"]},
            {"start": s, "end": s + 19, "label": ["small intestine", "ulcer"]},
            {"start": s + 20, "end": T - 1, "label": ["small intestine"]},
        ]
        out.append(Video(f"v{k}", p, np.arange(T), np.arange(T), events=gt))
    return out


def test_candidates_are_the_sections_holding_the_positive_frames():
    vids = [_Video(v) for v in _videos(False)]
    assert pathology_section_candidates(vids) == {"ulcer": ["small intestine"]}
    # a share below 1 of the frames outside the main section does not need a section of its own
    v = _videos(False, 1)[0]
    v.events.append({"start": 10, "end": 10, "label": ["ulcer"]})  # 1 of 21 ulcer frames in the stomach
    vids = [_Video(v)]
    assert pathology_section_candidates(vids, 0.99) == {"ulcer": ["stomach", "small intestine"]}
    assert pathology_section_candidates(vids, 0.9) == {"ulcer": ["small intestine"]}


@pytest.mark.parametrize("false_bursts", [True, False])
def test_the_tuner_gates_a_pathology_only_where_it_helps(false_bursts):
    videos = _videos(false_bursts)
    kw = {"grids": GRIDS, "anatomy": True, "anatomy_grid": None, "rounds": 1, "presence_folds": 0}
    tuned = tune_decoder(videos, pathology_gating=0.99, **kw)
    gates = dict(tuned["anatomy"]["pathology_sections"])
    if false_bursts:
        assert gates == {"ulcer": ("small intestine",)}
        ulcers = [e for e in EventDecoder(tuned).decode(videos[0]) if "ulcer" in e["label"]]
        assert [(e["start"], e["end"]) for e in ulcers] == [(150, 169)]
        # not tried by default: the decoder of today
        assert dict(tune_decoder(videos, **kw)["anatomy"]["pathology_sections"]) == {}
    else:
        assert gates == {}
    with pytest.raises(ValueError, match=r"pathology_gating: must be a share in \(0, 1\]"):
        tune_decoder(videos, pathology_gating=1.5, **kw)


def test_section_gates_round_trip_and_are_validated(tmp_path):
    params = DecoderParams({"anatomy": {"enabled": True, "pathology_sections": {"ulcer": ["small intestine"]}}})
    path = params.save(tmp_path / "decoder.json")
    assert DecoderParams.load(path) == params
    cases = {
        "ulcer": (["duodenum"], r"anatomy.pathology_sections.ulcer.0: must be one of \['mouth', .*got 'duodenum'"),
        "stomach": (["stomach"], r"anatomy.pathology_sections.stomach: must be a non-section label"),
    }
    for label, (value, match) in cases.items():
        d = params.to_dict()
        d["anatomy"]["pathology_sections"] = {label: value}
        path.write_text(json.dumps(d))
        with pytest.raises(ValueError, match=match) as err:
            DecoderParams.load(path)
        assert str(err.value).startswith(f"{path}: ") and "\n" not in str(err.value)
