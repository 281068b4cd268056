"""Temporal refiner: shapes, chunked inference, masking, files, the leakage guard and a learnable pattern."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
import torch

from monai_vce.events import Video, with_ground_truth
from monai_vce.labels import LABELS, NUM_LABELS, SECTIONS
from monai_vce.postprocessing import DecoderParams
from monai_vce.temporal import (
    LabelwiseTCN,
    LeakageError,
    MultiStageTCN,
    RefinerEnsemble,
    TemporalRefinementLoss,
    TemporalRefiner,
    change_point_states,
    check_no_leakage,
    cross_fit_refiner,
    fit_refiner,
    fold_provenance,
    kfold_videos,
    load_refiner,
    select_pipeline,
)

TINY = {"_target_": "MultiStageTCN", "stages": 2, "layers": 5, "channels": 8, "dropout": 0.0}
#: a small label-wise network (the default kind), with step-state inputs
TINY_LW = {"channels": 4, "layers": 3, "label_features": 2, "context_layers": 3, "context_channels": 8,
           "dropout": 0.0, "change_points": (0.5, 1.0), "lookback": 20, "lookahead": 20}  # fmt: skip


def _scramble(refiner: TemporalRefiner, seed: int = 0) -> TemporalRefiner:
    """Random weights everywhere (a fresh residual network is the identity, which would hide any bug)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in refiner.network.parameters():
            p.copy_(0.3 * torch.randn(p.shape, generator=g))
    return refiner


def _probs(T: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).random((T, NUM_LABELS)).astype(np.float32)


def _section_video(T: int, rng: np.random.Generator, noise: float = 2.0):
    """A video whose five sections follow the gut order, with per-frame noisy section probabilities."""
    cuts = np.sort(rng.choice(np.arange(50, T - 50), size=4, replace=False))
    bounds = [0, *cuts.tolist(), T]
    events = [{"start": bounds[i], "end": bounds[i + 1] - 1, "label": [SECTIONS[i]]} for i in range(len(SECTIONS))]
    truth = np.zeros((T, NUM_LABELS), dtype=bool)
    for i in range(len(SECTIONS)):
        truth[bounds[i] : bounds[i + 1], i] = True
    logit = np.where(truth, 1.0, -1.0) + noise * rng.standard_normal((T, NUM_LABELS))
    return (1.0 / (1.0 + np.exp(-logit))).astype(np.float32), np.arange(T), events, truth


def _record(name: str, video: tuple, features: np.ndarray | None = None) -> Video:
    """A :func:`_section_video` as the record the refiner fits on (targets from its ground-truth events)."""
    probs, ids, events = video[:3]
    return with_ground_truth(Video(name, probs, ids, ids, features=features), events, "frame_index")


def _frame_ap(y: np.ndarray, p: np.ndarray) -> float:
    order = np.argsort(-p, kind="stable")
    y = y[order].astype(np.float64)
    hits = np.cumsum(y)
    return float((hits / np.arange(1, y.size + 1))[y > 0].mean())


def test_network_shapes_and_context():
    torch.manual_seed(0)
    net = MultiStageTCN(in_channels=20, stages=3, layers=4, channels=8)
    out = net(torch.randn(2, 20, 50))
    assert out.shape == (3, 2, NUM_LABELS, 50)
    assert net.context == 3 * (2**4 - 1)
    # nothing beyond the context reaches an output
    net.eval()
    x = torch.randn(1, 20, 200)
    base = net(x)[-1, 0, :, 100]
    far = x.clone()
    far[0, :, 100 + net.context + 1] += 5.0
    far[0, :, 100 - net.context - 1] -= 5.0
    assert torch.equal(net(far)[-1, 0, :, 100], base)
    # and the context is not overstated: the farthest frame inside it does reach (one stage, so that the
    # product of a few weights along the only path stays far above float32 rounding)
    one = MultiStageTCN(in_channels=20, stages=1, layers=4, channels=8).eval()
    near = x.clone()
    near[0, :, 100 + one.context] += 5.0
    assert not torch.equal(one(near)[-1, 0, :, 100], one(x)[-1, 0, :, 100])


