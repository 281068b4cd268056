"""The inference writer: per-video probability files and the event JSON of a run.

:class:`TemporalEventWriter` (modelled on MONAI's ``ClassificationSaver``) writes ``<output_dir>/<video_id>.npz``
(the format of :mod:`monai_vce.events.probabilities`) atomically as soon as a video is complete
(:class:`~monai_vce.handlers.VideoFrameCollector` hands it over), then decodes the videos into events with :class:`monai_vce.postprocessing.EventDecoder` and writes
the challenge event JSON atomically. With ``features``, each file also holds the frame model's per-frame features
(:class:`~monai_vce.handlers.FrameFeatureCapture`); with a temporal ``refiner``, the videos are refined into
``refined_dir`` (same format) and the refined probabilities are decoded. File writers belong in handlers, never in
post-processing transforms, so that MONAI Label or MONAI Deploy, which run a bundle's ``postprocessing``, write
nothing.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from monai.utils import IgniteInfo, min_version, optional_import

from monai_vce.events.metadata import describe_events_file
from monai_vce.events.probabilities import (
    Video,
    check_video_ids,
    load_video_probs,
    npz_frame_count,
    probability_file,
    probability_files,
    save_video_probs,
)
from monai_vce.events.units import FrameUnits, as_frame_units
from monai_vce.events.validation import save_events
from monai_vce.postprocessing.decoder import DecoderParams, EventDecoder
from monai_vce.report.summary import write_report
from monai_vce.temporal.files import refine_folder
from monai_vce.utils import renamed_arguments

from .features import DEFAULT_FEATURE_MODULE, FrameFeatureCapture
from .video_collector import VideoFrameCollector

Events, _ = optional_import("ignite.engine", IgniteInfo.OPT_IMPORT_VERSION, min_version, "Events")
idist, _ = optional_import("ignite", IgniteInfo.OPT_IMPORT_VERSION, min_version, "distributed")
if TYPE_CHECKING:
    from ignite.engine import Engine
else:
    Engine, _ = optional_import("ignite.engine", IgniteInfo.OPT_IMPORT_VERSION, min_version, "Engine")

# the probability-file names are re-exported from their home, monai_vce.events.probabilities, for existing code
__all__ = [
    "TemporalEventWriter",
    "VideoFrameCollector",
    "Video",
    "save_video_probs",
    "load_video_probs",
    "npz_frame_count",
]

logger = logging.getLogger(__name__)

PathLike = str | os.PathLike


class TemporalEventWriter:
    """Event handler writing per-video probability files and the challenge event JSON of an inference run.

    Modelled on MONAI's ``ClassificationSaver``: it collects the frame probabilities at every iteration, groups
    them by video (:class:`VideoFrameCollector`), writes ``<output_dir>/<video_id>.npz`` atomically as soon as a
    video is complete (single process) or once on rank 0 after gathering all ranks (distributed), and at the end
    of the run decodes every video's probabilities with the tuned decoder and writes ``events_file`` atomically
    (validated before writing). Videos whose ``.npz`` already exists from an interrupted run are read back, so
    the JSON always covers every video of ``videos``.

    Args:
        output_dir: folder of the per-video ``.npz`` files.
        events_file: path of the event JSON; a relative path is taken inside ``output_dir``. ``None`` writes
            no JSON (probabilities only).
        decoder: an ``EventDecoder``, decoder parameters (``DecoderParams``, dict or JSON path) or ``None`` for
            the decoder's defaults.
        frame_units: frame ids written in the events: ``"frame_index"`` (Galar ground-truth units) or
            ``"frame_number"`` (numbers of the image file names); ``None`` takes the decoder parameters'
            ``frame_units``. Decoder parameters fitted in other units (a ``fit`` record and another
            ``frame_units``) are refused: their windows and gaps count other frames. Formerly ``units``.
        videos: ids of every video the JSON must list, in order (e.g. all videos of the datalist, including
            those skipped because their ``.npz`` was complete). ``None``: every ``.npz`` in ``output_dir``.
        pred_key: key of the probabilities in the engine output (apply the sigmoid in ``postprocessing``).
        output_transform: see :class:`VideoFrameCollector`.
        batch_transform: see :class:`VideoFrameCollector`.
        report_dir: folder of the report drawn after the JSON is written (one timeline PNG per video with
            the frame probabilities behind the predicted events, and a summary; see
            :func:`monai_vce.report.write_report`); ``None`` draws nothing. Drawing needs matplotlib
            (``pip install monai-vce[report]``); without it a one-line warning is logged and nothing is drawn.
        source: what produced the probabilities (e.g. :func:`monai_vce.events.model_fingerprint` of the model
            file), recorded in every file so that a resumed run never reuses another model's files.
        features: also write each frame's pooled image feature (``features``, float16 ``(T, D)``) into the
            files, captured from the same forward pass (:class:`~monai_vce.handlers.FrameFeatureCapture`).
        feature_module: the network's submodule whose input is that feature (see
            :class:`~monai_vce.handlers.FrameFeatureCapture`).
        refiner: a temporal refiner (:class:`monai_vce.temporal.TemporalRefiner`, or a
            :class:`~monai_vce.temporal.RefinerEnsemble`) applied to every video before decoding; ``None`` decodes
            the frame model's probabilities. Its inputs must be available: a refiner
            of features needs ``features=True`` and features of its width.
        refined_dir: folder of the refined ``<video_id>.npz`` files (needed with ``refiner``; not ``output_dir``).
            The events, the report and a resumed run use these files.
        refiner_source: identifies the refiner (e.g. :func:`monai_vce.temporal.refiner_fingerprint` of its file);
            a refined file records ``"<source> | <refiner_source>"``, and a rerun reuses a refined file only
            when both the frame model and the refiner are the same, so refined and unrefined probabilities, or
            those of two refiners, are never decoded together.
        name: logger name (``None``: the engine's logger).

    Raises:
        ValueError: a refiner whose inputs the run does not provide (features needed but not written), or a
            refiner without ``refined_dir`` (one line naming the refiner).

    Example (bundle JSON)::

        {"_target_": "monai_vce.handlers.TemporalEventWriter", "output_dir": "@output_dir",
         "events_file": "events.json", "decoder": "@decoder_params_file", "videos": "@video_ids"}
    """

    @renamed_arguments(units="frame_units")
    def __init__(
        self,
        output_dir: PathLike,
        events_file: PathLike | None = "events.json",
        decoder: Any = None,
        frame_units: FrameUnits | str | None = None,
        videos: Iterable[str] | None = None,
        pred_key: str = "pred",
        output_transform: Callable[[Any], Any] | None = None,
        batch_transform: Callable[[Any], Any] | None = None,
        report_dir: PathLike | None = None,
        source: str = "",
        features: bool = False,
        feature_module: str = DEFAULT_FEATURE_MODULE,
        refiner: Any = None,
        refined_dir: PathLike | None = None,
        refiner_source: str = "",
        name: str | None = None,
    ) -> None:
        self.output_dir = Path(output_dir)
        self.events_file = None if events_file is None else self._resolve(events_file)
        self.decoder = decoder
        self.frame_units = None if frame_units is None else as_frame_units(frame_units)
        # kept as given (a lazy sequence stays unread until the events are written)
        self.videos = videos
        self.report_dir = None if report_dir is None else Path(report_dir)
        self.source = str(source)
        self.logger = logging.getLogger(name)
        self._name = name
        self.refiner = refiner
        self.refiner_source = str(refiner_source)
        self.refined_dir = None if refined_dir is None else Path(refined_dir)
        refiner_dim = self._check_refiner(bool(features))
        self.feature_capture = FrameFeatureCapture(feature_module, feature_dim=refiner_dim) if features else None
        self.collector = VideoFrameCollector(
            self._save_video,
            pred_key=pred_key,
            output_transform=output_transform,
            batch_transform=batch_transform,
            on_discard=self._discard_video,
            features_key=None if self.feature_capture is None else self.feature_capture.output_key,
        )
        self.written: list[str] = []

    def _check_refiner(self, features: bool) -> int | None:
        """Refuse a refiner whose inputs the run does not give; returns the feature width it needs (or ``None``)."""
        if self.refiner is None:
            return None
        name = f"temporal refiner {self.refiner_source}" if self.refiner_source else "the temporal refiner"
        inputs = getattr(self.refiner, "inputs", "probs")
        if self.refined_dir is None:
            raise ValueError(f"{name} needs refined_dir, the folder of the refined probability files")
        if self.refined_dir.resolve() == self.output_dir.resolve():
            raise ValueError(
                f"refined_dir {self.refined_dir} is the folder of the frame model's probability files; choose another"
            )
        if inputs == "probs":
            return None
        if not features:
            raise ValueError(
                f"{name} takes inputs={inputs!r} (per-frame features), but this run writes no features: set "
                "write_features true, or use a refiner fitted on probabilities"
            )
        return int(getattr(self.refiner, "feature_dim", 0)) or None

    @property
    def decode_dir(self) -> Path:
        """The folder whose files are decoded: ``refined_dir`` with a refiner, else ``output_dir``."""
        return self.refined_dir if self.refiner is not None and self.refined_dir is not None else self.output_dir

    @property
    def refined_source(self) -> str:
        """The ``source`` recorded in the refined files: the frame model's and the refiner's."""
        return f"{self.source} | {self.refiner_source}"

    def refine(self) -> list[str]:
        """Refine every video of the run into ``refined_dir`` (rank 0), keeping refined files of the same frame
        model and refiner; returns the ids of the videos refined now. Nothing to do without a refiner."""
        if self.refiner is None or self.refined_dir is None or idist.get_rank() != 0:
            return []
        ids = self.video_ids()
        if not ids:
            return []
        result = refine_folder(
            self.refiner,
            self.output_dir,
            self.refined_dir,
            source=self.refined_source,
            videos=ids,
            log=self.logger.info,
        )
        if result["kept"]:
            self.logger.info(f"kept {len(result['kept'])} video(s) already refined by the same refiner")
        if result["trained_videos"]:
            self.logger.warning(
                f"{len(result['trained_videos'])} video(s) were among the refiner's training videos "
                f"(e.g. {result['trained_videos'][0]!r}): their refined probabilities are over-confident"
            )
        return list(result["written"])

    def _resolve(self, path: PathLike) -> Path:
        path = Path(path)
        return path if path.is_absolute() or path.parent != Path(".") else self.output_dir / path

    def _save_video(self, video: Video) -> None:
        path = save_video_probs(probability_file(self.output_dir, video.video_id), video, source=self.source)
        self.written.append(video.video_id)
        self.logger.info(f"saved probabilities of video {video.video_id} ({len(video)} frames): {path}")

    def _discard_video(self, video_id: str) -> None:
        """Remove the file of a video written from part of its frames (see ``VideoFrameCollector.on_discard``)."""
        probability_file(self.output_dir, video_id).unlink(missing_ok=True)
        if video_id in self.written:
            self.written.remove(video_id)

    def _get_decoder(self) -> Any:
        if isinstance(self.decoder, EventDecoder):
            return self.decoder
        if callable(self.decoder) and not isinstance(self.decoder, (str, os.PathLike, Mapping)):
            return self.decoder
        return EventDecoder(self.decoder)

    def events_frame_units(self) -> FrameUnits:
        """The frame units the events of this writer are written in (for consumers such as the review site)."""
        return self._units(self._get_decoder())

    def _units(self, decoder: Any) -> FrameUnits:
        """The frame units of the events: the writer's, checked against the decoder parameters' own."""
        params = getattr(decoder, "params", None)
        # only fitted parameters state their units (an unfitted default says nothing about them)
        fitted = params.frame_units if isinstance(params, DecoderParams) and "fit" in params else None
        if self.frame_units is None:
            return fitted or FrameUnits.FRAME_INDEX
        if fitted is not None and fitted is not self.frame_units:
            raise ValueError(
                f"the decoder parameters ({getattr(params, 'source', 'decoder')}) were fitted in {fitted.value} units, "
                f"but the run decodes in {self.frame_units.value} units (their windows and gaps count other frames); "
                f"pass frame_units={fitted.value!r} or parameters fitted in {self.frame_units.value} units"
            )
        return self.frame_units

    def video_ids(self) -> list[str]:
        """The videos the JSON lists: ``videos`` or every ``.npz`` file of ``output_dir`` in natural order."""
        if self.videos is not None:
            return check_video_ids(self.videos, "the writer's videos")
        return list(probability_files(self.output_dir))

    def write_events(self) -> Path | None:
        """Decode every video's ``.npz`` and write the event JSON atomically (rank 0 only), then the report.

        Reads one video at a time, so memory is bounded by the longest video. Can be called on its own (e.g.
        when every video was already complete and the engine had nothing to run). With a ``refiner``, the videos
        are refined first (:meth:`refine`) and the refined files decoded. With ``report_dir``, the timelines of the
        videos are drawn after the JSON is written.

        Returns:
            The JSON path, or ``None`` on other ranks or when ``events_file`` is ``None``.

        Raises:
            FileNotFoundError: a video of ``videos`` has no ``.npz`` file.
        """
        if self.events_file is None or idist.get_rank() != 0:
            return None
        decoder = self._get_decoder()
        units = self._units(decoder)
        out: dict[str, Any] = {"videos": []}
        missing = [v for v in self.video_ids() if not probability_file(self.output_dir, v).is_file()]
        if missing:
            raise FileNotFoundError(
                f"no probability file for video(s) {', '.join(missing[:10])}{' ...' if len(missing) > 10 else ''} "
                f"in {self.output_dir}: run inference on them first"
            )
        frames: dict[str, dict[str, int]] = {}
        self.refine()
        for vid in self.video_ids():
            video = load_video_probs(probability_file(self.decode_dir, vid), video_id=vid)
            ids = video.frame_ids(units)
            events = decoder(video.probs, ids, video_id=vid) if len(video) else []
            out["videos"].append({"video_id": vid, "events": list(events)})
            if len(video):
                frames[vid] = {"frames": len(video), "first": int(ids[0]), "last": int(ids[-1])}
        path = save_events(self.events_file, out, frame_units=units, videos=frames)
        n_events = sum(len(v["events"]) for v in out["videos"])
        self.logger.info(f"wrote {n_events} events of {len(out['videos'])} videos: {describe_events_file(path, units)}")
        if self.report_dir is not None:
            self.write_report(out, units, events_file=path)
        return path

    def write_report(
        self, events: Mapping[str, Any], frame_units: FrameUnits | str, events_file: PathLike | None = None
    ) -> Path | None:
        """Draw the timelines of ``events`` (with the probabilities of ``output_dir``) under ``report_dir``.

        Args:
            events: the event JSON object.
            frame_units: its frame units.
            events_file: the file ``events`` was written to, named on the summary page.

        Returns:
            ``report_dir``, or ``None`` when matplotlib is missing (a warning says so) or no report is asked.
        """
        if self.report_dir is None:
            return None
        names = {v["video_id"] for v in events["videos"]}
        # probability files of other videos (an earlier run on more videos) would be refused: draw the events
        # alone then
        strays = [p.name for vid, p in probability_files(self.decode_dir).items() if vid not in names]
        if strays:
            self.logger.warning(
                f"{self.decode_dir} holds probability files of videos not in this run ({', '.join(strays[:3])}"
                f"{' ...' if len(strays) > 3 else ''}): the report draws the events without probabilities"
            )
        try:
            write_report(
                events_file if events_file is not None else events,
                self.report_dir,
                probs_dir=None if strays else self.decode_dir,
                frame_units=frame_units,
            )
        except ImportError as e:  # matplotlib is an optional extra
            self.logger.warning(f"report not drawn ({e}); install monai-vce[report] for timelines")
            return None
        self.logger.info(f"drew the timelines of {len(events['videos'])} videos: {self.report_dir}")
        return self.report_dir

    def _completed(self, engine: Engine) -> None:
        self.write_events()

    def attach(self, engine: Engine) -> None:
        """Attach to an evaluator: collect every iteration, write the videos and, when the run completes, the JSON."""
        if self._name is None:
            self.logger = engine.logger
        if self.feature_capture is not None:
            self.feature_capture.attach(engine)
        self.collector.attach(engine)
        if not engine.has_event_handler(self._completed, Events.COMPLETED):
            engine.add_event_handler(Events.COMPLETED, self._completed)
