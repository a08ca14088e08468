"""Value pretraining: fit the critic to Monte-Carlo returns of a fixed policy before RL (chapter 10, :doc:`/chapters/10_long_responses`).

VC-PPO (Yuan et al., 2025) starts PPO on long responses with a critic that
has first been regressed onto Monte-Carlo returns of responses sampled from
the fixed initial policy, instead of one that starts from the reward model's
weights. The Monte-Carlo target does not depend on the critic, so this stage
removes the initial critic's error without bootstrapping from it. It is the
loop of :func:`valuelab.lab.critic.fit_critic` with ``target="mc"``; this module
only names the stage and checks its arguments.
"""

from __future__ import annotations

import numbers
from typing import Callable, Optional, Union

from torch import nn

from .._engine.checks import check_nonnegative_scalar, check_positive_int
from .critic import OPTIMIZERS, FitHistory, fit_critic
from .world import Rollout

__all__ = ["pretrain_value"]


def pretrain_value(
    critic: nn.Module,
    data: Union[Rollout, Callable[[int], Rollout]],
    *,
    refreshes: int = 1,
    steps_per_refresh: int = 50,
    lr: Optional[float] = None,
    optimizer: str = "adam",
    gamma: Optional[float] = None,
    max_grad_norm: Optional[float] = None,
    eval_rollout: Optional[Rollout] = None,
    callback: Optional[Callable[[int, nn.Module, FitHistory], None]] = None,
    progress: Optional[bool] = False,
) -> FitHistory:
    r"""Value pretraining (Yuan et al., 2025), equation :eq:`eq-value-pretraining` of chapter 10.

    .. math:: \phi_\text{pre} = \arg\min_\phi\ \E_{\pi_0}\Big[\sum_t \big(V_\phi(s_t) - G_t\big)^2\Big],

    with :math:`G_t` the Monte-Carlo return :eq:`eq-mc-return` of responses
    sampled from the fixed initial policy :math:`\pi_0` (the SFT model) and
    the token-mean value loss :eq:`eq-value-loss`. Calls
    :func:`valuelab.lab.critic.fit_critic` with ``target="mc"``: since the target
    does not depend on the critic, a refresh only matters when ``data``
    gives a fresh batch per refresh, and the result is the same for any
    initial critic up to the optimiser's path (exactly the same with
    ``optimizer="exact"``, on the states the batch visits).

    Args:
        critic: the critic to pretrain, in place (for example a
            :class:`~valuelab.lab.critic.TabularCritic` or
            :class:`~valuelab.lab.critic.TinyCritic` that starts from a bad
            initialisation).
        data: a fixed rollout of the initial policy, or a function of the
            refresh index returning a fresh one.
        refreshes: number of batches (or passes over the fixed batch).
        steps_per_refresh: optimisation steps per batch (ignored by ``"exact"``).
        lr: learning rate of ``"adam"`` or ``"sgd"`` (default 1e-2); with
            ``"exact"``, the step in (0, 1] toward the per-state mean of the
            returns (default 1: the exact minimiser), as in
            :func:`valuelab.lab.critic.fit_critic`.
        optimizer: ``"adam"``, ``"sgd"`` or ``"exact"`` (closed-form fit of a
            tabular critic).
        gamma: discount of the returns (default: the rollout's).
        max_grad_norm, eval_rollout, callback, progress: as in
            :func:`valuelab.lab.critic.fit_critic`.

    Returns:
        The :class:`~valuelab.lab.critic.FitHistory` of the fit (errors to the
        exact values before and after each refresh).
    """
    if not isinstance(critic, nn.Module):
        raise TypeError(f"critic must be a torch.nn.Module, got {type(critic).__name__}")
    if not isinstance(data, Rollout) and not callable(data):
        raise TypeError(f"data must be a Rollout or a callable k -> Rollout, got {type(data).__name__}")
    refreshes = check_positive_int(refreshes, "refreshes")
    steps_per_refresh = check_positive_int(steps_per_refresh, "steps_per_refresh")
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {optimizer!r}")
    if lr is not None:
        lr = check_nonnegative_scalar(lr, "lr")
        if lr == 0:
            raise ValueError("lr must be positive")
        if optimizer == "exact" and lr > 1:
            raise ValueError(f"lr must lie in (0, 1] with optimizer='exact' (a step toward the mean return), got {lr}")
    if gamma is not None:
        if isinstance(gamma, bool) or not isinstance(gamma, numbers.Real):
            raise TypeError(f"gamma must be a real number in [0, 1] or None, got {type(gamma).__name__}")
        gamma = check_nonnegative_scalar(gamma, "gamma")
        if gamma > 1:
            raise ValueError(f"gamma must lie in [0, 1], got {gamma}")
    return fit_critic(
        critic,
        data,
        target="mc",
        gamma=gamma,
        refreshes=refreshes,
        steps_per_refresh=steps_per_refresh,
        lr=lr,
        optimizer=optimizer,
        max_grad_norm=max_grad_norm,
        eval_rollout=eval_rollout,
        callback=callback,
        progress=progress,
    )
