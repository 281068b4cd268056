"""The 17 RARE-VISION labels of the Galar dataset, their groups and the clinical text prompts; every per-label array
uses the order of :data:`LABELS`.
"""

from __future__ import annotations

import string
from collections.abc import Iterable, Sequence

__all__ = [
    "LABELS",
    "NUM_LABELS",
    "ANATOMY",
    "PATHOLOGY",
    "SECTIONS",
    "LANDMARKS",
    "LANDMARK_BOUNDARIES",
    "PROMPT_TEMPLATES",
    "LABEL_DESCRIPTIONS",
    "label_index",
    "label_indices",
    "labels_to_multi_hot",
    "multi_hot_to_labels",
    "PROMPT_PLACEHOLDERS",
    "check_templates",
    "prompts_for",
    "all_prompts",
]

#: Anatomical sections, ordered along the gut (a capsule passes them in this order).
SECTIONS: tuple[str, ...] = ("mouth", "esophagus", "stomach", "small intestine", "colon")
#: Anatomical landmarks: short structures at the boundary between two consecutive sections.
LANDMARKS: tuple[str, ...] = ("z-line", "pylorus", "ileocecal valve")
#: Anatomy labels: sections then landmarks.
ANATOMY: tuple[str, ...] = SECTIONS + LANDMARKS
#: Pathology labels.
PATHOLOGY: tuple[str, ...] = (
    "active bleeding",
    "angiectasia",
    "blood",
    "erosion",
    "erythema",
    "hematin",
    "lymphangioectasis",
    "polyp",
    "ulcer",
)
#: The 17 labels in the canonical order of every per-label array.
LABELS: tuple[str, ...] = ANATOMY + PATHOLOGY
NUM_LABELS: int = len(LABELS)

#: For each landmark, the two sections whose boundary it marks.
LANDMARK_BOUNDARIES: dict[str, tuple[str, str]] = {
    "z-line": ("esophagus", "stomach"),
    "pylorus": ("stomach", "small intestine"),
    "ileocecal valve": ("small intestine", "colon"),
}

#: Placeholders of a prompt template: ``{label}``, the label's description (:data:`LABEL_DESCRIPTIONS`), and
#: ``{name}``, its name as in :data:`LABELS` (the authors' code uses ``"a video capsule endoscopy image showing {name}"``).
PROMPT_PLACEHOLDERS: tuple[str, ...] = ("label", "name")
#: Default prompt templates of the contrastive path; ``{label}`` is replaced by the label's description.
PROMPT_TEMPLATES: tuple[str, ...] = (
    "a video capsule endoscopy image showing {label}",
    "a capsule endoscopy frame of {label}",
    "an endoscopic image of {label}",
    "a wireless capsule endoscopy photo showing {label}",
)

#: Clinical wording of each label used inside the prompts.
LABEL_DESCRIPTIONS: dict[str, str] = {
    "mouth": "the mouth",
    "esophagus": "the esophagus",
    "stomach": "the stomach mucosa",
    "small intestine": "the small intestine with villi",
    "colon": "the colon",
    "z-line": "the z-line, the gastroesophageal junction",
    "pylorus": "the pylorus",
    "ileocecal valve": "the ileocecal valve",
    "active bleeding": "active bleeding",
    "angiectasia": "angiectasia, a vascular lesion",
    "blood": "blood in the lumen",
    "erosion": "a mucosal erosion",
    "erythema": "erythema, reddened mucosa",
    "hematin": "hematin, digested blood",
    "lymphangioectasis": "lymphangiectasia, white dilated lacteals",
    "polyp": "a polyp",
    "ulcer": "an ulcer",
}

_INDEX = {name: i for i, name in enumerate(LABELS)}


def label_index(name: str) -> int:
    """Return the position of ``name`` in :data:`LABELS`.

    Args:
        name: a label name, matched case-insensitively with surrounding blanks ignored.

    Raises:
        KeyError: when ``name`` is not one of the 17 labels; the message lists the valid names.
    """
    key = name.strip().lower() if isinstance(name, str) else name
    if key not in _INDEX:
        raise KeyError(f"unknown label {name!r}; expected one of {', '.join(LABELS)}")
    return _INDEX[key]


def label_indices(names: Iterable[str]) -> list[int]:
    """Return the positions of several label names (see :func:`label_index`)."""
    return [label_index(n) for n in names]


def labels_to_multi_hot(names: Iterable[str]) -> list[float]:
    """Return a 17-long 0/1 float list with ones at the given label names."""
    out = [0.0] * NUM_LABELS
    for i in label_indices(names):
        out[i] = 1.0
    return out


def multi_hot_to_labels(vector: Sequence[float], threshold: float = 0.5) -> list[str]:
    """Return the names whose value in a 17-long vector is at least ``threshold``, in :data:`LABELS` order."""
    if len(vector) != NUM_LABELS:
        raise ValueError(f"expected {NUM_LABELS} values in LABELS order, got {len(vector)}")
    return [name for name, v in zip(LABELS, vector, strict=False) if v >= threshold]


def check_templates(templates: Sequence[str] | None = None) -> tuple[str, ...]:
    """Return the prompt templates as a tuple after checking them; None gives :data:`PROMPT_TEMPLATES`.

    Args:
        templates: strings, each using ``{label}`` and/or ``{name}`` (see :data:`PROMPT_PLACEHOLDERS`) and no other
            placeholder (plain, without conversion or format spec); ``{{`` and ``}}`` are literal braces.

    Raises:
        ValueError: an empty sequence, a single string instead of a sequence, a template that is not a string, has
            no placeholder, another placeholder or unbalanced braces.
    """
    if templates is None:
        return PROMPT_TEMPLATES
    if isinstance(templates, str):
        raise ValueError(f"prompt templates must be a sequence of strings, got the single string {templates!r}")
    out = tuple(templates)
    if not out:
        raise ValueError("prompt templates must not be empty")
    for template in out:
        if not isinstance(template, str):
            raise ValueError(f"prompt template {template!r} is not a string")
        try:
            parsed = [(field, spec, conv) for _, field, spec, conv in string.Formatter().parse(template)]
        except ValueError as err:
            raise ValueError(f"prompt template {template!r} is malformed: {err}") from None
        fields = {field for field, _, _ in parsed if field is not None}
        if any(spec or conv for field, spec, conv in parsed if field is not None):
            raise ValueError(f"prompt template {template!r}: placeholders take no conversion or format spec")
        other = sorted(fields - set(PROMPT_PLACEHOLDERS))
        if other:
            raise ValueError(
                f"prompt template {template!r} has placeholder(s) {other}; only {{label}} and {{name}} are allowed"
            )
        if not fields:
            raise ValueError(f"prompt template {template!r} has neither {{label}} nor {{name}}")
    return out


def prompts_for(name: str, templates: Sequence[str] | None = None) -> list[str]:
    """Return the prompt variants of one label, one per template.

    Args:
        name: a label name (see :func:`label_index`).
        templates: prompt templates (see :func:`check_templates`); None: :data:`PROMPT_TEMPLATES`.

    Raises:
        KeyError: an unknown label name.
        ValueError: invalid templates.
    """
    key = LABELS[label_index(name)]
    desc = LABEL_DESCRIPTIONS[key]
    return [t.format(label=desc, name=key) for t in check_templates(templates)]


def all_prompts(templates: Sequence[str] | None = None) -> dict[str, list[str]]:
    """Return ``{label: [prompt variants]}`` for the 17 labels in :data:`LABELS` order (see :func:`prompts_for`)."""
    checked = check_templates(templates)
    return {name: prompts_for(name, checked) for name in LABELS}
