"""The Chinese edition (issue 29): every unit translated and current, the machinery and the terms kept, zh/ in step.

The English notebooks and pages are the only source of code, outputs, glued
numbers and figures; ``tools/zh.py`` keys each translation by the English
text it translates. These tests fail on a missing or stale translation, on
one that loses a piece of the machinery or a glossary term, and on a ``zh/``
that is not what ``tools/zh.py build`` writes now. The checker itself is
first run on planted slips, each of which it must report.
"""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import zh  # noqa: E402

SOURCES = zh.sources()
IDS = [s.relative_to(ROOT).as_posix() for s in SOURCES]
HTML = Path(os.environ.get("BOOK_HTML") or ROOT / "_build" / "html")


@pytest.mark.parametrize("source", SOURCES, ids=IDS)
def test_every_unit_has_a_current_translation(source):
    st = zh.status_of(source)
    assert not st.missing, (f"{len(st.missing)} untranslated unit(s) in {zh.translation_path(source).name}: "
                            f"{[u.where for u in st.missing][:8]} (python tools/zh.py sync, then translate the todo blocks)")
    assert not st.stale, f"stale translation(s) in {zh.translation_path(source).name}: {st.stale[:8]}"


@pytest.mark.parametrize("source", SOURCES, ids=IDS)
def test_each_translation_keeps_the_machinery_and_the_glossarys_terms(source):
    problems = zh.check(source)
    assert not problems, "\n".join(problems[:12])


# ---- the checker, on planted slips --------------------------------------------------------------------------

EN = ("(sec-x)=\n## The target\n\nThe {term}`Monte-Carlo return` of {numref}`chapter %s <ch-td>` trains the value "
      "model: $G_t = r_t + \\gamma G_{t+1}$, `vl.gae` and {glue:text}`x-bias` ({cite:p}`schulman2016gae`).\n\n"
      "$$\nA_t = \\delta_t\n$$ (eq-a)\n\n```{admonition} The answer\n:class: tip\nSee [the notes](notation.md).\n```\n\n"
      "```python\nadv = vl.gae(r, v)\n```")
ZH = ("(sec-x)=\n## 目标\n\n{numref}`第 %s 章 <ch-td>` 的{term}`蒙特卡洛回报`训练价值模型：$G_t = r_t + \\gamma G_{t+1}$，"
      "`vl.gae` 与 {glue:text}`x-bias`（{cite:p}`schulman2016gae`）。\n\n$$\nA_t = \\delta_t\n$$ (eq-a)\n\n"
      "```{admonition} 答案\n:class: tip\n见[记号](notation.md)。\n```\n\n```python\nadv = vl.gae(r, v)\n```")

SLIPS = {
    "a glued number typed in": ("{glue:text}`x-bias`", "0.31", "role"),
    "a label renamed": ("(sec-x)=", "(sec-y)=", "label"),
    "an equation label dropped": ("$$ (eq-a)", "$$", "math"),
    "math translated": ("$G_t = r_t + \\gamma G_{t+1}$", "$G_t = r_t + \\gamma G_{t+1}$（回报）$\\text{回报}$", "inline math"),
    "inline code translated": ("`vl.gae`", "`优势函数`", "inline code"),
    "a reference's target changed": ("<ch-td>", "<ch-gae>", "role"),
    "a citation dropped": ("（{cite:p}`schulman2016gae`）", "", "role"),
    "a code block's comment translated": ("adv = vl.gae(r, v)\n```", "adv = vl.gae(r, v)  # 优势\n```", "directive"),
    "a link retargeted": ("(notation.md)", "(glossary.md)", "link target"),
    "a heading's level changed": ("## 目标", "### 目标", "heading"),
    "a glossary term in another form": ("训练价值模型", "训练价值网络", "价值模型"),
    "a term role's Chinese replaced by English": ("{term}`蒙特卡洛回报`", "{term}`Monte-Carlo return`", "蒙特卡洛回报"),
}


def test_the_checker_passes_a_faithful_translation():
    assert zh.check_unit(EN, ZH) == []


@pytest.mark.parametrize("slip", list(SLIPS))
def test_the_checker_reports_each_planted_slip(slip):
    old, new, reported = SLIPS[slip]
    assert ZH.count(old) == 1, slip
    problems = zh.check_unit(EN, ZH.replace(old, new))
    assert problems and any(reported in p for p in problems), (slip, problems)


def test_a_changed_english_cell_makes_its_translation_stale(tmp_path):
    source = ROOT / "chapters" / "05_gae.ipynb"
    copy_nb, copy_zh = tmp_path / source.name, tmp_path / zh.translation_path(source).name
    nb = json.loads(source.read_text(encoding="utf-8"))
    shutil.copy(zh.translation_path(source), copy_zh)
    i = next(i for i, c in enumerate(nb["cells"]) if c["cell_type"] == "markdown" and i > 0)
    nb["cells"][i]["source"] = "".join(nb["cells"][i]["source"]) + " One more sentence."
    copy_nb.write_text(json.dumps(nb), encoding="utf-8")
    st = zh.status_of(copy_nb)
    assert [u.where for u in st.missing] == [f"cell {i}"] and len(st.stale) == 1
    # sync keeps every current translation, marks the new unit todo (with its English text) and the old one stale
    st = zh.sync(copy_nb)
    marks = [(b.key, b.mark) for b in zh.read_blocks(copy_zh)]
    assert sum(m == "todo" for _, m in marks) == 1 and sum(m == "stale" for _, m in marks) == 1
    assert len(marks) == len(zh.units_of(copy_nb)) + 1