@pytest.mark.parametrize("inputs", ["probs", "features", "both"])
def test_refine_shapes(inputs):
    T, D = 300, 6
    refiner = TemporalRefiner(inputs=inputs, feature_dim=0 if inputs == "probs" else D, network=TINY)
    feats = np.random.default_rng(1).standard_normal((T, D)).astype(np.float16)
    out = refiner.refine(_probs(T) if inputs != "features" else None, None if inputs == "probs" else feats)
    assert out.shape == (T, NUM_LABELS) and out.dtype == np.float32
    assert np.all((out >= 0) & (out <= 1))
    assert refiner.refine(
        np.zeros((0, NUM_LABELS), np.float32) if inputs != "features" else None,
        np.zeros((0, D)) if inputs != "probs" else None,
    ).shape == (0, NUM_LABELS)


def test_refine_errors_are_one_line():
    refiner = TemporalRefiner(network=TINY)
    for bad, msg in [
        (np.zeros((10, 5), np.float32), "shape"),
        (np.full((10, NUM_LABELS), 2.0, np.float32), "outside [0, 1]"),
        (np.full((10, NUM_LABELS), np.nan, np.float32), "non-finite"),
    ]:
        with pytest.raises(ValueError, match=msg.replace("[", r"\[").replace("]", r"\]")) as e:
            refiner.refine(bad)
        assert "\n" not in str(e.value)
    both = TemporalRefiner(inputs="both", feature_dim=4, network=TINY)
    with pytest.raises(ValueError, match="needs per-frame features"):
        both.refine(_probs(10))
    with pytest.raises(ValueError, match="feature_dim"):
        TemporalRefiner(inputs="features")


@pytest.mark.parametrize("inputs", ["probs", "both"])
def test_chunked_equals_whole_video(inputs):
    torch.manual_seed(0)
    T, D = 1500, 5
    refiner = TemporalRefiner(inputs=inputs, feature_dim=D if inputs == "both" else 0, network=TINY, chunk_size=None)
    _scramble(refiner)
    refiner.set_input_statistics(np.full(refiner.in_channels, 0.3), np.full(refiner.in_channels, 1.7))
    probs = _probs(T)
    feats = np.random.default_rng(2).standard_normal((T, D)).astype(np.float32) if inputs == "both" else None
    whole = refiner.refine(probs, feats)
    assert refiner.context == 2 * 31
    for chunk in (5, refiner.context, 200, 1499):
        chunked = refiner.refine(probs, feats, chunk_size=chunk)
        np.testing.assert_allclose(chunked, whole, atol=1e-5, rtol=0)
    # without enough overlap the result would differ: the overlap is needed
    refiner.network.stages[0].context = 0  # type: ignore[union-attr]
    assert np.abs(refiner.refine(probs, feats, chunk_size=200) - whole).max() > 1e-4


def test_padded_batch_equals_separate_videos():
    torch.manual_seed(0)
    refiner = _scramble(TemporalRefiner(network=TINY, position=True)).eval()
    a, b = torch.randn(NUM_LABELS + 3, 120), torch.randn(NUM_LABELS + 3, 80)
    x = torch.zeros(2, NUM_LABELS + 3, 120)
    x[0], x[1, :, 25:105] = a, b  # b padded on both sides, as a crop at a video's start and end
    mask = torch.zeros(2, 1, 120)
    mask[0], mask[1, :, 25:105] = 1.0, 1.0
    with torch.no_grad():
        batched = refiner(x, mask)
        torch.testing.assert_close(batched[:, 0], refiner(a[None])[:, 0], atol=1e-5, rtol=0)
        torch.testing.assert_close(batched[:, 1, :, 25:105], refiner(b[None])[:, 0], atol=1e-5, rtol=0)


def test_training_crops_see_what_inference_sees():
    """A scored frame of a training crop gets the same logits as in whole-video inference (crop context)."""
    from monai_vce.temporal.training import _batch, prepare_videos

    rng = np.random.default_rng(0)
    refiner = _scramble(TemporalRefiner(network=TINY, position=True, chunk_size=None)).eval()
    videos = prepare_videos([_record("a", _section_video(400, rng)), _record("b", _section_video(150, rng))], refiner)
    picks = [(videos[0], 0), (videos[0], 170), (videos[0], 330), (videos[1], 0)]
    length, ctx = 100, refiner.context
    x, y, real, scored = _batch(refiner, picks, length, ctx, torch.device("cpu"))
    with torch.no_grad():
        out = refiner(x, real)[-1]
        for i, (v, start) in enumerate(picks):
            whole = refiner.logits(torch.from_numpy(refiner.raw_inputs(v.probs, offset=0, total=len(v))))
            stop = min(start + length, len(v))
            cols = scored[i, 0].nonzero().flatten()
            assert cols.numel() == stop - start
            torch.testing.assert_close(out[i][:, cols], whole[:, start:stop], atol=1e-4, rtol=1e-4)
            torch.testing.assert_close(y[i][:, cols], torch.from_numpy(v.targets[start:stop].T))


