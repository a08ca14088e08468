"""Advantages for the policy and λ-returns for the critic: TD errors and GAE.

Derived in :doc:`/chapters/04_nstep` (TD error, n-step telescoping) and
:doc:`/chapters/05_gae` (GAE and the λ-return).
"""

from __future__ import annotations

from typing import NamedTuple, Optional, Union

import torch

from ._engine.docs import padded_conventions
from ._engine.checks import check_nonnegative_scalar, dense, renamed
from ._engine.fastscan import fast_backward_scan, time_invariant_decay
from ._engine.problem import Problem, check_outputs, fast_gae, solve, validate
from ._engine.scan import compact, shift_next

FloatOrTensor = Union[float, torch.Tensor]

__all__ = ["td_errors", "gae", "GAEResult", "decoupled_gae", "DecoupledGAE", "length_adaptive_lam"]


class GAEResult(NamedTuple):
    """Output of :func:`gae`."""

    advantages: torch.Tensor
    """:math:`\\hat A_t`, used to train the policy."""
    returns: torch.Tensor
    """:math:`\\hat G_t = \\hat A_t + V_\\text{old}(s_t)`, the λ-return, used to train the critic."""


@padded_conventions("the TD errors")
def td_errors(
    rewards: torch.Tensor,
    values: torch.Tensor,
    *,
    mask: Optional[torch.Tensor] = None,
    gamma: FloatOrTensor = 1.0,
    bootstrap: Optional[FloatOrTensor] = None,
) -> torch.Tensor:
    r"""TD error :math:`\delta_t = r_t + \gamma V(s_{t+1}) - V(s_t)`, equation :eq:`eq-td-error` of chapter 4.

    At the last valid token :math:`V(s_{T+1})` is ``bootstrap`` (0 after EOS),
    so :math:`\delta_T = r_T - V(s_T)`. Masked tokens are skipped and get 0.
    Arguments as in :func:`valuelab.discounted_returns`.

    {conventions}

    Example::

        >>> import torch, valuelab as vl
        >>> r, v = torch.tensor([0., 0., 1.]), torch.tensor([0.5, 0.6, 0.8])
        >>> vl.td_errors(r, v)  # r_t + V(s_{t+1}) - V(s_t); V(s_3) = 0
        tensor([0.1000, 0.2000, 0.2000])
    """
    p = validate(rewards, values, mask, gamma, bootstrap, need_values=True)
    c = compact(p)
    y = c.out(c.rewards + c.gamma * shift_next(c.values, c.packed.valid, c.bootstrap) - c.values)
    check_outputs(p, {"TD errors": y})
    return y


