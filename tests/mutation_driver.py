"""Run one chapter once, and each of its planted slips from a checkpoint: the engine of tests/test_mutation.py.

Usage: ``python tests/mutation_driver.py <spec> <report.json> [--vacuous LABEL]... [--only SLIP]... [--until N]``.

This process runs the chapter's code cells in order in an IPython shell
(the cells a spec lists in ``SKIP_CELLS`` are left out). Before it runs
cell ``i``, it forks one child per slip planted in cell ``i``: the child
runs the slipped cell and the cells after it, and stops at the first error;
the parent then goes on with the cell as written. So a slip costs only the
cells from its own to the check that catches it, not the whole chapter
again. Slips planted in a library function are forked right after the cell
that imports valuelab (or before the cell their ``from_cell`` names): the
child re-defines the function in its module and rebinds every alias of it,
in valuelab's modules and in the names the chapter's cells have bound, then
runs the chapter from there.

**Which cell caught it.** The first failing cell is not necessarily the
check the slip was aimed at: a later numeric table or instance check can
fail first and so hide a general proof that checks nothing. Each slip
therefore names what it aims at (``Slip.aims_at``): a proposition, whose
proof cells the spec lists in ``PROOFS``, or one code cell. Those *aimed
cells* are run on the mutated state, the state the chapter reaches with the
slip planted, each on its own:

* if the slip's run reaches an aimed cell with no earlier error, the cell
  runs there, in the state the slipped chapter has at that point;
* otherwise (an earlier cell stopped the run) a second child replays the
  slipped chapter up to the aimed cells with the *top-level* ``assert``
  statements of the other cells turned into plain expressions (so that a
  check that fires there does not leave its cell half run), and runs the
  aimed cells as written.

When a cell of a general proof (a proposition *proved symbolically, in
general*) that a slip aims at fails, a snapshot of the state it started
from (a forked grandchild, idle until then) runs it once more with its own
asserts disabled (``assert X`` -> ``X``, helpers defined in it included): the
*vacuous* outcome, which the vacuity test of tests/test_mutation.py
uses to show that the catch is the proof's doing.

``--vacuous LABEL`` disables the asserts of the proof cells of proposition
``LABEL`` for the whole run (the parent's cells and every child's): the
mutation test on a chapter whose proof checks nothing. ``--only`` runs only
the named slips; ``--until N`` runs no cell after cell ``N``.

Forking is safe here because the caller starts this process with
``OMP_NUM_THREADS=1`` (a forked child cannot use an OpenMP pool its parent
started; with one thread there is none; the C kernel, built with OpenMP,
uses its own pool in a forked child, and that pool resets itself there).

The report (JSON) maps ``"<baseline>"`` and each slip's name to
``{"error": exception name or None, "message": ..., "cell": index}``; a
slip's entry also has ``"aimed"``: ``{"cells": [...], "caught_by": the
first aimed cell that raised an AssertionError or None, "outcomes": {cell:
{"error", "message", "vacuous_error", "vacuous_message", "replayed"}}}``.
``"<meta>"`` holds the run time and the cells run.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import inspect
import json
import os
import re
import select
import signal
import sys
import textwrap
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = ROOT / "chapters"
sys.path.insert(0, str(ROOT / "tests"))

from mutations import Slip  # noqa: E402

TIMEOUT_S = 240  # one slip's run
BASELINE = "<baseline>"
META = "<meta>"


def code_cells(notebook: Path) -> List[Tuple[int, str]]:
    nb = json.loads(notebook.read_text(encoding="utf-8"))
    return [(i, "".join(c["source"])) for i, c in enumerate(nb["cells"]) if c["cell_type"] == "code"]


def replace_once(text: str, old: str, new: str, where: str) -> str:
    count = text.count(old)
    if count != 1:
        raise LookupError(f"{where}: the slip's text occurs {count} times, not once: {old!r}")
    return text.replace(old, new)


class _Disarm(ast.NodeTransformer):
    """``assert X, msg`` -> ``X``: the check's expression still runs, it can no longer fail."""

    def __init__(self, top_level_only: bool) -> None:
        self.top_level_only = top_level_only

    def visit_Assert(self, node: ast.Assert) -> ast.AST:
        return ast.copy_location(ast.Expr(value=node.test), node)

    def _scope(self, node: ast.AST) -> ast.AST:
        return node if self.top_level_only else self.generic_visit(node)

    visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = visit_Lambda = _scope


def disarm_asserts(source: str, *, top_level_only: bool = False) -> str:
    """The cell with its ``assert`` statements turned into plain expressions.

    ``top_level_only``: only the asserts that run when the cell runs, not
    those inside the functions and classes it defines (a later cell may
    call them: they are that cell's checks). IPython syntax (magics) is
    translated first.
    """
    from IPython.core.inputtransformer2 import TransformerManager

    tree = ast.parse(TransformerManager().transform_cell(source))
    tree = _Disarm(top_level_only).visit(tree)
    return ast.unparse(ast.fix_missing_locations(tree)) + "\n"


