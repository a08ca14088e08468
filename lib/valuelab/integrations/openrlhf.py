"""OpenRLHF's GAE with valuelab inside: same signature, same outputs (chapter 11 (:doc:`/chapters/11_pitfalls`)).

OpenRLHF (``openrlhf.trainer.ppo_utils.experience_maker``, method
``get_advantages_and_returns``, checked against OpenRLHF 0.11.2) multiplies
values and rewards by the action mask and runs the recursion through every
position: a hole is a token with reward 0 and value 0, not a gap (the
"zero" convention of ``valuelab.integrations.HOLE_CONVENTIONS``). Its
advantages are not whitened here (OpenRLHF whitens later, over the batch).
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch

from .._checks import check_mask, check_sequence_tensor
from ..advantages import gae
from ._conventions import zero_holes

__all__ = ["get_advantages_and_returns"]


def get_advantages_and_returns(
    values: torch.Tensor,
    rewards: torch.Tensor,
    action_mask: Optional[torch.Tensor],
    gamma: float,
    lambd: float,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """OpenRLHF's ``get_advantages_and_returns``, computed by :func:`valuelab.gae` (equation :eq:`eq-gae-recursion` of chapter 5).

    Masked positions are zeroed and then treated as tokens (no mask is passed
    to :func:`valuelab.gae`), exactly as OpenRLHF's loop does. Returns
    ``(advantages, returns)``, ``returns = advantages + values`` with the
    zeroed values; no gradient flows into either.
    """
    values = check_sequence_tensor(values, "values")
    rewards = check_sequence_tensor(rewards, "rewards")
    if values.shape != rewards.shape:
        raise ValueError(f"rewards must have the shape of values {tuple(values.shape)}, got {tuple(rewards.shape)}")
    if action_mask is not None:
        m = check_mask(action_mask, values, "action_mask")
        values, rewards = zero_holes(values, m), zero_holes(rewards, m)
    with torch.no_grad():  # OpenRLHF runs the whole method under no_grad: neither output carries a gradient
        adv = gae(rewards, values, gamma=float(gamma), lam=float(lambd)).advantages
        return adv, adv + values
