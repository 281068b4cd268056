"""Reliability: interrupted runs, bad inputs and untrusted files behave well.

One test (or one parametrised test) per item of the product's failure behaviour:

* faults: training and inference killed with SIGKILL in a subprocess and resumed; checkpoint writes killed or
  failing half-way; non-finite losses and probabilities; two runs on one output folder;
* bad inputs: broken frames, odd frame formats, frame and label layout problems, bad event JSON, wrong-shape
  text embeddings, checkpoints of another class count, configs pointing to missing folders, each giving a
  one-line error naming the file / video / frame / field, or a documented and counted skip, and no traceback
  from the project's own command lines;
* untrusted files: pickles carrying code are refused by every checkpoint-loading path, and the metric and
  validator bound their memory on huge or hostile JSON.

The bundle tests run the real bundle configs (``train.json`` / ``inference.json`` + ``demo.json``) on a tiny
generated mini-Galar, with the tiny offline backbone.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from bundle_helpers import chain_text, run_in_process
from capped import TORCH_CAP_MB, memory_cap

from monai_vce.labels import LABELS, NUM_LABELS

REPO = Path(__file__).resolve().parents[2]
BUNDLE = REPO / "bundle"
CONFIGS = BUNDLE / "configs"
TRAIN_CFG = [str(CONFIGS / "train.json"), str(CONFIGS / "demo.json")]
INFER_CFG = [str(CONFIGS / "inference.json"), str(CONFIGS / "demo.json")]
META = str(CONFIGS / "metadata.json")

#: Environment of every subprocess: one thread each (reproducible numbers, no oversubscription of the cores).
SUB_ENV = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
#: Address space of every subprocess (and of its DataLoader workers): a regression that makes a run allocate without
#: bound fails that run instead of taking the machine down (see tests/capped.py).
BUNDLE_CAP_MB = TORCH_CAP_MB

#: Inference batch size; it divides every video's frame count, so batches never span two videos and an
#: interrupted-and-resumed run sees exactly the batches of an uninterrupted one.
INFER_BATCH = 10


# ------------------------------------------------------------------------------------------------ helpers
def _config_arg(files: list[str]) -> str:
    return "[" + ",".join(f"'{f}'" for f in files) + "]"


def _bundle_argv(step: str, configs: list[str], **overrides: object) -> list[str]:
    """``python -m monai.bundle run <step> --config_file [...] --key value ...``."""
    argv = [
        sys.executable,
        "-m",
        "monai.bundle",
        "run",
        step,
        "--config_file",
        _config_arg(configs),
        "--meta_file",
        META,
    ]
    for key, value in overrides.items():
        argv += [f"--{key}", str(value)]
    return argv


def _start(argv: list[str], log: Path) -> subprocess.Popen:
    f = open(log, "wb")  # noqa: SIM115 - closed by the child's end; the parent reads the file afterwards
    return subprocess.Popen(
        argv, cwd=REPO, env=SUB_ENV, stdout=f, stderr=subprocess.STDOUT, preexec_fn=memory_cap(BUNDLE_CAP_MB)
    )


def _wait_for(
    condition: Callable[[], bool], proc: subprocess.Popen, timeout: float, log: Path, poll: float = 0.02
) -> None:
    """Poll until ``condition()``; fail with the child's log when it exits first or the time runs out."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if condition():
            return
        if proc.poll() is not None:
            pytest.fail(f"the run ended (exit {proc.returncode}) before the awaited state:\n{log.read_text()[-4000:]}")
        time.sleep(poll)
    proc.kill()
    proc.wait()
    pytest.fail(f"timed out after {timeout} s waiting for the run:\n{log.read_text()[-4000:]}")


def _sigkill(proc: subprocess.Popen) -> None:
    os.kill(proc.pid, signal.SIGKILL)
    assert proc.wait(timeout=60) == -signal.SIGKILL


def _run(argv: list[str], timeout: float = 300, **kw: object) -> subprocess.CompletedProcess:
    return subprocess.run(
        argv,
        cwd=REPO,
        env=SUB_ENV,
        capture_output=True,
        text=True,
        timeout=timeout,
        preexec_fn=memory_cap(BUNDLE_CAP_MB),
        **kw,
    )


def _run_here(argv: list[str]) -> subprocess.CompletedProcess:
    """:func:`_run` of a ``python -m monai.bundle`` command line, in this process (no interpreter start): one thread
    and the address-space cap of a subprocess."""
    assert argv[:3] == [sys.executable, "-m", "monai.bundle"], argv[:3]
    return run_in_process([str(a) for a in argv[3:]], check=False, threads=1, memory_mb=BUNDLE_CAP_MB)


def _copy_tree(src: Path, dst: Path) -> Path:
    import shutil

    shutil.copytree(src, dst)
    return dst


def _png(path: Path, arr: np.ndarray) -> Path:
    from PIL import Image

    Image.fromarray(arr).save(path, format="PNG")
    return path


def _first_frame(data_dir: Path, video: str) -> Path:
    return sorted((data_dir / "frames" / video).iterdir())[0]


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``model.pt`` of the demo network (inference.json + demo.json) with seeded random weights."""
    from monai.bundle import ConfigParser

    from monai_vce.utils import atomic_write_bytes

    parser = ConfigParser()
    parser.read_config(INFER_CFG)
    parser["bundle_root"] = str(BUNDLE)
    torch.manual_seed(0)
    net = parser.get_parsed_content("network_def")
    # spread the head's biases so that probabilities sit away from the decoder thresholds
    head_bias = [p for n, p in net.named_parameters() if n.endswith("bias") and p.shape == (NUM_LABELS,)]
    with torch.no_grad():
        for p in head_bias:
            p.copy_(torch.linspace(-3, 3, NUM_LABELS))
    import io

    buf = io.BytesIO()
    torch.save(net.state_dict(), buf)
    ckpt_dir = tmp_path_factory.mktemp("tiny_model")
    return atomic_write_bytes(ckpt_dir / "model.pt", buf.getvalue())


def _infer_in_process(data_dir: Path, out_dir: Path, model_file: Path, **extra: object) -> Path:
    """Run the bundle's inference workflow in this process; returns the event JSON path."""
    from monai.bundle import ConfigWorkflow

    override = {
        "dataset_dir": str(data_dir),
        "output_dir": str(out_dir),
        "model_file": str(model_file),
        "progress": False,
        "batch_size": INFER_BATCH,
        **extra,
    }
    wf = ConfigWorkflow(
        config_file=INFER_CFG,
        meta_file=META,
        logging_file=False,
        workflow_type="infer",
        bundle_root=str(BUNDLE),
        **override,
    )
    wf.initialize()
    try:
        wf.run()
    finally:
        wf.finalize()
    return Path(wf.parser.get_parsed_content("events_file"))


