"""Chapters are stored executed (nbval silently skips unrun cells) and the TOC lists them all."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = sorted(p for p in (ROOT / "chapters").glob("*.ipynb"))


def test_there_are_chapters():
    assert CHAPTERS, "no chapter notebooks found"


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.name)
def test_notebook_stored_executed_in_order(path):
    nb = json.loads(path.read_text())
    counts = [c.get("execution_count") for c in nb["cells"] if c["cell_type"] == "code" and "".join(c["source"]).strip()]
    assert counts, f"{path.name} has no code cells"
    assert None not in counts, f"{path.name}: {counts.count(None)} code cell(s) never executed"
    assert counts == list(range(1, len(counts) + 1)), f"{path.name} not executed top to bottom in one kernel: {counts}"
    for c in nb["cells"]:
        for out in c.get("outputs", []):
            assert out.get("output_type") != "error", f"{path.name} stores an error output"


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.name)
def test_notebook_outputs_have_no_absolute_paths_or_pngs_from_sympy(path):
    nb = json.loads(path.read_text())
    text = json.dumps([c.get("outputs", []) for c in nb["cells"]])
    assert "/work/" not in text and "/home/" not in text and "/root/" not in text, f"{path.name}: absolute path in outputs"


def _toc_files(toc: str) -> set[str]:
    return {m.strip().strip("\"'") for m in re.findall(r"^\s*-?\s*file:\s*(\S+)", toc, flags=re.M)}


def test_toc_and_chapters_list_the_same_notebooks():
    toc = _toc_files((ROOT / "_toc.yml").read_text())
    in_toc = {f for f in toc if f.startswith("chapters/")}
    on_disk = {f"chapters/{p.stem}" for p in CHAPTERS}
    assert in_toc == on_disk, f"only in _toc.yml: {in_toc - on_disk}; only in chapters/: {on_disk - in_toc}"
    for f in toc:
        assert any((ROOT / f"{f}{ext}").exists() for ext in (".md", ".ipynb")), f"_toc.yml names missing file {f}"


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.name)
def test_chapter_follows_the_template(path):
    """Colab setup cell first, a chapter label, imports from valuelab, at least two exercises with solutions."""
    nb = json.loads(path.read_text())
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    first = "".join(code[0]["source"])
    assert '"google.colab" in sys.modules' in first, f"{path.name}: the first code cell must be the Colab setup cell"
    md = "\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "markdown")
    assert re.match(r"\(ch-[\w-]+\)=", "".join(nb["cells"][0]["source"])), f"{path.name}: first cell must open with a (ch-...)= label"
    assert "import valuelab" in "".join("".join(c["source"]) for c in code), f"{path.name}: chapters use valuelab"
    exercises = re.findall(r"```\{exercise\}", md) + re.findall(r":::\{exercise\}", md)
    solutions = re.findall(r"[`:]{3}\{solution(?:-start)?\}", md)
    assert len(re.findall(r"\{solution-start\}", md)) == len(re.findall(r"\{solution-end\}", md)), (
        f"{path.name}: every solution-start needs its solution-end")
    assert len(exercises) >= 2, f"{path.name}: needs at least two exercises"
    assert len(solutions) >= len(exercises), f"{path.name}: every exercise needs a solution"


def proposition_blocks(markdown: str) -> list[tuple[str, str, str]]:
    """(label, title, body) of each ```{prf:proposition} block, nested ``` or ::: fences inside included."""
    out, lines, i = [], markdown.split("\n"), 0
    while i < len(lines):
        head = re.match(r"(`{3,})\{prf:proposition\}\s*(.*)$", lines[i])
        if not head:
            i += 1
            continue
        fence, title, body, depth = head.group(1), head.group(2), [], 0
        i += 1
        while i < len(lines):
            line = lines[i]
            if re.match(r"`{3,}[^`\s]", line):
                depth += 1  # a nested directive or code block opens
            elif re.fullmatch(r"`{3,}\s*", line):
                if depth == 0 and line.strip() == fence:
                    break
                depth -= 1
            body.append(line)
            i += 1
        label = next((m.group(1) for m in map(re.compile(r":label: (prop-[\w-]+)").match, body) if m), "")
        text = "\n".join(b for b in body if not b.startswith(":label:"))
        out.append((label, title.strip(), text))
        i += 1
    return out


STATUS = re.compile(r"\*Status: (proved symbolically, in general|checked on an instance|"
                    r"proved in the text; checked numerically) \(.+\)\.?\*\s*$", re.S)
KIND = {"proved symbolically, in general": "general", "checked on an instance": "instance",
        "proved in the text; checked numerically": "numerically"}


def propositions() -> dict[str, tuple[str, str]]:
    """label -> (chapter file, status kind) for every {prf:proposition} of every chapter."""
    found = {}
    for path in CHAPTERS:
        nb = json.loads(path.read_text(encoding="utf-8"))
        for cell in nb["cells"]:
            if cell["cell_type"] != "markdown":
                continue
            for label, _, body in proposition_blocks("".join(cell["source"])):
                last = body.strip().split("\n\n")[-1]
                m = STATUS.match(last.strip())
                found[label] = (path.name, KIND[m.group(1)] if m else "")
    return found


def test_every_proposition_says_how_it_is_checked():
    """The last paragraph of each proposition is its status: proved in general, on an instance, or numerically."""
    props = propositions()
    assert len(props) >= 20
    missing = sorted(f"{chapter}: {label}" for label, (chapter, kind) in props.items() if not kind)
    assert not missing, "propositions without a '*Status: ...*' line:\n" + "\n".join(missing)


def test_introduction_lists_every_proposition_with_its_status():
    """intro.md's table has one row per proposition, with the same status word as the chapter."""
    intro = (ROOT / "intro.md").read_text(encoding="utf-8")
    rows = {m.group(1): m.group(2) for m in re.finditer(r"^\|[^\n]*\{prf:ref\}`(prop-[\w-]+)`[^\n]*\|\s*(\w+)\s*\|\s*$",
                                                      intro, re.M)}
    props = propositions()
    assert set(rows) == set(props), (sorted(set(props) - set(rows)), sorted(set(rows) - set(props)))
    wrong = {label: (rows[label], kind) for label, (_, kind) in props.items() if rows[label] != kind}
    assert not wrong, wrong


