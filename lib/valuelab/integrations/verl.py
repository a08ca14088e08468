"""verl's GAE with valuelab inside: same signature, same outputs (chapter 11 (:doc:`/chapters/11_pitfalls`)).

verl (``verl.trainer.ppo.core_algos.compute_gae_advantage_return``, checked
against verl 0.9.1) runs a loop over tokens that skips masked positions
(PR 2337), carries its running advantage through them, returns
``advantages + values`` before whitening, and whitens the advantages over
the response mask (unbiased variance, ``1e-8`` inside the square root)
without zeroing the masked positions. :func:`compute_gae_advantage_return`
computes the same tensors with :func:`valuelab.gae` (no loop over tokens).

**Putting it into verl.** verl's trainer calls the function by its module
attribute (``ray_trainer.compute_advantage`` reads
``core_algos.compute_gae_advantage_return`` at call time, and registering a
new estimator would not reach that branch), so replace the attribute on the
driver before the trainer starts::

    import verl.trainer.ppo.core_algos as core_algos
    from valuelab.integrations import verl as vl_verl

    restore = vl_verl.install(core_algos)   # ... run the trainer ...; restore() puts verl's back
"""

from __future__ import annotations

from types import ModuleType
from typing import Callable, Tuple, Union

import torch

from .._checks import check_mask, check_nonnegative_scalar, check_sequence_tensor
from ..advantages import gae
from ..losses import masked_mean, masked_var
from ._conventions import carry_into_holes

__all__ = ["compute_gae_advantage_return", "whiten", "install"]


def whiten(values: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """verl's ``masked_whiten``: :math:`(x - \\mu)/\\sqrt{\\sigma^2 + \\epsilon}` at *every* position, with the mean and unbiased variance of the valid ones."""
    values = check_sequence_tensor(values, "values")
    m = check_mask(mask, values)
    eps = check_nonnegative_scalar(eps, "eps")
    mean = masked_mean(values, m)
    var = masked_var(values, m, unbiased=True)
    return (values - mean) * torch.rsqrt(var + eps)


def compute_gae_advantage_return(
    token_level_rewards: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    gamma: Union[float, torch.Tensor],
    lam: Union[float, torch.Tensor],
) -> Tuple[torch.Tensor, torch.Tensor]:
    """verl's ``compute_gae_advantage_return``, computed by :func:`valuelab.gae` (equation :eq:`eq-gae-recursion` of chapter 5).

    Args:
        token_level_rewards, values: ``(bs, response_length)``.
        response_mask: ``(bs, response_length)``, 1 on the tokens the policy
            generated (0 on padding and on holes such as tool outputs).
        gamma, lam: floats (or 0-d tensors).

    Returns:
        ``(advantages, returns)``: the GAE advantages with holes skipped and
        carried, whitened over the mask; ``returns`` = carried advantages +
        ``values``, before whitening. No gradient, as in verl.
    """
    rewards = check_sequence_tensor(token_level_rewards, "token_level_rewards")
    values = check_sequence_tensor(values, "values")
    if values.shape != rewards.shape:
        raise ValueError(f"values must have the shape of token_level_rewards {tuple(rewards.shape)}, got {tuple(values.shape)}")
    m = check_mask(response_mask, rewards, "response_mask")
    if isinstance(gamma, torch.Tensor):
        gamma = float(gamma)
    if isinstance(lam, torch.Tensor):
        lam = float(lam)
    with torch.no_grad():
        adv = carry_into_holes(gae(rewards, values, mask=m, gamma=gamma, lam=lam).advantages, m)
        returns = adv + values
        return whiten(adv, m), returns


def install(core_algos: ModuleType) -> Callable[[], None]:
    """Replace ``core_algos.compute_gae_advantage_return`` with :func:`compute_gae_advantage_return`; returns a function that restores verl's."""
    if not isinstance(core_algos, ModuleType) or not hasattr(core_algos, "compute_gae_advantage_return"):
        raise TypeError("core_algos must be the module verl.trainer.ppo.core_algos")
    original = core_algos.compute_gae_advantage_return
    core_algos.compute_gae_advantage_return = compute_gae_advantage_return

    def restore() -> None:
        core_algos.compute_gae_advantage_return = original

    return restore
