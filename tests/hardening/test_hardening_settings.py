"""Issue 25, item 6: every setting validated where it enters, named in a one-line message, before the first frame.

Bundle overrides of the wrong type or range (paths, numbers, booleans, ``image_size``), the reduced-inference
options, the frame listing's link loops, damaged frames read in DataLoader workers, and names holding control
characters in log lines.
"""

from __future__ import annotations

import logging
import math
import os
import re
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bundle_helpers, capped

from bundle_helpers import DEMO, INFERENCE, METADATA
from capped import TORCH_CAP_MB, python_capped

from monai_vce.utils import error_summary


def _workflow(tmp_path: Path, initialize: bool = True, **overrides):
    """The inference bundle (tiny demo network) in-process, as ``python -m monai.bundle run`` builds it."""
    from monai.bundle import ConfigWorkflow

    kwargs = {
        "dataset_dir": str(tmp_path / "frames"),
        "ckpt_dir": str(tmp_path / "models"),
        "output_dir": str(tmp_path / "out"),
        **overrides,
    }
    if not initialize:
        kwargs["initialize"] = []
    return ConfigWorkflow(
        config_file=[INFERENCE, DEMO], meta_file=METADATA, logging_file=False, workflow_type="infer", **kwargs
    )


def _one_line_error(call) -> str:
    with pytest.raises(Exception) as info:
        call()
    summary = error_summary(info.value)
    assert "\n" not in summary, summary
    return summary


# ------------------------------------------------------------------------------------------ bundle overrides
@pytest.mark.parametrize(
    ("override", "named"),
    [
        ({"output_dir": 3}, "'output_dir' must be a file or folder path"),
        ({"ckpt_dir": 5}, "'ckpt_dir' must be a file or folder path"),
        ({"model_file": 5}, "'model_file' must be a file or folder path"),
        ({"dataset_dir": 5}, "'dataset_dir' must be a file or folder path"),
        ({"decoder_params": 7}, "'decoder_params' must be a file or folder path"),
        ({"image_size": 100000}, r"image_size must be one or two sides in \[1, 8192\] pixels, got 100000"),
        ({"image_size": "224"}, "image_size must be one or two sides"),
        ({"batch_size": "8"}, "'batch_size' must be an integer"),
        ({"batch_size": 0}, r"'batch_size' must be in \[1, "),
        ({"num_workers": -1}, r"'num_workers' must be in \[0, "),
        ({"resume": "abc"}, "'resume' must be true or false"),
        ({"progress": 2}, "'progress' must be true or false"),
        ({"amp_dtype": "int8"}, "'amp_dtype' must be one of"),
        ({"bad_frames": "ignore"}, "'bad_frames' must be one of"),
        ({"reduction#stride": 1.9}, "'reduction#stride' must be an integer"),
        ({"reduction#refine": "abc"}, "'reduction#refine' must be true or false"),
    ],
)
def test_bundle_override_of_the_wrong_type_is_named(tmp_path, override, named):
    """A wrong override ends the run's ``initialize`` in one line naming the key (before: a ``TypeError`` from
    ``os.path.join`` without the key, a 10 GB network, or a silently accepted value); nothing is written."""
    wf = _workflow(tmp_path, **override)
    summary = _one_line_error(wf.initialize)
    assert summary.startswith("ValueError: ") and re.search(named, summary), summary
    assert not (tmp_path / "out").exists()


def test_valid_overrides_pass_and_cli_booleans_are_booleans(tmp_path):
    """The defaults pass the check; the strings ``true``/``false`` of a command line are booleans."""
    wf = _workflow(tmp_path, resume="false", **{"reduction#refine": "False", "reduction#stride": 4})
    wf.initialize()
    reduced = wf.parser.get_parsed_content("reduced_inference")
    assert reduced.settings["refine"] is False and reduced.resume is False and reduced.reduced


