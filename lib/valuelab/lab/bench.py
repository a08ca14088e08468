"""Benchmark of GAE: per-token loops, ``valuelab.gae`` end to end, what a user would pick instead, and an elementwise floor.

Run ``python -m valuelab.bench --threads 2`` (full grid, a few minutes on 2
CPU cores) or ``--quick``; ``--device cuda`` on a GPU (the default is CPU, plus
CUDA when present), ``--out results.csv`` to keep the numbers (a
``results.json`` next to it describes the machine, the git commit, the
threads and the contenders' versions), ``--shapes 64x4096`` for
one shape, ``--mallopt`` to switch glibc's malloc to keep freed memory (see
:func:`keep_freed_memory`). The timings are discussed in :doc:`/chapters/09_fast_gae`;
the stored full run is ``valuelab/lab/data/bench_cpu.csv`` (package data: :func:`stored_run`).

For every device, dtype, batch ``B``, length ``T`` and mask kind
(right-padded or with holes), measured in the same run, with
``torch.cuda.synchronize`` around each call on a GPU. Contenders that belong
together are timed in turn, one call each per round
(:func:`time_interleaved`), so that their ratios are fair on a machine whose
speed drifts, in this order: the two libraries; the two loops; the fast
paths of one shape (right-padded and holes) side by side with the floor; the
same two on the PyTorch path. The slow groups get fewer rounds on big shapes
(as many as fit in a time budget, at least 3). Median and minimum are kept;
on a shared machine the ratio of minima (``fast_min_ms / floor_min_ms``) is
the steadier figure. Before timing, every mask-aware contender's output is
checked against ``valuelab.gae`` on the right-padded rows
(:func:`check_agrees`); a contender that computes something else stops the
run (:class:`ContenderMismatch`). The loops and the libraries run in a
spawned process of their own (:func:`contender_process`), one shape at a
time while this one waits, so that ``valuelab.gae`` is timed in a process
whose allocation history is its own: glibc's malloc thresholds, hence the
page faults of its outputs (the ``faults`` column), depend on that history,
sensitively on big shapes (``--mallopt`` fixes them).

``loop``
    GAE as production RLHF frameworks wrote it (TRL / verl style): a Python
    loop over the tokens, ``delta = r[:, t] + gamma * v[:, t+1] - v[:, t]``,
    ``lastgaelam = delta + gamma * lam * lastgaelam``, then ``torch.stack``
    and ``returns = advantages + values``. It ignores the mask (so its time
    does not depend on it: it is timed once per (B, T, dtype)).
``verl``
    The mask-aware loop verl has used since its PR 2337 (:func:`verl_gae`):
    the same loop, where a masked token carries the next value and the
    running advantage unchanged, so holes are skipped. Equal to
    ``valuelab.gae`` on valid tokens, holes included; its cost does not
    depend on the mask either (timed once per (B, T, dtype), on the
    right-padded batch).
``lfilter``
    SciPy's ``lfilter`` on each row's valid prefix, the ``discount_cumsum``
    idiom of OpenAI Spinning Up (:func:`lfilter_gae`), conversions between
    torch and numpy included. Right-padded rows only.
``torchrl``
    TorchRL's ``vec_generalized_advantage_estimate`` (:func:`torchrl_gae`),
    with ``done`` at each row's last valid token. Right-padded rows only;
    ``n/a`` when torchrl cannot be imported (a note is printed).
``fast``
    :func:`valuelab.gae` end to end, the public function: argument checks,
    the scan, the outputs (on a CPU with a C compiler, one pass of the C
    kernel; elsewhere the same as ``torch``).
``torch``
    :func:`valuelab.gae` end to end with the C kernel switched off
    (:func:`valuelab._engine.native.disabled`): the PyTorch block scan, the path a
    GPU takes and the one a CPU takes without a C compiler.
``floor``
    One elementwise pass over the same tensors, ``torch.add(rewards, values,
    alpha=gamma, out=buf)`` into a buffer allocated once: nothing that reads
    the inputs and writes an output can be faster (``valuelab.gae`` reads
    three tensors and writes two, and allocates them). ``bytes`` is the
    byte-count bound on ``fast/floor`` (:func:`byte_bound`): what GAE moves
    over what the floor moves.

Ratios (of medians): ``loop/fast``, ``verl/fast``, ``lfilter/fast``,
``torchrl/fast``, ``fast/floor``, ``torch/floor`` and, for masks with holes,
``holes/rp`` (fast with holes over fast right-padded, same shape);
``lfilter`` and ``torchrl`` are ``-`` on rows with holes. ``faults`` is the
number of minor page faults per ``fast`` call: on a CPU, PyTorch allocates
every output with ``malloc``, and a buffer glibc has handed back to the OS
costs about 2 microseconds per 4 KiB page when touched again (see
:func:`keep_freed_memory`). ``kernel_threads`` (CSV) is the number of
threads the C kernel uses for the shape (0 where it does not run). At the
end the targets are checked on the CPU, float32, B=64, T=4096 rows (see
:data:`TARGETS`: ``loop/fast >= 500``, ``lfilter/fast >= 5``,
``torchrl/fast >= 50``, ``fast_min/floor_min <= 3``, ``holes/rp <= 2``), and the
large-batch target on the shapes of :data:`LARGE_SHAPES` present in the grid
(:func:`large_report`: ratio of minima ``<= 2``, median over ``--runs``).

When the grid has that shape, one more line (:func:`torchrl_dropin`, run in
the contenders' process): TorchRL's ``vec_generalized_advantage_estimate``
against valuelab's drop-in of the same name
(:func:`valuelab.integrations.torchrl.vec_generalized_advantage_estimate`)
on TorchRL's own layout, ``(64, 4096, 1)`` float32 with several
trajectories per row (``done`` at about 1 step in 200, half of them
``terminated``), checked against each other first, then timed interleaved;
it prints both times (minimum and median) and ``torchrl/dropin``, which
must be at least 1 (:data:`DROPIN_TARGET`).
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import functools
import json
import math
import multiprocessing
import os
import platform
import statistics
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Callable, Dict, Iterator, List, NamedTuple, Optional, Tuple

import numpy as np
import torch

from .. import advantages as _advantages
from .._engine import native as _native

GAMMA = 1.0
LAM = 0.95

FULL_GRID = [(8, 256), (64, 256), (8, 1024), (64, 1024), (8, 4096), (64, 4096), (8, 32768), (64, 32768)]
QUICK_GRID = [(8, 256), (64, 1024), (64, 4096)]

Pair = Tuple[torch.Tensor, torch.Tensor]
"""``(advantages, returns)``, each ``(B, T)``: what every contender returns."""


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


def verl_gae(rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float, lam: float) -> Pair:
    """The mask-aware per-token loop of verl's ``compute_gae_advantage_return`` since its PR 2337 (holes carried).

    A transcription of the computation, not of the code: walking backwards
    over the tokens, ``delta = r_t + gamma * next - v_t`` and
    ``a = delta + gamma * lam * running``; where ``mask`` is 1 the token
    updates ``next = v_t`` and ``running = a``, where it is 0 both are kept
    (verl writes the blend ``x * m + (1 - m) * kept``), so a hole (a tool
    output inside a rollout) is skipped and the padding after a row's last
    token leaves it bootstrapped with 0. The mask is cast to the values'
    dtype once and ``1 - m`` is formed once per step (verl forms it twice, on
    an integer mask): a slightly cheaper loop than verl's. verl whitens the
    advantages afterwards; that step is left out here, as it is from
    ``valuelab.gae``. Masked tokens keep the carried values (verl masks them
    downstream); on valid tokens the outputs equal ``valuelab.gae``'s.
    """
    keep = mask.to(values.dtype)
    next_value = 0.0
    running = 0.0
    reversed_advantages = []
    for t in range(rewards.shape[-1] - 1, -1, -1):
        m_t = keep[:, t]
        skip_t = 1 - m_t
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        fresh = delta + gamma * lam * running
        next_value = values[:, t] * m_t + skip_t * next_value
        running = fresh * m_t + skip_t * running
        reversed_advantages.append(running)
    advantages = torch.stack(reversed_advantages[::-1], dim=1)
    return advantages, advantages + values


@functools.lru_cache(maxsize=None)
def _load_lfilter() -> Optional[Callable]:
    """``scipy.signal.lfilter``, or None when SciPy is not installed."""
    try:
        from scipy.signal import lfilter
    except ImportError:
        return None
    return lfilter


@functools.lru_cache(maxsize=None)
def _load_torchrl() -> Optional[Callable]:
    """TorchRL's ``vec_generalized_advantage_estimate``, or None when torchrl cannot be imported."""
    try:
        from torchrl.objectives.value.functional import vec_generalized_advantage_estimate
    except Exception:  # ImportError, or a torchrl built for another torch failing at import
        return None
    return vec_generalized_advantage_estimate


