"""Command lines of the temporal refiner: ``temporal fit`` and ``refine`` on folders of per-video probability files."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from monai_vce.__main__ import main
from monai_vce.events.probabilities import Video, load_video_probs, probability_file, save_video_probs
from monai_vce.labels import NUM_LABELS, SECTIONS
from monai_vce.temporal import RefinerEnsemble, TemporalRefiner
from monai_vce.temporal.files import read_videos

TINY = json.dumps({"stages": 2, "layers": 4, "channels": 8})


def _write_videos(folder, n: int, seed: int, features: bool = False):
    rng = np.random.default_rng(seed)
    gt = {"videos": []}
    for i in range(n):
        T = 200 + 40 * i
        cut = int(rng.integers(60, T - 60))
        truth = np.zeros((T, NUM_LABELS), dtype=bool)
        truth[:cut, 2], truth[cut:, 3] = True, True
        probs = 1 / (1 + np.exp(-(np.where(truth, 1.0, -1.0) + 1.5 * rng.standard_normal(truth.shape))))
        index = np.arange(T) * 2 + 10  # ids with gaps and an offset: the events count in these units
        vid = f"vid{seed}_{i}"
        feats = rng.standard_normal((T, 6)).astype(np.float16) if features else None
        arrays = Video(vid, probs.astype(np.float32), index, index + 1000, features=feats)
        save_video_probs(probability_file(folder, vid), arrays)
        gt["videos"].append(
            {
                "video_id": vid,
                "events": [
                    {"start": int(index[0]), "end": int(index[cut - 1]), "label": [SECTIONS[2]]},
                    {"start": int(index[cut]), "end": int(index[-1]), "label": [SECTIONS[3]]},
                ],
            }
        )
    return gt


class _Result:
    def __init__(self, returncode: int, stdout: str, stderr: str) -> None:
        self.returncode, self.stdout, self.stderr = returncode, stdout, stderr


@pytest.fixture
def run(capsys):
    """The command line in this process (a fresh interpreter per call would cost seconds of imports)."""

    def _run(*args: str) -> _Result:
        code = main(["temporal", *args] if args[0] == "fit" else list(args))
        out = capsys.readouterr()
        return _Result(code, out.out, out.err)

    return _run


def test_fit_and_refine_round_trip(tmp_path, run):
    train, val, out = tmp_path / "train", tmp_path / "val", tmp_path / "refined"
    train.mkdir()
    val.mkdir()
    (tmp_path / "gt.json").write_text(json.dumps(_write_videos(train, 3, seed=0)))
    (tmp_path / "val_gt.json").write_text(json.dumps(_write_videos(val, 2, seed=1)))
    model = tmp_path / "refiner.pt"
    fit = run(
        "fit", "--probs-dir", str(train), "--gt", str(tmp_path / "gt.json"), "--out", str(model),
        "--val-probs-dir", str(val), "--val-gt", str(tmp_path / "val_gt.json"),
        "--network", TINY, "--steps", "4", "--crop-length", "64", "--batch-size", "2", "--frame-units", "frame_index",
    )  # fmt: skip
    assert fit.returncode == 0, fit.stderr
    summary = json.loads(fit.stdout)
    assert summary["out"] == str(model) and summary["videos"] == 3 and summary["val_loss"] is not None
    refiner = TemporalRefiner.load(model)
    assert sorted(refiner.trained_videos) == ["vid0_0", "vid0_1", "vid0_2"]
    assert refiner.fit_info["val_videos"] == ["vid1_0", "vid1_1"]

    ref = run("refine", "--probs-dir", str(val), "--refiner", str(model), "--out", str(out))
    assert ref.returncode == 0, ref.stderr
    assert json.loads(ref.stdout)["written"] == 2 and "warning" not in ref.stderr
    for vid in ("vid1_0", "vid1_1"):
        src, dst = load_video_probs(val / f"{vid}.npz"), load_video_probs(out / f"{vid}.npz")
        np.testing.assert_array_equal(dst.frame_index, src.frame_index)
        np.testing.assert_array_equal(dst.frame_number, src.frame_number)
        np.testing.assert_allclose(dst.probs, refiner.refine(src.probs), atol=1e-6)
        assert not np.allclose(dst.probs, src.probs)
    # a second run keeps the complete files; refining the training videos warns
    again = run("refine", "--probs-dir", str(val), "--refiner", str(model), "--out", str(out))
    assert json.loads(again.stdout)["kept"] == 2
    own = run("refine", "--probs-dir", str(train), "--refiner", str(model), "--out", str(tmp_path / "own"))
    assert own.returncode == 0 and "warning: " in own.stderr and "vid0_0" in own.stderr
    # an ensemble file (what the bundle's temporal stage writes) refines as the mean of its members
    second = TemporalRefiner.load(model)
    with torch.no_grad():
        for param in second.parameters():
            param.add_(0.05)
    ensemble = RefinerEnsemble([refiner, second]).save(tmp_path / "ensemble.pt")
    ens = run("refine", "--probs-dir", str(val), "--refiner", str(ensemble), "--out", str(tmp_path / "by_ensemble"))
    assert ens.returncode == 0, ens.stderr
    for vid in ("vid1_0", "vid1_1"):
        probs = load_video_probs(val / f"{vid}.npz").probs
        mean = (refiner.refine(probs) + second.refine(probs)) / 2
        np.testing.assert_allclose(load_video_probs(tmp_path / "by_ensemble" / f"{vid}.npz").probs, mean, atol=1e-6)


def test_cli_errors_name_the_file_or_video(tmp_path, run):
    train = tmp_path / "train"
    train.mkdir()
    gt = _write_videos(train, 2, seed=0)
    gt["videos"] = gt["videos"][:1]
    (tmp_path / "gt.json").write_text(json.dumps(gt))
    res = run("fit", "--probs-dir", str(train), "--gt", str(tmp_path / "gt.json"), "--out", str(tmp_path / "r.pt"))
    assert res.returncode == 2 and "vid0_1" in res.stderr and len(res.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "r.pt").exists()
    # the leakage guard: the frame model was trained on these very videos
    gt = _write_videos(train, 2, seed=0)
    (tmp_path / "gt.json").write_text(json.dumps(gt))
    (tmp_path / "trained.json").write_text(json.dumps(["vid0_1", "other"]))
    res = run(
        "fit", "--probs-dir", str(train), "--gt", str(tmp_path / "gt.json"), "--out", str(tmp_path / "r.pt"),
        "--frame-model-videos", str(tmp_path / "trained.json"),
    )  # fmt: skip
    assert res.returncode == 2 and "vid0_1" in res.stderr and "trained on the same video" in res.stderr
    # a wrong --frame-units value and the removed --units flag are one usage line each
    base = ["fit", "--probs-dir", str(train), "--gt", str(tmp_path / "gt.json"), "--out", str(tmp_path / "r.pt")]
    for extra in (["--frame-units", "bogus"], ["--units", "frame_index"]):
        res = run(*base, *extra)
        assert res.returncode == 2 and extra[0] in res.stderr and len(res.stderr.strip().splitlines()) == 1, res.stderr
    res = run(
        "refine", "--probs-dir", str(train), "--refiner", str(tmp_path / "missing.pt"), "--out", str(tmp_path / "o")
    )
    assert res.returncode == 2 and "missing.pt" in res.stderr and res.stderr.startswith("error: ")


def test_read_videos_with_features(tmp_path):
    gt = _write_videos(tmp_path, 2, seed=3, features=True)
    videos = read_videos(tmp_path, gt, frame_units="frame_index", features=True)
    v = videos["vid3_0"]
    assert v.probs.shape == (200, NUM_LABELS) and v.features.shape == (200, 6) and v.frame_index[0] == 10
    assert v.events == gt["videos"][0]["events"]
    assert v.targets.shape == (200, NUM_LABELS) and v.targets.any()
    by_number = read_videos(tmp_path, None, frame_units="frame_number")
    assert by_number["vid3_0"].frame_number[0] == 1010 and by_number["vid3_0"].events == []
    with pytest.raises(ValueError, match="frame_units"):
        read_videos(tmp_path, None, frame_units="frames")
    with pytest.raises(ValueError, match="features"):
        plain = tmp_path / "plain"
        plain.mkdir()
        _write_videos(plain, 1, seed=4)
        read_videos(plain, None, features=True)
