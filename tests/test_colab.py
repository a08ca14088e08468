"""Colab from the notebook alone: one repository URL, a setup cell that installs what each chapter imports.

The full simulation (a clean venv with only what Colab ships, each chapter
run from a folder holding only its notebook) is ``tools/colab_sim.py``
(``make colab``; CI runs it). These static checks run in ``make test``.
"""

from __future__ import annotations

import ast
import json
import re
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = sorted((ROOT / "chapters").glob("*.ipynb"))
sys.path.insert(0, str(ROOT / "tools"))
from colab_sim import COLAB_SHIPS  # noqa: E402

# what `valuelab[book]` brings, by import name: the core dependencies and the book extra (pyproject.toml)
VALUELAB_BRINGS = {"valuelab", "torch", "numpy", "sympy", "tqdm", "myst_nb", "matplotlib"}
SHIPPED = {name.replace("-", "_") for name in COLAB_SHIPS} | {"IPython", "torch"}


def repository_url() -> str:
    return yaml.safe_load((ROOT / "_config.yml").read_text())["repository"]["url"]


def code_cells(path: Path) -> list[dict]:
    return [c for c in json.loads(path.read_text(encoding="utf-8"))["cells"] if c["cell_type"] == "code"]


def test_the_url_is_a_github_repository():
    assert re.fullmatch(r"https://github\.com/[\w.-]+/[\w.-]+", repository_url())


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_setup_cell_installs_the_book_extra_from_the_one_url(path):
    setup = code_cells(path)[0]
    src = "".join(setup["source"])
    assert "remove-cell" in setup.get("metadata", {}).get("tags", []), "the setup cell is hidden from readers"
    m = re.search(r'REPO = "([^"]+)"', src)
    assert m and m.group(1) == repository_url(), f"{path.name}: REPO differs from repository.url in _config.yml"
    assert 'f"valuelab[book] @ git+{REPO}"' in src, f"{path.name}: the setup cell must install valuelab[book]"
    assert '"google.colab" in sys.modules' in src, f"{path.name}: install on Colab only"


def test_pyproject_book_extra_matches_what_the_test_assumes():
    text = (ROOT / "pyproject.toml").read_text()
    book = re.search(r"^book = \[(.*)\]", text, re.M).group(1)
    assert "myst-nb" in book and "matplotlib" in book


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_every_import_is_shipped_by_colab_or_installed_by_the_setup_cell(path):
    missing = set()
    for cell in code_cells(path):
        src = "".join(cell["source"])
        src = "\n".join(line for line in src.splitlines() if not line.lstrip().startswith(("%", "!")))
        for node in ast.walk(ast.parse(src)):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            for name in names:
                top = name.split(".")[0]
                if top not in sys.stdlib_module_names and top not in VALUELAB_BRINGS | SHIPPED:
                    missing.add(top)
    assert not missing, f"{path.name} imports {sorted(missing)}: neither on Colab nor installed by the setup cell"


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_no_chapter_reads_a_file_beside_the_notebook(path):
    for cell in code_cells(path):
        src = "".join(cell["source"])
        assert not re.search(r"""(open|read_text|read_csv|loadtxt|Path)\(\s*["'](?!/dev/null)[^"']*\.(csv|json|npy|pt|txt)""",
                             src), f"{path.name}: reads a data file; get it from the installed package"
        assert "chapters/data" not in src and 'Path("data")' not in src, f"{path.name}: reads chapters/data"
