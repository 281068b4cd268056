"""A MONAI Label app serving this bundle's frame classifier (``monailabel start_server --app <this folder> ...``).

MONAI Label's stock ``monaibundle`` app decides a bundle's task from its folder name (``classification`` must appear
in it, anything else is served as 3-D segmentation), and registers MONAI Label's bundle trainer for every bundle.
This app reads the task from the bundle's ``metadata.json`` instead (``network_data_format.outputs.pred.format``
``"classes"``: one score per label), so the bundle is served as a classifier whatever its folder is called, and it
registers no trainer: training needs whole labelled videos (``python -m monai.bundle run training``), which MONAI
Label's per-image annotation loop does not provide.

Run it::

    # this bundle (the folder above this app)
    monailabel start_server --app bundle/monailabel_app --studies /data/frames/1 --conf preload false
    # bundles copied (or linked) into <app>/model/<name>, as with the stock app (never downloaded)
    monailabel start_server --app apps/vce --studies /data/frames/1 --conf models vce_event_detection

then ``POST /infer/<name>?image=<image id>&output=json`` returns the 17 label scores of a frame. ``<name>`` is the
bundle's folder name (``models``) or ``vce`` for the bundle this app lives in.
"""

from __future__ import annotations

import json
import logging
import os

import monailabel
from monailabel.interfaces.app import MONAILabelApp
from monailabel.interfaces.tasks.infer_v2 import InferTask, InferType
from monailabel.interfaces.tasks.train import TrainTask
from monailabel.tasks.infer.bundle import BundleInferTask

logger = logging.getLogger(__name__)

#: Name under which the bundle holding this app is served when no ``models`` are configured.
DEFAULT_MODEL_NAME = "vce"


def bundle_task_type(bundle_dir: str) -> str:
    """The MONAI Label task type of a bundle, from its metadata: ``classification`` when its output is classes."""
    with open(os.path.join(bundle_dir, "configs", "metadata.json")) as f:
        metadata = json.load(f)
    outputs = metadata.get("network_data_format", {}).get("outputs", {})
    pred = next(iter(outputs.values()), {})
    return InferType.CLASSIFICATION if pred.get("format") == "classes" else InferType.SEGMENTATION


def local_bundles(app_dir: str, models: str) -> dict[str, str]:
    """``{name: bundle folder}``: the comma-separated ``models`` under ``<app_dir>/model/``, or the bundle holding this
    app when none are named. Bundles are never downloaded (MONAI Label's stock helper asks the model zoo online first).

    Raises:
        FileNotFoundError: a named bundle is not in ``<app_dir>/model/``.
    """
    names = [m.strip() for m in models.split(",") if m.strip()]
    if not names:
        return {DEFAULT_MODEL_NAME: os.path.dirname(os.path.abspath(app_dir))}
    found = {name: os.path.join(app_dir, "model", name) for name in names}
    for name, path in found.items():
        if not os.path.isfile(os.path.join(path, "configs", "metadata.json")):
            raise FileNotFoundError(f"bundle {name!r} not found: copy or link it to {path} (configs/metadata.json)")
    return found


class VCEBundleApp(MONAILabelApp):
    """MONAI Label app for frame-classification bundles (see the module docstring)."""

    def __init__(self, app_dir: str, studies: str, conf: dict[str, str]) -> None:
        self.models = local_bundles(app_dir, conf.get("models", ""))
        super().__init__(
            app_dir=app_dir,
            studies=studies,
            conf=conf,
            name=f"VCE frame classification (MONAI Label {monailabel.__version__})",
            description="Per-frame scores of the 17 RARE-VISION labels from a monai-vce bundle",
            version="0.1.0",
        )

    def init_infers(self) -> dict[str, InferTask]:
        infers: dict[str, InferTask] = {}
        for name, path in self.models.items():
            # no SaveImaged / Restored: a classification result is the JSON of scores, not an image
            task = BundleInferTask(path, self.conf, type=bundle_task_type(path), add_post_restore=False)
            if task.is_valid():
                logger.info(f"+++ Adding Inferer:: {name} => {path} ({task.type})")
                infers[name] = task
        return infers

    def init_trainers(self) -> dict[str, TrainTask]:
        return {}
