"""Targets for the critic built from rewards: Monte Carlo, TD(0) and n-step.

Derived in :doc:`/chapters/01_value_function_mc` (Monte-Carlo return),
:doc:`/chapters/02_td_targets` (TD target) and :doc:`/chapters/04_nstep` (n-step return).
Conventions (notation page): ``values[..., t]`` is :math:`V(s_t)`, the value of
the state *before* token :math:`t`; after the last valid token the next value
is ``bootstrap`` (0 when EOS ended the episode); masked tokens are skipped.
"""

from __future__ import annotations

from typing import Optional, Union

import torch

from ._engine.docs import padded_conventions
from ._engine.checks import check_positive_int
from ._engine.fastscan import fast_backward_scan, time_invariant_decay
from ._engine.nstep import fast_nstep_returns
from ._engine.problem import Problem, check_outputs, solve, validate
from ._engine.scan import compact, shift_next

FloatOrTensor = Union[float, torch.Tensor]

__all__ = ["discounted_returns", "td_targets", "nstep_returns"]


def _zero(x: torch.Tensor) -> torch.Tensor:
    return torch.zeros((), dtype=x.dtype, device=x.device)


def discounted_returns(
    rewards: torch.Tensor,
    *,
    mask: Optional[torch.Tensor] = None,
    gamma: FloatOrTensor = 1.0,
    bootstrap: Optional[FloatOrTensor] = None,
) -> torch.Tensor:
    r"""Monte-Carlo return :math:`G_t=\sum_{k=t}^{T}\gamma^{k-t} r_k + \gamma^{T-t+1} V(s_{T+1})`.

    Equation :eq:`eq-mc-return` of chapter 1, computed through its recursion
    :math:`G_t = r_t + \gamma_t G_{t+1}` :eq:`eq-mc-recursion` with
    :math:`G_{T+1}` = ``bootstrap``, without a Python loop over tokens: for
    a numeric ``gamma`` on a CPU, one pass of the C kernel
    (:mod:`valuelab._engine.native`), else the blocked scan of chapter 9.

    Conventions: the reward-model score is the reward of the last valid
    token (:func:`valuelab.kl_shaped_rewards` puts it there,
    :func:`valuelab.last_token_onehot` finds the slot), so every :math:`G_t`
    of a row contains its discounted score; ``bootstrap`` is
    :math:`V(s_{T+1})`, the value after each row's last valid token: a float
    for every row or a tensor of shape ``rewards.shape[:-1]`` (one per row),
    default 0 (after EOS; give it for a response cut at the length limit).
    Nothing is detached: a ``bootstrap`` read from the live critic
    (``requires_grad``) gives returns that carry its gradient; detach it
    when the returns are targets.

    Args:
        rewards: per-token rewards, shape ``(T,)`` or ``(B, T)``, float.
        mask: 1/True on generated tokens; masked tokens are skipped (no reward,
            no discount) and get return 0.
        gamma: discount in [0, 1]; a float or a tensor broadcastable to
            ``rewards`` (``(B, 1)`` per sequence, ``(B, T)`` per step, where
            ``gamma[t]`` discounts everything after token ``t``).
        bootstrap: value of the state after the last valid token (default 0).

    Returns:
        Tensor of ``rewards``' shape, dtype and device.

    Example::

        >>> import torch, valuelab as vl
        >>> r = torch.tensor([0., 0., 1.])  # the score on the last token
        >>> vl.discounted_returns(r, gamma=0.5)
        tensor([0.2500, 0.5000, 1.0000])
    """
    p = validate(rewards, None, mask, gamma, bootstrap, need_values=False)
    return p.out(solve(p, _general_returns)[1])


def _general_returns(p: Problem):
    """``(None, G)`` of :func:`discounted_returns` on the general (differentiable) path."""
    c = compact(p)
    valid = c.packed.valid
    zero = _zero(c.rewards)
    tail = shift_next(torch.zeros_like(c.rewards), valid, c.bootstrap)  # bootstrap at the last token only
    x = torch.where(valid, c.rewards + c.gamma * tail, zero)
    d = torch.where(valid, c.gamma, zero)
    k = time_invariant_decay(x, c.gamma_factor)
    return None, c.packed.put(fast_backward_scan(x, d if k is None else k))


@padded_conventions("the targets")
def td_targets(
    rewards: torch.Tensor,
    values: torch.Tensor,
    *,
    mask: Optional[torch.Tensor] = None,
    gamma: FloatOrTensor = 1.0,
    bootstrap: Optional[FloatOrTensor] = None,
) -> torch.Tensor:
    r"""TD(0) target :math:`r_t + \gamma V(s_{t+1})`, equation :eq:`eq-td-target` of chapter 2.

    ``values`` should come from the frozen (old) critic :math:`V_{\bar\phi}`.
    Past the last valid token :math:`V(s_{T+1})` is ``bootstrap``; masked
    tokens are skipped and get 0. Arguments as in :func:`discounted_returns`.

    {conventions}

    Example::

        >>> import torch, valuelab as vl
        >>> r, v = torch.tensor([0., 0., 1.]), torch.tensor([0.5, 0.6, 0.8])
        >>> vl.td_targets(r, v, bootstrap=0.5)  # cut at the length limit
        tensor([0.6000, 0.8000, 1.5000])
    """
    p = validate(rewards, values, mask, gamma, bootstrap, need_values=True)
    c = compact(p)
    y = c.out(c.rewards + c.gamma * shift_next(c.values, c.packed.valid, c.bootstrap))
    check_outputs(p, {"TD targets": y})
    return y


@padded_conventions("the returns")
def nstep_returns(
    rewards: torch.Tensor,
    values: torch.Tensor,
    n: int,
    *,
    mask: Optional[torch.Tensor] = None,
    gamma: FloatOrTensor = 1.0,
    bootstrap: Optional[FloatOrTensor] = None,
) -> torch.Tensor:
    r"""n-step return :math:`G_t^{(n)}=\sum_{k=t}^{t+n-1}\gamma^{k-t}r_k+\gamma^n V(s_{t+n})`.

    Equation :eq:`eq-nstep-return` of chapter 4. When :math:`t+n > T+1` the
    window runs past the end and the return is the Monte-Carlo return plus
    the discounted ``bootstrap``. Computed through
    :math:`G^{(k)}_t = r_t + \gamma_t G^{(k-1)}_{t+1}`, :math:`G^{(0)}_t = V(s_t)`.
    ``n = 1`` is :func:`td_targets`. Other arguments as in :func:`td_targets`.

    {conventions}

    Example::

        >>> import torch, valuelab as vl
        >>> r, v = torch.tensor([0., 0., 1.]), torch.tensor([0.5, 0.6, 0.8])
        >>> vl.nstep_returns(r, v, 2)  # r_t + r_{t+1} + V(s_{t+2})
        tensor([0.8000, 1.0000, 1.0000])
    """
    n = check_positive_int(n, "n")
    p = validate(rewards, values, mask, gamma, bootstrap, need_values=True)
    c = compact(p)
    y = c.out(fast_nstep_returns(c.rewards, c.values, c.gamma, c.packed.valid, c.bootstrap, n))
    check_outputs(p, {"n-step returns": y})
    return y

