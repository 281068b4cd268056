"""The decoder's parameters: one immutable, validated, versioned JSON object (:class:`DecoderParams`).

The schema derives from the step registries; a parameter file must list every label, and errors name the file
and the key.
"""

from __future__ import annotations

import copy
import math
import os
import warnings
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np
from jsonschema import validators

try:
    from jsonschema import Draft202012Validator as _DraftValidator
except ImportError:  # jsonschema 3 (MONAI Label's environment pins it): draft 7 knows every keyword used here
    from jsonschema import Draft7Validator as _DraftValidator
from jsonschema.exceptions import ValidationError

from monai_vce.events.composition import COMPOSITIONS, RANKINGS
from monai_vce.events.units import FrameUnits
from monai_vce.labels import LABELS, LANDMARKS, SECTIONS
from monai_vce.utils import atomic_write_json, read_json_file

from .anatomy import ANATOMY_PARAMS, LANDMARK_WINDOW
from .calibration import ProbabilityCalibration
from .chain import CHAIN_STEPS, PAPER_ORDER
from .gating import PRESENCE_FEATURES, PRESENCE_PARAMS
from .steps import MAX_FRAMES, Param

__all__ = [
    "DECODER_PARAMS_VERSION",
    "FRAME_UNITS",
    "WINDOW_SECONDS_PARAMS",
    "DecoderParams",
    "decoder_params_schema",
    "label_param_names",
]

DECODER_PARAMS_VERSION = 1
#: Accepted values of ``frame_units``.
FRAME_UNITS: tuple[str, ...] = tuple(u.value for u in FrameUnits)
_TOP_KEYS = (
    "version",
    "labels",
    "order",
    "composition",
    "ranking",
    "frame_units",
    "anatomy",
    "scores",
    "window_seconds",
    "calibration",
    "fit",
)
#: The frame-count parameters that may be given in seconds (``"window_seconds"``), converted per video at its row rate.
WINDOW_SECONDS_PARAMS: tuple[str, ...] = ("median_window", "max_gap", "min_length", "landmark_window")


def label_param_names() -> tuple[str, ...]:
    """The keys of one label's parameters: each chain step's parameter, then ``"presence"``."""
    return (*(step.param.name for step in CHAIN_STEPS.values()), "presence")


def _label_params() -> dict[str, Param]:
    return {step.param.name: step.param for step in CHAIN_STEPS.values()}


def _default_label() -> dict[str, Any]:
    return {**{name: p.default for name, p in _label_params().items()}, "presence": {"feature": "none"}}


def _default_anatomy() -> dict[str, Any]:
    out: dict[str, Any] = {name: p.default for name, p in ANATOMY_PARAMS.items()}
    # the order of the keys in written files: as earlier versions wrote them
    order = ("enabled", "emission_weight", "switch_cost", "skip_cost", "backward_cost", "entry_cost", "lead_in_logit")
    out = {k: out[k] for k in order} | {"landmark_window": {n: LANDMARK_WINDOW.default for n in LANDMARKS}}
    out["gate_landmarks"] = ANATOMY_PARAMS["gate_landmarks"].default
    out["pathology_sections"] = {}
    return out