def test_loss_masks_padding_and_smoothness():
    torch.manual_seed(0)
    logits = torch.randn(2, 1, NUM_LABELS, 30)
    target = (torch.rand(1, NUM_LABELS, 30) > 0.5).float()
    mask = torch.ones(1, 1, 30)
    mask[..., 20:] = 0
    loss = TemporalRefinementLoss(smoothness=0.15)
    changed = logits.clone()
    changed[..., 20:] = 100.0  # padded frames: must not matter
    assert torch.isclose(loss(logits, target, mask), loss(changed, target, mask))
    flat = torch.zeros(1, 1, NUM_LABELS, 30)
    rough = flat.clone()
    rough[..., ::2] = 3.0
    plain = TemporalRefinementLoss(smoothness=0.0)
    # the smoothness term penalises flicker and nothing else
    gap_plain = loss(rough, target) - plain(rough, target)
    assert gap_plain > 0
    assert torch.isclose(loss(flat, target), plain(flat, target))


def test_save_load_round_trip(tmp_path):
    rng = np.random.default_rng(0)
    videos = {f"v{i}": _record(f"v{i}", _section_video(400, rng)) for i in range(3)}
    refiner = fit_refiner(videos, network=TINY, steps=3, crop_length=128, batch_size=2, seed=1)
    path = refiner.save(tmp_path / "refiner.pt")
    loaded = TemporalRefiner.load(path)
    probs = _probs(500, seed=3)
    np.testing.assert_array_equal(loaded.refine(probs), refiner.refine(probs))
    assert loaded.get_config() == refiner.get_config()
    assert loaded.trained_videos == ["v0", "v1", "v2"]
    assert torch.equal(loaded.input_std, refiner.input_std) and not torch.all(loaded.input_std == 1)
    # weights_only-safe: plain tensors and strings only
    payload = torch.load(path, weights_only=True)
    assert isinstance(payload["config"], str)
    assert not list(tmp_path.glob(".*.tmp"))


def test_load_refuses_bad_files(tmp_path):
    with pytest.raises(FileNotFoundError):
        TemporalRefiner.load(tmp_path / "missing.pt")
    (tmp_path / "junk.pt").write_bytes(b"not a torch file")
    with pytest.raises(ValueError, match=r"junk\.pt"):
        TemporalRefiner.load(tmp_path / "junk.pt")
    good = TemporalRefiner(network=TINY).save(tmp_path / "good.pt")
    payload = torch.load(good, weights_only=True)
    payload["config"] = payload["config"].replace('"MultiStageTCN"', '"os.system"')
    buf = io.BytesIO()
    torch.save(payload, buf)
    (tmp_path / "evil.pt").write_bytes(buf.getvalue())
    with pytest.raises(ValueError, match=r"not a refinement network of this project") as e:
        TemporalRefiner.load(tmp_path / "evil.pt")
    assert "evil.pt" in str(e.value)
    payload = torch.load(good, weights_only=True)
    for version in (None, 0, 2, True):  # one file version: no other is read
        with pytest.raises(ValueError, match=rf"^v: has version {version}; this code reads 1$"):
            TemporalRefiner.from_payload({**payload, "version": version}, "v:")


