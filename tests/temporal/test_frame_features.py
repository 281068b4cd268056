"""Per-frame features in the probability files, and the temporal refiner applied by the refine stage.

In process, on a tiny network and a few random frames: the features written are the input of the network's head
from the same forward pass (shape (T, D), float16), absent when not asked for; files without them still load; a
network without the feature module fails only when features are asked for; a refiner whose inputs the run lacks
is refused with one line; a resumed run never decodes unrefined files or another refiner's files.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from monai.data import DataLoader
from monai.engines import SupervisedEvaluator
from monai.transforms import Activationsd
from torch import nn

from monai_vce.events.probabilities import (
    Video,
    load_video_probs,
    pending_frames,
    probability_file,
    save_video_probs,
)
from monai_vce.handlers import ProbabilityWriter, VideoFrameCollector
from monai_vce.labels import NUM_LABELS
from monai_vce.postprocessing import EventDecoder
from monai_vce.stages import decode, refine
from monai_vce.temporal import TemporalRefiner, refiner_fingerprint
from monai_vce.temporal.files import refine_folder

VIDEOS = {"a": 6, "b": 5}


def _frames(seed: int = 0) -> list[dict]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for vid, n in VIDEOS.items():
        for i in range(n):
            out.append(
                {"image": torch.rand(3, 32, 32, generator=g), "video_id": vid, "frame_index": i, "frame_number": 10 * i}
            )
    return out


@pytest.fixture(scope="module")
def tiny_network() -> nn.Module:
    from monai_vce.networks import TINY_MODEL_NAME, DiffAttnCLIPClassifier

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.manual_seed(0)
        return DiffAttnCLIPClassifier(
            backbone=TINY_MODEL_NAME, pretrained=False, image_size=32, contrastive=False
        ).eval()


def _run(network: nn.Module, writer: ProbabilityWriter, data: list[dict]) -> SupervisedEvaluator:
    evaluator = SupervisedEvaluator(
        device=torch.device("cpu"),
        val_data_loader=DataLoader(data, batch_size=4, shuffle=False),
        network=network,
        postprocessing=Activationsd(keys="pred", sigmoid=True),
        val_handlers=[writer],
        decollate=False,
    )
    evaluator.run()
    return evaluator


def test_features_come_from_the_same_forward_pass(tiny_network, tmp_path):
    data = _frames()
    calls = []
    handle = tiny_network.register_forward_hook(lambda *_: calls.append(1))
    try:
        _run(tiny_network, ProbabilityWriter(tmp_path / "with", features=True), data)
        batches = len(calls)
        _run(tiny_network, ProbabilityWriter(tmp_path / "without"), data)
    finally:
        handle.remove()
    assert batches == 3  # 11 frames in batches of 4: one forward pass per batch, none extra for the features
    for vid, n in VIDEOS.items():
        video = load_video_probs(probability_file(tmp_path / "with", vid), features=True)
        assert video.features is not None
        assert video.features.dtype == np.float16 and video.features.shape == (n, tiny_network.embed_dim)
        images = torch.stack([d["image"] for d in data if d["video_id"] == vid])
        with torch.no_grad():
            expected = tiny_network.forward_features(images).numpy()
        np.testing.assert_allclose(video.features.astype(np.float32), expected, rtol=2e-3, atol=2e-3)
        plain = load_video_probs(probability_file(tmp_path / "without", vid), features=True)
        assert plain.features is None  # absent when not asked for
        with np.load(probability_file(tmp_path / "without", vid)) as z:
            assert "features" not in z.files
        np.testing.assert_array_equal(plain.probs, video.probs)  # the probabilities do not change


def test_collector_keeps_features_in_frame_order():
    got = []
    collector = VideoFrameCollector(got.append, features_key="features")
    feats = np.arange(12, dtype=np.float32).reshape(6, 2)
    # frames of video x arrive out of order in the first batch; y starts in the second
    collector.update(["x", "x", "x"], np.full((3, NUM_LABELS), 0.5), [2, 0, 1], features=feats[:3])
    collector.update(["x", "y", "y"], np.full((3, NUM_LABELS), 0.5), [3, 0, 1], features=feats[3:])
    collector.epoch_completed()
    assert [v.video_id for v in got] == ["x", "y"]
    assert got[0].features.dtype == np.float16
    np.testing.assert_array_equal(got[0].features, feats[[1, 2, 0, 3]].astype(np.float16))
    np.testing.assert_array_equal(got[1].features, feats[4:].astype(np.float16))


def test_a_network_without_the_feature_module_fails_only_when_features_are_asked(tmp_path):
    network = nn.Sequential(nn.Flatten(), nn.Linear(3 * 32 * 32, NUM_LABELS)).eval()
    _run(network, ProbabilityWriter(tmp_path / "plain"), _frames())  # no features: runs
    assert sorted(p.stem for p in (tmp_path / "plain").glob("*.npz")) == sorted(VIDEOS)
    with pytest.raises(ValueError, match=r"network Sequential has no submodule 'classifier_head'.*write_features"):
        _run(network, ProbabilityWriter(tmp_path / "features", features=True), _frames())
    assert not list((tmp_path / "features").glob("*.npz"))
    # naming the module whose input is the feature works for any network
    _run(network, ProbabilityWriter(tmp_path / "named", features=True, feature_module="1"), _frames())
    video = load_video_probs(probability_file(tmp_path / "named", "a"), features=True)
    assert video.features is not None and video.features.shape == (6, 3 * 32 * 32)


def test_files_without_features_still_load_and_are_recomputed_when_features_are_needed(tmp_path):
    probs = np.random.default_rng(0).random((4, NUM_LABELS)).astype(np.float32)
    ids = np.arange(4)
    path = save_video_probs(probability_file(tmp_path, "v"), Video("v", probs, ids, ids), source="m")
    assert load_video_probs(path).features is None
    assert load_video_probs(path, features=True).features is None
    datalist = [{"video_id": "v", "frame_index": i} for i in range(4)]
    assert pending_frames(datalist, tmp_path, source="m") == []
    assert len(pending_frames(datalist, tmp_path, source="m", features=True)) == 4  # needs features: recomputed
    feats = np.ones((4, 3), np.float32)
    save_video_probs(path, Video("v", probs, ids, ids, features=feats), source="m")
    assert pending_frames(datalist, tmp_path, source="m", features=True) == []
    # a refiner of probabilities reads files without features
    out = refine_folder(TemporalRefiner(network={"stages": 1, "layers": 1, "channels": 4}), tmp_path, tmp_path / "r")
    assert out["written"] == ["v"]


def test_a_refiner_whose_inputs_the_run_lacks_is_refused(tiny_network, tmp_path):
    refiner = TemporalRefiner(inputs="features", feature_dim=5, network={"stages": 1, "layers": 1, "channels": 4})
    _run(tiny_network, ProbabilityWriter(tmp_path / "plain"), _frames())  # no features
    with pytest.raises(ValueError, match=r"probability file .*a\.npz has no 'features' array \(the refiner's inputs"):
        refine(tmp_path / "plain", tmp_path / "r", refiner)
    with pytest.raises(ValueError, match="is the folder of the frame model's probability files"):
        refine(tmp_path / "plain", tmp_path / "plain", TemporalRefiner())
    # the width a refiner of features needs is checked at the first batch, before any file is written
    writer = ProbabilityWriter(tmp_path / "p", features=True, feature_dim=refiner.feature_dim)
    with pytest.raises(ValueError, match=r"gives 32-wide features, but 5 are needed"):
        _run(tiny_network, writer, _frames())
    assert not (tmp_path / "p").exists() or not list((tmp_path / "p").glob("*.npz"))  # nothing written


def _random_refiner(seed: int) -> TemporalRefiner:
    torch.manual_seed(seed)
    refiner = TemporalRefiner(network={"stages": 1, "layers": 2, "channels": 4})
    with torch.no_grad():
        for p in refiner.network.parameters():
            p.normal_(0.0, 0.5)
    return refiner.eval()


def test_resume_never_mixes_refined_and_unrefined_files(tmp_path):
    rng = np.random.default_rng(1)
    probs_dir, refined_dir, model = tmp_path / "probs", tmp_path / "refined", "model.pt:1:2"
    frames = {}
    for vid, n in VIDEOS.items():
        frames[vid] = rng.random((n, NUM_LABELS)).astype(np.float32)
        save_video_probs(probability_file(probs_dir, vid), Video(vid, frames[vid], np.arange(n), np.arange(n)), model)

    def run(refiner_file: Path) -> dict:
        source = f"{model} | {refiner_fingerprint(refiner_file)}"
        refine(probs_dir, refined_dir, TemporalRefiner.load(refiner_file), source=source, videos=list(VIDEOS))
        decode(refined_dir, tmp_path / "events.json", videos=list(VIDEOS))
        return {vid: load_video_probs(probability_file(refined_dir, vid)) for vid in VIDEOS}

    refiner_file = tmp_path / "refiner.pt"
    first = _random_refiner(0)
    first.save(refiner_file)
    source_a = f"{model} | {refiner_fingerprint(refiner_file)}"
    for vid, video in run(refiner_file).items():
        assert video.source == source_a
        np.testing.assert_allclose(video.probs, first.refine(frames[vid]), atol=1e-6)
    # an unrefined file in the refined folder (e.g. copied there by hand) is never decoded: it is recomputed
    save_video_probs(probability_file(refined_dir, "b"), load_video_probs(probability_file(probs_dir, "b")))
    kept_mtime = probability_file(refined_dir, "a").stat().st_mtime_ns
    again = run(refiner_file)
    assert again["b"].source == source_a and probability_file(refined_dir, "a").stat().st_mtime_ns == kept_mtime
    # another refiner in the same file: every refined file is recomputed, the events come from its outputs
    second = _random_refiner(1)
    second.save(refiner_file)
    source_b = f"{model} | {refiner_fingerprint(refiner_file)}"
    assert source_b != source_a
    from monai_vce.metrics import load_events

    refined = run(refiner_file)
    events = {v["video_id"]: v["events"] for v in load_events(tmp_path / "events.json")["videos"]}
    for vid, video in refined.items():
        assert video.source == source_b
        expected = second.refine(frames[vid])
        np.testing.assert_allclose(video.probs, expected, atol=1e-6)
        assert events[vid] == EventDecoder()(expected, np.arange(VIDEOS[vid]), video_id=vid)


def _gather_features(local_rank: int, out_dir: str) -> None:
    import ignite.distributed as idist

    rank = idist.get_rank()
    got: list[Video] = []
    collector = VideoFrameCollector(got.append, features_key="features")
    # the frames of one video spread over both ranks (as a distributed sampler spreads them); rank 1 also has "y"
    index = np.array([0, 2]) if rank == 0 else np.array([1, 3, 0])
    vids = ["x", "x"] if rank == 0 else ["x", "x", "y"]
    feats = np.stack([index * 10.0 + rank, -index - 0.5 * rank], axis=1)
    collector.update(vids, np.full((len(vids), NUM_LABELS), 0.5), index, features=feats)
    collector.epoch_completed()
    if rank == 0:
        np.savez(Path(out_dir) / "gathered.npz", **{v.video_id: v.features for v in got})


@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed is not available")
def test_features_are_gathered_across_ranks(tmp_path):
    import ignite.distributed as idist

    # fork: the children need no fresh import of torch and MONAI
    with idist.Parallel(backend="gloo", nproc_per_node=2, start_method="fork") as parallel:
        parallel.run(_gather_features, str(tmp_path))
    with np.load(tmp_path / "gathered.npz") as z:
        assert z["x"].dtype == np.float16
        np.testing.assert_array_equal(z["x"], np.array([[0, 0], [11, -1.5], [20, -2], [31, -3.5]], np.float16))
        np.testing.assert_array_equal(z["y"], np.array([[1, -0.5]], np.float16))
