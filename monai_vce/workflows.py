"""Small helpers that the bundle's JSON configs call through ``$monai_vce.workflows...`` expressions.

They keep the configs readable: building and splitting the datalist, skipping videos an interrupted inference
run already finished, generating the demo data on first use, and loading the tuned decoder parameters.
(Optimizer parameter groups come from the network itself: ``DiffAttnCLIPClassifier.param_groups``.)
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import warnings
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from monai.inferers import SimpleInferer

__all__ = [
    "default_bundle_root",
    "galar_datalist",
    "inference_datalist",
    "video_ids",
    "pending_frames",
    "completed_videos",
    "ensure_mini_galar",
    "decoder_params",
    "check_folder",
    "check_backbone",
    "ground_truth",
    "evaluation_report",
    "FrameInferer",
]

PathLike = str | os.PathLike
logger = logging.getLogger(__name__)


class FrameInferer(SimpleInferer):
    """MONAI's ``SimpleInferer`` that also accepts ``uint8`` frames, scaling them to ``[0, 1]`` on their device.

    The bundle's frame pipeline keeps frames ``uint8`` until they reach the device (a quarter of the bytes);
    the bundle's engines convert them in ``prepare_batch``, but applications that run the bundle's
    ``preprocessing`` and ``inferer`` themselves (MONAI Label's ``BundleInferTask``) hand the ``uint8`` batch
    straight to the inferer, so the conversion happens here too. Float inputs pass unchanged.
    """

    def __call__(self, inputs: Any, network: Any, *args: Any, **kwargs: Any) -> Any:
        import torch

        if isinstance(inputs, torch.Tensor) and not inputs.is_floating_point():
            inputs = inputs.float().div_(255.0)
        return super().__call__(inputs, network, *args, **kwargs)


def default_bundle_root() -> str:
    """The bundle folder: ``.`` when run from inside it, ``bundle`` when run from the repository root.

    The configs' ``bundle_root`` uses this, so that both ``cd bundle && python -m monai.bundle run ...
    --config_file configs/train.json`` and ``python -m monai.bundle run ... --config_file
    bundle/configs/train.json`` work; ``--bundle_root PATH`` overrides it.
    """
    cwd = Path.cwd()
    if (cwd / "configs" / "metadata.json").is_file():
        return "."
    if (cwd / "bundle" / "configs" / "metadata.json").is_file():
        return "bundle"
    return str(Path(__file__).resolve().parents[1] / "bundle")


def check_folder(path: PathLike, what: str = "dataset folder") -> str:
    """Return ``path`` as a string, or raise ``FileNotFoundError`` naming it and the config key to change."""
    if not Path(path).is_dir():
        raise FileNotFoundError(
            f"{what} {path} not found; pass the right one on the command line, e.g. --dataset_dir /data/galar "
            f"(or use the demo: --config_file \"['bundle/configs/train.json','bundle/configs/demo.json']\")"
        )
    return str(path)


def galar_datalist(dataset_dir: PathLike, videos: Iterable[str] | None = None) -> list[dict]:
    """Labelled frame datalist of a Galar-layout folder (``frames/``, ``labels/``, optional ``metadata.csv``).

    Args:
        dataset_dir: the folder holding ``frames/<video_id>/*.PNG`` and ``labels/<video_id>.csv``.
        videos: video ids to keep (``None``: all with both frames and labels).
    """
    from monai_vce.data.galar import build_galar_datalist

    root = Path(check_folder(dataset_dir))
    meta = root / "metadata.csv"
    return build_galar_datalist(
        root / "frames", root / "labels", metadata_csv=meta if meta.is_file() else None, videos=videos
    )


def inference_datalist(dataset_dir: PathLike, videos: Iterable[str] | None = None) -> list[dict]:
    """Unlabelled frame datalist of a folder of videos (``<dir>/frames/<video_id>/`` or ``<dir>/<video_id>/``).

    A datalist JSON file (a list of frame dicts, or ``{"testing": [...]}``) is also accepted in place of the
    folder.
    """
    from monai_vce.data.galar import build_inference_datalist

    path = Path(dataset_dir)
    if path.is_file() and path.suffix.lower() == ".json":
        import json

        data = json.loads(path.read_text())
        if isinstance(data, Mapping):
            data = data.get("testing", data.get("validation", data.get("data")))
        if not isinstance(data, list) or not all(isinstance(d, Mapping) and "image" in d for d in data):
            raise ValueError(f"datalist file {path}: expected a list of frame dicts with an 'image' key")
        keep = None if videos is None else {str(v) for v in videos}
        return [dict(d) for d in data if keep is None or str(d.get("video_id")) in keep]
    root = Path(check_folder(path, "input folder"))
    frames = root / "frames" if (root / "frames").is_dir() else root
    meta = root / "metadata.csv"
    return build_inference_datalist(frames, videos=videos, metadata_csv=meta if meta.is_file() else None)


def video_ids(datalist: Sequence[Mapping[str, Any]]) -> list[str]:
    """Video ids of a frame datalist, in order of first appearance."""
    return list(dict.fromkeys(str(d["video_id"]) for d in datalist))


def model_fingerprint(model_file: PathLike) -> str:
    """A string identifying a model file's current content (path, size, modification time), ``""`` if absent.

    Stored in each probability file, it keeps a resumed inference from reusing the files of another model.
    """
    path = Path(model_file)
    if not path.is_file():
        return ""
    st = path.stat()
    return f"{path.resolve()}:{st.st_size}:{st.st_mtime_ns}"


def completed_videos(
    datalist: Sequence[Mapping[str, Any]], probs_dir: PathLike, source: str | None = None
) -> list[str]:
    """Videos of ``datalist`` whose probability file in ``probs_dir`` is complete.

    A file is complete when it exists (files are written atomically), holds as many frames as the
    datalist has for that video (a video folder that grew since is recomputed) and, when ``source`` is
    given, was written from that source (:func:`model_fingerprint`: a retrained model recomputes everything).
    """
    from monai_vce.events.probabilities import npz_record

    counts: dict[str, int] = {}
    for d in datalist:
        vid = str(d["video_id"])
        counts[vid] = counts.get(vid, 0) + 1
    out = []
    for vid, n in counts.items():
        record = npz_record(Path(probs_dir) / f"{vid}.npz")
        if record is not None and record[0] == n and (source is None or record[1] == source):
            out.append(vid)
    return out


def pending_frames(
    datalist: Sequence[Mapping[str, Any]], probs_dir: PathLike, resume: bool = True, source: str | None = None
) -> list[dict]:
    """The frames of ``datalist`` still to infer: those of videos without a complete probability file.

    Filtering the datalist before building the dataset makes an interrupted inference resumable: a rerun
    infers only the videos it had not finished, and the event JSON is still written from every video's file.

    Args:
        datalist: the full frame datalist.
        probs_dir: the folder of the per-video ``<video_id>.npz`` files.
        resume: ``False`` returns the whole datalist (recompute everything).
        source: what the probability files must have been written from (see :func:`completed_videos`).
    """
    if not resume:
        return list(datalist)
    done = set(completed_videos(datalist, probs_dir, source=source))
    if done:
        logger.info(f"skipping {len(done)} video(s) already inferred in {probs_dir}: {', '.join(sorted(done))}")
    return [d for d in datalist if str(d["video_id"]) not in done]


def ensure_mini_galar(
    out_dir: PathLike, videos: int = 8, frames_per_video: int = 120, size: int = 64, seed: int = 0, **kwargs: Any
) -> str:
    """Generate a mini-Galar dataset into ``out_dir`` unless a complete one is already there.

    The data is generated into a temporary sibling folder and renamed into place, so an interrupted
    generation never leaves a half-made dataset behind; ``out_dir/ground_truth.json`` marks a complete one.
    ``kwargs`` go to :func:`monai_vce.data.synthetic.generate_mini_galar` (e.g. ``use_real_timelines``).

    Returns:
        ``out_dir`` as a string.
    """
    from monai_vce.data.synthetic import generate_mini_galar

    out = Path(out_dir)
    if (out / "ground_truth.json").is_file():
        return str(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        generate_mini_galar(tmp, videos=videos, frames_per_video=frames_per_video, size=size, seed=seed, **kwargs)
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    logger.info(f"generated mini-Galar ({videos} videos x {frames_per_video} frames, {size} px): {out}")
    return str(out)


def decoder_params(path: PathLike | None) -> Any:
    """An ``EventDecoder`` with the tuned parameters of ``path``, or the default chain with a warning when the
    file does not exist (the model was not trained or validated with decoder tuning yet)."""
    from monai_vce.postprocessing.decoder import EventDecoder

    if path is None:
        return EventDecoder()
    if not Path(path).is_file():
        warnings.warn(
            f"decoder parameters {path} not found: decoding with the default parameters; train or evaluate "
            f"the bundle to tune them, or pass --decoder_params PATH",
            stacklevel=2,
        )
        return EventDecoder()
    return EventDecoder(path)


def check_backbone(backbone: str, pretrained: bool | str = True) -> str:
    """Resolve the backbone before anything is built, with a bundle-specific message when it is unavailable.

    A hub backbone (BiomedCLIP by default) is downloaded and cached here. When neither the hub nor the cache
    has it, the error says how to pass local weights on the bundle command line, or how to run the demo.

    Returns:
        ``backbone`` unchanged.

    Raises:
        RuntimeError: the backbone cannot be loaded (the message lists the alternatives).
    """
    from monai_vce.networks.backbone import BackboneUnavailableError, resolve_backbone

    try:
        resolve_backbone(backbone, pretrained=pretrained)
    except BackboneUnavailableError as e:
        raise RuntimeError(
            f"{e}\nWith the bundle: pass a local copy on the command line, e.g. "
            f"--backbone local-dir:/path/to/BiomedCLIP (a folder with open_clip_config.json and "
            f"open_clip_pytorch_model.bin) or --backbone /path/to/open_clip_pytorch_model.bin; or run the offline "
            f"demo, python -m monai_vce.demo (configs train.json + demo.json)."
        ) from None
    return backbone


def ground_truth(datalist: Sequence[Mapping[str, Any]], units: str = "index") -> dict:
    """The challenge event JSON of a labelled frame datalist: label-set runs of each video's frame labels.

    Args:
        datalist: labelled frame dicts (``label``, ``video_id``, ``frame_index``, ``frame_number``).
        units: ``"index"`` (``frame_index``) or ``"frame_number"``.
    """
    import numpy as np

    from monai_vce.events import event_json, frames_to_events

    key = "frame_index" if units == "index" else "frame_number"
    rows: dict[str, list] = {}
    for d in datalist:
        if "label" not in d:
            raise ValueError(
                f"datalist item of video {d.get('video_id')} frame {d.get(key)} has no 'label': no ground truth"
            )
        rows.setdefault(str(d["video_id"]), []).append((int(d[key]), d["label"]))
    videos = {}
    for vid, items in rows.items():
        items.sort(key=lambda r: r[0])
        ids = np.array([r[0] for r in items], dtype=np.int64)
        labels = np.asarray([r[1] for r in items], dtype=np.float32) >= 0.5
        videos[vid] = frames_to_events(labels, ids, mode="label_set")
    return event_json(videos)


def _frame_ap(datalist: Sequence[Mapping[str, Any]], probs_dir: PathLike) -> dict[str, float | None]:
    """Frame-level average precision per label of the probability files against the datalist's labels."""
    import numpy as np

    from monai_vce.events.probabilities import load_video_probs
    from monai_vce.handlers.frame_metrics import multilabel_average_precision
    from monai_vce.labels import LABELS

    labels: dict[str, dict[int, Any]] = {}
    for d in datalist:
        labels.setdefault(str(d["video_id"]), {})[int(d["frame_index"])] = d["label"]
    probs, targets = [], []
    for vid, rows in labels.items():
        v = load_video_probs(Path(probs_dir) / f"{vid}.npz")
        probs.append(v.probs)
        targets.append(np.asarray([rows[int(i)] for i in v.frame_index], dtype=np.float32))
    ap = multilabel_average_precision(np.concatenate(probs), np.concatenate(targets))
    return {name: (None if np.isnan(a) else float(a)) for name, a in zip(LABELS, ap)}


def evaluation_report(
    events_file: PathLike,
    datalist: Sequence[Mapping[str, Any]],
    output_dir: PathLike,
    probs_dir: PathLike | None = None,
    units: str = "index",
    draw: bool = True,
) -> dict[str, Any] | None:
    """Score an evaluation's event JSON against the datalist's ground truth; print and save the result.

    Writes ``<output_dir>/ground_truth.json`` and ``<output_dir>/metrics.json`` (the
    :func:`monai_vce.metrics.temporal_map` result, plus ``frame_AP``: the frame-level average precision of each
    label, ``None`` for a label without positive frames, when ``probs_dir`` is given), and the report of :func:`monai_vce.report.write_report`
    under ``<output_dir>/report`` when matplotlib is installed. Runs on rank 0 only in distributed runs.

    Returns:
        The metric result (``None`` on other ranks).
    """
    import json

    from monai_vce.metrics import load_events, temporal_map
    from monai_vce.utils import atomic_write_json

    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized() and dist.get_rank() != 0:
            return None
    except ImportError:  # pragma: no cover
        pass
    out = Path(output_dir)
    gt = ground_truth(datalist, units=units)
    pred = load_events(events_file)
    result = temporal_map(gt, pred)
    if probs_dir is not None:
        result["frame_AP"] = _frame_ap(datalist, probs_dir)
    atomic_write_json(out / "ground_truth.json", gt)
    atomic_write_json(out / "metrics.json", result)
    summary = {k: result[k] for k in ("mAP@0.5", "mAP@0.95") if k in result}
    print(json.dumps({"events_file": str(events_file), "videos": len(gt["videos"]), **summary}), flush=True)
    if draw:
        try:
            from monai_vce.report import write_report

            write_report(pred, out / "report", gt=gt, probs_dir=probs_dir, units=units)
        except ImportError as e:  # matplotlib is an optional extra
            logger.warning(f"report not drawn ({e}); install monai-vce[report] for timelines")
    return result
