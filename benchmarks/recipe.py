"""Ablation of the training recipe: the ``paper`` preset, the ``project`` preset and single changes of the latter.

Every arm trains the bundle (``train.json`` [+ ``paper.json``] + overrides, through ``monai.bundle.ConfigWorkflow``,
the same code path as ``python -m monai.bundle run training``) on a generated mini-Galar with the tiny offline
backbone, validates once at the end on the validation videos (which tune the thresholds and the decoder), then
runs the bundle's inference (``inference.json`` + the same preset) on held-out generated videos of another seed
and scores them: temporal mAP at tIoU 0.5 and 0.95 of the decoded events (the tuned decoder), and frame-level mean
average precision over the labels present in the held-out frames.

Arms (the training seed is the only other difference, shared by all arms):

- ``project, old loss``: the ``project`` preset with the loss as it was before the calibration fix (focusing of
  the smoothed positive and negative terms separately, smoothing to [eps/2, 1 - eps/2]; reimplemented here);
- ``project``: the ``project`` preset (the fixed loss);
- ``project + paper attention``: the paper's attention variant (constant lambda_init 0.8, no sub-norm);
- ``project + positive weights``: the class-frequency positive weights (neg/pos, clipped to [1, 100]);
- ``project + contrastive``: the contrastive path, 0.4 x binary cross-entropy;
- ``project + authors attention``: the authors' code's attention layout (head groups 0..h/2-1 and h/2..h-1);
- ``project + preserving attention``: the variant that starts as the pretrained attention (lambda pairs equal);
- ``paper``: the ``paper`` preset (its decoding: the paper's chain with F1 thresholds);
- ``authors``: ``paper`` + ``authors`` (the authors' code: schedule, mixup, positive weights, grid thresholds,
  decoding order).

Tiny scale, common to every arm (the presets' sizes are for BiomedCLIP on 3.5 M frames): 64 px, a random-init
2-block ViT (so the backbone trains at the head's rate, ``backbone_lr_mult`` 1; head rate 3e-3), ``--epochs`` of
800 sampled frames in batches of 32, EMA 0.95 with a 10-step warm-up, 16 training videos of 300 frames (12 train /
4 validation) and ``--heldout`` held-out videos, the demo's decoder-tuning settings under a preset's decoding
profile. Everything else (attention
variant, heads, loss, positive weights, contrastive weight, optimizer decay and clipping, one-cycle warm-up
fraction, mixup, augmentation) comes from the preset. The contrastive path's text embeddings come from the tiny
model's randomly initialised text tower (computed on first use through the bundle's code path): they exercise
the path, they are not clinical prompt embeddings.

Results are written per run to ``<out>/<arm>/seed<k>/result.json`` (a rerun skips finished runs) and printed as a
table: mean and standard deviation over the seeds, and the number of seeds each arm beats ``project`` on.

Usage (from the repository root)::

    OMP_NUM_THREADS=1 python benchmarks/recipe.py --seeds 0 1 2
    OMP_NUM_THREADS=1 python benchmarks/recipe.py --seeds 0 --epochs 2 --arms project paper   # a quick check
"""

from __future__ import annotations

import argparse
import json
import logging
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from monai.utils import LossReduction
from torch.nn.modules.loss import _Loss

REPO = Path(__file__).resolve().parents[1]
BUNDLE = REPO / "bundle"
CONFIGS = BUNDLE / "configs"


