"""Run one chapter once, and each of its planted slips from a checkpoint: the engine of tests/test_mutation.py.

Usage: ``python tests/mutation_driver.py <spec module name> <report.json>``.

This process runs the chapter's code cells in order in an IPython shell.
Before it runs cell ``i``, it forks one child per slip planted in cell
``i``: the child runs the slipped cell and the cells after it, and stops at
the first error; the parent then goes on with the cell as written. So a slip
costs only the cells from its own to the check that catches it, not the
whole chapter again. Slips planted in a library function need the chapter
from its first cell; their children are forked before cell 0.

Forking is safe here because the caller starts this process with
``OMP_NUM_THREADS=1`` (a forked child cannot use an OpenMP pool its parent
started; with one thread there is none) and valuelab's own thread pool
resets itself in a forked child.

The report (JSON) maps ``"<baseline>"`` and each slip's name to
``{"error": exception name or None, "message": ..., "cell": index}``.
"""

from __future__ import annotations

import importlib
import inspect
import json
import os
import select
import signal
import sys
import textwrap
import time
from pathlib import Path
from typing import Dict, List, Optional, Tuple

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = ROOT / "chapters"
sys.path.insert(0, str(ROOT / "tests"))

from mutations import Slip  # noqa: E402

TIMEOUT_S = 240  # one slip's run
BASELINE = "<baseline>"


def code_cells(notebook: Path) -> List[Tuple[int, str]]:
    nb = json.loads(notebook.read_text(encoding="utf-8"))
    return [(i, "".join(c["source"])) for i, c in enumerate(nb["cells"]) if c["cell_type"] == "code"]


def replace_once(text: str, old: str, new: str, where: str) -> str:
    count = text.count(old)
    if count != 1:
        raise LookupError(f"{where}: the slip's text occurs {count} times, not once: {old!r}")
    return text.replace(old, new)


def plant_in_function(slip: Slip) -> None:
    """Re-define ``slip.function`` in its module from its edited source; rebind every valuelab alias of it."""
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


def report(exc: Optional[BaseException], cell: Optional[int]) -> dict:
    if exc is None:
        return {"error": None, "message": "", "cell": cell}
    return {"error": type(exc).__name__, "message": str(exc)[:500], "cell": cell}


def run_from(shell, cells: List[Tuple[int, str]]) -> dict:
    """Run ``cells`` in ``shell``; the first error, or none."""
    for index, source in cells:
        result = shell.run_cell(source, silent=True, store_history=False)
        exc = result.error_before_exec or result.error_in_exec
        if exc is not None:
            return report(exc, index)
    return report(None, None)


def in_child(work) -> dict:
    """``work()`` in a forked child; its report, or a timeout/crash report."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_fd)
        try:
            out = work()
        except BaseException as exc:  # noqa: BLE001 -- everything goes back to the parent
            out = {"error": f"harness {type(exc).__name__}", "message": str(exc)[:500], "cell": None}
        os.write(write_fd, json.dumps(out).encode())
        os._exit(0)
    os.close(write_fd)
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


def main(spec_name: str, out_path: str) -> None:
    spec = importlib.import_module(f"mutations.{spec_name}")
    cells = code_cells(CHAPTERS / spec.CHAPTER)
    sources = dict(cells)
    reports: Dict[str, dict] = {}
    at_cell: Dict[int, List[Slip]] = {}
    in_library: List[Slip] = []
    for slip in spec.MUTATIONS:
        if slip.function is not None:
            in_library.append(slip)
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

    for slip in in_library:
        def work(slip=slip):
            try:
                plant_in_function(slip)
            except LookupError as exc:
                return report(exc, None)
            return run_from(shell, cells)
        reports[slip.name] = in_child(work)

    baseline = report(None, None)
    for k, (index, source) in enumerate(cells):
        for slip in at_cell.get(index, []):
            def work(slip=slip, index=index, k=k):
                try:
                    slipped = replace_once(sources[index], slip.old, slip.new, f"cell {index}")
                except LookupError as exc:
                    return report(exc, None)
                return run_from(shell, [(index, slipped)] + cells[k + 1:])
            reports[slip.name] = in_child(work)
        result = shell.run_cell(source, silent=True, store_history=False)
        exc = result.error_before_exec or result.error_in_exec
        if exc is not None:
            baseline = report(exc, index)
            for later in (s for i, ss in at_cell.items() if i > index for s in ss):
                reports[later.name] = {"error": "baseline", "message": f"the chapter fails at cell {index}",
                                       "cell": None}
            break
    reports[BASELINE] = baseline
    Path(out_path).write_text(json.dumps(reports), encoding="utf-8")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
