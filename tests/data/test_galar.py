"""Galar reader: frame discovery, label CSVs, frame/index alignment, metadata, policies and errors."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from monai_vce.data import (
    build_galar_datalist,
    build_ground_truth,
    build_inference_datalist,
    discover_videos,
    list_frames,
    parse_frame_number,
    read_label_csv,
    read_metadata,
    verify_frames,
)
from monai_vce.labels import LABELS, label_index

# a header as the real files have it: our labels in another order, plus labels we do not use
EXTRA = ("bubbles", "dirt", "foreign body")
HEADER = ("index", *reversed(LABELS[:9]), *EXTRA, *LABELS[9:], "frame")


def write_png(path: Path, value: int = 128) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.full((8, 8, 3), value, dtype=np.uint8)).save(path)
    return path


def write_csv(path: Path, rows: list[tuple[int, int, list[str]]], header=HEADER, cell=None) -> Path:
    """rows: (index, frame, label names); ``cell`` = (row, column, text) overrides one value."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [",".join(header)]
    for r, (index, frame, names) in enumerate(rows):
        vals = []
        for h in header:
            if h == "index":
                vals.append(str(index))
            elif h == "frame":
                vals.append(str(frame))
            elif h in EXTRA:
                vals.append("1")  # extra labels all on: they must be ignored
            else:
                vals.append("1" if h in names else "0")
        if cell is not None and cell[0] == r:
            vals[header.index(cell[1])] = cell[2]
        lines.append(",".join(vals))
    path.write_text("\n".join(lines) + "\n")
    return path


def onehot(*names: str) -> list[float]:
    v = [0.0] * len(LABELS)
    for n in names:
        v[label_index(n)] = 1.0
    return v


# ------------------------------------------------------------------------------------------- discovery
def test_parse_frame_number_both_schemes():
    assert parse_frame_number("frame_000100.PNG") == 100
    assert parse_frame_number("frame_0000049.png") == 49
    assert parse_frame_number("Frame_12.Png") == 12
    assert parse_frame_number("frame_000100.jpg") is None
    assert parse_frame_number("Thumbs.db") is None
    assert parse_frame_number("frame_.png") is None


def test_discover_videos_nested_and_flat(tmp_path):
    write_png(tmp_path / "Galar_Frames_1_to_10" / "2" / "frame_000000.PNG")
    write_png(tmp_path / "Galar_Frames_1_to_10" / "10" / "frame_000000.PNG")
    write_png(tmp_path / "galar_frames_11_to_20" / "11" / "frame_000000.PNG")
    write_png(tmp_path / "ukdd_navi_00051" / "frame_0000049.png")
    (tmp_path / ".cache").mkdir()
    (tmp_path / "notes.txt").write_text("x")
    found = discover_videos(tmp_path)
    assert list(found) == ["2", "10", "11", "ukdd_navi_00051"]
    assert found["11"] == tmp_path / "galar_frames_11_to_20" / "11"
    # a folder of frames is one video named after the folder
    single = discover_videos(tmp_path / "ukdd_navi_00051")
    assert list(single) == ["ukdd_navi_00051"]


def test_discover_videos_duplicate_id_in_two_containers(tmp_path):
    write_png(tmp_path / "Galar_Frames_1_to_10" / "3" / "frame_000000.PNG")
    write_png(tmp_path / "Galar_Frames_11_to_20" / "3" / "frame_000000.PNG")
    with pytest.raises(ValueError, match="video '3' found twice"):
        discover_videos(tmp_path)


def test_list_frames_orders_by_number_and_ignores_other_files(tmp_path):
    for n in (100, 5, 20):
        write_png(tmp_path / f"frame_{n:06d}.PNG")
    write_png(tmp_path / "frame_0000007.png")  # other scheme in the same folder
    (tmp_path / "frame_000001.jpg").write_bytes(b"x")
    (tmp_path / "desktop.ini").write_text("x")
    numbers, paths, dups = list_frames(tmp_path)
    assert numbers.tolist() == [5, 7, 20, 100]
    names = [Path(p).name for p in paths]
    assert names == ["frame_000005.PNG", "frame_0000007.png", "frame_000020.PNG", "frame_000100.PNG"]
    assert dups == []


