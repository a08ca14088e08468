r"""The backward scan without a Python loop over tokens (derived in ``chapters/09_fast_gae``).

Every return and advantage of :mod:`valuelab` is the backward linear recursion

.. math::  y_t = x_t + d_t\, y_{t+1},\qquad y_T = 0,\qquad d_t\in[0,1]

``(eq-fast-scan)`` on compacted, right-padded ``(B, T)`` rows (:mod:`valuelab._scan`).
:func:`valuelab._scan.backward_scan` solves it with one Python iteration per
token; this module solves it with a number of tensor operations that does not
grow with ``T`` (only with :math:`\log T`), and never divides by a product of
decays: every coefficient is a product :math:`d_t d_{t+1}\cdots d_{j-1}\in[0,1]`
computed by multiplication only, so nothing overflows, and a coefficient that
underflows to 0 is one whose contribution is below the float resolution anyway.

Two algorithms, chosen by the shape of ``d`` (see :func:`fast_backward_scan`):

* **constant decay** :math:`d_t = c` (a float, a 0-dim tensor, or one value per
  row): the *blocked Toeplitz* form. Cut the row into blocks of :math:`C`
  tokens. Inside block :math:`k`, unrolling the recursion gives

  .. math::  y^{(k)}_i = \sum_{j\ge i} c^{\,j-i} x^{(k)}_j + c^{\,C-i}\, y^{(k+1)}_0

  ``(eq-fast-block)``, i.e. ``y_blk = x_blk @ M.T + carry * q`` with the fixed upper-triangular
  Toeplitz matrix :math:`M_{ij} = c^{j-i}` (:math:`j\ge i`) and
  :math:`q_i = c^{C-i}`. The carries :math:`Y_k = y^{(k)}_0` obey the *same*
  recursion on the block summaries :math:`s_k = (x^{(k)} M^\top)_0`:
  :math:`Y_k = s_k + c^C\,Y_{k+1}` ``(eq-fast-carry)``, of length
  :math:`T/C`, solved by the same blocked form; after
  :math:`\lceil\log_C T\rceil` levels it fits in one block. One matrix
  product and one rank-one update per level: the work is :math:`O(BTC)` flops
  on the first level and almost nothing after.

* **per-step decay** :math:`d_t` (per-step :math:`\gamma_t` or
  :math:`\lambda_t`): the *blocked doubling* form. The recursion composes
  affine maps :math:`f_t(y) = x_t + d_t y`, and
  :math:`(x_1, d_1)\circ(x_2, d_2) = (x_1 + d_1 x_2,\ d_1 d_2)` is associative,
  so inside a block :math:`\log_2 C` Hillis--Steele doubling steps give every
  token's map to the end of its block (``(eq-fast-doubling)``); the block
  summaries again satisfy the recursion, solved recursively, and one
  multiply-add puts the carries in.

Both agree with the loop to float rounding (tested in ``tests/test_fastscan.py``
for :math:`c\in\{0, 10^{-8}, 0.5, 0.999, 1\}` and :math:`T` up to 100 000).
:func:`_naive_rescaled_scan`, the "closed form with a cumulative sum"
:math:`y_t = c^{-t}\sum_{j\ge t} c^{j}x_j`, is kept only to show in the chapter
why it cannot be used: :math:`c^{-t}` overflows and :math:`c^{j}` underflows.

The module also has the loop-free helpers for the rest of the package: the
O(T) replacement of the argsort in :func:`valuelab._scan.pack`
(:func:`valid_first_order`), the right-padding test
(:func:`right_padded_rows`: one matrix-vector product), and the n-step
return by sparse-table doubling (:func:`fast_nstep_returns`).

**The fused estimators.** :func:`fused_returns` is what :func:`valuelab.gae`
and :func:`valuelab.discounted_returns` run when γ and λ are numbers. On a
CPU it hands the whole job to the C kernel (:mod:`valuelab._native`: one
pass, ``(eq-fast-vector-scan)``) when that is available; otherwise (a GPU,
no C compiler, ``VALUELAB_NATIVE=0``) it computes, in PyTorch, the
λ-return recursion :math:`G_t = r_t + \gamma(1-\lambda)V_{t+1} + \gamma\lambda G_{t+1}`
(``(eq-fast-lambda-return)``) scanned once, without a TD-error pass; a mask
with holes compacted by a cumulative sum and one scatter
(:func:`compaction_index`, ``(eq-fast-u-form)``) and put back by one gather;
intermediate results in per-thread scratch buffers reused between calls
(:func:`_scratch`, :func:`clear_scratch`), because on the CPU a fresh
MB-sized temporary costs page faults worth several passes over it. The
benchmark (``python -m valuelab.bench``) and ``chapters/09_fast_gae`` give
the numbers.
"""

