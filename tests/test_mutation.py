"""The mutation test: a slip planted in a derivation must make that chapter's own checks fail.

A check that cannot fail proves nothing. For each chapter,
``tests/mutations/chNN.py`` lists plausible slips (a dropped λ, an
off-by-one limit, a wrong power), each planted either in one code cell of
the chapter or in one function of ``valuelab`` the chapter calls (see
:mod:`tests.mutations`). For every slip, the chapter runs with the slip in
place, in a fresh IPython shell; the test passes only if a cell at or after
the planted one stops with an ``AssertionError``: one of the chapter's own
checks caught it.

Which cell caught it matters too. The first cell that fails is not always
the check the slip was aimed at: a numeric table or an instance check later
in the chapter can fail first and hide a general proof whose asserts check
nothing. So each slip names what it aims at (a proposition, or one cell),
the driver runs the aimed cells on the mutated state on their own, and:

* every slip must be caught by the check it aims at;
* every proposition labelled *proved symbolically, in general* must have
  its own proof cells (``PROOFS`` of the spec) catch at least one slip
  aimed at it;
* the vacuity tests: with a proof's asserts disabled, that requirement must
  fail. Per slip, the driver reruns the proof cell that caught it with its
  asserts turned into plain expressions, from the same state; and once, end
  to end, chapter 5 runs with the proof of its closed form disarmed: the
  old rule still counts the library slip as caught (by the instance check at
  T = 5), the new rule fails.

Each chapter is also run once without a slip, and must then run clean: so
a "caught" slip is the slip's doing, not the harness's. A spec may leave
out slow cells that come after every check its slips need (``SKIP_CELLS``);
nbval runs every cell of every chapter.

One fresh interpreter per chapter (``tests/mutation_driver.py``) runs the
chapter once and forks each slip's run from the cell where it is planted.
The table of slips and the cells that caught them is printed at the end of
the session and written, with the drivers' reports, to ``_build/mutation/``
(``table.txt``, ``reports.json``; ``MUTATION_REPORT_DIR`` overrides it).
"""

from __future__ import annotations

import importlib
import json
import os
import pkgutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = ROOT / "chapters"
DRIVER = ROOT / "tests" / "mutation_driver.py"
sys.path.insert(0, str(ROOT / "tests"))

import mutations  # noqa: E402
from mutation_driver import META, code_cells, count_asserts  # noqa: E402
from test_notebooks import propositions  # noqa: E402

SPECS = [(info.name, importlib.import_module(f"mutations.{info.name}"))
         for info in sorted(pkgutil.iter_modules(mutations.__path__), key=lambda m: m.name)
         if not info.name.startswith("_")]
SPEC = dict(SPECS)
REPORT_DIR = Path(os.environ.get("MUTATION_REPORT_DIR", ROOT / "_build" / "mutation"))
CHAPTERS_WITH_SLIPS = ("01_value_function_mc.ipynb", "02_td_targets.ipynb", "03_kl_rewards.ipynb", "04_nstep.ipynb",
                       "05_gae.ipynb", "06_value_loss.ipynb", "07_propagation.ipynb", "08_bias_variance.ipynb",
                       "09_fast_gae.ipynb", "10_long_responses.ipynb", "11_pitfalls.ipynb",
                       "12_critic_in_ppo.ipynb", "13_transformer_critic.ipynb", "14_trainers.ipynb", "A1_errata.ipynb")
PROPOSITIONS = propositions()  # label -> (chapter file, status kind)

# the end-to-end vacuity run: chapter 5 up to its instance checks at T = 5 (cells 21 and 23), with every assert of
# the proof cells of prop-gae-closed disabled; the slips aimed at that proposition: those planted in its proof
# cells, and one in valuelab.lab.symbolic.gae_closed_form, which only the instance checks still stop
VACUITY_SPEC = "ch05"
VACUITY_LABELS = ("prop-gae-closed",)
VACUITY_LIBRARY_SLIP = "closed-limit-minus-1"
VACUITY_UNTIL = 24
VACUITY = "<vacuity>"


def general_propositions(chapter: str) -> List[str]:
    return sorted(label for label, (ch, kind) in PROPOSITIONS.items() if ch == chapter and kind == "general")


def vacuity_slips() -> List[str]:
    return [s.name for s in SPEC[VACUITY_SPEC].MUTATIONS
            if s.aims_at in VACUITY_LABELS and (s.cell is not None or s.name == VACUITY_LIBRARY_SLIP)]