def test_leakage_guard():
    check_no_leakage(["a", "b"], ["c", "d"])
    with pytest.raises(LeakageError, match="'b'"):
        check_no_leakage(["a", "b"], ["b", "c"])
    folds = kfold_videos(["a", "b", "c", "d", "e"], folds=2, seed=0)
    assert sorted(set(folds.values())) == [0, 1]
    provenance = fold_provenance(folds)
    for v, others in provenance.items():
        assert v not in others and set(others) == {u for u in folds if folds[u] != folds[v]}
    check_no_leakage(folds, provenance)
    with pytest.raises(LeakageError, match="no provenance"):
        check_no_leakage(["a", "z"], provenance)
    in_sample = {v: list(folds) for v in folds}  # one model trained on every video produced all outputs
    with pytest.raises(LeakageError):
        check_no_leakage(folds, in_sample)
    rng = np.random.default_rng(0)
    videos = {v: _record(v, _section_video(300, rng)) for v in folds}
    with pytest.raises(LeakageError):
        fit_refiner(videos, network=TINY, steps=1, trained_on=list(folds))


def test_cross_fit_never_refines_own_training_videos():
    rng = np.random.default_rng(0)
    videos = {f"v{i}": _record(f"v{i}", _section_video(300, rng)) for i in range(6)}
    result = cross_fit_refiner(videos, folds=3, network=TINY, steps=2, crop_length=128, batch_size=2)
    assert set(result.refined) == set(videos) and len(result.fold_refiners) == 3
    for f, refiner in enumerate(result.fold_refiners):
        held = {v for v, g in result.folds.items() if g == f}
        assert held and not held & set(refiner.trained_videos)
        assert set(refiner.trained_videos) == set(videos) - held
        for v in held:  # each video's refined probabilities come from its fold's refiner
            np.testing.assert_array_equal(result.refined[v], refiner.refine(videos[v].probs))
    # the default refiner for new videos: the fold refiners together, their mean probabilities
    assert isinstance(result.refiner, RefinerEnsemble) and list(result.refiner.members) == result.fold_refiners
    assert set(result.refiner.trained_videos) == set(videos)
    probs = _probs(400, seed=5)
    mean = np.mean([r.refine(probs) for r in result.fold_refiners], axis=0)
    np.testing.assert_allclose(result.refiner.refine(probs), mean, atol=1e-6)
    tuning = result.tuning_videos(videos)
    assert tuning["v0"].probs is result.refined["v0"] and tuning["v0"].events is videos["v0"].events
    assert tuning["v0"].frame_index is videos["v0"].frame_index and videos["v0"].probs is not result.refined["v0"]
    refit = cross_fit_refiner(videos, folds=3, final="refit", network=TINY, steps=2, crop_length=128, batch_size=2)
    assert isinstance(refit.refiner, TemporalRefiner) and set(refit.refiner.trained_videos) == set(videos)
    for a, b in zip(refit.fold_refiners, result.fold_refiners, strict=True):  # the folds do not depend on `final`
        np.testing.assert_array_equal(a.refine(probs), b.refine(probs))
    assert cross_fit_refiner(videos, folds=2, final=None, network=TINY, steps=1, crop_length=128).refiner is None
    with pytest.raises(ValueError, match="final must be one of"):
        cross_fit_refiner(videos, folds=2, final="last", network=TINY, steps=1)
    with pytest.raises(LeakageError):
        cross_fit_refiner(videos, folds=3, trained_on=list(videos), network=TINY, steps=1)


