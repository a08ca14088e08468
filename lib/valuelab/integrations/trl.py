"""TRL's PPO tensors in valuelab's layout: the score one step past EOS (chapter 11 (:doc:`/chapters/11_pitfalls`)).

TRL's ``PPOTrainer`` (checked against TRL 0.19.1; TRL 1.0 ships the same
code as ``trl.experimental.ppo``, and later 1.x releases dropped it) keeps, for each response, ``sequence_lengths``: the index of
its last token, EOS included. It then

* adds the score to the reward one step *past* that token, at
  ``sequence_lengths + 1`` (or on the last token when the response fills
  the row): a phantom step after EOS;
* keeps the critic's values up to and including that phantom step and
  zeroes them after it;
* runs GAE over the whole row and whitens the advantages over the tokens
  ``0..sequence_lengths``, zeroing the rest; ``returns = advantages + values``
  before whitening.

Chapter 11 calls this TRL's phantom step. :func:`from_trl` gives valuelab's
``(rewards, values, mask)`` for the same computation (``phantom=True``) or
with the score moved onto the EOS token and the phantom dropped
(``phantom=False``, the episode ends at EOS: no value after it).
:func:`trl_advantages` reproduces TRL's two outputs with :func:`valuelab.gae`.
"""

from __future__ import annotations

from typing import NamedTuple, Tuple

import torch

from .._engine.checks import check_flag, check_index_range, check_sequence_tensor, require_finite_result
from ..advantages import gae
from ..losses import masked_whiten
from ._swap import rate

__all__ = ["TRLBatch", "from_trl", "trl_advantages"]


class TRLBatch(NamedTuple):
    """Output of :func:`from_trl`: arguments of :func:`valuelab.gae`."""

    rewards: torch.Tensor
    values: torch.Tensor
    mask: torch.Tensor
    """(B, T) bool: the positions the recursion runs over."""


def _check(rewards: torch.Tensor, values: torch.Tensor, sequence_lengths: torch.Tensor) -> torch.Tensor:
    rewards = check_sequence_tensor(rewards, "rewards")
    values = check_sequence_tensor(values, "values")
    if rewards.dim() != 2 or values.shape != rewards.shape:
        raise ValueError(f"rewards and values must be (B, T) of one shape, got {tuple(rewards.shape)} and {tuple(values.shape)}")
    if not isinstance(sequence_lengths, torch.Tensor) or sequence_lengths.dtype not in (torch.int32, torch.int64):
        raise TypeError("sequence_lengths must be an integer tensor (the index of each response's last token)")
    if sequence_lengths.shape != rewards.shape[:1]:
        raise ValueError(f"sequence_lengths must have shape ({rewards.shape[0]},), got {tuple(sequence_lengths.shape)}")
    return check_index_range(sequence_lengths, "sequence_lengths", 0, rewards.shape[1] - 1, device=rewards.device)


def from_trl(rewards: torch.Tensor, values: torch.Tensor, sequence_lengths: torch.Tensor, *, phantom: bool = True) -> TRLBatch:
    """valuelab's layout of TRL's ``rewards`` (KL terms plus the score at the phantom step) and ``values``.

    ``phantom=True``: the mask covers ``0..sequence_lengths + 1`` (the
    phantom step, when the row has room for it), so :func:`valuelab.gae`
    gives TRL's advantages there. ``phantom=False``: the score is moved onto
    the last real token, the phantom step is dropped and the mask covers
    ``0..sequence_lengths``. ``phantom`` must be a bool (``"no"`` is not
    False); ``sequence_lengths`` must lie on the device of ``rewards``.
    """
    n = _check(rewards, values, sequence_lengths)
    phantom = check_flag(phantom, "phantom")
    B, T = rewards.shape
    idx = torch.arange(T, device=rewards.device)
    end = torch.where(n + 1 < T, n + 1, n)  # TRL's actual_end: where the score was added
    if phantom:
        return TRLBatch(rewards, values, idx <= end[:, None])
    rows = torch.arange(B, device=rewards.device)
    moved = rewards.clone()
    has_phantom = end != n
    score = rewards[rows, end]  # at the phantom step the KL term is 0 (both log-probs are TRL's INVALID_LOGPROB)
    moved[rows[has_phantom], end[has_phantom]] = 0.0
    moved[rows[has_phantom], n[has_phantom]] += score[has_phantom]
    require_finite_result(moved, "rewards", f"the score moved onto the last token overflows {rewards.dtype} "
                                            "(the KL term there plus the score exceed the largest float)")
    return TRLBatch(moved, values, idx <= n[:, None])


def trl_advantages(
    rewards: torch.Tensor, values: torch.Tensor, sequence_lengths: torch.Tensor, gamma: float, lam: float
) -> Tuple[torch.Tensor, torch.Tensor]:
    """TRL's advantages (whitened over ``0..sequence_lengths``, 0 after) and returns, by :func:`valuelab.gae` (equation :eq:`eq-gae-recursion` of chapter 5).

    ``gamma`` and ``lam`` are numbers in [0, 1] or 0-d float tensors, as
    TRL's ``args.gamma`` and ``args.lam``: one discount for the whole batch.
    A tensor of another shape is refused rather than broadcast over the rows
    (bools and strings too).
    """
    n = _check(rewards, values, sequence_lengths)
    gamma = rate(gamma, "gamma", rewards.shape[0], per_row=False)
    lam = rate(lam, "lam", rewards.shape[0], per_row=False)
    batch = from_trl(rewards, values, n, phantom=True)
    with torch.no_grad():
        out = gae(batch.rewards, batch.values, mask=batch.mask, gamma=gamma, lam=lam)
        zero = torch.zeros((), dtype=values.dtype, device=values.device)
        returns = out.advantages + torch.where(batch.mask, values, zero)
        valid = torch.arange(rewards.shape[1], device=rewards.device) <= n[:, None]
        if int(valid.sum()) < 2:  # TRL's own masked_whiten divides 0 by 0 here: NaN advantages
            raise ValueError("sequence_lengths must leave at least two tokens in the batch: TRL whitens the advantages "
                             "with the unbiased variance, undefined for one token")
        return masked_whiten(out.advantages, valid), returns
