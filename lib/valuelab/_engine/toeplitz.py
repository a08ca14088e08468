r"""Constant decay without a loop over tokens: the blocked Toeplitz form (derived in :doc:`/chapters/09_fast_gae`).

For :math:`y_t = x_t + c\,y_{t+1}`, :math:`y_T = 0` (:eq:`eq-fast-scan` with a
decay :math:`c\in[0,1]` that does not change along time), cut the row into
blocks of :math:`C` tokens. Inside block :math:`k`, unrolling the recursion gives

.. math::  y^{(k)}_i = \sum_{j\ge i} c^{\,j-i} x^{(k)}_j + c^{\,C-i}\, y^{(k+1)}_0

:eq:`eq-fast-block`, i.e. ``y_blk = x_blk @ M.T + carry * q`` with the fixed
upper-triangular Toeplitz matrix :math:`M_{ij} = c^{j-i}` (:math:`j\ge i`)
and :math:`q_i = c^{C-i}`. The carries :math:`Y_k = y^{(k)}_0` obey the *same*
recursion on the block summaries: :math:`Y_k = s_k + c^C\,Y_{k+1}`
:eq:`eq-fast-carry`, of length :math:`T/C`, solved by the same blocked form.
One matrix product and one rank-one update per level. Every coefficient is a
power :math:`c^m\in[0,1]`, computed in float64 and rounded once: nothing is
divided, nothing overflows.

Entry point: :func:`valuelab._engine.fastscan.fast_backward_scan` (which chooses
between this form and :mod:`valuelab._engine.doubling`); :func:`scan_into` is the
variant the PyTorch path of the fused estimators (:mod:`valuelab._engine.blocked`)
writes straight into its output.
"""

from __future__ import annotations

import functools
from typing import Union

import torch

from .workspace import scratch

__all__ = ["BLOCK", "BASE", "toeplitz_scan", "scan_into", "padded_len"]

# Block length (first level): the matrix product costs C flops per token, the recursion
# depth is log_C(T). 16 is the fastest on CPU (AVX-512 sgemm); on GPU the level count,
# not the flops, dominates.
BLOCK = 16
# A row this short is solved with one (T, T) Toeplitz product, no recursion.
BASE = 128
# The carries of scan_into (one per block) use one direct Toeplitz product up to this many.
_CARRY_DIRECT = BASE


def _powers(c: Union[float, torch.Tensor], exps: torch.Tensor) -> torch.Tensor:
    """:math:`c^k` in float64 for integer exponents ``exps`` (float64); ``0**0 = 1``."""
    if isinstance(c, float):
        return torch.pow(torch.tensor(c, dtype=torch.float64, device=exps.device), exps)
    return torch.pow(c, exps)