def test_refiner_ensemble_files_and_checks(tmp_path):
    rng = np.random.default_rng(0)
    videos = {f"v{i}": _record(f"v{i}", _section_video(300, rng)) for i in range(4)}
    members = [
        _scramble(fit_refiner(videos, network=TINY_LW, steps=1, crop_length=128, seed=s), seed=s) for s in (0, 1)
    ]
    ensemble = RefinerEnsemble(members)
    probs = _probs(700, seed=2)
    out = ensemble.refine(probs, chunk_size=100)  # chunked like its members: equal to whole-video inference
    np.testing.assert_allclose(out, ensemble.refine(probs, chunk_size=0), atol=1e-5)
    np.testing.assert_allclose(out, (members[0].refine(probs) + members[1].refine(probs)) / 2, atol=1e-6)
    sections = [LABELS.index(n) for n in SECTIONS]  # passed through exactly, not as a mean
    np.testing.assert_array_equal(out[:, sections], probs[:, sections])
    assert not np.allclose(out, members[0].refine(probs), atol=1e-3)
    assert ensemble.context == members[0].context and ensemble.inputs == "probs"
    # one weights_only-safe file; load_refiner reads either kind, TemporalRefiner.load says what it is
    ensemble.fit_info = {"members": 2, "stage": {"folds": 2}}
    path = ensemble.save(tmp_path / "ensemble.pt")
    loaded = load_refiner(path)
    assert isinstance(loaded, RefinerEnsemble) and len(loaded.members) == 2 and loaded.fit_info == ensemble.fit_info
    np.testing.assert_array_equal(loaded.refine(probs, chunk_size=100), out)
    assert isinstance(load_refiner(members[0].save(tmp_path / "one.pt")), TemporalRefiner)
    with pytest.raises(ValueError, match=r"ensemble\.pt is a refiner ensemble"):
        TemporalRefiner.load(path)
    with pytest.raises(ValueError, match=r"one\.pt is not a refiner ensemble"):
        RefinerEnsemble.load(tmp_path / "one.pt")
    payload = torch.load(path, weights_only=True)
    payload["members"][1]["state_dict"].popitem()
    buf = io.BytesIO()
    torch.save(payload, buf)
    (tmp_path / "damaged.pt").write_bytes(buf.getvalue())
    with pytest.raises(ValueError, match=r"damaged\.pt, member 1"):
        load_refiner(tmp_path / "damaged.pt")
    # members must read and return the same
    with pytest.raises(ValueError, match="at least one"):
        RefinerEnsemble([])
    with pytest.raises(ValueError, match="passthrough"):
        RefinerEnsemble([members[0], TemporalRefiner(network=TINY_LW, passthrough=())])
    with pytest.raises(ValueError, match="not a TemporalRefiner"):
        RefinerEnsemble([members[0], torch.nn.Linear(2, 2)])  # type: ignore[list-item]


def test_refiner_learns_section_order():
    """Per-frame section probabilities drowned in noise: a refiner that sees the timeline beats its input."""
    rng = np.random.default_rng(0)
    train = {f"t{i}": _record(f"t{i}", _section_video(1200, rng)) for i in range(12)}
    test = [_section_video(1200, rng) for _ in range(4)]
    refiner = fit_refiner(
        train,
        network={
            "_target_": "MultiStageTCN",
            "stages": 2,
            "layers": 7,
            "channels": 16,
            "dropout": 0.0,
        },
        steps=80,
        crop_length=600,
        batch_size=4,
        learning_rate=2e-2,
        passthrough=(),  # the sections are what this test refines
        seed=0,
    )
    raw_ap, refined_ap = [], []
    for probs, _, _, truth in test:
        refined = refiner.refine(probs)
        for c in range(len(SECTIONS)):
            raw_ap.append(_frame_ap(truth[:, c], probs[:, c]))
            refined_ap.append(_frame_ap(truth[:, c], refined[:, c]))
    assert np.mean(raw_ap) < 0.75  # the input is really noisy
    assert np.mean(refined_ap) > np.mean(raw_ap) + 0.15, (np.mean(raw_ap), np.mean(refined_ap))
    assert LABELS[: len(SECTIONS)] == SECTIONS


def test_fit_with_features_and_passthrough(tmp_path):
    rng = np.random.default_rng(0)
    videos = {}
    for i in range(3):
        video = _section_video(300, rng)
        videos[f"v{i}"] = _record(f"v{i}", video, rng.standard_normal((300, 6)).astype(np.float16))
    refiner = fit_refiner(
        videos, "both", network=TINY, steps=3, crop_length=128, batch_size=2, passthrough=SECTIONS[:2]
    )
    assert refiner.in_channels == NUM_LABELS + 6 and refiner.feature_dim == 6
    probs, feats = videos["v0"].probs, videos["v0"].features
    out = refiner.refine(probs, feats)
    np.testing.assert_array_equal(out[:, :2], probs[:, :2])  # passed through untouched
    loaded = TemporalRefiner.load(refiner.save(tmp_path / "r.pt"))
    np.testing.assert_array_equal(loaded.refine(probs, feats), out)
    with pytest.raises(ValueError, match="features"):
        fit_refiner({k: v.replace(features=None) for k, v in videos.items()}, "features", network=TINY, steps=1)
    with pytest.raises(ValueError, match="video 'v0': no targets"):
        fit_refiner([videos["v0"].replace(targets=None)], network=TINY, steps=1)
    with pytest.raises(ValueError, match="expected Video records"):
        fit_refiner([(probs, np.arange(300), [])], network=TINY, steps=1)


