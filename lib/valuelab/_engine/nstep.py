r"""The n-step return without a loop over tokens: sparse-table doubling (derived in :doc:`/chapters/09_fast_gae`).

:math:`G^{(n)}_t = f_t\circ\cdots\circ f_{t+n-1}(V_{t+n})` with the affine maps
:math:`f_t(y) = r_t + \gamma_t y` (:eq:`eq-nstep-return` of chapter 4). The
maps of the windows of length :math:`2^j` are built by
:math:`\lfloor\log_2 n\rfloor` doublings and the binary digits of ``n``
compose the answer: :math:`O(T\log n)` work in :math:`O(\log n)` tensor
operations. Every step makes new tensors (nothing is updated in place), so
the function is differentiable in every input, reverse and forward mode.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch

__all__ = ["fast_nstep_returns"]


def _then(
    ra: torch.Tensor, rg: torch.Tensor, a: torch.Tensor, g: torch.Tensor, off: int
) -> Tuple[torch.Tensor, torch.Tensor]:
    r"""The map ``(ra, rg)`` of each window followed by the map ``(a, g)`` of the window ``off`` tokens later.

    :math:`(r_a, r_g)\circ(a, g) = (r_a + r_g\,a,\ r_g\,g)`, with the identity
    map :math:`(0, 1)` past the end of the row (the last ``off`` columns keep
    ``(ra, rg)``). New tensors: the inputs are not modified.
    """
    k = ra.shape[-1] - off
    if k <= 0:
        return ra, rg
    return (
        torch.cat([torch.addcmul(ra[:, :k], rg[:, :k], a[:, off:]), ra[:, k:]], dim=-1),
        torch.cat([rg[:, :k] * g[:, off:], rg[:, k:]], dim=-1),
    )


def fast_nstep_returns(
    rewards: torch.Tensor,
    values: torch.Tensor,
    gamma: torch.Tensor,
    valid: torch.Tensor,
    bootstrap: torch.Tensor,
    n: int,
) -> torch.Tensor:
    r"""n-step return :math:`G^{(n)}_t = f_t\circ\cdots\circ f_{t+n-1}(V_{t+n})` by sparse-table doubling.

    Equation :eq:`eq-nstep-return` of chapter 4, loop-free form derived in
    :doc:`/chapters/09_fast_gae`. On compacted rows (``valid`` right-padded), with
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

    Args: compacted ``(B, T)`` tensors as :func:`valuelab._engine.scan.compact`
    builds them (``gamma`` may be a broadcast view), ``bootstrap`` of shape
    ``(B,)``, ``n >= 1``. The result on masked (padding) slots is finite but
    meaningless: the caller zeroes it (``Prepared.out``).
    """
    B, T = rewards.shape
    if B == 0 or T == 0:
        return torch.zeros_like(rewards)
    n = min(int(n), T)  # a window past the end of the row meets only identity maps
    zero = torch.zeros((), dtype=rewards.dtype, device=rewards.device)
    one = torch.ones((), dtype=rewards.dtype, device=rewards.device)
    a = torch.where(valid, rewards, zero)  # the map of the window [t, t+1): (a, g)
    g = torch.where(valid, gamma, one)
    ra: Optional[torch.Tensor] = None  # the map of [t, t+off), composed from the bits of n seen so far
    rg: Optional[torch.Tensor] = None
    off = 0
    w = 1
    while w <= n:
        if n & w:  # R <- R o (window of length w starting at t + off)
            ra, rg = (a, g) if ra is None else _then(ra, rg, a, g, off)
            off += w
        if 2 * w <= n:  # windows of length w -> 2w
            a, g = _then(a, g, a, g, w)
        w *= 2
    # apply R to the value after the window: V_{t+n}, the bootstrap from the last valid token on
    boot = bootstrap.reshape(B, 1).to(rewards.dtype)
    after = torch.cat([torch.where(valid[:, n:], values[:, n:], boot), boot.expand(B, n)], dim=-1)
    return torch.addcmul(ra, rg, after)