class LegacyAsymmetricFocalLoss(_Loss):
    """The loss as it was before the calibration fix, for the ``project, old loss`` arm only.

    ``-[t (1 - p)^gamma_pos log p + (1 - t) p_m^gamma_neg log(1 - p_m)]`` with ``t = y (1 - eps) + eps / 2``:
    each smoothed term keeps its own focusing factor, so the ``eps / 2`` positive part of every negative is not
    damped and pulls its probability towards ~0.4.
    """

    def __init__(self, gamma_pos: float = 1.0, gamma_neg: float = 4.0, clip: float = 0.05, eps: float = 0.05):
        super().__init__(reduction=LossReduction.MEAN.value)
        self.gamma_pos, self.gamma_neg, self.clip, self.eps = gamma_pos, gamma_neg, clip, eps

    def forward(self, input: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        x, y = input.float(), target.float()
        t = y * (1.0 - self.eps) + 0.5 * self.eps
        log_1m_pm = torch.log(torch.clamp(torch.sigmoid(-x) + self.clip, max=1.0))
        with torch.no_grad():
            w_pos = torch.exp(self.gamma_pos * F.logsigmoid(-x))
            w_neg = torch.clamp(torch.sigmoid(x) - self.clip, min=0.0).clamp(min=1e-38).pow(self.gamma_neg)
        return (-(t * w_pos * F.logsigmoid(x) + (1.0 - t) * w_neg * log_1m_pm)).mean()


#: arm name -> (preset files over train.json, overrides on top of them); train.json alone is the project's recipe
ARMS: dict[str, tuple[list[str], dict[str, Any]]] = {
    "project, old loss": ([], {"loss": "legacy"}),
    "project": ([], {}),
    "project + paper attention": ([], {"attention_variant": "paper"}),
    "project + positive weights": ([], {"positive_weights": True}),
    "project + contrastive": ([], {"contrastive_weight": 0.4}),
    "project + authors attention": ([], {"attention_variant": "authors"}),
    "project + preserving attention": ([], {"attention_variant": "preserving"}),
    "paper": (["paper.json"], {}),
    "authors": (["paper.json", "authors.json"], {}),
}


def tiny_scale(epochs: int) -> dict[str, Any]:
    """Overrides common to every arm: the tiny backbone and the training budget of one CPU core."""
    return {
        "backbone": "vce-tiny-vit-64",
        "pretrained": False,
        "image_size": 64,
        "amp": False,
        "num_workers": 0,
        "progress": False,
        "batch_size": 32,
        "val_batch_size": 64,
        "samples_per_epoch": 800,
        "max_epochs": epochs,
        "val_interval": epochs,
        "learning_rate": 0.003,
        "backbone_lr_mult": 1.0,
        "ema_decay": 0.95,
        "ema_warmup_iters": 10,
        "val_fraction": 0.25,
        "decoder_tuning": {"presence_min_gain": 0.0, "anatomy": False},
    }


def _workflow(files: Sequence[str], workflow_type: str, override: dict[str, Any]) -> Any:
    from monai.bundle import ConfigWorkflow

    wf = ConfigWorkflow(
        config_file=list(files),
        meta_file=str(CONFIGS / "metadata.json"),
        logging_file=False,
        workflow_type=workflow_type,
        **override,
    )
    wf.initialize()
    return wf


def frame_mean_ap(datalist: Sequence[dict], probs_dir: Path) -> float:
    """Frame-level AP averaged over the labels with a positive held-out frame."""
    from monai_vce.handlers.frame_metrics import multilabel_average_precision

    rows: dict[str, dict[int, Any]] = {}
    for d in datalist:
        rows.setdefault(str(d["video_id"]), {})[int(d["frame_index"])] = d["label"]
    probs, targets = [], []
    for vid, labels in rows.items():
        with np.load(probs_dir / f"{vid}.npz") as f:
            probs.append(f["probs"])
            targets.append(np.asarray([labels[int(i)] for i in f["frame_index"]], dtype=np.float32))
    ap = multilabel_average_precision(np.concatenate(probs), np.concatenate(targets))
    return float(np.nanmean(ap))


def run_arm(arm: str, seed: int, args: argparse.Namespace, data: dict[str, str]) -> dict[str, Any]:
    """Train, infer on the held-out videos and score one arm with one seed; the result is also saved."""
    from monai_vce.metrics import load_events, temporal_map
    from monai_vce.utils import atomic_write_json
    from monai_vce.workflows import galar_datalist

    run_dir = Path(args.out) / arm.replace(" ", "_").replace(",", "").replace("+", "plus") / f"seed{seed}"
    result_file = run_dir / "result.json"
    if result_file.is_file():
        return json.loads(result_file.read_text())
    presets, extra = ARMS[arm]
    presets = [str(CONFIGS / f) for f in presets]
    files = [str(CONFIGS / "train.json"), *presets]
    scale = tiny_scale(args.epochs)
    # a preset's decoding profile and prompts are part of it: keep them under the common overrides
    preset_keys: dict[str, Any] = {}
    for f in presets:
        preset_keys.update(json.loads(Path(f).read_text()))
    scale["decoder_tuning"] = {**scale["decoder_tuning"], **preset_keys.get("decoder_tuning", {})}
    embeddings = data["text_embeddings"] if "prompt_templates" not in preset_keys else run_dir / "text_embeddings.pt"
    override = {
        **scale,
        **extra,
        "seed": seed,
        "bundle_root": str(BUNDLE),
        "dataset_dir": data["train"],
        "ckpt_dir": str(run_dir / "models"),
        "output_dir": str(run_dir / "eval"),
        "text_model": data["text_model"],
        "text_embeddings": str(embeddings),
    }
    if extra.get("loss") == "legacy":
        override["loss"] = LegacyAsymmetricFocalLoss()
    t0 = time.perf_counter()
    wf = _workflow(files, "train", override)
    wf.run()
    wf.finalize()
    train_s = time.perf_counter() - t0

    infer_override = {
        key: override[key]
        for key in ("backbone", "image_size", "amp", "num_workers", "progress", "bundle_root", "ckpt_dir")
    }
    # the arm's network keys (e.g. the attention variant) must reach the inference network too
    infer_override.update({k: v for k, v in extra.items() if "#" not in k})
    infer_override.update(
        {
            "output_dir": str(run_dir / "heldout"),
            "dataset_dir": data["heldout"],
            "datalist": "$monai_vce.workflows.galar_datalist(@dataset_dir)",
            "batch_size": 64,
            "resume": False,
            "report": False,
        }
    )
    t0 = time.perf_counter()
    wf = _workflow([str(CONFIGS / "inference.json"), *presets], "infer", infer_override)
    events_file = Path(wf.parser.get_parsed_content("events_file"))
    probs_dir = Path(wf.parser.get_parsed_content("probs_dir"))
    wf.run()
    wf.finalize()
    infer_s = time.perf_counter() - t0

    gt = load_events(Path(data["heldout"]) / "ground_truth.json")
    score = temporal_map(gt, load_events(events_file))
    result = {
        "arm": arm,
        "seed": seed,
        "mAP@0.5": float(score["mAP@0.5"]),
        "mAP@0.95": float(score["mAP@0.95"]),
        "frame_mAP": frame_mean_ap(galar_datalist(data["heldout"]), probs_dir),
        "train_s": round(train_s, 1),
        "infer_s": round(infer_s, 1),
    }
    atomic_write_json(result_file, result)
    return result


def _table(results: list[dict[str, Any]], arms: Sequence[str], seeds: Sequence[int], empty: dict) -> str:
    by = {(r["arm"], r["seed"]): r for r in results}
    lines = [
        "| arm | held-out mAP@0.5 | held-out mAP@0.95 | held-out frame mAP | seeds above `project` (mAP@0.5) | "
        "per seed mAP@0.5 |",
        "|---|---|---|---|---|---|",
    ]
    for arm in arms:
        rows = [by[(arm, s)] for s in seeds if (arm, s) in by]
        if not rows:
            continue
        cells = []
        for key in ("mAP@0.5", "mAP@0.95", "frame_mAP"):
            v = np.array([r[key] for r in rows])
            cells.append(f"{v.mean():.4f} ± {v.std(ddof=1) if len(v) > 1 else 0.0:.4f}")
        wins = sum(
            1
            for s in seeds
            if (arm, s) in by and ("project", s) in by and by[(arm, s)]["mAP@0.5"] > by[("project", s)]["mAP@0.5"]
        )
        per_seed = ", ".join(f"{r['mAP@0.5']:.4f}" for r in rows)
        lines.append(f"| {arm} | {' | '.join(cells)} | {wins if arm != 'project' else '-'}/{len(rows)} | {per_seed} |")
    lines.append(f"| empty submission | {empty['mAP@0.5']:.4f} | {empty['mAP@0.95']:.4f} | - | - | - |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(REPO / "runs" / "recipe"), help="output folder (data, runs, results)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="training seeds")
    parser.add_argument("--epochs", type=int, default=20, help="epochs of 800 sampled frames")
    parser.add_argument("--heldout", type=int, default=6, help="held-out videos (300 frames each)")
    parser.add_argument("--arms", nargs="+", default=list(ARMS), help=f"arms to run, of {list(ARMS)}")
    args = parser.parse_args(argv)
    unknown = [a for a in args.arms if a not in ARMS]
    if unknown:
        parser.error(f"unknown arms {unknown}; choose from {list(ARMS)}")
    logging.basicConfig(level=logging.WARNING)
    warnings.filterwarnings("ignore")

    from monai_vce.metrics import load_events, temporal_map
    from monai_vce.networks import save_tiny_local_dir
    from monai_vce.workflows import ensure_mini_galar

    out = Path(args.out)
    common = {"frames_per_video": 300, "size": 64, "use_real_timelines": False}
    text_tower = out / "tiny_text_tower"
    if not (text_tower / "open_clip_config.json").is_file():
        save_tiny_local_dir(text_tower, seed=0)
    data = {
        "train": ensure_mini_galar(out / "mini_galar", videos=16, seed=0, **common),
        "heldout": ensure_mini_galar(out / f"mini_galar_heldout_{args.heldout}", videos=args.heldout, seed=1, **common),
        "text_model": f"local-dir:{text_tower}",
        "text_embeddings": str(out / "text_embeddings.pt"),
    }
    gt = load_events(Path(data["heldout"]) / "ground_truth.json")
    empty = temporal_map(gt, {"videos": [{"video_id": v["video_id"], "events": []} for v in gt["videos"]]})

    results = []
    t0 = time.perf_counter()
    for seed in args.seeds:
        for arm in args.arms:
            r = run_arm(arm, seed, args, data)
            results.append(r)
            print(
                f"{arm:28s} seed {seed}: mAP@0.5 {r['mAP@0.5']:.4f}  mAP@0.95 {r['mAP@0.95']:.4f}  "
                f"frame mAP {r['frame_mAP']:.4f}  (train {r['train_s']} s, inference {r['infer_s']} s)",
                flush=True,
            )
    print(f"\n{len(results)} runs in {time.perf_counter() - t0:.0f} s ({args.epochs} epochs x 800 frames each)\n")
    print(_table(results, args.arms, args.seeds, empty))


if __name__ == "__main__":
    main()