def test_select_pipeline_keeps_the_baseline_unless_beaten():
    def tuned(objective: float) -> DecoderParams:
        data = DecoderParams().to_dict()
        data["fit"] = {"objective": objective}
        return DecoderParams(data)

    assert select_pipeline({"decoder": tuned(0.50), "refiner": tuned(0.52)}, baseline="decoder") == "refiner"
    assert select_pipeline({"decoder": tuned(0.50), "refiner": tuned(0.505)}, baseline="decoder") == "decoder"
    assert select_pipeline({"decoder": tuned(0.50), "refiner": tuned(0.49)}, baseline="decoder") == "decoder"
    assert select_pipeline({"decoder": tuned(0.50), "refiner": tuned(0.505)}, "decoder", margin=0.0) == "refiner"
    with pytest.raises(ValueError, match="objective"):
        select_pipeline({"decoder": DecoderParams(), "refiner": tuned(0.5)})


def test_change_point_states():
    x = torch.tensor([0.0, 0.1, 2.0, 2.1, 1.9, 0.0, 0.0, 0.0, 0.0, 3.0])[None, None]
    states = change_point_states(x, (0.5, 2.5), lookback=3)
    assert states.shape == (1, 2, 10)
    # h = 0.5: up at frame 2, down at 5, remembered for 3 frames, then nothing until the next step
    assert states[0, 0].tolist() == [0, 0, 1, 1, 1, -1, -1, -1, -1, 1]
    # h = 2.5: only the last jump is large enough
    assert states[0, 1].tolist() == [0, 0, 0, 0, 0, 0, 0, 0, 0, 1]
    # no step across padding: a sequence starting after padded frames has no step at its first real frame
    mask = torch.tensor([0, 0, 1, 1, 1, 1, 1, 1, 1, 1.0])[None, None]
    padded = change_point_states(x * mask, (0.5,), lookback=3, mask=mask)
    assert padded[0, 0].tolist() == [0, 0, 0, 0, 0, -1, -1, -1, -1, 1]
    # the next step ahead, seen by the lookahead frames before it (the frame it leaves included)
    both = change_point_states(x, (0.5, 2.5), lookback=3, lookahead=2)
    assert torch.equal(both[:, :2], states)
    assert both[0, 2].tolist() == [1, 1, -1, -1, -1, 0, 1, 1, 1, 0]
    assert both[0, 3].tolist() == [0, 0, 0, 0, 0, 0, 1, 1, 1, 0]
    ahead = change_point_states(x * mask, (0.5,), lookback=3, mask=mask, lookahead=3)
    assert ahead[0, 1].tolist() == [0, 0, -1, -1, -1, 1, 1, 1, 1, 0]
    # reach: a state depends on the frame one beyond its window on each side, and on none further
    for offset, moves in ((-6, True), (-7, False), (5, True), (6, False)):
        spike = torch.zeros(1, 1, 40)
        spike[..., 20 + offset] = 3.0
        reached = change_point_states(spike, (1.0,), lookback=5, lookahead=4)[0, :, 20]
        assert bool(reached.abs().sum() > 0) == moves, offset


def test_step_spans_see_ramped_boundaries():
    # a boundary ramped over 8 frames: no one-frame difference reaches 0.5, the 8-frame difference does
    x = torch.cat([torch.zeros(10), torch.linspace(0.25, 2.0, 8), torch.full((12,), 2.0)])[None, None]
    assert not change_point_states(x, (0.5,), lookback=30).any()
    ramped = change_point_states(x, (0.5,), lookback=30, span=8)[0, 0]
    assert ramped[:12].tolist() == [0] * 12 and ramped[12:].eq(1).all()  # from 2 frames into the ramp on
    ahead = change_point_states(x, (0.5,), lookback=30, lookahead=30, span=8)[0, 1]
    assert ahead[:15].eq(1).all() and not ahead[15:].any()  # while the ramp ahead still rises by > 0.5
    # span 1 is the one-frame step; a span reaches that many frames beyond the window
    torch.testing.assert_close(change_point_states(x, (0.5,), 3, span=1), change_point_states(x, (0.5,), 3))
    for offset, moves in ((-11, True), (-12, False)):
        spike = torch.zeros(1, 1, 40)
        spike[..., 20 + offset] = 3.0
        assert bool(change_point_states(spike, (1.0,), lookback=5, span=6)[0, :, 20].abs().sum() > 0) == moves
    with pytest.raises(ValueError, match="span must be >= 1"):
        change_point_states(x, (0.5,), 3, span=0)


