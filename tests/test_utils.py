import os

import numpy as np
import pytest

from monai_vce.utils import OutputLock, atomic_save_npz, atomic_write_json


def test_atomic_json_roundtrip_and_no_temp_left(tmp_path):
    path = tmp_path / "sub" / "x.json"
    atomic_write_json(path, {"a": 1})
    assert path.read_text().strip().replace(" ", "").replace("\n", "") == '{"a":1}'
    assert [p.name for p in path.parent.iterdir()] == ["x.json"]


def test_failed_validation_keeps_previous_file(tmp_path):
    path = tmp_path / "x.json"
    atomic_write_json(path, {"v": 1})

    def reject(obj):
        raise ValueError("bad content")

    with pytest.raises(ValueError, match="bad content"):
        atomic_write_json(path, {"v": 2}, validate=reject)
    assert '"v": 1' in path.read_text()


def test_unserialisable_object_keeps_previous_file(tmp_path):
    path = tmp_path / "x.json"
    atomic_write_json(path, {"v": 1})
    with pytest.raises(TypeError):
        atomic_write_json(path, {"v": object()})
    assert '"v": 1' in path.read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.json"]


def test_atomic_npz(tmp_path):
    p = atomic_save_npz(tmp_path / "v.npz", probs=np.ones((3, 17), np.float32))
    with np.load(p) as z:
        assert z["probs"].shape == (3, 17)


def test_output_lock_is_shared_within_a_process_and_taken_over_when_stale(tmp_path):
    # another process holding the lock is refused: tests/hardening/test_faults.py runs real processes for that
    with OutputLock(tmp_path) as first:
        with OutputLock(tmp_path) as second:  # a second workflow of the same run
            assert first.held and second.held
        assert (tmp_path / OutputLock.name).is_file()  # still held by the first
    assert not (tmp_path / OutputLock.name).exists()
    # a lock file left by a killed run holds no lock and is taken over
    (tmp_path / OutputLock.name).write_text("999999999")
    with OutputLock(tmp_path) as lock:
        assert lock.path.read_text() == str(os.getpid())
    assert not (tmp_path / OutputLock.name).exists()


def test_atomic_write_uses_default_permissions(tmp_path):
    from monai_vce.utils import _UMASK

    p = atomic_write_json(tmp_path / "p.json", {})
    assert (p.stat().st_mode & 0o777) == (0o666 & ~_UMASK)
