"""OpenRLHF's GAE with valuelab inside: same method, same outputs, bound onto OpenRLHF's experience maker (chapter 14 (:doc:`/chapters/14_trainers`)).

OpenRLHF (method ``RemoteExperienceMaker.get_advantages_and_returns`` of
``openrlhf.trainer.ppo_utils.experience_maker``, checked against OpenRLHF
0.11.2) multiplies values and rewards by the action mask and runs the
recursion through every position: a hole is a token with reward 0 and value
0, not a gap (the "zero" convention of
``valuelab.integrations.HOLE_CONVENTIONS``). Its caller,
``compute_advantages_and_returns``, whitens the advantages afterwards over
all the experiences it holds.

**Where OpenRLHF computes advantages.** The experience maker lives inside
OpenRLHF's ``PPOTrainer``, a Ray actor, so a swap in the launching process
does not reach it. Two ways in:

* in every Ray worker: start Ray yourself with
  ``ray.init(runtime_env={"worker_process_setup_hook": RAY_WORKER_SETUP})``
  (:data:`RAY_WORKER_SETUP`) before calling OpenRLHF's ``train(args)``
  (``openrlhf.cli.train_ppo_ray`` calls ``ray.init`` only when Ray is not
  initialised), or submit with
  ``ray job submit --runtime-env-json '{"worker_process_setup_hook": "valuelab.integrations.openrlhf.ray_worker_setup"}'``;
* in one process: ``restore = install()``.
"""

from __future__ import annotations

from typing import Callable, Optional, Tuple

import torch

from .._engine.checks import check_mask, check_sequence_tensor
from ..advantages import gae
from ._conventions import zero_holes
from ._swap import installed, promoted, rate, refuse_nonfinite, swap

__all__ = ["get_advantages_and_returns", "advantages_and_returns", "install", "is_installed", "ray_worker_setup",
           "RAY_WORKER_SETUP"]

RAY_WORKER_SETUP = "valuelab.integrations.openrlhf.ray_worker_setup"
"""The import path Ray's ``runtime_env["worker_process_setup_hook"]`` takes."""


def advantages_and_returns(
    values: torch.Tensor,
    rewards: torch.Tensor,
    action_mask: Optional[torch.Tensor],
    gamma: float,
    lambd: float,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """OpenRLHF's ``get_advantages_and_returns`` as a plain function, computed by :func:`valuelab.gae` (equation :eq:`eq-gae-recursion` of chapter 5).

    Masked positions are zeroed and then treated as tokens (no mask is passed
    to :func:`valuelab.gae`), exactly as OpenRLHF's loop does. ``values`` and
    ``rewards`` may have different float dtypes: both are promoted to the
    common one, as OpenRLHF's arithmetic does (bf16 values with fp32 rewards
    give fp32 outputs; half precision is computed in float32 and rounded once,
    where OpenRLHF's loop rounds at every step). ``gamma`` and ``lambd`` are numbers in [0, 1] or 0-d
    tensors; bools and strings are refused. Returns ``(advantages, returns)``,
    ``returns = advantages + values`` with the zeroed values; no gradient
    flows into either.

    Raises:
        ValueError: NaN or inf anywhere in the values or rewards (OpenRLHF
            would return NaN advantages for that row, since NaN * 0 is NaN).
    """
    values = check_sequence_tensor(values, "values", finite=False)
    rewards = check_sequence_tensor(rewards, "rewards", finite=False)
    if values.shape != rewards.shape:
        raise ValueError(f"rewards must have the shape of values {tuple(values.shape)}, got {tuple(rewards.shape)}")
    m = None if action_mask is None else check_mask(action_mask, values, "action_mask")
    for name, x in (("values", values), ("rewards", rewards)):
        refuse_nonfinite(x, name, m, "OpenRLHF")
    rows = values.shape[0] if values.dim() == 2 else 1
    g = rate(gamma, "gamma", rows, per_row=False)
    l_ = rate(lambd, "lambd", rows, per_row=False)
    out, (values, rewards) = promoted(("values", values), ("rewards", rewards))
    values, rewards = values.detach(), rewards.detach()
    if m is not None:
        values, rewards = zero_holes(values, m), zero_holes(rewards, m)
    with torch.no_grad():  # OpenRLHF runs the whole method under no_grad: neither output carries a gradient
        adv = gae(rewards, values, gamma=g, lam=l_).advantages
        return adv.to(out), (adv + values).to(out)


def get_advantages_and_returns(
    self: object,
    values: torch.Tensor,
    rewards: torch.Tensor,
    action_mask: Optional[torch.Tensor],
    gamma: float,
    lambd: float,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """The method OpenRLHF's ``compute_advantages_and_returns`` calls, with OpenRLHF's signature (``self`` unused).

    :func:`install` binds it onto ``RemoteExperienceMaker``; the arguments
    and outputs are those of :func:`advantages_and_returns`.
    """
    return advantages_and_returns(values, rewards, action_mask, gamma, lambd)


def _experience_maker(cls: Optional[type]) -> type:
    if cls is None:
        from openrlhf.trainer.ppo_utils.experience_maker import RemoteExperienceMaker as cls  # noqa: PLC0415
    if not isinstance(cls, type) or not hasattr(cls, "get_advantages_and_returns"):
        raise TypeError("experience_maker must be the class openrlhf.trainer.ppo_utils.experience_maker.RemoteExperienceMaker")
    return cls


def install(experience_maker: Optional[type] = None) -> Callable[[], None]:
    """Bind :func:`get_advantages_and_returns` onto OpenRLHF's ``RemoteExperienceMaker`` in *this* process; returns a function that puts OpenRLHF's back.

    ``experience_maker`` defaults to
    ``openrlhf.trainer.ppo_utils.experience_maker.RemoteExperienceMaker``.
    Idempotent: installing twice changes nothing, and the restore function
    always puts OpenRLHF's original back. Every instance, existing or new,
    then calls valuelab's method. For OpenRLHF's Ray actors use
    :func:`ray_worker_setup`.
    """
    return swap(_experience_maker(experience_maker), "get_advantages_and_returns", get_advantages_and_returns)


def is_installed(experience_maker: Optional[type] = None) -> bool:
    """True when OpenRLHF's experience maker calls valuelab's method in this process."""
    return installed(_experience_maker(experience_maker), "get_advantages_and_returns", get_advantages_and_returns)


def ray_worker_setup() -> None:
    """Ray's ``worker_process_setup_hook``: :func:`install` into OpenRLHF's experience maker in every Ray worker.

    Pass it by its import path :data:`RAY_WORKER_SETUP`. An error here
    (OpenRLHF missing in the worker's environment) stops the worker, so
    training never runs silently with OpenRLHF's own GAE.
    """
    install()
