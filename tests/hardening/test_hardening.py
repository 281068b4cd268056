"""Bad inputs found by trying what a hostile or careless user would: each gives a one-line error or a documented,
reported policy, never a crash, a traceback, a file outside the output folder or a lost result.

One test per defect (the rows of ``docs/design/failures.md``): corrupted frames, video ids that look
like paths, videos listed in two places, the generator's lock, decompression bombs, stale resumed results, ids with
blanks and accents, weights of the wrong type, label CSVs with bad ``index`` values, event files that are devices or
pipes, huge numbers, silently accepted duplicates, errors that named nothing, and smaller ones. Code that could take
the machine down if its refusal regressed runs in a child process under a memory cap (``tests/capped.py``).
"""

from __future__ import annotations

import io
import json
import os
import re
import struct
import subprocess
import sys
import warnings
import zlib
from pathlib import Path
from urllib.parse import unquote

import numpy as np
import pytest
import torch
from bundle_helpers import chain_text
from capped import LIGHT_CAP_MB, TORCH_CAP_MB, python_capped, run_capped

from monai_vce.labels import LABELS, NUM_LABELS

REPO = Path(__file__).resolve().parents[2]
CONFIGS = REPO / "bundle" / "configs"
INFER_CFG = [str(CONFIGS / "inference.json"), str(CONFIGS / "demo.json")]
META = str(CONFIGS / "metadata.json")


# ------------------------------------------------------------------------------------------------ helpers
def _png_bytes(arr: np.ndarray) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format="PNG")
    return buf.getvalue()


