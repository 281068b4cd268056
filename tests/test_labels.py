import subprocess
import sys

import pytest

from monai_vce import labels as L


def test_label_order_and_groups():
    assert L.LABELS == (
        "mouth",
        "esophagus",
        "stomach",
        "small intestine",
        "colon",
        "z-line",
        "pylorus",
        "ileocecal valve",
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
    assert L.NUM_LABELS == 17
    assert L.ANATOMY + L.PATHOLOGY == L.LABELS
    assert set(L.SECTIONS) | set(L.LANDMARKS) == set(L.ANATOMY)
    for landmark, (a, b) in L.LANDMARK_BOUNDARIES.items():
        assert L.SECTIONS.index(b) == L.SECTIONS.index(a) + 1, landmark


def test_name_mapping():
    assert L.label_index("ulcer") == 16
    assert L.label_index(" Small Intestine ") == 3
    assert L.label_indices(["colon", "polyp"]) == [4, 15]
    v = L.labels_to_multi_hot(["mouth", "blood"])
    assert v[0] == 1.0 and v[10] == 1.0 and sum(v) == 2.0
    assert L.multi_hot_to_labels(v) == ["mouth", "blood"]
    with pytest.raises(KeyError, match="unknown label 'bleeding'"):
        L.label_index("bleeding")
    with pytest.raises(ValueError, match="expected 17"):
        L.multi_hot_to_labels([1.0, 0.0])


def test_prompts_cover_every_label():
    prompts = L.all_prompts()
    assert list(prompts) == list(L.LABELS)
    for variants in prompts.values():
        assert len(variants) == len(L.PROMPT_TEMPLATES) >= 3
        assert len(set(variants)) == len(variants)
    assert prompts["ulcer"][0] == "a video capsule endoscopy image showing an ulcer"


def test_package_import_is_light_and_silent():
    code = (
        # CPU time of the import, not wall time: a loaded machine does not slow it, a heavy import does
        "import sys, time; t = time.process_time(); import monai_vce, monai_vce.labels; dt = time.process_time() - t; "
        "heavy = [m for m in ('torch', 'monai', 'open_clip', 'timm', 'ignite') if m in sys.modules]; "
        "assert not heavy, heavy; assert dt < 2.0, dt"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert res.stdout == "" and res.stderr == ""


def test_prompt_templates_with_name_and_label():
    templates = ["a video capsule endoscopy image showing {name}", "{name}: {label}"]
    assert L.prompts_for("ulcer", templates) == [
        "a video capsule endoscopy image showing ulcer",
        "ulcer: an ulcer",
    ]
    assert L.prompts_for(" Z-Line ", ["{name} / {label}"]) == ["z-line / the z-line, the gastroesophageal junction"]
    prompts = L.all_prompts(("{{literal}} {name}",))
    assert list(prompts) == list(L.LABELS) and prompts["blood"] == ["{literal} blood"]
    assert L.all_prompts(None) == L.all_prompts(L.PROMPT_TEMPLATES)
    assert L.all_prompts()["ulcer"][0] == "a video capsule endoscopy image showing an ulcer"


@pytest.mark.parametrize(
    "templates, match",
    [
        ([], "must not be empty"),
        (["an image of blood"], "neither {label} nor {name}"),
        (["{label} in {organ}"], r"placeholder\(s\) \['organ'\]"),
        (["an image of {}"], r"placeholder\(s\) \[''\]"),
        (["{label"], "malformed"),
        (["{label!r}"], "no conversion or format spec"),
        ("{label}", "single string"),
        ([3], "not a string"),
    ],
)
def test_prompt_template_errors(templates, match):
    with pytest.raises(ValueError, match=match) as err:
        L.all_prompts(templates)
    assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match=match):
        L.prompts_for("polyp", templates)
