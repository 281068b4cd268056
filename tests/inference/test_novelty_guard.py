"""The novelty guard of reduced inference (``novelty_tolerance``): a short burst between strided samples that the
known probabilities do not hint at is found through the frames' signatures."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from monai_vce.data import LoadVCEFramed
from monai_vce.data.synthetic import generate_mini_galar
from monai_vce.inference import (
    FrameSignatured,
    ReducedInference,
    adaptive_inference,
    check_reduction,
    is_reduced,
    reduction_tag,
    resume_sources,
    strided_rows,
)
from monai_vce.labels import LABELS, NUM_LABELS
from monai_vce.networks import TINY_MODEL_NAME, DiffAttnCLIPClassifier
from monai_vce.postprocessing import DecoderParams, EventDecoder
from monai_vce.workflows import check_settings, inference_datalist

T = 81
BURST = (37, 38)  # between the strided samples 32 and 40
#: every label emitted from a single frame over 0.5: a 2-frame burst is an event of its own
DECODER = EventDecoder(
    DecoderParams(
        {
            "anatomy": {"enabled": False},
            "labels": {n: {"median_window": 1, "max_gap": 0, "min_length": 1} for n in LABELS},
        }
    )
)


class Lookup:
    """A network replaced by a table: records every call."""

    def __init__(self, probs: np.ndarray) -> None:
        self.probs = probs
        self.calls: list[np.ndarray] = []

    def __call__(self, rows: np.ndarray) -> np.ndarray:
        self.calls.append(rows.copy())
        return self.probs[rows]

    @property
    def rows(self) -> np.ndarray:
        return np.concatenate(self.calls) if self.calls else np.zeros(0, np.int64)


def burst_video(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``(probs, signatures)``: small intestine throughout, an ulcer on the 2 frames of ``BURST`` only, whose
    signatures are brighter than the (constant) others."""
    z = np.full((T, NUM_LABELS), -4.0)
    z[:, LABELS.index("small intestine")] = 4.0
    z[BURST[0] : BURST[1] + 1, LABELS.index("ulcer")] = 4.0
    probs = (1 / (1 + np.exp(-z))).astype(np.float32)
    base = np.random.default_rng(seed).integers(60, 200, 64)
    sig = np.tile(base, (T, 1)).astype(np.uint8)
    sig[BURST[0] : BURST[1] + 1] = base + 40
    return probs, sig


def ulcer_events(probs: np.ndarray) -> list[tuple[int, int]]:
    return [(e["start"], e["end"]) for e in DECODER(probs, np.arange(len(probs))) if "ulcer" in e["label"]]


def test_zero_tolerance_is_no_guard():
    probs, sig = burst_video()
    rng = np.random.default_rng(1)
    noisy = np.clip(probs + rng.uniform(-0.3, 0.3, probs.shape), 0, 1).astype(np.float32)
    for kwargs in ({"stride": 8}, {"stride": 4, "refine": False}, {"stride": 8, "budget": 20}):
        plain, guarded = Lookup(noisy), Lookup(noisy)
        p0, m0 = adaptive_inference(plain, T, DECODER, **kwargs)
        p1, m1 = adaptive_inference(guarded, T, DECODER, signatures=sig, novelty_tolerance=0.0, **kwargs)
        assert p0.tobytes() == p1.tobytes() and np.array_equal(m0, m1)
        assert [c.tolist() for c in plain.calls] == [c.tolist() for c in guarded.calls]
    assert (
        reduction_tag(8)
        == reduction_tag(8, novelty_tolerance=0.0)
        == "reduced(stride=8,budget=None,refine=True,margin=0.3,dup=0)"
    )


@pytest.mark.parametrize("refine", [True, False])
def test_the_guard_finds_a_burst_between_strided_samples(refine):
    probs, sig = burst_video()
    assert ulcer_events(probs) == [BURST]  # full inference finds it
    plain = Lookup(probs)
    p0, m0 = adaptive_inference(plain, T, DECODER, stride=8, refine=refine, signatures=sig)
    assert not m0[BURST[0] : BURST[1] + 1].any() and ulcer_events(p0) == []  # the blind spot
    guarded = Lookup(probs)
    p1, m1 = adaptive_inference(guarded, T, DECODER, stride=8, refine=refine, signatures=sig, novelty_tolerance=4.0)
    assert m1[BURST[0] : BURST[1] + 1].all() and ulcer_events(p1) == [BURST]
    # the first guard round infers the most novel frame of the one gap that qualifies (the first of the tie)
    assert np.array_equal(guarded.calls[0], strided_rows(T, 8)) and guarded.calls[1].tolist() == [BURST[0]]
    # nothing far from the burst is inferred beyond the strided pass
    extra = np.setdiff1d(np.flatnonzero(m1), strided_rows(T, 8))
    assert extra.min() > 32 and extra.max() < 40
    assert np.array_equal(m1, np.isin(np.arange(T), guarded.rows))  # the mask is what predict saw


