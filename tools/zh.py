"""The Chinese edition from one source: translations keyed by the English text they translate (issue 29).

The English notebooks and pages are the only source of code, outputs, glued
numbers and figures. Each *translatable unit* has a Chinese translation in a
file beside its source (``chapters/05_gae.ipynb`` -> ``chapters/05_gae.zh.md``,
``intro.md`` -> ``intro.zh.md``), keyed by the first 16 hex digits of the
SHA-256 of the English text:

* a notebook's markdown cell (the whole cell);
* a figure's caption and its alt text (``mystnb.figure.caption`` and
  ``mystnb.image.alt`` in a code cell's metadata);
* a page's section (a heading, the ``(label)=`` line above it, and the text
  up to the next heading; the text before the first heading is a section).

A translation file is plain MyST, one block per unit::

    <!-- unit 0123456789abcdef -->
    (the Chinese text)

When the English text of a unit changes, its key changes: the old
translation is *stale* and the new unit *missing*. ``python tools/zh.py sync``
rewrites every translation file in the English order, keeping the current
translations, turning each missing unit into a block marked ``todo`` that
holds the English text to translate, and keeping each stale translation at
the end, marked ``stale`` (the text to revise). ``python tools/zh.py status``
lists what is missing or stale; ``tests/test_zh.py`` fails on any, and on a
translation that loses a piece of the machinery (math, a role, a label, a
directive, inline code, a link target) or does not use the glossary's
Chinese term for an English term its unit uses.

``python tools/zh.py build`` writes the Chinese book's source into ``zh/``:
the notebooks with their markdown cells and figure captions translated and
every code cell, output and glued value copied unchanged, the pages, the
table of contents and the configuration. ``zh/chapters/*.ipynb`` are
committed, so that Colab opens a Chinese notebook from the repository;
``tests/test_zh.py`` checks that ``zh/`` is what ``build`` would write.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import re
import shutil
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Tuple

ROOT = Path(__file__).resolve().parents[1]
ZH = ROOT / "zh"
PAGES = ["intro.md", "notation.md", "glossary.md", "api.md", "references.md"]
UNIT = re.compile(r"^<!-- unit ([0-9a-f]{16})(?: (todo|stale))? -->$", re.M)
CJK = re.compile(r"[\u4e00-\u9fff]")

# the table of contents' part captions, the book's title and the switch's labels (the few strings not in a unit)
STRINGS = {
    "Start here": "从这里开始",
    "Targets for the critic": "评论家的目标",
    "Experiments against ground truth": "对照真值的实验",
    "Practice": "实践",
    "Critics as trainers run them": "训练框架中的评论家",
    "A real model": "一个真实的模型",
    "Appendix": "附录",
    "Reference": "参考",
    "Training the Critic: Value Models of PPO for Language Models": "训练评论家：语言模型 PPO 中的价值模型",
}


def key_of(text: str) -> str:
    """The unit's key: the first 16 hex digits of the SHA-256 of its English text (stripped)."""
    return hashlib.sha256(text.strip().encode("utf-8")).hexdigest()[:16]


@dataclass(frozen=True)
class Unit:
    key: str
    text: str
    where: str  # "cell 3", "cell 7 caption", "section 2": for the reader of a report


def sources() -> List[Path]:
    """Every English source that has a translation file: the chapters, then the pages."""
    return sorted((ROOT / "chapters").glob("*.ipynb")) + [ROOT / p for p in PAGES]


def translation_path(source: Path) -> Path:
    return source.with_name(source.stem + ".zh.md")


def _figure(cell: dict) -> dict:
    return cell.get("metadata", {}).get("mystnb", {})


def notebook_units(nb: dict) -> List[Unit]:
    out = []
    for i, cell in enumerate(nb["cells"]):
        if cell["cell_type"] == "markdown":
            text = "".join(cell["source"]).strip()
            if text:
                out.append(Unit(key_of(text), text, f"cell {i}"))
        elif cell["cell_type"] == "code":
            fig = _figure(cell)
            for part, path in (("caption", ("figure", "caption")), ("alt", ("image", "alt"))):
                text = fig.get(path[0], {}).get(path[1])
                if text and text.strip():
                    out.append(Unit(key_of(text), text.strip(), f"cell {i} {part}"))
    return out