# ============================================================================================== faults
# --- training killed -----------------------------------------------------------------------------------------
@pytest.mark.background
def test_training_sigkill_resumes_from_last_checkpoint(mini_galar: Path, tmp_path: Path) -> None:
    """SIGKILL after the first checkpoint; a ``--resume True`` rerun ends at the configured epoch count."""
    ckpt = tmp_path / "ckpt"
    epochs, samples, batch = 3, 64, 16
    epoch_length = samples // batch
    argv = _bundle_argv(
        "training",
        TRAIN_CFG,
        dataset_dir=mini_galar,
        ckpt_dir=ckpt,
        output_dir=tmp_path / "eval",
        max_epochs=epochs,
        samples_per_epoch=samples,
        batch_size=batch,
        val_batch_size=60,
    )
    last = ckpt / "checkpoint_last.pt"
    log1 = tmp_path / "run1.log"
    # once the first checkpoint exists, the training data pipeline holds: the run cannot reach the last epoch
    # before the kill, however slow the test process is
    release = tmp_path / "release"
    gate = _gate_config(
        tmp_path,
        release,
        when=f"__import__('os').path.exists({str(last)!r})",
        key="train#dataset#transform",
        preprocessing="@train#preprocessing",
        name="train_gate",
    )
    proc = _start([*argv[:6], _config_arg([*TRAIN_CFG, gate]), *argv[7:]], log1)
    try:
        _wait_for(last.is_file, proc, timeout=300, log=log1)
        _sigkill(proc)
    finally:
        release.touch()

    # the checkpoint present at the kill is complete and holds every piece of the training state
    state = torch.load(last, map_location="cpu", weights_only=True)
    assert set(state) >= {"model", "ema", "optimizer", "lr_scheduler", "sampler", "trainer"}
    # ignite stores the trainer's position as its iteration count
    assert int(state["trainer"]["epoch_length"]) == epoch_length
    killed_iteration = int(state["trainer"]["iteration"])
    killed_epoch = killed_iteration // epoch_length
    assert killed_iteration % epoch_length == 0 and 1 <= killed_epoch < epochs

    log2 = tmp_path / "run2.log"
    res = _run_here([*argv, "--resume", "True", "--log_iterations", "True"])  # the demo logs no iteration lines
    log2.write_text(res.stdout + res.stderr)
    assert res.returncode == 0, log2.read_text()[-4000:]
    text = log2.read_text()
    # it resumed: the first epochs are not run again
    # it resumed (MONAI's CheckpointLoader restores the state when the trainer starts): the finished epochs are not run
    # again, the first epoch run is the one after the checkpoint
    assert f"Restored all variables from {last}" in text, text[-3000:]
    ran = [int(e) for e in re.findall(rf"Epoch: (\d+)/{epochs}, Iter: 1/{epoch_length} ", text)]
    assert ran == list(range(killed_epoch + 1, epochs + 1)), ran

    final = torch.load(last, map_location="cpu", weights_only=True)
    assert int(final["trainer"]["iteration"]) == epochs * epoch_length  # the configured number of epochs
    assert int(final["trainer"]["max_epochs"]) == epochs
    # the scheduler and the sampler continued from the checkpoint (fresh ones would count from zero)
    assert int(final["lr_scheduler"]["last_epoch"]) == epochs * epoch_length
    assert int(final["sampler"]["epoch"]) == epochs + 1  # the epoch of its next draw, as after an uninterrupted run
    assert final["ema"].keys() == final["model"].keys()
    assert all(torch.isfinite(v).all() for v in final["model"].values() if v.is_floating_point())

    # the best model loads into the bundle's network and predicts
    from monai.bundle import ConfigParser

    parser = ConfigParser()
    parser.read_config(TRAIN_CFG)
    parser["bundle_root"] = str(BUNDLE)
    net = parser.get_parsed_content("network_def").eval()
    net.load_state_dict(torch.load(ckpt / "model.pt", map_location="cpu", weights_only=True))
    with torch.no_grad():
        out = net(torch.rand(2, 3, 64, 64))
    assert out.shape == (2, NUM_LABELS) and torch.isfinite(out).all()


_CKPT_LOOP = r"""
import os, sys, time, torch
from ignite.engine import Engine, Events
from monai_vce.handlers import AtomicCheckpointSaver

net = torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.Linear(512, 512), torch.nn.Linear(512, 512))

def step(engine, batch):
    with torch.no_grad():
        for p in net.parameters():
            p.fill_(float(engine.state.iteration))  # the checkpoint of iteration k holds k everywhere
    return 0

if sys.argv[2] == "stall":
    # stall inside the third fsync call: the second checkpoint's data is written, not yet renamed into place
    fsync, calls = os.fsync, [0]

    def stalling_fsync(fd):
        calls[0] += 1
        if calls[0] == 3:
            print("in-write", flush=True)
            time.sleep(120)
        fsync(fd)

    os.fsync = stalling_fsync

engine = Engine(step)
saver = AtomicCheckpointSaver(save_dir=sys.argv[1], save_dict={"model": net, "trainer": engine}, save_interval=1,
                              epoch_level=False, interval_filename="checkpoint_last.pt")
saver.attach(engine)
engine.add_event_handler(Events.ITERATION_COMPLETED(once=3), lambda e: print("saving", flush=True))
engine.run(range(10**7), max_epochs=1)
"""


@pytest.mark.background
def test_checkpoint_write_killed_never_leaves_a_corrupt_file(tmp_path: Path) -> None:
    """SIGKILL a tight loop of checkpoint saves at several moments: the file under the final name always loads."""
    ckpt = tmp_path / "ckpt"
    last = ckpt / "checkpoint_last.pt"
    rng = np.random.default_rng(0)

    def check() -> int:
        state = torch.load(last, map_location="cpu", weights_only=True)
        it = int(state["trainer"]["iteration"])
        values = torch.cat([v.reshape(-1) for v in state["model"].values()])
        # complete and consistent: every tensor holds the iteration recorded with it
        assert values.numel() == 3 * (512 * 512 + 512)
        assert torch.all(values == float(it)), f"checkpoint of iteration {it} holds other values"
        return it

    # killed for sure in the middle of a write (data written, not yet renamed): the previous checkpoint stays
    log = tmp_path / "stall.log"
    proc = _start([sys.executable, "-c", _CKPT_LOOP, str(ckpt), "stall"], log)
    _wait_for(lambda: "in-write" in log.read_text(), proc, timeout=120, log=log)
    _sigkill(proc)
    assert check() == 1
    leftovers = list(ckpt.glob(".checkpoint_last.pt.*.tmp"))
    assert len(leftovers) == 1  # the interrupted write: a hidden temporary file, never a file under the final name
    leftovers[0].unlink()

    # killed at random moments of a tight loop of saves
    for attempt in range(2):
        log = tmp_path / f"loop{attempt}.log"
        proc = _start([sys.executable, "-c", _CKPT_LOOP, str(ckpt), "run"], log)
        _wait_for(lambda log=log: "saving" in log.read_text(), proc, timeout=120, log=log)
        time.sleep(float(rng.uniform(0.05, 0.5)))
        _sigkill(proc)
        assert check() >= 3


