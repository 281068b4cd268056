"""Event decoder: anatomy decoding, presence gating, confidence order, parameters and errors."""

from __future__ import annotations

import json

import numpy as np
import pytest

from monai_vce.events import Video, event_json
from monai_vce.labels import LABELS, SECTIONS
from monai_vce.postprocessing import (
    DecoderParams,
    EventDecoder,
    apply_presence_rules,
    decode_videos,
    fit_presence_rule,
    landmark_windows,
    transition_scores,
    viterbi_sections,
)
from monai_vce.postprocessing.anatomy import section_log_emissions

L = {n: i for i, n in enumerate(LABELS)}


def _viterbi_reference(e, a):
    T, S = e.shape
    d = e[0].copy()
    bp = np.zeros((T, S), int)
    for t in range(1, T):
        s = d[:, None] + a
        bp[t] = s.argmax(0)
        d = s.max(0) + e[t]
    path = np.zeros(T, int)
    path[-1] = d.argmax()
    for t in range(T - 1, 0, -1):
        path[t - 1] = bp[t, path[t]]
    return path


@pytest.mark.parametrize("T", [1, 2, 5, 37, 400])
def test_chunked_viterbi_matches_plain_recursion(T):
    rng = np.random.default_rng(T)
    e = rng.normal(size=(T, 5)) * 3
    a = transition_scores(5, 2.0, 1.0, 4.0)
    ref = _viterbi_reference(e, a)
    for chunk in (None, 3, 7):
        got = viterbi_sections(e, a, chunk=chunk)
        score = lambda p: e[np.arange(T), p].sum() + a[p[:-1], p[1:]].sum()  # noqa: E731
        assert score(got) == pytest.approx(score(ref))


def _noisy_sections(truth, rng, flip=0.3):
    T = len(truth)
    p = np.full((T, 5), 0.1)
    p[np.arange(T), truth] = 0.9
    noise = rng.random((T, 5)) < flip
    p[noise] = rng.random(noise.sum())
    return p


def test_viterbi_monotone_on_noisy_sequence():
    rng = np.random.default_rng(0)
    truth = np.repeat(np.arange(5), [50, 40, 200, 500, 300])
    p = _noisy_sections(truth, rng)
    # a short burst of "stomach" inside the small intestine must not create a backward move
    p[600:606, 2], p[600:606, 3] = 0.95, 0.05
    path = viterbi_sections(section_log_emissions(p, 0.5), transition_scores(5, 10.0, 10.0, 30.0))
    assert path.shape == (len(truth),)
    assert np.all(np.diff(path) >= 0)  # exactly one section per frame, monotone
    assert np.mean(path == truth) > 0.97
    # a long, strongly supported return to the stomach is decoded as a backward move
    p2 = p.copy()
    p2[650:750, :] = 0.02
    p2[650:750, 2] = 0.98
    path2 = viterbi_sections(section_log_emissions(p2, 0.5), transition_scores(5, 10.0, 10.0, 30.0))
    assert np.any(np.diff(path2) < 0)
    assert np.all(path2[660:740] == 2)


def test_viterbi_allowed_states():
    e = np.zeros((10, 5))
    e[:, 0] = 5.0
    path = viterbi_sections(e, transition_scores(), allowed=np.array([False, True, True, True, True]))
    assert 0 not in path


def test_landmark_windows():
    sections = np.repeat([0, 1, 2, 3, 4], [10, 10, 30, 30, 20])
    w = landmark_windows(sections, {"z-line": 2, "pylorus": 3, "ileocecal valve": 0})
    assert np.flatnonzero(w["z-line"]).tolist() == [18, 19, 20, 21]  # transition 1 -> 2 at frame 20
    assert np.flatnonzero(w["pylorus"]).tolist() == list(range(47, 53))
    assert not w["ileocecal valve"].any()  # window 0
    # no colon decoded: the ileocecal valve is nowhere allowed
    w2 = landmark_windows(np.repeat([2, 3], [5, 5]), 4)
    assert not w2["ileocecal valve"].any() and w2["pylorus"].any()