def page_sections(text: str) -> List[str]:
    """A page cut at its headings (outside code fences); a ``(label)=`` line goes with the heading under it."""
    lines = text.strip("\n").split("\n")
    starts, fence = [0], None
    for i, line in enumerate(lines):
        m = re.match(r"^(```+|~~~+)", line)
        if m:
            fence = None if fence and line.startswith(fence) and line.strip() == fence else (fence or m.group(1))
            continue
        if fence is None and re.match(r"^#{1,6} ", line) and i > 0:
            start = i - 1 if re.match(r"^\(.+\)=$", lines[i - 1]) else i
            if start > starts[-1]:
                starts.append(start)
    starts.append(len(lines))
    return ["\n".join(lines[a:b]).strip() for a, b in zip(starts, starts[1:]) if "\n".join(lines[a:b]).strip()]


def page_units(text: str) -> List[Unit]:
    return [Unit(key_of(s), s, f"section {i}") for i, s in enumerate(page_sections(text))]


def units_of(source: Path) -> List[Unit]:
    if source.suffix == ".ipynb":
        return notebook_units(json.loads(source.read_text(encoding="utf-8")))
    return page_units(source.read_text(encoding="utf-8"))


@dataclass
class Block:
    key: str
    mark: Optional[str]  # None (current), "todo" (English text to translate), "stale" (translation to revise)
    text: str


def read_blocks(path: Path) -> List[Block]:
    if not path.exists():
        return []
    text = path.read_text(encoding="utf-8")
    found = list(UNIT.finditer(text))
    blocks = []
    for m, nxt in zip(found, found[1:] + [None]):
        body = text[m.end(): nxt.start() if nxt else len(text)].strip()
        blocks.append(Block(m.group(1), m.group(2), body))
    return blocks


def write_blocks(path: Path, source: Path, blocks: List[Block]) -> None:
    name = source.relative_to(ROOT).as_posix() if source.is_relative_to(ROOT) else source.name
    head = (f"<!-- The Chinese text of {name}, one block per unit, keyed by its English "
            f"text (tools/zh.py). Edit the text under a marker; never the marker. -->\n")
    body = "".join(f"\n<!-- unit {b.key}{' ' + b.mark if b.mark else ''} -->\n{b.text}\n" for b in blocks)
    path.write_text(head + body, encoding="utf-8")


@dataclass
class Status:
    source: Path
    missing: List[Unit]
    stale: List[str]
    todo: List[str]


def status_of(source: Path) -> Status:
    units = units_of(source)
    keys = {u.key for u in units}
    blocks = read_blocks(translation_path(source))
    have = {b.key for b in blocks if b.mark is None}
    todo = [b.key for b in blocks if b.mark == "todo"]
    stale = [b.key for b in blocks if b.key not in keys or b.mark == "stale"]
    missing = [u for u in units if u.key not in have]
    return Status(source, missing, stale, todo)


def sync(source: Path) -> Status:
    """Rewrite the translation file in the English order: current blocks kept, missing ones as todo, stale at the end."""
    units = units_of(source)
    blocks = read_blocks(translation_path(source))
    by_key = {b.key: b for b in blocks if b.mark is None}
    keys = {u.key for u in units}
    out = [by_key.get(u.key) or next((b for b in blocks if b.key == u.key), None) or Block(u.key, "todo", u.text)
           for u in units]
    seen = set()
    uniq = []
    for b in out:
        if b.key not in seen:
            uniq.append(b)
            seen.add(b.key)
    uniq += [Block(b.key, "stale", b.text) for b in blocks if b.key not in keys and b.mark != "todo"]
    write_blocks(translation_path(source), source, uniq)
    return status_of(source)


# ---------------------------------------------------------------------------------------------------------------
# what a translation must keep: the machinery of the English text
# ---------------------------------------------------------------------------------------------------------------

# directives whose argument names something (a label, a path, a glued name): kept; any other argument is a title
REFERENCE_ARGUMENT = {"solution", "figure", "image", "glue:figure", "glue:any", "glue:math", "glue", "include",
                      "literalinclude", "bibliography", "toctree"}