def decoder_params_schema() -> dict[str, Any]:
    """The JSON schema (draft 2020-12) of a complete parameter object, built from the step registries.

    Besides standard keywords it uses ``"finite": true`` (no NaN or infinity), checked by this module's validator.
    """
    presence = {
        "type": "object",
        "required": ["feature"],
        "properties": {"feature": {"enum": list(PRESENCE_FEATURES)}}
        | {name: p.schema() for name, p in PRESENCE_PARAMS.items()},
        "additionalProperties": False,
        "if": {"properties": {"feature": {"enum": ["peak", "quantile", "support"]}}},
        "then": {"required": ["cutoff"]},
    }
    label = {
        "type": "object",
        "required": list(label_param_names()),
        "properties": {name: p.schema() for name, p in _label_params().items()} | {"presence": presence},
        "additionalProperties": False,
    }
    anatomy = {
        "type": "object",
        "required": list(_default_anatomy()),
        "properties": {name: p.schema() for name, p in ANATOMY_PARAMS.items()}
        | {
            "landmark_window": {
                "type": "object",
                "required": list(LANDMARKS),
                "properties": {n: LANDMARK_WINDOW.schema() for n in LANDMARKS},
                "additionalProperties": False,
            },
            "pathology_sections": {
                "type": "object",
                "propertyNames": {"enum": [n for n in LABELS if n not in SECTIONS]},
                "additionalProperties": {"type": "array", "items": {"enum": list(SECTIONS)}},
            },
        },
        "additionalProperties": False,
    }
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "monai-vce decoder parameters",
        "type": "object",
        "required": ["version", "labels", "order", "composition", "ranking", "frame_units", "anatomy"],
        "properties": {
            "version": {"const": DECODER_PARAMS_VERSION},
            "labels": {
                "type": "object",
                "required": list(LABELS),
                "properties": {n: label for n in LABELS},
                "additionalProperties": False,
            },
            "order": {"type": "array", "items": {"enum": list(CHAIN_STEPS)}, "uniqueItems": True},
            "composition": {"enum": list(COMPOSITIONS)},
            "ranking": {"enum": list(RANKINGS)},
            "frame_units": {"enum": list(FRAME_UNITS)},
            "anatomy": anatomy,
            "scores": {"type": "boolean"},
            "window_seconds": {
                "type": "object",
                "properties": {
                    name: {
                        "type": "object",
                        "propertyNames": {"enum": list(LANDMARKS if name == "landmark_window" else LABELS)},
                        "additionalProperties": {"type": "number", "finite": True, "minimum": 0, "maximum": 1e6},
                    }
                    for name in WINDOW_SECONDS_PARAMS
                },
                "additionalProperties": False,
            },
            "calibration": {"type": "object"},
            "fit": {"type": "object"},
        },
        "additionalProperties": False,
    }


def _finite(validator: Any, finite: bool, instance: Any, schema: Mapping[str, Any]) -> Iterator[ValidationError]:
    if finite and isinstance(instance, float) and not math.isfinite(instance):
        yield ValidationError(f"{instance!r} is not finite")


_Validator = validators.extend(_DraftValidator, {"finite": _finite})
_VALIDATORS: dict[tuple, Any] = {}


def _validator() -> Any:
    """The schema validator of the current step registry (rebuilt when a step is registered)."""
    key = tuple((name, step.param) for name, step in CHAIN_STEPS.items())
    if key not in _VALIDATORS:
        _VALIDATORS[key] = _Validator(decoder_params_schema())
    return _VALIDATORS[key]


def _plain(value: Any) -> Any:
    """A JSON-like copy of ``value``: numpy scalars and arrays, tuples and mapping views become plain Python."""
    if isinstance(value, Mapping):
        return {str(k) if isinstance(k, np.str_) else k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, np.ndarray)):
        return [_plain(v) for v in value]
    if isinstance(value, np.bool_):
        return bool(value)
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.floating):
        return float(value)
    if isinstance(value, FrameUnits):
        return value.value
    return value


def _freeze(value: Any) -> Any:
    if isinstance(value, Mapping):
        return MappingProxyType({k: _freeze(v) for k, v in value.items()})
    if isinstance(value, list):
        return tuple(_freeze(v) for v in value)
    return value


