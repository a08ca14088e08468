"""Advantages for the policy and λ-returns for the critic: TD errors and GAE.

Derived in ``chapters/04_nstep`` (TD error, n-step telescoping) and
``chapters/05_gae`` (GAE and the λ-return).
"""

from __future__ import annotations

from typing import NamedTuple, Optional, Union

import torch

from ._checks import (
    check_bootstrap,
    check_like,
    check_mask,
    check_nonnegative_scalar,
    check_sequence_tensor,
    check_unit_interval,
    unit_scalar,
)
from ._fastscan import fast_backward_scan, fused_returns, time_invariant_decay
from ._scan import as_batch, prepare, shift_next

FloatOrTensor = Union[float, torch.Tensor]

__all__ = ["td_errors", "gae", "GAEResult", "decoupled_gae", "DecoupledGAE", "length_adaptive_lam"]


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

    No Python loop over tokens: for numeric ``gamma`` and ``lam``, on a CPU,
    one pass of a C kernel (:mod:`valuelab._native`, ``(eq-fast-vector-scan)``
    of chapter 9); on a GPU or without a C compiler the λ-return is scanned
    in blocks by matrix products (``valuelab._fastscan.fused_returns``,
    ``(eq-fast-lambda-return)`` and ``(eq-fast-block)``); for tensor
    ``gamma`` or ``lam`` the TD errors are
    (``valuelab._fastscan.fast_backward_scan``). The results equal the
    recursion's to float rounding.
    """
    fast = _fused_gae(rewards, values, mask, gamma, lam, bootstrap)
    if fast is not None:
        return fast
    p = prepare(rewards, values, mask, gamma, bootstrap, need_values=True)
    lam_t = p.packed.take(as_batch(check_unit_interval(lam, "lam", rewards)))
    valid = p.packed.valid
    zero = torch.zeros((), dtype=p.rewards.dtype, device=p.rewards.device)
    v_next = shift_next(p.values, valid, p.bootstrap)
    delta = torch.where(valid, p.rewards + p.gamma * v_next - p.values, zero)
    c = time_invariant_decay(delta, gamma, lam)
    adv = fast_backward_scan(delta, torch.where(valid, p.gamma * lam_t, zero) if c is None else c)
    return GAEResult(p.out(adv), p.out(adv + p.values))


def _fused_gae(rewards, values, mask, gamma, lam, bootstrap) -> Optional[GAEResult]:
    """:func:`gae` through :func:`valuelab._fastscan.fused_returns` when γ and λ are numbers, else None.

    Raises the errors of the general path, in its order (:func:`valuelab._scan.prepare`,
    then ``lam``), without building tensors for γ and λ, and looks for a NaN
    or an inf with one sum of the inputs (a finite sum means finite entries),
    taken by the C kernel during its pass or by one reduction of each input;
    only when the sum is not finite are the inputs checked entry by entry (an
    overflow of finite inputs passes, as on the general path). A NaN at a
    masked position is an error too, as on the general path. Returns None -- the general path then runs and
    checks everything -- when γ or λ is a tensor, the dtype is not
    float32/float64, or autograd would have to trace the inputs.
    """
    try:
        rewards = check_sequence_tensor(rewards, "rewards", finite=False)
        values = check_like(values, "values", rewards, "rewards", finite=False)
        m = None if mask is None else check_mask(mask, rewards)
        g = unit_scalar(gamma, "gamma", rewards.dtype)
        if g is None or rewards.dtype not in (torch.float32, torch.float64):
            return None
        b = None if bootstrap is None else check_bootstrap(bootstrap, rewards)
        l = unit_scalar(lam, "lam", rewards.dtype)
    except (TypeError, ValueError):
        _check_gae_arguments(rewards, values, mask, gamma, lam, bootstrap)  # the first error in the general order
        raise
    if l is None or (torch.is_grad_enabled() and (rewards.requires_grad or values.requires_grad)):
        return None
    r2, v2 = as_batch(rewards), as_batch(values)
    adv, ret = fused_returns(r2, v2, None if m is None else as_batch(m), g, l, None if b is None else b.reshape(r2.shape[0]),
                             check_all=lambda: _check_gae_arguments(rewards, values, mask, gamma, lam, bootstrap))
    if rewards.dim() == 1:
        adv, ret = adv.squeeze(0), ret.squeeze(0)
    return GAEResult(adv, ret)


def _check_gae_arguments(rewards, values, mask, gamma, lam, bootstrap) -> None:
    """Every check of :func:`gae`'s general path, in its order."""
    p = prepare(rewards, values, mask, gamma, bootstrap, need_values=True)
    check_unit_interval(lam, "lam", p.rewards)


class DecoupledGAE(NamedTuple):
    """Output of :func:`decoupled_gae`: the actor's advantages and the critic's targets, from two λs."""

    advantages: torch.Tensor
    """:math:`\\hat A_t` with :math:`\\lambda_\\text{actor}`, used to train the policy."""
    returns: torch.Tensor
    """:math:`\\hat G_t` with :math:`\\lambda_\\text{critic}`, used to train the critic."""


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

    Equation ``(eq-decoupled-gae)`` of chapter 10. The critic's target with
    :math:`\lambda_\text{critic}=1` is the Monte-Carlo return, free of the
    critic's own bias; the policy keeps a lower-variance
    :math:`\lambda_\text{actor}<1`. ``lam_actor`` may be per sequence, e.g.
    :func:`length_adaptive_lam`. Both outputs come from :func:`gae`; other
    arguments as there.
    """
    kw = dict(mask=mask, gamma=gamma, bootstrap=bootstrap)
    return DecoupledGAE(gae(rewards, values, lam=lam_actor, **kw).advantages, gae(rewards, values, lam=lam_critic, **kw).returns)


def length_adaptive_lam(lengths: torch.Tensor, alpha: float = 0.05) -> torch.Tensor:
    r"""Length-adaptive :math:`\lambda = 1 - 1/(\alpha\, l)` per sequence, clamped to [0, 1] (Yue et al., 2025).

    Equation ``(eq-length-adaptive-lam)`` of chapter 10. ``lengths`` holds the
    number of generated tokens :math:`l` of each sequence (shape ``(B,)``);
    the result has shape ``(B, 1)``, ready for ``gae(..., lam=...)``. It keeps
    :math:`\sum_l \lambda^l \approx \alpha l`, the effective horizon, a fixed
    fraction of the length, so :math:`\lambda^l \to e^{-1/\alpha}`: the
    relative decay is fixed, not removed.
    """
    if not isinstance(lengths, torch.Tensor):
        raise TypeError(f"lengths must be a torch.Tensor, got {type(lengths).__name__}")
    if lengths.dim() != 1:
        raise ValueError(f"lengths must have shape (B,), got {tuple(lengths.shape)}")
    if lengths.numel() and bool((lengths < 0).any()):
        raise ValueError("lengths must be non-negative")
    alpha = check_nonnegative_scalar(alpha, "alpha")
    if alpha == 0:
        raise ValueError("alpha must be positive")
    dtype = lengths.dtype if lengths.is_floating_point() else torch.float32
    al = alpha * lengths.to(dtype)
    lam = torch.where(al > 0, 1 - 1 / al.clamp(min=torch.finfo(dtype).tiny), torch.zeros((), dtype=dtype, device=lengths.device))
    return lam.clamp(0.0, 1.0).unsqueeze(-1)