def test_empty_video_folder_is_an_error(tmp_path):
    (tmp_path / "frames" / "4").mkdir(parents=True)
    (tmp_path / "frames" / "4" / "readme.txt").write_text("no frames here")
    write_csv(tmp_path / "labels" / "4.csv", [(0, 0, ["colon"])])
    with pytest.raises(ValueError, match=r"video folder .*4 contains no frame image"):
        build_galar_datalist(tmp_path / "frames", tmp_path / "labels")


# ------------------------------------------------------------------------------------------- label CSV
def test_read_label_csv_extra_columns_and_reordered_header(tmp_path):
    path = write_csv(
        tmp_path / "7.csv",
        [(0, 0, ["mouth"]), (1, 5, ["stomach", "ulcer"]), (2, 10, ["small intestine", "z-line", "polyp", "hematin"])],
    )
    t = read_label_csv(path)
    assert t.video_id == "7"
    assert t.index.tolist() == [0, 1, 2] and t.frame.tolist() == [0, 5, 10]
    assert t.labels.dtype == np.float32 and t.labels.shape == (3, 17)
    assert t.labels.tolist() == [
        onehot("mouth"),
        onehot("stomach", "ulcer"),
        onehot("small intestine", "z-line", "polyp", "hematin"),
    ]


def test_read_label_csv_header_variants(tmp_path):
    header = ["Index"] + [n.title().replace(" ", "_") for n in LABELS] + ["Frame"]
    path = tmp_path / "v.csv"
    path.write_text(",".join(header) + "\n" + ",".join(["3"] + ["0"] * 16 + ["1.0"] + ["15"]) + "\n")
    t = read_label_csv(path)
    assert t.index.tolist() == [3] and t.frame.tolist() == [15]
    assert t.labels.tolist() == [onehot("ulcer")]


def test_missing_label_column_names_file_and_column(tmp_path):
    header = tuple(h for h in HEADER if h != "angiectasia")
    path = write_csv(tmp_path / "12.csv", [(0, 0, ["colon"])], header=header)
    with pytest.raises(ValueError) as e:
        read_label_csv(path)
    assert "12.csv" in str(e.value) and "'angiectasia'" in str(e.value) and "missing label column" in str(e.value)


@pytest.mark.parametrize("column", ["index", "frame"])
def test_missing_index_or_frame_column(tmp_path, column):
    header = tuple(h for h in HEADER if h != column)
    path = write_csv(tmp_path / "5.csv", [(0, 0, ["colon"])], header=header)
    with pytest.raises(ValueError, match=rf"5\.csv: missing column '{column}'"):
        read_label_csv(path)


def test_non_binary_value_names_file_row_index_and_column(tmp_path):
    rows = [(i, 5 * i, ["colon"]) for i in range(4)]
    path = write_csv(tmp_path / "9.csv", rows, cell=(2, "polyp", "2"))
    with pytest.raises(ValueError) as e:
        read_label_csv(path)
    msg = str(e.value)
    assert "9.csv" in msg and "data row 3" in msg and "index 2" in msg and "'polyp'" in msg and "'2'" in msg


def test_non_integer_frame_and_ragged_row(tmp_path):
    path = write_csv(tmp_path / "9.csv", [(0, 0, ["colon"]), (1, 5, ["colon"])], cell=(1, "frame", "x5"))
    with pytest.raises(ValueError, match=r"9\.csv: data row 2, column 'frame': value 'x5'"):
        read_label_csv(path)
    path.write_text(path.read_text().splitlines()[0] + "\n0,1,0\n")
    with pytest.raises(ValueError, match=r"9\.csv: data row 1 has 3 fields"):
        read_label_csv(path)


# ------------------------------------------------------------------------------------------- alignment
def test_labels_follow_frame_column_not_row_order(tmp_path):
    """Rows listed in index order map to images through `frame`: the i-th image is not the i-th row."""
    rows = [(0, 10, ["colon", "polyp"]), (1, 0, ["colon", "ulcer"]), (2, 5, ["colon"])]
    write_csv(tmp_path / "labels" / "1.csv", rows)
    for n in (0, 5, 10):
        write_png(tmp_path / "frames" / "1" / f"frame_{n:06d}.PNG")
    dl = build_galar_datalist(tmp_path / "frames", tmp_path / "labels")
    assert [d["frame_number"] for d in dl] == [0, 5, 10]
    assert [d["frame_index"] for d in dl] == [1, 2, 0]
    assert [d["label"] for d in dl] == [onehot("colon", "ulcer"), onehot("colon"), onehot("colon", "polyp")]
    assert [Path(d["image"]).name for d in dl] == ["frame_000000.PNG", "frame_000005.PNG", "frame_000010.PNG"]


