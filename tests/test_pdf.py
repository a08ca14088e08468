"""The two PDFs of ``make pdf`` (issue 29): pages that are not blank, a text layer with the chapters' titles.

``make pdf`` builds ``_build/pdf/valuelab-book-en.pdf`` and
``valuelab-book-zh.pdf`` through xelatex and then runs this file with
``REQUIRE_PDF=1``; elsewhere it skips when the PDFs are not built. Three
pages of each are rendered to PNG with ``pdftoppm`` (the title page, the
first page of chapter 1's text and a page from the middle); the text layer
(``pdftotext``) must hold the title of every chapter, in the edition's
language. The LaTeX preamble must define every macro the web pages'
MathJax defines, so that the PDF typesets the same equations.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
PDF = ROOT / "_build" / "pdf"
EDITIONS = {"en": (PDF / "valuelab-book-en.pdf", ROOT / "chapters"), "zh": (PDF / "valuelab-book-zh.pdf", ROOT / "zh" / "chapters")}
TOOLS = shutil.which("pdftoppm") and shutil.which("pdftotext")
BUILT = all(p.is_file() for p, _ in EDITIONS.values())
if os.environ.get("REQUIRE_PDF") and not (BUILT and TOOLS):
    raise RuntimeError("REQUIRE_PDF is set but the PDFs (make pdf) or pdftoppm/pdftotext are missing")
needs_pdf = pytest.mark.skipif(not (BUILT and TOOLS), reason="make pdf builds the PDFs (needs xelatex, poppler-utils)")


def chapter_titles(folder: Path) -> list:
    """The first heading of every chapter notebook in the folder, without its markup."""
    out = []
    for nb in sorted(folder.glob("*.ipynb")):
        cells = json.loads(nb.read_text(encoding="utf-8"))["cells"]
        text = next("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
        title = re.search(r"^# (.+)$", text, flags=re.M).group(1)
        out.append(re.sub(r"\{[\w:]+\}`([^`<]*)(?:<[^>]*>)?`", r"\1", title).replace("`", "").strip())
    return out


def pages(pdf: Path) -> int:
    info = subprocess.run(["pdfinfo", str(pdf)], capture_output=True, text=True, check=True).stdout
    return int(re.search(r"^Pages:\s+(\d+)", info, flags=re.M).group(1))


def ink(png: Path) -> float:
    """The share of pixels that are not near-white."""
    from PIL import Image

    img = Image.open(png).convert("L")
    hist = img.histogram()
    return sum(hist[:200]) / (img.width * img.height)


@needs_pdf
@pytest.mark.parametrize("lang", list(EDITIONS))
def test_three_pages_render_with_ink_on_them(lang, tmp_path):
    pdf = EDITIONS[lang][0]
    n = pages(pdf)
    assert n > 100, f"{pdf.name}: {n} pages"
    text = subprocess.run(["pdftotext", "-layout", str(pdf), "-"], capture_output=True, text=True, check=True).stdout
    by_page = text.split("\f")
    first = chapter_titles(EDITIONS[lang][1])[0]
    start = next(i for i, p in enumerate(by_page) if first.split(":")[0] in " ".join(p.split()) and i > 3)
    for k in (1, start + 1, n // 2):
        out = tmp_path / f"p{k}"
        subprocess.run(["pdftoppm", "-r", "50", "-f", str(k), "-l", str(k), "-png", str(pdf), str(out)], check=True)
        png = next(tmp_path.glob(f"p{k}*.png"))
        assert ink(png) > 0.005, f"{pdf.name} page {k} is blank"


@needs_pdf
@pytest.mark.parametrize("lang", list(EDITIONS))
def test_the_text_layer_holds_every_chapters_title(lang):
    pdf, folder = EDITIONS[lang]
    text = subprocess.run(["pdftotext", str(pdf), "-"], capture_output=True, text=True, check=True).stdout
    def norm(s: str) -> str:  # LaTeX's typographic quotes and dashes, and its line breaks
        return re.sub(r"\s+", "", s).translate(str.maketrans({"’": "'", "‘": "'", "“": '"', "”": '"', "–": "-", "—": "-"}))

    flat = norm(text)
    for title in chapter_titles(folder):
        assert norm(title) in flat, f"{pdf.name}: no {title!r} in the text layer"
    if lang == "zh":
        assert re.search(r"[\u4e00-\u9fff]{20}", text), "the Chinese PDF has no Chinese text layer"


def test_the_latex_preamble_defines_every_mathjax_macro():
    config = yaml.safe_load((ROOT / "_config.yml").read_text(encoding="utf-8"))["sphinx"]["config"]
    macros = config["mathjax3_config"]["tex"]["macros"]
    preamble = config["latex_elements"]["preamble"]
    defined = dict(re.findall(r"^\\newcommand\{\\(\w+)\}\{(.+)\}\s*$", preamble, flags=re.M))
    assert defined == {name: body for name, body in macros.items()}


HTML = Path(os.environ.get("BOOK_HTML") or ROOT / "_build" / "html")


def web_equation_numbers(lang: str, nb: Path) -> list:
    """The equation numbers the chapter's web page shows, in order (the built book: make book)."""
    page = (HTML / ("zh" if lang == "zh" else "") / "chapters" / f"{nb.stem}.html").read_text(encoding="utf-8")
    return list(dict.fromkeys(re.findall(r'class="eqno">\(([^)<]+)\)', page)))