def _strip_fences(text: str) -> Tuple[str, List[str]]:
    """The text without its verbatim fenced blocks, and what of every fence a translation must keep.

    A directive keeps its name and an argument without spaces (a label, a
    path), not a title (``{admonition} The question`` may be translated); its
    body stays in the text, to be translated. A code block, ``{eval-rst}``
    and ``{math}`` are verbatim: kept whole and left out of the text.
    """
    kept, out, stack = [], [], []
    verbatim = None
    for line in text.split("\n"):
        stripped = line.strip()
        if verbatim is not None:
            verbatim[1].append(line)
            if stripped == verbatim[0]:
                kept.append("\n".join(verbatim[1]))
                verbatim = None
            continue
        m = re.match(r"^(```+|~~~+|:::+)(.*)$", stripped)
        if m and (not stack or m.group(2)):
            fence, rest = m.group(1), m.group(2).strip()
            d = re.match(r"^\{([\w:-]+)\}\s*(.*)$", rest)
            if d is None or d.group(1) in {"eval-rst", "math", "code-block", "code-cell"}:
                verbatim = (fence, [stripped])
                continue
            arg = d.group(2) if d.group(1) in REFERENCE_ARGUMENT else ""
            kept.append(f"{fence}{{{d.group(1)}}} {arg}".strip())
            stack.append(fence)
            out.append("")
            continue
        if stack and stripped == stack[-1]:
            stack.pop()
            out.append("")
            continue
        out.append(line)
    return "\n".join(out), kept


def machinery(text: str, terms: Dict[str, str]) -> Dict[str, Counter]:
    """The pieces a translation must keep, each as a multiset: math, roles, labels, directives and their options,
    inline code, link targets, glued names, headings (their count). A ``{term}`` role may name the English term or
    its Chinese pair (both are headwords of the glossary)."""
    body, fences = _strip_fences(text)
    math_blocks = re.findall(r"\$\$(.+?)\$\$", text, flags=re.S)
    no_block = re.sub(r"\$\$.+?\$\$", " ", body, flags=re.S)
    # inline math may wrap onto a second line of its paragraph (never across a blank line); compared without its
    # line breaks and runs of spaces, which a translation may reflow
    inline_math = [" ".join(m.split()) for m in re.findall(r"(?<![\\$])\$((?:[^$\n]|\n(?!\s*\n))+?)\$", no_block)]
    roles = []
    for name, target in re.findall(r"\{([\w:-]+)\}`([^`]*)`", text):
        if name == "term":
            label = re.sub(r"^.*<(.+)>$", r"\1", target)
            roles.append(f"term:{terms.get(label, terms.get(label.lower(), label)).lower()}")
        elif name in {"glue", "glue:text", "glue:md", "eq", "ref", "numref", "doc", "cite", "cite:p", "cite:t",
                      "func", "mod", "class", "meth", "attr", "download", "prf:ref"}:
            bare = re.sub(r"^.*<(.+)>$", r"\1", target) if name in {"ref", "numref", "doc"} else target
            roles.append(f"{name}:{bare}")
        else:
            roles.append(f"{name}:{target}")
    code = re.findall(r"(?<![`{}\w])`([^`\n]+)`(?!`)", re.sub(r"\{[\w:-]+\}`[^`]*`", " ", no_block))
    return {
        "math block": Counter(" ".join(m.split()) for m in math_blocks),
        "math label": Counter(re.findall(r"\$\$[ \t]*\(([\w:.-]+)\)", text)),
        "inline math": Counter(inline_math),
        "role": Counter(roles),
        "label": Counter(re.findall(r"^\((.+)\)=$", text, flags=re.M)),
        "directive": Counter(fences),
        "option": Counter(re.findall(r"^\s*(:(?:label|name|class|nonumber|number|enumerated|class):.*)$", text, flags=re.M)),
        "inline code": Counter(code),
        "link target": Counter(re.findall(r"\]\(([^)\s]+)\)", text)),
        "heading": Counter(len(h) for h in re.findall(r"^(#{1,6}) ", body, flags=re.M)),
    }


def glossary_pairs(text: Optional[str] = None) -> List[Tuple[List[str], List[str]]]:
    """The glossary's entries as (English headwords, Chinese headwords): the binding term list."""
    text = (ROOT / "glossary.md").read_text(encoding="utf-8") if text is None else text
    block = text[text.index("```{glossary}"):]
    lines = block.split("\n")[1:]
    entries, cur = [], []
    for line in lines:
        if line.startswith("```"):
            break
        if line.startswith(":") and not cur:
            continue
        if line and not line.startswith(" "):
            cur.append(line.strip())
        elif cur:
            entries.append(cur)
            cur = []
    if cur:
        entries.append(cur)
    return [([t for t in e if not CJK.search(t)], [t for t in e if CJK.search(t)]) for e in entries]


