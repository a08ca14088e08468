"""Benchmark of GAE: the per-token loop, ``valuelab.gae`` end to end, and an elementwise floor.

Run ``python -m valuelab.bench --threads 2`` (full grid, under a minute on 2
CPU cores) or ``--quick``; ``--device cuda`` on a GPU (the default is CPU, plus
CUDA when present), ``--out results.csv`` to keep the numbers (a
``results.json`` next to it describes the machine), ``--shapes 64x4096`` for
one shape, ``--mallopt`` to switch glibc's malloc to keep freed memory (see
:func:`keep_freed_memory`). The timings are discussed in ``chapters/09_fast_gae``;
the stored full run is ``chapters/data/bench_cpu.csv``.

For every device, dtype, batch ``B``, length ``T`` and mask kind (right-padded
or with holes), measured in the same run, with ``torch.cuda.synchronize``
around each call on a GPU; the fast paths of one shape (right-padded and holes; then the
same two on the PyTorch path) are timed in turn, one call each per round (:func:`time_interleaved`),
so that their ratios are fair on a machine whose speed drifts, and the
floor in a tight loop of its own (its smallest, warmest time: the
conservative choice for ``fast/floor``); median and minimum are kept:

``loop``
    GAE as production RLHF frameworks write it (TRL / verl style): a Python
    loop over the tokens, ``delta = r[:, t] + gamma * v[:, t+1] - v[:, t]``,
    ``lastgaelam = delta + gamma * lam * lastgaelam``, then ``torch.stack``
    and ``returns = advantages + values``. It ignores the mask (so its time
    does not depend on it: it is timed once per (B, T, dtype)).
``fast``
    :func:`valuelab.gae` end to end, the public function: argument checks,
    the scan, the outputs (on a CPU with a C compiler, one pass of the C
    kernel; elsewhere the same as ``torch``).
``torch``
    :func:`valuelab.gae` end to end with the C kernel switched off
    (:func:`valuelab._native.disabled`): the PyTorch block scan, the path a
    GPU takes and the one a CPU takes without a C compiler.
``floor``
    One elementwise pass over the same tensors, ``torch.add(rewards, values,
    alpha=gamma, out=buf)`` into a buffer allocated once: nothing that reads
    the inputs and writes an output can be faster (``valuelab.gae`` reads
    three tensors and writes two, and allocates them).

Ratios (of medians): ``loop/fast``, ``fast/floor``, ``torch/floor`` and, for
masks with holes, ``holes/rp`` (fast with holes over fast right-padded, same
shape). ``faults`` is the number of minor page faults per ``fast`` call: on a
CPU, PyTorch allocates every output with ``malloc``, and a buffer glibc has
handed back to the OS costs about 2 microseconds per 4 KiB page when touched
again (see :func:`keep_freed_memory`). At the end the issue's targets are
checked on the CPU, float32, B=64, T=4096 rows (``loop/fast >= 100``,
``fast/floor <= 10``, ``holes/rp <= 2``).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import statistics
import sys
import time
from typing import Callable, List, Optional, Tuple

import torch

from . import advantages as _advantages
from . import _native

GAMMA = 1.0
LAM = 0.95

FULL_GRID = [(8, 256), (64, 256), (8, 1024), (64, 1024), (8, 4096), (64, 4096), (8, 32768), (64, 32768)]
QUICK_GRID = [(8, 256), (64, 1024), (64, 4096)]


# ---------------------------------------------------------------------------
# the contenders
# ---------------------------------------------------------------------------


def loop_gae(rewards: torch.Tensor, values: torch.Tensor, gamma: float, lam: float):
    """GAE as TRL / verl write it: one Python iteration per token (the baseline)."""
    gen_len = rewards.shape[-1]
    lastgaelam = 0
    advantages_reversed = []
    for t in reversed(range(gen_len)):
        nextvalues = values[:, t + 1] if t < gen_len - 1 else 0.0
        delta = rewards[:, t] + gamma * nextvalues - values[:, t]
        lastgaelam = delta + gamma * lam * lastgaelam
        advantages_reversed.append(lastgaelam)
    advantages = torch.stack(advantages_reversed[::-1], dim=1)
    returns = advantages + values
    return advantages, returns


def fast_gae(rewards, values, mask, gamma, lam):
    """The public :func:`valuelab.gae`."""
    return _advantages.gae(rewards, values, mask=mask, gamma=gamma, lam=lam)


def torch_gae(rewards, values, mask, gamma, lam):
    """:func:`valuelab.gae` with the C kernel switched off: the PyTorch block scan."""
    with _native.disabled():
        return _advantages.gae(rewards, values, mask=mask, gamma=gamma, lam=lam)


# ---------------------------------------------------------------------------
# data and timing
# ---------------------------------------------------------------------------


def make_batch(B: int, T: int, dtype: torch.dtype, device: torch.device, holes: bool, seed: int = 0):
    """Rewards, values and a mask: right-padded rows of length in [T/2, T], optionally with holes.

    The holes imitate tool outputs inside a multi-turn rollout: three masked
    spans of up to T/16 tokens inside each row's valid part.
    """
    gen = torch.Generator().manual_seed(seed)
    rewards = torch.randn(B, T, generator=gen, dtype=torch.float64).to(dtype)
    values = torch.randn(B, T, generator=gen, dtype=torch.float64).to(dtype)
    lengths = torch.randint(max(T // 2, 1), T + 1, (B, 1), generator=gen)
    t = torch.arange(T)
    mask = t < lengths
    if holes and T >= 16:
        span = max(T // 16, 1)
        for _ in range(3):
            start = (torch.rand(B, 1, generator=gen) * (lengths - span).clamp(min=1)).long()
            mask &= ~((t >= start) & (t < start + span))
    return rewards.to(device), values.to(device), mask.to(device)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _minor_faults() -> int:
    try:
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    except (ImportError, AttributeError):  # pragma: no cover - not on POSIX
        return 0


def time_call(fn: Callable[[], object], device: torch.device, repeats: int, warmup: int = 1) -> Tuple[float, float, float]:
    """``(median, minimum, faults)``: wall time of ``fn()`` in seconds over ``repeats`` calls, and page faults per call.

    ``warmup`` calls are made first. The median is the figure the ratios use;
    the minimum is the robust one on a machine shared with other jobs, where
    a call can lose whole scheduler slices.
    """
    for _ in range(warmup):
        fn()
    _sync(device)
    times: List[float] = []
    f0 = _minor_faults()
    for _ in range(repeats):
        _sync(device)
        t0 = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - t0)
    faults = (_minor_faults() - f0) / max(repeats, 1)
    return statistics.median(times), min(times), faults


def keep_freed_memory() -> bool:
    """Tell glibc's malloc to keep freed memory instead of returning it to the OS (``mallopt``).

    PyTorch on the CPU has no caching allocator: a fresh tensor of more than
    ~128 KiB comes from ``mmap`` or from the top of the heap, and glibc gives
    freed memory back to the OS when enough of it piles up at the top
    (``M_TRIM_THRESHOLD``, adjusted on the fly); touching it again costs a page
    fault per 4 KiB (about 2 microseconds on the benchmark's VM, i.e. 0.5 ms
    per MB, ten times the arithmetic). ``valuelab.gae`` has no intermediate
    tensors on the C kernel's path and keeps them in reused scratch buffers
    on the PyTorch path (``valuelab._fastscan._scratch``), so only its two
    fresh outputs can fault, and whether they do depends on
    glibc's heuristics and on what else the process allocates (the ``faults``
    column shows it). Raising ``M_MMAP_THRESHOLD`` and ``M_TRIM_THRESHOLD``
    removes that cost, as jemalloc or tcmalloc would. Returns False where
    glibc's ``mallopt`` is not available.
    """
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
        m_trim_threshold, m_mmap_threshold = -1, -3
        return bool(libc.mallopt(m_trim_threshold, 1 << 30)) and bool(libc.mallopt(m_mmap_threshold, 1 << 25))
    except (OSError, AttributeError):
        return False


def _repeats_for(estimate_s: float, budget_s: float, lo: int = 1, hi: int = 25) -> int:
    """As many repeats as fit in ``budget_s`` given one call takes ``estimate_s``, within [lo, hi]."""
    return int(max(lo, min(hi, budget_s / max(estimate_s, 1e-7))))


# ---------------------------------------------------------------------------
# the grid
# ---------------------------------------------------------------------------

COLUMNS = [
    "device", "dtype", "B", "T", "mask", "loop_ms", "fast_ms", "floor_ms", "torch_ms",
    "loop/fast", "fast/floor", "torch/floor", "holes/rp", "fast_min_ms", "floor_min_ms", "faults",
]
CSV_COLUMNS = COLUMNS + ["loop_min_ms", "torch_min_ms"]


def time_interleaved(fns: dict, device: torch.device, repeats: int, warmup: int = 2) -> dict:
    """``{name: (median, minimum, faults per call)}`` for callables timed in turn, ``repeats`` rounds.

    One call of each per round, so a change of machine speed during the
    measurement (other jobs, frequency) hits all of them alike and their
    ratios stay fair.
    """
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    _sync(device)
    times = {k: [] for k in fns}
    faults = dict.fromkeys(fns, 0)
    for _ in range(repeats):
        for k, fn in fns.items():
            _sync(device)
            f0 = _minor_faults()
            t0 = time.perf_counter()
            fn()
            _sync(device)
            times[k].append(time.perf_counter() - t0)
            faults[k] += _minor_faults() - f0
    return {k: (statistics.median(v), min(v), faults[k] / repeats) for k, v in times.items()}


def run_grid(devices, grid, dtypes, loop_budget_s: float, fast_repeats: int, log=print) -> List[dict]:
    """Time the contenders on every (device, dtype, B, T, mask kind); one dict per row of the table."""
    rows: List[dict] = []
    for device in devices:
        for dtype in dtypes:
            for B, T in grid:
                # the loop does not look at the mask: time it once per (B, T, dtype), few repeats
                r, v, m = make_batch(B, T, dtype, device, holes=False)
                t0 = time.perf_counter()
                loop_gae(r, v, GAMMA, LAM)
                _sync(device)
                first = time.perf_counter() - t0
                loop_s, loop_min, _ = time_call(lambda: loop_gae(r, v, GAMMA, LAM), device,
                                                repeats=_repeats_for(first, loop_budget_s, lo=3, hi=9), warmup=0)
                rh, vh, mh = make_batch(B, T, dtype, device, holes=True)
                floor_buf = torch.empty_like(r)
                # the floor in a tight loop of its own: its threads and caches stay warm, its time is the
                # smallest (a conservative fast/floor)
                floor = time_call(lambda: torch.add(r, v, alpha=GAMMA, out=floor_buf), device,
                                  repeats=max(fast_repeats, 25), warmup=3)
                res = time_interleaved({
                    "right-padded": lambda: fast_gae(r, v, m, GAMMA, LAM),
                    "holes": lambda: fast_gae(rh, vh, mh, GAMMA, LAM),
                }, device, repeats=fast_repeats)
                # the PyTorch path in a group of its own: its scratch buffers would evict the fast path's data
                res.update(time_interleaved({
                    "torch right-padded": lambda: torch_gae(r, v, m, GAMMA, LAM),
                    "torch holes": lambda: torch_gae(rh, vh, mh, GAMMA, LAM),
                }, device, repeats=fast_repeats))
                floor_s, floor_min, _ = floor
                for kind in ("right-padded", "holes"):
                    fast_s, fast_min, faults = res[kind]
                    torch_s, torch_min, _ = res["torch " + kind]
                    rows.append({
                        "device": device.type, "dtype": str(dtype).replace("torch.", ""), "B": B, "T": T,
                        "mask": kind, "loop_ms": loop_s * 1e3, "fast_ms": fast_s * 1e3, "floor_ms": floor_s * 1e3,
                        "torch_ms": torch_s * 1e3, "loop/fast": loop_s / fast_s, "fast/floor": fast_s / floor_s,
                        "torch/floor": torch_s / floor_s,
                        "holes/rp": fast_s / res["right-padded"][0] if kind == "holes" else float("nan"),
                        "fast_min_ms": fast_min * 1e3, "floor_min_ms": floor_min * 1e3, "faults": faults,
                        "loop_min_ms": loop_min * 1e3, "torch_min_ms": torch_min * 1e3,
                    })
                    log(_fmt_row(rows[-1]))
    return rows


TARGET = ("cpu", "float32", 64, 4096)


def target_report(rows: List[dict]) -> List[str]:
    """The issue's targets on CPU, float32, B=64, T=4096: loop/fast >= 100, fast/floor <= 10, holes/rp <= 2."""
    def pick(kind):
        return [r for r in rows if (r["device"], r["dtype"], r["B"], r["T"]) == TARGET and r["mask"] == kind]

    rp, ho = pick("right-padded"), pick("holes")
    if not rp or not ho:
        return []
    r, h = rp[0], ho[0]

    def ok(flag: bool) -> str:
        return "met" if flag else "NOT met"

    return [
        "targets (cpu, float32, B=64, T=4096, right-padded; ratios of medians):",
        f"  loop/fast  = {r['loop/fast']:.0f}x  (valuelab.gae end to end; target >= 100x: {ok(r['loop/fast'] >= 100)})",
        f"  fast/floor = {r['fast/floor']:.1f}x  (target <= 10x: {ok(r['fast/floor'] <= 10)})",
        f"  holes/rp   = {h['holes/rp']:.2f}x  (masks with holes; target <= 2x: {ok(h['holes/rp'] <= 2)})",
        f"  for information: with holes loop/fast = {h['loop/fast']:.0f}x, fast/floor = {h['fast/floor']:.1f}x; "
        f"the PyTorch path (C kernel off) loop/torch = {r['loop_ms'] / r['torch_ms']:.0f}x, torch/floor = {r['torch/floor']:.1f}x",
    ]


