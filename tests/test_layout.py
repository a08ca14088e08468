"""The package's three parts and the import rules between them (issue 28), read off the import graph.

``valuelab/`` holds the estimators a trainer imports, ``valuelab/lab/`` the
book's laboratory, ``valuelab/_engine/`` what a call runs through. The rules:
the estimators never import the laboratory; the laboratory imports the
estimators (and may use the engine's checks); the engine imports neither.
The graph is built from the source with :mod:`ast`, so an import inside a
function counts as much as one at the top of a file; the checker is run on
a planted package first, to show that it finds what it is meant to find.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Set, Tuple

import pytest

import valuelab

PACKAGE_DIR = Path(valuelab.__file__).resolve().parent
ROOT = PACKAGE_DIR.parents[1]

# The public face: the package's __init__ (which reaches the laboratory only through importlib, on first read)
# and the two command lines. Everything else at the top level, and the trainer adapters, are estimators.
FACE = {"valuelab", "valuelab.__main__", "valuelab.bench"}


def module_files(package_dir: Path, package: str = "valuelab") -> Dict[str, Path]:
    """Every module of the package under ``package_dir``, by dotted name (a folder's ``__init__`` is the folder)."""
    out = {}
    for path in sorted(package_dir.rglob("*.py")):
        parts = list(path.relative_to(package_dir).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join([package] + parts)] = path
    return out


def part_of(module: str, package: str = "valuelab") -> str:
    """``"face"``, ``"lab"``, ``"engine"`` or ``"estimators"``: which of the three parts a module belongs to."""
    if module in {m.replace("valuelab", package, 1) for m in FACE}:
        return "face"
    if module == f"{package}.lab" or module.startswith(f"{package}.lab."):
        return "lab"
    if module == f"{package}._engine" or module.startswith(f"{package}._engine."):
        return "engine"
    return "estimators"


def imported(path: Path, module: str, known: Set[str]) -> Set[str]:
    """The package's modules that ``module`` (read from ``path``) imports, anywhere in the file.

    Relative imports are resolved against the module's package; ``from X
    import name`` counts as importing ``X.name`` when that is a module of
    the package, else ``X``.
    """
    is_package = path.name == "__init__.py"
    base = module.split(".") if is_package else module.split(".")[:-1]
    out: Set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                anchor = base[: len(base) - (node.level - 1)] if node.level > 1 else base
                target = ".".join(anchor + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for a in node.names:
                sub = f"{target}.{a.name}"
                out.add(sub if sub in known else target)
    root = module.split(".")[0]
    return {m for m in out if m == root or m.startswith(root + ".")}


def import_graph(package_dir: Path, package: str = "valuelab") -> Dict[str, Set[str]]:
    files = module_files(package_dir, package)
    known = set(files)
    return {m: imported(p, m, known) for m, p in files.items()}


def violations(graph: Dict[str, Set[str]], package: str = "valuelab") -> List[Tuple[str, str, str]]:
    """Every edge that breaks a rule, as (importer, imported, rule)."""
    bad = []
    for src, targets in graph.items():
        for dst in sorted(targets):
            s, d = part_of(src, package), part_of(dst, package)
            if s == "estimators" and d == "lab":
                bad.append((src, dst, "the estimators never import the laboratory"))
            elif s == "engine" and d != "engine":
                bad.append((src, dst, "the engine imports neither the estimators nor the laboratory"))
            elif s in {"estimators", "engine", "lab"} and d == "face" and dst != package:
                bad.append((src, dst, "nothing imports the command lines"))
            elif s == "engine" and dst == package:
                bad.append((src, dst, "the engine imports neither the estimators nor the laboratory"))
    return bad


def test_the_import_rules_hold_on_valuelabs_import_graph():
    graph = import_graph(PACKAGE_DIR)
    assert violations(graph) == []
    # the laboratory does build on the estimators (the rule's other half), and the estimators on the engine
    assert any(part_of(d) == "estimators" for s, ts in graph.items() if part_of(s) == "lab" for d in ts)
    assert any(part_of(d) == "engine" for s, ts in graph.items() if part_of(s) == "estimators" for d in ts)
    # the package's __init__ names no laboratory module in an import statement (it reads them through importlib)
    assert not any(part_of(d) == "lab" for d in graph["valuelab"])


def _plant(tmp_path: Path) -> Path:
    """A package laid out as valuelab, with one import of each kind, legal and not."""
    files = {
        "__init__.py": "from .returns import r\n",
        "returns.py": "from ._engine.checks import c\nr = 1\n",
        "advantages.py": "def f():\n    from .lab import world  # inside a function: still an edge\n",
        "losses.py": "import pkg.lab.world as w\n",
        "packed.py": "from . import returns\n",
        "integrations/__init__.py": "",
        "integrations/verl.py": "from ..lab.stats import pm\nfrom ..returns import r\n",
        "lab/__init__.py": "",
        "lab/world.py": "from ..returns import r\nfrom .._engine.checks import c\n",
        "lab/stats.py": "from .. import advantages\n",
        "_engine/__init__.py": "",
        "_engine/checks.py": "c = 1\n",
        "_engine/scan.py": "from .checks import c\nfrom ..losses import x\n",
        "_engine/problem.py": "def g():\n    from ..lab import stats\n",
        "_engine/nstep.py": "from pkg import returns\n",
    }
    root = tmp_path / "pkg"
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def test_the_checker_finds_each_planted_violation_and_nothing_else(tmp_path):
    graph = import_graph(_plant(tmp_path), "pkg")
    assert graph["pkg.lab.stats"] == {"pkg.advantages"}  # `from .. import advantages` is the module, not pkg
    assert graph["pkg.integrations.verl"] == {"pkg.lab.stats", "pkg.returns"}
    found = {(s, d) for s, d, _ in violations(graph, "pkg")}
    assert found == {
        ("pkg.advantages", "pkg.lab.world"),      # estimator -> laboratory, inside a function
        ("pkg.losses", "pkg.lab.world"),          # estimator -> laboratory, absolute import
        ("pkg.integrations.verl", "pkg.lab.stats"),  # an adapter is an estimator
        ("pkg._engine.scan", "pkg.losses"),       # engine -> estimator
        ("pkg._engine.problem", "pkg.lab.stats"),  # engine -> laboratory
        ("pkg._engine.nstep", "pkg.returns"),     # engine -> estimator, absolute import
    }


def test_every_module_is_on_the_package_docstrings_map_and_every_row_is_a_module():
    files = module_files(PACKAGE_DIR)
    modules = {m[len("valuelab."):] for m in files if m != "valuelab"}
    folders = {"lab", "_engine", "integrations"}  # each folder's own docstring speaks for it
    rows = set(re.findall(r"^``([\w.]+)``\s{2,}", valuelab.__doc__, flags=re.M))
    assert rows == modules - folders


def test_each_folder_says_who_it_is_for_and_what_it_must_not_import():
    import valuelab._engine as engine
    import valuelab.lab as lab

    assert "For the reader of the book" in lab.__doc__ and "What must not import it" in lab.__doc__
    assert "for valuelab's maintainers" in engine.__doc__ and "What it must not import" in engine.__doc__
    assert "the estimators never import ``valuelab.lab``" in valuelab.__doc__
    # the laboratory's list of modules is its folder's files
    assert set(lab.MODULES) == {p.stem for p in (PACKAGE_DIR / "lab").glob("*.py")} - {"__init__"}


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)


def test_importing_valuelab_and_its_estimators_loads_no_laboratory_module():
    out = _run("import sys, valuelab, valuelab.integrations, valuelab.packed, valuelab.distributed; "
               "print(sorted(m for m in sys.modules if m.startswith('valuelab.lab')))")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_the_public_names_keep_working():
    import valuelab as vl
    from valuelab.lab import stats

    for name in vl.__all__:
        assert getattr(vl, name) is not None
    # the laboratory's names that the top level exported before the move: the same objects, read lazily
    assert vl.mean_ci is stats.mean_ci and vl.paired_ci is stats.paired_ci and vl.Interval is stats.Interval
    assert vl.stats is stats and vl.lab.stats is stats
    assert {"lab", "stats", "mean_ci"} <= set(dir(vl))
    with pytest.raises(AttributeError, match="no attribute 'world'"):
        vl.world  # noqa: B018  (old module paths are not kept: valuelab.lab.world)
    with pytest.raises(AttributeError, match="no attribute 'gea'"):
        vl.lab.gea  # noqa: B018


@pytest.mark.parametrize("entry", ["valuelab.bench", "valuelab.lab.bench"])
def test_the_benchmarks_command_line_runs_from_its_old_and_its_new_place(entry):
    out = subprocess.run([sys.executable, "-m", entry, "--help"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "usage: python -m valuelab.bench" in out.stdout


def test_the_old_entry_point_passes_its_arguments_on():
    # a refused argument reaches the benchmark's own parser (exit status 2 and its message), not swallowed
    out = subprocess.run([sys.executable, "-m", "valuelab.bench", "--dtype", "float16"], capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 2 and "--dtype" in out.stderr, (out.returncode, out.stderr)


def test_chapters_import_the_laboratory_from_valuelab_lab():
    # no chapter reaches a laboratory module through an old path (valuelab.world, valuelab.stats, vl.mean_ci...)
    old = re.compile(r"valuelab\.(world|policy|ppo|critic|transformer|pretrain|stats|symbolic|reference|lm)\b"
                     r"|from valuelab import (world|policy|ppo|critic|transformer|pretrain|stats|symbolic|reference|lm)\b"
                     r"|\bvl\.(stats|mean_ci|paired_ci|Interval|ppo|bench|world)\b|valuelab\._[a-z]+\b(?<!_engine)")
    import json

    for nb in sorted((ROOT / "chapters").glob("*.ipynb")):
        for cell in json.loads(nb.read_text(encoding="utf-8"))["cells"]:
            src = "".join(cell["source"])
            assert not old.search(src), f"{nb.name}: {old.search(src).group(0)}"