@padded_conventions("the advantages and the returns")
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
    :eq:`eq-gae-closed` of chapter 5, computed by the backward recursion
    :math:`\hat A_t = \delta_t + \gamma_t\lambda_t \hat A_{t+1}`
    :eq:`eq-gae-recursion`, and the λ-return
    :math:`\hat G_t = \hat A_t + V_\text{old}(s_t)` :eq:`eq-lambda-return`.

    ``lam = 0`` gives the TD errors; ``lam = 1`` gives the Monte-Carlo return
    minus the value. ``lam`` is a float or a tensor broadcastable to
    ``rewards`` (``(B, 1)`` per sequence, e.g. a length-adaptive λ). Other
    arguments as in :func:`valuelab.td_errors`. Masked tokens get 0 in both
    outputs; the recursion carries over holes.

    No Python loop over tokens: for numeric ``gamma`` and ``lam``, on a CPU,
    one pass of a C kernel (:mod:`valuelab._engine.native`, :eq:`eq-fast-vector-scan`
    of chapter 9); on a GPU or without a C compiler the λ-return is scanned
    in blocks by matrix products (``valuelab._engine.blocked.fused_returns``,
    :eq:`eq-fast-lambda-return` and :eq:`eq-fast-block`); for tensor
    ``gamma`` or ``lam``, a dtype other than float32/64, or inputs that
    need gradients, the TD errors are scanned by
    ``valuelab._engine.fastscan.fast_backward_scan``;
    :func:`valuelab._engine.problem.solve` chooses. The results equal the
    recursion's to float rounding.

    {conventions}

    Example::

        >>> import torch, valuelab as vl
        >>> r, v = torch.tensor([0., 0., 1.]), torch.tensor([0.5, 0.6, 0.8])
        >>> vl.gae(r, v, gamma=1.0, lam=1.0)  # λ = 1: Monte-Carlo returns
        GAEResult(advantages=tensor([0.5000, 0.4000, 0.2000]), returns=tensor([1., 1., 1.]))
    """
    fast = fast_gae(rewards, values, mask, gamma, lam, bootstrap)  # the commonest call, in a few microseconds
    if fast is not None:
        return GAEResult(*fast)
    p = validate(rewards, values, mask, gamma, bootstrap, lam, need_values=True)
    adv, ret = solve(p, _general_gae)
    return GAEResult(p.out(adv), p.out(ret))


def _general_gae(p: Problem):
    """``(advantages, returns)`` of :func:`gae` on the general (differentiable) path: TD errors, then one scan."""
    c = compact(p)
    valid = c.packed.valid
    zero = torch.zeros((), dtype=c.rewards.dtype, device=c.rewards.device)
    v_next = shift_next(c.values, valid, c.bootstrap)
    delta = torch.where(valid, c.rewards + c.gamma * v_next - c.values, zero)
    k = time_invariant_decay(delta, c.gamma_factor, c.lam_factor)
    adv = fast_backward_scan(delta, torch.where(valid, c.gamma * c.lam, zero) if k is None else k)
    return c.packed.put(adv), c.packed.put(adv + c.values)


class DecoupledGAE(NamedTuple):
    """Output of :func:`decoupled_gae`: the actor's advantages and the critic's targets, from two λs."""

    advantages: torch.Tensor
    """:math:`\\hat A_t` with :math:`\\lambda_\\text{actor}`, used to train the policy."""
    returns: torch.Tensor
    """:math:`\\hat G_t` with :math:`\\lambda_\\text{critic}`, used to train the critic."""


@padded_conventions("the advantages and the returns")
def decoupled_gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    *,
    mask: Optional[torch.Tensor] = None,
    gamma: FloatOrTensor = 1.0,
    lam_actor: FloatOrTensor = 0.95,
    lam_critic: FloatOrTensor = 1.0,
    bootstrap: Optional[FloatOrTensor] = None,
) -> DecoupledGAE:
    r"""Decoupled GAE (Yuan et al., 2025): advantages with :math:`\lambda_\text{actor}`, returns with :math:`\lambda_\text{critic}`.

    Equation :eq:`eq-decoupled-gae` of chapter 10. The critic's target with
    :math:`\lambda_\text{critic}=1` is the Monte-Carlo return, free of the
    critic's own bias; the policy keeps a lower-variance
    :math:`\lambda_\text{actor}<1`. ``lam_actor`` may be per sequence, e.g.
    :func:`length_adaptive_lam`. Both outputs come from :func:`gae`; other
    arguments as there.

    {conventions}

    Example::

        >>> import torch, valuelab as vl
        >>> r, v = torch.tensor([0., 0., 1.]), torch.tensor([0.5, 0.6, 0.8])
        >>> vl.decoupled_gae(r, v, lam_actor=0.0, lam_critic=1.0)
        DecoupledGAE(advantages=tensor([0.1000, 0.2000, 0.2000]), returns=tensor([1., 1., 1.]))
    """
    kw = dict(mask=mask, gamma=gamma, bootstrap=bootstrap)
    return DecoupledGAE(renamed(lambda: gae(rewards, values, lam=lam_actor, **kw), "lam", "lam_actor").advantages,
                        renamed(lambda: gae(rewards, values, lam=lam_critic, **kw), "lam", "lam_critic").returns)


def length_adaptive_lam(lengths: torch.Tensor, alpha: float = 0.05) -> torch.Tensor:
    r"""Length-adaptive :math:`\lambda = 1 - 1/(\alpha\, l)` per sequence, clamped to [0, 1] (Yue et al., 2025).

    Equation :eq:`eq-length-adaptive-lam` of chapter 10. ``lengths`` holds the
    number of generated tokens :math:`l` of each sequence (shape ``(B,)``);
    the result has shape ``(B, 1)``, ready for ``gae(..., lam=...)``. It keeps
    :math:`\sum_l \lambda^l \approx \alpha l`, the effective horizon, a fixed
    fraction of the length, so :math:`\lambda^l \to e^{-1/\alpha}`: the
    relative decay is fixed, not removed.

    Conventions: :math:`l` counts the *valid* (generated) tokens of a row,
    ``mask.sum(-1)`` for a ``(B, T)`` mask, not the padded width ``T``; the
    ``(B, 1)`` result broadcasts along time, one λ per sequence, into
    :func:`gae` or :func:`decoupled_gae` (``lam_actor``), whose conventions
    (``values[..., t]`` is :math:`V(s_t)`, the score on the last valid token,
    ``bootstrap``) are the ones that apply.

    Example::

        >>> import torch, valuelab as vl
        >>> lengths = torch.tensor([10, 100])  # generated tokens per sequence
        >>> vl.length_adaptive_lam(lengths, alpha=0.5)  # 1 - 1/(0.5 l)
        tensor([[0.8000],
                [0.9800]])
    """
    if not isinstance(lengths, torch.Tensor):
        raise TypeError(f"lengths must be a torch.Tensor, got {type(lengths).__name__}")
    if lengths.dtype == torch.bool or lengths.is_complex():
        raise TypeError(f"lengths must hold real numbers (int or float), got {lengths.dtype}")
    lengths = dense(lengths, "lengths")
    if lengths.dim() != 1:
        raise ValueError(f"lengths must have shape (B,), got {tuple(lengths.shape)}")
    if lengths.is_floating_point() and lengths.numel() and not bool(torch.isfinite(lengths).all()):
        raise ValueError("lengths must be finite: it contains NaN or inf")
    if lengths.numel() and bool((lengths < 0).any()):
        raise ValueError("lengths must be non-negative")
    alpha = check_nonnegative_scalar(alpha, "alpha")
    if alpha == 0:
        raise ValueError("alpha must be positive")
    dtype = lengths.dtype if lengths.is_floating_point() else torch.float32
    al = alpha * lengths.to(dtype)
    lam = torch.where(al > 0, 1 - 1 / al.clamp(min=torch.finfo(dtype).tiny), torch.zeros((), dtype=dtype, device=lengths.device))
    return lam.clamp(0.0, 1.0).unsqueeze(-1)
