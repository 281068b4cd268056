"""Hardening of the readers of refiner, checkpoint and decoder files (issue 25).

Nothing a file names is imported, sizes a file declares are checked before anything is built, every weights file the
project writes carries a checksum that is checked on load, and no mutation of a file ends in anything but a result or
a one-line ``ValueError``.
"""

from __future__ import annotations

import io
import json
import logging
import sys
import textwrap

import pytest
import torch
from capped import TORCH_CAP_MB, python_capped

from monai_vce.handlers.checkpoint import AtomicDiskSaver, VCECheckpointLoader
from monai_vce.temporal.refiner import RefinerEnsemble, TemporalRefiner, load_refiner_file

TINY = {"_target_": "MultiStageTCN", "stages": 1, "layers": 2, "channels": 4, "dropout": 0.0}


def _one_line(e: pytest.ExceptionInfo) -> str:
    text = str(e.value)
    assert "\n" not in text, text
    return text


def _rewrite(path, payload) -> None:
    """Write ``payload`` as a refiner file from elsewhere (plain ``torch.save``, no checksum)."""
    buf = io.BytesIO()
    torch.save(payload, buf)
    path.write_bytes(buf.getvalue())


def _with_config(tmp_path, change) -> object:
    good = TemporalRefiner(network=dict(TINY)).save(tmp_path / "good.pt")
    payload = torch.load(good, weights_only=True)
    config = json.loads(payload["config"])
    change(config)
    payload["config"] = json.dumps(config)
    path = tmp_path / "changed.pt"
    _rewrite(path, payload)
    return path


