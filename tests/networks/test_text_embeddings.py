"""Label-prompt text embeddings: CLI with the tiny open_clip model, averaging of prompt variants, file validation."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

open_clip = pytest.importorskip("open_clip")

from monai_vce.labels import LABELS, PROMPT_TEMPLATES, all_prompts  # noqa: E402
from monai_vce.networks import TINY_MODEL_NAME, create_tiny_open_clip, save_tiny_checkpoint, save_tiny_local_dir  # noqa: E402
from monai_vce.networks.backbone import BIOMEDCLIP_CONFIG  # noqa: E402
from monai_vce.networks.text_embeddings import _require_text_tower, load_text_embeddings, main  # noqa: E402


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny_text")
    save_tiny_local_dir(root / "local", seed=5)
    save_tiny_checkpoint(root / "tiny.safetensors", seed=5)
    return root


def _expected(seed: int) -> torch.Tensor:
    """Independent recomputation: embed every variant, normalise, average per label, normalise again."""
    model = create_tiny_open_clip(seed)
    tokenizer = open_clip.get_tokenizer(TINY_MODEL_NAME)
    rows = []
    with torch.no_grad():
        for label in LABELS:
            emb = model.encode_text(tokenizer(all_prompts()[label]))
            rows.append(F.normalize(emb, dim=-1).mean(0))
    return F.normalize(torch.stack(rows), dim=-1)


def test_cli_local_dir_and_checkpoint_file(tiny, capsys):
    out_dir = tiny / "out_dir.pt"
    assert main(["--model", f"local-dir:{tiny / 'local'}", "--out", str(out_dir)]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary == {"out": str(out_dir), "model": f"local-dir:{tiny / 'local'}", "labels": 17, "embed_dim": 32}
    saved = torch.load(out_dir, weights_only=True)
    assert saved["labels"] == list(LABELS) and saved["prompts"] == all_prompts()
    assert saved["embeddings"].dtype == torch.float32 and saved["embeddings"].shape == (17, 32)
    expected = _expected(seed=5)
    torch.testing.assert_close(saved["embeddings"], expected, atol=1e-6, rtol=0)
    torch.testing.assert_close(saved["embeddings"].norm(dim=1), torch.ones(17))

    out_file = tiny / "out_file.pt"
    assert (
        main(["--model", str(tiny / "tiny.safetensors"), "--model-name", TINY_MODEL_NAME, "--out", str(out_file)]) == 0
    )
    torch.testing.assert_close(load_text_embeddings(out_file, embed_dim=32), expected, atol=1e-6, rtol=0)
    # another seed gives other embeddings: the comparison above can fail
    assert (_expected(seed=6) - expected).abs().max() > 1e-3


def test_cli_errors_are_messages(tiny, capsys):
    assert main(["--model", str(tiny / "absent.bin"), "--out", str(tiny / "x.pt")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "absent.bin" in err[0], err
    assert not (tiny / "x.pt").exists()


def test_hf_text_tower_without_transformers_is_a_clear_error(monkeypatch):
    real = importlib.util.find_spec
    # transformers absent, whether or not this environment has it
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "transformers" else real(name, *a)
    )
    with pytest.raises(RuntimeError, match="pip install transformers"):
        _require_text_tower(BIOMEDCLIP_CONFIG["model_cfg"], "hf-hub:microsoft/BiomedCLIP")


def test_load_validation(tmp_path):
    plain = tmp_path / "plain.pt"
    torch.save(torch.randn(17, 8) * 3, plain)
    loaded = load_text_embeddings(plain)
    torch.testing.assert_close(loaded.norm(dim=1), torch.ones(17))
    with pytest.raises(ValueError, match=r"plain\.pt.*\(17, 16\)"):
        load_text_embeddings(plain, embed_dim=16)
    renamed = tmp_path / "renamed.pt"
    torch.save({"labels": ["tumour", *LABELS[1:]], "embeddings": torch.randn(17, 8)}, renamed)
    with pytest.raises(ValueError, match=r"renamed\.pt.*unexpected: \['tumour'\].*missing: \['mouth'\]"):
        load_text_embeddings(renamed)
    nan = tmp_path / "nan.pt"
    bad = torch.randn(17, 8)
    bad[2, 1] = float("nan")
    torch.save(bad, nan)
    with pytest.raises(ValueError, match=r"nan\.pt.*non-finite"):
        load_text_embeddings(nan)
    pickled = tmp_path / "pickled.pt"
    torch.save({"embeddings": torch.randn(17, 8), "extra": object()}, pickled)
    with pytest.raises(ValueError, match=r"cannot read text embeddings .*pickled\.pt"):
        load_text_embeddings(pickled)
    with pytest.raises(FileNotFoundError, match=r"absent.pt"):
        load_text_embeddings(tmp_path / "absent.pt")


def _hub_layout_text_tower(root):
    """A tiny BERT in the hub layout of BiomedBERT (config.json, vocab.txt, tokenizer_config.json) and a tiny CLIP
    folder in BiomedCLIP's (open_clip_config.json whose text tower is that hub repo, open_clip_pytorch_model.bin)."""
    import re

    from transformers import BertConfig

    from monai_vce.networks.backbone import TINY_CONFIG
    from monai_vce.networks.text_embeddings import BIOMEDBERT_HUB_ID

    bert = root / "BiomedNLP-BiomedBERT-base-uncased-abstract"
    bert.mkdir(parents=True)
    words = sorted(
        {w for v in all_prompts().values() for p in v for w in re.findall(r"[a-z0-9]+|[^a-z0-9\s]", p.lower())}
    )
    (bert / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words]) + "\n")
    (bert / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": True, "model_max_length": 512}))
    BertConfig(
        vocab_size=5 + len(words),
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=48,
        max_position_embeddings=64,
        initializer_range=0.5,  # large random weights: each prompt's tokens move its embedding
    ).save_pretrained(bert)
    text_cfg = {
        "hf_model_name": BIOMEDBERT_HUB_ID,
        "hf_tokenizer_name": BIOMEDBERT_HUB_ID,
        "hf_proj_type": "mlp",
        "hf_pooler_type": "cls_last_hidden_state_pooler",
        "context_length": 32,
    }
    model_cfg = {"embed_dim": 32, "vision_cfg": TINY_CONFIG["model_cfg"]["vision_cfg"], "text_cfg": text_cfg}
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(3)
        model = open_clip.CustomTextCLIP(
            **{**model_cfg, "text_cfg": {**text_cfg, "hf_model_name": str(bert), "hf_model_pretrained": False}}
        ).eval()
    clip = root / "BiomedCLIP"
    save_tiny_checkpoint(clip / "open_clip_pytorch_model.bin", model=model)
    (clip / "open_clip_config.json").write_text(
        json.dumps({"model_cfg": model_cfg, "preprocess_cfg": TINY_CONFIG["preprocess_cfg"]})
    )
    return clip, bert, model


@pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="needs the text extra (transformers)")
def test_offline_from_a_local_clip_folder_and_a_local_bert_folder(tmp_path, monkeypatch, capsys):
    import huggingface_hub.constants as hub
    from open_clip.tokenizer import HFTokenizer

    from monai_vce.networks import DiffAttnCLIPClassifier
    from monai_vce.utils import check_torch_seal

    # offline, with an empty cache: in this process (hub constants are read at import) and in the command's
    empty = tmp_path / "empty_hf_home"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(empty), "HF_HUB_CACHE": str(empty / "hub")}
    monkeypatch.setattr(hub, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(hub, "HF_HUB_CACHE", str(empty / "hub"))
    clip, bert, model = _hub_layout_text_tower(tmp_path)
    out = tmp_path / "models" / "text_embeddings.pt"
    argv = ["--model", f"local-dir:{clip}", "--out", str(out)]

    # without the BiomedBERT folder: one line naming the hub repo and what to pass
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "microsoft/BiomedNLP-BiomedBERT-base-uncased-abstract" in err[0], err
    assert "--text-config" in err[0] and not out.exists()
    # a BiomedBERT folder that is not there: one line naming it
    assert main([*argv, "--text-config", str(tmp_path / "no_bert")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: text config folder not found") and "no_bert" in err[0], err
    # a folder without the config or without a tokenizer: one line naming what is missing
    (tmp_path / "empty").mkdir()
    assert main([*argv, "--text-config", str(tmp_path / "empty")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "config.json" in err[0] and "empty" in err[0], err

    # the command line itself, offline
    command = [sys.executable, "-m", "monai_vce", "text-embeddings", *argv, "--text-config", str(bert)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["embed_dim"] == 32 and summary["labels"] == 17
    assert check_torch_seal(out, "text embeddings") is True  # sealed
    tokenizer = HFTokenizer(str(bert), context_length=32)
    with torch.no_grad():
        rows = [F.normalize(model.encode_text(tokenizer(all_prompts()[lb])), dim=-1).mean(0) for lb in LABELS]
    expected = F.normalize(torch.stack(rows), dim=-1)
    torch.testing.assert_close(load_text_embeddings(out, embed_dim=32), expected, atol=1e-6, rtol=0)
    assert (expected[0] - expected[1]).abs().max() > 1e-3  # the labels' prompts give different rows

    # a Hugging Face cache holding the repository works the same (hub/models--org--name/snapshots/<rev>/)
    repo = tmp_path / "hf_cache" / "hub" / "models--microsoft--BiomedNLP-BiomedBERT-base-uncased-abstract"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("abc123")
    (repo / "snapshots").mkdir()
    bert.rename(repo / "snapshots" / "abc123")
    cached = tmp_path / "models" / "cached.pt"
    assert (
        main(["--model", f"local-dir:{clip}", "--out", str(cached), "--text-config", str(tmp_path / "hf_cache")]) == 0
    )
    torch.testing.assert_close(load_text_embeddings(cached, embed_dim=32), expected, atol=1e-6, rtol=0)

    # the classifier reads the file into its contrastive path
    net = DiffAttnCLIPClassifier(backbone=TINY_MODEL_NAME, pretrained=False, image_size=64, text_embeddings=str(out))
    assert net.contrastive_head is not None
    torch.testing.assert_close(net.contrastive_head.text_embeddings, expected, atol=1e-6, rtol=0)


def test_cli_templates_option(tiny, capsys):
    """--templates (several after one flag, or repeated) embeds exactly those templates' prompts; the file records
    them and a check against other templates names the command that rebuilds it."""
    templates = ["a video capsule endoscopy image showing {name}", "an endoscopic view of {label}"]
    model = f"local-dir:{tiny / 'local'}"
    out = tiny / "templates.pt"
    assert main(["--model", model, "--out", str(out), "--templates", *templates]) == 0
    capsys.readouterr()
    saved = torch.load(out, weights_only=True)
    # independent reference: the prompts written out by hand for two labels, embedded with the tiny text tower
    assert saved["prompts"]["active bleeding"] == [
        "a video capsule endoscopy image showing active bleeding",
        "an endoscopic view of active bleeding",
    ]
    assert saved["prompts"]["ulcer"] == [
        "a video capsule endoscopy image showing ulcer",
        "an endoscopic view of an ulcer",
    ]
    clip = create_tiny_open_clip(5)
    tokenizer = open_clip.get_tokenizer(TINY_MODEL_NAME)
    with torch.no_grad():
        rows = [F.normalize(clip.encode_text(tokenizer(saved["prompts"][lb])), dim=-1).mean(0) for lb in LABELS]
    expected = F.normalize(torch.stack(rows), dim=-1)
    torch.testing.assert_close(saved["embeddings"], expected, atol=1e-6, rtol=0)
    assert (saved["embeddings"] - _expected(seed=5)).abs().max() > 1e-3  # other prompts, other embeddings

    repeated = tiny / "repeated.pt"
    assert (
        main(["--model", model, "--out", str(repeated), "--templates", templates[0], "--templates", templates[1]]) == 0
    )
    capsys.readouterr()
    torch.testing.assert_close(torch.load(repeated, weights_only=True)["embeddings"], expected, atol=1e-6, rtol=0)

    # the file matches its templates, not the built-in ones
    torch.testing.assert_close(load_text_embeddings(out, templates=templates), expected, atol=1e-6, rtol=0)
    with pytest.raises(ValueError) as err:
        load_text_embeddings(out, templates=PROMPT_TEMPLATES)
    msg = str(err.value)
    assert "\n" not in msg and str(out) in msg and f"text-embeddings --model {model} --out {out}" in msg
    assert "--templates" not in msg  # the built-in templates are the default of the command
    # a file without recorded prompts is not checked
    plain = tiny / "plain_prompts.pt"
    torch.save({"labels": list(LABELS), "embeddings": expected}, plain)
    torch.testing.assert_close(load_text_embeddings(plain, templates=templates), expected, atol=1e-6, rtol=0)

    # invalid templates: one error line, nothing written
    bad = tiny / "bad.pt"
    assert main(["--model", model, "--out", str(bad), "--templates", "no placeholder"]) == 2
    err_lines = capsys.readouterr().err.strip().splitlines()
    assert len(err_lines) == 1 and "neither {label} nor {name}" in err_lines[0], err_lines
    assert not bad.exists()
