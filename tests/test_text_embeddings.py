"""Label-prompt text embeddings: CLI with the tiny open_clip model, averaging of prompt variants, file validation."""

from __future__ import annotations

import importlib.util
import json

import pytest
import torch
import torch.nn.functional as F

open_clip = pytest.importorskip("open_clip")

from monai_vce.labels import LABELS, all_prompts  # noqa: E402
from monai_vce.networks import TINY_MODEL_NAME, create_tiny_open_clip, save_tiny_checkpoint, save_tiny_local_dir  # noqa: E402
from monai_vce.networks.backbone import BIOMEDCLIP_CONFIG  # noqa: E402
from monai_vce.text_embeddings import _require_text_tower, load_text_embeddings, main  # noqa: E402


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
    with pytest.raises(SystemExit) as exc:
        main(["--model", str(tiny / "absent.bin"), "--out", str(tiny / "x.pt")])
    assert exc.value.code == 2
    assert "absent.bin" in capsys.readouterr().err
    assert not (tiny / "x.pt").exists()


@pytest.mark.skipif(importlib.util.find_spec("transformers") is not None, reason="transformers is installed")
def test_hf_text_tower_without_transformers_is_a_clear_error():
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