def lfilter_gae(rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float, lam: float) -> Pair:
    """GAE by SciPy's ``lfilter`` row by row: the ``discount_cumsum`` idiom of OpenAI Spinning Up (``ppo/core.py``).

    Spinning Up computes the discounted cumulative sum
    ``y_t = x_t + c * y_{t+1}`` of one trajectory as the IIR filter with
    numerator ``[1]`` and denominator ``[1, -c]`` run over the reversed
    sequence, reversed back; here ``x`` is the TD error ``delta_t = r_t +
    gamma * v_{t+1} - v_t`` (``v`` after the last valid token being 0) and
    ``c = gamma * lam``, then ``returns = advantages + values``. A batch of
    right-padded rows is handled as a user would: one filter per row, on its
    valid prefix (its length is ``mask.sum(1)``; a mask with holes is not
    handled). The cost includes what a torch user pays: the numpy views (a
    copy to the host for CUDA tensors), the lengths as Python ints, the
    outputs as torch tensors on the inputs' device; masked tokens get 0.
    """
    lfilter = _load_lfilter()
    if lfilter is None:
        raise ImportError("lfilter_gae needs scipy")
    device = rewards.device
    r = rewards.detach().cpu().numpy()
    v = values.detach().cpu().numpy()
    lengths = mask.sum(dim=1).tolist()
    advantages = np.zeros_like(r)
    returns = np.zeros_like(r)
    denominator = [1.0, -gamma * lam]
    for row, n in enumerate(lengths):
        if n == 0:
            continue
        r_row, v_row = r[row, :n], v[row, :n]
        delta = r_row - v_row
        delta[:-1] += gamma * v_row[1:]
        adv_row = lfilter([1.0], denominator, delta[::-1])[::-1]
        advantages[row, :n] = adv_row
        returns[row, :n] = adv_row + v_row
    return torch.from_numpy(advantages).to(device), torch.from_numpy(returns).to(device)


def torchrl_gae(rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float, lam: float) -> Pair:
    """GAE by TorchRL's ``vec_generalized_advantage_estimate`` (``torchrl.objectives.value.functional``).

    On right-padded rows only.

    TorchRL wants ``(B, T, 1)`` tensors with time on dimension -2, the value
    of the next state at each step, and ``done`` / ``terminated`` flags: here
    the next values are the values shifted left by one token, and both
    flags are True at each row's last valid token (the episode ends there,
    so TorchRL bootstraps nothing after it, as ``valuelab.gae`` does without
    ``bootstrap``). TorchRL then cuts each row into trajectories at the
    flags and runs the discounted sum as a convolution with the geometric
    kernel ``(gamma * lam) ** l``, truncated where it falls below 1e-7
    (:func:`tolerance` accounts for that). The padding after the last valid
    token forms a trajectory of its own; its outputs are set to 0 as
    ``valuelab.gae`` sets them. Building the inputs and that masking are
    part of the cost.
    """
    vec_gae = _load_torchrl()
    if vec_gae is None:
        raise ImportError("torchrl_gae needs torchrl")
    T = rewards.shape[-1]
    lengths = mask.sum(dim=1, keepdim=True)
    last = torch.arange(T, device=rewards.device) == lengths - 1
    next_values = torch.zeros_like(values)
    next_values[:, :-1] = values[:, 1:]
    done = last.unsqueeze(-1)
    adv, ret = vec_gae(gamma, lam, values.unsqueeze(-1), next_values.unsqueeze(-1), rewards.unsqueeze(-1),
                       done, done, time_dim=-2)
    zero = torch.zeros((), dtype=rewards.dtype, device=rewards.device)
    return torch.where(mask, adv.squeeze(-1), zero), torch.where(mask, ret.squeeze(-1), zero)


def fast_gae(rewards, values, mask, gamma, lam):
    """The public :func:`valuelab.gae`."""
    return _advantages.gae(rewards, values, mask=mask, gamma=gamma, lam=lam)


