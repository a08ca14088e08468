"""Mutation score of valuelab's training modules: mutmut on each module with the tests that cover it.

Usage::

    python tools/mutation_score.py                 # every module (long: see the timings in the table)
    python tools/mutation_score.py ppo losses      # some groups only (names of GROUPS)
    python tools/mutation_score.py --keep          # keep the work folder (to look at survivors: mutmut show/browse)
    python tools/mutation_score.py --report DIR    # only the table, from a kept work folder

mutmut rewrites the sources it mutates, so it never runs in the checkout:
each group gets a fresh copy in a temporary folder, laid out as mutmut
expects (``src/valuelab``, a copy of ``lib/valuelab`` with its built C
kernel; ``tests``, a copy of ``tests``) with its own ``pyproject.toml`` that
names the module(s) to mutate and the test files that cover them. mutmut
then runs, for each mutant, only those of the selected tests that call the
mutated function (its stats pass), in forked workers (``forkserver``: torch
is not fork-safe once its thread pools exist; one OpenMP thread per worker).

The score of a module is ``killed / (mutants - equivalent)``: a mutant is
killed when a test fails (or times out) with it in place; an equivalent
mutant is a survivor listed in ``tests/mutants_equivalent.txt`` with the
reason it cannot change behaviour. An entry names the mutant's key and the
line the mutant writes, so an entry whose mutant moved (the source changed)
no longer matches and the survivor counts again. The last line printed is
``mutation score: lowest module NN%``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional, Tuple

ROOT = Path(__file__).resolve().parents[1]
EQUIVALENT = ROOT / "tests" / "mutants_equivalent.txt"

# (group, modules under lib/valuelab, test files): in the order the issue lists them. Each group is one mutmut
# run in its own copy. The tests are those that exercise the module directly; slow suites that only pass
# through it (the chapters, the trainer processes, the benchmarks) are left out to keep the run affordable.
GROUPS: List[Tuple[str, List[str], List[str]]] = [
    ("ppo", ["lab/ppo.py"], ["tests/test_ppo.py", "tests/test_train_many.py"]),
    ("policy", ["lab/policy.py"], ["tests/test_policy.py"]),
    ("transformer", ["lab/transformer.py"], ["tests/test_transformer.py"]),
    ("advantages", ["advantages.py"], ["tests/test_estimators.py", "tests/test_errors.py"]),
    ("returns", ["returns.py"], ["tests/test_estimators.py", "tests/test_errors.py"]),
    # losses: the group paths are run on a one-rank process group in test_rewards_losses; tests/test_distributed.py
    # (2-4 spawned ranks) would kill the mutants that only several ranks tell apart, at ~30 s per surviving mutant
    ("losses", ["losses.py"], ["tests/test_rewards_losses.py", "tests/test_errors.py"]),
    ("packed", ["packed.py"], ["tests/test_packed.py"]),
    # the shared checks and the statistics (issue 25): their own tests, not the fuzz suite (a worker process per call)
    ("checks", ["_engine/checks.py"], ["tests/test_hardening_checks.py", "tests/test_hardening_numerics.py",
                                       "tests/test_hardening_fuzz_findings.py", "tests/test_errors.py"]),
    ("stats", ["lab/stats.py"], ["tests/test_stats.py", "tests/test_hardening_numerics.py",
                                 "tests/test_hardening_fuzz_findings.py"]),
    ("integrations", ["integrations/verl.py", "integrations/openrlhf.py", "integrations/torchrl.py", "integrations/trl.py",
                      "integrations/_conventions.py", "integrations/_swap.py"],
     ["tests/test_integrations.py", "tests/test_torchrl_gae.py", "tests/test_mutants_integrations.py"]),
]

# A mutant is detected when a test fails with it in place, or the run exceeds its time limit (SIGXCPU). A worker
# killed by a signal ("segfault": -9, -11) is not counted: a forked worker that deadlocks and burns its CPU limit is
# SIGKILLed too, which says nothing about the mutant (its line shows up among the survivors, marked [segfault]).
DETECTED = {"killed", "timeout"}

# Appended to the work copy's tests/conftest.py: mutmut's fork server imports it once, so every mutant's forked
# worker starts with what the first Adam step would otherwise import and set up (torch._dynamo: seconds) and
# with the loaded heap frozen out of the garbage collector's way.
WARM_UP = """

