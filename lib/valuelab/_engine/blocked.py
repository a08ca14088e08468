r"""The PyTorch path of the fused estimators: GAE and the return in a few tensor operations (:doc:`/chapters/09_fast_gae`).

What :func:`valuelab.gae` and :func:`valuelab.discounted_returns` run, for
numeric γ and λ and inputs that need no gradient, on a GPU, or on a CPU where
the C kernel (:mod:`valuelab._engine.native`) is missing or switched off. The
dispatcher (:func:`valuelab._engine.problem.solve`) has validated every argument
and checked finiteness before calling :func:`fused_returns`.
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import torch

from .masks import compaction_index, float_mask, right_padded_rows
from .toeplitz import padded_len, scan_into
from .workspace import scratch as _scratch

__all__ = ["fused_returns", "decay"]


def decay(gamma: float, lam: float, dtype: torch.dtype, with_values: bool) -> float:
    r""":math:`c = \gamma\lambda` as the per-token loop computes it (``gamma * lam`` rounded in ``dtype``), or γ without values."""
    if not with_values:
        return gamma
    if dtype == torch.float32:
        return float(np.float32(gamma) * np.float32(lam))
    return gamma * lam


def fused_returns(
    rewards: torch.Tensor,
    values: Optional[torch.Tensor],
    mask: Optional[torch.Tensor],
    gamma: float,
    lam: float,
    bootstrap: Optional[torch.Tensor],
):
    r"""The λ-return and GAE (or, with ``values=None``, the Monte-Carlo return) end to end, for constant γ and λ.

    The PyTorch path (a GPU, or a CPU without the C kernel of
    :mod:`valuelab._engine.native`, which does the same in one pass):
    one scan instead of a TD-error pass, a scan and an add: the λ-return obeys
    its own recursion (:eq:`eq-fast-lambda-return` in :doc:`/chapters/09_fast_gae`)

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
    :math:`G'` gives :math:`G = G' - (k/c)V` (:eq:`eq-fast-u-form`): no shift
    in compacted coordinates, and :math:`k/c = (1-\lambda)/\lambda \le 1`
    amplifies no rounding. Intermediate results live in the two output
    tensors and in reused scratch buffers (:func:`valuelab._engine.workspace.scratch`).

    Args:
        rewards, values: ``(B, T)``, float32 or float64, same device, finite
            (checked by the caller); ``values`` may be None (Monte-Carlo return).
        mask: canonical bool ``(B, T)`` (bytes 0 and 1) or None (all valid).
        gamma, lam: Python floats in [0, 1], already rounded to the dtype
            (``lam`` is ignored without values).
        bootstrap: ``(B,)`` tensor or None (0).

    Returns:
        ``(advantages, returns)`` (``advantages`` is None without values),
        contiguous ``(B, T)``, exactly 0 on masked tokens.
    """
    B, T = rewards.shape
    dtype, device = rewards.dtype, rewards.device
    with_values = values is not None
    c = decay(gamma, lam, dtype, with_values)
    k = gamma - c  # (1 - lam) gamma: the weight of the next value in x
    ret = torch.empty((B, T), dtype=dtype, device=device)
    adv = torch.empty((B, T), dtype=dtype, device=device) if with_values else None
    if B == 0 or T == 0:
        return adv, ret
    Tp = padded_len(T)
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
        scan_into(x, c, ret)
        if with_values:
            torch.sub(ret, vz, out=adv)
        return adv, ret
    g = _scratch("g", (B, T), dtype, device)
    scan_into(x, c, g)
    torch.gather(g, -1, dest, out=ret)  # a masked token reads column T - 1: 0 on a row with a masked token
    if a != 0.0:
        ret.addcmul_(values, mf, value=-a)
    if with_values:
        torch.addcmul(ret, values, mf, value=-1.0, out=adv)  # mf lives in adv: same positions, read first
    return adv, ret