def machine_description(threads: int, mallopt: bool) -> dict:
    """CPU model, core count, torch version and threads, for the JSON next to the CSV."""
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        load = os.getloadavg()
    except (OSError, AttributeError):
        load = None
    return {
        "cpu_model": model,
        "logical_cpus": os.cpu_count(),
        "torch": torch.__version__,
        "torch_threads": threads,
        "cpu_capability": getattr(torch.backends.cpu, "get_cpu_capability", lambda: "?")(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "mallopt": mallopt,
        "cpu_path": _native.status(),
        "loadavg_at_start": load,
        "gamma": GAMMA,
        "lam": LAM,
    }


def _fmt(v) -> str:
    if isinstance(v, float):
        if v != v:
            return "-"
        return f"{v:.3f}" if v < 10 else (f"{v:.1f}" if v < 1000 else f"{v:.0f}")
    return str(v)


_WIDTHS = [6, 8, 3, 6, 13, 9, 8, 8, 8, 9, 10, 10, 8, 11, 12, 7]


def _fmt_row(row: dict) -> str:
    return " ".join(_fmt(row[c]).rjust(w) for c, w in zip(COLUMNS, _WIDTHS))


def _header() -> str:
    return " ".join(c.rjust(w) for c, w in zip(COLUMNS, _WIDTHS))


def main(argv: Optional[List[str]] = None) -> List[dict]:
    ap = argparse.ArgumentParser(prog="python -m valuelab.bench", description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a small grid (a few seconds)")
    ap.add_argument("--device", choices=["cpu", "cuda", "all"], default="all",
                    help="cpu, cuda, or all (cpu, plus cuda when present; the default)")
    ap.add_argument("--out", default=None, help="write the table to this CSV file (and the machine to .json)")
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: leave torch's default)")
    ap.add_argument("--dtype", choices=["float32", "float64", "both"], default="both")
    ap.add_argument("--shapes", default=None,
                    help="comma-separated BxT list replacing the grid, e.g. 64x4096,8x32768")
    ap.add_argument("--repeats", type=int, default=0, help="rounds of the interleaved timing of the fast paths (default 61, quick 15)")
    ap.add_argument("--mallopt", action="store_true",
                    help="CPU, glibc only: keep freed memory in the process (no page faults on every "
                         "fresh MB-sized output); see keep_freed_memory")
    args = ap.parse_args(argv)
    mallopt = keep_freed_memory() if args.mallopt else False
    if args.mallopt:
        print("mallopt:", "applied" if mallopt else "not available on this platform")

    if args.threads > 0:
        torch.set_num_threads(args.threads)
    if args.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: no CUDA device available")
    devices = [torch.device("cpu")] if args.device in ("cpu", "all") else []
    if args.device == "cuda" or (args.device == "all" and torch.cuda.is_available()):
        devices.append(torch.device("cuda"))
    dtypes = {"float32": [torch.float32], "float64": [torch.float64],
              "both": [torch.float32, torch.float64]}[args.dtype]
    grid = QUICK_GRID if args.quick else FULL_GRID
    if args.shapes:
        try:
            grid = [tuple(int(n) for n in item.lower().split("x")) for item in args.shapes.split(",")]
            assert all(len(bt) == 2 and bt[0] > 0 and bt[1] > 0 for bt in grid)
        except (ValueError, AssertionError):
            ap.error(f"--shapes: expected a list like 64x4096,8x32768, got {args.shapes!r}")
    machine = machine_description(torch.get_num_threads(), bool(mallopt))

    print(f"{machine['cpu_model']}, {machine['logical_cpus']} logical CPUs, torch {torch.__version__}, "
          f"{torch.get_num_threads()} CPU threads, gamma={GAMMA}, lam={LAM}; fast = valuelab.gae "
          f"(CPU: {machine['cpu_path']}); torch = valuelab.gae with the C kernel off; "
          "times in ms (median of the repeats; *_min: minimum); ratios of medians")
    print(_header(), flush=True)
    t0 = time.perf_counter()
    repeats = args.repeats or (15 if args.quick else 61)
    rows = run_grid(devices, grid, dtypes, loop_budget_s=0.4 if args.quick else 3.0, fast_repeats=repeats,
                    log=lambda line: print(line, flush=True))
    print(f"total {time.perf_counter() - t0:.0f} s", flush=True)
    for line in target_report(rows):
        print(line)
    if args.out:
        with open(args.out, "w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=CSV_COLUMNS)
            w.writeheader()
            for row in rows:
                w.writerow({k: (round(v, 6) if isinstance(v, float) else v) for k, v in row.items()})
        try:
            machine["loadavg_at_end"] = os.getloadavg()
        except (OSError, AttributeError):
            pass
        machine["command"] = "python -m valuelab.bench " + " ".join(argv if argv is not None else sys.argv[1:])
        machine["targets"] = target_report(rows)
        meta = os.path.splitext(args.out)[0] + ".json"
        with open(meta, "w") as fh:
            json.dump(machine, fh, indent=1)
        print(f"wrote {args.out} and {meta}")
    return rows


if __name__ == "__main__":  # pragma: no cover
    main(sys.argv[1:])