ANSWER_BOX = re.compile(r"^(`{3,}|:{3,})\{admonition\} The question and the answer\n:class: [^\n]*\btip\b[^\n]*\n(.*?)^\1\s*$",
                        re.S | re.M)


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_chapter_answers_first_and_summarises(path):
    """Issue 26: under the title, a short box with the question and the measured answer; a Summary before the exercises.

    The box is the first thing after the title line; it asks one question in bold and answers it with at least one
    number glued from the computation (``{glue:text}``), in at most 170 words. The chapter ends with a ``## Summary``
    section placed before ``## Exercises``.
    """
    nb = json.loads(path.read_text(encoding="utf-8"))
    first = "".join(nb["cells"][0]["source"])
    after_title = re.split(r"^# .+\n", first, maxsplit=1, flags=re.M)
    assert len(after_title) == 2, f"{path.name}: the first cell must hold the chapter's title"
    box = ANSWER_BOX.match(after_title[1].lstrip("\n"))
    assert box, f"{path.name}: the first thing under the title must be the 'The question and the answer' box"
    body = box.group(2)
    assert re.search(r"\*\*[^*]+\?\*\*", body), f"{path.name}: the box must ask its question in bold"
    assert re.search(r"\{glue(?::text)?\}`[\w-]+`", body), f"{path.name}: the box's answer needs a glued number"
    words = len(re.sub(r"\{[\w:-]+\}`[^`]*`", "x", body).split())
    assert words <= 170, f"{path.name}: the answer box has {words} words (at most 170: it must fit the first screen)"
    md = [("".join(c["source"])) for c in nb["cells"] if c["cell_type"] == "markdown"]
    heads = [h for cell in md for h in re.findall(r"^## (.+)$", cell, re.M)]
    assert "Summary" in heads, f"{path.name}: needs a '## Summary' section"
    if "Exercises" in heads:
        assert heads.index("Summary") < heads.index("Exercises"), f"{path.name}: the Summary comes before the Exercises"