from __future__ import annotations

import functools
import numbers
import threading
from typing import Callable, Optional, Union

import numpy as np
import torch

from . import _native
from ._checks import sum_is_finite

__all__ = [
    "fast_backward_scan",
    "time_invariant_decay",
    "fast_nstep_returns",
    "valid_first_order",
    "float_mask",
    "right_padded_rows",
    "compaction_index",
    "fused_returns",
    "clear_scratch",
]

Decay = Union[float, torch.Tensor]

# Block length of the constant-decay form (first level): the matrix product costs
# C flops per token, the recursion depth is log_C(T). 16 is the fastest on CPU
# (AVX-512 sgemm) and on GPU the level count, not the flops, dominates.
_BLOCK = 16
# A row this short is solved with one (T, T) Toeplitz product, no recursion.
_BASE = 128
# The carries of the fused estimators (one per block) use one direct Toeplitz product up to this many.
_CARRY_DIRECT = _BASE
# Block length of the per-step form: log2(C) doubling steps per level.
_BLOCK_STEP = 32


# ---------------------------------------------------------------------------
# public entry point
# ---------------------------------------------------------------------------


def fast_backward_scan(x: torch.Tensor, d: Decay) -> torch.Tensor:
    r"""Solve :math:`y_t = x_t + d_t\,y_{t+1}`, :math:`y_T = 0` along the last axis, without a loop over tokens.

    Equation ``(eq-fast-scan)``, derived in ``chapters/09_fast_gae``; the same
    contract as :func:`valuelab._scan.backward_scan` (whose result it matches to
    float rounding) with one extension: ``d`` says by its *shape* whether the
    decay changes along time.

    Args:
        x: ``(B, T)`` float32 or float64 tensor, CPU or CUDA (``(T,)`` is
            accepted too). ``B = 0`` and ``T = 0`` are allowed.
        d: the decay, in [0, 1]. One of

            * a Python float, or a 0-dim tensor: the same :math:`c` at every
              step of every row (blocked Toeplitz form);
            * a tensor of shape ``(B, 1)`` (or ``(1, 1)``): one :math:`c_b` per
              row (blocked Toeplitz form, one matrix per row);
            * a tensor of shape ``(B, T)`` (or anything broadcastable to it
              whose last dimension is ``T``): a decay per step (blocked
              doubling form).

            A tensor ``d`` is cast to ``x``'s dtype and device. It is not
            checked (that would cost a device sync): the estimators check
            :math:`\gamma,\lambda\in[0,1]` before calling. A float ``d`` outside
            [0, 1] raises :class:`ValueError`.

    Returns:
        ``y`` with ``x``'s shape, dtype and device.

    Note:
        With right-padded rows whose ``x`` is 0 on the padding (what every
        estimator builds), the masked decay ``gamma * lam * valid`` and the
        plain scalar ``gamma * lam`` give the same ``y`` on the valid tokens,
        and 0 on the padding: past the last valid token there is nothing left
        to discount. So the estimators pass the scalar (see
        :func:`time_invariant_decay`) and get the fast form.

    Never divides by a product of decays: constant decays only enter through
    :math:`c^k` (computed in float64, then rounded once; powers below the
    smallest normal float become 0), per-step decays only through products.
    """
    if not isinstance(x, torch.Tensor) or not torch.is_floating_point(x):
        raise TypeError("x must be a floating torch.Tensor")
    if x.dim() == 1:
        return fast_backward_scan(x.unsqueeze(0), _row_decay_1d(d)).squeeze(0)
    if x.dim() != 2:
        raise ValueError(f"x must have shape (B, T) or (T,), got {tuple(x.shape)}")
    B, T = x.shape
    if B == 0 or T == 0:
        return torch.empty_like(x)
    if isinstance(d, bool):
        raise TypeError("d must be a float or a tensor, not bool")
    if isinstance(d, numbers.Real):
        c = float(d)
        if not 0.0 <= c <= 1.0:
            raise ValueError(f"a constant decay must lie in [0, 1], got {c}")
        if x.dtype != torch.float64:  # the loop multiplies by c held in x's dtype: so do we
            c = torch.tensor(c, dtype=x.dtype).item()
        return _toeplitz_scan(x, c)
    if not isinstance(d, torch.Tensor):
        raise TypeError(f"d must be a float or a torch.Tensor, got {type(d).__name__}")
    if d.dim() == 0 or d.numel() == 1:
        if d.device.type == "cpu":  # reading it costs nothing: use the cached float path
            return _toeplitz_scan(x, float(d.to(x.dtype)))
        return _toeplitz_scan(x, d.reshape(()).to(device=x.device, dtype=x.dtype).double())
    if d.dim() == 2 and d.shape[-1] == 1 and d.shape[0] in (1, B):
        c = d.to(device=x.device, dtype=x.dtype).double().expand(B, 1).reshape(B, 1, 1)
        return _toeplitz_scan(x, c)
    try:
        dd = torch.broadcast_to(d.to(device=x.device, dtype=x.dtype), x.shape)
    except RuntimeError:
        raise ValueError(
            f"d of shape {tuple(d.shape)} is neither a scalar, (B, 1), nor broadcastable to x {tuple(x.shape)}"
        ) from None
    return _affine_scan(x.contiguous(), dd.contiguous())