def _video(T=300, seed=0):
    """Probabilities of a simple video: stomach then small intestine, a pylorus at the boundary, an ulcer."""
    rng = np.random.default_rng(seed)
    p = rng.uniform(0.0, 0.1, size=(T, 17))
    p[: T // 2, L["stomach"]] = 0.9
    p[T // 2 :, L["small intestine"]] = 0.9
    p[T // 2 - 3 : T // 2 + 3, L["pylorus"]] = 0.8
    p[200:220, L["ulcer"]] = 0.7
    p[250:260, L["erosion"]] = 0.95
    return p


def test_decoder_label_set_events_and_units():
    p = _video()
    dec = EventDecoder(DecoderParams.paper())
    ev = dec(p, np.arange(300))
    # label-set runs: the small intestine is split by the pylorus, ulcer and erosion events
    si = sorted((e["start"], e["end"]) for e in ev if "small intestine" in e["label"])
    assert si == [(150, 152), (153, 199), (200, 219), (220, 249), (250, 259), (260, 299)]
    assert {"start": 147, "end": 149, "label": ["pylorus", "stomach"]} in ev
    assert {"start": 200, "end": 219, "label": ["small intestine", "ulcer"]} in ev
    # frame_number units: the same events in the caller's ids; the frames between two rows belong to the event
    # before them (the gap rule of the ground truth)
    ev2 = dec(p, np.arange(300) * 5 + 1000)
    assert sorted((e["start"], e["end"]) for e in ev2 if e["label"] == ["ulcer", "small intestine"][::-1]) == [
        (2000, 2099)
    ]
    per_label = EventDecoder(DecoderParams.paper(composition="per_label"))(p, np.arange(300))
    assert sorted((e["start"], e["end"]) for e in per_label if e["label"] == ["small intestine"]) == [(150, 299)]


def test_confidence_order():
    p = _video()
    ev = EventDecoder(DecoderParams.paper(ranking="mean"))(p, np.arange(300))
    scores = []
    for e in ev:
        cols = [L[n] for n in e["label"]]
        scores.append(p[e["start"] : e["end"] + 1, cols].mean(0).mean())
    assert np.all(np.diff(scores) <= 1e-12)
    # "max": the erosion event (0.95) comes first; "min": the ulcer-in-small-intestine event comes last
    ev_max = EventDecoder(DecoderParams.paper(ranking="max"))(p, np.arange(300))
    assert "erosion" in ev_max[0]["label"]
    ev_min = EventDecoder(DecoderParams.paper(ranking="min"))(p, np.arange(300))
    assert "ulcer" in ev_min[-1]["label"]
    # "none": time order
    ev_none = EventDecoder(DecoderParams.paper(ranking="none"))(p, np.arange(300))
    assert [e["start"] for e in ev_none] == sorted(e["start"] for e in ev_none)


def test_presence_gating_removes_absent_labels():
    p = _video()
    labels = {
        "ulcer": {"presence": {"feature": "peak", "window": 5, "cutoff": 0.8}},
        "erosion": {"presence": {"feature": "peak", "window": 5, "cutoff": 0.8}},
    }
    ev = EventDecoder(DecoderParams.paper(labels=labels))(p, np.arange(300))
    names = {n for e in ev for n in e["label"]}
    assert "ulcer" not in names and "erosion" in names
    never = EventDecoder(DecoderParams.paper(labels={"stomach": {"presence": {"feature": "never"}}}))(p, np.arange(300))
    assert not any("stomach" in e["label"] for e in never)
    present = apply_presence_rules(p, p > 0.5, [{"feature": "support", "cutoff": 15}] * 17)
    assert present[L["ulcer"]] and not present[L["pylorus"]] and not present[L["colon"]]


def test_fit_presence_rule():
    f = np.array([0.1, 0.2, 0.3, 0.8, 0.9, 0.95])
    absent = np.array([True, True, True, False, False, False])
    ap = np.array([0.0, 0.0, 0.0, 0.6, 0.7, 0.8])
    rule, score = fit_presence_rule([({"feature": "peak", "window": 1}, f)], ap, absent)
    assert rule == {"feature": "peak", "window": 1, "cutoff": pytest.approx(0.55)}
    assert score == pytest.approx((3 + 2.1) / 6)
    # emitting everywhere loses more than it gains: "never"
    rule, _ = fit_presence_rule([], np.array([0.1, 0.0, 0.0]), np.array([False, True, True]))
    assert rule == {"feature": "never"}


def test_anatomy_decoding_in_decoder():
    p = _video()
    p[100:110, L["colon"]] = 0.9  # a colon burst inside the stomach
    p[30:33, L["pylorus"]] = 0.9  # a pylorus far from the stomach -> small intestine boundary
    params = DecoderParams.paper(anatomy={"enabled": True, "landmark_window": 10})
    dec = EventDecoder(params)
    mask = dec.masks(p)
    assert np.all(mask[:, [L[s] for s in SECTIONS]].sum(1) == 1)
    assert not mask[100:110, L["colon"]].any()
    assert not mask[30:33, L["pylorus"]].any() and mask[148:152, L["pylorus"]].all()
    gated = EventDecoder(DecoderParams.paper(anatomy={"enabled": True, "pathology_sections": {"ulcer": ["stomach"]}}))
    assert not gated.masks(p)[:, L["ulcer"]].any()


def test_nan_error_names_video_and_frame():
    p = _video()
    p[17, 3] = np.nan
    with pytest.raises(ValueError, match=r"video 'v7'.*frame 17.*small intestine"):
        decode_videos([Video("v7", p, np.arange(300), np.arange(300))], EventDecoder())
    with pytest.raises(ValueError, match=r"outside \[0, 1\].*logits"):
        EventDecoder()(_video() * 3, np.arange(300))
    with pytest.raises(ValueError, match="strictly increasing"):
        EventDecoder()(_video(), np.r_[np.arange(299), 5])


def test_decode_videos_json():
    ids = np.arange(300)
    a, b = Video("a", _video(), ids, ids + 1000), Video("b", _video(seed=1), ids, ids + 1000)
    out = decode_videos({"a": a, "b": b}, DecoderParams.paper())
    from monai_vce.metrics import check_events

    check_events(out)
    assert [v["video_id"] for v in out["videos"]] == ["a", "b"]
    paper = EventDecoder(DecoderParams.paper())
    assert out == decode_videos([a, b], paper) == event_json({"a": paper(a.probs, ids), "b": paper(b.probs, ids)})
    # frame ids are chosen at the edge: the parameters' frame_units, or the video's (those of its ground truth)
    by_number = decode_videos([a], DecoderParams.paper(frame_units="frame_number"))
    assert by_number == decode_videos([a.replace(units="frame_number")], DecoderParams.paper())
    assert by_number["videos"][0]["events"] == EventDecoder(DecoderParams.paper())(a.probs, ids + 1000)
    assert (
        EventDecoder(DecoderParams.paper()).decode(a.replace(units="frame_number")) == by_number["videos"][0]["events"]
    )


def test_params_round_trip_and_errors(tmp_path):
    params = DecoderParams.paper(composition="per_label", frame_units="frame_number", anatomy={"enabled": True})
    params = params.with_label("ulcer", presence={"feature": "quantile", "q": 0.99, "cutoff": 0.7})
    path = params.save(tmp_path / "p.json")
    loaded = DecoderParams.load(path)
    assert loaded == params and loaded["version"] == 1 and loaded["frame_units"] == "frame_number"
    data = json.loads(path.read_text())
    assert set(data["labels"]) == set(LABELS)

    def bad(mutate, match):
        d = json.loads(path.read_text())
        mutate(d)
        f = tmp_path / "bad.json"
        f.write_text(json.dumps(d))
        with pytest.raises(ValueError, match=match):
            DecoderParams.load(f)

    bad(lambda d: d.update(version=2), r"bad.json.*'version' must be 1")
    bad(lambda d: d["labels"]["ulcer"].update(median_window=4), r"bad.json: labels.ulcer.median_window")
    bad(lambda d: d["labels"]["ulcer"].update(threshold=1.5), r"labels.ulcer.threshold")
    bad(lambda d: d["labels"].update(tumour={}), r"labels.tumour: unknown label")
    bad(lambda d: d.update(composition="runs"), r"composition: must be one of")
    bad(lambda d: d["labels"]["polyp"].update(presence={"feature": "peak"}), r"labels.polyp.presence.cutoff")
    bad(lambda d: d["anatomy"].update(landmark_window={"pylorus": -1}), r"anatomy.landmark_window.pylorus")
    (tmp_path / "broken.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"broken.json.* not valid JSON"):
        DecoderParams.load(tmp_path / "broken.json")
    with pytest.raises(FileNotFoundError, match=r"missing.json"):
        DecoderParams.load(tmp_path / "missing.json")
    # EventDecoder accepts the path
    assert EventDecoder(str(path)).params == params


def test_from_thresholds(tmp_path):
    f = tmp_path / "thr.json"
    f.write_text(json.dumps({"ulcer": 0.3, "stomach": 0.6}))
    params = DecoderParams.from_thresholds(f)
    assert params.per_label("threshold")[L["ulcer"]] == 0.3 and params.per_label("threshold")[L["colon"]] == 0.5
    assert params["labels"]["ulcer"]["median_window"] == 7
    f.write_text(json.dumps({"tumour": 0.3}))
    with pytest.raises(ValueError, match=r"thr.json: unknown label 'tumour'"):
        DecoderParams.from_thresholds(f)


def test_lead_in_frames_carry_no_section():
    from monai_vce.postprocessing.anatomy import LEAD_IN, decode_sections

    truth = np.repeat([-1, 0, 1, 2, 3], [40, 30, 20, 100, 100])
    p = np.full((truth.size, 5), 0.1)
    rows = truth >= 0
    p[np.flatnonzero(rows), truth[rows]] = 0.9
    sec = decode_sections(p, 0.1, 2.5, 2.5, 7.5, entry_cost=0.0)
    assert sec.tolist() == [LEAD_IN if t < 0 else t for t in truth.tolist()]
    # without the lead-in state the first section absorbs the unannotated frames
    assert (decode_sections(p, 0.1, 2.5, 2.5, 7.5, entry_cost=None)[:40] == 0).all()
    # leaving the lead-in crosses no landmark boundary
    assert not landmark_windows(sec, 5)["z-line"][:40].any()
    # in the decoder: lead-in frames belong to no event; a gated-out section still claims its frames
    probs = np.full((truth.size, 17), 0.01)
    probs[:, [L[s] for s in SECTIONS]] = p
    params = DecoderParams.paper(anatomy={"enabled": True, "switch_cost": 2.5, "skip_cost": 2.5, "entry_cost": 0.0})
    ev = EventDecoder(params)(probs, np.arange(truth.size))
    assert min(e["start"] for e in ev) == 40
    params = params.with_label("esophagus", presence={"feature": "never"})
    mask = EventDecoder(params).masks(probs)
    assert not mask[:, L["esophagus"]].any() and not mask[70:90].any() and mask[90:190, L["stomach"]].all()
    with pytest.raises(ValueError, match=r"anatomy.entry_cost"):
        DecoderParams({"anatomy": {"entry_cost": -1.0}})


def test_lead_in_logit_follows_a_shifted_model():
    from monai_vce.postprocessing.anatomy import LEAD_IN, decode_sections

    truth = np.repeat([-1, 0, 1, 2, 3], [40, 30, 20, 100, 100])
    z = np.full((truth.size, 5), -2.2)
    rows = truth >= 0
    z[np.flatnonzero(rows), truth[rows]] = 2.2
    calibrated = decode_sections(1 / (1 + np.exp(-z)), 0.1, 2.5, 2.5, 7.5, entry_cost=0.0)
    assert calibrated.tolist() == [LEAD_IN if t < 0 else t for t in truth.tolist()]
    shifted = 1 / (1 + np.exp(-(z - 2.5)))  # every section logit 2.5 lower: all below 0
    # at the calibrated level the lead-in outscores every section on every frame and is never left
    assert (decode_sections(shifted, 0.1, 2.5, 2.5, 7.5, entry_cost=0.0) == LEAD_IN).all()
    # at the shifted level the decode is the calibrated one (a constant per frame changes no Viterbi path)
    again = decode_sections(shifted, 0.1, 2.5, 2.5, 7.5, entry_cost=0.0, lead_in_logit=-2.5)
    assert again.tolist() == calibrated.tolist()
    # through the parameters, and checked like every anatomy parameter
    probs = np.full((truth.size, 17), 0.01)
    probs[:, [L[s] for s in SECTIONS]] = shifted
    anatomy = {"enabled": True, "switch_cost": 2.5, "skip_cost": 2.5, "entry_cost": 0.0}
    assert EventDecoder(DecoderParams.paper(anatomy=anatomy))(probs, np.arange(truth.size)) == []
    ev = EventDecoder(DecoderParams.paper(anatomy={**anatomy, "lead_in_logit": -2.5}))(probs, np.arange(truth.size))
    assert min(e["start"] for e in ev) == 40
    with pytest.raises(ValueError, match=r"anatomy.lead_in_logit"):
        DecoderParams({"anatomy": {"lead_in_logit": 100.0}})


def test_forward_only_sections_are_not_split_by_a_burst_of_an_earlier_section():
    from monai_vce.postprocessing.anatomy import DEFAULT_ANATOMY_GRID, decode_sections
    from monai_vce.postprocessing.steps import MAX_COST

    truth = np.repeat([0, 1, 2, 3, 4], [20, 20, 60, 200, 100])
    p = np.full((truth.size, 5), 0.1)
    p[np.arange(truth.size), truth] = 0.9
    burst = slice(150, 170)  # stomach-looking frames inside the small intestine
    p[burst, 2], p[burst, 3] = 0.95, 0.05
    back = decode_sections(p, 0.1, 0.3, 0.3, 0.9, entry_cost=0.0)
    assert (back[burst] == 2).all()  # a backward move: the small intestine in two pieces
    fwd = decode_sections(p, 0.1, 0.3, 0.3, MAX_COST, entry_cost=0.0)
    assert np.all(np.diff(fwd) >= 0) and fwd.tolist() == truth.tolist()
    # the tuning's grid holds both kinds
    assert {g["backward_cost"] == MAX_COST for g in DEFAULT_ANATOMY_GRID} == {True, False}