def test_labelwise_network_with_step_spans():
    torch.manual_seed(0)
    net = LabelwiseTCN(in_channels=NUM_LABELS, **{**TINY_LW, "step_spans": (1, 8)})
    assert net.context == 2 * (2**3 - 1) + 20 + 8
    assert net.config["step_spans"] == [1, 8]
    assert LabelwiseTCN(in_channels=NUM_LABELS, **TINY_LW).config["step_spans"] == [1]
    for p in net.parameters():
        torch.nn.init.normal_(p, std=0.3)
    net.eval()
    x = torch.randn(1, NUM_LABELS, 300)
    base = net(x)[-1, 0, :, 150]
    far = x.clone()
    far[0, :, 150 + net.context + 1] += 5.0
    far[0, :, 150 - net.context - 1] -= 5.0
    assert torch.equal(net(far)[-1, 0, :, 150], base)
    with pytest.raises(ValueError, match="step_spans"):
        LabelwiseTCN(in_channels=NUM_LABELS, step_spans=(0,))


def test_refiner_with_step_spans_chunks_saves_and_refuses_bad_spans(tmp_path):
    net = {**TINY_LW, "step_spans": [1, 6]}
    refiner = _scramble(TemporalRefiner(network=net, chunk_size=None, passthrough=()))
    refiner.set_input_statistics(np.full(refiner.in_channels, 0.3), np.full(refiner.in_channels, 1.7))
    probs = _probs(700)
    whole = refiner.refine(probs)
    for chunk in (7, refiner.context, 250):
        np.testing.assert_allclose(refiner.refine(probs, chunk_size=chunk), whole, atol=1e-5, rtol=0)
    loaded = TemporalRefiner.load(refiner.save(tmp_path / "spans.pt"))
    assert loaded.get_config()["network"]["step_spans"] == [1, 6]
    np.testing.assert_array_equal(loaded.refine(probs), whole)
    payload = refiner.payload()
    for bad in ([], [0], [1.5], [True], list(range(1, 30)), 3):
        config = json.loads(payload["config"])
        config["network"]["step_spans"] = bad
        with pytest.raises(ValueError, match="step_spans must be a list"):
            TemporalRefiner.from_payload({**payload, "config": json.dumps(config)}, "spans file")


def test_labelwise_network_shapes_context_and_identity():
    torch.manual_seed(0)
    net = LabelwiseTCN(in_channels=NUM_LABELS + 3, **TINY_LW)
    assert net.context == 2 * (2**3 - 1) + 20 + 1  # the lookback reaches one frame beyond its window
    assert LabelwiseTCN(in_channels=NUM_LABELS, **{**TINY_LW, "lookahead": 30}).context == 2 * (2**3 - 1) + 31
    # untrained: the input logits through the affine skip, whatever the rest of the input
    net.init_skip(torch.full((NUM_LABELS,), 2.0), torch.full((NUM_LABELS,), -1.0))
    x = torch.randn(2, NUM_LABELS + 3, 90)
    out = net(x)
    assert out.shape == (2, 2, NUM_LABELS, 90)
    torch.testing.assert_close(out[-1], 2.0 * x[:, :NUM_LABELS] - 1.0)
    for p in net.parameters():  # now every weight matters
        torch.nn.init.normal_(p, std=0.3)
    net.eval()
    x = torch.randn(1, NUM_LABELS + 3, 300)
    base = net(x)[-1, 0, :, 150]
    far = x.clone()
    far[0, :, 150 + net.context + 1] += 5.0
    far[0, :, 150 - net.context - 1] -= 5.0
    assert torch.equal(net(far)[-1, 0, :, 150], base)
    # labels share the label-wise weights but not their outputs: changing one label's evidence moves others
    # only through the context stage
    moved = x.clone()
    moved[0, 0, 140:160] += 3.0
    assert not torch.equal(net(moved)[-1, 0, 1, 150], base[1])
    with pytest.raises(ValueError, match="per-label evidence"):
        LabelwiseTCN(in_channels=5)


