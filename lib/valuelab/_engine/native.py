"""The CPU kernel ``_gae_kernel.c``: built when valuelab is installed, loaded from the package, called through ctypes.

Derived in :doc:`/chapters/09_fast_gae` (section "One pass in C"). On a CPU,
:func:`valuelab.gae` and :func:`valuelab.discounted_returns` with numeric γ
and λ call :func:`scan` first; it returns None, and the PyTorch block scan
runs instead, on a GPU, when the kernel was not built or is refused (see
below; a :class:`UserWarning` says so, once per process), or when it is
switched off (environment variable ``VALUELAB_NATIVE=0``, or ``false``,
``no``, ``off`` in any case, read once at import; or :func:`disabled`; no
warning). Another value of ``VALUELAB_NATIVE`` is not ignored silently: a
``UserWarning`` names it, and the kernel stays on. Both paths give the recursion's results to
float rounding; the tests run both. ``python -m valuelab info`` prints which
one runs.

**Building.** ``pip install`` compiles the kernel (``setup.py``: an optional
setuptools extension, portable flags, one clone per x86-64 instruction set)
into ``_gae_kernel<EXT_SUFFIX>`` next to this file; an install without a
working C compiler succeeds without it. Nothing is compiled at run time.

**Loading** (:func:`_open`, once per process): only that file, from this
package's folder -- never from a cache or a temporary folder -- and only
when the file, the folder and (for a link) the folder the file really is in
are owned by this user or by root and writable by nobody else, when the
library has the entry point ``valuelab_scan`` and when it was built from the
``_gae_kernel.c`` next to it (the SHA-256 compiled into it matches: an
edited source needs ``pip install -e .`` again). Otherwise nothing is
loaded, :func:`status` says why, and it stays that way.

**The boundary** (:func:`scan`): every tensor handed to C is checked, or
made safe, first -- device, exact dtype, shape, storage large enough for the
view (a freed storage raises), negative and conjugate bits resolved, zero
tensors materialised, contiguity -- in O(1) per tensor unless a copy is
needed.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import os
import re
import stat
import sys
import sysconfig
import threading
import warnings
from pathlib import Path
from typing import Callable, Dict, Iterator, Optional, Tuple

import torch

from .checks import env_switch

__all__ = ["available", "status", "disabled", "scan", "run", "plain", "threads_for", "lanes", "widths", "library_path"]

PACKAGE_DIR = Path(__file__).resolve().parent  # valuelab/_engine: the kernel's source and library live here
VALUELAB_DIR = PACKAGE_DIR.parent  # the whole package: a warning points at the first frame outside it
SOURCE = PACKAGE_DIR / "_gae_kernel.c"
LIBRARY = PACKAGE_DIR / ("_gae_kernel" + (sysconfig.get_config_var("EXT_SUFFIX") or ".so"))  # setup.py's output
_FALLBACK = "PyTorch block scan"
_ARGTYPES = [ctypes.c_void_p] * 6 + [ctypes.c_int64, ctypes.c_int64, ctypes.c_double, ctypes.c_double,
                                     ctypes.c_int, ctypes.c_int]

_lock = threading.Lock()
_fn: Optional[Callable[..., int]] = None  # valuelab_scan, argtypes set
_path: Optional[Path] = None  # the file it was loaded from
_tried = False
_status = "not loaded yet"
_warned = False
_enabled = env_switch("VALUELAB_NATIVE", True)  # 0/false/no/off (any case) switch the kernel off
_stat = os.stat  # the ownership check's stat (the tests replace it)
_vector_bytes: Callable[[], int]  # valuelab_vector_bytes of the loaded library (set by _open)


class _NotForC(Exception):
    """A tensor C cannot read (a tensor subclass, or one without storage, e.g. under ``torch.vmap``): use PyTorch."""


# ---------------------------------------------------------------------------
# loading
# ---------------------------------------------------------------------------


def _unsafe(path: Path, what: str, want_dir: bool) -> Optional[str]:
    """Why ``path`` may not be trusted, or None: it must be owned by this user or root and writable by no one else."""
    try:
        st = _stat(path)
    except OSError as e:
        return f"{what} {path} cannot be read ({e.strerror})"
    if want_dir != stat.S_ISDIR(st.st_mode) or not (want_dir or stat.S_ISREG(st.st_mode)):
        return f"{what} {path} is not a {'folder' if want_dir else 'regular file'}"
    uid = os.getuid() if hasattr(os, "getuid") else None
    if uid is not None and st.st_uid not in (uid, 0):
        return f"{what} {path} is owned by uid {st.st_uid}, not by this user (uid {uid}) or root"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return (f"{what} {path} is writable by its group or by everyone (mode {stat.S_IMODE(st.st_mode):o}; "
                f"chmod go-w {path})")
    return None


def _refusal(path: Path) -> Optional[str]:
    """Why the library at ``path`` may not be loaded (see :func:`_unsafe`), or None: checked are its folder, the file and, for a link, the folder of its target."""
    real = Path(os.path.realpath(path))
    checks = [(path.parent, "the folder", True), (real, "the library", False)]
    if real.parent != Path(os.path.realpath(path.parent)):
        checks.append((real.parent, "the folder", True))
    for p, what, want_dir in checks:
        reason = _unsafe(p, what, want_dir)
        if reason:
            return reason
    return None


def _source_sha256() -> Optional[str]:
    """SHA-256 of ``_gae_kernel.c`` next to this file (None where it is missing)."""
    try:
        return hashlib.sha256(SOURCE.read_bytes()).hexdigest()
    except OSError:
        return None


def _open(path: Path) -> Tuple[Optional[Callable[..., int]], str]:
    """``(valuelab_scan, status)`` for the library at ``path``, or ``(None, why not)``; never raises."""
    if not path.exists():
        return None, (f"the C kernel is not built (no {path.name} in {path.parent}: installed without a working "
                      f"C compiler? reinstall valuelab with one): {_FALLBACK}")
    reason = _refusal(path)
    if reason:
        return None, f"refused to load the C kernel: {reason}: {_FALLBACK}"
    try:
        lib = ctypes.CDLL(os.path.realpath(path))
    except OSError as e:
        return None, f"the C kernel {path} does not load ({e}): {_FALLBACK}"
    try:
        fn, built_from, target, threads = (lib.valuelab_scan, lib.valuelab_source_sha256, lib.valuelab_target,
                                           lib.valuelab_threading)
        lib.valuelab_vector_bytes
    except AttributeError as e:
        return None, f"the C kernel {path} lacks an entry point ({e}): {_FALLBACK}"
    built_from.restype = target.restype = threads.restype = ctypes.c_char_p
    built_from.argtypes = target.argtypes = threads.argtypes = []
    source = _source_sha256()
    if source is not None and built_from() != source.encode():
        return None, (f"the C kernel {path} was built from another version of {SOURCE.name} "
                      f"(rebuild it: pip install -e . or pip install .): {_FALLBACK}")
    fn.restype = ctypes.c_int
    fn.argtypes = _ARGTYPES
    global _vector_bytes
    _vector_bytes = lib.valuelab_vector_bytes
    _vector_bytes.restype, _vector_bytes.argtypes = ctypes.c_int, []
    return fn, f"C kernel ({target().decode()}; threads: {threads().decode()})"


def _load() -> Optional[Callable[..., int]]:
    """Load the kernel once per process (:func:`_open`); None when it can't be."""
    global _fn, _path, _tried, _status
    if _tried:  # every call after the first: no lock on the hot path
        return _fn
    with _lock:
        if not _tried:
            _fn, _status = _open(LIBRARY)
            _path = LIBRARY if _fn is not None else None
            _tried = True  # last: a concurrent caller waits on the lock until _fn is set
    return _fn


