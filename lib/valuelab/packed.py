"""GAE and Monte-Carlo returns on a packed batch: sequences laid end to end, delimited by ``cu_seqlens`` (chapter 11 (:doc:`/chapters/11_pitfalls`)).

Trainers that pack variable-length responses without padding (AReaL,
cugae, any varlen attention kernel) hold a batch as one 1-D tensor of
``N`` tokens and the cumulative lengths ``cu_seqlens = [0, L_0, L_0 + L_1,
..., N]``: sequence ``s`` is ``x[cu_seqlens[s]:cu_seqlens[s + 1]]``. The
recursion must restart at every boundary, and a sequence cut by the length
limit rather than ended by EOS must bootstrap from the value of the state
after its last token, not from 0 (the truncation rule of chapter 11).

:func:`gae_packed` and :func:`discounted_returns_packed` lay the sequences
out as right-padded rows, call :func:`valuelab.gae` and
:func:`valuelab.discounted_returns` (one backend, the same numbers), and
pack the result back. Both are differentiable.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import torch

from ._engine.checks import check_flag, check_index_range, check_int, check_sequence_tensor, dense
from .advantages import GAEResult, gae
from .returns import discounted_returns

__all__ = ["Packing", "packing", "gae_packed", "discounted_returns_packed"]


class Packing(NamedTuple):
    """Where each packed token sits in the padded layout, from :func:`packing`."""

    rows: torch.Tensor
    """(N,) long: the sequence of each token."""
    cols: torch.Tensor
    """(N,) long: its position within the sequence."""
    n_seqs: int
    width: int
    """The longest sequence (0 when every sequence is empty)."""


def packing(cu_seqlens: torch.Tensor, n_tokens: int) -> Packing:
    """Check ``cu_seqlens`` against a packed tensor of ``n_tokens`` tokens and index its layout.

    ``cu_seqlens`` is an integer tensor ``(S + 1,)`` that starts at 0, never
    decreases (empty sequences are allowed) and ends at ``n_tokens``;
    otherwise ``ValueError`` naming it (``TypeError`` for a float or bool one).
    The entries are compared with their bounds and their neighbours before
    any is subtracted (``valuelab._engine.checks.check_index_range``): offsets
    whose differences wrap around in int64 are refused, not handed to
    ``repeat_interleave``. A meta tensor is refused too (ValueError).
    """
    if not isinstance(cu_seqlens, torch.Tensor):
        raise TypeError(f"cu_seqlens must be a torch.Tensor, got {type(cu_seqlens).__name__}")
    n_tokens = check_int(n_tokens, "n_tokens")  # not a bool: True is not one token
    if n_tokens < 0:
        raise ValueError(f"n_tokens must be non-negative, got {n_tokens}")
    if cu_seqlens.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"cu_seqlens must be an int32 or int64 tensor, got {cu_seqlens.dtype}")
    if cu_seqlens.dim() != 1 or cu_seqlens.numel() < 2:
        raise ValueError(f"cu_seqlens must have shape (S + 1,) with S >= 1, got {tuple(cu_seqlens.shape)}")
    cu_seqlens = dense(cu_seqlens, "cu_seqlens")  # data behind it (not meta; a zero tensor materialised) for the message

    def refused() -> str:
        return (f"cu_seqlens must start at 0, never decrease and end at the number of tokens ({n_tokens}), "
                f"got {cu_seqlens.tolist() if cu_seqlens.numel() <= 12 else 'a tensor that does not'}")

    cu = check_index_range(cu_seqlens, "cu_seqlens", 0, n_tokens, nondecreasing=True, message=refused)
    if int(cu[0]) != 0 or int(cu[-1]) != n_tokens:
        raise ValueError(refused())
    lengths = cu[1:] - cu[:-1]  # every entry of cu lies in [0, n_tokens]: no difference can wrap around
    n_seqs = lengths.numel()
    rows = torch.repeat_interleave(torch.arange(n_seqs, device=cu.device), lengths)
    cols = torch.arange(n_tokens, device=cu.device) - cu[rows]
    return Packing(rows, cols, n_seqs, int(lengths.max()) if n_seqs else 0)


def _pad(x: torch.Tensor, p: Packing) -> torch.Tensor:
    out = torch.zeros(p.n_seqs, max(p.width, 1), dtype=x.dtype, device=x.device)
    return out.index_put((p.rows, p.cols), x)


def _bootstrap(truncated: Optional[torch.Tensor], bootstrap: Optional[torch.Tensor], like: torch.Tensor,
               n_seqs: int) -> Optional[torch.Tensor]:
    """V(s_{T+1}) per sequence: ``bootstrap`` where truncated, 0 where the sequence ended."""
    if truncated is None:
        if bootstrap is not None:
            raise ValueError("bootstrap is given but truncated is not: say which sequences were cut (truncated=...)")
        return None
    truncated = check_flag(truncated, "truncated", shape=(n_seqs,), hint=", one flag per sequence")
    if not bool(truncated.any()):
        return None
    if bootstrap is None:
        raise ValueError("truncated marks sequences as cut: give bootstrap, the value of the state after each one's last token")
    bootstrap = check_sequence_tensor(bootstrap, "bootstrap")
    if bootstrap.shape != (n_seqs,):
        raise ValueError(f"bootstrap must have shape ({n_seqs},), got {tuple(bootstrap.shape)}")
    zero = torch.zeros((), dtype=like.dtype, device=like.device)
    return torch.where(truncated.to(like.device), bootstrap.to(like.dtype), zero)


def gae_packed(
    rewards: torch.Tensor,
    values: torch.Tensor,
    cu_seqlens: torch.Tensor,
    *,
    gamma: float = 1.0,
    lam: float = 0.95,
    truncated: Optional[torch.Tensor] = None,
    bootstrap: Optional[torch.Tensor] = None,
) -> GAEResult:
    """:func:`valuelab.gae` (equation :eq:`eq-gae-recursion` of chapter 5) on a packed batch (chapter 11 (:doc:`/chapters/11_pitfalls`)).

    Conventions: ``values[i]`` is :math:`V(s_t)` of the token at ``i``, the
    value of its sequence's prefix *before* that token; the reward-model
    score is the reward of each sequence's last token
    (:func:`valuelab.kl_shaped_rewards`); ``bootstrap`` is
    :math:`V(s_{T+1})`, one per sequence, shape ``(S,)``, read only where
    ``truncated`` (a sequence that ended with EOS gets 0). Nothing is
    detached: the live critic's output (``requires_grad``) as ``values``
    makes the advantages and the returns carry its gradient, the PPO trap;
    pass ``values.detach()``.

    Args:
        rewards, values: ``(N,)`` packed tokens.
        cu_seqlens: ``(S + 1,)`` cumulative lengths (see :func:`packing`).
        gamma, lam: floats.
        truncated: ``(S,)`` bool, True for a sequence cut by the length limit.
        bootstrap: ``(S,)`` value of the state after each sequence's last
            token, read only where ``truncated`` (required if any is).

    Returns:
        ``GAEResult`` of ``(N,)`` advantages and λ-returns, packed as the input.

    Example::

        >>> import torch, valuelab.packed as vp
        >>> r, v = torch.tensor([0., 1., 2.]), torch.full((3,), 0.5)
        >>> vp.gae_packed(r, v, torch.tensor([0, 2, 3]), lam=1.0)  # [0, 1] and [2]
        GAEResult(advantages=tensor([0.5000, 0.5000, 1.5000]), returns=tensor([1., 1., 2.]))
    """
    rewards = check_sequence_tensor(rewards, "rewards")
    values = check_sequence_tensor(values, "values")
    if rewards.dim() != 1 or values.shape != rewards.shape:
        raise ValueError(f"rewards and values must be 1-D packed tensors of one length, got {tuple(rewards.shape)} and {tuple(values.shape)}")
    p = packing(cu_seqlens, rewards.numel())
    boot = _bootstrap(truncated, bootstrap, rewards, p.n_seqs)
    mask = _pad(torch.ones_like(rewards, dtype=torch.bool), p)
    out = gae(_pad(rewards, p), _pad(values, p), mask=mask, gamma=gamma, lam=lam, bootstrap=boot)
    return GAEResult(out.advantages[p.rows, p.cols], out.returns[p.rows, p.cols])


def discounted_returns_packed(
    rewards: torch.Tensor,
    cu_seqlens: torch.Tensor,
    *,
    gamma: float = 1.0,
    truncated: Optional[torch.Tensor] = None,
    bootstrap: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """:func:`valuelab.discounted_returns` (equation :eq:`eq-mc-recursion` of chapter 1) on a packed batch; arguments as in :func:`gae_packed`.

    Conventions: the reward-model score is the reward of each sequence's
    last token (:func:`valuelab.kl_shaped_rewards`); ``bootstrap`` is
    :math:`V(s_{T+1})`, one per sequence, shape ``(S,)``, read only where
    ``truncated`` (a sequence that ended with EOS gets 0). Nothing is
    detached: a ``bootstrap`` from the live critic (``requires_grad``) gives
    returns that carry its gradient; detach it when they are targets.

    Example::

        >>> import torch, valuelab.packed as vp
        >>> r, cu = torch.tensor([0., 1., 2.]), torch.tensor([0, 2, 3])  # [0, 1] and [2]
        >>> cut, v_next = torch.tensor([False, True]), torch.tensor([0., 0.5])
        >>> vp.discounted_returns_packed(r, cu, truncated=cut, bootstrap=v_next)
        tensor([1.0000, 1.0000, 2.5000])
    """
    rewards = check_sequence_tensor(rewards, "rewards")
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be a 1-D packed tensor, got {tuple(rewards.shape)}")
    p = packing(cu_seqlens, rewards.numel())
    boot = _bootstrap(truncated, bootstrap, rewards, p.n_seqs)
    mask = _pad(torch.ones_like(rewards, dtype=torch.bool), p)
    return discounted_returns(_pad(rewards, p), mask=mask, gamma=gamma, bootstrap=boot)[p.rows, p.cols]