def term_map() -> Dict[str, str]:
    """English headword (and its lower case) -> the Chinese headword of its entry."""
    out = {}
    for en, zh in glossary_pairs():
        for t in en:
            if zh:
                out[t] = zh[0]
                out[t.lower()] = zh[0]
    return out


def _prose(text: str) -> str:
    """The English text without math, code, roles' targets and fenced blocks: where a glossary term is *used*."""
    body, _ = _strip_fences(text)
    body = re.sub(r"\$\$.+?\$\$", " ", body, flags=re.S)
    body = re.sub(r"\$[^$\n]+\$", " ", body)
    body = re.sub(r"\{[\w:-]+\}`[^`]*`", " ", body)
    body = re.sub(r"`[^`\n]+`", " ", body)
    body = re.sub(r"\]\([^)]*\)", "]", body)
    body = re.sub(r"^\(.+\)=$", " ", body, flags=re.M)
    body = re.sub(r"^\s*:\w+:.*$", " ", body, flags=re.M)
    return body


# Headwords not bound in plain prose (only through {term} roles): "state" is also a verb ("the next section
# states"), and GAE, TD and κ stay in Latin or Greek letters in the Chinese text, as its readers write them.
LOOSE_TERMS = {"state", "TD", "GAE", "κ"}


def terms_used(english: str) -> List[Tuple[str, str]]:
    """(English term, Chinese term) for each binding glossary term the English prose uses."""
    prose = _prose(english)
    out = []
    terms = term_map()
    for target in re.findall(r"\{term\}`([^`]*)`", english):  # a term the text links: always bound
        label = re.sub(r"^.*<(.+)>$", r"\1", target)
        zh = terms.get(label) or terms.get(label.lower())
        if zh and (label, zh) not in out:
            out.append((label, zh))
    for en, zh in glossary_pairs():
        if not zh:
            continue
        for t in en:
            if t in LOOSE_TERMS or t.lower() in LOOSE_TERMS:
                continue
            pat = r"(?<![\w-])" + re.escape(t).replace(r"\ ", r"[\s-]+") + r"(?:s|es)?(?![\w-])"
            if re.search(pat, prose, flags=re.I):
                if (t, zh[0]) not in out:
                    out.append((t, zh[0]))
                break
    return out


def check_unit(english: str, chinese: str) -> List[str]:
    """What a translation lost or changed of its English unit ([] when none)."""
    terms = term_map()
    problems = []
    a, b = machinery(english, terms), machinery(chinese, terms)
    for kind in a:
        if a[kind] != b[kind]:
            lost, added = a[kind] - b[kind], b[kind] - a[kind]
            problems.append(f"{kind}: lost {sorted(lost.elements())!r}, added {sorted(added.elements())!r}")
    if not CJK.search(chinese) and CJK.search(english) is None and len(_prose(english).split()) > 3:
        problems.append("no Chinese text")
    for en, zh in terms_used(english):
        if zh not in chinese:
            problems.append(f"the glossary term {en!r} is {zh!r} in Chinese, which the translation does not use")
    return problems


def check(source: Path) -> List[str]:
    units = {u.key: u for u in units_of(source)}
    out = []
    for b in read_blocks(translation_path(source)):
        if b.mark is None and b.key in units:
            out += [f"{units[b.key].where} ({b.key}): {p}" for p in check_unit(units[b.key].text, b.text)]
    return out


# ---------------------------------------------------------------------------------------------------------------
# the Chinese book's source
# ---------------------------------------------------------------------------------------------------------------

def translations(source: Path) -> Dict[str, str]:
    return {b.key: b.text for b in read_blocks(translation_path(source)) if b.mark is None}


def chinese_notebook(source: Path) -> dict:
    """The English notebook with its markdown cells and figure texts in Chinese; code, outputs, metadata unchanged."""
    nb = json.loads(source.read_text(encoding="utf-8"))
    zh = translations(source)
    out = copy.deepcopy(nb)
    for cell in out["cells"]:
        if cell["cell_type"] == "markdown":
            text = "".join(cell["source"]).strip()
            if text and key_of(text) in zh:
                cell["source"] = zh[key_of(text)].splitlines(keepends=True)
        elif cell["cell_type"] == "code":
            fig = _figure(cell)
            for a, b in (("figure", "caption"), ("image", "alt")):
                text = fig.get(a, {}).get(b)
                if text and key_of(text) in zh:
                    fig[a][b] = zh[key_of(text)]
    return out