def _warn_fallback() -> None:
    """Warn, once per process, that the CPU takes the PyTorch path because the kernel is missing or refused."""
    global _warned
    with _lock:
        if _warned:
            return
        _warned = True
    level, frame, inside = 1, sys._getframe(0), str(VALUELAB_DIR) + os.sep
    while frame is not None and frame.f_code.co_filename.startswith(inside):
        frame, level = frame.f_back, level + 1  # point at the caller's line, outside valuelab
    warnings.warn(f"valuelab: {_status} (several times slower on a CPU; `python -m valuelab info` says more)",
                  UserWarning, stacklevel=level)


def widths() -> Dict[torch.dtype, Tuple[int, ...]]:
    """Every W the kernel is compiled for, per dtype, widest first, read from ``DEFINE_KERNEL(...)`` in the source.

    One kernel per vector width (64, 32 and 16 bytes: AVX-512, AVX2, the
    baseline), so ``{float32: (16, 8, 4), float64: (8, 4, 2)}``; the W of
    :eq:`eq-fast-vector-scan` in chapter 9, whose SymPy proof runs for each.
    """
    found = re.findall(r"^DEFINE_KERNEL\(scan_(f32|f64)x\d+, \w+, \w+, (\d+),", SOURCE.read_text(), flags=re.M)
    names = {"f32": torch.float32, "f64": torch.float64}
    out: Dict[torch.dtype, Tuple[int, ...]] = {}
    for k, w in found:
        out[names[k]] = tuple(sorted(set(out.get(names[k], ())) | {int(w)}, reverse=True))
    return out


