"""The CPU kernel ``_gae_kernel.c``: compiled on first use with the system's C compiler, called through ctypes.

Derived in ``chapters/09_fast_gae`` (section "One pass in C"). On a CPU,
:func:`valuelab._fastscan.fused_returns` -- hence :func:`valuelab.gae` and
:func:`valuelab.discounted_returns` with numeric γ and λ -- calls
:func:`scan` first; it returns None, and the PyTorch block scan runs
instead, on a GPU, when no C compiler is found, when compiling fails, or
when the kernel is switched off (environment variable ``VALUELAB_NATIVE=0``
or :func:`disabled`). Both paths give the recursion's results to float
rounding; the tests run both.

The shared library is cached in ``$VALUELAB_CACHE_DIR``, else
``$XDG_CACHE_HOME/valuelab``, else ``~/.cache/valuelab`` (and, where that
cannot be written, in a private folder under the temporary directory), under a name that
hashes the source, the compiler, its flags and the machine, so a changed
source or another CPU gets its own build. Compiling takes about a second,
once per machine.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import os
import platform
import re
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Tuple

import torch

__all__ = ["available", "status", "disabled", "scan", "threads_for", "lanes"]

SOURCE = Path(__file__).with_name("_gae_kernel.c")
_FLAG_SETS: List[List[str]] = [["-O3", "-march=native"], ["-O3"]]  # the first that compiles wins
_COMMON = ["-ffp-contract=fast", "-fPIC", "-shared", "-pthread", "-Wno-psabi"]

_lock = threading.Lock()
_lib: Optional[ctypes.CDLL] = None
_tried = False
_status = "not loaded yet"
_enabled = os.environ.get("VALUELAB_NATIVE", "1") != "0"


def _cache_dirs() -> List[Path]:
    """Where the built kernel may live, in order: the configured cache, then a private temporary folder."""
    env = os.environ.get("VALUELAB_CACHE_DIR")
    if env:
        first = Path(env)
    else:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        first = Path(base) / "valuelab"
    uid = os.getuid() if hasattr(os, "getuid") else "user"
    return [first, Path(tempfile.gettempdir()) / f"valuelab-{uid}"]


def _cpu_signature() -> str:
    """The CPU's model and feature flags (``-march=native`` builds for them)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            lines = [ln for ln in f if ln.startswith(("model name", "flags", "Features"))]
        return "".join(sorted(set(lines)))
    except OSError:
        return platform.processor()


def _compile(compiler: str, flags: List[str], target: Path) -> bool:
    try:
        target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
        os.close(fd)
    except OSError:  # a read-only or missing home: the caller tries the next folder
        return False
    try:
        proc = subprocess.run(
            [compiler, *flags, *_COMMON, "-o", tmp, str(SOURCE)], capture_output=True, text=True, timeout=120
        )
        if proc.returncode != 0:
            return False
        os.replace(tmp, target)  # atomic: a concurrent process sees the old file or the new one
        return True
    except (OSError, subprocess.SubprocessError):
        return False
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _load() -> Optional[ctypes.CDLL]:
    """Compile (or find in the cache) and load the kernel once per process; None when it can't be."""
    global _lib, _tried, _status
    if _tried:  # every call after the first: no lock on the hot path
        return _lib
    with _lock:
        if _tried:
            return _lib
        _tried = True
        compiler = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc") or shutil.which("clang")
        if compiler is None:
            _status = "no C compiler found: PyTorch block scan"
            return None
        try:
            source = SOURCE.read_bytes()
        except OSError:
            _status = "kernel source missing: PyTorch block scan"
            return None
        for flags in _FLAG_SETS:
            key = hashlib.sha256(
                b"\0".join([source, compiler.encode(), " ".join(flags + _COMMON).encode(),
                            platform.machine().encode(), _cpu_signature().encode()])
            ).hexdigest()[:16]
            lib = None
            for folder in _cache_dirs():
                target = folder / f"gae_kernel-{key}.so"
                if target.exists() or _compile(compiler, flags, target):
                    try:
                        lib = ctypes.CDLL(str(target))
                        break
                    except OSError:
                        continue
            if lib is None:
                continue
            fn = lib.valuelab_scan
            fn.restype = ctypes.c_int
            fn.argtypes = [ctypes.c_void_p] * 6 + [ctypes.c_int64, ctypes.c_int64, ctypes.c_double,
                                                   ctypes.c_double, ctypes.c_int, ctypes.c_int]
            _lib = lib
            _status = f"C kernel ({Path(compiler).name} {' '.join(flags)})"
            return _lib
        _status = "the C kernel did not compile: PyTorch block scan"
        return None