def test_every_fifth_frame_video_and_both_naming_schemes(tmp_path):
    # video 1: index i is frame 5 i (as in Galar video 1); images of the other frames exist but are unlabeled
    names = [["stomach"], ["stomach", "pylorus"], ["small intestine"], ["small intestine", "blood"]]
    write_csv(tmp_path / "labels" / "1.csv", [(i, 5 * i, n) for i, n in enumerate(names)])
    for f in range(0, 16):
        write_png(tmp_path / "frames" / "1" / f"frame_{f:06d}.PNG")
    # challenge test naming: 7 digits, lower case, frame == index
    write_csv(tmp_path / "labels" / "ukdd_navi_00051.csv", [(i, i, ["colon"]) for i in range(3)])
    for f in range(3):
        write_png(tmp_path / "frames" / "ukdd_navi_00051" / f"frame_{f:07d}.png")
    metadata = tmp_path / "metadata.csv"
    metadata.write_text("video_id,capsule\n1,PillCam SB3\nukdd_navi_00051,Olympus\n")
    with pytest.warns(UserWarning, match="12 frame images without a label row"):
        dl, report = build_galar_datalist(tmp_path / "frames", tmp_path / "labels", metadata, return_report=True)
    v1 = [d for d in dl if d["video_id"] == "1"]
    assert [d["frame_number"] for d in v1] == [0, 5, 10, 15]
    assert [d["frame_index"] for d in v1] == [0, 1, 2, 3]
    assert [d["label"] for d in v1] == [onehot(*n) for n in names]
    assert {d["capsule"] for d in v1} == {"PillCam SB3"}
    v2 = [d for d in dl if d["video_id"] == "ukdd_navi_00051"]
    assert [d["frame_number"] for d in v2] == [0, 1, 2] and v2[0]["capsule"] == "Olympus"
    assert v2[0]["image"].endswith("frame_0000000.png")
    assert set(dl[0]) == {"image", "label", "video_id", "frame_index", "frame_number", "capsule"}
    assert all(isinstance(x, float) for x in dl[0]["label"]) and isinstance(dl[0]["frame_index"], int)
    assert report.videos["1"].unlabeled_frames == {"count": 12, "examples": [1, 2, 3, 4, 6]}
    assert report.videos["ukdd_navi_00051"].ok


# ------------------------------------------------------------------------------------------- policies
def make_inconsistent(tmp_path: Path) -> tuple[Path, Path]:
    rows = [(i, i, ["colon"]) for i in range(6)] + [(6, 3, ["colon", "polyp"])]  # frame 3 listed twice
    write_csv(tmp_path / "labels" / "3.csv", rows)
    for f in (0, 1, 3, 5, 8, 9):  # 2 and 4 missing; 8, 9 without row
        write_png(tmp_path / "frames" / "3" / f"frame_{f:06d}.PNG")
    write_png(tmp_path / "frames" / "3" / "frame_0000005.png", value=10)  # duplicate number 5
    return tmp_path / "frames", tmp_path / "labels"


def test_policy_report_and_warning(tmp_path):
    frames, labels = make_inconsistent(tmp_path)
    with pytest.warns(UserWarning) as rec:
        dl, report = build_galar_datalist(frames, labels, return_report=True)
    text = str(rec[0].message)
    assert "video 3: 2 frame images without a label row" in text
    assert "video 3: 2 label rows without a frame image" in text
    rep = report.videos["3"]
    assert rep.unlabeled_frames == {"count": 2, "examples": [8, 9]}
    assert rep.rows_without_frame == {"count": 2, "examples": [(2, 2), (4, 4)]}
    assert rep.duplicate_frames == {"count": 1, "examples": [(5, ["frame_000005.PNG"])]}
    assert rep.duplicate_rows == {"count": 1, "examples": [(3, 6)]}
    assert (rep.n_frames, rep.n_rows, rep.n_items) == (6, 7, 4)
    assert not report.ok and report.to_dict()["videos"]["3"]["unlabeled_frames"]["count"] == 2
    # kept: frames 0, 1, 3 (first row: no polyp), 5 (first file in name order: the 7-digit one)
    assert [d["frame_number"] for d in dl] == [0, 1, 3, 5]
    assert dl[2]["label"] == onehot("colon") and dl[2]["frame_index"] == 3
    assert Path(dl[3]["image"]).name == "frame_0000005.png"


