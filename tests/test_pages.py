"""Issue 26: what a reader meets, read from the built HTML book (no browser needed).

``make test`` builds the book first and passes it in ``BOOK_HTML``; run alone,
the tests read ``_build/html`` and are skipped when no book is built there.
Widths (tables, output blocks, figures at display size, the API page on a
phone) need a browser: tests/test_browser.py.

- every figure of a chapter has a number, a caption and alt text that
  describes it (not a file name, not empty);
- a solution is collapsed together with its code: the cell right after a
  solution holds only a self-check, never the model answer;
- no page shows an internal target ("the target was 500: not met") or
  spells a chapter's whole title where "chapter 7" reads better.
"""

from __future__ import annotations

import functools
import os
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HTML = Path(os.environ.get("BOOK_HTML") or ROOT / "_build" / "html")
CHAPTERS = sorted(p.stem for p in (ROOT / "chapters").glob("*.ipynb"))

if os.environ.get("BOOK_HTML") and not (HTML / "index.html").is_file():
    raise RuntimeError(f"BOOK_HTML={HTML} holds no built book")
pytestmark = pytest.mark.skipif(not (HTML / "chapters").is_dir(), reason="no built book: make book")


def _main(stem: str):
    from bs4 import BeautifulSoup

    soup = BeautifulSoup((HTML / "chapters" / f"{stem}.html").read_text(encoding="utf-8"), "html.parser")
    return soup.find("main") or soup


FILE_NAME = re.compile(r"(\.(png|jpe?g|svg|gif|pdf)$)|^[0-9a-f]{16,}|^_images/|^fig[-_]?\d*$", re.I)


@pytest.mark.parametrize("stem", CHAPTERS)
def test_every_figure_has_a_number_a_caption_and_alt_text(stem):
    main = _main(stem)
    bad = []
    for img in main.find_all("img"):
        if "_images/" not in img.get("src", ""):
            continue  # the launch buttons' logos
        src, alt = img.get("src", ""), (img.get("alt") or "").strip()
        fig = img.find_parent("figure")
        cap = fig.find("figcaption") if fig else None
        number = cap.find(class_="caption-number") if cap else None
        text = cap.get_text(" ", strip=True) if cap else ""
        if not (cap and number and len(text.split()) >= 6):
            bad.append(f"{src}: no numbered caption ({text[:60]!r})")
        if not alt or FILE_NAME.search(alt) or len(alt.split()) < 4:
            bad.append(f"{src}: alt text {alt!r} does not describe the figure")
    assert not bad, f"{stem}:\n" + "\n".join(bad)


SELF_CHECK = re.compile(r"^\s*#\s*self-check", re.I)


def _code(cell) -> str:
    pre = cell.find("pre")
    return pre.get_text() if pre else ""


@pytest.mark.parametrize("stem", CHAPTERS)
def test_solutions_are_collapsed_with_their_code(stem):
    """Each solution is a dropdown; the code cell right after it may only be the exercise's self-check."""
    main = _main(stem)
    solutions = main.find_all("div", class_="solution")
    assert solutions, f"{stem}: no solution found"
    for sol in solutions:
        title = sol.find(class_="admonition-title").get_text(" ", strip=True)
        assert "dropdown" in sol.get("class", []), f"{stem}: '{title}' is not collapsed"
        nxt = sol.find_next_sibling()
        if nxt is not None and "cell" in (nxt.get("class") or []) and nxt.find(class_="cell_input"):
            assert SELF_CHECK.match(_code(nxt)), (
                f"{stem}: the code after '{title}' is shown to every reader: "
                f"{_code(nxt)[:120]!r}; put it between solution-start and solution-end")


INTERNAL = re.compile(r"\b(?:the )?target (?:was|is) [\d,.]+[^.]*(?:not met|met)\b|\bTODO\b|\bFIXME\b", re.I)


@functools.lru_cache(maxsize=None)
def _titles() -> dict:
    """Chapter stem -> its title as the built page shows it."""
    from bs4 import BeautifulSoup

    out = {}
    for stem in CHAPTERS:
        soup = BeautifulSoup((HTML / "chapters" / f"{stem}.html").read_text(encoding="utf-8"), "html.parser")
        h1 = next(h for h in soup.find_all("h1") if h.find_parent("section") is not None)
        out[stem] = re.sub(r"^\s*[\dA]+\.?\s*|#\s*$", "", h1.get_text(" ", strip=True)).strip()
    return out


@pytest.mark.parametrize("stem", CHAPTERS)
def test_prose_has_no_internal_targets_or_title_length_references(stem):
    main = _main(stem)
    for tag in main.find_all(["pre", "script", "style", "nav"]):
        tag.decompose()
    for cell in main.find_all(class_="cell"):
        cell.decompose()
    text = main.get_text(" ", strip=True)
    hits = INTERNAL.findall(text)
    assert not hits, f"{stem}: internal targets in the prose: {hits[:3]}"
    titles = set(_titles().values())
    long_refs = sorted({a.get_text(" ", strip=True) for a in main.find_all("a", class_="reference")
                        if a.get_text(" ", strip=True) in titles and not a.find_parent(class_="toctree-wrapper")
                        and re.match(r"(\.\./chapters/|(?!\.\./)[\w-]+\.html|#)", a.get("href") or "")})
    assert not long_refs, f"{stem}: cross-references that spell a chapter's whole title (write 'chapter N'): {long_refs[:4]}"


@pytest.mark.parametrize("stem", CHAPTERS)
def test_answer_box_under_the_title_and_a_summary(stem):
    """The first thing under the chapter's title is the question-and-answer box, its numbers filled in; a Summary follows."""
    main = _main(stem)
    h1 = next(h for h in main.find_all("h1") if h.find_parent("section") is not None)  # not the print-only header
    first = h1.find_next_sibling(lambda t: t.name and t.name not in ("span", "a"))
    assert first is not None and "admonition" in (first.get("class") or []), f"{stem}: nothing boxed under the title"
    title = first.find(class_="admonition-title").get_text(" ", strip=True)
    assert title == "The question and the answer", f"{stem}: the first box under the title is {title!r}"
    body = first.get_text(" ", strip=True)
    assert "?" in body and re.search(r"\d", body), f"{stem}: the box must ask a question and answer it with numbers"
    assert not re.search(r"\{glue|glue:text", body), f"{stem}: an unfilled glue reference in the answer box"
    summary = main.find("section", id="summary")
    assert summary is not None and len(summary.get_text(" ", strip=True).split()) >= 30, f"{stem}: no Summary section"