def torch_gae(rewards, values, mask, gamma, lam):
    """:func:`valuelab.gae` with the C kernel switched off: the PyTorch block scan."""
    with _native.disabled():
        return _advantages.gae(rewards, values, mask=mask, gamma=gamma, lam=lam)



def stored_run(name: str = "bench_cpu") -> Tuple[dict, List[dict]]:
    """The stored benchmark run ``name`` that chapter 9 reads: ``(machine, rows)``.

    ``machine`` is the run's JSON (commit, threads, versions, command) and
    ``rows`` its CSV as dicts of strings, read from the installed package
    (``valuelab/lab/data/<name>.json`` and ``.csv``), so the chapter needs no file
    beside the notebook (e.g. on Colab). Refresh them with
    ``python -m valuelab.bench --threads 2 --out lib/valuelab/lab/data/bench_cpu.csv``.
    """
    csv_file, json_file = _stored_file(name, ".csv"), _stored_file(name, ".json")
    if not csv_file.is_file():
        raise ValueError(f"name: no stored run {name!r} in valuelab/lab/data")
    machine = json.loads(json_file.read_text(encoding="utf-8")) if json_file.is_file() else {}
    rows = list(csv.DictReader(csv_file.read_text(encoding="utf-8").splitlines()))
    return machine, rows


def stored_breakdown(name: str = "bench_cpu_breakdown") -> dict:
    """The stored ``--breakdown`` run ``name`` that chapter 9 reads: ``{"machine": ..., "breakdown": [...]}``.

    Read from the installed package (``valuelab/lab/data/<name>.json``). Refresh
    it with ``python -m valuelab.bench --breakdown --threads 2 --shapes
    64x4096,512x4096,16x32768 --out lib/valuelab/lab/data/bench_cpu_breakdown.json``.
    """
    json_file = _stored_file(name, ".json")
    if not json_file.is_file():
        raise ValueError(f"name: no stored breakdown {name!r} in valuelab/lab/data")
    return json.loads(json_file.read_text(encoding="utf-8"))


def _stored_file(name: str, suffix: str):
    """``valuelab/lab/data/<name><suffix>`` in the installed package; ``name`` must be a plain name."""
    from importlib import resources

    if not isinstance(name, str) or not name.replace("_", "").isalnum():
        raise ValueError(f"name must be the plain name of a stored run (e.g. 'bench_cpu'), got {name!r}")
    return resources.files("valuelab.lab") / "data" / f"{name}{suffix}"

def missing_contenders() -> Dict[str, str]:
    """``{contender: why it is not timed}`` for the optional ones (lfilter needs scipy, torchrl torchrl)."""
    missing = {}
    if _load_lfilter() is None:
        missing["lfilter"] = "scipy is not installed"
    if _load_torchrl() is None:
        missing["torchrl"] = "torchrl cannot be imported"
    return missing


# ---------------------------------------------------------------------------
# checking that a contender computes the same thing
# ---------------------------------------------------------------------------

TORCHRL_THRESHOLD = 1e-7
"""TorchRL drops the terms of its geometric kernel below this (``_fast_vec_gae``'s ``thr``)."""


class ContenderMismatch(AssertionError):
    """A contender's advantages or returns differ from ``valuelab.gae``'s by more than float rounding."""


class Agreement(NamedTuple):
    """How far a contender's outputs are from ``valuelab.gae``'s on valid tokens, and the bound they must meet."""

    contender: str
    max_err: float
    tol: float


def tolerance(rewards: torch.Tensor, values: torch.Tensor, gamma: float, lam: float, truncation: float = 0.0) -> float:
    """A bound on the difference of two correct GAE computations of the same batch.

    Every TD error is at most ``d = max|r| + (1 + gamma) max|v|`` in size, and
    an advantage sums them with weights ``c**l`` (``c = gamma * lam``), i.e. over
    ``n = min(T, 1 / (1 - c))`` effective terms; rounding costs a few ulps per
    term: ``64 * eps * d * n``. ``truncation`` is the threshold below which a
    contender drops terms of the geometric series (TorchRL): the dropped tail
    is at most ``truncation / (c * (1 - c)) * d`` and is added. A contender that
    computes anything else (another bootstrap, a shifted value) is off by
    about ``d``, far above.
    """
    T = rewards.shape[-1]
    c = gamma * lam
    d = float(rewards.abs().max()) + (1 + gamma) * float(values.abs().max()) if rewards.numel() else 0.0
    n = T if c >= 1 else min(T, 1 / (1 - c))
    tail = truncation / (c * (1 - c)) * d if 0 < c < 1 and truncation > 0 else 0.0
    return 64 * torch.finfo(rewards.dtype).eps * d * n + tail


def check_agrees(name: str, got: Pair, want: Pair, mask: torch.Tensor, tol: float) -> Agreement:
    """The largest difference of ``got`` from ``want`` (advantages and returns) on the tokens where ``mask`` is True.

    Raises :class:`ContenderMismatch` above ``tol`` (or on NaN): a benchmark
    that times another computation says nothing.
    """
    err = 0.0
    for g, w in zip(got, want):
        diff = (g.to(w.dtype) - w)[mask]
        if diff.numel():
            err = max(err, float(diff.abs().max()))
    if not err <= tol:
        raise ContenderMismatch(f"{name}: differs from valuelab.gae by {err:.3g} on valid tokens (tolerance {tol:.3g})")
    return Agreement(name, err, tol)


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