def test_policy_strict_raises(tmp_path):
    frames, labels = make_inconsistent(tmp_path)
    with pytest.raises(ValueError, match=r"strict=True(.|\n)*video 3: 2 frame images without a label row"):
        build_galar_datalist(frames, labels, strict=True)


def test_consistent_data_is_silent(tmp_path):
    write_csv(tmp_path / "labels" / "1.csv", [(i, i, ["colon"]) for i in range(3)])
    for f in range(3):
        write_png(tmp_path / "frames" / "1" / f"frame_{f:06d}.PNG")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        dl, report = build_galar_datalist(tmp_path / "frames", tmp_path / "labels", return_report=True, strict=True)
    assert report.ok and len(dl) == 3


def test_videos_without_labels_are_reported_or_rejected(tmp_path):
    write_csv(tmp_path / "labels" / "1.csv", [(0, 0, ["colon"])])
    write_csv(tmp_path / "labels" / "99.csv", [(0, 0, ["colon"])])
    write_png(tmp_path / "frames" / "1" / "frame_000000.PNG")
    write_png(tmp_path / "frames" / "2" / "frame_000000.PNG")
    with pytest.warns(UserWarning, match="video folders without a label CSV"):
        dl, report = build_galar_datalist(tmp_path / "frames", tmp_path / "labels", return_report=True)
    assert [d["video_id"] for d in dl] == ["1"]
    assert report.videos_without_labels == ["2"] and report.labels_without_frames == ["99"]
    with pytest.raises(FileNotFoundError, match=r"no label file for video\(s\) 2"):
        build_galar_datalist(tmp_path / "frames", tmp_path / "labels", videos=["1", "2"])
    with pytest.raises(FileNotFoundError, match=r"no frame folder for video\(s\) 7"):
        build_galar_datalist(tmp_path / "frames", tmp_path / "labels", videos=["7"])
    assert len(build_galar_datalist(tmp_path / "frames", tmp_path / "labels", videos=["1"])) == 1