def test_checkpoint_write_failing_midway_keeps_previous(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An error inside a checkpoint write (disk full, ...) keeps the previous file intact and no temporary file."""
    from ignite.engine import Engine

    from monai_vce.handlers import AtomicCheckpointSaver

    net = torch.nn.Linear(4, 4)
    engine = Engine(lambda e, b: 0)
    saver = AtomicCheckpointSaver(
        save_dir=str(tmp_path),
        save_dict={"model": net},
        save_interval=1,
        epoch_level=False,
        interval_filename="checkpoint_last.pt",
    )
    saver.attach(engine)
    with torch.no_grad():
        net.weight.fill_(1.0)
    engine.run([0], max_epochs=1)
    before = (tmp_path / "checkpoint_last.pt").read_bytes()

    def disk_full(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", disk_full)
    with torch.no_grad():
        net.weight.fill_(2.0)
    engine2 = Engine(lambda e, b: 0)
    saver2 = AtomicCheckpointSaver(
        save_dir=str(tmp_path),
        save_dict={"model": net},
        save_interval=1,
        epoch_level=False,
        interval_filename="checkpoint_last.pt",
    )
    saver2.attach(engine2)
    with pytest.raises(OSError, match=r"(?i)no space left"):
        engine2.run([0], max_epochs=1)
    monkeypatch.undo()
    assert (tmp_path / "checkpoint_last.pt").read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint_last.pt"]
    state = torch.load(tmp_path / "checkpoint_last.pt", weights_only=True)
    assert torch.all(state["weight"] == 1.0)


# --- inference killed ----------------------------------------------------------------------------------------
def _infer_argv(
    data_dir: Path, out_dir: Path, model: Path, extra_configs: list[str] = (), **overrides: object
) -> list[str]:
    return _bundle_argv(
        "inference",
        INFER_CFG + list(extra_configs),
        dataset_dir=data_dir,
        output_dir=out_dir,
        model_file=model,
        batch_size=INFER_BATCH,
        progress=False,
        **overrides,
    )


@pytest.fixture(scope="module")
def reference_inference(mini_galar: Path, tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Output folder of one uninterrupted inference run (the bundle's command line, in this process)."""
    out = tmp_path_factory.mktemp("reference_inference")
    res = _run_here(_infer_argv(mini_galar, out, tiny_model))
    assert res.returncode == 0, (res.stdout + res.stderr)[-4000:]
    assert (out / "events.json").is_file()
    return out


@pytest.mark.background
def test_inference_sigkill_resumes_at_first_incomplete_video(
    mini_galar: Path, tiny_model: Path, reference_inference: Path, tmp_path: Path
) -> None:
    """SIGKILL mid-video; the rerun skips finished videos and writes the same JSON as an uninterrupted run."""
    from monai_vce.events import load_video_probs

    out = tmp_path / "out"
    probs = out / "probs"
    log = tmp_path / "killed.log"
    # the run is held inside video 2 (from its third batch on), so the kill lands there whatever the machine's
    # speed: video 1 is complete (written when video 2 started), video 2 is not
    release = tmp_path / "release"
    gate = _gate_config(tmp_path, release, when="d['video_id'] == '2' and d['frame_index'] >= 100")
    proc = _start(_infer_argv(mini_galar, out, tiny_model, [gate]), log)
    try:
        _wait_for(lambda: (probs / "1.npz").is_file(), proc, timeout=300, log=log)
        _sigkill(proc)
    finally:
        release.touch()  # lets the orphaned loader workers finish and exit

    done = sorted(p.stem for p in probs.glob("*.npz"))
    assert done == ["1"], f"the kill should land inside video 2, found {done}"
    assert not (out / "events.json").exists()
    stamps = {}
    for vid in done:  # what exists is complete
        video = load_video_probs(probs / f"{vid}.npz")
        assert len(video) == 60 and np.isfinite(video.probs).all()
        stamps[vid] = (probs / f"{vid}.npz").stat().st_mtime_ns
    # a write cut short leaves at most a hidden temporary file, never a partial file under a final name
    assert not [p.name for p in probs.iterdir() if p.suffix != ".npz" and not p.name.startswith(".")]

    res = _run_here(_infer_argv(mini_galar, out, tiny_model))
    assert res.returncode == 0, (res.stdout + res.stderr)[-4000:]
    # finished videos were skipped, not recomputed
    for vid, stamp in stamps.items():
        assert (probs / f"{vid}.npz").stat().st_mtime_ns == stamp
    assert f"skipping {len(done)} video(s)" in res.stdout + res.stderr

    assert (out / "events.json").read_bytes() == (reference_inference / "events.json").read_bytes()
    for ref in sorted((reference_inference / "probs").glob("*.npz")):
        a, b = load_video_probs(ref), load_video_probs(probs / ref.name)
        np.testing.assert_array_equal(a.frame_index, b.frame_index)
        np.testing.assert_array_equal(a.probs, b.probs)


# --- non-finite values -----------------------------------------------------------------------------------
def test_nan_loss_stops_training_naming_iteration_and_keeps_last_good_checkpoint(tmp_path: Path) -> None:
    from ignite.engine import Events

    from monai_vce.engines.trainer import VCETrainer
    from monai_vce.handlers import AtomicCheckpointSaver

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 4 * 4, NUM_LABELS))
    bad_iteration = 3
    batches = []
    for i in range(5):
        img = torch.rand(2, 3, 4, 4)
        if i + 1 == bad_iteration:
            img[0, 0, 0, 0] = float("nan")  # a corrupt frame in the third batch
        batches.append({"image": img, "label": torch.randint(0, 2, (2, NUM_LABELS)).float()})
    trainer = VCETrainer(
        device="cpu",
        max_epochs=2,
        train_data_loader=batches,
        network=net,
        optimizer=torch.optim.SGD(net.parameters(), lr=0.1),
        loss_function=torch.nn.BCEWithLogitsLoss(),
        mixup_alpha=0.0,
    )
    good: dict[int, dict] = {}
    trainer.add_event_handler(
        Events.ITERATION_COMPLETED,
        lambda e: good.__setitem__(e.state.iteration, {k: v.clone() for k, v in net.state_dict().items()}),
    )
    AtomicCheckpointSaver(
        save_dir=str(tmp_path),
        save_dict={"model": net, "trainer": trainer},
        save_interval=1,
        epoch_level=False,
        interval_filename="checkpoint_last.pt",
    ).attach(trainer)
    with pytest.raises(FloatingPointError) as info:
        trainer.run()
    msg = str(info.value)
    assert "\n" not in msg and f"iteration {bad_iteration}" in msg and "epoch 1" in msg
    state = torch.load(tmp_path / "checkpoint_last.pt", weights_only=True)
    assert int(state["trainer"]["iteration"]) == bad_iteration - 1
    for k, v in state["model"].items():
        assert torch.isfinite(v).all()
        torch.testing.assert_close(v, good[bad_iteration - 1][k], rtol=0, atol=0)
    # the weights in memory are those of the last finite iteration too (no step on the NaN batch)
    for k, v in net.state_dict().items():
        torch.testing.assert_close(v, good[bad_iteration - 1][k], rtol=0, atol=0)


