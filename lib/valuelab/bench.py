"""Benchmark of the backward scan: the per-token loop, valuelab's fast path, and an elementwise floor.

Run ``python -m valuelab.bench`` (full grid, about 1-3 minutes on 2 CPU cores)
or ``python -m valuelab.bench --quick``; ``--device cuda`` on a GPU (the default
is CPU, plus CUDA when present), ``--out results.csv`` to keep the numbers,
``--threads 2`` to pin the CPU thread count, ``--stat min`` on a machine shared
with other jobs, ``--mallopt`` to take glibc's page faults out of the CPU
timings (see :func:`keep_freed_memory`). The timings are discussed in ``chapters/08_fast_gae``.

For every device, dtype, batch ``B``, length ``T`` and mask kind (right-padded
or with holes), measured in the same run (median of several repeats, with
``torch.cuda.synchronize`` around each call on a GPU):

``loop``
    GAE as production RLHF frameworks write it (TRL / verl style): a Python
    loop over the tokens, ``delta = r[:, t] + gamma * v[:, t+1] - v[:, t]``,
    ``lastgaelam = delta + gamma * lam * lastgaelam``, then ``torch.stack``
    and ``returns = advantages + values``. It ignores the mask (so its time
    does not depend on it: it is timed once per (B, T, dtype)).
``fast``
    :func:`valuelab.gae` end to end (argument checks, hole compaction, TD
    errors, the scan, scatter back), through the fast scan. Until the fast
    scan is wired into :mod:`valuelab.advantages` the benchmark times
    :func:`_gae_wired`, the same composition with the wiring applied.
``scan``
    :func:`valuelab._fastscan.fast_backward_scan` alone on the ``(B, T)`` TD
    errors with a constant decay: the part this benchmark is about.
``floor``
    One elementwise pass over the same tensors, ``torch.add(rewards, values,
    alpha=gamma, out=buf)``: nothing that reads the inputs and writes an
    output can be faster.

and the ratios ``loop/fast``, ``loop/scan``, ``fast/floor``, ``scan/floor``
and, for masks with holes, ``holes/rp`` (fast time with holes over fast time
right-padded). At the end, the issue's targets are checked on the CPU,
float32, B=64, T=4096 rows when the grid has them.
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
import time
from typing import Callable, List, Optional

import torch

from . import advantages as _advantages
from ._fastscan import fast_backward_scan, pack_fast, time_invariant_decay

GAMMA = 1.0
LAM = 0.95

FULL_GRID = [(8, 256), (64, 256), (8, 1024), (64, 1024), (8, 4096), (64, 4096), (8, 32768), (64, 32768)]
QUICK_GRID = [(8, 256), (64, 1024), (64, 4096)]


# ---------------------------------------------------------------------------
# the three contenders
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


def _wired() -> bool:
    """True once :mod:`valuelab.advantages` calls the fast scan (the wiring of issue 5 is applied)."""
    return hasattr(_advantages, "fast_backward_scan")


def _gae_wired(rewards, values, *, mask=None, gamma=1.0, lam=0.95, bootstrap=None):
    """:func:`valuelab.gae` with the wiring of issue 5 applied (pack_fast, constant decay, fast scan).

    A line-for-line copy of ``valuelab.gae`` and ``valuelab._scan.prepare``;
    used by the benchmark only while the library still calls the loop.
    """
    from ._checks import check_bootstrap, check_like, check_mask, check_sequence_tensor, check_unit_interval
    from ._scan import Prepared, as_batch, shift_next

    rewards = check_sequence_tensor(rewards, "rewards")
    values = check_like(values, "values", rewards, "rewards")
    m = check_mask(mask, rewards)
    g = check_unit_interval(gamma, "gamma", rewards)
    b = check_bootstrap(bootstrap, rewards)
    squeeze = rewards.dim() == 1
    r2, m2, g2 = as_batch(rewards), as_batch(m), as_batch(g)
    b2 = b.reshape(r2.shape[0])
    packed = pack_fast(m2)
    p = Prepared(packed.take(r2), packed.take(as_batch(values)), packed.take(g2), b2, packed, squeeze)

    lam_t = p.packed.take(as_batch(check_unit_interval(lam, "lam", rewards)))
    valid = p.packed.valid
    zero = torch.zeros((), dtype=p.rewards.dtype, device=p.rewards.device)
    v_next = shift_next(p.values, valid, p.bootstrap)
    delta = torch.where(valid, p.rewards + p.gamma * v_next - p.values, zero)
    c = time_invariant_decay(delta, gamma, lam)
    adv = fast_backward_scan(delta, torch.where(valid, p.gamma * lam_t, zero) if c is None else c)
    return _advantages.GAEResult(p.out(adv), p.out(adv + p.values))


def fast_gae(rewards, values, mask, gamma, lam):
    """The public :func:`valuelab.gae` once wired, else :func:`_gae_wired`."""
    if _wired():
        return _advantages.gae(rewards, values, mask=mask, gamma=gamma, lam=lam)
    return _gae_wired(rewards, values, mask=mask, gamma=gamma, lam=lam)


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


STAT = "median"


def time_call(fn: Callable[[], object], device: torch.device, repeats: int, warmup: int = 1) -> float:
    """Median (or, with ``--stat min``, minimum) wall time of ``fn()`` in seconds over ``repeats`` calls.

    ``warmup`` calls are made first. The minimum is the robust choice on a
    machine shared with other jobs, where a call can lose whole scheduler
    slices; the median is the default.
    """
    for _ in range(warmup):
        fn()
    _sync(device)
    times: List[float] = []
    for _ in range(repeats):
        _sync(device)
        t0 = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - t0)
    return min(times) if STAT == "min" else statistics.median(times)


def keep_freed_memory() -> bool:
    """Tell glibc's malloc to keep freed memory instead of returning it to the OS (``mallopt``).

    PyTorch on the CPU has no caching allocator: every fresh tensor of more
    than ~128 KiB is a new ``mmap`` whose pages fault on first touch, and
    freeing it gives them back. A composition of many elementwise ops on MB-
    sized tensors (``valuelab.gae`` end to end) then spends most of its time
    in page faults, a property of the allocator, not of the algorithm (the
    loop, whose tensors are tiny, and the floor, which writes into ``out=``,
    do not pay it). Raising ``M_MMAP_THRESHOLD`` and ``M_TRIM_THRESHOLD``
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
    "device", "dtype", "B", "T", "mask", "loop_ms", "fast_ms", "scan_ms", "floor_ms",
    "loop/fast", "loop/scan", "fast/floor", "scan/floor", "holes/rp",
]


