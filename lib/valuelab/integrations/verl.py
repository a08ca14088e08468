"""verl's GAE with valuelab inside: same signature, same outputs, in verl's own Ray workers (chapter 14 (:doc:`/chapters/14_trainers`)).

verl (``verl.trainer.ppo.core_algos.compute_gae_advantage_return``, checked
against verl 0.9.1) runs a loop over tokens that skips masked positions
(PR 2337), carries its running advantage through them, returns
``advantages + values`` before whitening, and whitens the advantages over
the response mask (unbiased variance, ``1e-8`` inside the square root)
without zeroing the masked positions. :func:`compute_gae_advantage_return`
computes the same tensors with :func:`valuelab.gae` (no loop over tokens).

**Where verl computes advantages.** ``verl.trainer.main_ppo`` calls
``ray.init`` and runs ``trainer.fit()`` inside a Ray actor (the
``TaskRunner``), another process. ``ray_trainer.compute_advantage`` reads
``core_algos.compute_gae_advantage_return`` there, at call time (other
estimators go through ``core_algos.get_adv_estimator_fn``). A swap made in
the launching process never reaches that actor. Two ways in:

* **verl's own launcher** (``python -m verl.trainer.main_ppo ...``): add
  the Hydra override :data:`HYDRA_OVERRIDE`,
  ``+ray_kwargs.ray_init.runtime_env.worker_process_setup_hook=valuelab.integrations.verl.ray_worker_setup``.
  verl merges ``ray_kwargs.ray_init.runtime_env`` into the ``runtime_env``
  it hands ``ray.init``, and Ray runs :func:`ray_worker_setup` in every
  worker process before it runs any task or actor;
* **in one process** (a notebook, a test, your own loop calling verl's
  functions without Ray): ``restore = install()``.
"""

from __future__ import annotations

from types import ModuleType
from typing import Callable, Optional, Tuple, Union

import torch

from .._engine.checks import check_mask, check_nonnegative_scalar, check_sequence_tensor, require_finite_result
from ..advantages import gae
from ..losses import _whiten_everywhere
from ._conventions import carry_into_holes
from ._swap import installed, promoted, rate, refuse_nonfinite, swap

__all__ = ["compute_gae_advantage_return", "whiten", "install", "is_installed", "ray_worker_setup",
           "RAY_WORKER_SETUP", "HYDRA_OVERRIDE"]

RAY_WORKER_SETUP = "valuelab.integrations.verl.ray_worker_setup"
"""The import path Ray's ``runtime_env["worker_process_setup_hook"]`` takes."""

HYDRA_OVERRIDE = f"+ray_kwargs.ray_init.runtime_env.worker_process_setup_hook={RAY_WORKER_SETUP}"
"""The command-line override of ``verl.trainer.main_ppo`` (verl 0.9.1) that installs valuelab in every Ray worker."""