# ------------------------------------------------------------------------------------------- images
def test_truncated_png_names_the_file(tmp_path):
    good = write_png(tmp_path / "frames" / "1" / "frame_000000.PNG")
    bad = write_png(tmp_path / "frames" / "1" / "frame_000001.PNG")
    data = bad.read_bytes()
    bad.write_bytes(data[: len(data) // 2])
    write_csv(tmp_path / "labels" / "1.csv", [(0, 0, ["colon"]), (1, 1, ["colon"])])
    verify_frames([good])
    with pytest.raises(ValueError, match=r"unreadable or truncated image file .*frame_000001\.PNG"):
        verify_frames([good, bad])
    with pytest.raises(ValueError, match=r"frame_000001\.PNG"):
        build_galar_datalist(tmp_path / "frames", tmp_path / "labels", check_images=True)
    # decoding is optional: without the check the datalist is built
    assert len(build_galar_datalist(tmp_path / "frames", tmp_path / "labels")) == 2


def test_header_check_finds_non_png(tmp_path):
    fake = tmp_path / "frame_000003.PNG"
    fake.write_bytes(b"GIF89a not a png")
    empty = tmp_path / "frame_000004.PNG"
    empty.write_bytes(b"")
    with pytest.raises(ValueError, match=r"frame_000003\.PNG.*bad signature"):
        verify_frames([fake], mode="header")
    with pytest.raises(ValueError, match=r"frame_000004\.PNG.*empty file"):
        verify_frames([empty], mode="header")


# ------------------------------------------------------------------------------------------- metadata
def test_read_metadata_tolerant_headers(tmp_path):
    a = tmp_path / "a.csv"
    a.write_text("Video ID;Capsule Type;age\n1;PillCam SB3;60\n02;Olympus;70\n")
    assert read_metadata(a) == {"1": "PillCam SB3", "02": "Olympus"}
    b = tmp_path / "b.csv"
    b.write_text("vid,cam\n5,PillCam COLON2\n")
    assert read_metadata(b) == {"5": "PillCam COLON2"}
    c = tmp_path / "c.csv"
    c.write_text("patient,age,sex\n1,3,f\n")
    with pytest.raises(ValueError, match=r"c\.csv: cannot find the video id column"):
        read_metadata(c)


def test_capsule_matches_numeric_ids_and_defaults_to_unknown(tmp_path):
    for vid in ("2", "3"):
        write_csv(tmp_path / "labels" / f"{vid}.csv", [(0, 0, ["colon"])])
        write_png(tmp_path / "frames" / vid / "frame_000000.PNG")
    dl = build_galar_datalist(tmp_path / "frames", tmp_path / "labels", {"02": "PillCam SB2"})
    assert [d["capsule"] for d in dl] == ["PillCam SB2", "unknown"]


# ------------------------------------------------------------------------------------------- inference
def test_inference_datalist(tmp_path):
    for f in (49, 7, 12):
        write_png(tmp_path / "ukdd_navi_00051" / f"frame_{f:07d}.png")
    write_png(tmp_path / "ukdd_navi_00052" / "frame_0000001.png")
    dl = build_inference_datalist(tmp_path, metadata_csv={"ukdd_navi_00051": "Olympus"})
    assert [(d["video_id"], d["frame_number"], d["frame_index"]) for d in dl] == [
        ("ukdd_navi_00051", 7, 7),
        ("ukdd_navi_00051", 12, 12),
        ("ukdd_navi_00051", 49, 49),
        ("ukdd_navi_00052", 1, 1),
    ]
    assert all("label" not in d for d in dl) and dl[0]["capsule"] == "Olympus" and dl[3]["capsule"] == "unknown"
    one = build_inference_datalist(tmp_path / "ukdd_navi_00051", frame_index="position")
    assert [(d["video_id"], d["frame_index"]) for d in one] == [("ukdd_navi_00051", i) for i in range(3)]
    only = build_inference_datalist(tmp_path, videos=["ukdd_navi_00052"])
    assert [d["video_id"] for d in only] == ["ukdd_navi_00052"]


# ------------------------------------------------------------------------------------------- ground truth
def test_build_ground_truth_label_set_runs(tmp_path):
    rows = [
        (0, 0, []),
        (1, 5, ["stomach"]),
        (2, 10, ["stomach"]),
        (3, 15, ["stomach", "pylorus"]),
        (4, 20, ["small intestine"]),
        (5, 25, ["small intestine"]),
        (7, 35, ["small intestine"]),  # index 6 missing: the event goes on (the challenge's rule)
    ]
    write_csv(tmp_path / "1.csv", rows)
    gt = build_ground_truth(tmp_path)
    assert gt == {
        "videos": [
            {
                "video_id": "1",
                "events": [
                    {"start": 0, "end": 0, "label": []},  # a row without labels: an empty event, as the challenge's
                    {"start": 1, "end": 2, "label": ["stomach"]},
                    {"start": 3, "end": 3, "label": ["pylorus", "stomach"]},  # names sorted, as the challenge's
                    {"start": 4, "end": 7, "label": ["small intestine"]},
                ],
            }
        ]
    }


def test_mini_galar_reads_back(mini_galar):
    dl, report = build_galar_datalist(
        mini_galar / "frames", mini_galar / "labels", mini_galar / "metadata.csv", return_report=True, strict=True
    )
    assert report.ok and len(dl) == 4 * 60
    by_video = {}
    for d in dl:
        by_video.setdefault(d["video_id"], []).append(d)
    assert list(by_video) == ["1", "2", "3", "ukdd_navi_00004"]
    for items in by_video.values():
        numbers = [d["frame_number"] for d in items]
        assert numbers == sorted(numbers) and [d["frame_index"] for d in items] == list(range(60))
    assert all(d["capsule"] != "unknown" for d in dl)