def test_a_tolerance_above_the_burst_finds_nothing():
    probs, sig = burst_video()
    look = Lookup(probs)
    _, mask = adaptive_inference(look, T, DECODER, stride=8, refine=False, signatures=sig, novelty_tolerance=40.0)
    assert np.array_equal(np.flatnonzero(mask), strided_rows(T, 8)) and len(look.calls) == 1


@pytest.mark.parametrize("refine", [True, False])
def test_constant_signatures_infer_nothing_more(refine):
    probs, _ = burst_video()
    rng = np.random.default_rng(2)
    noisy = np.clip(probs + rng.uniform(-0.3, 0.3, probs.shape), 0, 1).astype(np.float32)
    flat = np.full((T, 64), 117, np.uint8)
    ramp = (3 * np.arange(T)).astype(np.uint8)[:, None].repeat(64, 1)  # linear in position: interpolated exactly
    for sig in (flat, ramp):
        p0, m0 = adaptive_inference(Lookup(noisy), T, DECODER, stride=8, refine=refine)
        p1, m1 = adaptive_inference(
            Lookup(noisy), T, DECODER, stride=8, refine=refine, signatures=sig, novelty_tolerance=0.6
        )
        assert np.array_equal(m0, m1) and p0.tobytes() == p1.tobytes()


@pytest.mark.parametrize("budget", [11, 12, 14, 0.2])
def test_the_budget_is_respected(budget):
    probs, _ = burst_video()
    rng = np.random.default_rng(3)
    sig = rng.integers(0, 256, (T, 64)).astype(np.uint8)  # every frame novel: the guard would infer them all
    look = Lookup(probs)
    _, mask = adaptive_inference(look, T, DECODER, stride=8, budget=budget, signatures=sig, novelty_tolerance=1.0)
    limit = budget if isinstance(budget, int) else int(np.ceil(budget * T))
    assert mask.sum() == look.rows.size == limit and np.unique(look.rows).size == look.rows.size
    _, everything = adaptive_inference(Lookup(probs), T, DECODER, stride=8, signatures=sig, novelty_tolerance=1.0)
    assert everything.all()  # without a budget every novel frame is eventually inferred


def test_the_guard_with_near_duplicate_skipping():
    probs, sig = burst_video()
    look = Lookup(probs)
    kwargs = {"signatures": sig, "duplicate_tolerance": 1.0, "novelty_tolerance": 4.0}
    filled, mask = adaptive_inference(look, T, DECODER, stride=8, refine=False, **kwargs)
    # the burst's first frame is inferred; its copy reuses it
    assert mask[BURST[0]] and not mask[BURST[1]] and ulcer_events(filled) == [BURST]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"novelty_tolerance": -1.0}, "video 'v7': novelty_tolerance must be a finite number >= 0, got -1.0"),
        ({"novelty_tolerance": float("nan")}, "video 'v7': novelty_tolerance must be a finite number >= 0, got nan"),
        ({"novelty_tolerance": float("inf")}, "video 'v7': novelty_tolerance must be a finite number >= 0"),
        ({"novelty_tolerance": True}, "video 'v7': novelty_tolerance must be a finite number >= 0, got True"),
        ({"novelty_tolerance": "4"}, "video 'v7': novelty_tolerance must be a finite number >= 0"),
        ({"novelty_tolerance": 4.0, "signatures": None}, "video 'v7': novelty_tolerance > 0 needs the frames' sig"),
        ({"novelty_tolerance": 4.0, "signatures": np.zeros((T - 1, 4))}, "video 'v7': signatures must have shape"),
    ],
)
def test_bad_arguments_fail_in_one_line(kwargs, match):
    probs, sig = burst_video()
    kwargs = {"signatures": sig, **kwargs}
    with pytest.raises(ValueError, match=match) as err:
        adaptive_inference(Lookup(probs), T, DECODER, stride=8, video_id="v7", **kwargs)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("bad", [-1, float("nan"), True, "abc"])
def test_bad_reduction_settings_fail_in_one_line(bad):
    for call in (
        lambda: check_reduction(8, novelty_tolerance=bad),
        lambda: reduction_tag(8, novelty_tolerance=bad),
        lambda: is_reduced(8, novelty_tolerance=bad),
        lambda: check_settings(reduction={"stride": 8, "novelty_tolerance": bad}),
    ):
        with pytest.raises(ValueError, match="'reduction#novelty_tolerance'") as err:
            call()
        assert "\n" not in str(err.value)