def test_nan_probabilities_never_reach_the_decoder_silently(tmp_path: Path) -> None:
    from ignite.engine import Engine

    from monai_vce.handlers import ProbabilityWriter
    from monai_vce.postprocessing import EventDecoder

    probs = np.full((10, NUM_LABELS), 0.2, np.float32)
    probs[4, 3] = np.nan
    with pytest.raises(ValueError, match=r"video 'v7'.*non-finite.*frame 4.*" + re.escape(repr(LABELS[3]))):
        EventDecoder()(probs, np.arange(10), video_id="v7")
    probs[4, 3] = np.inf
    with pytest.raises(ValueError, match="non-finite"):
        EventDecoder()(probs, np.arange(10))

    # through the probability writer: the video with a NaN is refused, no file of it is written
    batches = []
    for vid in ("a", "b"):
        p = torch.full((5, NUM_LABELS), 0.3)
        if vid == "b":
            p[2, 0] = float("nan")
        batches.append(
            {"video_id": [vid] * 5, "frame_index": torch.arange(5) + 100, "frame_number": torch.arange(5), "p": p}
        )
    engine = Engine(lambda e, batch: {"pred": batch["p"]})
    writer = ProbabilityWriter(output_dir=tmp_path)
    writer.attach(engine)
    with pytest.raises(ValueError, match=r"video b: non-finite probability .* frame_index 102"):
        engine.run(batches, max_epochs=1)
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith(".")) == ["a.npz"]


# --- two runs, one output folder ---------------------------------------------------------------------------
_HOLD_LOCK = r"""
import sys, time
from monai_vce.utils import OutputLock
with OutputLock(sys.argv[1]):
    print("locked", flush=True)
    time.sleep(120)
"""


def test_output_lock_refuses_a_second_run_and_recovers_from_a_killed_one(tmp_path: Path) -> None:
    from monai_vce.utils import OutputLock

    folder = tmp_path / "out"
    log = tmp_path / "holder.log"
    proc = _start([sys.executable, "-c", _HOLD_LOCK, str(folder)], log)
    try:
        _wait_for(lambda: "locked" in log.read_text(), proc, timeout=60, log=log)
        with pytest.raises(
            RuntimeError, match=rf"{re.escape(str(folder))} is in use by another run \(process {proc.pid}\)"
        ):
            OutputLock(folder).acquire()
    finally:
        _sigkill(proc)
    # the killed run left its lock file; a new run takes it over
    assert (folder / OutputLock.name).is_file()
    with OutputLock(folder) as lock:
        assert (folder / OutputLock.name).read_text() == str(os.getpid())
    assert not lock.path.exists()


def _gate_config(
    tmp_path: Path,
    release: Path,
    when: str = "True",
    key: str = "dataset#transform",
    preprocessing: str = "@preprocessing",
    name: str = "gate",
) -> str:
    """A config override that holds the data pipeline, at the frames where ``when`` (an expression of the item ``d``)
    is true, until the test creates ``release``.

    Tests that need a run to be busy, or to stop at a known point, hold it this way instead of racing its speed.
    """
    wait = (
        f"[__import__('time').sleep(0.05) for _ in iter(lambda: __import__('os').path.exists({str(release)!r}), True)]"
    )
    cfg = {
        f"{name}_preprocessing": {
            "_target_": "monai.transforms.Compose",
            "transforms": [
                preprocessing,
                {"_target_": "monai.transforms.Lambda", "func": f"$lambda d: (({wait}) if ({when}) else None, d)[1]"},
            ],
        },
        key: f"@{name}_preprocessing",
    }
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(cfg))
    return str(path)


@pytest.mark.background
def test_two_inference_runs_on_one_output_folder(
    mini_galar: Path, tiny_model: Path, reference_inference: Path, tmp_path: Path
) -> None:
    """While an inference run writes into a folder, a second run on that folder is refused with a clear message."""
    out = tmp_path / "shared_out"
    log = tmp_path / "first.log"
    release = tmp_path / "release"
    first = _start(_infer_argv(mini_galar, out, tiny_model, [_gate_config(tmp_path, release)]), log)
    lock = out / ".monai_vce.lock"
    try:
        # the first run holds the lock and waits at the gate until the second run has been answered
        _wait_for(lambda: lock.is_file() and lock.read_text() == str(first.pid), first, timeout=300, log=log)
        second = _run_here(_infer_argv(mini_galar, out, tiny_model, resume=False))
    finally:
        release.touch()
        rc_first = first.wait(timeout=300)
    assert rc_first == 0, log.read_text()[-4000:]
    assert second.returncode != 0, "the second run on a busy output folder was not refused"
    assert re.search(r"in use by another run|is locked|another run", second.stdout + second.stderr)
    assert (out / "events.json").read_bytes() == (reference_inference / "events.json").read_bytes()


