"""Self-training test-time adaptation (monai_vce.engines.SelfTraining) and the bundle's ``adapt`` workflow."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from bundle_helpers import CONFIGS, DEMO, INFERENCE, inference_args, run_in_process, trained_bundle

from monai_vce.engines import SelfTraining, self_train, strong_view, trainable_parameters
from monai_vce.handlers import VCECheckpointLoader
from monai_vce.networks import DiffAttnCLIPClassifier
from monai_vce.utils import check_torch_seal

ADAPT = str(CONFIGS / "adapt.json")
TINY = {"backbone": "vce-tiny-vit-64", "pretrained": False, "image_size": 64, "contrastive": False}


def _network() -> DiffAttnCLIPClassifier:
    torch.manual_seed(0)  # the same starting weights in every test
    # the head's BatchNorm: its statistics must stay, its affine parameters train
    return DiffAttnCLIPClassifier(**TINY, head_batch_norm=True)


@pytest.fixture(scope="module")
def frames() -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    return [{"image": torch.randint(0, 256, (3, 64, 64), dtype=torch.uint8, generator=g)} for _ in range(12)]


def _state(net: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in net.state_dict().items()}


def _run(net: torch.nn.Module, frames: list, out: Path, **kwargs) -> SelfTraining:
    # thresholds 0.5 / 0.5: an untrained network's probabilities near 0.5 all become pseudo-labels
    settings = {"steps": 3, "batch_size": 4, "learning_rate": 1e-2, "positive_threshold": 0.5}
    settings.update(negative_threshold=0.5, anchor_weight=0.0)
    settings.update(kwargs)
    st = SelfTraining(net, frames, out, **settings)
    assert st() == out
    return st


@pytest.mark.parametrize("subset", ["norm_and_head", "all"])
def test_only_the_chosen_subset_trains(frames, tmp_path, subset):
    net = _network()
    before = dict(net.named_parameters())
    start = _state(net)
    flags = {k: p.requires_grad for k, p in before.items()}
    chosen = set(trainable_parameters(net, subset))
    st = _run(net, frames, tmp_path / "a.pt", parameters=subset)
    changed = {k for k, p in net.named_parameters() if not torch.equal(p, start[k])}
    assert changed and changed <= chosen
    if subset == "norm_and_head":
        assert any(k.startswith("classifier_head.") for k in changed)
        assert any(".norm" in k for k in changed) and not any("attn.qkv" in k for k in changed)
        assert "classifier_head.norm.weight" in changed
    assert all(torch.equal(b, start[k]) for k, b in net.named_buffers() if k in start)  # BatchNorm statistics kept
    assert {k: p.requires_grad for k, p in net.named_parameters()} == flags
    saved = torch.load(tmp_path / "a.pt", map_location="cpu", weights_only=True)
    moved = {k for k, v in saved.items() if not torch.equal(v, start[k])}
    assert moved and moved <= chosen
    assert st.summary["confident"] > 0.99 and st.summary["steps"] == 3


def test_everything_masked_leaves_the_student_still(frames, tmp_path):
    net = _network()
    start = _state(net)
    # no probability is above 1 or below 0: every entry is masked; the anchor's gradient at the start is zero
    st = _run(net, frames, tmp_path / "a.pt", positive_threshold=1.0, negative_threshold=0.0, anchor_weight=1.0)
    assert st.summary["confident"] == 0.0 and st.summary["loss"] == 0.0
    assert all(torch.equal(v, start[k]) for k, v in net.state_dict().items())
    saved = torch.load(tmp_path / "a.pt", map_location="cpu", weights_only=True)
    assert all(torch.equal(v, start[k]) for k, v in saved.items())


def test_saved_file_loads_into_a_fresh_network_as_the_teacher(frames, tmp_path):
    out = tmp_path / "sub" / "adapted.pt"
    st = _run(_network(), frames, out, ema_decay=0.5)
    assert check_torch_seal(out)  # sealed like the bundle's model.pt
    fresh = _network()
    VCECheckpointLoader(load_path=str(out), load_dict={"model": fresh})(
        SimpleNamespace(state=SimpleNamespace(epoch=0, max_epochs=None))
    )
    assert st.teacher is not None
    teacher = st.teacher.state_dict()
    assert all(torch.equal(v, teacher[k]) for k, v in fresh.state_dict().items())
    # the teacher follows the student, half way per step at decay 0.5: it moved, but not as far
    assert not all(torch.equal(v, _network().state_dict()[k]) for k, v in teacher.items())


def test_load_path_and_seed_give_the_same_weights(frames, tmp_path):
    torch.save(_network().state_dict(), tmp_path / "model.pt")
    digests = []
    for name, seed in (("a.pt", 0), ("b.pt", 0), ("c.pt", 1)):
        other = DiffAttnCLIPClassifier(**TINY, head_batch_norm=True)
        rng = torch.get_rng_state()
        self_train(
            network=other,
            data=frames,
            output_file=tmp_path / name,
            load_path=tmp_path / "model.pt",
            steps=2,
            batch_size=4,
            learning_rate=1e-2,
            positive_threshold=0.5,
            negative_threshold=0.5,
            seed=seed,
        )
        assert torch.equal(torch.get_rng_state(), rng)  # the caller's random state is left alone
        state = torch.load(tmp_path / name, map_location="cpu", weights_only=True)
        digests.append(hashlib.sha256(b"".join(v.numpy().tobytes() for v in state.values())).hexdigest())
    assert digests[0] == digests[1] != digests[2]


def test_strong_view_is_seeded_and_in_range():
    x = torch.rand(4, 3, 8, 8)
    a = strong_view(x, torch.Generator().manual_seed(3))
    b = strong_view(x, torch.Generator().manual_seed(3))
    assert torch.equal(a, b) and a.shape == x.shape and a.min() >= 0.0 and a.max() <= 1.0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"steps": 0}, "steps must be at least 1"),
        ({"batch_size": 2.5}, "batch_size must be an integer"),
        ({"learning_rate": -1.0}, "learning_rate must be a finite number > 0"),
        ({"ema_decay": 1.0}, r"ema_decay must be in \[0, 1\)"),
        ({"positive_threshold": 0.2, "negative_threshold": 0.3}, "must not exceed positive_threshold"),
        ({"positive_threshold": 1.5}, r"positive_threshold must be a number or one number per class in \[0, 1\]"),
        ({"parameters": "bias"}, "parameters must be one of"),
        ({"anchor_weight": float("nan")}, "anchor_weight must be a finite number"),
        ({"num_workers": -1}, "num_workers must be an integer >= 0"),
        ({"load_path": "OUT"}, "is the checkpoint it adapts"),
    ],
)
def test_bad_arguments_fail_in_one_line(frames, tmp_path, kwargs, message):
    kwargs = {k: (str(tmp_path / "a.pt") if v == "OUT" else v) for k, v in kwargs.items()}
    with pytest.raises(ValueError, match=message) as info:
        SelfTraining(_network(), frames, tmp_path / "a.pt", **kwargs)
    assert "\n" not in str(info.value)


def test_bad_networks_and_data(tmp_path):
    with pytest.raises(ValueError, match="no classifier_head submodule"):
        SelfTraining(torch.nn.Linear(2, 2), [], tmp_path / "a.pt")
    with pytest.raises(TypeError, match=r"torch\.nn\.Module"):
        SelfTraining("net", [], tmp_path / "a.pt")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="the dataset is empty"):
        SelfTraining(_network(), [], tmp_path / "a.pt")()
    assert not (tmp_path / "a.pt").exists()


def test_adapt_workflow_end_to_end(tmp_path_factory, mini_galar, tmp_path):
    from monai_vce.events.probabilities import load_video_probs
    from monai_vce.workflows import model_fingerprint

    run = trained_bundle(tmp_path_factory, mini_galar)
    shipped = (run["models"] / "model.pt").read_bytes()
    out = tmp_path / "eval"
    args = inference_args(run["models"], mini_galar, out, configs=(INFERENCE, DEMO, ADAPT))
    proc = run_in_process([args[0], "adapt", *args[1:], "--adapt_steps", "3", "--adapt_batch_size", "8"])
    adapted = out / "adapted_model.pt"
    assert adapted.is_file() and (run["models"] / "model.pt").read_bytes() == shipped
    assert "self-training: 3 steps" in proc.stdout + proc.stderr
    assert "Restored all variables from " + str(adapted) in proc.stdout + proc.stderr
    probs = sorted((out / "probs").glob("*.npz"))
    assert len(probs) == 4
    assert all(load_video_probs(p).source.startswith(model_fingerprint(adapted)) for p in probs)
    assert json.loads((out / "events.json").read_text())