def keep_freed_memory() -> bool:
    """Tell glibc's malloc to keep freed memory instead of returning it to the OS (``mallopt``).

    PyTorch on the CPU has no caching allocator: a fresh tensor of more than
    ~128 KiB comes from ``mmap`` or from the top of the heap, and glibc gives
    freed memory back to the OS when enough of it piles up at the top
    (``M_TRIM_THRESHOLD``, adjusted on the fly); touching it again costs a page
    fault per 4 KiB (about 2 microseconds on the benchmark's VM, i.e. 0.5 ms
    per MB, ten times the arithmetic). ``valuelab.gae`` has no intermediate
    tensors on the C kernel's path and keeps them in reused scratch buffers
    on the PyTorch path (``valuelab._engine.workspace.scratch``), so only its two
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
    "loop/fast", "fast/floor", "bytes", "torch/floor", "holes/rp", "fast_min_ms", "floor_min_ms", "faults",
    "verl_ms", "lfilter_ms", "torchrl_ms", "verl/fast", "lfilter/fast", "torchrl/fast",
]
CSV_COLUMNS = COLUMNS + ["loop_min_ms", "torch_min_ms", "verl_min_ms", "lfilter_min_ms", "torchrl_min_ms",
                         "kernel_threads", "fast_min/floor_min", "run"]
NAN = float("nan")
NO_TIME = (NAN, NAN, NAN)


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


def _first_call(fn: Callable[[], Pair], device: torch.device) -> Tuple[Pair, float]:
    """``(output, seconds)`` of one call: the output for the check, the time to size the repeats."""
    t0 = time.perf_counter()
    out = fn()
    _sync(device)
    return out, time.perf_counter() - t0


def kernel_threads(B: int, T: int, dtype: torch.dtype, device: torch.device) -> int:
    """Threads the C kernel runs ``valuelab.gae`` on for this shape.

    0 where it does not run: GPU, no C compiler, another dtype.
    """
    if device.type != "cpu" or dtype not in (torch.float32, torch.float64) or not _native.available():
        return 0
    return _native.threads_for(B * T)


def _time_checked(fns: Dict[str, Callable[[], Pair]], device: torch.device, budget_s: float, hi: int,
                  check: Callable[[str, Pair], None]) -> dict:
    """Time slow contenders interleaved after checking them: as many rounds as fit in ``budget_s``, 3 to ``hi``.

    Each one's first call gives its output to ``check`` and its time to the
    budget (and serves as warm-up).
    """
    first = {}
    for name, fn in fns.items():
        out, first[name] = _first_call(fn, device)
        check(name, out)
    if not fns:
        return {}
    return time_interleaved(fns, device, warmup=0, repeats=_repeats_for(sum(first.values()), budget_s, lo=3, hi=hi))


def slow_contenders(B: int, T: int, dtype: str, device: str, budget_s: float, lib_repeats: int) -> Tuple[dict, List[dict]]:
    """``(timings, checks)`` of the slow contenders on :func:`make_batch`'s right-padded batch (seed 0) of one shape.

    Every mask-aware contender is first checked against ``valuelab.gae``
    (the mask-blind loop is not: it computes something else on padded rows,
    by design); ``checks`` has one dict per check. Then the two libraries are
    timed interleaved (3 to ``lib_repeats`` rounds), then the two loops (3 to
    9), each group in about ``budget_s``. ``timings`` maps each contender to
    ``(median, minimum, faults)``; a missing library gets :data:`NO_TIME`.
    :func:`run_grid` runs this in the process of :func:`contender_process`:
    the contenders' temporaries (gigabytes for TorchRL at B=64, T=32768 in
    float64) would otherwise become part of the allocation history of the
    process that times ``valuelab.gae``, on which glibc's malloc thresholds,
    hence its page faults, depend (see :func:`keep_freed_memory`).
    """
    dev = torch.device(device)
    r, v, m = make_batch(B, T, getattr(torch, dtype), dev, holes=False)
    want = fast_gae(r, v, m, GAMMA, LAM)
    shape = {"device": dev.type, "dtype": dtype, "B": B, "T": T}
    tol = tolerance(r, v, GAMMA, LAM)
    bounds = {"verl": tol, "lfilter": tol, "torchrl": tolerance(r, v, GAMMA, LAM, TORCHRL_THRESHOLD)}
    checks: List[dict] = []

    def check(name: str, out: Pair) -> None:
        if name in bounds:
            checks.append({**shape, **check_agrees(name, out, want, m, bounds[name])._asdict()})

    missing = missing_contenders()
    libs = {"lfilter": lambda: lfilter_gae(r, v, m, GAMMA, LAM), "torchrl": lambda: torchrl_gae(r, v, m, GAMMA, LAM)}
    res = _time_checked({k: fn for k, fn in libs.items() if k not in missing}, dev, budget_s, lib_repeats, check)
    res.update({name: NO_TIME for name in missing})
    loops = {"loop": lambda: loop_gae(r, v, GAMMA, LAM), "verl": lambda: verl_gae(r, v, m, GAMMA, LAM)}
    res.update(_time_checked(loops, dev, budget_s, 9, check))
    return res, checks


def contender_info() -> dict:
    """The process that runs the contenders: its torch threads and id, the missing contenders, the libraries' versions."""
    have_torchrl = _load_torchrl() is not None
    return {
        "torch_threads": torch.get_num_threads(),
        "pid": os.getpid(),
        "missing": missing_contenders(),
        "scipy": _version("scipy") if _load_lfilter() is not None else None,
        "torchrl": _version("torchrl") if have_torchrl else None,
        "tensordict": _version("tensordict") if have_torchrl else None,
    }


def _init_contender_process(threads: int, mallopt: bool) -> None:
    torch.set_num_threads(threads)
    if mallopt:
        keep_freed_memory()


Call = Callable[..., object]
"""``call(fn, *args)`` runs ``fn(*args)`` somewhere and returns its result."""


def in_process(fn: Callable, *args):
    """:data:`Call` in this process."""
    return fn(*args)


@contextlib.contextmanager
def contender_process(threads: int, mallopt: bool) -> Iterator[Call]:
    """A :data:`Call` into one spawned process, kept for the whole run, with ``threads`` torch threads (and ``mallopt``).

    The contenders run there, one call at a time, while this process waits
    (so the two never compete for the CPUs); this process times
    ``valuelab.gae`` and never allocates the contenders' memory or imports
    SciPy and TorchRL. Spawned, not forked: forking a process whose torch
    thread pools are running is unsafe.
    """
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=1, mp_context=context, initializer=_init_contender_process,
                             initargs=(threads, mallopt)) as pool:
        yield lambda fn, *args: pool.submit(fn, *args).result()


def byte_bound(dtype: torch.dtype) -> float:
    """Bytes ``valuelab.gae`` moves over bytes the floor moves, per token: the least ``fast/floor`` can be.

    GAE reads rewards, values and the mask (one byte) and writes advantages
    and returns; the floor reads two tensors and writes one:
    ``(4 s + 1) / (3 s)`` for ``s`` bytes per entry (17/12 in float32, 33/24
    in float64), read-for-ownership traffic and page faults aside.
    """
    s = torch.empty((), dtype=dtype).element_size()
    return (4 * s + 1) / (3 * s)