def lanes() -> Dict[torch.dtype, int]:
    """Tokens per vector of the kernel, per dtype, read from ``DEFINE_KERNEL(...)`` in the source (W in chapter 9)."""
    found = re.findall(r"^DEFINE_KERNEL\(scan_(f32|f64), \w+, \w+, (\d+),", SOURCE.read_text(), flags=re.M)
    names = {"f32": torch.float32, "f64": torch.float64}
    return {names[k]: int(w) for k, w in found}


def available() -> bool:
    """Whether ``valuelab._native.scan`` runs the C kernel (compiling it now if it has not been tried)."""
    return _enabled and _load() is not None


def status() -> str:
    """Which path CPU GAE takes, in words (for the chapter and the benchmark)."""
    if not _enabled:
        return "C kernel switched off: PyTorch block scan"
    _load()
    return _status


@contextlib.contextmanager
def disabled() -> Iterator[None]:
    """Within the block, CPU GAE takes the PyTorch block scan (as without a compiler)."""
    global _enabled
    previous = _enabled
    _enabled = False
    try:
        yield
    finally:
        _enabled = previous


_PARALLEL_GRAIN = 1 << 21  # elements per thread: starting one costs ~60 µs on a small VM


def threads_for(numel: int) -> int:
    """Threads the kernel uses for ``numel`` elements: one per ``_PARALLEL_GRAIN``, at most torch's."""
    return max(1, min(torch.get_num_threads(), numel // _PARALLEL_GRAIN))


def scan(
    rewards: torch.Tensor,
    values: Optional[torch.Tensor],
    mask: Optional[torch.Tensor],
    gamma: float,
    c: float,
    bootstrap: Optional[torch.Tensor],
) -> Optional[Tuple[Optional[torch.Tensor], torch.Tensor, bool]]:
    r"""``(advantages, returns, finite)`` by the C kernel, or None where it does not apply (then the caller scans in PyTorch).

    GAE (``(eq-gae-recursion)`` of chapter 5, with ``c = γλ``) when ``values``
    is given, else the discounted return (``c = γ``, ``advantages`` None),
    computed as in ``(eq-fast-vector-scan)`` and ``(eq-fast-vector-carry)``
    of chapter 9. Arguments as in :func:`valuelab._fastscan.fused_returns`
    (already checked, except for finiteness): ``(B, T)`` float32/float64 CPU
    tensors, a bool mask or None, a ``(B,)`` bootstrap or None. ``finite``
    is False when the sum of all entries of ``rewards`` and ``values``
    (masked ones included), taken during the same pass, is not finite: an
    entry is NaN or infinite (the caller must then check them one by one and
    raise) or finite entries overflowed. None is returned for CUDA tensors,
    other dtypes, or when :func:`available` is False.
    """
    if rewards.device.type != "cpu" or rewards.dtype not in (torch.float32, torch.float64) or not available():
        return None
    B, T = rewards.shape
    dtype = rewards.dtype
    r = rewards.contiguous()
    v = None if values is None else values.contiguous()
    m = None if mask is None else mask.contiguous()
    b = None if bootstrap is None else bootstrap.reshape(B).to(dtype).contiguous()
    ret = torch.empty((B, T), dtype=dtype)
    adv = None if v is None else torch.empty((B, T), dtype=dtype)
    finite = True
    if B and T:
        finite = 1 == _lib.valuelab_scan(
            r.data_ptr(),
            None if v is None else v.data_ptr(),
            None if m is None else m.data_ptr(),
            None if b is None else b.data_ptr(),
            None if adv is None else adv.data_ptr(),
            ret.data_ptr(),
            B, T, float(gamma), float(c), int(dtype == torch.float64), threads_for(B * T),
        )
    return adv, ret, finite
