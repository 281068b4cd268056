"""A MONAI Deploy application: the frames of one capsule video in, the event JSON of the bundle out.

Graph (Holoscan operators, run by MONAI Deploy's ``Application``)::

    FrameFolderLoaderOperator  --image-->  MonaiBundleInferenceOperator  --pred-->  EventWriterOperator
              \\-------------------------------- frame ids --------------------------------/

* ``FrameFolderLoaderOperator`` lists the frames of a video folder with the bundle's own datalist builder
  (``monai_vce.data.build_inference_datalist``) and emits one decoded ``uint8`` frame (3, H, W) per tick, and its
  frame ids.
* ``MonaiBundleInferenceOperator`` (MONAI Deploy's) runs the bundle's ``preprocessing`` (the resize), ``inferer``,
  network and ``postprocessing`` (sigmoid) from the bundle folder (``configs/inference.json``, ``models/model.pt``
  or ``models/model.ts``).
* ``EventWriterOperator`` stacks the 17 probabilities of every frame and, after the last frame, decodes them with
  the bundle's decoder (``models/decoder.json``) into the challenge's event JSON, as the bundle's inference does,
  with its frame units beside it (``events.meta.json``, :mod:`monai_vce.events.metadata`).

Run it (in an environment with ``pip install "monai-vce[deploy]"``)::

    python bundle/deploy_app/app.py --frames /data/frames/ukdd_navi_00051 --output out/ [--bundle bundle]
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import Any

import numpy as np
import torch
from holoscan.conditions import CountCondition
from monai.deploy.core import AppContext, Application, Fragment, IOType, Operator, OperatorSpec
from monai.deploy.operators.monai_bundle_inference_operator import IOMapping, MonaiBundleInferenceOperator

# isort: split
# monai_vce after the third-party block: a first-party package here (ruff), an installed one in model-zoo (isort)
from monai_vce.data import build_inference_datalist, load_vce_frame
from monai_vce.events import FrameUnits
from monai_vce.labels import NUM_LABELS
from monai_vce.postprocessing import load_decoder
from monai_vce.stages import write_events

__all__ = ["FrameFolderLoaderOperator", "EventWriterOperator", "VCEEventsApp", "main"]

logger = logging.getLogger(__name__)

#: The bundle this application lives in (``<bundle>/deploy_app/app.py``).
DEFAULT_BUNDLE = Path(__file__).resolve().parents[1]


class FrameFolderLoaderOperator(Operator):
    """Emit the frames of one video folder in frame order: ``image`` (decoded ``uint8`` (3, H, W)) and ``frame``.

    Args:
        fragment: the application.
        frames_dir: the folder of one video's frame images (``frame_<number>.png``).
    """

    def __init__(self, fragment: Fragment, *args: Any, frames_dir: Path, **kwargs: Any) -> None:
        self.datalist = build_inference_datalist(frames_dir)
        if not self.datalist:
            raise ValueError(f"no frame image in {frames_dir}")
        self.position = 0
        super().__init__(fragment, *args, **kwargs)

    def setup(self, spec: OperatorSpec) -> None:
        spec.output("image")
        spec.output("frame")

    def compute(self, op_input: Any, op_output: Any, context: Any) -> None:
        item = self.datalist[self.position]
        self.position += 1
        # decoded at full size: the bundle's preprocessing does the resize, as in the bundle's own inference
        op_output.emit(load_vce_frame(item["image"], image_size=None), "image")
        op_output.emit({k: item[k] for k in ("video_id", "frame_index", "frame_number")}, "frame")


class EventWriterOperator(Operator):
    """Collect every frame's probabilities and write the event JSON of the video after its last frame.

    Args:
        fragment: the application.
        num_frames: frames of the video (the JSON is written when all have arrived).
        output_dir: folder of ``events.json``.
        decoder_params: the bundle's ``decoder.json`` (its default decoder when the file does not exist).
    """

    def __init__(
        self, fragment: Fragment, *args: Any, num_frames: int, output_dir: Path, decoder_params: Path, **kwargs: Any
    ) -> None:
        self.num_frames = int(num_frames)
        self.output_dir = Path(output_dir)
        self.decoder = load_decoder(decoder_params)
        self.probs: list[np.ndarray] = []
        self.frames: list[dict[str, Any]] = []
        super().__init__(fragment, *args, **kwargs)

    def setup(self, spec: OperatorSpec) -> None:
        spec.input("pred")
        spec.input("frame")

    def compute(self, op_input: Any, op_output: Any, context: Any) -> None:
        pred = op_input.receive("pred")
        if isinstance(pred, dict):  # what the operator sends for an output declared as "probabilities"
            pred = pred["probabilities"]
        pred = torch.as_tensor(pred).detach().float().cpu().reshape(-1)
        if pred.numel() != NUM_LABELS:
            raise ValueError(f"expected {NUM_LABELS} probabilities per frame, got {pred.numel()}")
        self.probs.append(pred.numpy())
        self.frames.append(op_input.receive("frame"))
        if len(self.probs) == self.num_frames:
            self.write()

    def write(self) -> Path:
        """Decode the collected probabilities and write ``events.json`` and its units sidecar ``events.meta.json``."""
        units = FrameUnits(self.decoder.params.get("frame_units", FrameUnits.FRAME_INDEX.value))
        frame_ids = np.asarray([f[units.value] for f in self.frames], dtype=np.int64)
        vid = str(self.frames[0]["video_id"])
        events = self.decoder(np.stack(self.probs).astype(np.float32), frame_ids, video_id=vid)
        # the units sidecar (events.meta.json) as the bundle writes it: readers of the file need its frame units
        videos = {vid: {"frames": len(frame_ids), "first": int(frame_ids.min()), "last": int(frame_ids.max())}}
        path = write_events({vid: list(events)}, self.output_dir / "events.json", frame_units=units, videos=videos)
        logger.info(f"wrote {len(events)} events of video {vid}: {path}")
        return path


class VCEEventsApp(Application):
    """Frames of one video -> the bundle's network -> the event JSON (see the module docstring).

    Args:
        frames_dir: the folder of one video's frame images.
        output_dir: folder of ``events.json``.
        bundle: the bundle folder (default: the bundle this application lives in).
    """

    def __init__(self, frames_dir: Path, output_dir: Path, bundle: Path = DEFAULT_BUNDLE, **kwargs: Any) -> None:
        self.frames_dir = Path(frames_dir)
        self.output_dir = Path(output_dir)
        self.bundle = Path(bundle).resolve()
        super().__init__(**kwargs)

    def compose(self) -> None:
        loader = FrameFolderLoaderOperator(self, frames_dir=self.frames_dir, name="frame_loader")
        num_frames = len(loader.datalist)
        loader.add_arg(CountCondition(self, num_frames))
        inference = MonaiBundleInferenceOperator(
            self,
            app_context=AppContext({}),
            input_mapping=[IOMapping("image", torch.Tensor, IOType.IN_MEMORY)],
            output_mapping=[IOMapping("pred", torch.Tensor, IOType.IN_MEMORY)],
            bundle_path=self.bundle,
            name="bundle_inference",
        )
        writer = EventWriterOperator(
            self,
            num_frames=num_frames,
            output_dir=self.output_dir,
            decoder_params=self.bundle / "models" / "decoder.json",
            name="event_writer",
        )
        self.add_flow(loader, inference, {("image", "image")})
        self.add_flow(inference, writer, {("pred", "pred")})
        self.add_flow(loader, writer, {("frame", "frame")})


def main(argv: list[str] | None = None) -> Path:
    """Command line: ``--frames DIR --output DIR [--bundle DIR]``; returns the event JSON's path."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=Path, required=True, help="folder of one video's frame images")
    parser.add_argument("--output", type=Path, required=True, help="output folder (events.json)")
    parser.add_argument("--bundle", type=Path, default=DEFAULT_BUNDLE, help="bundle folder (default: this one)")
    args = parser.parse_args(argv)
    VCEEventsApp(args.frames, args.output, args.bundle).run()
    return args.output / "events.json"


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    main()
