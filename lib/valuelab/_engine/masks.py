"""Masks without argsort: the right-padding test, the valid-first order and the compaction index.

Loop-free helpers of the general and PyTorch paths (derived in
:doc:`/chapters/09_fast_gae`, "holes"). Each takes a *canonical* bool mask (one
byte per entry, 0 or 1; :meth:`valuelab._engine.problem.Problem.torch_mask` makes
one from any bool tensor).
"""

from __future__ import annotations

import functools
from typing import Optional

import torch

from .workspace import scratch as _scratch

__all__ = ["valid_first_order", "float_mask", "right_padded_rows", "compaction_index"]


def valid_first_order(mask: torch.Tensor, lengths: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The permutation ``torch.argsort(~mask, stable=True)`` gives, in O(T) with one cumulative sum.

    ``order[b, j]`` is the original column of the j-th token of row b once the
    valid tokens are moved first (in their order) and the masked ones after
    (in theirs). With ``cs = cumsum(mask)``, the valid token at column t goes
    to ``cs[t] - 1`` and a masked one to ``lengths + t - cs[t]`` (``t - cs[t]``
    masked tokens precede it); ``order`` is the inverse of that map, built by
    one scatter. The arithmetic is int32 (several times faster than int64 on
    CPU); only the index handed to the scatter is int64. ``lengths``
    (``mask.sum(-1, keepdim=True)``) is optional.
    """
    B, T = mask.shape
    t = torch.arange(T, device=mask.device)
    if T == 0:
        return torch.empty((B, 0), dtype=torch.int64, device=mask.device)
    cs = mask.to(torch.int32).cumsum(-1, dtype=torch.int32)
    L = cs[:, -1:] if lengths is None else lengths.to(torch.int32)
    dest = torch.where(mask, cs - 1, (L + t.to(torch.int32)) - cs).long()
    return torch.empty_like(dest).scatter_(-1, dest, t.expand(B, T))



def float_mask(mask: torch.Tensor, dtype: torch.dtype, out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """A boolean mask as 0/1 numbers of ``dtype`` (into ``out`` when given).

    Goes through ``uint8`` (a bool tensor is one byte per entry, 0 or 1):
    PyTorch's CPU kernel for bool -> float is not vectorised and is about ten
    times slower than uint8 -> float.
    """
    src = mask.view(torch.uint8) if mask.dtype == torch.bool else mask
    if out is None:
        return src.to(dtype)
    return out.copy_(src)


@functools.lru_cache(maxsize=64)
def _position_weights(T: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """``2 t`` for ``t < T`` (the weights of :func:`right_padded_rows`)."""
    return (2 * torch.arange(T, dtype=dtype)).to(device)


def right_padded_rows(mf: torch.Tensor) -> bool:
    r"""True when every row of the 0/1 mask ``mf`` (float, ``(B, T)``) is ``1 ... 1 0 ... 0``.

    A row with :math:`L` ones has :math:`S=\sum_t t\,m_t \ge 0+1+\dots+(L-1) = L(L-1)/2`,
    with equality exactly when the ones are the first :math:`L` columns
    (moving any one to the right raises :math:`S`). One matrix-vector product
    and one sum; exact in float32 while :math:`T(T-1)/2 < 2^{24}`
    (:math:`T\le 5792`), in float64 beyond.
    """
    B, T = mf.shape
    if B == 0 or T <= 1:
        return True
    if T > 5792 and mf.dtype != torch.float64:
        mf = mf.double()
    L = mf.sum(-1)
    S2 = torch.mv(mf, _position_weights(T, mf.dtype, mf.device))  # 2 S: even integers below 2^25, exact
    return torch.equal(S2, L * (L - 1))


def compaction_index(mask: torch.Tensor, scratch: bool = False):
    """``(dest, lengths)``: the column of each valid token once a row's valid tokens move to its front.

    ``dest[b, t] = cs[t] - 1`` for a valid token (``cs``: the running count of
    valid tokens of the row), and ``T - 1`` for *every* masked token.
    ``lengths`` (``(B, 1)``, int64) is the number of valid tokens of each row.
    It is not a permutation: it is meant for ``y.zero_().scatter_(-1, dest, x)``
    followed by zeroing column ``T - 1`` of the rows with a masked token
    (``lengths < T``): the masked tokens' values all land in that one column
    and are then discarded, and a row with a masked token has ``L < T``, so
    that column is padding. Putting back is ``y.gather(-1, dest)``: a masked
    token reads column ``T - 1``, 0 on such a row. One cumulative sum and
    three int32 passes (int32 is vectorised on the CPU, int64 is not):
    ``dest = m (cs - T) + T - 1``. With ``scratch``, ``dest`` lives in a
    reused buffer (:func:`_scratch`), valid until the next call.
    """
    B, T = mask.shape
    dev = mask.device
    mu = mask.view(torch.uint8) if mask.dtype == torch.bool else (mask != 0).view(torch.uint8)
    if scratch:
        cs = _scratch("cs", (B, T), torch.int32, dev)
        dest = _scratch("dest", (B, T), torch.int64, dev)
    else:
        cs = torch.empty((B, T), dtype=torch.int32, device=dev)
        dest = torch.empty((B, T), dtype=torch.int64, device=dev)
    torch.cumsum(mu, -1, dtype=torch.int32, out=cs)
    L = cs[:, -1:].long()
    torch.addcmul(_int_scalar(T - 1, dev), cs.sub_(T), mu, out=dest)
    return dest, L


@functools.lru_cache(maxsize=64)
def _int_scalar(v: int, device: torch.device) -> torch.Tensor:
    return torch.tensor(v, dtype=torch.int32).to(device)

