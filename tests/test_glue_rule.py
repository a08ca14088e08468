"""Numbers in prose come from `glue`: a glued value typed by hand into a markdown cell fails this test."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = sorted((ROOT / "chapters").glob("*.ipynb"))
GLUE_MIME = "application/papermill.record/text/plain"
ROLE = re.compile(r"\{glue(?::\w+)?\}`[^`]*`")


def glued_values(nb: dict) -> dict[str, str]:
    out = {}
    for cell in nb["cells"]:
        for o in cell.get("outputs", []):
            data = o.get("data", {})
            key = o.get("metadata", {}).get("scrapbook", {}).get("name")
            if key and GLUE_MIME in data:
                out[key] = data[GLUE_MIME].strip("'\"")
    return out


def significant(value: str) -> bool:
    """A number distinctive enough that its appearance in prose is no coincidence (>= 3 digits)."""
    return bool(re.fullmatch(r"-?\d+(\.\d+)?(e-?\d+)?", value)) and len(re.sub(r"\D", "", value.split("e")[0])) >= 3


def hand_typed(nb: dict) -> list[str]:
    """Glued values that also appear, typed, in the notebook's markdown."""
    values = {k: v for k, v in glued_values(nb).items() if significant(v)}
    found = []
    for cell in nb["cells"]:
        if cell["cell_type"] != "markdown":
            continue
        prose = ROLE.sub("", "".join(cell["source"]))
        for key, v in values.items():
            if re.search(rf"(?<![\w.]){re.escape(v)}(?![\w])", prose):
                found.append(f"{key}={v}")
    return found


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.name)
def test_no_hand_typed_glued_numbers(path):
    found = hand_typed(json.loads(path.read_text()))
    assert not found, f"{path.name}: glued values typed into the prose (use {{glue:text}}`key`): {found}"


def test_the_rule_catches_a_typed_number():
    glue_out = {"output_type": "display_data", "metadata": {"scrapbook": {"name": "x-err"}}, "data": {GLUE_MIME: "0.123"}}
    nb = {"cells": [{"cell_type": "code", "outputs": [glue_out], "source": ""},
                    {"cell_type": "markdown", "source": "The error is {glue:text}`x-err`."}]}
    assert hand_typed(nb) == []
    nb["cells"][1]["source"] = "The error is 0.123."
    assert hand_typed(nb) == ["x-err=0.123"]


def test_glue_roles_name_existing_keys():
    keys = set()
    for p in CHAPTERS:
        keys |= set(glued_values(json.loads(p.read_text())))
    for p in list(CHAPTERS) + [m for m in sorted(ROOT.glob("*.md")) if m.name not in {"README.md", "CONTRIBUTING.md"}]:
        text = p.read_text()
        for m in re.finditer(r"\{glue(?::\w+)?\}`([^`]+)`", text):
            name = m.group(1).split(":")[0].strip()
            assert name in keys, f"{p.name} refers to unknown glue key {name!r}"