def count_asserts(source: str) -> int:
    """The number of ``assert`` statements in a cell (inside its functions too)."""
    from IPython.core.inputtransformer2 import TransformerManager

    return sum(isinstance(n, ast.Assert) for n in ast.walk(ast.parse(TransformerManager().transform_cell(source))))


def plant_in_function(slip: Slip, namespace: Optional[dict] = None) -> None:
    """Re-define ``slip.function`` in its module from its edited source; rebind every valuelab alias of it.

    ``namespace`` (the shell's): names the chapter's cells bound to the function
    (``from valuelab.lab.policy import soft_optimal``) are rebound too.
    """
    modname, qualname = slip.function.split(":")
    module = importlib.import_module(modname)
    old_obj = getattr(module, qualname)
    src = textwrap.dedent(inspect.getsource(inspect.unwrap(old_obj)))  # decorators included: a fresh cache
    src = replace_once(src, slip.old, slip.new, slip.function)
    exec(compile(src, f"<slip {slip.name} in {slip.function}>", "exec"), module.__dict__)
    new_obj = module.__dict__[qualname]
    for name, mod in list(sys.modules.items()):
        if mod is None or not (name == "valuelab" or name.startswith("valuelab.")):
            continue
        for attr, value in list(vars(mod).items()):
            if value is old_obj:
                setattr(mod, attr, new_obj)
    for attr, value in list((namespace or {}).items()):
        if value is old_obj:
            namespace[attr] = new_obj


def report(exc: Optional[BaseException], cell: Optional[int]) -> dict:
    if exc is None:
        return {"error": None, "message": "", "cell": cell}
    return {"error": type(exc).__name__, "message": str(exc)[:500], "cell": cell}


def run_one(shell, source: str) -> Optional[BaseException]:
    result = shell.run_cell(source, silent=True, store_history=False)
    return result.error_before_exec or result.error_in_exec


def _child(work: Callable[[], dict], gate: Optional[Tuple[int, int]] = None) -> Tuple[int, int]:
    """Fork; the child runs ``work()`` (after a go byte on the pipe ``gate``, if given), reports through a pipe."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_fd)
        if gate is not None:
            os.close(gate[1])
        if gate is not None and os.read(gate[0], 1) != b"g":
            os._exit(0)  # dropped: nothing to run
        try:
            out = work()
        except BaseException as exc:  # noqa: BLE001 -- everything goes back to the parent
            out = {"error": f"harness {type(exc).__name__}", "message": str(exc)[:500], "cell": None}
        data = json.dumps(out).encode()
        while data:
            data = data[os.write(write_fd, data):]
        os._exit(0)
    os.close(write_fd)
    return pid, read_fd


def _collect(pid: int, read_fd: int) -> dict:
    """The report of a forked child, or a timeout/crash report."""
    chunks, deadline = [], time.monotonic() + TIMEOUT_S
    with os.fdopen(read_fd, "rb") as pipe:
        while True:
            ready, _, _ = select.select([pipe], [], [], max(deadline - time.monotonic(), 0))
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


def in_child(work: Callable[[], dict]) -> dict:
    """``work()`` in a forked child; its report, or a timeout/crash report."""
    return _collect(*_child(work))


class Snapshot:
    """A forked copy of this process as it is now, idle until :meth:`run` has it do ``work`` (or :meth:`drop`)."""

    def __init__(self, work: Callable[[], dict]) -> None:
        gate_r, self._gate = os.pipe()
        self._pid, self._read_fd = _child(work, (gate_r, self._gate))
        os.close(gate_r)

    def run(self) -> dict:
        os.write(self._gate, b"g")
        os.close(self._gate)
        return _collect(self._pid, self._read_fd)

    def drop(self) -> None:
        os.write(self._gate, b"x")
        os.close(self._gate)
        _collect(self._pid, self._read_fd)


class Chapter:
    """The chapter's code cells as the harness runs them, and what each slip aims at."""

    def __init__(self, spec, vacuous: Sequence[str] = ()) -> None:
        skipped = set(getattr(spec, "SKIP_CELLS", ()))
        self.proofs: Dict[str, Tuple[int, ...]] = {k: tuple(v) for k, v in getattr(spec, "PROOFS", {}).items()}
        self.cells = [(i, s) for i, s in code_cells(CHAPTERS / spec.CHAPTER) if i not in skipped]
        self.sources = dict(self.cells)
        self.vacuous_cells = set()
        for label in vacuous:
            if label not in self.proofs:
                raise LookupError(f"--vacuous {label}: not a proposition of PROOFS")
            self.vacuous_cells.update(self.proofs[label])
        self.raw = dict(self.sources)  # as written: where a slip's text is looked up
        from test_notebooks import propositions  # the chapters' statuses, as the notebook tests read them

        self.general = {label for label, (ch, kind) in propositions().items() if ch == spec.CHAPTER and kind == "general"}
        if self.vacuous_cells:  # the proofs check nothing, for the parent and every child
            self.cells = [(i, self.as_run(i, s)) for i, s in self.cells]
            self.sources = dict(self.cells)

    def as_run(self, index: int, source: str) -> str:
        """The cell as the harness runs it: with its asserts disabled when it proves a ``--vacuous`` proposition."""
        return disarm_asserts(source) if index in self.vacuous_cells else source

    def aimed(self, slip: Slip) -> List[int]:
        """The code cells of the check the slip aims at, from the slip's own cell on."""
        cells = self.proofs.get(slip.aims_at, ()) if isinstance(slip.aims_at, str) else (slip.aims_at,)
        start = slip.cell if slip.cell is not None else (slip.from_cell if slip.from_cell is not None else -1)
        return sorted(c for c in cells if c >= start)


