"""Video-level splits: disjoint, complete, reproducible, stratified on rare labels."""

from __future__ import annotations

import random

import numpy as np
import pytest

from monai_vce.data import build_galar_datalist, group_by_video, kfold_videos, split_videos, video_label_presence
from monai_vce.data.splits import assign_video_groups
from monai_vce.labels import LABELS, label_index


def make_datalist(n_videos: int = 20, frames: int = 3) -> list[dict]:
    """Every video has small intestine; label k+8 (a pathology) sits in a few videos; 'ulcer' in exactly 2."""
    rng = np.random.default_rng(123)
    items = []
    for v in range(n_videos):
        vid = f"v{v}"
        present = {"small intestine"}
        for k, name in enumerate(LABELS[8:16]):
            if rng.random() < 0.15 + 0.05 * k:
                present.add(name)
        if v in (3, 14):
            present.add("ulcer")
        for f in range(frames):
            label = [0.0] * 17
            for name in present:
                if f == 0 or name == "small intestine":  # pathologies only on the first frame
                    label[label_index(name)] = 1.0
            items.append(
                {
                    "image": f"{vid}/{f}.png",
                    "label": label,
                    "video_id": vid,
                    "frame_index": f,
                    "frame_number": f,
                    "capsule": "PillCam SB3" if v % 4 else "Olympus",
                }
            )
    return items


def vids(datalist):
    return {d["video_id"] for d in datalist}


def test_group_by_video_and_presence():
    dl = make_datalist(12, 2)
    random.Random(0).shuffle(dl)
    groups = group_by_video(dl)
    assert list(groups) == [f"v{i}" for i in range(12)]  # natural order: v2 before v10
    assert all(len(g) == 2 for g in groups.values())
    ids, presence = video_label_presence(dl)
    assert ids == list(groups) and presence.shape == (12, 17)
    assert presence[:, label_index("small intestine")].all()
    assert presence[:, label_index("ulcer")].tolist() == [i in (3,) for i in range(12)]


def test_split_disjoint_complete_sized():
    dl = make_datalist(20)
    train, val = split_videos(dl, val_fraction=0.2, seed=0)
    assert vids(train).isdisjoint(vids(val))
    assert vids(train) | vids(val) == vids(dl)
    assert len(vids(val)) == 4 and len(train) + len(val) == len(dl)
    # items keep their original order
    assert train == [d for d in dl if d["video_id"] in vids(train)]


def test_split_rare_labels_on_both_sides():
    dl = make_datalist(20)
    _, presence = video_label_presence(dl)
    for seed in range(6):
        train, val = split_videos(dl, val_fraction=0.2, seed=seed)
        _, p_val = video_label_presence(val)
        _, p_train = video_label_presence(train)
        for c in np.flatnonzero(presence.sum(0) >= 2):
            assert p_val[:, c].any(), f"seed {seed}: {LABELS[c]} (in {presence[:, c].sum()} videos) missing from val"
            assert p_train[:, c].any(), f"seed {seed}: {LABELS[c]} missing from train"


def test_split_reproducible_and_order_independent():
    dl = make_datalist(20)
    a = split_videos(dl, 0.25, seed=7)
    shuffled = list(dl)
    random.Random(1).shuffle(shuffled)
    b = split_videos(shuffled, 0.25, seed=7)
    assert vids(a[1]) == vids(b[1])
    assert split_videos(dl, 0.25, seed=7) == a
    # the seed matters
    assert len({frozenset(vids(split_videos(dl, 0.25, seed=s)[1])) for s in range(8)}) > 1


def test_kfold_partition_and_spread():
    dl = make_datalist(20)
    ids, presence = video_label_presence(dl)
    vals = [vids(kfold_videos(dl, n_folds=5, fold=f, seed=3)[1]) for f in range(5)]
    assert sorted(len(v) for v in vals) == [4, 4, 4, 4, 4]
    assert set().union(*vals) == set(ids) and sum(len(v) for v in vals) == 20
    for f in range(5):
        train, val = kfold_videos(dl, n_folds=5, fold=f, seed=3)
        assert vids(train).isdisjoint(vids(val)) and vids(train) | vids(val) == set(ids)
    # a label in c videos reaches min(c, 5) folds
    for c in range(17):
        n = int(presence[:, c].sum())
        reached = sum(any(presence[ids.index(v), c] for v in fold) for fold in vals)
        assert reached == min(n, 5), LABELS[c]
    assert vals == [vids(kfold_videos(dl, n_folds=5, fold=f, seed=3)[1]) for f in range(5)]


def test_assign_video_groups_sizes_and_rare_first():
    presence = np.zeros((6, 2), dtype=bool)
    presence[[0, 1], 0] = True  # rare label: must be split over both groups
    presence[:, 1] = True
    group = assign_video_groups(presence, [4, 2], seed=0)
    assert np.bincount(group).tolist() == [4, 2]
    assert sorted(group[[0, 1]].tolist()) == [0, 1]
    with pytest.raises(ValueError, match="sum to the number of videos"):
        assign_video_groups(presence, [4, 1])


