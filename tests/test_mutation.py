"""The mutation test: a slip planted in a derivation must make that chapter's own checks fail.

A check that cannot fail proves nothing. For each derivation chapter,
``tests/mutations/chNN.py`` lists plausible slips (a dropped λ, an
off-by-one limit, a wrong power), each planted either in one code cell of
the chapter or in one function of ``valuelab`` the chapter calls (see
:mod:`tests.mutations`). For every slip, the chapter's code cells are run in
order, in a fresh IPython shell in a forked child process, with the slip in
place; the test passes only if a cell at or after the planted one stops with
an ``AssertionError``, i.e. one of the chapter's own checks caught it.

Each chapter is also run once without a slip, and must then run clean: so
a "caught" slip is the slip's doing, not the harness's.

The children are forked from this process after the heavy imports (torch,
SymPy, matplotlib, IPython), so each run costs only the chapter's cells up to
the first failing check.
"""

from __future__ import annotations

import importlib
import inspect
import json
import os
import pkgutil
import select
import signal
import sys
import textwrap
import time
from pathlib import Path
from typing import List, Optional, Tuple

import pytest

os.environ.setdefault("MPLBACKEND", "Agg")

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = ROOT / "chapters"
sys.path.insert(0, str(ROOT / "tests"))

from mutations import Slip  # noqa: E402

TIMEOUT_S = 240  # one run of one chapter


def _specs() -> List[Tuple[str, object]]:
    import mutations

    found = []
    for info in sorted(pkgutil.iter_modules(mutations.__path__), key=lambda m: m.name):
        mod = importlib.import_module(f"mutations.{info.name}")
        found.append((info.name, mod))
    return found


SPECS = _specs()


def _code_cells(notebook: Path) -> List[Tuple[int, str]]:
    nb = json.loads(notebook.read_text(encoding="utf-8"))
    return [(i, "".join(c["source"])) for i, c in enumerate(nb["cells"]) if c["cell_type"] == "code"]


def _replace_once(text: str, old: str, new: str, where: str) -> str:
    count = text.count(old)
    if count != 1:
        raise LookupError(f"{where}: the slip's text occurs {count} times, not once: {old!r}")
    return text.replace(old, new)


def _plant_in_function(slip: Slip) -> None:
    """Re-define ``slip.function`` in its module from its edited source; rebind every valuelab alias of it."""
    modname, qualname = slip.function.split(":")
    module = importlib.import_module(modname)
    old_obj = getattr(module, qualname)
    src = textwrap.dedent(inspect.getsource(inspect.unwrap(old_obj)))
    # the decorators are part of getsource's text; re-running them gives a fresh cache, if any
    src = _replace_once(src, slip.old, slip.new, slip.function)
    exec(compile(src, f"<slip {slip.name} in {slip.function}>", "exec"), module.__dict__)
    new_obj = module.__dict__[qualname]
    for name, mod in list(sys.modules.items()):
        if mod is None or not (name == "valuelab" or name.startswith("valuelab.")):
            continue
        for attr, value in list(vars(mod).items()):
            if value is old_obj:
                setattr(mod, attr, new_obj)


def _run_cells(notebook: Path, slip: Optional[Slip]) -> dict:
    """In this (child) process: run the chapter's code cells with ``slip``; report the first error."""
    from IPython.core.interactiveshell import InteractiveShell

    cells = _code_cells(notebook)
    if slip is not None and slip.cell is not None:
        sources = dict(cells)
        if slip.cell not in sources:
            return {"error": "LookupError", "message": f"cell {slip.cell} is not a code cell", "cell": None}
        try:
            sources[slip.cell] = _replace_once(sources[slip.cell], slip.old, slip.new, f"cell {slip.cell}")
        except LookupError as exc:
            return {"error": "LookupError", "message": str(exc), "cell": None}
        cells = sorted(sources.items())
    if slip is not None and slip.function is not None:
        try:
            _plant_in_function(slip)
        except LookupError as exc:
            return {"error": "LookupError", "message": str(exc), "cell": None}
    os.chdir(CHAPTERS)
    shell = InteractiveShell.instance()
    for index, source in cells:
        result = shell.run_cell(source, silent=True, store_history=False)
        exc = result.error_before_exec or result.error_in_exec
        if exc is not None:
            return {"error": type(exc).__name__, "message": str(exc)[:500], "cell": index}
    return {"error": None, "message": "", "cell": None}