def _row(device, dtype, B, T, kind, res: dict, threads: int) -> dict:
    """One row of the table from the timings ``res`` (``{contender: (median, min, faults)}``) of one shape."""
    fast_s, fast_min, faults = res[kind]
    torch_s, torch_min, _ = res["torch " + kind]
    floor_s, floor_min, _ = res["floor"]
    row = {
        "device": device.type, "dtype": str(dtype).replace("torch.", ""), "B": B, "T": T,
        "mask": kind, "loop_ms": res["loop"][0] * 1e3, "fast_ms": fast_s * 1e3, "floor_ms": floor_s * 1e3,
        "torch_ms": torch_s * 1e3, "loop/fast": res["loop"][0] / fast_s, "fast/floor": fast_s / floor_s,
        "bytes": byte_bound(dtype), "torch/floor": torch_s / floor_s, "fast_min/floor_min": fast_min / floor_min,
        "holes/rp": fast_s / res["right-padded"][0] if kind == "holes" else NAN,
        "fast_min_ms": fast_min * 1e3, "floor_min_ms": floor_min * 1e3, "faults": faults,
        "loop_min_ms": res["loop"][1] * 1e3, "torch_min_ms": torch_min * 1e3, "kernel_threads": threads,
    }
    for name in ("verl", "lfilter", "torchrl"):
        # verl's loop costs the same on any mask; the libraries handle right-padded rows only
        median, minimum, _ = res[name] if name == "verl" or kind == "right-padded" else NO_TIME
        row[f"{name}_ms"], row[f"{name}_min_ms"] = median * 1e3, minimum * 1e3
        row[f"{name}/fast"] = median / fast_s
    return row


def run_grid(devices, grid, dtypes, loop_budget_s: float, fast_repeats: int, log=print,
             checks: Optional[List[dict]] = None, call: Call = in_process) -> List[dict]:
    """Time the contenders on every (device, dtype, B, T, mask kind); one dict per row of the table.

    ``checks``, when given, receives the result of every agreement check
    (contender, shape, ``max_err``, ``tol``). ``call`` runs
    :func:`slow_contenders` (:func:`main` passes :func:`contender_process`;
    the default, in this process, lets the contenders' allocations change
    ``valuelab.gae``'s page faults on big shapes).
    """
    checks = [] if checks is None else checks
    rows: List[dict] = []
    for device in devices:
        for dtype in dtypes:
            for B, T in grid:
                r, v, m = make_batch(B, T, dtype, device, holes=False)
                rh, vh, mh = make_batch(B, T, dtype, device, holes=True)
                res, found = call(slow_contenders, B, T, str(dtype).replace("torch.", ""), device.type,
                                  loop_budget_s, fast_repeats)
                checks.extend(found)
                floor_buf = torch.empty_like(r)
                # the floor side by side with the fast paths, on the same inputs, in the same rounds
                res.update(time_interleaved({
                    "floor": lambda: torch.add(r, v, alpha=GAMMA, out=floor_buf),
                    "right-padded": lambda: fast_gae(r, v, m, GAMMA, LAM),
                    "holes": lambda: fast_gae(rh, vh, mh, GAMMA, LAM),
                }, device, repeats=fast_repeats))
                # the PyTorch path in a group of its own: its scratch buffers would evict the fast path's data
                res.update(time_interleaved({
                    "torch right-padded": lambda: torch_gae(r, v, m, GAMMA, LAM),
                    "torch holes": lambda: torch_gae(rh, vh, mh, GAMMA, LAM),
                }, device, repeats=fast_repeats))
                threads = kernel_threads(B, T, dtype, device)
                for kind in ("right-padded", "holes"):
                    rows.append(_row(device, dtype, B, T, kind, res, threads))
                    log(_fmt_row(rows[-1]))
    return rows


TARGET = ("cpu", "float32", 64, 4096)
TARGETS = [
    # (ratio, mask kind of the row, ">=" or "<=", bound, what it measures)
    ("loop/fast", "right-padded", ">=", 500, "valuelab.gae end to end against the per-token loop"),
    ("lfilter/fast", "right-padded", ">=", 5, "against SciPy lfilter per row"),
    ("torchrl/fast", "right-padded", ">=", 50, "against TorchRL vec_generalized_advantage_estimate"),
    ("fast_min/floor_min", "right-padded", "<=", 3, "against one elementwise pass side by side; minima"),
    ("holes/rp", "holes", "<=", 2, "masks with holes against right-padded"),
]
"""The targets, checked on the CPU, float32, B=64, T=4096 rows (:data:`TARGET`)."""


def _ratio_text(value: float) -> str:
    return f"{value:.2f}" if value < 10 else f"{value:.0f}"


def target_report(rows: List[dict]) -> List[str]:
    """The targets of :data:`TARGETS` on CPU, float32, B=64, T=4096: one line each, measured value, met or NOT met.

    A ratio that was not measured (a missing library) reads ``n/a``.
    """
    def pick(kind):
        return [r for r in rows if (r["device"], r["dtype"], r["B"], r["T"]) == TARGET and r["mask"] == kind]

    found = {kind: pick(kind) for kind in ("right-padded", "holes")}
    if not all(found.values()):
        return []
    lines = ["targets (cpu, float32, B=64, T=4096; ratios of medians, but fast_min/floor_min):"]
    for ratio, kind, op, bound, what in TARGETS:
        value = float(found[kind][0][ratio])
        if math.isnan(value):
            verdict, shown = "n/a: not measured", "n/a"
        else:
            met = value >= bound if op == ">=" else value <= bound
            verdict, shown = ("met" if met else "NOT met"), _ratio_text(value) + "x"
        lines.append(f"  {ratio:<18s} = {shown:>7s}  ({what}; target {op} {bound}x: {verdict})")
    r, h = found["right-padded"][0], found["holes"][0]
    lines.append(
        f"  for information: verl/fast = {_ratio_text(r['verl/fast'])}x; with holes loop/fast = {h['loop/fast']:.0f}x, "
        f"fast_min/floor_min = {h['fast_min/floor_min']:.1f}x; the PyTorch path (C kernel off) loop/torch = "
        f"{r['loop_ms'] / r['torch_ms']:.0f}x, torch/floor = {r['torch/floor']:.1f}x")
    return lines