# ------------------------------------------------------------------------------- reduced-inference options
@pytest.mark.parametrize(
    ("override", "named"),
    [
        ({"reduction#stride": 1.9}, "'reduction#stride' must be an integer"),
        ({"reduction#stride": True}, "'reduction#stride' must be an integer"),
        ({"reduction#stride": 0}, r"'reduction#stride' must be in \[1, inf\]"),
        ({"reduction#duplicate_tolerance": -1}, r"'reduction#duplicate_tolerance' must be in \[0, inf\]"),
        ({"reduction#duplicate_tolerance": float("nan")}, "'reduction#duplicate_tolerance' must be a finite number"),
        ({"reduction#duplicate_tolerance": True}, "'reduction#duplicate_tolerance' must be a number"),
        ({"reduction#refine": "abc"}, "'reduction#refine' must be true or false"),
        ({"reduction#refine": 1}, "'reduction#refine' must be true or false"),
        ({"reduction#budget": True}, "'reduction#budget' must be an int"),
        ({"reduction#budget": 1.5}, r"'reduction#budget': a fractional budget must be in \(0, 1\]"),
        ({"reduction#margin": float("inf")}, "'reduction#margin' must be a finite number"),
        ({"reduction#options": {"max_round": 3}}, "'reduction#options' has an unknown key 'max_round'"),
        ({"reduction#options": {"max_rounds": 2.5}}, "'reduction#options#max_rounds' must be an integer"),
        ({"reduction#options": {"interpolation": "cubic"}}, "'reduction#options#interpolation' must be one of"),
    ],
)
def test_reduction_options_are_refused_not_run_as_full_inference(tmp_path, override, named):
    """Each bad reduction option is refused in one line naming it when the bundle builds its reduced inference
    (before: ``stride 1.9`` or ``True``, ``duplicate_tolerance -1`` or NaN silently ran full inference, ``"abc"``
    was taken as true), even with the ``initialize`` check left out."""
    wf = _workflow(tmp_path, initialize=False, **override)
    wf.initialize()
    summary = _one_line_error(lambda: wf.parser.get_parsed_content("reduced_inference"))
    assert re.search(named, summary), summary


def test_adaptive_inference_refuses_non_boolean_refine_and_infinite_tolerance():
    """The Python API refuses them too (before: ``refine="abc"`` refined, ``duplicate_tolerance=inf`` made every
    frame a duplicate of the first)."""
    from monai_vce.inference import adaptive_inference

    def predict(rows):
        return np.full((rows.size, 17), 0.5, np.float32)

    sig = np.zeros((10, 4), np.uint8)
    with pytest.raises(ValueError, match="refine must be True or False, got 'abc'"):
        adaptive_inference(predict, 10, stride=2, refine="abc")
    for bad in (math.inf, True):
        with pytest.raises(ValueError, match="duplicate_tolerance must be a finite number >= 0"):
            adaptive_inference(predict, 10, stride=2, signatures=sig, duplicate_tolerance=bad)
    probs, inferred = adaptive_inference(predict, 10, stride=2, refine=np.bool_(False))
    assert probs.shape == (10, 17) and inferred.sum() == 6


def test_check_setting_contract():
    from monai_vce.utils import check_setting

    assert check_setting("a", "TRUE", "bool") is True and check_setting("a", np.bool_(False), "bool") is False
    assert check_setting("a", Path("x"), "path") == "x" and check_setting("a", None, "path", optional=True) is None
    assert check_setting("a", np.int64(3), "int", minimum=1) == 3 and check_setting("a", 2, "number") == 2.0
    for value, kind in [("", "path"), (b"x", "path"), ("a\0b", "path"), (1.0, "int"), (True, "int"), ("1", "number")]:
        with pytest.raises(ValueError, match="setting 'a' must be"):
            check_setting("a", value, kind)


# ------------------------------------------------------------------------------------------ image_size
def test_image_size_is_refused_before_the_network_allocates():
    """``DiffAttnCLIPClassifier(image_size=100000)`` is refused in one line under a memory cap (before: the
    position embedding of 100000-pixel inputs was allocated, gigabytes, until ``MemoryError``)."""
    code = (
        "from monai_vce.networks import DiffAttnCLIPClassifier\n"
        "try:\n"
        "    DiffAttnCLIPClassifier(backbone='vce-tiny-vit-64', pretrained=False, image_size=100000)\n"
        "except ValueError as e:\n"
        "    print('REFUSED', e)\n"
    )
    res = python_capped(code, limit_mb=TORCH_CAP_MB, timeout=240)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "REFUSED image_size must be one or two sides in [1, 8192] pixels, got 100000" in res.stdout