def test_the_guard_is_in_the_tag_but_does_not_reduce():
    tag = reduction_tag(8, novelty_tolerance=4)
    assert tag == "reduced(stride=8,budget=None,refine=True,margin=0.3,dup=0,novelty=4)"
    assert reduction_tag(8, novelty_tolerance=4, options={"max_rounds": 2}).endswith(",novelty=4,max_rounds=2)")
    assert not is_reduced(1, novelty_tolerance=4) and reduction_tag(1, novelty_tolerance=4) == ""
    keys = {"stride": 8, "budget": None, "refine": True, "margin": 0.3, "duplicate_tolerance": 0.0, "options": {}}
    assert resume_sources("m", {**keys, "novelty_tolerance": 4.0}) == ["m", f"m|{tag}"]
    assert resume_sources("m", keys) == ["m", f"m|{reduction_tag(8)}"]
    assert check_settings(reduction={**keys, "novelty_tolerance": 4.0}) is True


# ------------------------------------------------------------------------------------------ through the driver
@pytest.fixture(scope="module")
def mini(tmp_path_factory):
    root = tmp_path_factory.mktemp("mini")
    generate_mini_galar(root, videos=1, frames_per_video=40, size=32, seed=3, naming="galar")
    return root


@pytest.fixture(scope="module")
def network():
    torch.manual_seed(0)
    return DiffAttnCLIPClassifier(backbone=TINY_MODEL_NAME, pretrained=False, image_size=64).eval()


def test_reduced_inference_with_the_guard(mini, network, tmp_path):
    data = inference_datalist(mini / "frames")
    common = {"stride": 8, "refine": False, "image_size": 64, "batch_size": 16, "progress": False, "source": "m"}
    off = ReducedInference(network, data, tmp_path / "off", **common)
    off.run()
    assert off.predictor.frames_inferred == 6
    run = ReducedInference(network, data, tmp_path / "on", novelty_tolerance=2.0, **common)
    assert run.novelty_tolerance == 2.0 and run.stored_source == "m|" + reduction_tag(
        8, refine=False, novelty_tolerance=2
    )
    assert run.stored_source != off.stored_source
    run.run()
    with np.load(tmp_path / "on" / "1.npz") as z:
        inferred = z["inferred"]
        assert str(z["source"]) == run.stored_source
    # the rows adaptive_inference picks from the signatures of the loader's frames, no more, no fewer
    load, sign = LoadVCEFramed(keys="image", image_size=64), FrameSignatured(keys="image")
    sig = np.stack([sign(load(dict(d)))["signature"].numpy() for d in data])
    calls = []

    def predict(rows):
        calls.append(rows)
        return np.full((rows.size, NUM_LABELS), 0.5, np.float32)

    _, expected = adaptive_inference(
        predict, 40, run.decoder, stride=8, refine=False, signatures=sig, novelty_tolerance=2.0
    )
    assert expected.sum() > 6 and np.array_equal(inferred, expected)
    assert run.predictor.frames_inferred == int(expected.sum())
    # a run without the guard does not take the guard's files for its own (nor the reverse)
    again = ReducedInference(network, data, tmp_path / "on", **common)
    again.run()
    assert again.predictor.frames_inferred == 6
    with pytest.raises(ValueError, match="'reduction#novelty_tolerance' must be"):
        ReducedInference(network, data, tmp_path / "bad", novelty_tolerance=-1, **common)


def test_the_bundle_key_reaches_the_reduced_inference(mini_galar, tmp_path):
    from bundle_helpers import inference_workflow

    def workflow(**overrides):
        return inference_workflow(mini_galar / "frames", tmp_path, **overrides)

    wf = workflow(**{"reduction#stride": 8, "reduction#novelty_tolerance": 4.0})
    reduced = wf.parser.get_parsed_content("reduced_inference")
    assert reduced.novelty_tolerance == 4.0 and reduced.stored_source.endswith(",novelty=4)")
    assert wf.parser.get_parsed_content("stored_source") == reduced.stored_source
    assert wf.parser.get_parsed_content("reduction") == {
        "stride": 8, "refine": True, "budget": None, "margin": 0.3, "duplicate_tolerance": 0.0,
        "novelty_tolerance": 4.0, "options": {},
    }  # fmt: skip
    default = workflow(**{"reduction#stride": 8}).parser.get_parsed_content("reduced_inference")
    assert default.novelty_tolerance == 0.0 and "novelty" not in default.stored_source