def test_the_glossary_pairs_are_read_as_the_page_states_them():
    pairs = {tuple(en): tuple(c) for en, c in zh.glossary_pairs()}
    assert pairs[("value model",)] == ("价值模型",)
    assert pairs[("generalized advantage estimation", "GAE")] == ("广义优势估计",)
    assert all(c for c in pairs.values()), [en for en, c in pairs.items() if not c]
    # the glossary's Chinese page keeps every headword, so a {term} role resolves in both editions
    zh_glossary = (ROOT / "zh" / "glossary.md").read_text(encoding="utf-8")
    for en, c in pairs.items():
        for t in en + c:
            assert re.search(rf"^{re.escape(t)}$", zh_glossary, flags=re.M), t


# ---- zh/: what tools/zh.py build writes -----------------------------------------------------------------------

def test_zh_is_what_the_build_writes_now():
    stale = [p.relative_to(ROOT).as_posix() for p, text in zh.generated().items()
             if not p.exists() or p.read_text(encoding="utf-8") != text]
    assert not stale, f"zh/ is behind its sources (python tools/zh.py build): {stale[:8]}"
    committed = {p.relative_to(ROOT / "zh").as_posix() for p in (ROOT / "zh").rglob("*")
                 if p.is_file() and "_static" not in p.parts and "_build" not in p.parts}
    assert committed == {p.relative_to(ROOT / "zh").as_posix() for p in zh.generated()}


@pytest.mark.parametrize("source", [s for s in SOURCES if s.suffix == ".ipynb"], ids=lambda s: s.stem)
def test_a_chinese_notebook_is_the_english_one_with_its_text_translated(source):
    en = json.loads(source.read_text(encoding="utf-8"))
    cn = json.loads((ROOT / "zh" / "chapters" / source.name).read_text(encoding="utf-8"))
    assert len(cn["cells"]) == len(en["cells"])
    for a, b in zip(en["cells"], cn["cells"]):
        assert a["cell_type"] == b["cell_type"]
        if a["cell_type"] == "code":  # code, outputs (the glued values and figures among them), tags: unchanged
            assert a["source"] == b["source"] and a.get("outputs") == b.get("outputs")
            strip = copy.deepcopy(a["metadata"]), copy.deepcopy(b["metadata"])
            for m in strip:
                m.get("mystnb", {}).get("figure", {}).pop("caption", None)
                m.get("mystnb", {}).get("image", {}).pop("alt", None)
            assert strip[0] == strip[1]
        elif len(re.findall(r"[A-Za-z]{3,}", zh._prose("".join(a["source"])))) > 2:  # a cell with prose in it
            assert zh.CJK.search("".join(b["source"])), "".join(a["source"])[:80]
    assert cn["metadata"] == en["metadata"]


# ---- the built edition ------------------------------------------------------------------------------------------

needs_book = pytest.mark.skipif(not (HTML / "zh" / "index.html").is_file(),
                                reason="the book is not built (make book builds both editions)")


@needs_book
def test_every_page_of_one_edition_is_in_the_other_with_a_link_to_it():
    en = sorted(p.relative_to(HTML).as_posix() for p in HTML.glob("**/*.html")
                if "zh" not in p.relative_to(HTML).parts[:1] and "_static" not in p.parts and "_sources" not in p.parts)
    for page in en:
        other = HTML / "zh" / page
        assert other.is_file(), f"no Chinese page for {page}"
        if page in ("genindex.html", "search.html", "index.html"):  # index.html: a redirect to intro.html
            continue
        depth = page.count("/")
        here = (HTML / page).read_text(encoding="utf-8")
        there = other.read_text(encoding="utf-8")
        assert f'content="{"../" * depth}zh/{page}"' in here, page
        assert f'content="{"../" * depth}../{page}"' in there, page
        assert '<html lang="zh-CN"' in there and "language_switch.js" in there and "language_switch.js" in here


@needs_book
def test_chinese_search_indexes_chinese_words():
    text = (HTML / "zh" / "searchindex.js").read_text(encoding="utf-8")
    index = json.loads(text[text.index("(") + 1: text.rindex(")")])
    terms = index["terms"]
    # words, not single characters: Sphinx's Chinese splitter with jieba (requirements.txt)
    for word in ("价值", "优势", "回报", "蒙特卡洛"):
        assert word in terms, word
    assert any(t.isascii() for t in terms) and "gae" in terms  # the Latin words are indexed too


@needs_book
def test_chinese_pages_show_the_english_pages_numbers():
    # the glued numbers of a chapter are the same objects in both editions: compare what the reader sees
    pat = re.compile(r'<span class="pasted-text">([^<]*)</span>')
    for stem in ("05_gae", "12_critic_in_ppo", "15_real_model"):
        en = pat.findall((HTML / "chapters" / f"{stem}.html").read_text(encoding="utf-8"))
        cn = pat.findall((HTML / "zh" / "chapters" / f"{stem}.html").read_text(encoding="utf-8"))
        assert en and sorted(en) == sorted(cn), stem


@needs_book
def test_colab_opens_the_chinese_notebook_from_a_chinese_page():
    # the launch button of a Chinese page opens zh/chapters/<name>.ipynb: Chinese text, the English code
    for nb in sorted((ROOT / "chapters").glob("*.ipynb")):
        page = (HTML / "zh" / "chapters" / f"{nb.stem}.html").read_text(encoding="utf-8")
        links = set(re.findall(r'colab\.research\.google\.com/github/[^"]+?/blob/main/([^"]+\.ipynb)', page))
        assert links == {f"zh/chapters/{nb.name}"}, (nb.stem, links)
        assert (ROOT / "zh" / "chapters" / nb.name).is_file()