def lanes() -> Optional[Dict[torch.dtype, int]]:
    """The W the loaded kernel runs on this CPU, per dtype (the widest of :func:`widths` it supports); None when not loaded."""
    if _load() is None:
        return None
    size = _vector_bytes()
    return {torch.float32: size // 4, torch.float64: size // 8}


def available() -> bool:
    """Whether ``valuelab._engine.native.scan`` runs the C kernel (loading it now if it has not been tried)."""
    return _enabled and _load() is not None


def status() -> str:
    """Which path CPU GAE takes, in words (for the chapter, the benchmark and ``python -m valuelab info``)."""
    if not _enabled:
        return f"C kernel switched off: {_FALLBACK}"
    _load()
    return _status


def library_path() -> Optional[Path]:
    """The file the kernel was loaded from (``LIBRARY``), or None when it is not loaded."""
    _load()
    return _path


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


_PARALLEL_GRAIN = 1 << 16  # elements per thread: tens of microseconds of work


def threads_for(numel: int) -> int:
    """Threads the kernel may use for ``numel`` elements: one per ``_PARALLEL_GRAIN``, at most torch's.

    The rows are cut into chunks that these threads take one at a time:
    PyTorch's own OpenMP threads where the kernel was built with OpenMP (the
    same runtime, ``libgomp.so.1``, so the threads that just ran a tensor
    operation run GAE too), else -- and in a forked child, whose OpenMP
    threads did not survive the fork -- the caller's thread and the workers
    of a small pool inside the kernel (``valuelab_scan`` in
    ``_gae_kernel.c``). Rows are independent, so the result is the same
    bits whoever scans them.
    """
    return max(1, min(torch.get_num_threads(), numel // _PARALLEL_GRAIN))



# ---------------------------------------------------------------------------
# the boundary
# ---------------------------------------------------------------------------


_ITEMSIZE = {torch.float32: 4, torch.float64: 8, torch.bool: 1}
_Tensor = torch.Tensor


def _extent(x: torch.Tensor) -> int:
    """Elements from ``x.storage_offset()`` that the view can reach: the largest offset + 1 (0 when empty)."""
    if x.numel() == 0:
        return 0
    return 1 + sum((n - 1) * s for n, s in zip(x.shape, x.stride()))


def _for_c(x: object, name: str, dtype: torch.dtype, shape: Tuple[int, ...]) -> torch.Tensor:
    """``x`` as a tensor C may read as a dense row-major ``shape`` array of ``dtype`` (float32, float64 or bool).

    The common case -- a plain, dense, contiguous CPU tensor of ``dtype`` and
    ``shape`` whose storage holds the view -- is recognised by a few O(1)
    queries and ``x`` itself is returned; anything else goes through
    :func:`_resolve`. (No conjugate bit to look at here: PyTorch sets it on
    complex tensors only, and ``dtype`` is real.)
    """
    return x if plain(x, dtype, shape) else _resolve(x, name, dtype, shape)


def plain(x: object, dtype: torch.dtype, shape: Tuple[int, ...]) -> bool:
    """Whether C may read ``x`` as it is: a plain, dense, contiguous CPU tensor of ``dtype`` and ``shape`` whose storage holds the view.

    A few O(1) queries; False for anything :func:`_resolve` would have to
    look at (a subclass, a tensor without storage as under ``torch.vmap``, a
    freed storage, a zero tensor's NULL pointer, a negative bit, another
    dtype, shape or device).
    """
    if not (type(x) is _Tensor and x.is_cpu and x.dtype == dtype and not x.is_nested and x.shape == shape
            and x.is_contiguous() and not x.is_neg()):
        return False
    try:
        have = x.untyped_storage().nbytes()
    except (RuntimeError, NotImplementedError):  # no storage (torch.vmap, functionalization)
        return False
    # contiguous: the view reaches numel elements; a NULL pointer (a zero tensor) is not plain
    return have >= x.storage_offset() * _ITEMSIZE[dtype] + x.nbytes and (x.data_ptr() != 0 or not x.numel())


def _check_dense(x: object, name: str) -> None:
    """Raise :class:`TypeError` unless ``x`` is a tensor with the strided layout (not sparse, not nested)."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(x).__name__}")
    if x.is_nested or x.layout != torch.strided:
        kind = "a nested tensor" if x.is_nested else f"layout {x.layout}"
        raise TypeError(f"{name}: {kind}, expected a dense torch.strided tensor")


def _resolve(x: object, name: str, dtype: torch.dtype, shape: Tuple[int, ...]) -> torch.Tensor:
    """:func:`_for_c` for everything but the common case: check, then copy into a dense tensor where needed.

    Raises :class:`TypeError` (not a strided tensor of ``dtype``) or
    :class:`ValueError` (another device or shape; a storage too small for
    the view, e.g. freed by ``untyped_storage().resize_(0)`` as FSDP does; a
    NULL data pointer), the message starting with ``name``; raises
    :class:`_NotForC` for a tensor subclass or a tensor without storage
    (``torch.vmap``, functionalization), which the PyTorch path handles.
    Otherwise: a zero tensor (``torch._efficientzerotensor``) becomes real
    zeros; the storage is checked against the view *before* anything reads
    it; negative and conjugate bits are resolved; the result is contiguous.
    """
    _check_dense(x, name)
    if type(x) is not _Tensor and type(x) is not torch.nn.Parameter:
        raise _NotForC(name)
    if not x.is_cpu:
        raise ValueError(f"{name}: on {x.device}, but the C kernel reads CPU memory")
    if x.dtype != dtype:
        raise TypeError(f"{name}: dtype {x.dtype}, expected {dtype}")
    if x.shape != shape:
        raise ValueError(f"{name}: shape {tuple(x.shape)}, expected {tuple(shape)}")
    if x._is_zerotensor():  # no memory behind it: real zeros
        return torch.zeros(shape, dtype=dtype, device="cpu")
    try:
        have = x.untyped_storage().nbytes()
    except (RuntimeError, NotImplementedError):
        raise _NotForC(name) from None
    need = (x.storage_offset() + _extent(x)) * x.element_size() if x.numel() else 0
    if have < need:
        if have == 0:
            raise ValueError(f"{name}: its storage has been freed (size 0) but the view needs {need} bytes "
                             "(e.g. untyped_storage().resize_(0), as FSDP does); the kernel would read freed memory")
        raise ValueError(f"{name}: its storage holds {have} bytes but the view needs {need} "
                         f"(storage_offset {x.storage_offset()}, stride {x.stride()})")
    if x.is_neg():
        x = x.resolve_neg()
    if x.is_conj():
        x = x.resolve_conj()
    x = x.contiguous()
    if x.numel() and x.data_ptr() == 0:
        raise ValueError(f"{name}: its data pointer is NULL")
    return x


def _output(like: torch.Tensor, name: str) -> torch.Tensor:
    """A fresh output for C to write: ``empty_like`` of a checked dense input, checked again (O(1)).

    The check can only fail when a ``__torch_function__`` mode has replaced
    ``empty_like`` (say, with a fake tensor): then nothing is written.
    """
    x = torch.empty_like(like, memory_format=torch.contiguous_format)
    if type(x) is not _Tensor or not x.is_cpu or x.dtype != like.dtype or x.shape != like.shape \
            or not x.is_contiguous() or (x.numel() and x.data_ptr() == 0):
        raise ValueError(f"{name}: torch.empty_like gave no dense CPU buffer ({type(x).__name__} on {x.device})")
    return x


def scan(
    rewards: torch.Tensor,
    values: Optional[torch.Tensor],
    mask: Optional[torch.Tensor],
    gamma: float,
    c: float,
    bootstrap: Optional[torch.Tensor],
) -> Optional[Tuple[Optional[torch.Tensor], torch.Tensor, bool]]:
    r"""``(advantages, returns, finite)`` by the C kernel, or None where it does not apply (then the caller scans in PyTorch).

    GAE (:eq:`eq-gae-recursion` of chapter 5, with ``c = γλ``) when ``values``
    is given, else the discounted return (``c = γ``, ``advantages`` None),
    computed as in :eq:`eq-fast-vector-scan` and :eq:`eq-fast-vector-carry`
    of chapter 9. ``rewards``: ``(B, T)`` float32 or float64 on the CPU;
    ``values``: the same or None; ``mask``: ``(B, T)`` bool or None (all
    valid; a byte other than 0 and 1 counts as True, as ``byte != 0``);
    ``bootstrap``: ``(B,)`` of the same dtype, or None (0). The caller has
    validated them, but each is checked again before C sees it
    (:func:`_for_c`): a wrong type, dtype, device or shape, or a freed
    storage, raises :class:`TypeError` or :class:`ValueError` naming the
    argument; views (negative, conjugate, strided) and zero tensors are
    resolved into dense copies. ``finite`` is False when an entry of
    ``rewards`` or ``values`` (masked ones included) is NaN or infinite, a
    return overflowed (a non-finite advantage makes its return non-finite
    too), or only the finiteness test's sum overflowed -- one sum, taken
    during the same pass, of the returns written and of the masked tokens'
    inputs (at a valid token a non-finite input makes its return non-finite);
    the caller then checks entry by entry
    (:func:`valuelab._engine.problem.check_outputs`). A call that writes
    ``VALUELAB_STREAM_BYTES`` of outputs or more (``_gae_kernel.c``) streams
    them past the caches.

    None is returned for non-CPU ``rewards`` (a GPU takes the PyTorch path),
    for tensors C cannot read (tensor subclasses, tensors under
    ``torch.vmap``), when the kernel is switched off, and when it is not
    loaded (then, once per process, a :class:`UserWarning`).
    """
    if not isinstance(rewards, torch.Tensor):
        raise TypeError(f"rewards: expected a torch.Tensor, got {type(rewards).__name__}")
    if not rewards.is_cpu or not _enabled:
        return None
    if _load() is None:
        _warn_fallback()
        return None
    _check_dense(rewards, "rewards")
    if rewards.dim() != 2:
        raise ValueError(f"rewards: shape {tuple(rewards.shape)}, expected (B, T)")
    dtype = rewards.dtype
    if dtype != torch.float32 and dtype != torch.float64:
        raise TypeError(f"rewards: dtype {dtype}, expected torch.float32 or torch.float64")
    shape = rewards.shape
    B, T = shape
    try:
        r = _for_c(rewards, "rewards", dtype, shape)
        v = None if values is None else _for_c(values, "values", dtype, shape)
        m = None if mask is None else _for_c(mask, "mask", torch.bool, shape)
        b = None if bootstrap is None else _for_c(bootstrap, "bootstrap", dtype, (B,))
    except _NotForC:
        return None
    return run(r, v, m, b, gamma, c)


def run(
    r: torch.Tensor,
    v: Optional[torch.Tensor],
    m: Optional[torch.Tensor],
    b: Optional[torch.Tensor],
    gamma: float,
    c: float,
) -> Tuple[Optional[torch.Tensor], torch.Tensor, bool]:
    """:func:`scan` past its checks: fresh outputs, then one call of the loaded kernel.

    Only for tensors :func:`_for_c` returned (or that pass :func:`plain`)
    and a loaded kernel (:func:`available`): nothing is checked here.
    """
    ret = _output(r, "returns")
    adv = None if v is None else _output(r, "advantages")
    B, T = r.shape
    finite = True
    if B and T:
        finite = 1 == _fn(
            r.data_ptr(),
            None if v is None else v.data_ptr(),
            None if m is None else m.data_ptr(),
            None if b is None else b.data_ptr(),
            None if adv is None else adv.data_ptr(),
            ret.data_ptr(),
            B, T, float(gamma), float(c), int(r.dtype == torch.float64), threads_for(B * T),
        )
    return adv, ret, finite
