r"""The backward scan without a Python loop over tokens (derived in :doc:`/chapters/09_fast_gae`).

Every return and advantage of :mod:`valuelab` is the backward linear recursion

.. math::  y_t = x_t + d_t\, y_{t+1},\qquad y_T = 0,\qquad d_t\in[0,1]

:eq:`eq-fast-scan` on compacted, right-padded ``(B, T)`` rows (:mod:`valuelab._engine.scan`).
:func:`valuelab._engine.scan.backward_scan` solves it with one Python iteration per
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

  :eq:`eq-fast-block`, i.e. ``y_blk = x_blk @ M.T + carry * q`` with the fixed upper-triangular
  Toeplitz matrix :math:`M_{ij} = c^{j-i}` (:math:`j\ge i`) and
  :math:`q_i = c^{C-i}`. The carries :math:`Y_k = y^{(k)}_0` obey the *same*
  recursion on the block summaries :math:`s_k = (x^{(k)} M^\top)_0`:
  :math:`Y_k = s_k + c^C\,Y_{k+1}` :eq:`eq-fast-carry`, of length
  :math:`T/C`, solved by the same blocked form; after
  :math:`\lceil\log_C T\rceil` levels it fits in one block. One matrix
  product and one rank-one update per level: the work is :math:`O(BTC)` flops
  on the first level and almost nothing after.

* **per-step decay** :math:`d_t` (per-step :math:`\gamma_t` or
  :math:`\lambda_t`): the *blocked doubling* form. The recursion composes
  affine maps :math:`f_t(y) = x_t + d_t y`, and
  :math:`(x_1, d_1)\circ(x_2, d_2) = (x_1 + d_1 x_2,\ d_1 d_2)` is associative,
  so inside a block :math:`\log_2 C` Hillis--Steele doubling steps give every
  token's map to the end of its block (:eq:`eq-fast-doubling`); the block
  summaries again satisfy the recursion, solved recursively, and one
  multiply-add puts the carries in.

Both agree with the loop to float rounding (tested in ``tests/test_fastscan.py``
for :math:`c\in\{0, 10^{-8}, 0.5, 0.999, 1\}` and :math:`T` up to 100 000).
:func:`_naive_rescaled_scan`, the "closed form with a cumulative sum"
:math:`y_t = c^{-t}\sum_{j\ge t} c^{j}x_j`, is kept only to show in the chapter
why it cannot be used: :math:`c^{-t}` overflows and :math:`c^{j}` underflows.

Each algorithm has its own module: :mod:`valuelab._engine.toeplitz` (constant
decay), :mod:`valuelab._engine.doubling` (per-step decay), :mod:`valuelab._engine.nstep`
(the n-step return by sparse-table doubling), :mod:`valuelab._engine.masks` (the
O(T) replacement of the argsort in :func:`valuelab._engine.scan.pack`, the
right-padding test, the compaction index), :mod:`valuelab._engine.blocked` (the
PyTorch path of the fused estimators) and :mod:`valuelab._engine.native` (the C
kernel). This module holds the entry point :func:`fast_backward_scan`, the
decay helper :func:`time_invariant_decay` and the formula the chapter shows
failing (:func:`_naive_rescaled_scan`), and re-exports the helpers under
their old names.

**The fused estimators.** :func:`valuelab.gae` and
:func:`valuelab.discounted_returns` with numeric γ and λ are dispatched by
:func:`valuelab._engine.problem.solve`: to the C kernel on a CPU, else to
:func:`valuelab._engine.blocked.fused_returns` (the λ-return recursion
:eq:`eq-fast-lambda-return` scanned once; holes compacted by one scatter,
:eq:`eq-fast-u-form`), else -- tensor γ or λ, or inputs that need
gradients -- to the general path built on :func:`fast_backward_scan`.
The benchmark (``python -m valuelab.bench``) and :doc:`/chapters/09_fast_gae`
give the numbers.
"""

from __future__ import annotations

import numbers
from typing import Optional, Union

import torch

from .blocked import fused_returns
from .checks import dense, traced
from .doubling import affine_scan as _affine_scan
from .masks import compaction_index, float_mask, right_padded_rows, valid_first_order
from .nstep import fast_nstep_returns
from .toeplitz import BASE as _BASE  # noqa: F401  (chapter 9 glues the block sizes)
from .toeplitz import BLOCK as _BLOCK  # noqa: F401
from .toeplitz import toeplitz_scan as _toeplitz_scan
from .workspace import clear_scratch

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


def fast_backward_scan(x: torch.Tensor, d: Decay) -> torch.Tensor:
    r"""Solve :math:`y_t = x_t + d_t\,y_{t+1}`, :math:`y_T = 0` along the last axis, without a loop over tokens.

    Equation :eq:`eq-fast-scan`, derived in :doc:`/chapters/09_fast_gae`; the same
    contract as :func:`valuelab._engine.scan.backward_scan` (whose result it matches to
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
    d = dense(d, "d")  # a meta tensor has no value to read (float(d) below)
    if d.dim() == 0 or d.numel() == 1:
        if d.device.type == "cpu" and not traced(d):  # reading it costs nothing: the cached float path
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



def time_invariant_decay(like: torch.Tensor, *factors) -> Optional[Decay]:
    r"""The product of ``factors`` (e.g. ``gamma, lam``) in the compact form :func:`fast_backward_scan` takes, or None.

    Each factor is what the user passed to an estimator (a float, or a tensor
    broadcastable to the data) or its validated form
    (:class:`valuelab._engine.problem.Problem`: a float, or a tensor broadcast to the
    data). When every factor is constant along time (a float, a 0-dim tensor,
    a tensor whose last dimension is 1, e.g. ``(B, 1)``, or one broadcast
    along time, stride 0), returns the product -- a float, a 0-dim tensor or a ``(B, 1)``
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
        elif isinstance(f, torch.Tensor) and f.dim() > 0 and f.shape[-1] > 1 and f.stride(-1) == 0:
            tensors.append(f[..., :1].to(device=device, dtype=dtype).reshape(-1, 1))
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


def _naive_rescaled_scan(x: torch.Tensor, c: float) -> torch.Tensor:
    r"""The tempting closed form :math:`y_t = c^{-t}\sum_{j\ge t} c^{j} x_j` (a reversed cumsum). DO NOT USE.

    Exact in real arithmetic for :math:`0 < c \le 1` (multiply the recursion by
    :math:`c^t` and it telescopes), and one cumulative sum long. But in floats
    :math:`c^{-t}` overflows to inf once :math:`t > \log(\text{max float})/\log(1/c)`
    (88.7/0.0513, about 1 730 tokens, for :math:`c = 0.95` in float32; 709.8/0.0513,
    about 13 800, in float64) while :math:`c^{j}` underflows to 0 there, giving
    ``inf * 0 = nan`` and ``inf``. Below that length it is as accurate as the loop:
    the failure is purely one of range. Undefined for :math:`c = 0`
    (:math:`0^{-t}`). Kept only so that :doc:`/chapters/09_fast_gae` and the tests can
    show it fail.
    """
    t = torch.arange(x.shape[-1], dtype=x.dtype, device=x.device)
    cc = torch.tensor(c, dtype=x.dtype, device=x.device)
    scaled = x * torch.pow(cc, t)
    suffix = torch.flip(torch.cumsum(torch.flip(scaled, [-1]), -1), [-1])
    return torch.pow(cc, -t) * suffix
