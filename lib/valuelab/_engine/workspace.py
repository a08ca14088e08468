"""Reused scratch buffers for the PyTorch path of the fused estimators (:mod:`valuelab._engine.blocked`).

Derived in :doc:`/chapters/09_fast_gae` (the benchmark's page faults).
"""

from __future__ import annotations

import threading

import torch

__all__ = ["scratch", "clear_scratch"]

_WORKSPACE = threading.local()
# At most this many bytes of scratch are kept per thread (beyond, scratch is allocated per call):
# enough for a (64, 32768) float64 batch with holes.
_WORKSPACE_BYTES = 128 << 20


def scratch(name: str, shape, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """An uninitialised tensor for intermediate results, reused from call to call on the CPU.

    PyTorch has no caching allocator on the CPU: a fresh MB-sized temporary
    comes from ``mmap`` or the top of the heap, and glibc returns freed memory
    to the OS, so touching it again costs a page fault per 4 KiB -- about
    0.5 ms per MB on the benchmark's machine, ten times the arithmetic on it.
    Keeping the scratch buffers of the largest problem seen (per thread, at
    most ``_WORKSPACE_BYTES`` in all; :func:`clear_scratch` frees them)
    removes that cost; outputs are always fresh tensors. A buffer is only
    valid until the next call that asks for the same ``name``. On CUDA the
    caching allocator already does this: a plain ``torch.empty``.
    """
    n = 1
    for d in shape:
        n *= d
    if device.type != "cpu":
        return torch.empty(shape, dtype=dtype, device=device)
    bufs = getattr(_WORKSPACE, "bufs", None)
    if bufs is None:
        bufs = _WORKSPACE.bufs = {}
    key = (name, dtype)
    buf = bufs.get(key)
    if buf is None or buf.numel() < n:
        held = sum(b.numel() * b.element_size() for k, b in bufs.items() if k != key)
        if held + n * dtype.itemsize > _WORKSPACE_BYTES:
            return torch.empty(shape, dtype=dtype)
        buf = bufs[key] = torch.empty(n, dtype=dtype)
    return buf[:n].view(shape)


def clear_scratch() -> None:
    """Free the scratch buffers that the fused estimators keep on this thread (see :func:`_scratch`)."""
    _WORKSPACE.bufs = {}