def test_lock_take_over_is_atomic(tmp_path: Path) -> None:
    """With a stale lock file present, of several runs started together exactly one takes the lock."""
    folder = tmp_path / "out"
    folder.mkdir()
    go, end = tmp_path / "go", tmp_path / "end"
    script = (
        "import os, sys, time\n"
        "from monai_vce.utils import OutputLock\n"
        "print('ready', flush=True)\n"
        "while not os.path.exists(sys.argv[2]): time.sleep(0.001)\n"
        "try:\n"
        "    OutputLock(sys.argv[1]).acquire()\n"
        "    print('took', flush=True)\n"
        "    while not os.path.exists(sys.argv[3]): time.sleep(0.01)\n"
        "except RuntimeError:\n"
        "    print('refused', flush=True)\n"
    )
    argv = [sys.executable, "-c", script, str(folder), str(go), str(end)]
    for trial in range(5):
        (folder / ".monai_vce.lock").write_text("999999999")  # a stale lock file, as a killed run leaves it
        procs = [
            subprocess.Popen(
                argv, cwd=REPO, env=SUB_ENV, stdout=subprocess.PIPE, text=True, preexec_fn=memory_cap(TORCH_CAP_MB)
            )
            for _ in range(4)
        ]
        try:
            assert [p.stdout.readline().strip() for p in procs] == ["ready"] * 4
            go.touch()  # all four try at once
            answers = sorted(p.stdout.readline().strip() for p in procs)
        finally:
            end.touch()
            for p in procs:
                p.communicate(timeout=60)
        go.unlink()
        end.unlink()
        assert answers == ["refused", "refused", "refused", "took"], (trial, answers)
        assert not (folder / ".monai_vce.lock").exists()  # removed at exit by the one that took it


def test_training_refuses_a_checkpoint_folder_in_use(mini_galar: Path, tmp_path: Path) -> None:
    """A training run on a checkpoint folder another run holds is refused before it writes anything."""
    from monai_vce.utils import OutputLock

    ckpt = tmp_path / "ckpt"
    log = tmp_path / "holder.log"
    holder = _start([sys.executable, "-c", _HOLD_LOCK, str(ckpt)], log)
    try:
        _wait_for(lambda: "locked" in log.read_text(), holder, timeout=60, log=log)
        res = _run_here(_bundle_argv("training", TRAIN_CFG, dataset_dir=mini_galar, ckpt_dir=ckpt, max_epochs=1))
    finally:
        _sigkill(holder)
    assert res.returncode != 0
    assert f"output folder {ckpt} is in use by another run (process {holder.pid})" in res.stdout + res.stderr
    assert sorted(p.name for p in ckpt.iterdir()) == [OutputLock.name]  # nothing written


# ============================================================================================ bad inputs
@pytest.fixture
def frames_copy(mini_galar: Path, tmp_path: Path) -> Path:
    """A writable copy of the generated mini-Galar."""
    return _copy_tree(mini_galar, tmp_path / "data")