# ---------------------------------------------------------------- 1. nothing a file names is imported
@pytest.mark.parametrize("target", ["vce_marker_module.Refiner", "antigravity.X", "this.Refiner"])
def test_refiner_target_is_never_imported(tmp_path, monkeypatch, target):
    marker = tmp_path / "imported.txt"
    (tmp_path / "vce_marker_module.py").write_text(
        textwrap.dedent(
            f"""
            import pathlib
            pathlib.Path({str(marker)!r}).write_text("imported")
            import torch
            class Refiner(torch.nn.Module):
                def __init__(self, **kw):
                    super().__init__()
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    before = set(sys.modules)
    path = _with_config(tmp_path, lambda c: c["network"].update({"_target_": target}))
    with pytest.raises(ValueError, match="not a refinement network of this project") as e:
        load_refiner_file(path)
    assert "changed.pt" in _one_line(e)
    assert not marker.exists()
    assert not {"vce_marker_module", "antigravity", "this"} & (set(sys.modules) - before)


def test_a_file_names_its_network_by_its_key(tmp_path):
    # one name per network: its NETWORKS key, mapped, never imported; no class path is read
    refiner = TemporalRefiner(network=TINY)
    config = refiner.get_config()
    assert config["network"]["_target_"] == "MultiStageTCN"
    loaded = TemporalRefiner.load(refiner.save(tmp_path / "r.pt"))
    assert loaded.get_config() == config
    for path in ("monai_vce.temporal.MultiStageTCN", "monai_vce.temporal.networks.MultiStageTCN"):
        with pytest.raises(ValueError, match="not a refinement network of this project"):
            TemporalRefiner(network={**TINY, "_target_": path})


# ---------------------------------------------------------------- 3. sizes checked before anything is built
def test_huge_declared_sizes_are_refused_before_allocation(tmp_path):
    # a file of a few kB declaring a network of hundreds of GB; the child's peak memory must stay small
    path = _with_config(tmp_path, lambda c: c["network"].update({"channels": 4096, "layers": 64, "stages": 64}))
    code = textwrap.dedent(
        """
        import resource, sys
        from monai_vce.temporal.refiner import load_refiner_file
        base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        try:
            load_refiner_file(sys.argv[1])
        except ValueError as e:
            print("REFUSED", str(e).replace(chr(10), " "))
        grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base
        print("GROWN_KB", grown)
        """
    )
    result = python_capped(code, str(path), limit_mb=TORCH_CAP_MB)
    assert "REFUSED" in result.stdout, result.stdout + result.stderr
    assert "changed.pt" in result.stdout and "shape" in result.stdout
    grown = int(result.stdout.split("GROWN_KB")[1].split()[0])
    assert grown < 300 * 1024, f"the loader grew by {grown} kB before refusing"


@pytest.mark.parametrize(
    "key, value",
    [("channels", 10**9), ("layers", -1), ("kernel_size", "3"), ("dropout", float("nan")), ("residual", "abc")],
)
def test_out_of_range_sizes_are_refused_with_one_line(tmp_path, key, value):
    path = _with_config(tmp_path, lambda c: c["network"].update({key: value}))
    with pytest.raises(ValueError, match=key) as e:
        load_refiner_file(path)
    assert "changed.pt" in _one_line(e)


# ---------------------------------------------------------------- listed defects
def test_refiner_file_without_label_list_is_refused(tmp_path):
    path = _with_config(tmp_path, lambda c: c.pop("labels"))
    with pytest.raises(ValueError, match="no label list") as e:
        TemporalRefiner.load(path)
    assert "changed.pt" in _one_line(e)


def test_empty_refiner_file_is_one_line(tmp_path):
    (tmp_path / "empty.pt").write_bytes(b"")
    with pytest.raises(ValueError, match=r"empty\.pt is empty") as e:
        load_refiner_file(tmp_path / "empty.pt")
    _one_line(e)


def test_missing_decoder_params_file_is_an_error(tmp_path):
    from monai_vce.postprocessing.decoder import load_decoder

    with pytest.raises(FileNotFoundError, match=r"missing\.json") as e:
        load_decoder(tmp_path / "missing.json", tmp_path / "decoder.json")
    _one_line(e)
    assert load_decoder("default") is not None  # the default chain, asked for explicitly
    with pytest.warns(UserWarning, match="decoding with the default"):  # the bundle's own, not tuned yet
        load_decoder(tmp_path / "decoder.json", tmp_path / "decoder.json")


# ---------------------------------------------------------------- 4. integrity
def _flip_tensor_byte(path, tensor: torch.Tensor) -> None:
    data = bytearray(path.read_bytes())
    at = data.find(tensor.detach().contiguous().numpy().tobytes()[:32])
    assert at > 0, "the tensor's bytes are not in the file"
    data[at + 5] ^= 0x10
    path.write_bytes(bytes(data))


def test_flipped_byte_in_refiner_file_is_refused(tmp_path):
    refiner = TemporalRefiner(network=dict(TINY))
    path = refiner.save(tmp_path / "refiner.pt")
    from monai_vce.utils import check_torch_seal  # here, so that the other tests also run on older code

    assert check_torch_seal(path, "refiner file")
    weight = next(v for k, v in refiner.state_dict().items() if k.endswith("weight") and v.numel() >= 16)
    _flip_tensor_byte(path, weight)
    with pytest.raises(ValueError, match="damaged") as e:
        load_refiner_file(path)
    assert "refiner.pt" in _one_line(e)


def test_flipped_byte_in_ensemble_file_is_refused(tmp_path):
    members = [TemporalRefiner(network=dict(TINY)) for _ in range(2)]
    path = RefinerEnsemble(members).save(tmp_path / "ensemble.pt")
    _flip_tensor_byte(path, members[1].state_dict()["network.stages.0.conv_in.weight"])
    with pytest.raises(ValueError, match="damaged") as e:
        load_refiner_file(path)
    assert "ensemble.pt" in _one_line(e)


def test_checkpoint_checksum_survives_monai_loading_and_catches_a_flipped_byte(tmp_path):
    net = torch.nn.Linear(8, 4)
    AtomicDiskSaver(tmp_path)({k: v.clone() for k, v in net.state_dict().items()}, "model.pt")
    path = tmp_path / "model.pt"
    # MONAI's CheckpointLoader, ckpt_export and the demo read it with plain torch.load
    plain = torch.load(path, weights_only=True)
    assert set(plain) == {"weight", "bias"} and torch.equal(plain["weight"], net.weight)
    VCECheckpointLoader(str(path), {"model": torch.nn.Linear(8, 4)}).check()
    _flip_tensor_byte(path, net.weight)
    with pytest.raises(ValueError, match="damaged") as e:
        VCECheckpointLoader(str(path), {"model": torch.nn.Linear(8, 4)}).check()
    assert "model.pt" in _one_line(e)


def test_files_from_elsewhere_are_read_with_a_note(tmp_path, caplog):
    refiner = TemporalRefiner(network=dict(TINY))
    path = tmp_path / "foreign.pt"
    _rewrite(path, refiner.payload())
    torch.save(torch.nn.Linear(8, 4).state_dict(), tmp_path / "foreign_model.pt")
    with caplog.at_level(logging.WARNING, logger="monai_vce"):
        load_refiner_file(path)
        VCECheckpointLoader(str(tmp_path / "foreign_model.pt"), {"model": torch.nn.Linear(8, 4)}).check()
    notes = [r.getMessage() for r in caplog.records if "no monai_vce checksum" in r.getMessage()]
    assert len(notes) == 2 and "foreign.pt" in notes[0]


# ---------------------------------------------------------------- 9. fuzz: a result or one ValueError line
hypothesis = pytest.importorskip("hypothesis")  # the `test` extra installs it
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from monai_vce.networks.backbone import read_torch_file  # noqa: E402
from monai_vce.postprocessing.params import DecoderParams  # noqa: E402

#: Per example: the CPU time a reader may take (seconds), and its peak memory growth (kB of max RSS).
EXAMPLE_SECONDS = 5.0
FUZZ = settings(
    max_examples=40,
    derandomize=True,
    deadline=None,  # timed by the test itself
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture, HealthCheck.data_too_large],
)
_flips = st.lists(st.tuples(st.floats(0.0, 1.0, exclude_max=True), st.integers(1, 255)), min_size=1, max_size=8)
_json = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=8,
)


def _mutate(data: bytes, flips, cut: float) -> bytes:
    if cut == 0.0:
        return b""  # a save or copy cut short before its first byte
    out = bytearray(data[: max(1, int(len(data) * cut))])
    for where, xor in flips:
        out[int(where * len(out))] ^= xor
    return bytes(out)


def _result_or_one_line(read, path) -> None:
    import resource
    import time

    start = time.process_time()
    try:
        read(path)
    except ValueError as e:
        assert str(e) and "\n" not in str(e), repr(e)
    assert time.process_time() - start < EXAMPLE_SECONDS
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss < 6 * 1024**2  # kB: nothing near the memory cap


@pytest.fixture(scope="module")
def originals(tmp_path_factory):
    folder = tmp_path_factory.mktemp("originals")
    refiner = TemporalRefiner(network=dict(TINY))
    buf = io.BytesIO()
    torch.save(refiner.payload(), buf)  # unsealed: mutations reach the parser, not only the checksum
    ckpt = io.BytesIO()
    torch.save(torch.nn.Linear(8, 4).state_dict(), ckpt)
    DecoderParams.paper().save(folder / "decoder.json")
    return {
        "refiner": buf.getvalue(),
        "payload": refiner.payload(),
        "checkpoint": ckpt.getvalue(),
        "decoder": (folder / "decoder.json").read_bytes(),
    }


@FUZZ
@given(flips=_flips, cut=st.sampled_from([1.0, 1.0, 0.9, 0.5, 0.1, 0.0]))
def test_fuzz_refiner_file_bytes(tmp_path, originals, flips, cut):
    path = tmp_path / "refiner.pt"
    path.write_bytes(_mutate(originals["refiner"], flips, cut))
    _result_or_one_line(load_refiner_file, path)


@FUZZ
@given(
    where=st.sampled_from(["config", "network"]), key=st.text(max_size=12) | st.sampled_from(sorted(TINY)), value=_json
)
def test_fuzz_refiner_file_config(tmp_path, originals, where, key, value):
    payload = dict(originals["payload"])
    config = json.loads(payload["config"])
    (config if where == "config" else config["network"])[key] = value
    try:
        payload["config"] = json.dumps(config)
    except ValueError:  # not representable as JSON text (NaN is; a circular value is not generated)
        return
    path = tmp_path / "refiner.pt"
    _rewrite(path, payload)
    _result_or_one_line(load_refiner_file, path)


@FUZZ
@given(flips=_flips, cut=st.sampled_from([1.0, 1.0, 0.9, 0.5, 0.1, 0.0]))
def test_fuzz_checkpoint_bytes(tmp_path, originals, flips, cut):
    path = tmp_path / "model.pt"
    path.write_bytes(_mutate(originals["checkpoint"], flips, cut))
    _result_or_one_line(lambda p: VCECheckpointLoader(str(p), {"model": torch.nn.Linear(8, 4)}).check(), path)
    _result_or_one_line(read_torch_file, path)


@FUZZ
@given(flips=_flips, cut=st.sampled_from([1.0, 1.0, 0.9, 0.5, 0.0]))
def test_fuzz_decoder_file_bytes(tmp_path, originals, flips, cut):
    path = tmp_path / "decoder.json"
    path.write_bytes(_mutate(originals["decoder"], flips, cut))
    _result_or_one_line(DecoderParams.load, path)


def test_flipped_byte_in_text_embeddings_is_refused(tmp_path):
    from monai_vce.labels import LABELS
    from monai_vce.networks.text_embeddings import load_text_embeddings, save_text_embeddings

    emb = torch.randn(len(LABELS), 32)
    path = save_text_embeddings({"labels": list(LABELS), "embeddings": emb}, tmp_path / "text_embeddings.pt")
    assert load_text_embeddings(path).shape == emb.shape
    _flip_tensor_byte(path, emb)
    with pytest.raises(ValueError, match="damaged") as e:
        load_text_embeddings(path)
    assert "text_embeddings.pt" in _one_line(e)
