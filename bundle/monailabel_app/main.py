"""A MONAI Label app serving this bundle's frame classifier (``monailabel start_server --app <this folder> ...``).

MONAI Label's stock ``monaibundle`` app decides a bundle's task from its folder name (``classification`` must appear
in it, anything else is served as 3-D segmentation), and registers MONAI Label's bundle trainer for every bundle.
This app reads the task from the bundle's ``metadata.json`` instead (``network_data_format.outputs.pred.format``
``"classes"``: one score per label), so the bundle is served as a classifier whatever its folder is called, and it
registers no trainer: training needs whole labelled videos (``python -m monai.bundle run training``), which MONAI
Label's per-image annotation loop does not provide.

Run it (MONAI Label listens on all interfaces unless told otherwise; this app refuses to start without ``--host``)::

    # this bundle (the folder above this app)
    monailabel start_server --app bundle/monailabel_app --studies /data/frames/1 --conf preload false \\
        --host 127.0.0.1
    # bundles copied (or linked) into <app>/model/<name>, as with the stock app (never downloaded)
    monailabel start_server --app apps/vce --studies /data/frames/1 --conf models vce_event_detection \\
        --host 127.0.0.1

The studies folder holds the frames: ``.png`` and ``.jpg``/``.jpeg`` files, in lower or upper case (Galar's
``frame_000003.PNG``; MONAI Label's own datastore lists lower-case extensions only), or only those of
``--conf extensions png`` (comma-separated, each listed in both cases; see ``vce_studies.py``). Then
``POST /infer/<name>?image=<image id>&output=json`` returns the 17 label scores of a frame. ``<name>`` is the
bundle's folder name (``models``) or ``vce`` for the bundle this app lives in. ``image`` must be an id of the studies
folder (a frame's file name without extension): paths, uploads and sessions are refused. A bad request is answered
with a one-line ``detail``: 400 (malformed id, upload, ``params`` not a JSON object), 404 (unknown model or image id),
413 (body over :data:`MAX_REQUEST_BYTES`), 422 (the frame is not a readable image).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import sys
from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from typing import Any

import monailabel
from fastapi import HTTPException
from fastapi.responses import JSONResponse
from monailabel.config import settings
from monailabel.datastore.local import LocalDatastore
from monailabel.interfaces.app import MONAILabelApp
from monailabel.interfaces.datastore import Datastore
from monailabel.interfaces.tasks.infer_v2 import InferTask, InferType
from monailabel.interfaces.tasks.train import TrainTask
from monailabel.tasks.infer.bundle import BundleInferTask
from PIL import Image
from starlette.requests import Request

# the app's own module, next to this file (MONAI Label puts the app folder on sys.path while it imports main.py)
from vce_studies import datastore_extensions

logger = logging.getLogger(__name__)

#: Name under which the bundle holding this app is served when no ``models`` are configured.
DEFAULT_MODEL_NAME = "vce"

#: ``POST /infer`` bodies larger than this are refused (413) before they are parsed; a frame id is a few bytes.
MAX_REQUEST_BYTES = 1 << 20

#: Frames with more pixels than this are refused (422) before they are decoded (Pillow's decompression-bomb limit).
MAX_FRAME_PIXELS = 89_478_485

# an image id names a file of the studies folder: no path separator, no markup, no control character
_SAFE_ID = re.compile(r"[A-Za-z0-9_][A-Za-z0-9 ._+()\[\]-]{0,254}")

_Scope = MutableMapping[str, Any]
_Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
_Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
_ASGIApp = Callable[[_Scope, _Receive, _Send], Awaitable[None]]


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


def bind_problem(argv: Sequence[str]) -> str | None:
    """Why a ``monailabel start_server`` command line must not start: without ``--host`` MONAI Label listens on all
    interfaces (``0.0.0.0``). ``None`` when ``--host`` is given (other hosts are the user's choice, with a warning)
    or ``argv`` is not ``start_server`` (the app built in-process or by another command: nothing listens)."""
    if "start_server" not in argv:
        return None
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("-i", "--host")
    host = parser.parse_known_args(list(argv[1:]))[0].host
    if host is None:
        return (
            "monailabel start_server without --host listens on all interfaces (0.0.0.0): add --host 127.0.0.1 to "
            "serve this machine only, or name the interface that serves others (e.g. --host 0.0.0.0)"
        )
    if host not in ("127.0.0.1", "localhost", "::1"):
        logger.warning(f"serving frames to other machines (--host {host}): MONAI Label's authentication is off")
    return None


def _refuse(status: int, detail: str) -> HTTPException:
    return HTTPException(status_code=status, detail=detail)


def _shown(text: str) -> str:
    """``text`` safe to quote in a one-line reason: at most 60 characters, markup and control characters escaped."""
    return ascii(text[:60]).translate({ord("<"): "\\x3c", ord(">"): "\\x3e", ord("&"): "\\x26"})


def guard_infer_request(inner: _ASGIApp) -> _ASGIApp:
    """Wrap the ASGI app ``inner`` serving ``POST /infer/{model}``: refuse an oversized body (413), an uploaded file
    or label, or ``params`` that is not a JSON object (400) with a one-line ``detail`` before ``inner`` runs (MONAI
    Label's handler calls ``json.loads(params)`` itself and answers a bad one with HTTP 500, its traceback logged)."""

    async def guarded(scope: _Scope, receive: _Receive, send: _Send) -> None:
        chunks, size, more = [], 0, True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client went away
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            more = message.get("more_body", False)
            if size > MAX_REQUEST_BYTES:
                body = {"detail": f"request body over {MAX_REQUEST_BYTES} bytes: pass a frame id, not a file"}
                await JSONResponse(body, status_code=413)(scope, receive, send)
                return
        replayed = False

        async def replay() -> MutableMapping[str, Any]:
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": b"".join(chunks), "more_body": False}

        problem = None
        try:
            async with Request(scope, replay).form() as form:
                if any(not isinstance(form.get(k), (str, type(None))) for k in ("file", "label")):
                    problem = "uploads are not served: copy the frame into the studies folder and pass its id as image"
                params = form.get("params")
        except Exception as e:  # a malformed form body: the parser's own error type varies
            problem = f"the request's form body cannot be parsed ({type(e).__name__})"
        if problem is None and isinstance(params, str) and params:
            try:
                value = json.loads(params)
            except ValueError as e:
                problem = f"params is not JSON ({e})"
            else:
                if not isinstance(value, dict):
                    problem = f"params must be a JSON object, not {type(value).__name__}"
        if problem is not None:
            await JSONResponse({"detail": problem}, status_code=400)(scope, receive, send)
            return
        replayed = False
        await inner(scope, replay, send)

    return guarded


def guard_server(server: Any) -> None:
    """Put :func:`guard_infer_request` in front of MONAI Label's FastAPI ``server`` for ``POST .../infer/{model}``
    (once). The app is built inside the running server, whose middleware and routes are fixed by then (and how
    FastAPI stores routes varies by version): the server's built middleware stack is the stable hook."""
    stack = server.middleware_stack if server.middleware_stack is not None else server.build_middleware_stack()
    if getattr(stack, "_vce_guard", False):
        return
    guarded_infer = guard_infer_request(stack)

    async def guarded(scope: _Scope, receive: _Receive, send: _Send) -> None:
        parts = scope.get("path", "").rstrip("/").split("/")
        infer = scope["type"] == "http" and scope.get("method") == "POST" and len(parts) >= 2 and parts[-2] == "infer"
        await (guarded_infer if infer else stack)(scope, receive, send)

    guarded._vce_guard = True  # type: ignore[attr-defined]
    server.middleware_stack = guarded


class VCEBundleApp(MONAILabelApp):
    """MONAI Label app for frame-classification bundles (see the module docstring)."""

    def __init__(self, app_dir: str, studies: str, conf: dict[str, str]) -> None:
        problem = bind_problem(sys.argv)
        if problem is not None:
            # the app is built in the server's startup, before it listens; an exception there prints the startup
            # traceback and leaves the reason at its end, so say it in one line and stop (nothing is open yet)
            print(f"error: {problem}", file=sys.stderr, flush=True)
            os._exit(2)
        self.models = local_bundles(app_dir, conf.get("models", ""))
        self.extensions = datastore_extensions(conf.get("extensions", ""))
        super().__init__(
            app_dir=app_dir,
            studies=studies,
            conf=conf,
            name=f"VCE frame classification (MONAI Label {monailabel.__version__})",
            description="Per-frame scores of the 17 RARE-VISION labels from a monai-vce bundle",
            version="0.1.0",
        )
        server = sys.modules.get("monailabel.app")  # imported only inside the server: never import it here
        if server is not None:
            guard_server(server.app)

    def init_datastore(self) -> Datastore:
        """MONAI Label's local datastore listing the frames (:func:`vce_studies.datastore_extensions`: ``.png``,
        ``.PNG``, ``.jpg``, ... instead of MONAI Label's lower-case defaults, which miss Galar's ``.PNG``); a
        ``http(s)://`` studies address is MONAI Label's remote datastore, as in its own apps."""
        if self.studies.startswith(("http://", "https://")):
            return super().init_datastore()
        logger.info(f"Init Datastore for: {self.studies} (frames: {', '.join(self.extensions)})")
        return LocalDatastore(
            self.studies,
            extensions=self.extensions,
            auto_reload=settings.MONAI_LABEL_DATASTORE_AUTO_RELOAD,
            read_only=settings.MONAI_LABEL_DATASTORE_READ_ONLY,
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

    def frame_path(self, image: Any) -> str:
        """The file of the datastore image id ``image``, checked to be a readable image of bounded size.

        Raises:
            HTTPException: 400 not an id (a path, markup, not a string); 404 no such image in the datastore; 422 the
                file is not a readable image or has over :data:`MAX_FRAME_PIXELS` pixels.
        """
        if not isinstance(image, str) or not _SAFE_ID.fullmatch(image):
            shown = _shown(image) if isinstance(image, str) else type(image).__name__
            raise _refuse(
                400,
                f"image must be an image id of the studies folder (a file name without extension, "
                f"letters, digits, ' ._+()[]-'), not a path or markup: {shown}",
            )
        datastore = self.datastore()
        path = datastore.get_image_uri(image) if image in datastore.list_images() else ""
        if not path:
            raise _refuse(404, f"image {image!r} is not in the studies folder")
        try:
            with Image.open(path) as frame:
                pixels = frame.width * frame.height
                if pixels > MAX_FRAME_PIXELS:
                    raise _refuse(422, f"frame {image!r} has {pixels} pixels, over {MAX_FRAME_PIXELS}")
                frame.load()  # a truncated file fails here, not inside the model's transforms
        except HTTPException:
            raise
        except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as e:
            reason = " ".join(str(e).replace(path, "<file>").split())[:120] or type(e).__name__
            raise _refuse(422, f"frame {image!r} is not a readable image ({reason})") from None
        return path

    def infer(self, request: dict[str, Any], datastore: Any = None) -> dict[str, Any]:
        """MONAI Label's inference, on datastore ids only (MONAI Label's own reads any path the server can).

        Raises:
            HTTPException: 404 unknown model; see :meth:`frame_path` for the image.
        """
        model = request.get("model")
        if model not in self._infers:
            shown = _shown(model) if isinstance(model, str) else type(model).__name__
            raise _refuse(404, f"no model {shown}: this server has {', '.join(sorted(self._infers)) or 'none'}")
        if request.get("session") is not None:
            raise _refuse(400, "sessions are not served: pass a frame's image id")
        request = {**request, "image": self.frame_path(request.get("image")), "save_label": False}
        return super().infer(request, datastore)