def whiten(values: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """verl's ``masked_whiten``: :math:`(x - \\mu)/\\sqrt{\\sigma^2 + \\epsilon}` at *every* position, with the mean and unbiased variance of the valid ones.

    Computed in float64 on the scale of the largest valid entry
    (``valuelab.losses._whiten_everywhere``): where verl's own function
    gives NaN (every valid entry equal and ``eps = 0``, or a float16 ``eps``
    that rounds to 0) this gives the centred values, 0; where its variance
    overflows float32 this gives the whitened values.
    """
    values = check_sequence_tensor(values, "values")
    m = check_mask(mask, values, required=True)
    eps = check_nonnegative_scalar(eps, "eps")
    out, _ = _whiten_everywhere(values, m.to(torch.float64), eps, True, "mask")  # on a scale: no overflow, no 0/0
    return require_finite_result(out.to(values.dtype), "values",
                                 f"a masked entry lies so far from the valid ones that its whitened value overflows {values.dtype}")


def compute_gae_advantage_return(
    token_level_rewards: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    gamma: Union[float, torch.Tensor],
    lam: Union[float, torch.Tensor],
) -> Tuple[torch.Tensor, torch.Tensor]:
    """verl's ``compute_gae_advantage_return``, computed by :func:`valuelab.gae` (equation :eq:`eq-gae-recursion` of chapter 5).

    Args:
        token_level_rewards, values: ``(bs, response_length)``, any float
            dtypes: the outputs have their common dtype, as verl's arithmetic
            gives (bf16 values with fp32 rewards give fp32 outputs). Half
            precision is computed in float32 and rounded once; verl's loop
            rounds ``gamma * V`` at every step, so with bf16 values and
            ``gamma < 1`` the two differ by bf16 rounding, valuelab's the
            closer to the exact value.
        response_mask: ``(bs, response_length)``, 1 on the tokens the policy
            generated (0 on padding and on holes such as tool outputs).
        gamma, lam: numbers in [0, 1], 0-d tensors, or ``(bs,)`` tensors (one
            per row, as verl's loop broadcasts them). Bools and strings are
            refused.

    Returns:
        ``(advantages, returns)``: the GAE advantages with holes skipped and
        carried, whitened over the mask; ``returns`` = carried advantages +
        ``values``, before whitening. No gradient, as in verl.

    Raises:
        ValueError: NaN or inf anywhere in the rewards or values, masked
            positions included: verl would return NaN advantages for that row
            (``NaN * 0`` is NaN); valuelab refuses and says so.
    """
    rewards = check_sequence_tensor(token_level_rewards, "token_level_rewards", finite=False)
    values = check_sequence_tensor(values, "values", finite=False)
    if values.shape != rewards.shape:
        raise ValueError(f"values must have the shape of token_level_rewards {tuple(rewards.shape)}, got {tuple(values.shape)}")
    m = check_mask(response_mask, rewards, "response_mask", required=True)  # verl's has no default
    for name, x in (("token_level_rewards", rewards), ("values", values)):
        refuse_nonfinite(x, name, m, "verl")
    rows = rewards.shape[0] if rewards.dim() == 2 else 1
    g = rate(gamma, "gamma", rows, per_row=rewards.dim() == 2)
    l_ = rate(lam, "lam", rows, per_row=rewards.dim() == 2)
    out, (rewards, values) = promoted(("token_level_rewards", rewards), ("values", values))
    with torch.no_grad():
        values = values.detach()
        adv = carry_into_holes(gae(rewards.detach(), values, mask=m, gamma=g, lam=l_).advantages, m)
        returns = adv + values
        white, _ = _whiten_everywhere(adv, m.to(torch.float64), 1e-8, True, "response_mask")
        why = "the advantages or returns overflow {}: rescale the rewards".format(out)
        return (require_finite_result(white.to(out), "token_level_rewards", why),
                require_finite_result(returns.to(out), "token_level_rewards", why))


def _core_algos(core_algos: Optional[ModuleType]) -> ModuleType:
    if core_algos is None:
        import verl.trainer.ppo.core_algos as core_algos  # noqa: PLC0415 - verl is optional
    if not isinstance(core_algos, ModuleType) or not hasattr(core_algos, "compute_gae_advantage_return"):
        raise TypeError("core_algos must be the module verl.trainer.ppo.core_algos")
    return core_algos


def install(core_algos: Optional[ModuleType] = None) -> Callable[[], None]:
    """Put :func:`compute_gae_advantage_return` into verl in *this* process; returns a function that puts verl's back.

    Replaces ``core_algos.compute_gae_advantage_return`` (what
    ``ray_trainer.compute_advantage`` calls) and the registry entry
    ``ADV_ESTIMATOR_REGISTRY["gae"]`` (what ``get_adv_estimator_fn("gae")``
    returns). ``core_algos`` defaults to ``verl.trainer.ppo.core_algos``.
    Idempotent: installing twice changes nothing, and the restore function
    always puts verl's original back. For verl's Ray workers use
    :func:`ray_worker_setup` instead: a swap here does not reach them.
    """
    mod = _core_algos(core_algos)
    registry = getattr(mod, "ADV_ESTIMATOR_REGISTRY", None)
    return swap(mod, "compute_gae_advantage_return", compute_gae_advantage_return,
                registry=registry if isinstance(registry, dict) else None, key="gae")


def is_installed(core_algos: Optional[ModuleType] = None) -> bool:
    """True when verl's GAE, by attribute and by registry, is valuelab's in this process."""
    mod = _core_algos(core_algos)
    registry = getattr(mod, "ADV_ESTIMATOR_REGISTRY", None)
    in_registry = not isinstance(registry, dict) or registry.get("gae") is compute_gae_advantage_return
    return installed(mod, "compute_gae_advantage_return", compute_gae_advantage_return) and in_registry


def ray_worker_setup() -> None:
    """Ray's ``worker_process_setup_hook``: :func:`install` into ``verl.trainer.ppo.core_algos`` in every Ray worker.

    Pass it by its import path :data:`RAY_WORKER_SETUP`, e.g.
    ``ray.init(runtime_env={"worker_process_setup_hook": RAY_WORKER_SETUP})``,
    or to verl's launcher as the override :data:`HYDRA_OVERRIDE`. Ray runs it
    once in each worker process before any task or actor; an error here
    (verl missing in the worker's environment) stops the worker, so training
    never runs silently with verl's own GAE.
    """
    install()