def _kernel_call(r: torch.Tensor, v: torch.Tensor, m: torch.Tensor, threads: int,
                 out: Optional[Pair] = None) -> Callable[[], None]:
    """A call of the raw kernel ``valuelab_scan`` on ``r, v, m``: into ``out`` (warm buffers) or, each call, two fresh outputs.

    Every tensor goes through the boundary's own check (``_native._for_c``)
    before its pointer reaches C, as in :func:`valuelab._engine.native.scan`; what is
    left out is the rest of the public call (argument checks, dispatch).
    """
    if not _native.available():  # loads it on a first use
        raise RuntimeError(f"the C kernel is not available: {_native.status()}")
    fn = _native._fn
    shape, dtype = tuple(r.shape), r.dtype
    B, T = shape
    r, v = _native._for_c(r, "rewards", dtype, shape), _native._for_c(v, "values", dtype, shape)
    m = _native._for_c(m, "mask", torch.bool, shape)
    f64 = int(dtype == torch.float64)

    def run(adv: torch.Tensor, ret: torch.Tensor) -> None:
        adv = _native._for_c(adv, "advantages", dtype, shape)
        ret = _native._for_c(ret, "returns", dtype, shape)
        fn(r.data_ptr(), v.data_ptr(), m.data_ptr(), None, adv.data_ptr(), ret.data_ptr(), B, T, GAMMA,
           GAMMA * LAM, f64, threads)

    if out is not None:
        return lambda: run(*out)
    return lambda: run(torch.empty_like(r), torch.empty_like(r))


BREAKDOWN = {
    "floor_side": "the floor, timed side by side with valuelab.gae (as in the grid)",
    "gae_side": "valuelab.gae, timed side by side with the floor",
    "floor_alone": "the floor, timed alone",
    "gae_alone": "valuelab.gae, timed alone",
    "kernel_2t": "the raw kernel on the benchmark's threads, into warm outputs",
    "kernel_1t": "the raw kernel on one thread, into warm outputs",
    "kernel_2t_fresh": "the raw kernel on the benchmark's threads, into two fresh outputs per call",
}
"""What :func:`breakdown` times (minimum ms per call), by key."""


def breakdown(B: int, T: int, dtype: torch.dtype, rounds: int = 101, seed: int = 0) -> dict:
    """Where the time of ``valuelab.gae`` goes on one CPU shape (right-padded rows): the pieces of :data:`BREAKDOWN`.

    Each figure is the minimum over ``rounds`` calls in ms; the two
    side-by-side ones are timed in the same rounds, the others each in a loop
    of its own. Also ``faults`` (minor page faults per ``valuelab.gae`` call,
    side by side), ``front_door_us`` (a call on one row of 16 tokens: the
    fixed price of the public function) and ``kernel_threads``. Needs the
    C kernel (:class:`RuntimeError` otherwise).
    """
    cpu = torch.device("cpu")
    r, v, m = make_batch(B, T, dtype, cpu, holes=False, seed=seed)
    buf, warm = torch.empty_like(r), (torch.empty_like(r), torch.empty_like(r))
    threads = kernel_threads(B, T, dtype, cpu)
    floor = lambda: torch.add(r, v, alpha=GAMMA, out=buf)  # noqa: E731
    gae = lambda: fast_gae(r, v, m, GAMMA, LAM)  # noqa: E731
    side = time_interleaved({"floor": floor, "gae": gae}, cpu, repeats=rounds)
    out = {"B": B, "T": T, "dtype": str(dtype).replace("torch.", ""), "kernel_threads": threads,
           "floor_side": side["floor"][1] * 1e3, "gae_side": side["gae"][1] * 1e3, "faults": side["gae"][2]}
    alone = {"floor_alone": floor, "gae_alone": gae, "kernel_2t": _kernel_call(r, v, m, threads, warm),
             "kernel_1t": _kernel_call(r, v, m, 1, warm), "kernel_2t_fresh": _kernel_call(r, v, m, threads)}
    for key, fn in alone.items():
        out[key] = time_interleaved({key: fn}, cpu, repeats=rounds)[key][1] * 1e3
    r1, v1, m1 = make_batch(1, 16, dtype, cpu, holes=False, seed=seed)
    out["front_door_us"] = time_interleaved({"tiny": lambda: fast_gae(r1, v1, m1, GAMMA, LAM)}, cpu,
                                            repeats=max(rounds, 501))["tiny"][1] * 1e6
    return out


def breakdown_report(found: List[dict]) -> List[str]:
    """Lines for :func:`breakdown`'s results: one per shape, each figure as ms and as a multiple of ``floor_alone``."""
    keys = list(BREAKDOWN)
    lines = ["breakdown (cpu, right-padded; minimum ms per call, and / floor_alone):"]
    for b in found:
        f = b["floor_alone"]
        lines.append(f"  {b['dtype']:<7s} {b['B']:>4d}x{b['T']:<6d} faults/call {b['faults']:.0f}, "
                     f"front door {b['front_door_us']:.1f} us, kernel threads {b['kernel_threads']}")
        lines.extend(f"    {k:<16s} {b[k]:8.3f} ms {b[k] / f:6.2f}x  {BREAKDOWN[k]}" for k in keys)
    return lines


LARGE_SHAPES = ((64, 4096), (512, 4096), (16, 32768))
"""The batches trainers run: hundreds of responses of thousands of tokens, or a few very long ones."""
LARGE_TARGET = 2.0
"""On the CPU, at every shape of :data:`LARGE_SHAPES`, dtype and mask kind: ``fast_min_ms / floor_min_ms <= 2``."""


def large_report(rows: List[dict], load: Optional[Tuple[Optional[float], Optional[float]]] = None) -> List[str]:
    """The large-batch target (:data:`LARGE_TARGET`): one line per CPU row of :data:`LARGE_SHAPES` in ``rows``.

    The figure is the ratio of minima ``fast_min_ms / floor_min_ms`` (the fast
    path and the floor timed side by side), its median over the runs in
    ``rows`` (the ``run`` key; one run when absent), shown with each run's
    value and the byte-count bound :func:`byte_bound`. ``load`` is the
    1-minute load average before and after. Empty when no row has such a shape.
    """
    groups: Dict[Tuple, List[dict]] = {}
    for r in rows:
        if r["device"] == "cpu" and (int(r["B"]), int(r["T"])) in LARGE_SHAPES:
            groups.setdefault((r["dtype"], int(r["B"]), int(r["T"]), r["mask"]), []).append(r)
    if not groups:
        return []
    runs = max(len(g) for g in groups.values())
    shown = "" if load is None else "; load " + " -> ".join("?" if x is None else f"{x:.2f}" for x in load)
    lines = [f"large batches (cpu; fast_min/floor_min, the ratio of minima, median of {runs} run(s){shown}):"]
    for (dtype, B, T, kind), group in groups.items():
        ratios = [float(r["fast_min_ms"]) / float(r["floor_min_ms"]) for r in group]
        value = statistics.median(ratios)
        verdict = "met" if value <= LARGE_TARGET else "NOT met"
        lines.append(f"  {dtype:<7s} {B:>4d}x{T:<6d} {kind:<12s} = {value:5.2f}x  (runs "
                     f"{', '.join(f'{x:.2f}' for x in ratios)}; bytes bound {float(group[0]['bytes']):.2f}x; "
                     f"target <= {LARGE_TARGET:g}x: {verdict})")
    return lines