def test_split_errors():
    dl = make_datalist(4)
    with pytest.raises(ValueError, match="val_fraction"):
        split_videos(dl, 1.0)
    with pytest.raises(ValueError, match="at least 2 videos"):
        split_videos([d for d in dl if d["video_id"] == "v0"])
    with pytest.raises(ValueError, match="n_folds"):
        kfold_videos(dl, n_folds=5)
    with pytest.raises(ValueError, match="fold must be"):
        kfold_videos(dl, n_folds=2, fold=2)


def test_split_unlabeled_datalist():
    dl = [
        {"image": f"{v}/{f}", "video_id": str(v), "frame_index": f, "frame_number": f, "capsule": "x"}
        for v in range(5)
        for f in range(2)
    ]
    train, val = split_videos(dl, 0.4, seed=0)
    assert len(vids(val)) == 2 and vids(train).isdisjoint(vids(val))


def test_split_mini_galar(mini_galar):
    dl = build_galar_datalist(mini_galar / "frames", mini_galar / "labels", mini_galar / "metadata.csv")
    train, val = split_videos(dl, val_fraction=0.25, seed=0)
    assert len(vids(val)) == 1 and len(vids(train)) == 3 and vids(train).isdisjoint(vids(val))


def test_split_real_galar_label_presence(galar_events_path):
    """On the 80 real Galar videos every label of two or more videos lands on both sides, for several seeds."""
    import json

    videos = json.loads(galar_events_path.read_text())["videos"]
    dl = []
    for v in videos:
        present = {name for e in v["events"] for name in e["label"]}
        dl.append(
            {
                "image": "",
                "label": [float(n in present) for n in LABELS],
                "video_id": v["video_id"],
                "frame_index": 0,
                "frame_number": 0,
                "capsule": "unknown",
            }
        )
    ids, presence = video_label_presence(dl)
    assert len(ids) == 80
    for seed in range(3):
        train, val = split_videos(dl, val_fraction=0.2, seed=seed)
        assert len(val) == 16
        _, pv = video_label_presence(val)
        _, pt = video_label_presence(train)
        assert pv.any(0).all() and pt.any(0).all()  # every label has >= 13 videos in Galar
    vals = [vids(kfold_videos(dl, n_folds=5, fold=f, seed=0)[1]) for f in range(5)]
    for c in range(17):
        assert sum(any(presence[ids.index(v), c] for v in fold) for fold in vals) == 5, LABELS[c]


def test_subsample_frames_keeps_every_nth_frame_file_of_each_video():
    """The authors' epoch: ``frame_files[::5]`` of each video in frame-number order, whatever the datalist order."""
    from monai_vce.data import subsample_frames

    data = [{"video_id": "v2", "frame_number": n} for n in (9, 0, 3, 6, 1, 2, 4, 5, 7, 8)]
    data += [{"video_id": "v1", "frame_index": n} for n in range(7)]
    kept = subsample_frames(data, stride=3)
    assert [(d["video_id"], d.get("frame_number", d.get("frame_index"))) for d in kept] == [
        ("v2", 9),
        ("v2", 0),
        ("v2", 3),
        ("v2", 6),
        ("v1", 0),
        ("v1", 3),
        ("v1", 6),
    ]
    assert all(a is b for a, b in zip(subsample_frames(data, 1), data, strict=True))
    for bad in (0, -2, 1.5, True):
        with pytest.raises(ValueError, match="frame stride"):
            subsample_frames(data, bad)
    with pytest.raises(ValueError, match="video v3: a frame has neither"):
        subsample_frames([{"video_id": "v3"}], 2)


def test_leave_one_capsule_out():
    from monai_vce.data import video_capsules

    data = [
        {"video_id": v, "capsule": c, "frame_index": i, "label": [0.0] * len(LABELS)}
        for v, c in (("a", "PillCam SB3"), ("b", "NaviCam"), ("c", "PillCam SB3"), ("d", "NaviCam"), ("e", None))
        for i in range(3)
    ]
    assert video_capsules(data) == {
        "a": "PillCam SB3",
        "b": "NaviCam",
        "c": "PillCam SB3",
        "d": "NaviCam",
        "e": "unknown",
    }
    train, val = split_videos(data, held_out_capsule="NaviCam")
    assert {d["video_id"] for d in val} == {"b", "d"} and {d["video_id"] for d in train} == {"a", "c", "e"}
    assert len(train) + len(val) == len(data)
    with pytest.raises(ValueError, match=r"'OMOM': no video .*capsules: \['NaviCam', 'PillCam SB3', 'unknown'\]"):
        split_videos(data, held_out_capsule="OMOM")
    with pytest.raises(ValueError, match="every video"):
        split_videos([d for d in data if d["video_id"] in ("b", "d")], held_out_capsule="NaviCam")


def test_the_bundle_setting_leaves_a_capsule_out(mini_galar, tmp_path):
    from bundle_helpers import TRAIN, tiny_config_parser

    from monai_vce.data import video_capsules

    parser = tiny_config_parser([TRAIN], mini_galar, tmp_path)
    caps = video_capsules(parser.get_parsed_content("datalist"))
    held = sorted(set(caps.values()))[0]
    parser = tiny_config_parser([TRAIN], mini_galar, tmp_path, held_out_capsule=held)
    train, val = parser.get_parsed_content("split")
    assert {d["video_id"] for d in val} == {v for v, c in caps.items() if c == held}
    assert {d["video_id"] for d in train} == {v for v, c in caps.items() if c != held}