def _break_frame(path: Path, kind: str) -> None:
    data = path.read_bytes()
    if kind == "zero-byte":
        path.write_bytes(b"")
    elif kind == "truncated":
        path.write_bytes(data[: len(data) // 2])
    else:  # pragma: no cover
        raise ValueError(kind)


@pytest.mark.parametrize("kind", ["zero-byte", "truncated"])
def test_broken_frame_fails_naming_file_without_corrupting_outputs(
    frames_copy: Path, tiny_model: Path, tmp_path: Path, kind: str
) -> None:
    from monai_vce.data import build_inference_datalist, load_vce_frame
    from monai_vce.events import load_video_probs

    # in the third batch of video 2, so that video 1 is complete (handed over when video 2 starts) before it
    bad = sorted((frames_copy / "frames" / "2").iterdir())[25]
    _break_frame(bad, kind)
    # the loader: a one-line ValueError naming the file
    with pytest.raises(ValueError) as info:
        load_vce_frame(bad, 64)
    assert str(bad) in str(info.value) and "\n" not in str(info.value)
    # an up-front check of the folder finds it too
    with pytest.raises(ValueError, match=re.escape(str(bad))):
        build_inference_datalist(frames_copy / "frames", check_images="decode")
    # the bundle: the run stops naming the file; the finished video is complete, the broken one has no file
    out = tmp_path / "out"
    with pytest.raises(Exception) as info:
        _infer_in_process(frames_copy, out, tiny_model)
    assert str(bad) in chain_text(info.value)
    assert sorted(p.name for p in (out / "probs").glob("*.npz")) == ["1.npz"]
    assert len(load_video_probs(out / "probs" / "1.npz")) == 60
    assert not (out / "events.json").exists()


def test_unusual_frame_formats_convert_and_say_so_once(frames_copy: Path, tiny_model: Path, tmp_path: Path) -> None:
    """JPEG renamed .png, grayscale, RGBA, 16-bit and odd-sized frames: converted, one warning per kind, all inferred."""
    from PIL import Image

    from monai_vce.data import load_vce_frame
    from monai_vce.data.frames import reset_frame_warnings
    from monai_vce.events import load_video_probs

    frames = sorted((frames_copy / "frames" / "3").iterdir())
    rgb = np.asarray(Image.open(frames[0]).convert("RGB"))
    Image.fromarray(rgb).save(frames[1], format="JPEG")  # JPEG content under the .PNG name
    Image.fromarray(rgb).save(frames[2], format="JPEG")
    _png(frames[3], rgb[..., 0])  # grayscale
    _png(frames[4], rgb[..., 0])
    _png(frames[5], np.dstack([rgb, np.full(rgb.shape[:2], 200, np.uint8)]))  # RGBA
    _png(frames[6], rgb[..., 1].astype(np.uint16) * 257)  # 16-bit
    _png(frames[7], np.zeros((48, 20, 3), np.uint8))  # another size within the video

    # the loader refuses JPEG content when asked to
    with pytest.raises(ValueError, match=re.escape(str(frames[1])) + ".*JPEG"):
        load_vce_frame(frames[1], 64, allow_jpeg=False)

    reset_frame_warnings()
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        events = _infer_in_process(frames_copy, tmp_path / "out", tiny_model)
    msgs = [str(w.message) for w in rec if "converting" in str(w.message) or "JPEG" in str(w.message)]
    kinds = {"JPEG": 0, "grayscale PNG": 0, "rgba PNG": 0, "16-bit PNG": 0}
    for m in msgs:
        for k in kinds:
            kinds[k] += k in m
    # one warning per kind, however many frames of that kind (the 16-bit frame is grayscale too: no second warning)
    assert kinds == {"JPEG": 1, "grayscale PNG": 1, "rgba PNG": 1, "16-bit PNG": 1}, msgs
    assert str(frames[1]) in next(m for m in msgs if "JPEG" in m)
    video = load_video_probs(tmp_path / "out" / "probs" / "3.npz")
    assert len(video) == 60 and np.isfinite(video.probs).all()
    assert json.loads(events.read_text())["videos"][2]["video_id"] == "3"


def test_missing_frame_number_is_kept_as_a_gap_and_counted(frames_copy: Path) -> None:
    """A missing frame file: inference keeps real frame numbers (the gap stays), training counts the label row."""
    from monai_vce.data import build_galar_datalist, build_inference_datalist
    from monai_vce.postprocessing import EventDecoder

    missing = sorted((frames_copy / "frames" / "1").iterdir())[10]
    number = int(re.search(r"(\d+)", missing.name).group(1))
    missing.unlink()
    items = build_inference_datalist(frames_copy / "frames", videos=["1"])
    numbers = [d["frame_number"] for d in items]
    assert len(items) == 59 and number not in numbers and numbers == sorted(numbers)
    # events are written in the frames' own ids: the decoder never renumbers frames across the gap
    probs = np.zeros((59, NUM_LABELS), np.float32)
    probs[:, 0] = 0.99
    ids = np.asarray(numbers)
    events = EventDecoder()(probs, ids)
    assert events and events[0]["start"] == ids[0] and events[0]["end"] == ids[-1]

    with pytest.warns(UserWarning, match=r"video 1: 1 label rows without a frame image \(dropped\)"):
        data, report = build_galar_datalist(frames_copy / "frames", frames_copy / "labels", return_report=True)
    assert report.videos["1"].rows_without_frame["count"] == 1
    assert sum(d["video_id"] == "1" for d in data) == 59
    with pytest.raises(ValueError, match="strict"):
        build_galar_datalist(frames_copy / "frames", frames_copy / "labels", strict=True)


def test_video_folder_without_frames_names_the_folder(frames_copy: Path) -> None:
    from monai_vce.data import build_galar_datalist, build_inference_datalist

    empty = frames_copy / "frames" / "3"
    for p in empty.iterdir():
        p.unlink()
    (empty / "notes.txt").write_text("not a frame")
    for build in (
        lambda: build_inference_datalist(frames_copy / "frames"),
        lambda: build_galar_datalist(frames_copy / "frames", frames_copy / "labels"),
    ):
        with pytest.raises(ValueError) as info:
            build()
        assert str(empty) in str(info.value) and "no frame image" in str(info.value)
        assert "\n" not in str(info.value)


@pytest.mark.parametrize("column", ["index", "frame"])
def test_label_csv_without_index_or_frame(frames_copy: Path, column: str) -> None:
    import csv

    from monai_vce.data import build_galar_datalist

    path = frames_copy / "labels" / "2.csv"
    rows = list(csv.reader(path.read_text().splitlines()))
    drop = rows[0].index(column)
    path.write_text("\n".join(",".join(c for i, c in enumerate(r) if i != drop) for r in rows) + "\n")
    with pytest.raises(ValueError) as info:
        build_galar_datalist(frames_copy / "frames", frames_copy / "labels")
    msg = str(info.value)
    assert str(path) in msg and f"missing column {column!r}" in msg and "\n" not in msg


@pytest.mark.parametrize("value", ["2", "0.5", "yes", ""])
def test_label_value_other_than_0_or_1(frames_copy: Path, value: str) -> None:
    import csv

    from monai_vce.data import build_galar_datalist

    path = frames_copy / "labels" / "1.csv"
    rows = list(csv.reader(path.read_text().splitlines()))
    col = [c.strip().lower() for c in rows[0]].index("ulcer")
    rows[6][col] = value
    path.write_text("\n".join(",".join(r) for r in rows) + "\n")
    with pytest.raises(ValueError) as info:
        build_galar_datalist(frames_copy / "frames", frames_copy / "labels")
    msg = str(info.value)
    assert str(path) in msg and "data row 6" in msg and "'ulcer'" in msg and f"{value!r} is not 0 or 1" in msg


def test_label_csv_without_video_and_video_without_label_csv(frames_copy: Path) -> None:
    """Discovered videos: each side's orphans are skipped, counted and named; named videos: a clear error."""
    from monai_vce.data import build_galar_datalist

    (frames_copy / "labels" / "3.csv").unlink()  # video 3: frames, no labels
    (frames_copy / "labels" / "99.csv").write_text((frames_copy / "labels" / "1.csv").read_text())  # labels, no frames
    with pytest.warns(UserWarning) as rec:
        data, report = build_galar_datalist(frames_copy / "frames", frames_copy / "labels", return_report=True)
    text = "\n".join(str(w.message) for w in rec)
    assert report.videos_without_labels == ["3"] and report.labels_without_frames == ["99"]
    assert "1 video folders without a label CSV (skipped): ['3']" in text
    assert "1 label CSVs without a video folder (skipped): ['99']" in text
    assert {d["video_id"] for d in data} == {"1", "2", "ukdd_navi_00004"}
    with pytest.raises(FileNotFoundError, match=r"no label file for video\(s\) 3 in .*labels"):
        build_galar_datalist(frames_copy / "frames", frames_copy / "labels", videos=["1", "3"])
    with pytest.raises(FileNotFoundError, match=r"no frame folder for video\(s\) 99 under .*frames"):
        build_galar_datalist(frames_copy / "frames", frames_copy / "labels", videos=["99"])


_GOOD_EVENTS = {
    "videos": [
        {"video_id": "1", "events": [{"start": 0, "end": 9, "label": ["mouth"]}]},
        {"video_id": "2", "events": [{"start": 3, "end": 5, "label": ["ulcer", "colon"]}]},
    ]
}


def _bad_events(kind: str) -> tuple[dict, str]:
    """A copy of ``_GOOD_EVENTS`` with one defect, and the text the error must contain."""
    obj = json.loads(json.dumps(_GOOD_EVENTS))
    ev = obj["videos"][1]["events"][0]
    where = "video '2' (videos[1]) event 0"
    if kind == "string label":
        ev["label"] = "ulcer"
        return obj, f"{where}: 'label' must be a list of label names, got str 'ulcer'"
    if kind == "unknown label":
        ev["label"] = ["ulcer", "tumour"]
        return obj, f"{where}: unknown label 'tumour'"
    if kind == "start > end":
        ev["start"], ev["end"] = 8, 5
        return obj, f"{where}: start 8 > end 5"
    if kind == "negative frame":
        ev["start"] = -1
        return obj, f"{where}: 'start' must be non-negative, got -1"
    if kind == "non-integer frame":
        ev["end"] = 5.5
        return obj, f"{where}: 'end' must be an integer frame, got float 5.5"
    if kind == "string frame":
        ev["end"] = "5"
        return obj, f"{where}: 'end' must be an integer frame, got str '5'"
    if kind == "duplicate video id":
        obj["videos"][1]["video_id"] = "1"
        return obj, "video '1' (videos[1]): duplicate video id (first listed at videos[0])"
    raise ValueError(kind)  # pragma: no cover


_BAD_EVENT_KINDS = [
    "string label",
    "unknown label",
    "start > end",
    "negative frame",
    "non-integer frame",
    "string frame",
    "duplicate video id",
]


@pytest.mark.parametrize("kind", _BAD_EVENT_KINDS)
def test_bad_event_json_is_named_in_one_line(tmp_path: Path, kind: str) -> None:
    from monai_vce.metrics import check_events, load_events, save_events, temporal_map, validate_events

    obj, expected = _bad_events(kind)
    problems = validate_events(obj)
    assert problems == [expected]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(obj))
    good = tmp_path / "good.json"
    good.write_text(json.dumps(_GOOD_EVENTS))
    with pytest.raises(ValueError, match=re.escape(expected)) as info:
        load_events(bad)
    assert str(bad) in str(info.value)
    for gt, pred in ((good, bad), (bad, good)):  # as a prediction and as a ground truth
        with pytest.raises(ValueError, match=re.escape(expected)):
            temporal_map(gt, pred)
    with pytest.raises(ValueError):
        check_events(obj)
    # an invalid object is never written
    target = tmp_path / "out.json"
    with pytest.raises(ValueError):
        save_events(target, obj)
    assert not target.exists()

    # the command line: exit 2, the file and the problem on stderr, no traceback
    for gt, pred in ((good, bad), (bad, good)):
        res = _run([sys.executable, "-m", "monai_vce.metrics", "--gt", str(gt), "--events", str(pred)], timeout=120)
        assert res.returncode == 2 and res.stdout == ""
        assert "Traceback" not in res.stderr and f"{bad}: {expected}" in res.stderr


def test_report_command_line_bad_input_has_no_traceback(tmp_path: Path) -> None:
    obj, expected = _bad_events("unknown label")
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(obj))
    for argv in (["--events", str(bad)], ["--events", str(tmp_path / "missing.json")]):
        res = _run([sys.executable, "-m", "monai_vce.report", *argv, "--out", str(tmp_path / "report")], timeout=120)
        assert res.returncode == 2 and "Traceback" not in res.stderr
        assert "error: " in res.stderr and argv[1] in res.stderr
    assert (
        expected
        in _run(
            [sys.executable, "-m", "monai_vce.report", "--events", str(bad), "--out", str(tmp_path / "r")], timeout=120
        ).stderr
    )