def _run_driver(spec_name: str, extra: Sequence[str] = ()) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", MPLBACKEND="Agg")
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "report.json"
        proc = subprocess.run([sys.executable, str(DRIVER), spec_name, str(out), *extra], env=env, cwd=ROOT,
                              capture_output=True, text=True, timeout=1200)
        if proc.returncode != 0 or not out.is_file():
            return {"<driver>": f"driver failed for {spec_name}:\n{proc.stderr[-3000:]}"}
        result = json.loads(out.read_text(encoding="utf-8"))
    result.setdefault(META, {})["wall_s"] = round(time.perf_counter() - started, 1)
    return result


def _job(key: str) -> dict:
    if key == VACUITY:
        extra = [f"--vacuous={label}" for label in VACUITY_LABELS] + [f"--only={name}" for name in vacuity_slips()]
        return _run_driver(VACUITY_SPEC, [*extra, f"--until={VACUITY_UNTIL}"])
    return _run_driver(key)


def caught_cell(report: dict) -> Optional[int]:
    return report.get("aimed", {}).get("caught_by")


def uncaught_propositions(mod, reports: dict, vacuous: bool = False) -> List[str]:
    """The general propositions of the chapter that no slip aimed at them is caught by in their own proof cells.

    ``vacuous``: judge by the driver's reruns of the catching proof cells with their asserts disabled.
    """
    out = []
    for label in general_propositions(mod.CHAPTER):
        caught = False
        for slip in (s for s in mod.MUTATIONS if s.aims_at == label):
            outcomes = reports.get(slip.name, {}).get("aimed", {}).get("outcomes", {})
            key = "vacuous_error" if vacuous else "error"
            caught |= any(o.get(key) == "AssertionError" and int(c) in mod.PROOFS.get(label, ())
                          for c, o in outcomes.items())
        if not caught:
            out.append(label)
    return out


