"""Fuzzing the readers of user files: the event-file validator with the metric command line, and the label CSV reader.

Inputs are random mutations of valid files (wrong types, huge and negative numbers, non-finite floats, unicode,
long strings, deep nesting, repeated keys, truncation, flipped bytes, other encodings). Each run is bounded:
a fixed number of examples, derandomised (the same examples on every run, so CI stays deterministic), and each
example must finish fast. Every input must end in a result or a clear refusal: exit status 0 or 2, one message per
line naming the file, no traceback, bounded memory (``tracemalloc`` peak).
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import time
import tracemalloc
from pathlib import Path

import pytest

hypothesis = pytest.importorskip("hypothesis")  # the `test` extra installs it
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from monai_vce.labels import LABELS  # noqa: E402

#: Per example: the CPU time a reader may take, and the memory it may allocate (bytes, tracemalloc peak).
EXAMPLE_SECONDS = 2.0
EXAMPLE_BYTES = 64 * 1024**2

FUZZ = settings(
    max_examples=150,
    derandomize=True,
    deadline=None,  # timed by the test itself, with a bound meant for a loaded CI machine
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture, HealthCheck.data_too_large],
)

# ------------------------------------------------------------------------------------------- strategies
_GT: dict = {
    "videos": [
        {
            "video_id": "1",
            "events": [{"start": 0, "end": 10, "label": ["mouth"]}, {"start": 11, "end": 99, "label": []}],
        },
        {"video_id": "2", "events": [{"start": 5, "end": 9, "label": ["ulcer", "stomach"]}]},
    ]
}

_leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.sampled_from(["", "mouth", "Mouth", "ulcer ", "z-line", "\u0000", "é", "\U0001f600", "x" * 300]),
)
_json = st.recursive(
    _leaf,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)),
    max_leaves=16,
)
_frame = st.one_of(
    st.integers(min_value=0, max_value=300),
    st.integers(min_value=-5, max_value=2**64),
    st.sampled_from([-1, 2**31 - 1, 2**31, 2**63 - 1, 2**64, 10**30, 1.0, 1e30, True]),
    _json,
)
_labels = st.one_of(st.lists(st.sampled_from(LABELS), max_size=3), st.lists(_leaf, max_size=3), _json)
_event = st.one_of(
    st.fixed_dictionaries({"start": _frame, "end": _frame, "label": _labels}, optional={"score": _json}),
    _json,
)
_video = st.one_of(
    st.fixed_dictionaries(
        {
            "video_id": st.one_of(st.sampled_from(["1", "2", "a b", "../x"]), _leaf),
            "events": st.lists(_event, max_size=5),
        }
    ),
    _json,
)
_random_file = st.one_of(st.fixed_dictionaries({"videos": st.lists(_video, max_size=4)}), _json)


@st.composite
def _mutated_valid(draw: st.DrawFn) -> object:
    """The ground truth with the ids the metric expects, one node replaced: what passes the id checks and reaches
    the scoring unless the validator stops it."""
    obj = json.loads(json.dumps(_GT))
    for _ in range(draw(st.sampled_from([1, 1, 1, 2, 3]))):
        video = draw(st.sampled_from(obj["videos"]))
        if not isinstance(video, dict):
            continue
        where = draw(
            st.sampled_from(["start", "end", "end", "label", "label item", "event", "events", "video_id", "add"])
        )
        value = draw(
            {
                "start": _frame,
                "end": _frame,
                "label": _labels,
                "label item": st.one_of(st.sampled_from(LABELS), _leaf),
                "event": _event,
                "events": st.one_of(st.lists(_event, max_size=3), _json),
                "video_id": st.one_of(st.sampled_from(["1", "2", "3", ""]), _leaf),
            }.get(where, _json)
        )
        events = video.get("events")
        events = events if isinstance(events, list) else []
        dict_events = [e for e in events if isinstance(e, dict)]
        if where in ("start", "end", "label") and dict_events:
            draw(st.sampled_from(dict_events))[where] = value
        elif where == "label item" and dict_events:
            event = draw(st.sampled_from(dict_events))
            if isinstance(event.get("label"), list):
                event["label"].append(value)
        elif where == "event" and events:
            events[draw(st.integers(0, len(events) - 1))] = value
        elif where == "events":
            video["events"] = value
        elif where == "video_id":
            video["video_id"] = value
        elif isinstance(video.get("events"), list):
            video["events"].append({"start": draw(_frame), "end": draw(_frame), "label": draw(_labels)})
    return obj


_event_file = st.one_of(_mutated_valid(), _mutated_valid(), _random_file)
_text_mutation = st.sampled_from(["none", "none", "repeat_key", "truncate", "flip", "deep", "bom", "latin1", "nan"])


def _mutate(text: str, how: str, seed: int) -> bytes:
    data = text.encode("utf-8")
    if how == "repeat_key" and text.startswith("{"):
        return ('{"videos": [], ' + text[1:]).encode("utf-8")
    if how == "truncate":
        return data[: seed % (len(data) + 1)]
    if how == "flip" and data:
        out = bytearray(data)
        out[seed % len(out)] ^= 1 << (seed % 8)
        return bytes(out)
    if how == "deep":
        return ("[" * (10_000 + seed % 90_000)).encode()
    if how == "bom":
        return b"\xef\xbb\xbf" + data
    if how == "latin1":
        return text.encode("latin-1", errors="replace") + b"\xe9"
    if how == "nan":
        return text.replace("0", "NaN", 1).encode("utf-8")
    return data


@contextlib.contextmanager
def _bounded(what: str):
    """Fail when the block takes more than EXAMPLE_SECONDS of CPU or allocates more than EXAMPLE_BYTES (tracemalloc).

    CPU time of this process, not wall time: other work on a loaded machine does not count, a reader stuck in a loop
    does.
    """
    tracemalloc.start()
    t0 = time.process_time()
    try:
        yield
    finally:
        seconds = time.process_time() - t0
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    assert seconds < EXAMPLE_SECONDS, f"{what} took {seconds:.2f} s of CPU"
    assert peak < EXAMPLE_BYTES, f"{what} allocated {peak / 2**20:.1f} MiB"


# ------------------------------------------------------------------------------- event files + metric CLI
@FUZZ
@given(obj=_event_file, how=_text_mutation, seed=st.integers(min_value=0, max_value=2**16), as_gt=st.booleans())
def test_fuzz_event_files_through_the_validator_and_the_metric_command_line(
    tmp_path: Path, obj: object, how: str, seed: int, as_gt: bool
) -> None:
    from monai_vce.events import validate_events
    from monai_vce.metrics.__main__ import main

    text = json.dumps(obj, ensure_ascii=bool(seed % 2))
    bad = tmp_path / "fuzz.json"
    bad.write_bytes(_mutate(text, how, seed))
    good = tmp_path / "gt.json"
    good.write_text(json.dumps(_GT))
    gt, pred = (bad, good) if as_gt else (good, bad)

    problems = validate_events(obj)  # the validator alone: a list of strings, never an exception
    assert isinstance(problems, list) and all(isinstance(p, str) and len(p) < 1000 for p in problems)

    out, err = io.StringIO(), io.StringIO()
    with _bounded("the metric command line"), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["--gt", str(gt), "--events", str(pred)])
    assert code in (0, 2)
    if code == 0:
        result = json.loads(out.getvalue())
        assert 0.0 <= result["mAP@0.5"] <= 1.0 and 0.0 <= result["mAP@0.95"] <= 1.0
    else:
        lines = err.getvalue().strip().splitlines()
        assert lines and out.getvalue() == "" and "Traceback" not in err.getvalue()
        # one problem per line, each naming a file (or its role) and short
        named = (str(gt), str(pred), "prediction", "ground truth")
        assert all(len(line) < 2000 and any(n in line for n in named) for line in lines), lines
        assert len(lines) <= 1002  # the validator lists at most 1,000 problems and counts the rest


# ------------------------------------------------------------------------------------------- label CSVs
_COLUMNS = ["index", "frame", *LABELS]
_cell = st.one_of(
    st.sampled_from(["0", "1", "1.0", "0.0", "", " 1 ", "2", "-1", "yes", "1e3", "0x10", "٣"]),
    st.integers(min_value=-(2**70), max_value=2**70).map(str),
    st.text(max_size=10),
    st.sampled_from(['"', "a,b", "line\nbreak", "\u0000", "é", "9" * 40]),
)


@st.composite
def _label_csv(draw: st.DrawFn) -> tuple[list[str], list[list[str]]]:
    header = list(_COLUMNS)
    if draw(st.booleans()):
        header = draw(st.permutations(header))
    edit = draw(st.sampled_from(["none", "none", "drop", "repeat", "rename", "extra", "case"]))
    if edit == "drop":
        header.pop(draw(st.integers(0, len(header) - 1)))
    elif edit == "repeat":
        header.append(draw(st.sampled_from(header)))
    elif edit == "rename":
        header[draw(st.integers(0, len(header) - 1))] = draw(st.text(max_size=6))
    elif edit == "extra":
        header.append("bubbles")
    elif edit == "case":
        header = [h.upper().replace(" ", "_") for h in header]
    n = draw(st.integers(0, 6))
    rows = []
    for r in range(n):
        row = [str(r) if h.lower() in ("index", "frame") else draw(st.sampled_from(["0", "1"])) for h in header]
        for _ in range(draw(st.integers(0, 2))):  # a few cells replaced by anything
            if row:
                row[draw(st.integers(0, len(row) - 1))] = draw(_cell)
        if draw(st.integers(0, 9)) == 0:  # a ragged row now and then
            row = row[: draw(st.integers(0, len(row)))]
        rows.append(row)
    return header, rows


@FUZZ
@given(
    table=_label_csv(),
    quoted=st.booleans(),
    encoding=st.sampled_from(["utf-8", "utf-8", "utf-8-sig", "latin-1", "utf-16"]),
    tail=st.sampled_from([b"", b"", b"\n\n", b"\x00\xff", b"\r\n1,2"]),
)
def test_fuzz_label_csv_reader(
    tmp_path: Path, table: tuple[list[str], list[list[str]]], quoted: bool, encoding: str, tail: bytes
) -> None:
    import numpy as np

    from monai_vce.data import read_label_csv

    header, rows = table
    if quoted:
        buf = io.StringIO()
        csv.writer(buf, lineterminator="\n", quoting=csv.QUOTE_ALL).writerows([header, *rows])
        text = buf.getvalue()
    else:
        text = "\n".join(",".join(r) for r in [header, *rows]) + "\n"
    path = tmp_path / "7.csv"
    path.write_bytes(text.encode(encoding, errors="replace") + tail)
    with _bounded("read_label_csv"):
        try:
            result = read_label_csv(path)
        except ValueError as e:
            message = str(e)
            assert str(path) in message and "\n" not in message and len(message) < 2000, message
            return
    # accepted: everything the reader promises holds
    assert result.labels.shape == (len(result), len(LABELS)) and result.labels.dtype == np.float32
    assert set(np.unique(result.labels)) <= {0.0, 1.0}
    for ids in (result.index, result.frame):
        assert ids.dtype == np.int64 and (ids >= 0).all() and (ids <= 2**31 - 1).all()
