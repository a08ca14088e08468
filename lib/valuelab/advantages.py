"""Advantages for the policy and λ-returns for the critic: TD errors and GAE.

Derived in ``chapters/04_nstep`` (TD error, n-step telescoping) and
``chapters/05_gae`` (GAE and the λ-return).
"""

from __future__ import annotations

from typing import NamedTuple, Optional, Union

import torch

from ._checks import check_unit_interval
from ._scan import as_batch, backward_scan, prepare, shift_next

FloatOrTensor = Union[float, torch.Tensor]

__all__ = ["td_errors", "gae", "GAEResult"]


class GAEResult(NamedTuple):
    """Output of :func:`gae`."""

    advantages: torch.Tensor
    """:math:`\\hat A_t`, used to train the policy."""
    returns: torch.Tensor
    """:math:`\\hat G_t = \\hat A_t + V_\\text{old}(s_t)`, the λ-return, used to train the critic."""


def td_errors(
    rewards: torch.Tensor,
    values: torch.Tensor,
    *,
    mask: Optional[torch.Tensor] = None,
    gamma: FloatOrTensor = 1.0,
    bootstrap: Optional[FloatOrTensor] = None,
) -> torch.Tensor:
    r"""TD error :math:`\delta_t = r_t + \gamma V(s_{t+1}) - V(s_t)`, equation ``(eq-td-error)`` of chapter 4.

    At the last valid token :math:`V(s_{T+1})` is ``bootstrap`` (0 after EOS),
    so :math:`\delta_T = r_T - V(s_T)`. Masked tokens are skipped and get 0.
    Arguments as in :func:`valuelab.discounted_returns`.
    """
    p = prepare(rewards, values, mask, gamma, bootstrap, need_values=True)
    v_next = shift_next(p.values, p.packed.valid, p.bootstrap)
    return p.out(p.rewards + p.gamma * v_next - p.values)


def gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    *,
    mask: Optional[torch.Tensor] = None,
    gamma: FloatOrTensor = 1.0,
    lam: FloatOrTensor = 0.95,
    bootstrap: Optional[FloatOrTensor] = None,
) -> GAEResult:
    r"""Generalized advantage estimation (Schulman et al., 2016).

    :math:`\hat A_t=\sum_{l=0}^{T-t}(\gamma\lambda)^l\delta_{t+l}`, equation
    ``(eq-gae-closed)`` of chapter 5, computed by the backward recursion
    :math:`\hat A_t = \delta_t + \gamma_t\lambda_t \hat A_{t+1}`
    ``(eq-gae-recursion)``, and the λ-return
    :math:`\hat G_t = \hat A_t + V_\text{old}(s_t)` ``(eq-lambda-return)``.

    ``lam = 0`` gives the TD errors; ``lam = 1`` gives the Monte-Carlo return
    minus the value. ``lam`` is a float or a tensor broadcastable to
    ``rewards`` (``(B, 1)`` per sequence, e.g. a length-adaptive λ). Other
    arguments as in :func:`valuelab.td_errors`. Masked tokens get 0 in both
    outputs; the recursion carries over holes.
    """
    p = prepare(rewards, values, mask, gamma, bootstrap, need_values=True)
    lam_t = p.packed.take(as_batch(check_unit_interval(lam, "lam", rewards)))
    valid = p.packed.valid
    zero = torch.zeros((), dtype=p.rewards.dtype, device=p.rewards.device)
    v_next = shift_next(p.values, valid, p.bootstrap)
    delta = torch.where(valid, p.rewards + p.gamma * v_next - p.values, zero)
    adv = backward_scan(delta, torch.where(valid, p.gamma * lam_t, zero))
    return GAEResult(p.out(adv), p.out(adv + p.values))