# ---- added by tools/mutation_score.py in its temporary copy (not in the checkout) ----
import gc as _gc

import torch as _torch
import torch._dynamo  # noqa: F401,E402

_p = _torch.zeros(2, requires_grad=True)
for _fused in (True, False):
    _opt = _torch.optim.Adam([_p], lr=0.1, fused=_fused)
    _p.sum().backward()
    _opt.step()
del _p, _opt
_gc.collect()
_gc.freeze()
"""


def status_of(code: Optional[int]) -> str:
    from mutmut.stats import status_by_exit_code

    return status_by_exit_code[code]


def module_name(module: str) -> str:
    return "valuelab." + module[:-3].replace("/", ".")


def write_config(work: Path, modules: List[str], tests: List[str]) -> None:
    """The work copy's pyproject.toml: what mutmut mutates, with which tests, and how it runs them."""
    lines = [
        "[tool.mutmut]",
        'source_paths = ["src"]',
        "only_mutate = [" + ", ".join(f'"src/valuelab/{m}"' for m in modules) + "]",
        "pytest_add_cli_args_test_selection = [" + ", ".join(f'"{t}"' for t in tests) + "]",
        # pytest's unraisable/thread-exception plugins call gc.collect() at each session's end: most of a short
        # run's time on a torch-sized heap, once per mutant
        'pytest_add_cli_args = ["-p", "no:cacheprovider", "-p", "no:unraisableexception", "-p", "no:threadexception", '
        '"-W", "ignore::DeprecationWarning"]',
        'process_isolation = "forkserver"',
        "use_setproctitle = false",
        "use_git_change_detection = false",
        "",
        "[tool.pytest.ini_options]",
        'testpaths = ["tests"]',
        "",
    ]
    (work / "pyproject.toml").write_text("\n".join(lines), encoding="utf-8")