def run_grid(devices, grid, dtypes, loop_budget_s: float, fast_repeats: int) -> List[dict]:
    rows: List[dict] = []
    for device in devices:
        for dtype in dtypes:
            for B, T in grid:
                # the loop does not look at the mask: time it once per (B, T, dtype), few repeats
                r, v, _ = make_batch(B, T, dtype, device, holes=False)
                t0 = time.perf_counter()
                loop_gae(r, v, GAMMA, LAM)
                _sync(device)
                first = time.perf_counter() - t0
                loop_s = time_call(lambda: loop_gae(r, v, GAMMA, LAM), device,
                                   repeats=_repeats_for(first, loop_budget_s, lo=1, hi=7), warmup=0)
                floor_buf = torch.empty_like(r)
                floor_s = time_call(lambda: torch.add(r, v, alpha=GAMMA, out=floor_buf), device,
                                    repeats=max(fast_repeats, 25), warmup=3)
                fast_rp: Optional[float] = None
                for kind in ("right-padded", "holes"):
                    r, v, m = make_batch(B, T, dtype, device, holes=(kind == "holes"))
                    fast_s = time_call(lambda: fast_gae(r, v, m, GAMMA, LAM), device, repeats=fast_repeats, warmup=2)
                    delta = (r - v) * m  # TD-error-like input, zero on masked slots
                    scan_s = time_call(lambda: fast_backward_scan(delta, GAMMA * LAM), device,
                                       repeats=fast_repeats, warmup=2)
                    if kind == "right-padded":
                        fast_rp = fast_s
                    rows.append({
                        "device": device.type, "dtype": str(dtype).replace("torch.", ""), "B": B, "T": T,
                        "mask": kind, "loop_ms": loop_s * 1e3, "fast_ms": fast_s * 1e3, "scan_ms": scan_s * 1e3,
                        "floor_ms": floor_s * 1e3, "loop/fast": loop_s / fast_s, "loop/scan": loop_s / scan_s,
                        "fast/floor": fast_s / floor_s,
                        "scan/floor": scan_s / floor_s,
                        "holes/rp": (fast_s / fast_rp) if kind == "holes" and fast_rp else float("nan"),
                    })
                    print(_fmt_row(rows[-1]), flush=True)
    return rows


