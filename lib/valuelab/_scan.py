"""The machinery every estimator shares: holes compaction and the backward scan.

All returns and advantages of this package are instances of one linear
recursion run backwards over the valid tokens of a sequence,

.. math::  y_t = x_t + d_t\\, y_{t'} ,\\qquad y_{\\text{after last}} = 0,

where :math:`t'` is the next *valid* token after :math:`t`. Masked tokens
(right padding, or holes such as tool output in a multi-turn rollout) are
skipped: they add nothing and discount nothing. Skipping holes is exactly the
same as running the recursion on the *compacted* sequence in which the valid
tokens are moved to the left, so every function here works on compacted,
right-padded rows and scatters the result back (derived in
``chapters/01_value_function_mc``, notation page "Masks").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Tuple

import torch

from ._fastscan import float_mask, fused_returns, right_padded_rows, valid_first_order


@dataclass(frozen=True)
class Packed:
    """A batch moved into compacted, right-padded form.

    ``order[b, j]`` is the original column of the j-th valid token of row b
    (None when the mask is already right-padded and nothing moves);
    ``valid`` is the compacted, right-padded mask.
    """

    order: Optional[torch.Tensor]
    valid: torch.Tensor

    def take(self, x: torch.Tensor) -> torch.Tensor:
        """Move ``x`` (B, T) into compacted order."""
        return x if self.order is None else x.gather(-1, self.order)

    def put(self, y: torch.Tensor) -> torch.Tensor:
        """Scatter compacted ``y`` back to the original columns; masked slots become 0."""
        y = torch.where(self.valid, y, torch.zeros((), dtype=y.dtype, device=y.device))
        if self.order is None:
            return y
        return torch.zeros_like(y).scatter_(-1, self.order, y)


def pack(mask: torch.Tensor) -> Packed:
    """Compact a boolean (B, T) mask so that each row's valid tokens come first.

    A right-padded mask (the common case) is recognised by one matrix-vector
    product and one sum (:func:`valuelab._fastscan.right_padded_rows`) and
    nothing moves.
    """
    T = mask.shape[-1]
    if mask.numel() == 0 or right_padded_rows(float_mask(mask, torch.float32)):
        return Packed(order=None, valid=mask)
    lengths = mask.sum(-1, keepdim=True)
    prefix = torch.arange(T, device=mask.device) < lengths
    # a stable sort of "is masked" puts valid tokens first, in their original order (without sorting)
    order = valid_first_order(mask, lengths)
    return Packed(order=order, valid=prefix)


def shift_next(x: torch.Tensor, valid: torch.Tensor, after_last: torch.Tensor) -> torch.Tensor:
    """``x[t+1]`` on compacted rows, and ``after_last`` (shape (B,)) past each row's last valid token."""
    fill = after_last.unsqueeze(-1)
    nxt = torch.cat([x[..., 1:], fill], dim=-1)
    nxt_valid = torch.cat([valid[..., 1:], torch.zeros_like(valid[..., :1])], dim=-1)
    return torch.where(nxt_valid, nxt, fill)


def backward_scan(x: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
    """Solve ``y[t] = x[t] + d[t] * y[t+1]`` with ``y[T] = 0`` along the last axis.

    The straightforward loop over tokens (vectorised over the batch).
    """
    y = torch.empty_like(x)
    carry = x.new_zeros(x.shape[:-1])
    for t in range(x.shape[-1] - 1, -1, -1):
        carry = x[..., t] + d[..., t] * carry
        y[..., t] = carry
    return y


def as_batch(x: torch.Tensor) -> torch.Tensor:
    """View a (T,) tensor as (1, T); leave (B, T) alone."""
    return x.unsqueeze(0) if x.dim() == 1 else x


@dataclass(frozen=True)
class Prepared:
    """Validated inputs of an estimator, in compacted (B, T) form."""

    rewards: torch.Tensor
    values: Optional[torch.Tensor]
    gamma: torch.Tensor
    bootstrap: torch.Tensor
    packed: Packed
    squeeze: bool

    def out(self, y: torch.Tensor) -> torch.Tensor:
        """Scatter a compacted result back to the caller's shape."""
        y = self.packed.put(y)
        return y.squeeze(0) if self.squeeze else y


def prepare(rewards, values, mask, gamma, bootstrap, *, need_values: bool) -> Prepared:
    """Validate the common arguments and compact them (see :mod:`valuelab._checks`)."""
    from ._checks import check_bootstrap, check_like, check_mask, check_sequence_tensor, check_unit_interval

    rewards = check_sequence_tensor(rewards, "rewards")
    if need_values:
        values = check_like(values, "values", rewards, "rewards")
    m = check_mask(mask, rewards)
    g = check_unit_interval(gamma, "gamma", rewards)
    b = check_bootstrap(bootstrap, rewards)
    squeeze = rewards.dim() == 1
    r2, m2, g2 = as_batch(rewards), as_batch(m), as_batch(g)
    b2 = b.reshape(r2.shape[0])
    packed = pack(m2)
    v2 = packed.take(as_batch(values)) if need_values else None
    return Prepared(packed.take(r2), v2, packed.take(g2), b2, packed, squeeze)


def fused(
    rewards, values, mask, gamma, lam, bootstrap, general_checks: Callable[[], None]
) -> Optional[Tuple[Optional[torch.Tensor], torch.Tensor]]:
    """``(advantages, returns)`` through :func:`valuelab._fastscan.fused_returns` when γ and λ are numbers, else None.

    The front end of :func:`valuelab.gae` (``values`` given) and
    :func:`valuelab.discounted_returns` (``values=None``, ``lam=1``). It
    raises the errors of the general path in its order -- on any argument
    error it runs ``general_checks`` (every check of the general path, in
    order), which raises the first one -- without building tensors for γ and
    λ, and it leaves finiteness to ``fused_returns`` (one sum of the inputs,
    taken by the C kernel during its pass or by one reduction; only when that
    sum is not finite does ``general_checks`` look at the entries). Returns
    None -- the general path then runs and checks everything -- when γ or λ
    is a tensor, the dtype is not float32/float64, or autograd would have to
    trace the inputs. ``advantages`` is None without ``values``.
    """
    from ._checks import check_bootstrap, check_like, check_mask, check_sequence_tensor, unit_scalar

    try:
        rewards = check_sequence_tensor(rewards, "rewards", finite=False)
        if values is not None:
            values = check_like(values, "values", rewards, "rewards", finite=False)
        m = None if mask is None else check_mask(mask, rewards)
        g = unit_scalar(gamma, "gamma", rewards.dtype)
        if g is None or rewards.dtype not in (torch.float32, torch.float64):
            return None
        b = None if bootstrap is None else check_bootstrap(bootstrap, rewards)
        l = unit_scalar(lam, "lam", rewards.dtype)
    except (TypeError, ValueError):
        general_checks()  # the first error in the general path's order
        raise
    traced = rewards.requires_grad or (values is not None and values.requires_grad)
    if l is None or (torch.is_grad_enabled() and traced):
        return None
    r2 = as_batch(rewards)
    adv, ret = fused_returns(
        r2, None if values is None else as_batch(values), None if m is None else as_batch(m), g, l,
        None if b is None else b.reshape(r2.shape[0]), check_all=general_checks,
    )
    if rewards.dim() == 1:
        adv, ret = None if adv is None else adv.squeeze(0), ret.squeeze(0)
    return adv, ret