def run_chapter(notebook: Path, slip: Optional[Slip]) -> dict:
    """Run the chapter in a forked child (fresh namespace, fresh library state); its report as a dict."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: silence the cells, run them, send the report, leave without cleanup
        code = 0
        try:
            os.close(read_fd)
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 1)
            os.dup2(devnull, 2)
            sys.stdout = sys.stderr = open(os.devnull, "w")
            report = _run_cells(notebook, slip)
        except BaseException as exc:  # noqa: BLE001 -- everything goes back to the parent
            report = {"error": f"harness {type(exc).__name__}", "message": str(exc)[:500], "cell": None}
            code = 1
        os.write(write_fd, json.dumps(report).encode())
        os.close(write_fd)
        os._exit(code)
    os.close(write_fd)
    chunks, deadline = [], time.monotonic() + TIMEOUT_S
    with os.fdopen(read_fd, "rb") as pipe:
        while True:
            left = deadline - time.monotonic()
            ready, _, _ = select.select([pipe], [], [], max(left, 0))
            if not ready:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                return {"error": "timeout", "message": f"no report after {TIMEOUT_S} s", "cell": None}
            chunk = os.read(pipe.fileno(), 1 << 16)
            if not chunk:
                break
            chunks.append(chunk)
    _, status = os.waitpid(pid, 0)
    if not chunks:
        return {"error": "crash", "message": f"child exited with status {status}", "cell": None}
    return json.loads(b"".join(chunks))


@pytest.fixture(scope="module", autouse=True)
def _heavy_imports():
    """Import once in the parent, so every forked child starts warm."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot  # noqa: F401
    import myst_nb  # noqa: F401
    import numpy  # noqa: F401
    import sympy  # noqa: F401
    import torch  # noqa: F401
    from IPython.core.interactiveshell import InteractiveShell  # noqa: F401

    import valuelab  # noqa: F401
    import valuelab.symbolic  # noqa: F401


def test_every_derivation_chapter_has_slips():
    chapters = {mod.CHAPTER for _, mod in SPECS}
    for name in ("01_value_function_mc.ipynb", "02_td_targets.ipynb", "03_kl_rewards.ipynb", "04_nstep.ipynb",
                 "05_gae.ipynb", "06_value_loss.ipynb", "A1_errata.ipynb"):
        assert name in chapters, f"no slips planted in {name}"
    for _, mod in SPECS:
        assert (CHAPTERS / mod.CHAPTER).is_file(), mod.CHAPTER
        assert len(mod.MUTATIONS) >= 3, f"{mod.CHAPTER}: at least three slips"
        names = [s.name for s in mod.MUTATIONS]
        assert len(names) == len(set(names)), f"{mod.CHAPTER}: slip names repeat"


@pytest.mark.parametrize("spec", [m for _, m in SPECS], ids=[n for n, _ in SPECS])
def test_chapter_runs_clean_without_a_slip(spec):
    report = run_chapter(CHAPTERS / spec.CHAPTER, None)
    assert report["error"] is None, f"{spec.CHAPTER} fails with no slip: {report}"


CASES = [(mod, slip) for _, mod in SPECS for slip in mod.MUTATIONS]


@pytest.mark.parametrize("spec,slip", CASES, ids=[f"{m.CHAPTER[:2]}-{s.name}" for m, s in CASES])
def test_slip_is_caught_by_the_chapter(spec, slip):
    report = run_chapter(CHAPTERS / spec.CHAPTER, slip)
    assert report["error"] is not None, f"{slip.name} ({slip.why}): no check in {spec.CHAPTER} caught it"
    assert report["error"] == "AssertionError", (
        f"{slip.name} ({slip.why}): the chapter stopped with {report['error']}, not a failed check: "
        f"{report['message']}")
    if slip.cell is not None:
        assert report["cell"] >= slip.cell, (slip.name, report)