def target_report(rows: List[dict]) -> List[str]:
    """The issue's targets on CPU, float32, B=64, T=4096: loop >= 100x fast, fast <= 10x floor, holes <= 2x."""
    rp = [r for r in rows if (r["device"], r["dtype"], r["B"], r["T"], r["mask"]) == ("cpu", "float32", 64, 4096, "right-padded")]
    ho = [r for r in rows if (r["device"], r["dtype"], r["B"], r["T"], r["mask"]) == ("cpu", "float32", 64, 4096, "holes")]
    if not rp or not ho:
        return []
    r, h = rp[0], ho[0]

    def ok(flag: bool) -> str:
        return "met" if flag else "NOT met"

    return [
        "targets (cpu, float32, B=64, T=4096):",
        f"  loop/fast  = {r['loop/fast']:.0f}x  (gae end to end; >= 100x: {ok(r['loop/fast'] >= 100)})",
        f"  loop/scan  = {r['loop/scan']:.0f}x  (the scan alone; >= 100x: {ok(r['loop/scan'] >= 100)})",
        f"  fast/floor = {r['fast/floor']:.1f}x  (<= 10x: {ok(r['fast/floor'] <= 10)})",
        f"  scan/floor = {r['scan/floor']:.1f}x  (<= 10x: {ok(r['scan/floor'] <= 10)})",
        f"  holes/rp   = {h['holes/rp']:.2f}x  (<= 2x: {ok(h['holes/rp'] <= 2)})",
    ]


def _fmt(v) -> str:
    if isinstance(v, float):
        if v != v:
            return "-"
        return f"{v:.3f}" if v < 10 else (f"{v:.1f}" if v < 1000 else f"{v:.0f}")
    return str(v)


_WIDTHS = [6, 8, 3, 6, 13, 9, 8, 8, 9, 9, 9, 10, 10, 8]


def _fmt_row(row: dict) -> str:
    return " ".join(_fmt(row[c]).rjust(w) for c, w in zip(COLUMNS, _WIDTHS))


def _header() -> str:
    return " ".join(c.rjust(w) for c, w in zip(COLUMNS, _WIDTHS))


def main(argv: Optional[List[str]] = None) -> List[dict]:
    ap = argparse.ArgumentParser(prog="python -m valuelab.bench", description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a small grid (a few seconds)")
    ap.add_argument("--device", choices=["cpu", "cuda", "all"], default="all",
                    help="cpu, cuda, or all (cpu, plus cuda when present; the default)")
    ap.add_argument("--out", default=None, help="write the table to this CSV file")
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: leave torch's default)")
    ap.add_argument("--dtype", choices=["float32", "float64", "both"], default="both")
    ap.add_argument("--stat", choices=["median", "min"], default="median",
                    help="how repeats are summarised (min is robust on a shared, noisy machine)")
    ap.add_argument("--shapes", default=None,
                    help="comma-separated BxT list replacing the grid, e.g. 64x4096,8x32768")
    ap.add_argument("--mallopt", action="store_true",
                    help="CPU, glibc only: keep freed memory in the process (no page faults on every "
                         "fresh MB-sized temporary); see keep_freed_memory")
    args = ap.parse_args(argv)
    if args.mallopt:
        print("mallopt:", "applied" if keep_freed_memory() else "not available on this platform")

    global STAT
    STAT = args.stat
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

    print(f"torch {torch.__version__}, {torch.get_num_threads()} CPU threads, gamma={GAMMA}, lam={LAM}; "
          f"fast = {'valuelab.gae' if _wired() else 'valuelab.bench._gae_wired (fast scan not wired yet)'}; "
          f"times are {STAT}s in ms")
    print(_header(), flush=True)
    t0 = time.perf_counter()
    rows = run_grid(devices, grid, dtypes, loop_budget_s=0.4 if args.quick else 1.5, fast_repeats=15 if args.quick else 31)
    print(f"total {time.perf_counter() - t0:.0f} s", flush=True)
    for line in target_report(rows):
        print(line)
    if args.out:
        with open(args.out, "w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=COLUMNS)
            w.writeheader()
            w.writerows(rows)
        print(f"wrote {args.out}")
    return rows


if __name__ == "__main__":  # pragma: no cover
    main(sys.argv[1:])