def chinese_page(source: Path) -> str:
    zh = translations(source)
    return "\n\n".join(zh.get(key_of(s), s) for s in page_sections(source.read_text(encoding="utf-8"))) + "\n"


def notebook_text(nb: dict) -> str:
    return json.dumps(nb, indent=1, ensure_ascii=False) + "\n"


def chinese_config() -> str:
    """``_config.yml`` for the Chinese book in ``zh/``: the title, the language, the switch back, paths to the shared files."""
    text = (ROOT / "_config.yml").read_text(encoding="utf-8")
    title = "Training the Critic: Value Models of PPO for Language Models"
    swaps = [
        (f'title: "{title}"', f'title: "{STRINGS[title]}"'),
        ('  path_to_book: ""', '  path_to_book: "zh"'),
        ("offline_mathjax: _ext", "offline_mathjax: ../_ext"),
        ("authoryear_bib: _ext", "authoryear_bib: ../_ext"),
        ("language_switch: _ext", "language_switch: ../_ext"),
        ("latex_fixes: _ext", "latex_fixes: ../_ext"),
        ('language_switch: {"prefix": "zh/", "label": "中文", "lang": "zh-CN"}',
         'language_switch: {"prefix": "../", "label": "English", "lang": "en"}\n    language: zh_CN'),
        ("bibtex_bibfiles:\n  - references.bib", "bibtex_bibfiles:\n  - ../references.bib"),
        (', zh, "**.zh.md"]', ', "**.zh.md"]'),
    ]
    for old, new in swaps:
        if old not in text:
            raise ValueError(f"_config.yml no longer has {old!r}: update tools/zh.py's chinese_config")
        text = text.replace(old, new)
    return "# Generated by tools/zh.py from ../_config.yml: edit that file, then `python tools/zh.py build`.\n" + text


def chinese_toc() -> str:
    text = (ROOT / "_toc.yml").read_text(encoding="utf-8")
    for en, zh in STRINGS.items():
        text = text.replace(f"caption: {en}\n", f"caption: {zh}\n")
    return "# Generated by tools/zh.py from ../_toc.yml.\n" + text


def generated() -> Dict[Path, str]:
    """Every file ``build`` writes under zh/, by path, with its text."""
    out = {ZH / "_config.yml": chinese_config(), ZH / "_toc.yml": chinese_toc()}
    for source in sources():
        rel = source.relative_to(ROOT)
        out[ZH / rel] = notebook_text(chinese_notebook(source)) if source.suffix == ".ipynb" else chinese_page(source)
    return out


SHARED = ["_static"]  # copied into zh/ at build time (jupyter-book loads every file of a book's _static; .gitignore)


def build() -> None:
    for path, text in generated().items():
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")
    for name in SHARED:
        src, dst = ROOT / name, ZH / name
        if src.is_dir():
            shutil.copytree(src, dst, dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(src, dst)


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python tools/zh.py", description=__doc__.splitlines()[0])
    ap.add_argument("command", choices=["status", "sync", "check", "build", "units", "terms"])
    ap.add_argument("files", nargs="*", type=Path, help="sources (default: every chapter and page)")
    args = ap.parse_args(argv)
    files = [f.resolve() for f in args.files] or sources()
    bad = 0
    if args.command == "terms":
        for en, zh in glossary_pairs():
            print(" / ".join(en), "->", " / ".join(zh))
        return 0
    for source in files:
        if args.command == "build":
            build()
            return 0
        if args.command == "units":
            for u in units_of(source):
                print(u.key, u.where, len(u.text))
            continue
        st = sync(source) if args.command == "sync" else status_of(source)
        problems = check(source) if args.command == "check" else []
        n = len(units_of(source))
        print(f"{source.relative_to(ROOT)}: {n - len(st.missing)}/{n} translated, {len(st.missing)} missing, "
              f"{len(st.stale)} stale" + (f", {len(problems)} problems" if args.command == "check" else ""))
        for p in problems:
            print("   ", p)
        bad += len(st.missing) + len(st.stale) + len(problems)
    return 1 if bad and args.command in {"status", "check"} else 0


if __name__ == "__main__":
    sys.exit(main())