class _Table:
    """Prints the slip -> catching cell table at the end of the session, and writes it with the reports."""

    def __init__(self, reports: dict, out_dir: Optional[Path]) -> None:
        self.reports, self.out_dir = reports, out_dir

    def lines(self) -> List[str]:
        out = [f"{'spec':6s} {'slip':44s} {'planted':>8s} {'aims at':26s} {'first failing':>13s} "
               f"{'aimed check caught it':>21s} {'disarmed':>9s}"]
        for name in [n for n in SPEC if n in self.reports] + [k for k in self.reports if k == VACUITY]:
            rep, mod = self.reports[name], SPEC[VACUITY_SPEC if name == VACUITY else name]
            meta = rep.get(META, {})
            title = mod.CHAPTER if name != VACUITY else (
                f"{mod.CHAPTER} with the proof cells of {', '.join(VACUITY_LABELS)} disarmed, up to cell {VACUITY_UNTIL}")
            out.append(f"-- {title}: driver {meta.get('seconds', '?')} s (wall {meta.get('wall_s', '?')} s), "
                       f"{len(meta.get('cells_run', []))} code cells run")
            if "<driver>" in rep:
                out.append(f"   {rep['<driver>'][:300]}")
                continue
            for slip in mod.MUTATIONS:
                if slip.name not in rep:
                    continue
                r = rep[slip.name]
                planted = f"cell {slip.cell}" if slip.cell is not None else "library"
                caught = caught_cell(r)
                vac = "-"
                if caught is not None and slip.aims_at in general_propositions(mod.CHAPTER):
                    err = r.get("aimed", {}).get("outcomes", {}).get(str(caught), {}).get("vacuous_error")
                    vac = "passes" if err is None else ("FAILS" if err == "AssertionError" else err)
                first = f"cell {r.get('cell')}" if r.get("error") == "AssertionError" else f"{r.get('error')}"
                aimed = f"cell {caught}" if caught is not None else "NOT CAUGHT"
                label = "vacuity" if name == VACUITY else name
                aims = slip.aims_at if isinstance(slip.aims_at, str) else f"cell {slip.aims_at}"
                out.append(f"{label:6s} {slip.name:44s} {planted:>8s} {aims:26s} {first:>13s} {aimed:>21s} {vac:>9s}")
        return out

    def pytest_terminal_summary(self, terminalreporter) -> None:
        lines = self.lines()
        terminalreporter.write_sep("-", "mutation test: which cell caught each slip")
        terminalreporter.write_line("first failing: the first cell that stopped the slipped chapter; aimed check: the "
                                    "cell the slip aims at (or the first of its proposition's proof cells) that "
                                    "fails on the mutated state; disarmed: that proof cell rerun from the same state "
                                    "with its asserts disabled ('passes': the catch was its asserts' doing)")
        for line in lines:
            terminalreporter.write_line(line)
        if self.out_dir is not None:
            try:
                self.out_dir.mkdir(parents=True, exist_ok=True)
                (self.out_dir / "table.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
                (self.out_dir / "reports.json").write_text(json.dumps(self.reports, indent=1), encoding="utf-8")
                terminalreporter.write_line(f"written to {self.out_dir}")
            except OSError as exc:
                terminalreporter.write_line(f"could not write the mutation report to {self.out_dir}: {exc}")


@pytest.fixture(scope="module")
def reports(request) -> dict:
    """The drivers of the chapters whose tests were selected, two at a time (each runs single-threaded)."""
    wanted = []
    for item in request.session.items:
        if item.module.__name__ != __name__:
            continue
        params = getattr(getattr(item, "callspec", None), "params", {})
        key = VACUITY if item.originalname == "test_disarmed_proofs_fail_the_mutation_test_end_to_end" \
            else params.get("name")
        if key and key not in wanted:
            wanted.append(key)
    wanted.sort(key=lambda k: -_last_seconds().get(k, 0.0))  # the longest first: the two workers finish together
    with ThreadPoolExecutor(max_workers=max(1, min(2, os.cpu_count() or 1))) as pool:
        out = dict(zip(wanted, pool.map(_job, wanted)))
    if not request.config.pluginmanager.has_plugin("mutation-table"):
        request.config.pluginmanager.register(_Table(out, REPORT_DIR), "mutation-table")
    return out


def _last_seconds() -> Dict[str, float]:
    """Each driver's wall time in the last written report (none: the order of the specs)."""
    try:
        last = json.loads((REPORT_DIR / "reports.json").read_text(encoding="utf-8"))
        return {k: float(r[META]["wall_s"]) for k, r in last.items() if META in r}
    except (OSError, ValueError, KeyError, TypeError):
        return {}


def chapter_reports(reports: dict, spec_name: str) -> dict:
    """The driver's reports for one spec: its slips', the baseline's (``"<baseline>"``) and ``"<meta>"``."""
    assert "<driver>" not in reports[spec_name], reports[spec_name].get("<driver>")
    return reports[spec_name]


def test_every_chapter_with_checks_has_slips():
    chapters = {mod.CHAPTER for _, mod in SPECS}
    for name in CHAPTERS_WITH_SLIPS:
        assert name in chapters, f"no slips planted in {name}"
    with_general = {ch for ch, kind in PROPOSITIONS.values() if kind == "general"}
    assert with_general <= chapters, f"general propositions without slips: {sorted(with_general - chapters)}"
    for _, mod in SPECS:
        assert (CHAPTERS / mod.CHAPTER).is_file(), mod.CHAPTER
        assert len(mod.MUTATIONS) >= 3, f"{mod.CHAPTER}: at least three slips"
        names = [s.name for s in mod.MUTATIONS]
        assert len(names) == len(set(names)), f"{mod.CHAPTER}: slip names repeat"


@pytest.mark.parametrize("spec_name", [n for n, _ in SPECS])
def test_spec_names_the_proof_cells_and_what_each_slip_aims_at(spec_name):
    """PROOFS covers the chapter's general propositions with code cells that check something; aims resolve."""
    mod = SPEC[spec_name]
    cells = dict(code_cells(CHAPTERS / mod.CHAPTER))
    skipped = set(getattr(mod, "SKIP_CELLS", ()))
    assert not skipped or getattr(mod, "SKIP_WHY", ""), f"{spec_name}: SKIP_CELLS needs SKIP_WHY"
    assert not skipped or skipped & set(cells), f"{spec_name}: SKIP_CELLS names no code cell"
    proofs = getattr(mod, "PROOFS", None)
    assert isinstance(proofs, dict), f"{spec_name}: no PROOFS"
    missing = [label for label in general_propositions(mod.CHAPTER) if label not in proofs]
    assert not missing, f"{spec_name}: PROOFS does not list the proof cells of {missing}"
    for label, where in proofs.items():
        assert PROPOSITIONS.get(label, (None,))[0] == mod.CHAPTER, f"{spec_name}: {label} is not a proposition here"
        assert where, f"{spec_name}: {label} has no proof cell"
        for c in where:
            assert c in cells and c not in skipped, f"{spec_name}: proof cell {c} of {label} is not a run code cell"
            assert count_asserts(cells[c]) > 0, f"{spec_name}: proof cell {c} of {label} has no assert"
    for slip in mod.MUTATIONS:
        if isinstance(slip.aims_at, str):
            assert slip.aims_at in proofs, f"{slip.name}: aims at {slip.aims_at}, which PROOFS does not list"
        else:
            assert slip.aims_at in cells and slip.aims_at not in skipped, (
                f"{slip.name}: aims at cell {slip.aims_at}, not a run code cell")
            assert count_asserts(cells[slip.aims_at]) > 0, f"{slip.name}: the cell it aims at has no assert"
        if slip.cell is not None:
            assert slip.cell not in skipped, f"{slip.name}: planted in a skipped cell"
        if slip.from_cell is not None:
            assert slip.from_cell in cells and slip.from_cell not in skipped, f"{slip.name}: from_cell is not run"
        start = slip.cell if slip.cell is not None else slip.from_cell
        aimed = proofs[slip.aims_at] if isinstance(slip.aims_at, str) else (slip.aims_at,)
        assert start is None or max(aimed) >= start, f"{slip.name}: every aimed cell is before the slip"


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


@pytest.mark.parametrize("name,slip", CASES, ids=[f"{n}-{s.name}" for n, s in CASES])
def test_slip_is_caught_by_the_check_it_aims_at(reports, name, slip):
    """The aimed cell (or one of the aimed proposition's proof cells), run on the mutated state, fails by itself."""
    report = chapter_reports(reports, name)[slip.name]
    aimed = report.get("aimed", {})
    assert caught_cell(report) is not None, (
        f"{slip.name} ({slip.why}) aims at {slip.aims_at} (cells {aimed.get('cells')}), which does not catch it; "
        f"the first failing cell is {report.get('cell')} ({report.get('error')}); "
        f"aimed cells: {json.dumps(aimed.get('outcomes', {}))[:1500]}")


@pytest.mark.parametrize("name", [n for n, mod in SPECS if general_propositions(mod.CHAPTER)])
def test_every_general_proof_catches_a_slip_in_its_own_cells(reports, name):
    mod = SPEC[name]
    uncaught = uncaught_propositions(mod, chapter_reports(reports, name))
    assert not uncaught, (f"{mod.CHAPTER}: no slip aimed at {uncaught} is caught by their own proof cells "
                          f"{[mod.PROOFS.get(label) for label in uncaught]}")


@pytest.mark.parametrize("name", [n for n, mod in SPECS if general_propositions(mod.CHAPTER)])
def test_disarmed_proofs_fail_the_mutation_test(reports, name):
    """With the asserts of the catching proof cells disabled (same mutated state), no general proof catches a slip.

    So the requirement above is met by the proofs' own checks, not by something else the cells run.
    """
    mod = SPEC[name]
    rep = chapter_reports(reports, name)
    assert not uncaught_propositions(mod, rep)
    still = sorted(set(general_propositions(mod.CHAPTER)) - set(uncaught_propositions(mod, rep, vacuous=True)))
    assert not still, f"{mod.CHAPTER}: {still} still catch a slip with their asserts disabled"


def test_disarmed_proofs_fail_the_mutation_test_end_to_end(reports):
    """Chapter 5 with every assert of the proof cells of prop-gae-closed disabled in the notebook, for the whole run.

    The old rule (a slip counts as caught by the first failing cell at or after it) still counts the library slip
    as caught, by the instance check at T = 5; the rule of this test, that the proposition's own proof cells catch
    a slip aimed at it, fails.
    """
    rep = reports[VACUITY]
    assert "<driver>" not in rep, rep.get("<driver>")
    mod = SPEC[VACUITY_SPEC]
    names = vacuity_slips()
    assert len(names) >= len(VACUITY_LABELS)
    for name in names:
        r = rep[name]
        print(f"{name}: first failing cell {r['cell']} ({r['error']}); its proof cells caught it: "
              f"{caught_cell(r) is not None}")
    assert set(VACUITY_LABELS) <= set(uncaught_propositions(mod, rep))  # (only the slips aimed at them were run)
    assert all(caught_cell(rep[name]) is None for name in names)
    if VACUITY_SPEC in reports:  # the same slips with the proofs as written: caught by them
        assert not set(VACUITY_LABELS) & set(uncaught_propositions(mod, reports[VACUITY_SPEC]))
    masked = rep[VACUITY_LIBRARY_SLIP]
    assert masked["error"] == "AssertionError" and masked["cell"] > max(mod.PROOFS["prop-gae-closed"]), (
        "the old rule no longer counts the library slip as caught by a later check", masked)