# --------------------------------------------------------------------------------------- frame listing
def _png(path: Path, value: int = 0) -> Path:
    from PIL import Image

    Image.fromarray(np.full((16, 16, 3), value, np.uint8)).save(path)
    return path


def test_a_loop_of_links_among_frames_is_a_broken_link(tmp_path):
    """Frame files that are links in a loop (ELOOP) are counted and skipped like dangling links (before: a raw
    ``OSError: [Errno 40] Too many levels of symbolic links`` from the listing)."""
    from monai_vce.data.galar import list_frames

    video = tmp_path / "v1"
    video.mkdir()
    for i in range(3):
        _png(video / f"frame_{i:06d}.PNG")
    os.symlink("frame_000011.PNG", video / "frame_000010.PNG")
    os.symlink("frame_000010.PNG", video / "frame_000011.PNG")
    with pytest.warns(UserWarning, match=r"2 frame files are broken links \(skipped\)"):
        numbers, paths, _ = list_frames(video)
    assert numbers.tolist() == [0, 1, 2] and len(paths) == 3


def test_damaged_frame_in_a_dataloader_worker_is_named(tmp_path):
    """A damaged frame read in a DataLoader worker ends in one line naming the frame (before: the summary was
    torch's ``Caught RuntimeError in DataLoader worker process 0`` with the file lost in a traceback text)."""
    from monai.data import Dataset

    from monai_vce.data import VCEDataLoader, vce_val_transforms

    frame = _png(tmp_path / "frame_000001.PNG")
    data = bytearray(frame.read_bytes())
    data[40] ^= 0xFF
    frame.write_bytes(bytes(data))
    ds = Dataset([{"image": str(frame), "label": np.zeros(17, np.float32)}], vce_val_transforms(16))
    summary = _one_line_error(lambda: next(iter(VCEDataLoader(ds, batch_size=1, num_workers=1))))
    assert summary.startswith("ValueError: truncated or corrupted PNG frame") and str(frame) in summary, summary


def test_control_characters_in_names_cannot_forge_log_lines(tmp_path, caplog):
    """A video folder whose name holds a newline is logged and warned about on one line, the newline escaped
    (before: the name's second half started a forged log line)."""
    from monai_vce.workflows import inference_datalist

    frames = tmp_path / "frames"
    video = frames / "v1\nERROR forged line"
    video.mkdir(parents=True)
    _png(video / "frame_000000.PNG")
    os.symlink("missing.PNG", video / "frame_000001.PNG")
    with caplog.at_level(logging.WARNING), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        datalist = inference_datalist(str(frames))
    assert len(datalist) == 1
    messages = [r.getMessage() for r in caplog.records] + [str(w.message) for w in caught]
    assert any("v1\\nERROR forged line" in m for m in messages), messages
    assert not any("\nERROR forged" in m for m in messages), messages


@pytest.mark.parametrize("evaluate", [False, True], ids=["train", "evaluate"])
@pytest.mark.parametrize(
    ("override", "named"),
    [
        ({"ckpt_dir": 5}, "'ckpt_dir' must be a file or folder path"),
        ({"batch_size": 0}, r"'batch_size' must be in \[1, "),
        ({"image_size": 100000}, "image_size must be one or two sides"),
        ({"resume": "abc"}, "'resume' must be true or false"),
    ],
)
def test_training_and_evaluation_overrides_are_checked_first(tmp_path, evaluate, override, named):
    """The training and evaluation workflows check their settings in ``initialize`` too, before anything is built."""
    from bundle_helpers import EVALUATE, TRAIN
    from monai.bundle import ConfigWorkflow

    files = [TRAIN, EVALUATE, DEMO] if evaluate else [TRAIN, DEMO]
    kwargs = {"dataset_dir": str(tmp_path / "frames"), "output_dir": str(tmp_path / "out"), **override}
    kwargs.setdefault("ckpt_dir", str(tmp_path / "models"))
    wf = ConfigWorkflow(config_file=files, meta_file=METADATA, logging_file=False, workflow_type="train", **kwargs)
    summary = _one_line_error(wf.initialize)
    assert summary.startswith("ValueError: ") and re.search(named, summary), summary
    assert not (tmp_path / "out").exists() and not (tmp_path / "models").exists()
