"""``python -m monai_vce check-backbone`` on BiomedCLIP-shaped snapshots with random weights (the hub's file layout)."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import math
import shutil
from pathlib import Path

import pytest
import torch

from monai_vce.__main__ import main
from monai_vce.labels import LABELS
from monai_vce.networks import check
from monai_vce.networks.backbone import save_tiny_local_dir
from monai_vce.networks.diff_attention import ATTENTION_VARIANTS, convert_to_diff_attention, find_vit_blocks
from monai_vce.networks.text_embeddings import save_text_embeddings

_BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "check_backbone.py"
_spec = importlib.util.spec_from_file_location("bench_check_backbone", _BENCH)
assert _spec is not None and _spec.loader is not None
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)


def _cli(*argv: object) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["check-backbone", *(str(a) for a in argv)])
    return code, out.getvalue(), err.getvalue()


def _error_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("error: ")]


@pytest.fixture(scope="module")
def snapshot(tmp_path_factory) -> Path:
    """BiomedCLIP's config (PubMedBERT text config) and file layout, a toy-size ViT and BERT, random weights."""
    return bench.write_biomedclip_shaped(tmp_path_factory.mktemp("biomedclip") / "snapshot", "small")


@pytest.fixture(scope="module")
def embeddings(tmp_path_factory) -> Path:
    tensor = torch.nn.functional.normalize(torch.randn(len(LABELS), 32), dim=-1)
    return save_text_embeddings({"labels": list(LABELS), "embeddings": tensor}, tmp_path_factory.mktemp("e") / "t.pt")


def _expected_added(folder: Path, variant: str) -> int:
    """Parameters the conversion adds, counted on a tower built from the file by open_clip itself."""
    from open_clip.model import _build_vision_tower

    cfg = json.loads((folder / "open_clip_config.json").read_text())["model_cfg"]
    visual = _build_vision_tower(cfg["embed_dim"], cfg["vision_cfg"])
    convert_to_diff_attention(visual, variant=variant)
    return sum(
        p.numel()
        for block in find_vit_blocks(visual)
        for name, p in block.attn.named_parameters()
        if "lambda" in name or "sub_norm" in name
    )


def test_report_values_and_exit_0(snapshot, embeddings):
    code, out, err = _cli(f"local-dir:{snapshot}", "--text-embeddings", embeddings, "--json")
    assert code == 0, err
    assert not _error_lines(err)
    report = json.loads(out)
    state = torch.load(snapshot / "open_clip_pytorch_model.bin", weights_only=True)
    visual_params = sum(v.numel() for k, v in state.items() if k.startswith("visual."))
    assert report["tower"]["params"] == visual_params
    assert report["tower"]["checkpoint_dtypes"] == ["float32"] and report["tower"]["tower_dtype"] == "float32"
    assert report["tower"]["logit_scale"] == pytest.approx(math.log(100.0))
    rows = {v["variant"]: v for v in report["variants"]}
    assert list(rows) == list(ATTENTION_VARIANTS)  # every variant the project has, in its order
    for variant, row in rows.items():
        added = _expected_added(snapshot, variant)
        assert added > 0 and row["added_params"] == added, variant
        assert row["params"] == visual_params + added
        assert row["blocks"] == 2
    assert rows["preserving"]["max_abs_diff_at_lambda_0"] <= 1e-5 and rows["preserving"]["ok"] is True
    if "authors" in rows:
        assert rows["authors"]["max_abs_diff_at_lambda_0"] <= 1e-5 and rows["authors"]["ok"] is True
    for variant in set(rows) - set(check.LAMBDA_ZERO_EXACT):  # not the pretrained function: not measured
        assert rows[variant]["ok"] is None and rows[variant]["max_abs_diff_at_lambda_0"] is None
    assert report["text_embeddings"] == {"path": str(embeddings), "ok": True}
    assert report["missing"] == [] and report["ready"] is True
    text = {row["part"]: row for row in report["text"]}
    n_text = sum(1 for k in state if k.startswith("text."))
    assert text["text weights"]["found"].startswith(f"{n_text} tensors")


def test_a_broken_conversion_fails(snapshot, embeddings, monkeypatch):
    """A variant listed as exact at lambda = 0 that is not (here: ``paper``) fails the check, naming it."""
    monkeypatch.setattr(check, "LAMBDA_ZERO_EXACT", frozenset({"preserving", "paper"}))
    code, _, err = _cli(f"local-dir:{snapshot}", "--text-embeddings", embeddings)
    (line,) = _error_lines(err)
    assert code == 2 and "the paper conversion at lambda = 0 differs from the tower by" in line