def run_aimed_cell(shell, index: int, source: str, vacuous: bool) -> dict:
    """Run an aimed cell; with ``vacuous``, if it fails, rerun it with its asserts disabled, from the same state."""
    if not vacuous:
        return report(run_one(shell, source), index)
    snapshot = Snapshot(lambda: report(run_one(shell, disarm_asserts(source)), index))
    out = report(run_one(shell, source), index)
    if out["error"] is None:
        snapshot.drop()
        out.update(vacuous_error=None, vacuous_message="")
    else:
        vac = snapshot.run()
        out.update(vacuous_error=vac["error"], vacuous_message=vac["message"])
    return out


def slip_run(shell, cells: List[Tuple[int, str]], aimed: List[int], vacuous: bool) -> dict:
    """The slip's run: cells in order, stopping at the first error; the aimed cells it reaches are recorded."""
    outcomes: Dict[int, dict] = {}
    for index, source in cells:
        if index in aimed:
            outcomes[index] = run_aimed_cell(shell, index, source, vacuous)
            if outcomes[index]["error"] is not None:
                out = {k: outcomes[index][k] for k in ("error", "message", "cell")}
                break
        else:
            exc = run_one(shell, source)
            if exc is not None:
                out = report(exc, index)
                break
    else:
        out = report(None, None)
    out["outcomes"] = {str(k): v for k, v in outcomes.items()}
    return out


def replay_to_aimed(shell, cells: List[Tuple[int, str]], aimed: List[int], vacuous: bool) -> dict:
    """The slipped chapter up to its last aimed cell: other cells' top-level checks disarmed, aimed cells as written."""
    outcomes: Dict[int, dict] = {}
    errors = []
    for index, source in cells:
        if index > aimed[-1]:
            break
        if index in aimed:
            outcomes[index] = dict(run_aimed_cell(shell, index, source, vacuous), replayed=True)
            if outcomes[index]["error"] == "AssertionError":
                break
        else:
            exc = run_one(shell, disarm_asserts(source, top_level_only=True))
            if exc is not None:
                errors.append(report(exc, index))
    return {"outcomes": {str(k): v for k, v in outcomes.items()}, "replay_errors": errors}


def aimed_summary(aimed: List[int], first: dict, replay: Optional[dict]) -> dict:
    outcomes = dict(first.pop("outcomes", {}))
    if replay is not None:
        for k, v in replay["outcomes"].items():
            outcomes.setdefault(k, v)
    caught = [int(k) for k, v in outcomes.items() if v["error"] == "AssertionError"]
    out = {"cells": aimed, "caught_by": min(caught) if caught else None, "outcomes": outcomes}
    if replay is not None and replay["replay_errors"]:
        out["replay_errors"] = replay["replay_errors"]
    return out


def needs_replay(aimed: List[int], first: dict) -> bool:
    """True when the slip's run stopped before it could run the aimed cells after its stop."""
    if any(v["error"] == "AssertionError" for v in first["outcomes"].values()):
        return False
    return first["cell"] is not None and any(c > first["cell"] for c in aimed)


def import_cell(cells: List[Tuple[int, str]]) -> Optional[int]:
    """The chapter's cell that imports valuelab (the setup cell of the chapter template), if any."""
    return next((i for i, s in cells if re.search(r"^(import valuelab|from valuelab)", s, re.M)), None)