@needs_pdf
@pytest.mark.skipif(not (HTML / "zh" / "index.html").is_file(), reason="the web pages are not built (make book)")
@pytest.mark.parametrize("lang", list(EDITIONS))
@pytest.mark.parametrize("number", [3, 5, 12])
def test_a_chapters_equations_are_numbered_as_on_its_web_page(lang, number):
    # on the web chapter 5's equations are (5.1), (5.2), ...; in the PDF they must be too, inside chapter 5's pages
    pdf, folder = EDITIONS[lang]
    nb = next(folder.glob(f"{number:02d}_*.ipynb"))
    web = web_equation_numbers(lang, nb)
    assert len(web) >= 2 and all(n.startswith(f"{number}.") for n in web), (nb.name, web)
    text = subprocess.run(["pdftotext", str(pdf), "-"], capture_output=True, text=True, check=True).stdout.split("\f")
    # the chapter's pages: those whose running header names it, the opening page before them, the page after
    pages_of = [i for i, p in enumerate(text) if re.search(rf"^Chapter {number}\.\s", p, flags=re.M)]
    assert pages_of, f"{pdf.name}: no page headed 'Chapter {number}.'"
    span = "\n".join(text[pages_of[0] - 1: pages_of[-1] + 2])
    for n in web:
        assert f"({n})" in span, f"{pdf.name}: equation ({n}) is not in chapter {number}'s pages"
    last = int(web[-1].split(".")[1])
    assert f"({number}.{last + 1})" not in span


@needs_pdf
@pytest.mark.parametrize("lang", list(EDITIONS))
def test_no_line_runs_off_the_paper(lang):
    # Sphinx's LaTeX pages have a 1 in (72.27 pt) side margin (sphinx.sty's hmargin); a line LaTeX reports as
    # overfull sticks out into it. Allowed: up to 60 pt (a 12 pt gap to the paper's edge stays); the intro's
    # table of propositions before its column widths were set stuck out 85 pt, past the edge.
    log = (PDF / lang / "_build" / "latex" / "book.log").read_text(encoding="utf-8", errors="replace")
    over = [float(x) for x in re.findall(r"Overfull \\hbox \(([\d.]+)pt too wide\)", log)]
    assert "Output written on book.pdf" in log, "not the log of the build that wrote the PDF"
    assert max(over) < 60.0, f"{lang}: a line sticks out {max(over):.1f} pt (margin 72.3 pt)"