def _flush(m: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Round float64 coefficients to ``dtype``; those below its smallest normal become 0.

    (Subnormal coefficients would change nothing visible and make CPU kernels slow.)
    """
    m = m.to(dtype)
    return torch.where(m < torch.finfo(dtype).tiny, torch.zeros((), dtype=dtype, device=m.device), m)


def _toeplitz_factors(c, n: int, dtype: torch.dtype, device: torch.device):
    """``Mt`` with ``Mt[j, i] = c^(j-i)`` for ``j >= i`` (the transpose of M) and ``q[i] = c^(n-i)``.

    For a float ``c`` both have shape ``(n, n)`` and ``(n,)``; for a per-row
    ``c`` of shape ``(B, 1, 1)``, ``(B, n, n)`` and ``(B, 1, n)``.
    """
    if isinstance(c, float):
        return _toeplitz_factors_cached(c, n, dtype, device)
    return _build_toeplitz_factors(c, n, dtype, device)


def _build_toeplitz_factors(c, n: int, dtype: torch.dtype, device: torch.device):
    """:func:`_toeplitz_factors`, computed (``c`` a float or a float64 tensor)."""
    k = torch.arange(n, device=device, dtype=torch.float64)
    e = k.unsqueeze(-1) - k  # e[j, i] = j - i
    mt = torch.where(e >= 0, _powers(c, e.clamp(min=0)), torch.zeros((), dtype=torch.float64, device=device))
    q = _powers(c, n - k)
    if not isinstance(c, torch.Tensor) or c.dim() == 0:
        return _flush(mt, dtype), _flush(q, dtype)
    return _flush(mt, dtype), _flush(q, dtype).reshape(c.shape[0], 1, n)


@functools.lru_cache(maxsize=256)
def _toeplitz_factors_cached(c: float, n: int, dtype: torch.dtype, device: torch.device):
    """:func:`_toeplitz_factors` for a float ``c``, kept (the estimators ask for the same few again and again)."""
    return _build_toeplitz_factors(c, n, dtype, device)


def _pow_scalar(c, n: int):
    """:math:`c^n` (float64), for the next level's decay."""
    if isinstance(c, float):
        return c**n  # Python floats are IEEE doubles; 0.0 ** 0 == 1.0
    return torch.pow(c, float(n))


def toeplitz_scan(x: torch.Tensor, c) -> torch.Tensor:
    """:eq:`eq-fast-block` for ``x`` of shape ``(B, T)``, ``T >= 1``.

    ``c`` is a float, a float64 0-dim tensor, or a float64 ``(B, 1, 1)`` tensor.
    """
    B, T = x.shape
    per_row = isinstance(c, torch.Tensor) and c.dim() == 3
    # one block: y = x @ M.T. A float c has its (cached) matrices up to BASE; a tensor
    # c (not readable without a device sync) builds them on every call: keep them C x C.
    if T <= (BASE if isinstance(c, float) else BLOCK):
        mt, _ = _toeplitz_factors(c, T, x.dtype, x.device)
        if per_row:
            return torch.bmm(x.unsqueeze(1), mt).squeeze(1)
        return x @ mt
    C = BLOCK
    nb = -(-T // C)
    if nb * C != T:  # right-pad with zeros: y is 0 there and the result is unchanged
        x = torch.nn.functional.pad(x, (0, nb * C - T))
    mt, q = _toeplitz_factors(c, C, x.dtype, x.device)
    xb = x.reshape(B, nb, C)
    z = torch.matmul(xb, mt)  # local solutions, every block as if it ended the row
    # carries: Y_k = s_k + c^C Y_{k+1}  (eq-fast-carry), the same problem T/C long
    Y = toeplitz_scan(z[..., 0].contiguous(), _pow_scalar(c, C))
    carry = torch.nn.functional.pad(Y[:, 1:], (0, 1))  # y at the start of the next block; 0 after the last
    if per_row:
        z.baddbmm_(carry.unsqueeze(-1), q)  # z += carry (x) q, one rank-one update per row
    else:
        z.addcmul_(carry.unsqueeze(-1), q)  # z += carry (x) q (a broadcast multiply-add)
    y = z.view(B, nb * C)
    return y if nb * C == T else y[:, :T]



def padded_len(T: int) -> int:
    """Columns of the work buffer: ``T`` rounded up to whole blocks when the blocked form is used."""
    return T if T <= BASE else -(-T // BLOCK) * BLOCK


def scan_into(x: torch.Tensor, c: float, out: torch.Tensor) -> None:
    """``out = y[:, :T]`` for ``y`` = :func:`toeplitz_scan` of ``x`` ``(B, Tp)`` (float ``c``); ``out`` may be ``x``.

    The first level is written straight into ``out`` (no padded result, no
    copy); its matrix product goes to a reused scratch buffer.
    """
    B, Tp = x.shape
    T = out.shape[1]
    if Tp <= BASE:
        mt, _ = _toeplitz_factors_cached(c, Tp, x.dtype, x.device)
        y = torch.mm(x, mt, out=scratch("z", (B, Tp), x.dtype, x.device))
        out.copy_(y if T == Tp else y[:, :T])
        return
    C = BLOCK
    nb = Tp // C
    mt, q = _toeplitz_factors_cached(c, C, x.dtype, x.device)
    z = torch.mm(x.view(B * nb, C), mt, out=scratch("z", (B * nb, C), x.dtype, x.device)).view(B, nb, C)
    # carries: Y_k = s_k + c^C Y_{k+1} (eq-fast-carry) for the blocks after the first, whose starts
    # enter the block before: one (nb-1)-long Toeplitz product when short, else the blocked form again
    if nb - 1 <= _CARRY_DIRECT:
        Y = z[:, 1:, 0] @ _toeplitz_factors_cached(c**C, nb - 1, x.dtype, x.device)[0]
    else:  # (all nb summaries: a whole number of blocks when C divides nb, no padding)
        Y = toeplitz_scan(z[:, :, 0], c**C)[:, 1:]
    if T == Tp:
        Y = torch.nn.functional.pad(Y, (0, 1))  # nothing after the last block
        torch.addcmul(z, Y.unsqueeze(-1), q, out=out.view(B, nb, C))
    else:
        full = (nb - 1) * C
        torch.addcmul(z[:, :-1], Y.unsqueeze(-1), q, out=out[:, :full].view(B, nb - 1, C))
        out[:, full:] = z[:, -1, : T - full]