def _frame(seed: int = 0, size: int = 32) -> bytes:
    return _png_bytes(np.random.default_rng(seed).integers(0, 256, (size, size, 3), dtype=np.uint8))


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def _damaged(data: bytes, kind: str) -> bytes:
    """A PNG with one flipped bit in its image data (``"flip"``) or only its IDAT checksum wrong (``"crc"``)."""
    out = bytearray(data)
    at = data.index(b"IDAT")
    length = struct.unpack(">I", data[at - 4 : at])[0]
    if kind == "flip":
        out[at + 4 + length // 2] ^= 0x10
    else:
        out[at + 4 + length] ^= 0xFF
    return bytes(out)


def _bomb_png(width: int, height: int) -> bytes:
    """A small PNG declaring ``width x height`` RGB pixels (valid chunks and checksums, little image data)."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    rows = zlib.compress(b"\0" * 200_000, 9)
    return b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", ihdr) + _chunk(b"IDAT", rows) + _chunk(b"IEND", b"")


def _bomb_jpeg(width: int, height: int) -> bytes:
    sof = b"\xff\xc0" + struct.pack(">HBHHB", 17, 8, height, width, 3) + b"\x01\x22\x00\x02\x11\x01\x03\x11\x01"
    return b"\xff\xd8" + sof + b"\xff\xd9"


def _one_line(err: pytest.ExceptionInfo, *needles: str) -> str:
    text = str(err.value)
    assert "\n" not in text, text
    for n in needles:
        assert n in text, f"{n!r} not in {text!r}"
    return text


def _label_csv(path: Path, rows: list[tuple], header: list[str] | None = None) -> Path:
    header = header or ["index", *LABELS, "frame"]
    lines = [",".join(header)]
    for index, frame, *labels in rows:
        on = set(labels)
        lines.append(",".join([str(index), *("1" if n in on else "0" for n in LABELS), str(frame)]))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return path


def _probs(n: int, seed: int = 0) -> np.ndarray:
    p = np.full((n, NUM_LABELS), 0.02, np.float32)
    p[:, LABELS.index("stomach")] = 0.95  # one section all along: the decoder writes one event per video
    p += np.random.default_rng(seed).uniform(0, 0.01, p.shape).astype(np.float32)
    return p


def _run_writer(items: list[dict], out: Path, batch: int = 4, videos=None, report_dir=None) -> object:
    """Feed frame items through an ignite engine with a ProbabilityWriter, as the bundle's evaluator does, then
    decode the files into ``out/events.json`` (and draw the report), as the bundle's run list does."""
    from ignite.engine import Engine

    from monai_vce.handlers import ProbabilityWriter
    from monai_vce.stages import decode, report

    batches = []
    for s in range(0, len(items), batch):
        chunk = items[s : s + batch]
        batches.append(
            {
                "pred": np.stack([_probs(1, d["frame_index"])[0] for d in chunk]),
                "video_id": [d["video_id"] for d in chunk],
                "frame_index": torch.tensor([d["frame_index"] for d in chunk]),
                "frame_number": torch.tensor([d["frame_number"] for d in chunk]),
            }
        )
    writer = ProbabilityWriter(output_dir=out, name="test.writer")
    engine = Engine(lambda e, b: {"pred": torch.as_tensor(b["pred"])})
    writer.attach(engine)
    engine.run(batches, max_epochs=1)
    decode(out, out / "events.json", videos=videos)
    report(out / "events.json", report_dir, out)
    return writer


def _items(video_id: str, n: int, start: int = 0) -> list[dict]:
    return [{"image": f"{i}.png", "video_id": video_id, "frame_index": i, "frame_number": i} for i in range(start, n)]


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``model.pt`` of the demo network (inference.json + demo.json) with seeded random weights."""
    from monai.bundle import ConfigParser

    parser = ConfigParser()
    parser.read_config(INFER_CFG)
    parser["bundle_root"] = str(REPO / "bundle")
    torch.manual_seed(0)
    net = parser.get_parsed_content("network_def")
    path = tmp_path_factory.mktemp("tiny_model") / "model.pt"
    torch.save(net.state_dict(), path)
    return path


@pytest.fixture(scope="module")
def hostile_frames(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, str]]:
    """Hostile frame files loaded by ``load_vce_frame`` in one child process under a memory cap (a crash or a
    decompression bomb there cannot take the test run or the machine down): ``{kind: (path, verdict line)}``."""
    folder = tmp_path_factory.mktemp("hostile_frames")
    good = _frame()
    contents = {
        "flip": _damaged(good, "flip"),
        "crc": _damaged(good, "crc"),
        "bomb_png": _bomb_png(30000, 30000),
        "bomb_jpeg": _bomb_jpeg(30000, 30000),
    }
    paths = {}
    for i, (kind, data) in enumerate(contents.items()):
        paths[kind] = folder / f"frame_{i:06d}.png"
        paths[kind].write_bytes(data)
    code = (
        "import sys, time\nfrom monai_vce.data.frames import load_vce_frame\nfor p in sys.argv[1:]:\n"
        "    t = time.perf_counter()\n    try:\n        load_vce_frame(p)\n        print('LOADED', p, flush=True)\n"
        "    except ValueError as e:\n        print('REFUSED', round(time.perf_counter() - t, 3), e, flush=True)\n"
    )
    res = python_capped(code, *map(str, paths.values()), timeout=300)
    assert res.returncode == 0, f"exit {res.returncode} (a crash?):\n{res.stdout}\n{res.stderr[-2000:]}"
    lines = res.stdout.strip().splitlines()
    assert len(lines) == len(paths), res.stdout
    return {kind: (path, line) for (kind, path), line in zip(paths.items(), lines, strict=True)}


# ------------------------------------------------------------------------------- 1. corrupted frames
def test_1_corrupted_png_gives_one_line_error_never_a_crash(
    tmp_path: Path, hostile_frames: dict[str, tuple[Path, str]]
) -> None:
    """A flipped bit in the image data or a wrong checksum: a ValueError naming the file (the decoder used before
    crashed the process with a segmentation fault); the check of the datalist builder finds the same frames."""
    for kind in ("flip", "crc"):
        path, line = hostile_frames[kind]
        assert line.startswith("REFUSED") and f"truncated or corrupted PNG frame {path}" in line, line

    # the datalist builder's check: "decode" finds both (the checksum-only damage too), "skip" leaves them out
    from monai_vce.data import build_inference_datalist

    video = tmp_path / "frames" / "v"
    video.mkdir(parents=True)
    for i in range(5):
        data = _frame(i)
        (video / f"frame_{i:06d}.png").write_bytes(_damaged(data, "crc") if i == 3 else data)
    with pytest.raises(ValueError) as err:
        build_inference_datalist(tmp_path / "frames", check_images="decode")
    _one_line(err, "frame_000003.png", "CRC mismatch", "bad_frames='skip'")
    with pytest.warns(UserWarning, match=r"1 unreadable, corrupted or oversized frame files \(skipped"):
        items = build_inference_datalist(tmp_path / "frames", check_images="decode", bad_frames="skip")
    assert [d["frame_number"] for d in items] == [0, 1, 2, 4]


def test_1_corrupted_frame_in_a_bundle_run_with_workers(tmp_path: Path, mini_galar: Path, tiny_model: Path) -> None:
    """With DataLoader workers, a corrupted frame stops the run naming the file; the videos before keep their files."""
    import shutil

    from monai.bundle import ConfigWorkflow

    data = tmp_path / "data"
    shutil.copytree(mini_galar, data)
    bad = sorted((data / "frames" / "3").iterdir())[30]
    bad.write_bytes(_damaged(bad.read_bytes(), "flip"))
    out = tmp_path / "out"
    wf = ConfigWorkflow(
        config_file=INFER_CFG,
        meta_file=META,
        logging_file=False,
        workflow_type="infer",
        bundle_root=str(REPO / "bundle"),
        dataset_dir=str(data),
        output_dir=str(out),
        model_file=str(tiny_model),
        progress=False,
        report=False,
        batch_size=10,
        num_workers=2,
    )
    wf.initialize()
    try:
        with pytest.raises(Exception) as err:
            wf.run()
    finally:
        wf.finalize()
    text = chain_text(err.value)
    assert f"truncated or corrupted PNG frame {bad}" in text, text[-3000:]
    assert sorted(p.name for p in (out / "probs").glob("*.npz")) == ["1.npz", "2.npz"]
    assert not (out / "events.json").exists()
    assert not (out / ".monai_vce.lock").exists()  # the failed run released its output folder


# ------------------------------------------------------------------------------ 2. ids that look like paths
HOSTILE_IDS = [
    "../../escape",
    "/tmp/monai_vce_absolute_escape",
    "a/b",
    "a_b",
    ".",
    "..",
    ".hidden",
    "%41",
    "a b",
    "vidéo 1",
    "$\\undefinedmacro$",
    "x|y](javascript:alert(1))<b>",
]


def test_2_9_video_ids_never_become_paths_and_any_id_works_end_to_end(tmp_path: Path) -> None:
    """Ids with separators, dots, blanks, accents or markup: every file stays in its folder, names never collide,
    the id is kept in the file, and the event JSON, timelines and summary (links and text) work."""
    from monai_vce.events import load_events, load_video_probs, pending_frames, probability_file, probability_files

    out = tmp_path / "run" / "probs"
    report = tmp_path / "run" / "report"
    datalist = [d for i, vid in enumerate(HOSTILE_IDS) for d in _items(vid, 6 + i % 3)]
    items = pending_frames(datalist, out)
    _run_writer(items, out, videos=HOSTILE_IDS, report_dir=report)

    run = tmp_path / "run"
    assert not [p for p in tmp_path.rglob("*") if p != run and run not in p.parents]  # nothing outside the run
    assert not Path("/tmp/monai_vce_absolute_escape.npz").exists()
    assert set(probability_files(out)) == set(HOSTILE_IDS)
    for vid in HOSTILE_IDS:
        assert load_video_probs(probability_file(out, vid)).video_id == vid
    events = load_events(out / "events.json")
    assert [v["video_id"] for v in events["videos"]] == HOSTILE_IDS
    assert len(list((report / "timelines").glob("*.png"))) == len(HOSTILE_IDS)
    md = (report / "summary.md").read_text()
    links = re.findall(r"\]\(([^)]*)\)", md)
    assert len(links) == len(HOSTILE_IDS)
    for target in links:
        assert " " not in target and (report / unquote(target)).is_file(), target
    assert "<b>" not in md and "](javascript" not in md

    from monai_vce.data.frame_cache import FrameCache
    from monai_vce.events.probabilities import video_file_name, video_id_of_file_name
    from monai_vce.review import exam_file_name

    names = {video_file_name(v) for v in HOSTILE_IDS}
    assert len(names) == len(HOSTILE_IDS)  # "a/b" and "a_b" (and all others) get different names
    for vid in HOSTILE_IDS:
        name = video_file_name(vid)
        assert "/" not in name and "\\" not in name and not name.startswith(".") and video_id_of_file_name(name) == vid
        assert exam_file_name(vid) == video_file_name(vid, "")
        cache = FrameCache(tmp_path / "cache", image_size=8)
        assert cache.array_path(vid).parent == cache.root and cache.partial_path(vid).parent == cache.root
    assert video_file_name("ukdd_navi_00051") == "ukdd_navi_00051.npz"  # plain ids keep their names


# --------------------------------------------------------------------------- 3. a video listed in two places
def test_3_video_listed_in_two_places_is_grouped_or_refused(tmp_path: Path) -> None:
    from monai_vce.events import load_video_probs, pending_frames

    datalist = _items("1", 5) + _items("2", 5) + _items("1", 10, start=5)
    grouped = pending_frames(datalist, tmp_path / "probs")
    assert [(d["video_id"], d["frame_index"]) for d in grouped] == [("1", i) for i in range(10)] + [
        ("2", i) for i in range(5)
    ]
    _run_writer(grouped, tmp_path / "probs")
    assert len(load_video_probs(tmp_path / "probs" / "1.npz")) == 10

    # fed to the writer directly in that order: refused, and no file holds part of video 1
    out = tmp_path / "direct"
    with pytest.raises(ValueError) as err:
        _run_writer(datalist, out)
    _one_line(err, "video '1'", "list each video's frames together")
    assert not (out / "1.npz").exists() and not (out / "events.json").exists()


# ------------------------------------------------------------------------ 4. the generator's lock comes first
def test_4_generator_refuses_a_folder_in_use_before_touching_it(tmp_path: Path) -> None:
    from monai_vce.data import generate_mini_galar

    out = generate_mini_galar(tmp_path / "g", videos=1, frames_per_video=3, size=8, use_real_timelines=False)
    before = sorted(str(p.relative_to(out)) for p in out.rglob("*"))
    code = (
        "import sys\nfrom monai_vce.utils import OutputLock\nOutputLock(sys.argv[1]).acquire()\n"
        "print('locked', flush=True)\nsys.stdin.read()\n"
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", code, str(out)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=REPO
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"  # held: no race
        with pytest.raises(RuntimeError, match="is in use by another run"):
            generate_mini_galar(out, videos=1, frames_per_video=3, size=8, use_real_timelines=False)
        after = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.name != ".monai_vce.lock")
        assert after == before  # nothing removed or rewritten
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(timeout=60)


# ------------------------------------------------------------------------ 8. a failed run releases its lock
@pytest.mark.parametrize("ending", ["raise ValueError('bad input')", "sys.exit(2)"])
def test_8_a_failed_run_removes_its_lock_file(tmp_path: Path, ending: str) -> None:
    """A run that stops with an error or an exit status leaves no lock file behind (a killed one can; the next run
    takes that one over, see tests/hardening/test_faults.py)."""
    folder = tmp_path / "out"
    code = (
        "import os, sys\nfrom monai_vce.utils import OutputLock\n"
        f"OutputLock(sys.argv[1]).acquire()\nassert os.path.exists(sys.argv[1] + '/.monai_vce.lock')\n{ending}\n"
    )
    res = python_capped(code, str(folder), limit_mb=TORCH_CAP_MB, timeout=120)
    assert res.returncode != 0 and "AssertionError" not in res.stderr, res.stderr[-2000:]
    assert folder.is_dir() and not (folder / ".monai_vce.lock").exists()


# -------------------------------------------------------------------------------- 6. decompression bombs
def test_6_oversized_frames_are_refused_from_their_header(
    tmp_path: Path, hostile_frames: dict[str, tuple[Path, str]]
) -> None:
    """A PNG of a few hundred bytes (or a JPEG header) declaring 30000 x 30000 pixels: refused from the header in well under a second
    (decoding it would take 3.4 GB and most of a minute)."""
    bomb_png, _ = hostile_frames["bomb_png"]
    assert bomb_png.stat().st_size < 2_000_000
    for kind in ("bomb_png", "bomb_jpeg"):
        path, line = hostile_frames[kind]
        assert line.startswith("REFUSED") and str(path) in line and "30000 x 30000 pixels" in line, line
        assert float(line.split()[1]) < 1.0  # refused from the header, nothing decoded

    from monai_vce.data import verify_frames
    from monai_vce.data.frames import LoadVCEFramed, load_vce_frame

    with pytest.raises(ValueError, match="30000 x 30000"):
        verify_frames([bomb_png], mode="header")
    # the limit is a setting: a normal frame under a low limit is refused, and accepted by default
    normal = tmp_path / "normal.png"
    normal.write_bytes(_frame(size=64))
    with pytest.raises(ValueError) as err:
        LoadVCEFramed(keys="image", max_pixels=1000)({"image": str(normal)})
    _one_line(err, str(normal), "64 x 64", "max_pixels")
    assert tuple(load_vce_frame(normal, None).shape) == (3, 64, 64)


# ------------------------------------------------------------------------- 7 (and 16). resume checks the frames
def test_7_resume_reuses_a_file_only_for_the_same_frames(tmp_path: Path) -> None:
    from monai_vce.events import Video, completed_videos, pending_frames, probability_file, save_video_probs

    ids = np.arange(10, dtype=np.int64)
    save_video_probs(probability_file(tmp_path, "1"), Video("1", _probs(10), ids, ids))
    same = _items("1", 10)
    assert completed_videos(same, tmp_path) == ["1"] and pending_frames(same, tmp_path) == []
    renumbered = [{**d, "frame_index": d["frame_index"] + 100, "frame_number": d["frame_number"] + 100} for d in same]
    assert completed_videos(renumbered, tmp_path) == [] and len(pending_frames(renumbered, tmp_path)) == 10
    other_numbers = [{**d, "frame_number": 5 * d["frame_number"]} for d in same]
    assert completed_videos(other_numbers, tmp_path) == []
    # a datalist repeating an item: the video is still complete (it was recomputed at every run)
    with pytest.warns(UserWarning, match="repeats 1 frame"):
        assert pending_frames([*same, same[3]], tmp_path) == []
    # a file renamed or copied to another video's name is not that video's
    probability_file(tmp_path, "1").rename(probability_file(tmp_path, "2"))
    assert completed_videos(_items("2", 10), tmp_path) == []


# ----------------------------------------------------------------------------- 10. weights of the wrong type
def test_10_weights_of_a_non_floating_type_are_refused(tmp_path: Path) -> None:
    from ignite.engine import Engine
    from safetensors.torch import save_file

    from monai_vce.handlers import VCECheckpointLoader
    from monai_vce.networks import TINY_MODEL_NAME, DiffAttnCLIPClassifier
    from monai_vce.networks.backbone import build_image_tower, create_tiny_open_clip

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        net = DiffAttnCLIPClassifier(backbone=TINY_MODEL_NAME, pretrained=False, image_size=64)
    int8 = tmp_path / "model.pt"
    torch.save({k: (v * 10).to(torch.int8) if v.is_floating_point() else v for k, v in net.state_dict().items()}, int8)
    engine = Engine(lambda e, b: 0)
    VCECheckpointLoader(load_path=str(int8), load_dict={"model": net}).attach(engine)
    with pytest.raises(ValueError) as err:
        engine.run([0], max_epochs=1)
    _one_line(err, str(int8), "int8", "key '")

    state = {k: v > 0 for k, v in create_tiny_open_clip().state_dict().items() if k.startswith("visual.")}
    boolean = tmp_path / "tower.safetensors"
    save_file({k: v.contiguous() for k, v in state.items()}, str(boolean))
    with pytest.raises(ValueError) as err:
        build_image_tower(str(boolean), model_name=TINY_MODEL_NAME)
    _one_line(err, str(boolean), "bool", "key '")


# ------------------------------------------------------------------------- 11. label CSVs with bad index values
@pytest.mark.parametrize(
    ("rows", "expected"),
    [
        ([(0, 0), (-1, 1), (2, 2)], "data row 2, column 'index': value '-1' is not a frame id"),
        ([(0, 0), (1, 5), (1, 6)], "data rows 2 and 3 both have index 1 but frames 5 and 6"),
    ],
)
def test_11_label_csv_with_negative_or_clashing_index(tmp_path: Path, rows: list, expected: str) -> None:
    from monai_vce.data import read_label_csv

    path = _label_csv(tmp_path / "1.csv", [(i, f, "colon") for i, f in rows])
    with pytest.raises(ValueError) as err:
        read_label_csv(path)
    _one_line(err, str(path), expected)


# ------------------------------------------------------------------------- 12. event files bounded and regular
def test_12_event_file_that_is_a_device_or_a_pipe_is_refused(tmp_path: Path) -> None:
    fifo = tmp_path / "events.fifo"
    os.mkfifo(fifo)
    code = (
        "import sys\nfrom monai_vce.events import load_events\nfor p in sys.argv[1:]:\n"
        "    try:\n        load_events(p)\n        print('READ', p)\n"
        "    except ValueError as e:\n        print('REFUSED', e)\n"
    )
    res = python_capped(code, "/dev/zero", str(fifo), limit_mb=LIGHT_CAP_MB, timeout=60)
    assert res.returncode == 0, f"exit {res.returncode}:\n{res.stdout}\n{res.stderr[-2000:]}"
    lines = res.stdout.strip().splitlines()
    assert lines == [
        "REFUSED event file /dev/zero is not a regular file (a device, pipe or socket); give a file",
        f"REFUSED event file {fifo} is not a regular file (a device, pipe or socket); give a file",
    ]
    gt = tmp_path / "gt.json"
    gt.write_text(json.dumps({"videos": [{"video_id": "1", "events": []}]}))
    res = run_capped(
        [sys.executable, "-m", "monai_vce.metrics", "--gt", str(gt), "--events", "/dev/zero"],
        limit_mb=LIGHT_CAP_MB,
        timeout=60,
    )
    assert res.returncode == 2 and "Traceback" not in res.stderr and len(res.stderr.strip().splitlines()) == 1


# ---------------------------------------------------------------------------------------- 13. huge numbers
def test_13_huge_numbers_give_one_line_errors(tmp_path: Path) -> None:
    from monai_vce.data import build_inference_datalist, read_label_csv
    from monai_vce.events import validate_events
    from monai_vce.metrics import temporal_map

    huge = "1" + "0" * 24
    path = _label_csv(tmp_path / "1.csv", [(0, 0, "colon"), (huge, 1, "colon")])
    with pytest.raises(ValueError) as err:
        read_label_csv(path)
    _one_line(err, str(path), "data row 2, column 'index'", "is not a frame id")

    video = tmp_path / "frames" / "v"
    video.mkdir(parents=True)
    (video / "frame_000001.png").write_bytes(_frame())
    (video / f"frame_{huge}.png").write_bytes(_frame())
    with pytest.raises(ValueError) as err:
        build_inference_datalist(tmp_path / "frames")
    _one_line(err, f"frame_{huge}.png", "25 digits")

    for end in (10**30, 2**63 - 1, 2**31):
        obj = {"videos": [{"video_id": "1", "events": [{"start": 0, "end": end, "label": ["colon"]}]}]}
        assert validate_events(obj) == [
            f"video '1' (videos[0]) event 0: 'end' must be at most 2147483647 (2**31 - 1), got {end}"
        ]
        with pytest.raises(ValueError, match="must be at most"):
            temporal_map(obj, obj)


# ------------------------------------------------------------------------------ 14. nothing accepted silently
def test_14_duplicates_are_errors_not_silently_resolved(tmp_path: Path) -> None:
    from monai_vce.data import read_label_csv
    from monai_vce.events import load_events
    from monai_vce.postprocessing import DecoderParams

    header = ["index", *LABELS, "frame", "ulcer"]
    path = tmp_path / "1.csv"
    path.write_text(",".join(header) + "\n" + ",".join(["0"] * (NUM_LABELS + 2) + ["1"]) + "\n")
    with pytest.raises(ValueError) as err:
        read_label_csv(path)
    _one_line(err, str(path), "column 'ulcer' appears twice")

    events = tmp_path / "events.json"
    events.write_text('{"videos": [{"video_id": "1", "events": []}], "videos": []}')
    with pytest.raises(ValueError) as err:
        load_events(events)
    _one_line(err, str(events), "key 'videos' appears twice")

    params = DecoderParams().to_dict()
    text = json.dumps(params)
    decoder = tmp_path / "decoder.json"
    decoder.write_text(text[:-1] + ', "version": 1}')
    with pytest.raises(ValueError) as err:
        DecoderParams.load(decoder)
    _one_line(err, str(decoder), "key 'version' appears twice")


# ------------------------------------------------------------------------ 15. errors name the file and what to do
def test_15_errors_name_the_file_and_what_to_do(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    from monai_vce.data import read_label_csv, read_metadata
    from monai_vce.events import pending_frames

    latin = _label_csv(tmp_path / "latin.csv", [(0, 0, "colon")])
    latin.write_bytes(latin.read_bytes().replace(b"index", b"ind\xe9x", 1))
    with pytest.raises(ValueError) as err:
        read_label_csv(latin)
    _one_line(err, str(latin), "not UTF-8", "line 1")
    meta = tmp_path / "metadata.csv"
    meta.write_bytes(b"video_id,capsule\n1,Pill\xe9Cam\n")
    with pytest.raises(ValueError) as err:
        read_metadata(meta)
    _one_line(err, str(meta), "not UTF-8")

    # model.pt cut short, empty, of another kind, or a safetensors file under its name: the loader names the file
    # (torch's errors name nothing, or advise weights_only=False, exactly wrong for an untrusted file)
    from ignite.engine import Engine

    from monai_vce.handlers import VCECheckpointLoader

    net = torch.nn.Linear(3, 2)
    good = tmp_path / "good.pt"
    torch.save(net.state_dict(), good)
    save_file({k: v.contiguous() for k, v in net.state_dict().items()}, str(tmp_path / "weights.pt"))
    cases = {
        "empty.pt": (b"", "the file is empty (0 bytes)"),
        "truncated.pt": (good.read_bytes()[: good.stat().st_size // 2], "the file is truncated or damaged"),
        "text.pt": (b"just some text", "not a file written by torch.save"),
        "weights.pt": (None, "it is a safetensors file, not a torch checkpoint"),
    }
    for name, (content, expected) in cases.items():
        if content is not None:
            (tmp_path / name).write_bytes(content)
        engine = Engine(lambda e, b: 0)
        VCECheckpointLoader(load_path=str(tmp_path / name), load_dict={"model": net}).attach(engine)
        with pytest.raises(ValueError) as err:
            engine.run([0], max_epochs=1)
        text = _one_line(err, f"cannot read checkpoint {tmp_path / name}: ", expected)
        assert "weights_only=False" not in text and "`weights_only` set to `False`" not in text

    with pytest.raises(ValueError) as err:
        pending_frames([*_items("1", 2), {"image": "x.png", "frame_index": 2}], tmp_path / "probs")
    _one_line(err, "item 2 has no 'video_id'")

    # --out below a regular file: exit 2, one line, no traceback
    from monai_vce.metrics.__main__ import main as metrics_main
    from monai_vce.report.__main__ import main as report_main

    gt = tmp_path / "gt.json"
    gt.write_text(json.dumps({"videos": [{"video_id": "1", "events": [{"start": 0, "end": 3, "label": ["colon"]}]}]}))
    afile = tmp_path / "afile"
    afile.write_text("x")
    res = run_capped(
        [
            sys.executable,
            "-m",
            "monai_vce.metrics",
            "--gt",
            str(gt),
            "--events",
            str(gt),
            "--out",
            str(afile / "r.json"),
        ],
        limit_mb=LIGHT_CAP_MB,
        timeout=60,
    )
    assert res.returncode == 2 and "Traceback" not in res.stderr and f"{afile} is a file" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1
    assert metrics_main(["--gt", str(gt), "--events", str(gt), "--out", str(afile / "sub" / "r.json")]) == 2
    assert report_main(["--events", str(gt), "--out", str(afile / "report")]) == 2


# ---------------------------------------------------------------------------------------------- 16. minor
def test_16_messages_are_bounded_escaped_and_never_echo_file_content(tmp_path: Path) -> None:
    from monai_vce.data import build_galar_datalist, build_inference_datalist
    from monai_vce.data.frames import load_vce_frame
    from monai_vce.events import check_events
    from monai_vce.report.summary import summary_markdown

    big = {"videos": [{"video_id": "1", "events": [{"start": 0, "end": 1, "label": ["x" * 10_000_000]}]}]}
    with pytest.raises(ValueError) as err:
        check_events(big)
    assert len(str(err.value)) < 1000

    secret = tmp_path / "frame_000007.png"
    secret.write_bytes(b"admin:$6$SECRETHASH:19000:0:99999:7:::\n")
    with pytest.raises(ValueError) as err:
        load_vce_frame(secret)
    assert str(secret) in str(err.value) and "SECRETHASH" not in str(err.value) and "admin" not in str(err.value)

    md = summary_markdown({"a|b](x)<script>": [], "[c](javascript:alert(1))": []})
    assert "<script>" not in md and "](javascript" not in md and "](x)" not in md
    assert "| a\\|b\\]\\(x\\)&lt;script&gt; | 0 |" in md

    # a broken frame link is reported, not skipped silently
    video = tmp_path / "frames" / "1"
    video.mkdir(parents=True)
    for i in range(3):
        (video / f"frame_{i:06d}.PNG").write_bytes(_frame(i))
    (video / "frame_000003.PNG").symlink_to(tmp_path / "gone.png")
    with pytest.warns(
        UserWarning, match=r"1 frame files that are broken links \(skipped\), e.g. \['frame_000003.PNG'\]"
    ):
        assert len(build_inference_datalist(tmp_path / "frames")) == 3
    _label_csv(tmp_path / "labels" / "1.csv", [(i, i, "colon") for i in range(4)])
    items, report = build_galar_datalist(tmp_path / "frames", tmp_path / "labels", return_report=True)
    assert report.videos["1"].broken_links == {"count": 1, "examples": ["frame_000003.PNG"]} and len(items) == 3


# ------------------------------------------------------------------ the same classes of defect, elsewhere
def test_same_defects_elsewhere_are_refused_in_one_line(tmp_path: Path) -> None:
    """Other readers of user files and other numeric settings: the same one-line refusals."""
    from monai_vce.data import generate_mini_galar
    from monai_vce.data.frames import resize_frame
    from monai_vce.events import Video, load_video_probs, probability_file, save_video_probs
    from monai_vce.postprocessing.thresholds import load_thresholds
    from monai_vce.review import write_review_site

    # a thresholds file naming a label twice
    thresholds = tmp_path / "thresholds.json"
    thresholds.write_text('{"ulcer": 0.5, ' + ", ".join(f'"{n}": 0.5' for n in LABELS) + "}")
    with pytest.raises(ValueError) as err:
        load_thresholds(thresholds)
    _one_line(err, str(thresholds), "key 'ulcer' appears twice")

    # a probability file declaring an array of gigabytes (a damaged or hostile zip) is refused before reading
    ids = np.arange(4, dtype=np.int64)
    path = save_video_probs(probability_file(tmp_path, "1"), Video("1", _probs(4), ids, ids))
    data = bytearray(path.read_bytes())
    entry = data.index(b"PK\x01\x02")  # central directory entry of the first array: its size field at +24
    data[entry + 24 : entry + 28] = struct.pack("<I", 0xFFFFFF00)
    path.write_bytes(bytes(data))
    with pytest.raises(ValueError) as err:
        load_video_probs(path)
    _one_line(err, str(path), "GiB once read")

    # numeric settings that would allocate without bound, or fail deep inside a library
    with pytest.raises(ValueError, match=r"image_size must be one or two sides in \[1, 8192\]"):
        resize_frame(torch.zeros(3, 8, 8, dtype=torch.uint8), 100_000)
    with pytest.raises(ValueError, match="a mini-Galar is small"):
        generate_mini_galar(tmp_path / "g", videos=1, frames_per_video=2, size=100_000, use_real_timelines=False)
    assert not (tmp_path / "g").exists()
    pred = {"videos": [{"video_id": "1", "events": []}]}
    for kwargs, expected in (
        ({"strip_frames": -5}, "strip_frames must be an integer in [0, 100000], got -5"),
        ({"frame_rate": float("nan")}, "frame_rate must be in (0, 10000] frames per second, got nan"),
        ({"num_workers": 0}, "num_workers must be an integer in [1, 1024], got 0"),
    ):
        with pytest.raises(ValueError) as err:
            write_review_site(pred, tmp_path, tmp_path / "site", progress=False, **kwargs)
        _one_line(err, expected)
    assert not (tmp_path / "site").exists()


def test_video_file_with_oversized_frames_is_refused_before_decoding(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A video whose stream declares frames above the pixel limit: refused from the header, naming the file (the
    limit is lowered so that the video stays tiny)."""
    pytest.importorskip("av")
    from monai_vce.data import frame_checks
    from monai_vce.data.video import iter_video_frames, probe_video, write_video

    path = write_video(tmp_path / "v.mkv", np.zeros((3, 32, 32, 3), np.uint8), codec="ffv1")
    assert probe_video(path).num_frames == 3  # under the default limit: read as before
    monkeypatch.setattr(frame_checks, "MAX_FRAME_PIXELS", 32 * 32 - 1)
    with pytest.raises(ValueError) as err:
        probe_video(path)
    _one_line(err, str(path), "32 x 32 pixels, more than the limit of 1,023 pixels")
    with pytest.raises(ValueError) as err:
        list(iter_video_frames(path, None))
    _one_line(err, str(path), "32 x 32 pixels")


@pytest.mark.background
def test_frame_path_that_is_a_device_or_a_pipe_is_refused(tmp_path: Path) -> None:
    """A datalist pointing a frame at ``/dev/zero`` or a named pipe: refused before reading (the loader read
    ``/dev/zero`` until memory ran out and waited forever on the pipe), by the loader, the datalist check and the
    review thumbnails; a checkpoint path likewise. Run in a child process under a memory cap and a timeout."""
    fifo = tmp_path / "frame_000001.png"
    os.mkfifo(fifo)
    code = (
        "import sys\nfrom monai_vce.data import verify_frames\nfrom monai_vce.data.frames import load_vce_frame\n"
        "from monai_vce.review.thumbnails import _read_rgb\nfrom monai_vce.networks.backbone import read_torch_file\n"
        "for p in sys.argv[1:]:\n"
        "    for f in (load_vce_frame, _read_rgb, lambda p: verify_frames([p], mode='decode'), read_torch_file):\n"
        "        try:\n            f(p)\n            print('READ', p)\n"
        "        except ValueError as e:\n            print('REFUSED', e)\n"
    )
    res = python_capped(code, "/dev/zero", str(fifo), limit_mb=TORCH_CAP_MB, timeout=120)
    assert res.returncode == 0, f"exit {res.returncode}:\n{res.stdout}\n{res.stderr[-2000:]}"
    lines = res.stdout.strip().splitlines()
    assert len(lines) == 8 and all(line.startswith("REFUSED") for line in lines), lines
    for path, group in (("/dev/zero", lines[:4]), (str(fifo), lines[4:])):
        assert all(path in line and "not a regular file" in line for line in group), group


def test_refined_files_are_reused_only_for_the_same_frames(tmp_path: Path) -> None:
    """The refinement's resume, like inference's: a refined file is kept only when it holds the same frame ids as its
    input (before, the same frame count and source were enough, so a re-inferred, renumbered video kept stale ids)."""
    from monai_vce.events import Video, load_video_probs, probability_file, save_video_probs
    from monai_vce.temporal import TemporalRefiner
    from monai_vce.temporal.files import refine_folder

    probs, out = tmp_path / "probs", tmp_path / "refined"
    refiner = TemporalRefiner(network={"stages": 1, "layers": 1, "channels": 4})
    ids = np.arange(10, dtype=np.int64)
    save_video_probs(probability_file(probs, "1"), Video("1", _probs(10), ids, ids), source="m")
    assert refine_folder(refiner, probs, out, source="r")["written"] == ["1"]
    assert refine_folder(refiner, probs, out, source="r")["kept"] == ["1"]
    save_video_probs(probability_file(probs, "1"), Video("1", _probs(10), ids + 100, ids + 100), source="m")
    assert refine_folder(refiner, probs, out, source="r")["written"] == ["1"]
    np.testing.assert_array_equal(load_video_probs(probability_file(out, "1")).frame_index, ids + 100)


def test_bad_frame_policy_is_a_bundle_setting(tmp_path: Path, mini_galar: Path) -> None:
    """``check_images`` / ``bad_frames`` of the bundle configs: a damaged frame named before the run, or left out."""
    import shutil

    from monai.bundle import ConfigParser

    data = tmp_path / "data"
    shutil.copytree(mini_galar, data)
    bad = sorted((data / "frames" / "2").iterdir())[5]
    bad.write_bytes(_damaged(bad.read_bytes(), "crc"))
    for config in (INFER_CFG, str(REPO / "bundle" / "configs" / "train.json")):
        parser = ConfigParser()
        parser.read_config(config)
        parser.update({"bundle_root": str(REPO / "bundle"), "dataset_dir": str(data)})
        listed = list(parser.get_parsed_content("datalist"))  # default: no check before the run
        assert str(bad) in {d["image"] for d in listed}
        parser.update({"check_images": "decode"})
        with pytest.raises(ValueError) as err:
            len(parser.get_parsed_content("datalist", lazy=False))
        _one_line(err, str(bad), "CRC mismatch", "bad_frames='skip'")
        parser.update({"bad_frames": "skip"})
        with pytest.warns(UserWarning, match="1 unreadable, corrupted or oversized frame files"):
            items = list(parser.get_parsed_content("datalist", lazy=False))
        assert [d for d in listed if d["image"] != str(bad)] == items
