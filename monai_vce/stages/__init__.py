"""The stages after the probability folder: plain, engine-free functions from folders to files.

``refine`` (probabilities -> refined probabilities), ``decode`` (probabilities -> event JSON, the one writer),
``report`` and ``review`` (event JSON -> report, review site).
"""

from __future__ import annotations

from ._common import main_process
from .decode import as_decoder, decode, events_units, write_events
from .refine import refine
from .report import report
from .review import review

__all__ = ["main_process", "as_decoder", "decode", "events_units", "write_events", "refine", "report", "review"]
