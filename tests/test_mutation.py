"""The mutation test: a slip planted in a derivation must make that chapter's own checks fail.

A check that cannot fail proves nothing. For each derivation chapter,
``tests/mutations/chNN.py`` lists plausible slips (a dropped λ, an
off-by-one limit, a wrong power), each planted either in one code cell of
the chapter or in one function of ``valuelab`` the chapter calls (see
:mod:`tests.mutations`). For every slip, the chapter runs with the slip in
place, in a fresh IPython shell; the test passes only if a cell at or after
the planted one stops with an ``AssertionError``: one of the chapter's own
checks caught it.

Each chapter is also run once without a slip, and must then run clean: so
a "caught" slip is the slip's doing, not the harness's.

One fresh interpreter per chapter (``tests/mutation_driver.py``) runs the
chapter once and forks each slip's run from the cell where it is planted.
"""

from __future__ import annotations

import importlib
import json
import os
import pkgutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = ROOT / "chapters"
DRIVER = ROOT / "tests" / "mutation_driver.py"
sys.path.insert(0, str(ROOT / "tests"))

import mutations  # noqa: E402

SPECS = [(info.name, importlib.import_module(f"mutations.{info.name}"))
         for info in sorted(pkgutil.iter_modules(mutations.__path__), key=lambda m: m.name)
         if not info.name.startswith("_")]
DERIVATION_CHAPTERS = ("01_value_function_mc.ipynb", "02_td_targets.ipynb", "03_kl_rewards.ipynb", "04_nstep.ipynb",
                       "05_gae.ipynb", "06_value_loss.ipynb", "A1_errata.ipynb")


def _run_driver(spec_name: str) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", MPLBACKEND="Agg")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "report.json"
        proc = subprocess.run([sys.executable, str(DRIVER), spec_name, str(out)], env=env, cwd=ROOT,
                              capture_output=True, text=True, timeout=1200)
        if proc.returncode != 0 or not out.is_file():
            return {"<driver>": f"driver failed for {spec_name}:\n{proc.stderr[-3000:]}"}
        return json.loads(out.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def reports(request) -> dict:
    """The drivers of the chapters whose tests were selected, two at a time (each runs single-threaded)."""
    wanted = []
    for item in request.session.items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        if item.module.__name__ == __name__ and params.get("name") and params["name"] not in wanted:
            wanted.append(params["name"])
    with ThreadPoolExecutor(max_workers=max(1, min(2, os.cpu_count() or 1))) as pool:
        return dict(zip(wanted, pool.map(_run_driver, wanted)))


def chapter_reports(reports: dict, spec_name: str) -> dict:
    """The driver's reports for one spec: its slips' and the baseline's (``"<baseline>"``)."""
    assert "<driver>" not in reports[spec_name], reports[spec_name].get("<driver>")
    return reports[spec_name]


def test_every_derivation_chapter_has_slips():
    chapters = {mod.CHAPTER for _, mod in SPECS}
    for name in DERIVATION_CHAPTERS:
        assert name in chapters, f"no slips planted in {name}"
    for _, mod in SPECS:
        assert (CHAPTERS / mod.CHAPTER).is_file(), mod.CHAPTER
        assert len(mod.MUTATIONS) >= 3, f"{mod.CHAPTER}: at least three slips"
        names = [s.name for s in mod.MUTATIONS]
        assert len(names) == len(set(names)), f"{mod.CHAPTER}: slip names repeat"


@pytest.mark.parametrize("name", [n for n, _ in SPECS])
def test_chapter_runs_clean_without_a_slip(reports, name):
    base = chapter_reports(reports, name)["<baseline>"]
    assert base["error"] is None, f"{name} fails with no slip: {base}"


CASES = [(name, slip) for name, mod in SPECS for slip in mod.MUTATIONS]


@pytest.mark.parametrize("name,slip", CASES, ids=[f"{n}-{s.name}" for n, s in CASES])
def test_slip_is_caught_by_the_chapter(reports, name, slip):
    report = chapter_reports(reports, name)[slip.name]
    assert report["error"] is not None, f"{slip.name} ({slip.why}): no check in the chapter caught it"
    assert report["error"] == "AssertionError", (
        f"{slip.name} ({slip.why}): the chapter stopped with {report['error']}, not a failed check: "
        f"{report['message']}")
    if slip.cell is not None:
        assert report["cell"] >= slip.cell, (slip.name, report)