def _thaw(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _thaw(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return [_thaw(v) for v in value]
    return value


def _param_at(path: Sequence[Any]) -> Param | None:
    """The :class:`Param` describing the value at a schema path, if there is one."""
    if len(path) == 3 and path[0] == "labels":
        return _label_params().get(path[2])
    if len(path) == 4 and path[0] == "labels" and path[2] == "presence":
        return PRESENCE_PARAMS.get(path[3])
    if len(path) == 2 and path[0] == "anatomy":
        return ANATOMY_PARAMS.get(path[1])
    if len(path) == 3 and path[:2] == ["anatomy", "landmark_window"]:
        return LANDMARK_WINDOW
    return None


def _message(err: ValidationError) -> tuple[str, str]:
    """``(key, message)`` of a schema error, in the words of the registries."""
    path = list(err.absolute_path)
    key = ".".join(str(p) for p in path)
    if err.validator == "additionalProperties":
        allowed = list(err.schema.get("properties", {}))
        extra = [k for k in err.instance if k not in allowed]
        what = "label" if path == ["labels"] else "landmark" if path[-1:] == ["landmark_window"] else "key"
        name = ".".join([*map(str, path), str(extra[0])])
        return name, f"unknown {what}; expected {what}s from {allowed}"
    if err.validator == "required":
        missing = next(k for k in err.validator_value if k not in err.instance)
        feature = err.instance.get("feature") if path[-1:] == ["presence"] else None
        return ".".join([*map(str, path), str(missing)]), "missing" + (
            f" (feature {feature!r} is compared with a cutoff)" if feature else ""
        )
    if "propertyNames" in err.schema_path:
        return f"{key}.{err.instance}", "must be a non-section label (pathologies and landmarks only)"
    param = _param_at(path)
    if param is not None:
        return key, f"must be {param.describe()}, got {err.instance!r}"
    if err.validator == "enum":
        return key, f"must be one of {list(err.validator_value)}, got {err.instance!r}"
    if err.validator == "const":
        return key, f"must be {err.validator_value!r}, got {err.instance!r}"
    if path and path[0] == "anatomy" and "pathology_sections" in path:
        return key, f"must be a list of sections from {list(SECTIONS)}, got {err.instance!r}"
    if key == "order":
        return key, f"must be a list of distinct steps from {list(CHAIN_STEPS)}, got {err.instance!r}"
    if err.validator == "then":  # a presence feature compared with a cutoff, without one
        return (
            f"{key}.cutoff",
            f"must be {PRESENCE_PARAMS['cutoff'].describe()} for feature {err.instance['feature']!r}",
        )
    if err.validator == "type":
        return key, f"must be {err.validator_value if isinstance(err.validator_value, str) else 'of another type'}"
    return key, err.message


class DecoderParams(Mapping[str, Any]):
    """All parameters of :class:`~monai_vce.postprocessing.EventDecoder`, as one immutable JSON object.

    Structure (version 1; the schema is :func:`decoder_params_schema`)::

        {"version": 1,
         "labels": {"<label>": {"threshold": float in [0, 1], "hysteresis": float in [0, 1],
                                "duration_cost": float in [0, 1e6], "median_window": odd int in [1, 1e7],
                                "max_gap": int in [0, 1e7], "min_length": int in [0, 1e7],
                                "presence": {"feature": "none" | "never" | "peak" | "quantile" | "support",
                                             "cutoff": float, "window": int, "q": float}}, ...},   # all 17
         "order": ["threshold", "median", "fill_gaps", "min_length"],   # any order, steps may be left out
                    # ("hysteresis" before "threshold", "duration" after it: both off by default)
         "composition": "label_set" | "per_label",
         "ranking": "mean" | "max" | "min" | "none",
         "frame_units": "frame_index" | "frame_number",
         "anatomy": {"enabled": bool, "emission_weight": float in [0, 1000], "switch_cost": float in [0, 1e6],
                     "skip_cost": float, "backward_cost": float, "entry_cost": float | null,
                     "lead_in_logit": float in [-20, 20],
                     "landmark_window": {"<landmark>": int in [0, 1e7]}, "gate_landmarks": bool,
                     "pathology_sections": {"<pathology>": ["<section>", ...]}},
         "scores": bool,  # optional (false): events carry "score", the screening profile's
         "window_seconds": {"median_window" | "max_gap" | "min_length": {"<label>": s}, "landmark_window": {..}},
                    # optional: windows in seconds, converted per video at its row rate (rows_at)
         "calibration": {...},   # optional: a ProbabilityCalibration.to_dict() applied to the probabilities first
         "fit": {...}}   # optional, free-form record of how the parameters were fitted

    The object is read-only (``params["labels"]["ulcer"]["threshold"]``); derive changed parameters with
    :meth:`replace`, :meth:`with_label` and :meth:`with_anatomy`, or edit :meth:`to_dict` and build a new one.

    Args:
        data: a mapping in the structure above; missing keys take the paper's defaults (thresholds 0.5, median
            7, gaps 5, minimum length 3, no gating, no anatomy decoding). See ``docs/design/decoding.md`` for files.
        source: where the mapping came from, named in error messages.

    Raises:
        ValueError: an invalid or unknown key, one line naming ``source`` and the key.
    """

    def __init__(self, data: Mapping[str, Any] | None = None, source: str = "decoder parameters") -> None:
        self.source = source
        complete = self._complete(_plain(dict(data or {})), source)
        self._validate(complete)
        self._data: Mapping[str, Any] = _freeze(complete)

    # construction -----------------------------------------------------------------------------------
    @staticmethod
    def _complete(data: dict[str, Any], source: str) -> dict[str, Any]:
        out = copy.deepcopy(data)
        out.setdefault("version", DECODER_PARAMS_VERSION)
        labels = out.get("labels", {})
        if isinstance(labels, Mapping):
            merged = {}
            for name in LABELS:
                given = labels.get(name, {})
                merged[name] = {**_default_label(), **dict(given)} if isinstance(given, Mapping) else given
            out["labels"] = merged | {k: v for k, v in labels.items() if k not in LABELS}
        out.setdefault("order", list(PAPER_ORDER))
        out.setdefault("composition", "label_set")
        out.setdefault("ranking", "mean")
        out.setdefault("frame_units", FrameUnits.FRAME_INDEX.value)
        anatomy = out.get("anatomy", {})
        if isinstance(anatomy, Mapping):
            merged = {**_default_anatomy(), **dict(anatomy)}
            lw = merged.get("landmark_window")
            if isinstance(lw, (int, float)) and not isinstance(lw, bool):
                merged["landmark_window"] = {name: lw for name in LANDMARKS}
            elif isinstance(lw, Mapping):
                merged["landmark_window"] = {**_default_anatomy()["landmark_window"], **lw}
            out["anatomy"] = merged
        return out

    def _fail(self, key: str, msg: str) -> None:
        raise ValueError(f"{self.source}: {key}: {msg}")

    def _validate(self, d: dict[str, Any]) -> None:
        if d.get("version") != DECODER_PARAMS_VERSION:
            self._fail("version", f"must be {DECODER_PARAMS_VERSION}, got {d.get('version')!r}")
        errors = sorted(_validator().iter_errors(d), key=lambda e: (len(e.absolute_path), list(map(str, e.path))))
        if errors:
            # the shallowest error first: an unknown or missing key explains the errors below it
            self._fail(*_message(errors[0]))
        if "calibration" in d:
            try:
                ProbabilityCalibration.from_dict(d["calibration"])
            except ValueError as e:
                self._fail("calibration", str(e))
        order = d["order"]
        if "threshold" not in order:
            self._fail("order", "must contain 'threshold'")
        th = order.index("threshold")
        for step in order:
            if CHAIN_STEPS[step].needs_mask and order.index(step) < th:
                self._fail("order", f"{step!r} works on the binary mask and must come after 'threshold'")
            if CHAIN_STEPS[step].needs_probs and order.index(step) > th:
                self._fail("order", f"{step!r} works on the probabilities and must come before 'threshold'")

    @classmethod
    def paper(cls, **overrides: Any) -> DecoderParams:
        """The paper's chain: thresholds 0.5, median 7, gaps <= 5 filled, events < 3 frames removed."""
        return cls(overrides, source="paper parameters")

    @classmethod
    def from_thresholds(cls, thresholds: Mapping[str, float] | str | os.PathLike, **overrides: Any) -> DecoderParams:
        """Parameters from a plain ``{label: threshold}`` JSON (or dict); everything else as in :meth:`paper`."""
        source = "thresholds"
        if not isinstance(thresholds, Mapping):
            source = str(thresholds)
            thresholds = cls._read_json(thresholds)
        if not isinstance(thresholds, Mapping):
            raise ValueError(f"{source}: expected a JSON object {{label: threshold}}, got {type(thresholds).__name__}")
        labels = {}
        for name, value in thresholds.items():
            if name not in LABELS:
                raise ValueError(f"{source}: unknown label {name!r}; expected names from {list(LABELS)}")
            labels[name] = {"threshold": value}
        return cls({**overrides, "labels": labels}, source=source)

    @staticmethod
    def _read_json(path: str | os.PathLike) -> Any:
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"decoder parameter file {path} does not exist")
        # strict JSON: a key given twice (json would keep the last one silently) is refused, naming the key
        return read_json_file(path, max_bytes=64 * 1024**2, what="decoder parameter file", source=str(path))

    @classmethod
    def load(cls, path: str | os.PathLike) -> DecoderParams:
        """Read and validate a parameter file (every label with every key; see ``docs/design/decoding.md``).

        Raises:
            FileNotFoundError: the file does not exist.
            ValueError: invalid JSON, a missing label or key, or an invalid value; one line naming the file and key.
        """
        data = cls._read_json(path)
        if not isinstance(data, Mapping):
            raise ValueError(f"{path}: expected a JSON object, got {type(data).__name__}")
        if data.get("version") != DECODER_PARAMS_VERSION:
            raise ValueError(f"{path}: 'version' must be {DECODER_PARAMS_VERSION}, got {data.get('version')!r}")
        labels = data.get("labels")
        if not isinstance(labels, Mapping):
            raise ValueError(f"{path}: labels: must be an object keyed by label name, got {type(labels).__name__}")
        missing = [name for name in LABELS if name not in labels]
        if missing:
            raise ValueError(
                f"{path}: labels: missing label {missing[0]!r}"
                + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else "")
                + f"; a parameter file lists all {len(LABELS)} labels (no label falls back to the defaults)"
            )
        defaults = _default_label()
        # a step left out of the order never runs, so its parameter may be absent without a warning
        order = data.get("order")
        ordered = set(order) if isinstance(order, list) else set(CHAIN_STEPS)
        keys = [step.param.name for step in CHAIN_STEPS.values() if step.name in ordered] + ["presence"]
        absent = [
            f"labels.{name}.{key}"
            for name in LABELS
            if isinstance(labels[name], Mapping)
            for key in keys
            if key not in labels[name]
        ]
        if absent:
            warnings.warn(
                f"{path}: {', '.join(absent[:5])}{' ...' if len(absent) > 5 else ''} not given: using the default"
                f" ({', '.join(f'{k}={defaults[k]!r}' for k in dict.fromkeys(a.rsplit('.', 1)[1] for a in absent))})",
                stacklevel=2,
            )
        return cls(data, source=str(path))

    def save(self, path: str | os.PathLike) -> Path:
        """Write the parameters atomically as JSON."""
        return atomic_write_json(path, self.to_dict())

    def to_dict(self) -> dict[str, Any]:
        """A mutable deep copy as plain JSON types (dicts and lists)."""
        out: dict[str, Any] = _thaw(self._data)
        return out

    @property
    def data(self) -> Mapping[str, Any]:
        """The parameters as a read-only mapping (the object itself is the same mapping)."""
        return self._data

    def copy(self) -> DecoderParams:
        return DecoderParams(self.to_dict(), source=self.source)

    def replace(self, **changes: Any) -> DecoderParams:
        """New parameters with top-level keys replaced (``replace(ranking="max")``)."""
        return DecoderParams({**self.to_dict(), **changes}, source=self.source)

    def with_label(self, name: str, **changes: Any) -> DecoderParams:
        """New parameters with some of one label's parameters replaced (``with_label("ulcer", threshold=0.3)``)."""
        if name not in LABELS:
            raise ValueError(f"{self.source}: labels.{name}: unknown label; expected names from {list(LABELS)}")
        d = self.to_dict()
        d["labels"][name].update(changes)
        return DecoderParams(d, source=self.source)

    def with_anatomy(self, **changes: Any) -> DecoderParams:
        """New parameters with some anatomy parameters replaced (``with_anatomy(enabled=True)``)."""
        d = self.to_dict()
        d["anatomy"].update(changes)
        return DecoderParams(d, source=self.source)

    @property
    def calibration(self) -> ProbabilityCalibration | None:
        """The probability calibration the decoder applies first (``calibration``), ``None`` without one."""
        data = self._data.get("calibration")
        return None if data is None else ProbabilityCalibration.from_dict(_thaw(data))

    # time -----------------------------------------------------------------------------------------
    def rows_at(self, rows_per_second: float) -> DecoderParams:
        """The parameters with the windows of ``window_seconds`` converted to rows at ``rows_per_second`` (``window_seconds``
        dropped): a median window to the odd count at or below ``s * rate + 1``, the others to the nearest count.
        Without ``window_seconds``: the parameters themselves."""
        if "window_seconds" not in self._data:
            return self
        rate = float(rows_per_second)
        if not (math.isfinite(rate) and rate > 0):
            raise ValueError(f"{self.source}: rows_per_second must be a positive number, got {rows_per_second!r}")
        d = self.to_dict()
        for name, values in d.pop("window_seconds").items():
            for label, sec in values.items():
                x = min(float(sec) * rate, MAX_FRAMES - 1)
                rows = 2 * int(x // 2) + 1 if name == "median_window" else round(x)
                if name == "landmark_window":
                    d["anatomy"]["landmark_window"][label] = rows
                else:
                    d["labels"][label][name] = rows
        return DecoderParams(d, source=self.source)

    def with_seconds(self, rows_per_second: float, names: Sequence[str] = WINDOW_SECONDS_PARAMS) -> DecoderParams:
        """The parameters with ``window_seconds`` set from their row windows at ``rows_per_second`` (e.g. the median
        row rate of the videos they were tuned on), so that each video converts them at its own rate."""
        rate = float(rows_per_second)
        if not (math.isfinite(rate) and rate > 0):
            raise ValueError(f"{self.source}: rows_per_second must be a positive number, got {rows_per_second!r}")
        unknown = [n for n in names if n not in WINDOW_SECONDS_PARAMS]
        if unknown:
            raise ValueError(
                f"{self.source}: window_seconds: unknown window {unknown[0]!r}; expected {list(WINDOW_SECONDS_PARAMS)}"
            )
        d = self.to_dict()
        seconds: dict[str, dict[str, float]] = {}
        for name in names:
            if name == "landmark_window":
                rows = {n: d["anatomy"]["landmark_window"][n] for n in LANDMARKS}
            else:
                rows = {n: d["labels"][n][name] for n in LABELS}
            seconds[name] = {n: round(float(v) / rate, 6) for n, v in rows.items()}
        d["window_seconds"] = seconds
        return DecoderParams(d, source=self.source)

    # per-label arrays -------------------------------------------------------------------------------
    def per_label(self, key: str) -> np.ndarray:
        """``(17,)`` array of one per-label chain parameter (``threshold``, ``median_window``, ...) in LABELS order."""
        params = _label_params()
        if key not in params:
            raise KeyError(f"unknown per-label parameter {key!r}; expected one of {list(params)}")
        return np.array([self._data["labels"][n][key] for n in LABELS], dtype=params[key].dtype)

    def presence_rules(self) -> list[dict[str, Any]]:
        return [dict(self._data["labels"][n]["presence"]) for n in LABELS]

    @property
    def frame_units(self) -> FrameUnits:
        """``frame_units`` as a :class:`~monai_vce.events.FrameUnits`."""
        return FrameUnits(self._data["frame_units"])

    # mapping ----------------------------------------------------------------------------------------
    def __getitem__(self, key: str) -> Any:
        return self._data[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, DecoderParams) and self.to_dict() == other.to_dict()

    __hash__ = None  # type: ignore[assignment]

    def __reduce__(self) -> tuple[Any, ...]:
        # the frozen views cannot be pickled or deep-copied themselves: rebuild from the plain JSON object
        return (type(self), (self.to_dict(), self.source))

    def __repr__(self) -> str:
        return (
            f"DecoderParams(composition={self['composition']!r}, anatomy={self['anatomy']['enabled']}, "
            f"source={self.source!r})"
        )