def test_default_network_follows_the_inputs(tmp_path):
    assert isinstance(TemporalRefiner().network, LabelwiseTCN)
    assert isinstance(TemporalRefiner(inputs="both", feature_dim=4).network, LabelwiseTCN)
    assert isinstance(TemporalRefiner(inputs="features", feature_dim=4).network, MultiStageTCN)
    # the sections pass through unless asked otherwise (and cannot without probabilities among the inputs)
    assert TemporalRefiner().passthrough == list(SECTIONS)
    assert TemporalRefiner(passthrough=()).passthrough == []
    assert TemporalRefiner(inputs="features", feature_dim=4).passthrough == []
    with pytest.raises(ValueError, match="inputs='features'"):
        TemporalRefiner(inputs="features", feature_dim=4, network={"_target_": "LabelwiseTCN"})
    # chunked inference equals whole-video inference with the step states' lookback in the overlap
    refiner = _scramble(TemporalRefiner(network=TINY_LW, chunk_size=None, passthrough=()))
    refiner.set_input_statistics(np.full(refiner.in_channels, 0.3), np.full(refiner.in_channels, 1.7))
    probs = _probs(700)
    whole = refiner.refine(probs)
    for chunk in (7, refiner.context, 250):
        np.testing.assert_allclose(refiner.refine(probs, chunk_size=chunk), whole, atol=1e-5, rtol=0)
    # and without the states of the next step, or with a longer lookahead than lookback
    for lookahead in (0, 25):
        net = {**TINY_LW, "lookahead": lookahead}
        ahead = _scramble(TemporalRefiner(network=net, chunk_size=None, passthrough=()))
        ahead.set_input_statistics(np.full(ahead.in_channels, 0.3), np.full(ahead.in_channels, 1.7))
        whole_ahead = ahead.refine(probs)
        if lookahead == 0:  # another network: the look-ahead states matter
            assert np.abs(whole_ahead - whole).max() > 1e-3
        for chunk in (7, ahead.context, 250):
            np.testing.assert_allclose(ahead.refine(probs, chunk_size=chunk), whole_ahead, atol=1e-5, rtol=0)
    loaded = TemporalRefiner.load(refiner.save(tmp_path / "lw.pt"))
    assert isinstance(loaded.network, LabelwiseTCN) and loaded.get_config() == refiner.get_config()
    np.testing.assert_array_equal(loaded.refine(probs), whole)
    # a file whose network lacks "lookahead" is refused: it would read as today's default, other weights' shapes
    before = _scramble(TemporalRefiner(network={**TINY_LW, "lookahead": 0}, chunk_size=None, passthrough=()))
    payload = before.payload()
    config = json.loads(payload["config"])
    del config["network"]["lookahead"]
    with pytest.raises(ValueError, match=r"^partial file: tensor 'network\.labelwise\..*' has shape"):
        TemporalRefiner.from_payload({**payload, "config": json.dumps(config)}, "partial file")
    assert TemporalRefiner().get_config()["network"]["lookahead"] == 128  # today's default looks ahead


def test_boundary_weighted_loss():
    target = torch.zeros(1, NUM_LABELS, 20)
    target[0, 0, 8:12] = 1.0
    loss = TemporalRefinementLoss(smoothness=0.0, boundary_weight=3.0, boundary_radius=1)
    w = loss.boundary_weights(target)
    # changes between frames 7|8 and 11|12: frames 7, 8, 11, 12 and one more on each side
    assert w[0, 0].tolist() == [1.0] * 6 + [4.0] * 8 + [1.0] * 6
    assert torch.all(w[0, 1:] == 1.0)
    plain = TemporalRefinementLoss(smoothness=0.0)
    # an error at a boundary costs more than the same error far from one; without weights they cost the same
    at_edge, far = torch.zeros(1, 1, NUM_LABELS, 20), torch.zeros(1, 1, NUM_LABELS, 20)
    at_edge[..., 0, 7] = 4.0
    far[..., 0, 1] = 4.0
    assert loss(at_edge, target) > loss(far, target)
    assert torch.isclose(plain(at_edge, target), plain(far, target))
    with pytest.raises(ValueError, match="boundary_weight"):
        TemporalRefinementLoss(boundary_weight=-1.0)