def test_table(snapshot, embeddings):
    code, out, _ = _cli(f"local-dir:{snapshot}", "--text-embeddings", embeddings)
    assert code == 0
    for variant in ATTENTION_VARIANTS:
        assert f"\n{variant} " in out
    assert "logit_scale  4.6052 (exp: 100.00)" in out and out.rstrip().endswith("training can start")


def test_text_parts_absent_exit_2_names_them(snapshot, monkeypatch):
    monkeypatch.setattr(check, "_has_transformers", lambda: False)
    code, out, err = _cli(f"local-dir:{snapshot}")
    assert code == 2
    (line,) = _error_lines(err)
    assert line.startswith(f"error: local-dir:{snapshot}: training cannot start: ")
    assert "transformers package" in line
    assert "config.json of microsoft/BiomedNLP-BiomedBERT-base-uncased-abstract" in line
    assert f"vocab.txt of the tokenizer microsoft/BiomedNLP-BiomedBERT-base-uncased-abstract in {snapshot}" in line
    assert "text-tower weights" not in line  # the checkpoint has them
    assert "MISSING" in out  # the table says it too


def test_text_weights_absent(snapshot, embeddings, tmp_path):
    folder = tmp_path / "visual_only"
    folder.mkdir()
    shutil.copy(snapshot / "open_clip_config.json", folder)
    state = torch.load(snapshot / "open_clip_pytorch_model.bin", weights_only=True)
    torch.save({k: v for k, v in state.items() if k.startswith("visual.")}, folder / "open_clip_pytorch_model.bin")
    code, _, err = _cli(f"local-dir:{folder}", "--json")
    (line,) = _error_lines(err)
    assert code == 2 and "the text-tower weights (no keys but visual.*" in line
    # an embeddings file makes the text tower unnecessary
    code, out, _ = _cli(f"local-dir:{folder}", "--json", "--text-embeddings", embeddings)
    assert code == 0 and json.loads(out)["tower"]["logit_scale"] is None


def test_wrong_embeddings_width(snapshot, tmp_path):
    bad = save_text_embeddings({"labels": list(LABELS), "embeddings": torch.randn(len(LABELS), 8)}, tmp_path / "b.pt")
    code, _, err = _cli(f"local-dir:{snapshot}", "--text-embeddings", bad)
    (line,) = _error_lines(err)
    assert code == 2 and "text embeddings are not usable" in line and "(17, 32)" in line


def test_text_parts_present(snapshot, tmp_path):
    pytest.importorskip("transformers")
    folder = tmp_path / "with_tokenizer"
    shutil.copytree(snapshot, folder)
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "video", "capsule", "image", "showing"]
    (folder / "vocab.txt").write_text("\n".join(words) + "\n")
    (folder / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "BertTokenizer"}))
    bert = tmp_path / "biomedbert"
    bert.mkdir()
    config = {"model_type": "bert", "hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2}
    (bert / "config.json").write_text(json.dumps(config))
    code, out, err = _cli(f"local-dir:{folder}", "--text-config", bert, "--json")
    assert code == 0, err
    found = {row["part"]: row["found"] for row in json.loads(out)["text"]}
    assert found["text config"] == str(bert / "config.json") and found["tokenizer"] == str(folder / "vocab.txt")
    # a config transformers cannot read is named with the reason
    (bert / "config.json").write_text(json.dumps({"model_type": "no-such-model"}))
    code, _, err = _cli(f"local-dir:{folder}", "--text-config", bert)
    (line,) = _error_lines(err)
    assert code == 2 and f"a text config transformers can read ({bert / 'config.json'}" in line


def test_tiny_model_and_checkpoint_file(tmp_path):
    folder = save_tiny_local_dir(tmp_path / "tiny")
    code, out, _ = _cli(f"local-dir:{folder}", "--json")  # built-in text tower and tokenizer: nothing missing
    assert code == 0 and json.loads(out)["ready"]
    code, out, _ = _cli(folder / "open_clip_pytorch_model.bin", "--json")  # a file; its config beside it
    report = json.loads(out)
    assert code == 0 and report["checkpoint"] == str(folder / "open_clip_pytorch_model.bin")
    folder = save_tiny_local_dir(tmp_path / "tiny_safetensors", safetensors=True)
    code, out, _ = _cli(f"local-dir:{folder}", "--json")
    report = json.loads(out)
    assert code == 0 and report["tower"]["checkpoint_dtypes"] == ["float32"] and report["text"][0]["found"]


def test_bad_input_is_one_line(tmp_path):
    code, out, err = _cli(f"local-dir:{tmp_path / 'absent'}")
    assert code == 2 and out == "" and err.startswith("error: backbone folder not found") and len(err.splitlines()) == 1
    code, _, err = _cli(f"local-dir:{tmp_path}", "--batch-size", "0")
    assert code == 2 and len(_error_lines(err)) == 1
