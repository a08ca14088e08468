"""valuelab's batch layout to TorchRL's and back: ``done``, ``terminated`` and the next state's value (chapter 11 (:doc:`/chapters/11_pitfalls`)).

TorchRL's advantage functions
(``torchrl.objectives.value.functional.vec_generalized_advantage_estimate``,
checked against TorchRL 0.14.1) read ``(B, T, 1)`` tensors with time on
dimension -2: the value of each state, the value of the *next* state at each
step, the reward, ``done`` (the trajectory stops here) and ``terminated``
(it stops because the episode ended, so the next value is not used). A
response cut by the length limit is ``done`` but not ``terminated``, and
TorchRL bootstraps from its next value: valuelab's ``bootstrap``.
"""

from __future__ import annotations

from typing import Dict, NamedTuple, Optional

import torch

from .._checks import check_mask, check_sequence_tensor

__all__ = ["to_torchrl", "from_torchrl", "ValuelabBatch"]


def _right_padded(m: torch.Tensor) -> torch.Tensor:
    lengths = m.sum(-1)
    if bool((lengths < 1).any()):
        raise ValueError("mask: every row needs at least one valid token")
    if not torch.equal(m, torch.arange(m.shape[-1], device=m.device) < lengths[:, None]):
        raise ValueError("mask must be right-padded (no holes): TorchRL has no notion of a hole inside a trajectory")
    return lengths


def to_torchrl(
    rewards: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    *,
    truncated: Optional[torch.Tensor] = None,
    bootstrap: Optional[torch.Tensor] = None,
) -> Dict[str, torch.Tensor]:
    """The keyword arguments of TorchRL's GAE for a right-padded ``(B, T)`` batch.

    ``done`` is True at each row's last valid token; ``terminated`` there too
    unless the row is ``truncated`` (``(B,)`` bool), whose next value is then
    ``bootstrap`` (``(B,)``). The padding after a row's end is a trajectory
    of its own for TorchRL: ignore its outputs (mask them).
    """
    rewards = check_sequence_tensor(rewards, "rewards")
    values = check_sequence_tensor(values, "values")
    if rewards.dim() != 2 or values.shape != rewards.shape:
        raise ValueError(f"rewards and values must be (B, T) of one shape, got {tuple(rewards.shape)} and {tuple(values.shape)}")
    m = check_mask(mask, rewards)
    lengths = _right_padded(m)
    B, T = rewards.shape
    last = torch.arange(T, device=rewards.device) == (lengths - 1)[:, None]
    cut = torch.zeros(B, dtype=torch.bool, device=rewards.device)
    if truncated is not None:
        if not isinstance(truncated, torch.Tensor) or truncated.dtype != torch.bool or truncated.shape != (B,):
            raise TypeError(f"truncated must be a ({B},) bool tensor")
        cut = truncated.to(rewards.device)
    next_values = torch.zeros_like(values)
    next_values[:, :-1] = values[:, 1:]
    if bool(cut.any()):
        if bootstrap is None:
            raise ValueError("truncated rows need bootstrap, the value of the state after their last token")
        bootstrap = check_sequence_tensor(bootstrap, "bootstrap")
        if bootstrap.shape != (B,):
            raise ValueError(f"bootstrap must have shape ({B},), got {tuple(bootstrap.shape)}")
        next_values = torch.where(last & cut[:, None], bootstrap.to(values.dtype)[:, None], next_values)
    next_values = torch.where(last & ~cut[:, None], torch.zeros_like(next_values), next_values)
    col = lambda x: x.unsqueeze(-1)  # noqa: E731
    return dict(state_value=col(values), next_state_value=col(next_values), reward=col(rewards),
                done=col(last), terminated=col(last & ~cut[:, None]))


class ValuelabBatch(NamedTuple):
    """Output of :func:`from_torchrl`: the arguments of :func:`valuelab.gae`."""

    rewards: torch.Tensor
    values: torch.Tensor
    mask: torch.Tensor
    bootstrap: torch.Tensor
    """(B,): the next value at a truncated row's end, 0 where the row terminated."""


def from_torchrl(state_value: torch.Tensor, next_state_value: torch.Tensor, reward: torch.Tensor,
                 done: torch.Tensor, terminated: Optional[torch.Tensor] = None) -> ValuelabBatch:
    """TorchRL's ``(B, T, 1)`` tensors, one trajectory per row starting at t = 0, as valuelab's ``(B, T)`` batch.

    Each row's first ``done`` ends its trajectory (later steps are padding);
    where it is not ``terminated`` (default: ``done``) the bootstrap is that
    step's next value.
    """
    for name, x in (("state_value", state_value), ("next_state_value", next_state_value), ("reward", reward)):
        if not isinstance(x, torch.Tensor) or not x.is_floating_point():
            raise TypeError(f"{name} must be a float tensor")
        if x.dim() != 3 or x.shape[-1] != 1:
            raise ValueError(f"{name} must have shape (B, T, 1), got {tuple(x.shape)}")
    if not isinstance(done, torch.Tensor) or done.shape != reward.shape:
        raise ValueError("done must be a bool tensor of the reward's shape")
    terminated = done if terminated is None else terminated
    if not isinstance(terminated, torch.Tensor) or terminated.shape != reward.shape:
        raise ValueError("terminated must be a bool tensor of the reward's shape")
    d, term = done.squeeze(-1).bool(), terminated.squeeze(-1).bool()
    if not bool(d.any(-1).all()):
        raise ValueError("done: every row needs a done step (its trajectory's end)")
    T = d.shape[-1]
    end = torch.where(d, torch.arange(T, device=d.device), torch.full_like(d, T, dtype=torch.long)).min(-1).values
    mask = torch.arange(T, device=d.device) <= end[:, None]
    rows = torch.arange(d.shape[0], device=d.device)
    nxt = next_state_value.squeeze(-1)[rows, end]
    boot = torch.where(term[rows, end], torch.zeros_like(nxt), nxt)
    zero = torch.zeros((), dtype=reward.dtype, device=reward.device)
    return ValuelabBatch(torch.where(mask, reward.squeeze(-1), zero), torch.where(mask, state_value.squeeze(-1), zero),
                         mask, boot)