def test_synthetic_command_line_bad_input_has_no_traceback(tmp_path: Path) -> None:
    afile = tmp_path / "afile"
    afile.write_text("x")
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000)
    cases = [
        (["--out", str(afile), "--num-videos", "1", "--frames-per-video", "4"], str(afile)),
        (["--out", str(tmp_path / "o1"), "--num-videos", "0"], "must be positive"),
        (
            ["--out", str(tmp_path / "o2"), "--num-videos", "1", "--galar-events", str(tmp_path / "none.json")],
            "none.json",
        ),
        (["--out", str(tmp_path / "o3"), "--num-videos", "1", "--galar-events", str(deep)], "deep.json"),
    ]
    for argv, expected in cases:
        res = _run([sys.executable, "-m", "monai_vce.data.synthetic", *argv], timeout=120)
        assert res.returncode == 2, res.stderr
        assert "Traceback" not in res.stderr and expected in res.stderr, res.stderr


def test_text_embeddings_of_wrong_shape(tmp_path: Path) -> None:
    from monai_vce.networks import TINY_MODEL_NAME, DiffAttnCLIPClassifier
    from monai_vce.networks.text_embeddings import load_text_embeddings

    net = DiffAttnCLIPClassifier(backbone=TINY_MODEL_NAME, pretrained=False, image_size=64)
    dim = net.embed_dim
    cases = {
        "rows.pt": (
            {"labels": list(LABELS[:5]), "embeddings": torch.randn(5, dim)},
            f"expected shape (17, {dim}), got (5, {dim})",
        ),
        "width.pt": (torch.randn(NUM_LABELS, dim + 3), f"expected shape (17, {dim}), got (17, {dim + 3})"),
        "ndim.pt": (torch.randn(NUM_LABELS), "expected a 2-D float tensor"),
    }
    for name, (obj, expected) in cases.items():
        path = tmp_path / name
        torch.save(obj, path)
        with pytest.raises(ValueError) as info:
            DiffAttnCLIPClassifier(backbone=TINY_MODEL_NAME, pretrained=False, image_size=64, text_embeddings=str(path))
        assert str(path) in str(info.value) and expected in str(info.value), str(info.value)
        assert "\n" not in str(info.value)
    with pytest.raises(ValueError, match=re.escape(str(tmp_path / "width.pt"))):
        load_text_embeddings(tmp_path / "width.pt", embed_dim=dim)


def test_checkpoint_of_another_number_of_classes_names_the_file(mini_galar: Path, tmp_path: Path) -> None:
    from monai_vce.networks import TINY_MODEL_NAME, DiffAttnCLIPClassifier

    other = DiffAttnCLIPClassifier(backbone=TINY_MODEL_NAME, pretrained=False, image_size=64, num_classes=5)
    ckpt = tmp_path / "five_classes.pt"
    torch.save(other.state_dict(), ckpt)
    with pytest.raises(Exception) as info:
        _infer_in_process(mini_galar, tmp_path / "out", ckpt)
    text = chain_text(info.value)
    assert str(ckpt) in text, f"the error does not name the checkpoint file:\n{text[-2000:]}"
    assert re.search(r"\b5\b", text) and re.search(r"\b17\b", text)
    assert not (tmp_path / "out" / "events.json").exists()


def test_config_pointing_to_a_missing_folder(tmp_path: Path, tiny_model: Path) -> None:
    """MONAI prints its own traceback for errors raised in config expressions; the message names the folder."""
    missing = tmp_path / "no_such_galar"
    res = _run_here(_bundle_argv("training", TRAIN_CFG, dataset_dir=missing, ckpt_dir=tmp_path / "ckpt"))
    assert res.returncode != 0
    err = res.stdout + res.stderr
    assert f"dataset folder {missing} not found" in err, err[-3000:]
    assert "--dataset_dir" in err
    # inference, in process
    with pytest.raises(Exception) as info:
        _infer_in_process(missing, tmp_path / "out", tiny_model)
    assert f"input folder {missing} not found" in chain_text(info.value)
    assert not (tmp_path / "out" / "events.json").exists()