def prepare(work: Path, modules: List[str], tests: List[str]) -> None:
    """A copy mutmut may rewrite: src/valuelab, tests, and a pyproject.toml with this group's settings."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".pytest_cache")
    shutil.copytree(ROOT / "lib" / "valuelab", work / "src" / "valuelab", ignore=ignore)
    shutil.copytree(ROOT / "tests", work / "tests", ignore=ignore)
    with open(work / "tests" / "conftest.py", "a", encoding="utf-8") as f:
        f.write(WARM_UP)
    write_config(work, modules, tests)


def run_group(work: Path, max_children: int, log) -> float:
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", MPLBACKEND="Agg", PYTHONDONTWRITEBYTECODE="1",
               HYPOTHESIS_PROFILE=os.environ.get("HYPOTHESIS_PROFILE", "ci"))
    env.pop("PYTHONPATH", None)
    start = time.monotonic()
    subprocess.run([sys.executable, "-m", "mutmut", "run", "--max-children", str(max_children)], cwd=work, env=env,
                   stdout=log, stderr=subprocess.STDOUT, check=False)
    return time.monotonic() - start


def refresh_tests(work: Path) -> None:
    """The checkout's current tests into a kept work folder (both copies mutmut reads), warm-up appended."""
    for dest in (work / "tests", work / "mutants" / "tests"):
        shutil.rmtree(dest, ignore_errors=True)
        shutil.copytree(ROOT / "tests", dest, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        with open(dest / "conftest.py", "a", encoding="utf-8") as f:
            f.write(WARM_UP)


def rerun_survivors(work: Path, modules: List[str], tests: List[str], max_children: int, log) -> float:
    """Run again, with the current tests, only the mutants of ``modules`` that no test detected in a kept run."""
    keys = []
    for module in modules:
        meta = work / "mutants" / "src" / "valuelab" / (module + ".meta")
        codes = json.loads(meta.read_text(encoding="utf-8"))["exit_code_by_key"] if meta.is_file() else {}
        keys += [k for k, c in codes.items() if status_of(c) not in DETECTED]
    if not keys:
        return 0.0
    refresh_tests(work)
    write_config(work, modules, tests)
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", MPLBACKEND="Agg", PYTHONDONTWRITEBYTECODE="1")
    env.pop("PYTHONPATH", None)
    start = time.monotonic()
    subprocess.run([sys.executable, "-m", "mutmut", "run", "--max-children", str(max_children), *keys], cwd=work, env=env,
                   stdout=log, stderr=subprocess.STDOUT, check=False)
    return time.monotonic() - start


def mutated_line(work: Path, key: str, module: str) -> str:
    """The first line the mutant writes (``+`` in its diff), stripped; ``-`` + the removed line if it only removes."""
    from mutmut.mutation.diff_apply import get_diff_for_mutant

    old = os.getcwd()
    os.chdir(work)
    try:
        diff = get_diff_for_mutant(key, path=Path("src") / "valuelab" / module)
    except Exception as e:  # noqa: BLE001 - a report must not stop on one unreadable mutant
        return f"<no diff: {type(e).__name__}>"
    finally:
        os.chdir(old)
    body = diff.splitlines()[2:]
    added = [line[1:].strip() for line in body if line.startswith("+")]
    if added:
        return " ".join(added)
    removed = [line[1:].strip() for line in body if line.startswith("-")]
    return "- " + " ".join(removed)


def load_equivalent() -> Dict[str, Tuple[str, str]]:
    """key -> (mutated line, reason) from tests/mutants_equivalent.txt (``key :: line :: reason``, # comments)."""
    out = {}
    if not EQUIVALENT.is_file():
        return out
    for raw in EQUIVALENT.read_text(encoding="utf-8").splitlines():
        if not raw.strip() or raw.lstrip().startswith("#"):
            continue
        parts = [p.strip() for p in raw.split(" :: ")]
        if len(parts) != 3:
            raise SystemExit(f"{EQUIVALENT}: not 'key :: mutated line :: reason': {raw!r}")
        out[parts[0]] = (parts[1], parts[2])
    return out


def collect(work: Path, modules: List[str]) -> Dict[str, dict]:
    """Per module: every mutant's status, and the survivors' mutated lines."""
    out = {}
    for module in modules:
        meta = work / "mutants" / "src" / "valuelab" / (module + ".meta")
        codes = json.loads(meta.read_text(encoding="utf-8"))["exit_code_by_key"] if meta.is_file() else {}
        statuses = {key: status_of(code) for key, code in codes.items()}
        survivors = {key: mutated_line(work, key, module) for key, s in sorted(statuses.items()) if s not in DETECTED}
        out[module] = dict(statuses=statuses, survivors=survivors)
    return out


def table(results: Dict[str, dict], times: Dict[str, float], equivalent: Dict[str, Tuple[str, str]]) -> List[str]:
    rows, lowest, lines = [], None, []
    for module, r in results.items():
        total = len(r["statuses"])
        killed = sum(s in DETECTED for s in r["statuses"].values())
        equiv = [k for k, line in r["survivors"].items() if k in equivalent and equivalent[k][0] == line]
        stale = [k for k in r["survivors"] if k in equivalent and equivalent[k][0] != r["survivors"][k]]
        open_ = [k for k in r["survivors"] if k not in equiv]
        score = 100.0 * killed / max(total - len(equiv), 1) if total else 0.0
        lowest = score if lowest is None else min(lowest, score)
        rows.append((module_name(module), total, killed, len(equiv), score, times.get(module)))
        for k in open_:
            status = r["statuses"][k]
            lines.append(f"  survivor  {k} [{status}]: {r['survivors'][k]}")
        for k in stale:
            lines.append(f"  stale equivalent entry (the mutant's line changed): {k}")
    width = max([len(r[0]) for r in rows] + [6])
    lines.append("")
    lines.append(f"{'module':<{width}}  {'mutants':>7}  {'killed':>6}  {'equivalent':>10}  {'score':>6}  {'run time':>9}")
    for name, total, killed, equiv, score, t in rows:
        tt = f"{t / 60:7.1f} m" if t is not None else "        -"
        lines.append(f"{name:<{width}}  {total:>7}  {killed:>6}  {equiv:>10}  {score:>5.1f}%  {tt}")
    lines.append(f"mutation score: lowest module {int(lowest if lowest is not None else 0)}%")
    return lines


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("groups", nargs="*", help=f"groups to run (default all): {', '.join(g[0] for g in GROUPS)}")
    ap.add_argument("--work", type=Path, help="work folder (default: a new temporary folder)")
    ap.add_argument("--keep", action="store_true", help="keep the work folder")
    ap.add_argument("--report", type=Path, help="no run: the table from a kept work folder")
    ap.add_argument("--survivors", type=Path,
                    help="in a kept work folder: run the surviving mutants again with the checkout's current tests, then the table")
    ap.add_argument("--max-children", type=int, default=os.cpu_count() or 1)
    args = ap.parse_args(argv)
    names = [g[0] for g in GROUPS]
    unknown = [g for g in args.groups if g not in names]
    if unknown:
        ap.error(f"unknown groups {unknown}; choose from {names}")
    chosen = [g for g in GROUPS if not args.groups or g[0] in args.groups]

    if args.survivors:
        for group, modules, tests in chosen:
            work = args.survivors / group
            if (work / "mutants").is_dir():
                with open(work / "mutmut-survivors.log", "w") as log:
                    t = rerun_survivors(work, modules, tests, args.max_children, log)
                print(f"==> {group}: survivors run again with the current tests ({t / 60:.1f} min)", flush=True)
        args.report = args.survivors
    base = args.report or args.work or Path(tempfile.mkdtemp(prefix="valuelab-mutation-"))
    results, times = {}, {}
    times_file = base / "times.json"
    if times_file.is_file():  # a kept work folder: the run times of the groups run there before
        times = json.loads(times_file.read_text(encoding="utf-8"))
    try:
        for group, modules, tests in chosen:
            work = base / group
            if not args.report:
                if work.exists():
                    shutil.rmtree(work)
                work.mkdir(parents=True)
                prepare(work, modules, tests)
                print(f"==> {group}: mutmut on {', '.join(modules)} with {', '.join(tests)} (log: {work / 'mutmut.log'})",
                      flush=True)
                with open(work / "mutmut.log", "w") as log:
                    elapsed = run_group(work, args.max_children, log)
                for m in modules:  # the group's run time, shared by its modules in proportion to their mutants
                    times[m] = elapsed
                times_file.write_text(json.dumps(times), encoding="utf-8")
                print(f"    {elapsed / 60:.1f} min", flush=True)
            if not (work / "mutants").is_dir():
                print(f"    {group}: no mutmut results in {work}", flush=True)
                continue
            part = collect(work, modules)
            if len(modules) > 1 and not args.report:
                total = sum(len(r["statuses"]) for r in part.values()) or 1
                for m in modules:
                    times[m] = times[m] * len(part[m]["statuses"]) / total
                times_file.write_text(json.dumps(times), encoding="utf-8")
            results.update(part)
    finally:
        if not (args.keep or args.work or args.report):
            shutil.rmtree(base, ignore_errors=True)
        elif not args.report:
            print(f"work folder kept: {base}")
    for line in table(results, times, load_equivalent()):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