def main(spec_name: str, out_path: str, vacuous: Sequence[str] = (), only: Sequence[str] = (),
         until: Optional[int] = None) -> None:
    started = time.perf_counter()
    spec = importlib.import_module(f"mutations.{spec_name}")
    chapter = Chapter(spec, vacuous)
    if until is not None:
        chapter.cells = [(i, s) for i, s in chapter.cells if i <= until]
        chapter.sources = dict(chapter.cells)
    cells, sources = chapter.cells, chapter.sources
    slips = [s for s in spec.MUTATIONS if not only or s.name in only]
    # a library slip is planted after the cell that imports valuelab (every name that cell bound to the function
    # is rebound), so its run does not pay for the imports again; nothing before that cell calls valuelab's maths
    imports = import_cell(cells)
    after_imports = next((k for k, (i, _) in enumerate(cells) if imports is not None and i > imports), 0)
    reports: Dict[str, dict] = {}
    at_cell: Dict[int, List[Slip]] = {}
    for slip in slips:
        aimed = chapter.aimed(slip)
        if not aimed:
            reports[slip.name] = {"error": "LookupError", "message": f"aims at {slip.aims_at!r}: no code cell to run",
                                  "cell": None}
        elif any(c not in sources for c in aimed):
            reports[slip.name] = {"error": "LookupError", "message": f"aimed cells {aimed}: not all are run code cells",
                                  "cell": None}
        elif slip.function is not None and slip.from_cell is not None and slip.from_cell not in sources:
            reports[slip.name] = {"error": "LookupError", "message": f"from_cell {slip.from_cell} is not a run code cell",
                                  "cell": None}
        elif slip.function is not None:
            at_cell.setdefault(slip.from_cell if slip.from_cell is not None else cells[after_imports][0], []).append(slip)
        elif slip.cell not in sources:
            reports[slip.name] = {"error": "LookupError", "message": f"cell {slip.cell} is not a code cell",
                                  "cell": None}
        else:
            at_cell.setdefault(slip.cell, []).append(slip)

    # the cells' output goes nowhere; the report goes to out_path
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    sys.stdout = sys.stderr = open(os.devnull, "w")
    os.chdir(CHAPTERS)
    import matplotlib

    matplotlib.use("Agg")
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()

    def run_slip(slip: Slip, prepare: Callable[[], List[Tuple[int, str]]]) -> dict:
        aimed = chapter.aimed(slip)
        vacuous = slip.aims_at in chapter.general  # a general proof: is the catch its asserts' doing?

        def first_run() -> dict:
            try:
                slipped = prepare()
            except LookupError as exc:
                return dict(report(exc, None), outcomes={})
            return slip_run(shell, slipped, aimed, vacuous)

        first = in_child(first_run)
        first.setdefault("outcomes", {})
        replay = None
        if first["error"] not in ("LookupError", "timeout", "crash") and needs_replay(aimed, first):
            replay = in_child(lambda: replay_to_aimed(shell, prepare(), aimed, vacuous))
            if "outcomes" not in replay:  # the replay itself timed out or crashed
                replay = {"outcomes": {}, "replay_errors": [replay]}
        first["aimed"] = aimed_summary(aimed, first, replay)
        return first

    baseline = report(None, None)
    cell_seconds: Dict[int, float] = {}
    for k, (index, source) in enumerate(cells):
        for slip in at_cell.get(index, []):
            if slip.function is not None:
                def prepare(slip=slip, k=k) -> List[Tuple[int, str]]:
                    plant_in_function(slip, shell.user_ns)
                    return cells[k:]
            else:
                def prepare(slip=slip, index=index, k=k) -> List[Tuple[int, str]]:
                    slipped = replace_once(chapter.raw[index], slip.old, slip.new, f"cell {index}")
                    return [(index, chapter.as_run(index, slipped))] + cells[k + 1:]
            reports[slip.name] = run_slip(slip, prepare)
        cell_start = time.perf_counter()
        exc = run_one(shell, source)
        cell_seconds[index] = round(time.perf_counter() - cell_start, 2)
        if exc is not None:
            baseline = report(exc, index)
            for later in (s for i, ss in at_cell.items() if i > index for s in ss):
                reports[later.name] = {"error": "baseline", "message": f"the chapter fails at cell {index}",
                                       "cell": None}
            break
    reports[BASELINE] = baseline
    reports[META] = {"seconds": round(time.perf_counter() - started, 1), "cells_run": [i for i, _ in cells],
                     "vacuous": list(vacuous), "until": until, "library_slips_from": cells[after_imports][0],
                     "baseline_cell_seconds": cell_seconds}
    Path(out_path).write_text(json.dumps(reports), encoding="utf-8")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("spec")
    parser.add_argument("out")
    parser.add_argument("--vacuous", action="append", default=[],
                        help="disable the asserts of this proposition's proof cells (repeatable)")
    parser.add_argument("--only", action="append", default=[], help="run only this slip (repeatable)")
    parser.add_argument("--until", type=int, default=None, help="run no cell after this one (parent and children)")
    args = parser.parse_args()
    main(args.spec, args.out, args.vacuous, args.only, args.until)