DROPIN_DONE = 1 / 200
"""Density of ``done`` in :func:`torchrl_dropin`'s batch (half of those steps are ``terminated``)."""
DROPIN_TARGET = 1.0
"""``torchrl/dropin`` (ratio of minimum times) must be at least this: the drop-in is no slower than TorchRL."""


def torchrl_dropin(B: int, T: int, dtype: str, device: str, budget_s: float, hi: int = 25,
                   seed: int = 0) -> Optional[dict]:
    """TorchRL's ``vec_generalized_advantage_estimate`` against valuelab's drop-in, on TorchRL's layout; None without torchrl.

    The batch is ``(B, T, 1)``: random values, next values and rewards, and
    several trajectories per row (``done`` with probability
    :data:`DROPIN_DONE`, half of them ``terminated``), ``gamma`` and
    ``lmbda`` the benchmark's. The two outputs are compared first (the
    difference must be within :func:`tolerance`, TorchRL's truncation
    included, else :class:`ContenderMismatch`), then the two functions are
    timed interleaved, 5 to ``hi`` rounds in about ``budget_s``. Returns the
    times in ms (``*_ms`` medians, ``*_min_ms`` minima), ``ratio`` (TorchRL's
    minimum over the drop-in's), ``rounds``, ``max_err`` and ``tol``.
    """
    vec_gae = _load_torchrl()
    if vec_gae is None:
        return None
    from ..integrations.torchrl import vec_generalized_advantage_estimate as dropin

    dev = torch.device(device)
    gen = torch.Generator().manual_seed(seed)
    sv, nsv, r = (torch.randn(B, T, 1, generator=gen, dtype=torch.float64).to(getattr(torch, dtype)).to(dev)
                  for _ in range(3))
    done = torch.rand(B, T, 1, generator=gen) < DROPIN_DONE
    terminated = done & (torch.rand(B, T, 1, generator=gen) < 0.5)
    args = (GAMMA, LAM, sv, nsv, r, done.to(dev), terminated.to(dev))
    fns = {"torchrl": lambda: vec_gae(*args, time_dim=-2), "dropin": lambda: dropin(*args, time_dim=-2)}
    (want, t_theirs), (got, t_ours) = _first_call(fns["torchrl"], dev), _first_call(fns["dropin"], dev)
    tol = tolerance(r.squeeze(-1), torch.maximum(sv.abs(), nsv.abs()).squeeze(-1), GAMMA, LAM, TORCHRL_THRESHOLD)
    err = max(float((g.double() - w.double()).abs().max()) for g, w in zip(got, want))
    if not err <= tol:
        raise ContenderMismatch(f"torchrl drop-in: differs from TorchRL's vec_generalized_advantage_estimate by "
                                f"{err:.3g} (tolerance {tol:.3g})")
    rounds = _repeats_for(t_theirs + t_ours, budget_s, lo=5, hi=hi)
    res = time_interleaved(fns, dev, repeats=rounds, warmup=1)
    return {"B": B, "T": T, "dtype": dtype, "device": dev.type,
            "torchrl_ms": res["torchrl"][0] * 1e3, "torchrl_min_ms": res["torchrl"][1] * 1e3,
            "dropin_ms": res["dropin"][0] * 1e3, "dropin_min_ms": res["dropin"][1] * 1e3,
            "ratio": res["torchrl"][1] / res["dropin"][1], "rounds": rounds, "max_err": err, "tol": tol}


def dropin_report(res: Optional[dict]) -> str:
    """The benchmark's line for :func:`torchrl_dropin`'s result (``n/a`` without torchrl)."""
    if res is None:
        return "torchrl drop-in: n/a (torchrl cannot be imported)"
    met = "met" if res["ratio"] >= DROPIN_TARGET else "NOT met"
    return (f"torchrl drop-in ({res['device']}, {res['dtype']}, ({res['B']}, {res['T']}, 1), done 1/"
            f"{round(1 / DROPIN_DONE)}): valuelab.integrations.torchrl.vec_generalized_advantage_estimate "
            f"{res['dropin_min_ms']:.3g} ms, TorchRL's {res['torchrl_min_ms']:.3g} ms (minima of {res['rounds']} "
            f"interleaved rounds; medians {res['dropin_ms']:.3g} / {res['torchrl_ms']:.3g} ms): torchrl/dropin = "
            f"{_ratio_text(res['ratio'])}x (target >= {DROPIN_TARGET:g}x: {met}); outputs differ by "
            f"{res['max_err']:.2g} (tolerance {res['tol']:.2g})")


def git_commit(where: Optional[Path] = None) -> str:
    """``git rev-parse HEAD`` of the checkout holding ``where`` (default: this file), ``-dirty`` appended when
    ``git status --porcelain`` lists anything; ``"unknown"`` outside a git checkout or without git."""
    where = Path(__file__).resolve().parent if where is None else Path(where)

    def git(*args: str) -> Optional[str]:
        try:
            proc = subprocess.run(["git", *args], cwd=where, capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.SubprocessError):
            return None
        return proc.stdout if proc.returncode == 0 else None

    head = git("rev-parse", "HEAD")
    if not head or not head.strip():
        return "unknown"
    changes = git("status", "--porcelain")
    return head.strip() + ("-dirty" if changes is None or changes.strip() else "")


def _version(module: str) -> Optional[str]:
    """The installed version of ``module``, or None when it cannot be imported."""
    try:
        return __import__(module).__version__
    except Exception:
        return None


def machine_description(threads: int, mallopt: bool, contenders: Optional[dict] = None) -> dict:
    """For the JSON next to the CSV: CPU, core count, torch and its threads, the git commit, the contenders' versions.

    ``contenders`` is :func:`contender_info` of the process that runs them
    (default: this one).
    """
    contenders = contender_info() if contenders is None else contenders
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
        "git_commit": git_commit(),
        "numpy": np.__version__,
        "scipy": contenders["scipy"],
        "torchrl": contenders["torchrl"],
        "tensordict": contenders["tensordict"],
        "contender_torch_threads": contenders["torch_threads"],
        "contenders_in": "this process" if contenders["pid"] == os.getpid() else "a spawned process of their own",
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


