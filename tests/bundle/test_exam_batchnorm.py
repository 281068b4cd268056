"""Per-exam AdaBN in inference: VideoBatchSampler, ExamBatchNormHandler and the bundle overlay adabn.json."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn as nn
from bundle_helpers import CONFIGS, DEMO, INFERENCE, inference_args, run_in_process

from monai_vce.data import VideoBatchSampler
from monai_vce.handlers import ExamBatchNormHandler
from monai_vce.networks.adabn import adapt_batchnorm, batchnorm_state

ADABN = str(CONFIGS / "adabn.json")


def _datalist(lengths: dict[str, int]) -> list[dict]:
    return [{"video_id": v, "frame_index": i} for v, n in lengths.items() for i in range(n)]


@pytest.mark.parametrize("batch_size", [1, 3, 4, 64])
def test_sampler_batches_stay_within_one_video_and_cover_every_index_once(batch_size):
    data = _datalist({"a": 5, "b": 3, "c": 7, "d": 1})
    sampler = VideoBatchSampler(data, batch_size=batch_size)
    batches = list(sampler)
    assert len(sampler) == len(batches)
    assert [i for b in batches for i in b] == list(range(len(data)))  # every index once, in order
    for b in batches:
        assert 1 <= len(b) <= batch_size
        assert len({data[i]["video_id"] for i in b}) == 1
        assert b == list(range(b[0], b[-1] + 1))  # consecutive


def test_sampler_reads_a_datasets_datalist_on_first_use():
    from monai.data import Dataset

    from monai_vce.utils import LazySequence

    calls = []

    def build():
        calls.append(1)
        return _datalist({"a": 4, "b": 2})

    sampler = VideoBatchSampler(Dataset(LazySequence(build)), batch_size=3)
    assert not calls  # building reads nothing
    assert list(sampler) == [[0, 1, 2], [3], [4, 5]] and len(sampler) == 3
    with pytest.raises(ValueError, match="batch_size"):
        VideoBatchSampler([], batch_size=0)


class _BNNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 1)
        self.bn = nn.BatchNorm2d(4)
        self.drop = nn.Dropout(0.5)  # must stay off during the adaptation and the prediction
        self.fc = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.drop(self.bn(self.conv(x)).mean(dim=(2, 3))))


class _NoBNNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(3, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x.mean(dim=(2, 3)))


def _exams(lengths: dict[str, int]) -> list[dict]:
    g = torch.Generator().manual_seed(0)
    items = []
    for k, (vid, n) in enumerate(lengths.items()):
        # each exam its own "device": another brightness and contrast
        frames = torch.rand(n, 3, 6, 6, generator=g) * (1 + k) + 2 * k
        items += [{"image": frames[i], "video_id": vid} for i in range(n)]
    return items


def _net() -> _BNNet:
    torch.manual_seed(0)
    net = _BNNet()
    with torch.no_grad():
        net.bn.running_mean.fill_(0.3)
        net.bn.running_var.fill_(2.0)
    return net


def _evaluator(data, network, handler, batch_sampler=None, batch_size=None):
    from monai.data import DataLoader, Dataset
    from monai.engines import SupervisedEvaluator

    from monai_vce.data import VCEPrepareBatch

    ds = Dataset(data)
    if batch_sampler is not None:
        loader = DataLoader(ds, batch_sampler=batch_sampler(ds))
    else:
        loader = DataLoader(ds, batch_size=batch_size, shuffle=False)
    return ds, SupervisedEvaluator(
        device=torch.device("cpu"),
        val_data_loader=loader,
        network=network,
        prepare_batch=VCEPrepareBatch(),
        decollate=False,
        val_handlers=None if handler is None else [handler(ds)],
    )


def _run(evaluator) -> dict[str, torch.Tensor]:
    from ignite.engine import Events

    preds: dict[str, list[torch.Tensor]] = {}

    def collect(engine):
        vid = engine.state.batch["video_id"][0]
        preds.setdefault(vid, []).append(engine.state.output["pred"].detach().clone())

    evaluator.add_event_handler(Events.ITERATION_COMPLETED, collect)
    evaluator.run()
    return {k: torch.cat(v) for k, v in preds.items()}


@pytest.mark.parametrize("frames_per_exam", [256, 5])
def test_handler_predicts_each_exam_as_adabn_on_that_exam_alone(frames_per_exam):
    lengths = {"v1": 9, "v2": 6, "v3": 11}
    data = _exams(lengths)
    net = _net()
    before = batchnorm_state(net)
    handler = None

    def make(ds):
        nonlocal handler
        handler = ExamBatchNormHandler(ds, frames_per_exam=frames_per_exam, batch_size=4)
        return handler

    _, evaluator = _evaluator(data, net, make, batch_sampler=lambda ds: VideoBatchSampler(ds, batch_size=4))
    net.train()  # the handler gives back the modes it found
    got = _run(evaluator)
    assert handler is not None and handler.adapted == list(lengths)
    for vid, n in lengths.items():
        frames = torch.stack([d["image"] for d in data if d["video_id"] == vid])
        picks = np.unique(np.linspace(0, n - 1, min(n, frames_per_exam)).round().astype(int))
        ref = adapt_batchnorm(copy.deepcopy(_net()), frames[picks].split(3))
        with torch.no_grad():
            expected = ref.eval()(frames)
        torch.testing.assert_close(got[vid], expected, rtol=1e-5, atol=1e-5)
    # the stored statistics and the modes are back after the run
    after = batchnorm_state(net)
    for name, entry in before.items():
        for key in ("running_mean", "running_var", "num_batches_tracked"):
            assert torch.equal(after[name][key], entry[key])
    assert all(m.training for m in net.modules())


def test_predictions_differ_from_the_stored_statistics():
    data = _exams({"v1": 8, "v2": 8})
    _, plain = _evaluator(data, _net(), None, batch_sampler=lambda ds: VideoBatchSampler(ds, batch_size=4))
    _, adapted = _evaluator(
        data, _net(), lambda ds: ExamBatchNormHandler(ds), batch_sampler=lambda ds: VideoBatchSampler(ds, 4)
    )
    a, b = _run(plain), _run(adapted)
    assert not torch.allclose(a["v2"], b["v2"])


def test_a_batch_of_two_videos_is_an_error_and_the_statistics_are_restored():
    net = _net()
    before = batchnorm_state(net)
    _, evaluator = _evaluator(_exams({"v1": 5, "v2": 5}), net, lambda ds: ExamBatchNormHandler(ds), batch_size=4)
    with pytest.raises(ValueError, match=r"2 videos \(v1, v2\).*VideoBatchSampler"):
        evaluator.run()
    for name, entry in before.items():
        assert torch.equal(batchnorm_state(net)[name]["running_mean"], entry["running_mean"])


def test_a_network_without_batchnorm_is_an_error():
    data = _exams({"v1": 4})
    with pytest.raises(ValueError, match="has no BatchNorm layers; train with head_batch_norm true"):
        _evaluator(data, _NoBNNet(), lambda ds: ExamBatchNormHandler(ds, network=_NoBNNet()), batch_size=4)
    # the evaluator's own network is checked when the run starts (MONAI sets it after attaching handlers)
    _, evaluator = _evaluator(data, _NoBNNet(), lambda ds: ExamBatchNormHandler(ds), batch_size=4)
    with pytest.raises(ValueError, match="has no BatchNorm layers"):
        evaluator.run()


def test_reduced_inference_refuses_adabn():
    from types import SimpleNamespace

    from monai_vce.handlers.exam_batchnorm import require_full_inference

    full = SimpleNamespace(reduced=False)
    assert require_full_inference(full) is full
    assert require_full_inference(SimpleNamespace(reduced=True), enabled=False).reduced
    with pytest.raises(ValueError, match="full inference only"):
        require_full_inference(SimpleNamespace(reduced=True))


# --- the bundle: inference.json + demo.json + adabn.json on a tiny model trained with head_batch_norm true ---


def _shifted_copy(src: Path, dst: Path) -> None:
    """The frames as another capsule would give them: darker, with a colour cast."""
    from PIL import Image

    for png in sorted(src.rglob("*")):
        if png.suffix.lower() != ".png":
            continue
        out = dst / png.relative_to(src)
        out.parent.mkdir(parents=True, exist_ok=True)
        arr = np.asarray(Image.open(png).convert("RGB"), dtype=np.float32)
        arr = np.clip(arr * np.array([0.55, 0.8, 1.1]) + 20, 0, 255).astype(np.uint8)
        Image.fromarray(arr).save(out)


@pytest.fixture(scope="module")
def tiny_bn_bundle(tmp_path_factory):
    from monai_vce.data.frames import load_vce_frame
    from monai_vce.networks import DiffAttnCLIPClassifier
    from monai_vce.workflows import ensure_mini_galar, inference_datalist

    root = tmp_path_factory.mktemp("adabn")
    source = Path(
        ensure_mini_galar(
            root / "mini", videos=2, frames_per_video=60, size=64, seed=0, use_real_timelines=False, progress=False
        )
    )
    shifted = root / "shifted"
    _shifted_copy(source / "frames", shifted / "frames")
    torch.manual_seed(0)
    # the inference network of the configs (attention, SE head) at the tests' tiny size, with the BatchNorm head
    net = DiffAttnCLIPClassifier(
        backbone="vce-tiny-vit-64",
        pretrained=False,
        image_size=64,
        attention="diff",
        attention_variant="diff_transformer",
        se_reduction=4,
        head_batch_norm=True,
        contrastive=False,
    )
    # "trained" on the source capsule: its BatchNorm statistics are those of the unshifted frames
    frames = [load_vce_frame(d["image"], 64) for d in inference_datalist(source / "frames")]
    images = torch.stack([torch.as_tensor(f) for f in frames]).float() / 255.0
    adapt_batchnorm(net, images.split(32))
    models = root / "models"
    models.mkdir()
    torch.save(net.state_dict(), models / "model.pt")
    return models, shifted / "frames"


def _probs(out: Path) -> dict[str, np.ndarray]:
    files = sorted((out / "probs").glob("*.npz"))
    result = {}
    for p in files:
        with np.load(p) as z:
            result[p.stem] = z["probs"]
    return result


def test_bundle_adabn_writes_other_probabilities_on_a_shifted_capsule(tiny_bn_bundle, tmp_path):
    models, data_dir = tiny_bn_bundle
    extra = ("--screening", "False", "--report", "False", "--head_batch_norm", "True")
    plain = run_in_process(inference_args(models, data_dir, tmp_path / "plain", *extra, configs=(INFERENCE, DEMO)))
    adabn = run_in_process(
        inference_args(models, data_dir, tmp_path / "adabn", *extra[:4], configs=(INFERENCE, DEMO, ADABN))
    )
    a, b = _probs(tmp_path / "plain"), _probs(tmp_path / "adabn")
    assert len(a) == 2 and sorted(a) == sorted(b), (plain.stdout + plain.stderr)[-2000:]
    for vid in a:
        assert a[vid].shape == b[vid].shape == (60, 17)
        assert np.isfinite(b[vid]).all() and ((b[vid] >= 0) & (b[vid] <= 1)).all()
        assert np.abs(a[vid] - b[vid]).max() > 1e-3, vid
    assert json.loads((tmp_path / "adabn" / "events.json").read_text())["videos"]
    assert adabn.returncode == 0
    # with a reduced inference the overlay refuses to run instead of silently skipping the adaptation
    bad = run_in_process(
        inference_args(
            models, data_dir, tmp_path / "bad", *extra[:4], "--reduction#stride", "4", configs=(INFERENCE, DEMO, ADABN)
        ),
        check=False,
    )
    assert bad.returncode != 0 and "full inference only" in bad.stdout + bad.stderr
