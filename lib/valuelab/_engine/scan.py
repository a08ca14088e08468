"""The general path: hole compaction, and the backward scan as a loop.

All returns and advantages of this package are instances of one linear
recursion run backwards over the valid tokens of a sequence,

.. math::  y_t = x_t + d_t\\, y_{t'} ,\\qquad y_{\\text{after last}} = 0,

where :math:`t'` is the next *valid* token after :math:`t`. Masked tokens
(right padding, or holes such as tool output in a multi-turn rollout) are
skipped: they add nothing and discount nothing. Skipping holes is exactly the
same as running the recursion on the *compacted* sequence in which the valid
tokens are moved to the left, so every function here works on compacted,
right-padded rows and scatters the result back (derived in
:doc:`/chapters/01_value_function_mc`, notation page "Masks").

:func:`compact` turns a validated :class:`valuelab._engine.problem.Problem` into
that form (:class:`Prepared`) for the general, differentiable path of every
estimator; the fused backends (:mod:`valuelab._engine.native`,
:mod:`valuelab._engine.blocked`) skip holes without moving anything.
:func:`backward_scan` is the per-token loop, kept as the tests' and the
chapters' oracle.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Union

import torch

from .masks import float_mask, right_padded_rows, valid_first_order
from .problem import Problem, validate


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
    product and one sum (:func:`valuelab._engine.masks.right_padded_rows`) and
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
    """A :class:`valuelab._engine.problem.Problem` in compacted ``(B, T)`` form, for the general (differentiable) path.

    ``gamma`` and ``lam`` are tensors (a float becomes a 0-stride one);
    ``gamma_factor`` and ``lam_factor`` are the Problem's own float or
    broadcast tensor, for :func:`valuelab._engine.fastscan.time_invariant_decay`.
    """

    rewards: torch.Tensor
    values: Optional[torch.Tensor]
    gamma: torch.Tensor
    lam: Optional[torch.Tensor]
    bootstrap: torch.Tensor
    packed: Packed
    squeeze: bool
    gamma_factor: Union[float, torch.Tensor]
    lam_factor: Union[float, torch.Tensor, None]

    def out(self, y: torch.Tensor) -> torch.Tensor:
        """Scatter a compacted result back to the caller's shape."""
        y = self.packed.put(y)
        return y.squeeze(0) if self.squeeze else y


def _full(f: Union[float, torch.Tensor], like: torch.Tensor) -> torch.Tensor:
    """A factor (float or broadcast tensor) as a ``(B, T)`` tensor of ``like``'s dtype and device."""
    if isinstance(f, torch.Tensor):
        return f
    return torch.tensor(f, dtype=like.dtype, device=like.device).expand(like.shape)


def compact(p: Problem) -> Prepared:
    """Move a validated problem into compacted, right-padded rows (:func:`pack`). Finiteness is the caller's."""
    r = p.rewards
    m = p.torch_mask()
    packed = pack(torch.ones(r.shape, dtype=torch.bool, device=r.device) if m is None else m)
    boot = torch.zeros(r.shape[0], dtype=r.dtype, device=r.device) if p.bootstrap is None else p.bootstrap
    return Prepared(
        rewards=packed.take(r),
        values=None if p.values is None else packed.take(p.values),
        gamma=packed.take(_full(p.gamma, r)),
        lam=None if p.lam is None else packed.take(_full(p.lam, r)),
        bootstrap=boot,
        packed=packed,
        squeeze=p.squeeze,
        gamma_factor=p.gamma,
        lam_factor=p.lam,
    )


def prepare(rewards, values, mask, gamma, bootstrap, *, need_values: bool) -> Prepared:
    """Validate (every check, finiteness included) and compact in one call: a shortcut for tests and notebooks."""
    p = validate(rewards, values, mask, gamma, bootstrap, need_values=need_values)
    p.check_finite()
    return compact(p)