# ======================================================================================== untrusted files
class _Payload:
    """Unpickling this object runs ``os.mkdir(marker)``: a stand-in for arbitrary code in a checkpoint."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (os.mkdir, (self.marker,))


def _evil_checkpoint(path: Path, marker: Path, content: dict) -> Path:
    torch.save({**content, "payload": _Payload(marker)}, path)
    return path


def test_pickle_with_code_is_refused_by_every_checkpoint_loading_path(mini_galar: Path, tmp_path: Path) -> None:
    from ignite.engine import Engine
    from monai.handlers import CheckpointLoader

    from monai_vce.networks import TINY_MODEL_NAME, DiffAttnCLIPClassifier
    from monai_vce.networks.text_embeddings import load_text_embeddings

    # the payload works: an unsafe load would run it
    probe = tmp_path / "probe_marker"
    torch.load(_evil_checkpoint(tmp_path / "probe.pt", probe, {}), weights_only=False)
    assert probe.is_dir()

    marker = tmp_path / "marker"
    net = DiffAttnCLIPClassifier(backbone=TINY_MODEL_NAME, pretrained=False, image_size=64)
    evil = _evil_checkpoint(tmp_path / "evil.pt", marker, {"embeddings": torch.randn(NUM_LABELS, net.embed_dim)})
    evil_state = _evil_checkpoint(tmp_path / "evil_state.pt", marker, dict(net.state_dict()))

    # text embeddings
    with pytest.raises(ValueError, match=re.escape(str(evil))):
        load_text_embeddings(evil)
    # the network's backbone weights
    with pytest.raises(ValueError, match=re.escape(str(evil_state))):
        DiffAttnCLIPClassifier(backbone=TINY_MODEL_NAME, pretrained=str(evil_state), image_size=64)
    # MONAI's CheckpointLoader (the bundle's model and resume loading)
    engine = Engine(lambda e, b: 0)
    CheckpointLoader(load_path=str(evil_state), load_dict={"model": net}).attach(engine)
    with pytest.raises(Exception, match=r"[Ww]eights only load failed|Unsupported global"):
        engine.run([0], max_epochs=1)
    # the bundle's inference end to end
    with pytest.raises(RuntimeError) as err:  # MONAI's config expression error, raised from the refusal
        _infer_in_process(mini_galar, tmp_path / "out", evil_state)
    chain, e = [], err.value
    while e is not None:
        chain.append(str(e))
        e = e.__cause__ or e.__context__
    assert any("eights only load failed" in m or "Unsupported global" in m for m in chain), chain
    assert not marker.exists()


def test_every_torch_load_in_the_package_is_weights_only() -> None:
    """Guard for new code: each ``torch.load(`` call of the package passes ``weights_only=True``."""
    calls = []
    for path in sorted((REPO / "monai_vce").rglob("*.py")):
        text = path.read_text()
        for m in re.finditer(r"torch\.load\(", text):
            # the call's arguments, up to the matching parenthesis
            depth, i = 1, m.end()
            while depth and i < len(text):
                depth += {"(": 1, ")": -1}.get(text[i], 0)
                i += 1
            calls.append((path.relative_to(REPO), text[m.end() : i - 1]))
    assert calls, "no torch.load call found: the scan is broken"
    unsafe = [f"{p}: torch.load({args})" for p, args in calls if "weights_only=True" not in args]
    assert not unsafe, "torch.load without weights_only=True:\n" + "\n".join(unsafe)


def test_probability_file_with_pickled_objects_is_refused(tmp_path: Path) -> None:
    from monai_vce.events import load_video_probs, npz_frame_count
    from monai_vce.workflows import completed_videos

    marker = tmp_path / "marker"
    path = tmp_path / "v1.npz"
    np.savez(
        path, probs=np.array([_Payload(marker)], dtype=object), frame_index=np.array([_Payload(marker)], dtype=object)
    )
    with pytest.raises(ValueError, match=re.escape(str(path))):
        load_video_probs(path)
    assert npz_frame_count(path) is None
    # resume treats it as incomplete: the video is inferred again and the file replaced
    assert completed_videos([{"video_id": "v1", "image": "x", "frame_index": 0}], tmp_path) == []
    assert not marker.exists()


def test_hostile_event_json_is_refused_with_bounded_memory(tmp_path: Path) -> None:
    import resource

    from monai_vce.metrics import DEFAULT_MAX_BYTES, load_events, temporal_map, validate_events

    # a 1 GiB file (sparse: no disk used) is refused from its size, before anything is read
    huge = tmp_path / "huge.json"
    with open(huge, "wb") as f:
        f.truncate(1024**3)
    assert huge.stat().st_size > DEFAULT_MAX_BYTES
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.process_time()  # CPU time: the machine's load does not count
    with pytest.raises(ValueError, match=r"1024\.0 MiB, more than the limit of 512\.0 MiB"):
        load_events(huge)
    with pytest.raises(ValueError, match="more than the limit"):
        temporal_map(huge, huge)
    assert time.process_time() - t0 < 5
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before < 200 * 1024  # KiB: nothing was loaded

    # too many events (cap lowered so that the test stays small)
    many = {"videos": [{"video_id": "1", "events": [{"start": i, "end": i, "label": ["mouth"]} for i in range(5001)]}]}
    many_path = tmp_path / "many.json"
    many_path.write_text(json.dumps(many))
    with pytest.raises(ValueError, match="5001 events, more than the limit of 5000"):
        load_events(many_path, max_events=5000)
    assert validate_events(many, max_events=5000)[-1] == "5001 events in all, more than the limit of 5000"

    # a hostile file with a problem in every event: the problem list stays bounded
    bad = {"videos": [{"video_id": "1", "events": [{"start": -1, "end": -1, "label": "x"}] * 20000}]}
    problems = validate_events(bad, max_problems=100)
    assert len(problems) == 101 and problems[-1].startswith("... and ")

    # deeply nested JSON: a clear error instead of a RecursionError traceback
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 200_000 + "]" * 200_000)
    with pytest.raises(ValueError, match=re.escape(f"event file {deep} is nested too deeply")):
        load_events(deep)

    # the command line
    gt = tmp_path / "gt.json"
    gt.write_text(json.dumps(_GOOD_EVENTS))
    cases = [
        ([str(huge)], "more than the limit"),
        ([str(deep)], "nested too deeply"),
        ([str(many_path), "--max-events", "5000"], "more than the limit of 5000"),
    ]
    for (pred, *extra), expected in cases:
        res = _run([sys.executable, "-m", "monai_vce.metrics", "--gt", str(gt), "--events", pred, *extra], timeout=120)
        assert res.returncode == 2 and "Traceback" not in res.stderr and expected in res.stderr, res.stderr[-2000:]
