"""The reduced-inference driver on generated frames: signatures in the loader, the tiny network, files, resume."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

from monai_vce.data import LoadVCEFramed
from monai_vce.data.synthetic import generate_mini_galar
from monai_vce.events import Video, load_video_probs, pending_frames, save_video_probs
from monai_vce.inference import (
    FramePredictor,
    FrameSignatured,
    ReducedInference,
    duplicate_anchors,
    frame_signature,
    resume_sources,
)
from monai_vce.labels import NUM_LABELS
from monai_vce.networks import TINY_MODEL_NAME, DiffAttnCLIPClassifier
from monai_vce.stages import decode, refine
from monai_vce.workflows import inference_datalist


@pytest.fixture(scope="module")
def mini(tmp_path_factory):
    root = tmp_path_factory.mktemp("mini")
    generate_mini_galar(root, videos=2, frames_per_video=40, size=32, seed=3, naming="galar")
    return root


@pytest.fixture(scope="module")
def network():
    torch.manual_seed(0)
    return DiffAttnCLIPClassifier(backbone=TINY_MODEL_NAME, pretrained=False, image_size=64).eval()


def lingering_copy(mini, tmp_path):
    """The mini-Galar with frames 10-19 of video 1 replaced by copies of frame 10 (a capsule that lingers)."""
    root = tmp_path / "lingering"
    shutil.copytree(mini, root)
    data = inference_datalist(root / "frames", videos=["1"])
    for item in data[11:20]:
        shutil.copyfile(data[10]["image"], item["image"])
    return data


def test_signature_transform_on_generated_frames(mini, tmp_path):
    data = lingering_copy(mini, tmp_path)
    load = LoadVCEFramed(keys="image", image_size=64)
    sign = FrameSignatured(keys="image", size=8)
    items = [sign(load(d)) for d in data]
    assert all(i["signature"].dtype == torch.uint8 and i["signature"].shape == (64,) for i in items)
    assert items[0]["image"].shape == (3, 64, 64)  # the image is left as it is
    sig = np.stack([i["signature"].numpy() for i in items])
    assert (sig[11:20] == sig[10]).all()
    # generated frames differ from one another (sensor noise, moving lumen): no frame is skipped at tolerance 0,
    # the copies are at a small tolerance, and the others are not
    assert np.array_equal(duplicate_anchors(sig, 0.0), np.arange(len(sig)))
    anchors = duplicate_anchors(sig, 0.5)
    assert (anchors[11:20] == 10).all()
    assert np.array_equal(np.delete(anchors, np.arange(11, 20)), np.delete(np.arange(len(sig)), np.arange(11, 20)))
    # float frames in [0, 1] give the same signature as their uint8 source
    img = items[3]["image"]
    assert torch.equal(frame_signature(img.float() / 255, 8), frame_signature(img, 8))
    with pytest.raises(ValueError, match="expected a"):
        frame_signature(torch.zeros(4, 8, 8))


def test_frame_predictor_matches_the_network(mini, network):
    from monai_vce.data import vce_val_transforms

    data = inference_datalist(mini / "frames", videos=["1"])
    predict = FramePredictor(network, data, image_size=64, batch_size=7)
    rows = np.array([0, 3, 5, 17, 39])
    out = predict(rows)
    assert out.shape == (5, NUM_LABELS) and out.dtype == np.float32
    transform = vce_val_transforms(image_size=64)
    x = torch.stack([transform(dict(data[i]))["image"] for i in rows.tolist()]).float() / 255
    with torch.inference_mode():
        ref = torch.sigmoid(network(x)).numpy()
    np.testing.assert_allclose(out, ref, atol=1e-5)
    with pytest.raises(ValueError, match="rows must lie in"):
        predict(np.array([40]))


def test_reduced_inference_files_events_and_resume(mini, network, tmp_path):
    data = inference_datalist(mini / "frames")
    full = ReducedInference(network, data, tmp_path / "full", stride=1, image_size=64, batch_size=16, progress=False)
    assert full.run() == tmp_path / "full"
    assert sorted(p.name for p in (tmp_path / "full").iterdir()) == ["1.npz", "2.npz"]  # the files and nothing more
    events = json.loads(decode(tmp_path / "full", tmp_path / "events.json").read_text())
    assert [v["video_id"] for v in events["videos"]] == ["1", "2"]
    with np.load(tmp_path / "full" / "1.npz") as z:
        full_probs = z["probs"]
        assert z["inferred"].all() and z["probs"].shape == (40, NUM_LABELS)

    out = tmp_path / "reduced"
    run = ReducedInference(
        network, data, out, stride=8, refine=False, image_size=64, batch_size=16, progress=False, source="model-a"
    )
    run.run()
    with np.load(out / "1.npz") as z:
        inferred = z["inferred"]
        assert inferred.sum() == 6 and inferred[[0, 8, 16, 24, 32, 39]].all()
        np.testing.assert_allclose(z["probs"][inferred], full_probs[inferred], atol=1e-5)
        assert z["frame_index"].tolist() == list(range(40))
        assert "reduced(stride=8" in str(z["source"])
    assert run.stats["1"] == {"frames": 40, "inferred": 6, "seconds": pytest.approx(run.stats["1"]["seconds"])}
    events = json.loads(decode(out, tmp_path / "reduced_events.json").read_text())
    assert [v["video_id"] for v in events["videos"]] == ["1", "2"]

    # a rerun with the same model and settings infers nothing; other settings recompute
    again = ReducedInference(
        network, data, out, stride=8, refine=False, image_size=64, batch_size=16, progress=False, source="model-a"
    )
    again.run()
    assert again.predictor.frames_inferred == 0
    other = ReducedInference(
        network, data, out, stride=4, refine=False, image_size=64, progress=False, source="model-a"
    )
    other.run()
    assert other.predictor.frames_inferred == 2 * 11


def test_reduced_inference_skips_near_duplicates(mini, network, tmp_path):
    data = lingering_copy(mini, tmp_path)
    common = {"stride": 1, "image_size": 64, "batch_size": 16, "progress": False}
    run = ReducedInference(network, data, tmp_path / "dup", duplicate_tolerance=0.5, **common)
    run.run()
    with np.load(tmp_path / "dup" / "1.npz") as z:
        assert z["inferred"].sum() == 31 and not z["inferred"][11:20].any()
        assert np.array_equal(z["probs"][11:20], np.repeat(z["probs"][10:11], 9, axis=0))
    off = ReducedInference(network, data, tmp_path / "off", duplicate_tolerance=0.0, **common)
    off.run()
    assert off.predictor.frames_inferred == 40


def test_resume_between_full_and_reduced_inference(mini, network, tmp_path):
    """A reduced run reuses the full-inference files of the same model; full inference never reuses reduced ones."""
    data = inference_datalist(mini / "frames")
    common = {"image_size": 64, "batch_size": 16, "progress": False, "source": "model-a"}
    out = tmp_path / "probs"
    ReducedInference(network, data, out, stride=8, refine=False, **common).run()
    assert (
        load_video_probs(out / "1.npz").source == "model-a|reduced(stride=8,budget=None,refine=False,margin=0.3,dup=0)"
    )
    assert pending_frames(data, out, source="model-a") == data  # what the bundle's full inference infers
    for vid in ("1", "2"):  # full-inference files, as the event writer saves them
        v = load_video_probs(out / f"{vid}.npz")
        save_video_probs(out / f"{vid}.npz", Video(vid, v.probs, v.frame_index, v.frame_number), "model-a")
    assert pending_frames(data, out, source="model-a") == []
    reduced = ReducedInference(network, data, out, stride=4, **common)
    reduced.run()
    assert reduced.predictor.frames_inferred == 0
    other_model = ReducedInference(network, data, out, stride=4, refine=False, **{**common, "source": "model-b"})
    other_model.run()
    assert other_model.predictor.frames_inferred == 2 * 11
    # the bundle filters its dataset with the same rule
    keys = {"stride": 4, "refine": True, "budget": None, "margin": 0.3, "duplicate_tolerance": 0.0, "options": {}}
    assert resume_sources("model-a", keys) == ["model-a", reduced.stored_source]
    assert resume_sources("model-a", {**keys, "stride": 1}) == resume_sources("model-a") == ["model-a"]


def test_a_refiner_of_probabilities_composes_with_reduced_inference(mini, network, tmp_path):
    """A refiner of probabilities is what the refinement aims at; the files keep the frame model's probabilities, and
    the refine and decode stages decode the refined ones."""
    data = inference_datalist(mini / "frames")
    calls = []

    class Sharpen:
        inputs, trained_videos = "probs", ()

        def refine(self, probs, features=None, chunk_size=None):
            calls.append(len(probs))
            return np.where(probs > np.median(probs, axis=0), 0.9, 0.1).astype(np.float32)

    sharpen = Sharpen()
    run = ReducedInference(
        network, data, tmp_path / "out", stride=8, refiner=sharpen, image_size=64, batch_size=16, progress=False
    )
    assert run.probs_transform == sharpen.refine
    run.run()
    assert calls.count(40) >= 2  # every video: at least one refinement round
    refine(tmp_path / "out", tmp_path / "refined", sharpen)
    events = {
        v["video_id"]: v["events"]
        for v in json.loads(decode(tmp_path / "refined", tmp_path / "e.json").read_text())["videos"]
    }
    for vid in ("1", "2"):
        video = load_video_probs(tmp_path / "out" / f"{vid}.npz")
        assert not np.isin(video.probs, (0.1, 0.9)).all()
        assert events[vid] == run.decoder(sharpen.refine(video.probs), video.frame_index, video_id=vid)
        assert events[vid] != run.decoder(video.probs, video.frame_index, video_id=vid)


def test_reduced_inference_refuses_what_it_cannot_write(mini, network, tmp_path):
    """Reduced inference infers some frames only: per-frame features, or a refiner of features, are refused."""
    data = inference_datalist(mini / "frames")
    common = {"stride": 4, "image_size": 64, "progress": False}
    with pytest.raises(ValueError, match=r"reduced inference \(reduced\(stride=4.*\(write_features\)"):
        ReducedInference(network, data, tmp_path / "a", features=True, **common).run()

    class OfFeatures:
        inputs = "features"

        def refine(self, probs, features=None, chunk_size=None):
            return probs

    with pytest.raises(ValueError, match=r"a temporal refiner with inputs='features'"):
        ReducedInference(network, data, tmp_path / "b", refiner=OfFeatures(), **common).run()
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