_WIDTHS = [6, 8, 3, 6, 13, 9, 8, 8, 8, 9, 10, 5, 10, 8, 11, 12, 7, 9, 10, 10, 9, 12, 12]


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
    ap.add_argument("--breakdown", action="store_true",
                    help="CPU only: where valuelab.gae's time goes on each shape and dtype (breakdown); "
                         "--out writes the results as JSON")
    ap.add_argument("--runs", type=int, default=1,
                    help="time the grid this many times (the large-batch target takes the median of the runs)")
    ap.add_argument("--repeats", type=int, default=0, help="rounds of the interleaved timing of the fast paths (default 61, quick 15)")
    ap.add_argument("--mallopt", action="store_true",
                    help="CPU, glibc only: keep freed memory in the process (no page faults on every "
                         "fresh MB-sized output); see keep_freed_memory")
    args = ap.parse_args(argv)
    if args.runs < 1:
        ap.error(f"--runs: expected a positive count, got {args.runs}")
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
    if args.breakdown:
        return _run_breakdown(args, argv, dtypes, grid, bool(mallopt))
    with contender_process(torch.get_num_threads(), bool(mallopt)) as call:
        return _run(args, argv, devices, dtypes, grid, bool(mallopt), call)


def _run_breakdown(args: argparse.Namespace, argv: Optional[List[str]], dtypes: List[torch.dtype],
                   grid: List[Tuple[int, int]], mallopt: bool) -> List[dict]:
    """``--breakdown``: :func:`breakdown` for every shape and dtype, printed, and written as JSON with ``--out``."""
    if not _native.available():
        raise SystemExit(f"--breakdown needs the C kernel: {_native.status()}")
    machine = machine_description(torch.get_num_threads(), mallopt, {
        "torch_threads": torch.get_num_threads(), "pid": os.getpid(), "missing": {}, "scipy": None,
        "torchrl": None, "tensordict": None})
    found = [breakdown(B, T, dtype, rounds=args.repeats or 101) for dtype in dtypes for B, T in grid]
    try:
        machine["loadavg_at_end"] = os.getloadavg()
    except (OSError, AttributeError):
        pass
    for line in breakdown_report(found):
        print(line)
    if args.out:
        machine["command"] = "python -m valuelab.bench " + " ".join(argv if argv is not None else sys.argv[1:])
        with open(args.out, "w") as fh:
            json.dump({"machine": machine, "breakdown": found}, fh, indent=1)
        print(f"wrote {args.out}")
    return found


def _run(args: argparse.Namespace, argv: Optional[List[str]], devices: List[torch.device], dtypes: List[torch.dtype],
         grid: List[Tuple[int, int]], mallopt: bool, call: Call) -> List[dict]:
    """The run of :func:`main` once the arguments are parsed: the table, the targets, the files."""
    contenders = call(contender_info)
    machine = machine_description(torch.get_num_threads(), mallopt, contenders)
    if "cpu" in [d.type for d in devices]:
        machine["kernel_threads"] = {f"{B}x{T}": kernel_threads(B, T, dtypes[0], torch.device("cpu")) for B, T in grid}

    print(f"{machine['cpu_model']}, {machine['logical_cpus']} logical CPUs, torch {torch.__version__}, "
          f"{torch.get_num_threads()} CPU threads, gamma={GAMMA}, lam={LAM}; fast = valuelab.gae "
          f"(CPU: {machine['cpu_path']}); torch = valuelab.gae with the C kernel off; verl = verl's mask-aware loop; "
          f"lfilter = SciPy {machine['scipy']} per row; torchrl = TorchRL {machine['torchrl']}; "
          f"commit {machine['git_commit']}; "
          "times in ms (median of the repeats; *_min: minimum); ratios of medians")
    for name, why in contenders["missing"].items():
        print(f"note: {why}: the {name} column is n/a ('-')")
    print(_header(), flush=True)
    t0 = time.perf_counter()
    repeats = args.repeats or (15 if args.quick else 61)
    checks: List[dict] = []
    rows: List[dict] = []
    for run in range(1, args.runs + 1):
        if args.runs > 1:
            print(f"run {run} of {args.runs}", flush=True)
        found = run_grid(devices, grid, dtypes, loop_budget_s=0.4 if args.quick else 3.0, fast_repeats=repeats,
                         log=lambda line: print(line, flush=True), checks=checks, call=call)
        rows.extend(dict(r, run=run) for r in found)
    worst = max((c["max_err"] / c["tol"] for c in checks if c["tol"] > 0), default=0.0)
    print(f"total {time.perf_counter() - t0:.0f} s; {len(checks)} agreement checks with valuelab.gae passed "
          f"(largest error / tolerance: {worst:.2g})", flush=True)
    try:
        machine["loadavg_at_end"] = os.getloadavg()
    except (OSError, AttributeError):
        pass
    load = machine["loadavg_at_start"], machine.get("loadavg_at_end")
    machine["large_targets"] = large_report(rows, (load[0][0] if load[0] else None, load[1][0] if load[1] else None))
    for line in target_report([r for r in rows if r["run"] == 1]) + machine["large_targets"]:
        print(line)
    _, _, tB, tT = TARGET
    if "cpu" in [d.type for d in devices] and torch.float32 in dtypes and (tB, tT) in grid:
        machine["torchrl_dropin"] = dropin = call(torchrl_dropin, tB, tT, "float32", "cpu",
                                                  0.4 if args.quick else 3.0)
        print(dropin_report(dropin), flush=True)
    if args.out:
        with open(args.out, "w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=CSV_COLUMNS)
            w.writeheader()
            for row in rows:
                w.writerow({k: (round(v, 6) if isinstance(v, float) else v) for k, v in row.items()})
        machine["command"] = "python -m valuelab.bench " + " ".join(argv if argv is not None else sys.argv[1:])
        machine["targets"] = target_report([r for r in rows if r["run"] == 1])
        machine["checks"] = checks
        meta = os.path.splitext(args.out)[0] + ".json"
        with open(meta, "w") as fh:
            json.dump(machine, fh, indent=1)
        print(f"wrote {args.out} and {meta}")
    return rows


if __name__ == "__main__":  # pragma: no cover
    main(sys.argv[1:])