def _row_decay_1d(d: Decay) -> Decay:
    """The decay of a ``(T,)`` problem, re-shaped for the ``(1, T)`` one."""
    if isinstance(d, torch.Tensor) and d.dim() >= 1:
        return d.reshape(1, -1) if d.numel() != 1 else d.reshape(())
    return d


# ---------------------------------------------------------------------------
# constant decay: the blocked Toeplitz form (eq-fast-block)
# ---------------------------------------------------------------------------


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


def _toeplitz_scan(x: torch.Tensor, c) -> torch.Tensor:
    """``(eq-fast-block)`` for ``x`` of shape ``(B, T)``, ``T >= 1``.

    ``c`` is a float, a float64 0-dim tensor, or a float64 ``(B, 1, 1)`` tensor.
    """
    B, T = x.shape
    per_row = isinstance(c, torch.Tensor) and c.dim() == 3
    # one block: y = x @ M.T. A float c has its (cached) matrices up to _BASE; a tensor
    # c (not readable without a device sync) builds them on every call: keep them C x C.
    if T <= (_BASE if isinstance(c, float) else _BLOCK):
        mt, _ = _toeplitz_factors(c, T, x.dtype, x.device)
        if per_row:
            return torch.bmm(x.unsqueeze(1), mt).squeeze(1)
        return x @ mt
    C = _BLOCK
    nb = -(-T // C)
    if nb * C != T:  # right-pad with zeros: y is 0 there and the result is unchanged
        x = torch.nn.functional.pad(x, (0, nb * C - T))
    mt, q = _toeplitz_factors(c, C, x.dtype, x.device)
    xb = x.reshape(B, nb, C)
    z = torch.matmul(xb, mt)  # local solutions, every block as if it ended the row
    # carries: Y_k = s_k + c^C Y_{k+1}  (eq-fast-carry), the same problem T/C long
    Y = _toeplitz_scan(z[..., 0].contiguous(), _pow_scalar(c, C))
    carry = torch.nn.functional.pad(Y[:, 1:], (0, 1))  # y at the start of the next block; 0 after the last
    if per_row:
        z.baddbmm_(carry.unsqueeze(-1), q)  # z += carry (x) q, one rank-one update per row
    else:
        z.addcmul_(carry.unsqueeze(-1), q)  # z += carry (x) q (a broadcast multiply-add)
    y = z.view(B, nb * C)
    return y if nb * C == T else y[:, :T]


# ---------------------------------------------------------------------------
# per-step decay: blocked doubling over affine maps (eq-fast-doubling)
# ---------------------------------------------------------------------------


def _doubling(X: torch.Tensor, D: torch.Tensor, need_d: bool):
    """Compose each token's map with the following ones up to the end of its row (last axis).

    After the step with offset ``s`` the pair at ``t`` is the map of tokens
    ``t .. t+2s-1``: ``X[t] += D[t] * X[t+s]`` and ``D[t] *= D[t+s]`` (only
    products, never a division). Past the end of the row the identity map
    ``(0, 1)`` is used, i.e. the last ``s`` entries stay as they are. Returns
    ``X`` (the solution with zero beyond the row) and, when ``need_d``, ``D``
    (the product of ``d`` from ``t`` to the end of the row).
    """
    n = X.shape[-1]
    if torch.is_grad_enabled() and (X.requires_grad or D.requires_grad):
        return _doubling_autograd(X, D)
    s = 1
    while s < n:
        k = n - s
        Xn = torch.empty_like(X)
        torch.addcmul(X[..., :k], D[..., :k], X[..., s:], out=Xn[..., :k])
        Xn[..., k:] = X[..., k:]
        if need_d or 2 * s < n:
            Dn = torch.empty_like(D)
            torch.mul(D[..., :k], D[..., s:], out=Dn[..., :k])
            Dn[..., k:] = D[..., k:]
            D = Dn
        X = Xn
        s *= 2
    return X, D


def _doubling_autograd(X: torch.Tensor, D: torch.Tensor):
    """:func:`_doubling` without ``out=`` (which autograd does not support); one extra copy per step."""
    n = X.shape[-1]
    s = 1
    while s < n:
        k = n - s
        X = torch.cat([torch.addcmul(X[..., :k], D[..., :k], X[..., s:]), X[..., k:]], dim=-1)
        D = torch.cat([D[..., :k] * D[..., s:], D[..., k:]], dim=-1)
        s *= 2
    return X, D


def _affine_scan(x: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
    """``(eq-fast-scan)`` with a per-step ``d``; both ``(B, T)`` contiguous, ``T >= 1``."""
    B, T = x.shape
    C = _BLOCK_STEP
    if T <= C:
        return _doubling(x, d, need_d=False)[0]
    nb = -(-T // C)
    if nb * C != T:
        x = torch.nn.functional.pad(x, (0, nb * C - T))
        d = torch.nn.functional.pad(d, (0, nb * C - T))
    X, D = _doubling(x.reshape(B, nb, C), d.reshape(B, nb, C), need_d=True)
    # block summaries obey the same recursion: Y_k = X_k[0] + D_k[0] * Y_{k+1}
    Y = _affine_scan(X[..., 0].contiguous(), D[..., 0].contiguous())
    carry = torch.nn.functional.pad(Y[:, 1:], (0, 1))
    X = X.addcmul(D, carry.unsqueeze(-1))  # y = X_local + (product to block end) * y at next block start
    y = X.view(B, nb * C)
    return y if nb * C == T else y[:, :T]


# ---------------------------------------------------------------------------
# helpers for the estimators
# ---------------------------------------------------------------------------


def time_invariant_decay(like: torch.Tensor, *factors) -> Optional[Decay]:
    r"""The product of ``factors`` (e.g. ``gamma, lam``) in the compact form :func:`fast_backward_scan` takes, or None.

    Each factor is what the user passed to an estimator: a float, or a tensor
    broadcastable to the data. When every factor is constant along time (a
    float, a 0-dim tensor, or a tensor whose last dimension is 1, e.g.
    ``(B, 1)``), returns the product -- a float, a 0-dim tensor or a ``(B, 1)``
    tensor -- rounded to ``like.dtype`` exactly as the loop's ``gamma * lam``
    is; otherwise returns None and the caller passes the per-step decay. Call
    it after the arguments have been checked.
    """
    dtype, device = like.dtype, like.device
    floats = []
    tensors = []
    for f in factors:
        if isinstance(f, numbers.Real) and not isinstance(f, bool):
            floats.append(float(f))
        elif isinstance(f, torch.Tensor) and (f.dim() == 0 or f.shape[-1] == 1):
            tensors.append(f.to(device=device, dtype=dtype).reshape(-1, 1) if f.dim() > 0 else f.to(device=device, dtype=dtype))
        else:
            return None
    if not tensors:
        out = torch.tensor(floats[0] if floats else 1.0, dtype=dtype)
        for v in floats[1:]:
            out = out * torch.tensor(v, dtype=dtype)
        return float(out)
    out = tensors[0]
    for v in floats:
        out = out * torch.tensor(v, dtype=dtype, device=device)
    for t in tensors[1:]:
        out = out * t
    if out.dim() == 2 and like.dim() == 2 and out.shape[0] not in (1, like.shape[0]):
        return None
    return out


def fast_nstep_returns(
    rewards: torch.Tensor,
    values: torch.Tensor,
    gamma: torch.Tensor,
    valid: torch.Tensor,
    bootstrap: torch.Tensor,
    n: int,
) -> torch.Tensor:
    r"""n-step return :math:`G^{(n)}_t = f_t\circ\cdots\circ f_{t+n-1}(V_{t+n})` by sparse-table doubling.

    Equation ``(eq-nstep-return)`` of chapter 4, loop-free form derived in
    ``chapters/09_fast_gae``. On compacted rows (``valid`` right-padded), with
    :math:`f_t(y) = r_t + \gamma_t y` on valid tokens, the identity map after
    the last one, and :math:`V_t` = ``bootstrap`` from the last valid token on.
    The maps of the windows of length :math:`2^j` are built by
    :math:`\lfloor\log_2 n\rfloor` doublings
    :math:`(a, g)_{j+1}[t] = (a_j[t] + g_j[t]\,a_j[t+2^j],\ g_j[t]\,g_j[t+2^j])`
    and the binary digits of ``n`` compose the answer. Every output is the
    defining sum :math:`\sum_k\Gamma_{t,k}r_k + \Gamma_{t,n}V_{t+n}`
    evaluated in another order, with coefficients that are products of
    :math:`\gamma`'s: no division, and no difference of large partial sums.
    (The tempting telescoping :math:`G_t - \Gamma_{t,n}G_{t+n} + \Gamma_{t,n}V_{t+n}`
    through the Monte-Carlo return subtracts two returns that agree in all
    but their first n terms: with :math:`\gamma\approx 1` on long rows the
    difference of two large numbers loses the small one.)

    Args: compacted ``(B, T)`` tensors as :func:`valuelab._scan.prepare`
    builds them (``gamma`` may be a broadcast view), ``bootstrap`` of shape
    ``(B,)``, ``n >= 1``. The result on masked (padding) slots is finite but
    meaningless: the caller zeroes it (``Prepared.out``).
    """
    B, T = rewards.shape
    if B == 0 or T == 0:
        return torch.empty_like(rewards)
    n = min(int(n), T)  # a window past the end of the row meets only identity maps
    zero = torch.zeros((), dtype=rewards.dtype, device=rewards.device)
    one = torch.ones((), dtype=rewards.dtype, device=rewards.device)
    A = torch.where(valid, rewards, zero)  # the map of the window [t, t+1): (a, g)
    G = torch.where(valid, gamma, one)
    RA: Optional[torch.Tensor] = None  # the map of [t, t+off), composed from the bits of n seen so far
    RG: Optional[torch.Tensor] = None
    off = 0
    w = 1
    while w <= n:
        if n & w:  # R <- R o (window of length w starting at t+off); identity past the row
            if RA is None:  # off == 0 here: R is the window itself
                RA, RG = A, G
            else:
                k = T - off
                if k > 0:
                    RA[:, :k].addcmul_(RG[:, :k], A[:, off:])
                    RG[:, :k].mul_(G[:, off:])
            off += w
        if 2 * w <= n:  # windows of length w -> 2w
            k = T - w
            A2, G2 = A.clone(), G.clone()
            if k > 0:
                A2[:, :k].addcmul_(G[:, :k], A[:, w:])
                G2[:, :k].mul_(G[:, w:])
            A, G = A2, G2  # (R may hold the old A, G: from now on it is their only owner)
        w *= 2
    # apply R to the value after the window: V_{t+n}, the bootstrap from the last valid token on.
    # RA, RG are tensors made here (where / clone), so they are updated in place.
    boot = bootstrap.reshape(B, 1).to(rewards.dtype)
    k = T - n
    if k > 0:
        RA[:, :k].addcmul_(RG[:, :k], torch.where(valid[:, n:], values[:, n:], boot))
    RA[:, k:].addcmul_(RG[:, k:], boot)
    return RA


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


# ---------------------------------------------------------------------------
# masks without argsort, and the fused estimators (gae, discounted_returns)
# ---------------------------------------------------------------------------

_WORKSPACE = threading.local()
# At most this many bytes of scratch are kept per thread (beyond, scratch is allocated per call):
# enough for a (64, 32768) float64 batch with holes.
_WORKSPACE_BYTES = 128 << 20


def _scratch(name: str, shape, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
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


def _padded_len(T: int) -> int:
    """Columns of the work buffer: ``T`` rounded up to whole blocks when the blocked form is used."""
    return T if T <= _BASE else -(-T // _BLOCK) * _BLOCK


def _scan_into(x: torch.Tensor, c: float, out: torch.Tensor) -> None:
    """``out = y[:, :T]`` for ``y`` = :func:`_toeplitz_scan` of ``x`` ``(B, Tp)`` (float ``c``); ``out`` may be ``x``.

    The first level is written straight into ``out`` (no padded result, no
    copy); its matrix product goes to a reused scratch buffer.
    """
    B, Tp = x.shape
    T = out.shape[1]
    if Tp <= _BASE:
        mt, _ = _toeplitz_factors_cached(c, Tp, x.dtype, x.device)
        y = torch.mm(x, mt, out=_scratch("z", (B, Tp), x.dtype, x.device))
        out.copy_(y if T == Tp else y[:, :T])
        return
    C = _BLOCK
    nb = Tp // C
    mt, q = _toeplitz_factors_cached(c, C, x.dtype, x.device)
    z = torch.mm(x.view(B * nb, C), mt, out=_scratch("z", (B * nb, C), x.dtype, x.device)).view(B, nb, C)
    # carries: Y_k = s_k + c^C Y_{k+1} (eq-fast-carry) for the blocks after the first, whose starts
    # enter the block before: one (nb-1)-long Toeplitz product when short, else the blocked form again
    if nb - 1 <= _CARRY_DIRECT:
        Y = z[:, 1:, 0] @ _toeplitz_factors_cached(c**C, nb - 1, x.dtype, x.device)[0]
    else:  # (all nb summaries: a whole number of blocks when C divides nb, no padding)
        Y = _toeplitz_scan(z[:, :, 0], c**C)[:, 1:]
    if T == Tp:
        Y = torch.nn.functional.pad(Y, (0, 1))  # nothing after the last block
        torch.addcmul(z, Y.unsqueeze(-1), q, out=out.view(B, nb, C))
    else:
        full = (nb - 1) * C
        torch.addcmul(z[:, :-1], Y.unsqueeze(-1), q, out=out[:, :full].view(B, nb - 1, C))
        out[:, full:] = z[:, -1, : T - full]


def fused_returns(
    rewards: torch.Tensor,
    values: Optional[torch.Tensor],
    mask: Optional[torch.Tensor],
    gamma: float,
    lam: float,
    bootstrap: Optional[torch.Tensor],
    check_all: Optional[Callable[[], None]] = None,
):
    r"""The λ-return and GAE (or, with ``values=None``, the Monte-Carlo return) end to end, for constant γ and λ.

    On a CPU with the C kernel available (:func:`valuelab._native.scan`), that
    kernel does everything in one pass and the rest of this function does not
    run. Otherwise (a GPU, no compiler, the kernel switched off):
    one scan instead of a TD-error pass, a scan and an add: the λ-return obeys
    its own recursion (``(eq-fast-lambda-return)`` in ``chapters/09_fast_gae``)

    .. math::  G_t = \underbrace{r_t + (\gamma - c)\,V_{t+1}}_{x_t} + c\, G_{t+1},\qquad c=\gamma\lambda,

    with :math:`V_{t+1}` the next *valid* value and, at the last valid token,
    :math:`x = r + \gamma\,\text{bootstrap}` (then :math:`G_{L} = \text{bootstrap}`).
    It is :math:`\hat A_t = \delta_t + c\hat A_{t+1}` with
    :math:`G = \hat A + V` substituted, so :math:`\hat A = G - V` afterwards.
    Rows are zeroed on masked tokens first (``r * m``, ``v * m``), so on
    right-padded rows nothing after the last valid token enters and ``G`` is
    exactly 0 there: no masking of the outputs. A mask with holes is compacted
    by one scatter (two when :math:`\lambda < 1/2`) and the result put back by
    one gather (:func:`compaction_index`); for :math:`\lambda\ge 1/2` the scan
    input is :math:`u = r + (k/c)V` with :math:`k=\gamma-c`, whose scan
    :math:`G'` gives :math:`G = G' - (k/c)V` (``(eq-fast-u-form)``): no shift
    in compacted coordinates, and :math:`k/c = (1-\lambda)/\lambda \le 1`
    amplifies no rounding. Intermediate results live in the two output
    tensors and in reused scratch buffers (:func:`_scratch`).

    Args:
        rewards, values: ``(B, T)``, float32 or float64, same device, finite
            (checked by the caller); ``values`` may be None (Monte-Carlo return).
        mask: bool ``(B, T)`` or None (all valid).
        gamma, lam: Python floats in [0, 1], already rounded to the dtype.
        bootstrap: ``(B,)`` tensor or None (0).
        check_all: called when the inputs may hold a NaN or an inf (their sum
            is not finite: taken during the kernel's pass, or by one reduction
            each on the PyTorch path); it checks them entry by entry and
            raises. None: the caller has checked them.

    Returns:
        ``(advantages, returns)`` (``advantages`` is None without values),
        contiguous ``(B, T)``, exactly 0 on masked tokens.
    """
    B, T = rewards.shape
    dtype, device = rewards.dtype, rewards.device
    with_values = values is not None
    if not with_values:
        c = gamma
    elif dtype == torch.float32:  # the loop's gamma * lam, rounded in float32
        c = float(np.float32(gamma) * np.float32(lam))
    else:
        c = gamma * lam
    native = _native.scan(rewards, values, mask, gamma, c, bootstrap)  # one pass in C, on a CPU
    if native is not None:
        adv_n, ret_n, finite = native
        if not finite and check_all is not None:
            check_all()  # raises on a NaN or an inf entry; a mere overflow of the sum passes
        return adv_n, ret_n
    if check_all is not None and not (sum_is_finite(rewards) and (values is None or sum_is_finite(values))):
        check_all()
    k = gamma - c  # (1 - lam) gamma: the weight of the next value in x
    ret = torch.empty((B, T), dtype=dtype, device=device)
    adv = torch.empty((B, T), dtype=dtype, device=device) if with_values else None
    if B == 0 or T == 0:
        return adv, ret
    Tp = _padded_len(T)
    if Tp == T:
        x = xT = ret
    else:
        x = _scratch("x", (B, Tp), dtype, device)
        x[:, T:] = 0
        xT = x[:, :T]
    shift = with_values and k != 0.0 and T > 1
    lengths = dest = None

    mf = None
    holes = False
    if mask is not None:
        mf = float_mask(mask, dtype, out=adv if with_values else _scratch("mf", (B, T), dtype, device))
        holes = not right_padded_rows(mf)
    a = 0.0  # the u-form below: x = u = r + a v, and G = scan(u) - a v
    if mask is None:  # x = r + k v_next; vz = v
        if shift:
            torch.add(rewards[:, :-1], values[:, 1:], alpha=k, out=x[:, : T - 1])
            x[:, T - 1] = rewards[:, T - 1]
        else:
            xT.copy_(rewards)
        vz = values
    elif not holes:  # right-padded: x = r m + k (v m)_next, vz = v m (in adv)
        if bootstrap is not None:
            lengths = mf.sum(-1, keepdim=True).long()
        torch.mul(rewards, mf, out=xT)
        vz = mf.mul_(values) if with_values else None
        if shift:
            x[:, : T - 1].add_(vz[:, 1:], alpha=k)
    else:  # holes: compact, scan, put back (compaction_index)
        dest, lengths = compaction_index(mask, scratch=True)
        pad_col = (lengths == T).to(dtype)  # column T - 1 holds masked tokens' values unless the row is full

        def compact(src: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
            out.zero_().scatter_(-1, dest, src)
            out[:, T - 1 :].mul_(pad_col)
            return out

        if not shift:
            compact(rewards, xT)
        elif k <= c:
            # lam >= 1/2: G_j = sum_i c^(i-j) (r_i + k v_(i+1)) = scan(r + (k/c) v)_j - (k/c) v_j, so the
            # scan input has no shift in the compacted order and is compacted in one scatter.
            a = k / c
            compact(torch.add(rewards, values, alpha=a, out=_scratch("u", (B, T), dtype, device)), xT)
        else:  # lam < 1/2 (k/c > 1 would amplify rounding): compact r and v, then shift
            rc = compact(rewards, _scratch("rc", (B, T), dtype, device))
            vc = compact(values, _scratch("vc", (B, T), dtype, device))
            torch.add(rc[:, :-1], vc[:, 1:], alpha=k, out=x[:, : T - 1])
            x[:, T - 1] = rc[:, T - 1]
        vz = None
    if bootstrap is not None:
        gb = bootstrap.reshape(B, 1).to(dtype) * gamma
        if lengths is None:  # every row ends at T - 1
            x[:, T - 1 : T] += gb
        else:  # at column L - 1; nothing where L = 0
            x.scatter_add_(1, (lengths - 1).clamp_(min=0), gb * (lengths > 0))
    if dest is None:
        _scan_into(x, c, ret)
        if with_values:
            torch.sub(ret, vz, out=adv)
        return adv, ret
    g = _scratch("g", (B, T), dtype, device)
    _scan_into(x, c, g)
    torch.gather(g, -1, dest, out=ret)  # a masked token reads column T - 1: 0 on a row with a masked token
    if a != 0.0:
        ret.addcmul_(values, mf, value=-a)
    if with_values:
        torch.addcmul(ret, values, mf, value=-1.0, out=adv)  # mf lives in adv: same positions, read first
    return adv, ret


# ---------------------------------------------------------------------------
# the formula the chapter shows failing
# ---------------------------------------------------------------------------


def _naive_rescaled_scan(x: torch.Tensor, c: float) -> torch.Tensor:
    r"""The tempting closed form :math:`y_t = c^{-t}\sum_{j\ge t} c^{j} x_j` (a reversed cumsum). DO NOT USE.

    Exact in real arithmetic for :math:`0 < c \le 1` (multiply the recursion by
    :math:`c^t` and it telescopes), and one cumulative sum long. But in floats
    :math:`c^{-t}` overflows to inf once :math:`t > \log(\text{max float})/\log(1/c)`
    (88.7/0.0513, about 1 730 tokens, for :math:`c = 0.95` in float32; 709.8/0.0513,
    about 13 800, in float64) while :math:`c^{j}` underflows to 0 there, giving
    ``inf * 0 = nan`` and ``inf``. Below that length it is as accurate as the loop:
    the failure is purely one of range. Undefined for :math:`c = 0`
    (:math:`0^{-t}`). Kept only so that ``chapters/09_fast_gae`` and the tests can
    show it fail.
    """
    t = torch.arange(x.shape[-1], dtype=x.dtype, device=x.device)
    cc = torch.tensor(c, dtype=x.dtype, device=x.device)
    scaled = x * torch.pow(cc, t)
    suffix = torch.flip(torch.cumsum(torch.flip(scaled, [-1]), -1), [-1])
    return torch.pow(cc, -t) * suffix
