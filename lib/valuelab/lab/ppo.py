"""PPO on the many-prompt world, with the critic's target as the variable (chapter 12 (:doc:`/chapters/12_critic_in_ppo`)).

A small, complete PPO loop with the defaults production trainers use: the
clipped policy surrogate (clip 0.2), the clipped value loss, advantage
whitening, several epochs over shuffled minibatches, Adam. The policy and the
critic are tables over the world's states (:mod:`valuelab.lab.policy`), so after
every iteration the policy is evaluated exactly: its objective :math:`J(\\pi_k)`
against :math:`J^*`, its mean length, and the exact advantages that the
estimated ones are measured against.

An :class:`Arm` names the advantage estimator and the critic's target; the
runs of one arm over many seeds are trained together in one batch (each run
has its own tables, generator and minibatch order, and its own Adam state
element by element, so a run's trajectory does not depend on which runs
share the batch).
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field
from typing import List, NamedTuple, Optional, Sequence, Tuple, Union

import numpy as np
import torch

from .._engine.checks import (check_device, check_flag, check_index_range, check_like, check_mask, check_nonnegative_scalar, check_positive_int,
                      check_seed, check_sequence_tensor, require_finite_result, scale_of, within_dtype)
from ..advantages import decoupled_gae, length_adaptive_lam
from ..losses import _aggregate, check_aggregation, masked_mean, masked_whiten, value_loss
from .policy import PromptBatch, PromptWorld, evaluate_policy, reward_model_start, sample_responses, soft_optimal
from ..returns import discounted_returns
from ..runtime import pick_device

__all__ = [
    "policy_loss",
    "PolicyLoss",
    "group_advantages",
    "advantage_fit",
    "AdvantageFit",
    "Arm",
    "PPOConfig",
    "PPOHistory",
    "train_ppo",
    "train_many",
]


class PolicyLoss(NamedTuple):
    """Output of :func:`policy_loss`."""

    loss: torch.Tensor
    """The scalar loss (to minimise)."""
    clip_fraction: torch.Tensor
    """Fraction of valid tokens whose ratio left :math:`[1 - \\epsilon, 1 + \\epsilon]` (no gradient)."""


def policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    *,
    mask: Optional[torch.Tensor] = None,
    clip_range: float = 0.2,
    aggregation: str = "token-mean",
) -> PolicyLoss:
    r"""PPO's clipped surrogate (Schulman et al., 2017), equation :eq:`eq-ppo-clip` of chapter 12 (:doc:`/chapters/12_critic_in_ppo`).

    .. math::

        \mathcal L(\theta) = -\,\overline{\min\big(\rho_t \hat A_t,\ \mathrm{clip}(\rho_t, 1-\epsilon, 1+\epsilon)\,\hat A_t\big)},

        \rho_t = e^{\log\pi_\theta(a_t\mid s_t) - \log\pi_\text{old}(a_t\mid s_t)},

    the bar being ``aggregation`` over valid tokens (see
    :func:`valuelab.losses.aggregate`). ``advantages`` and ``old_logprobs``
    are constants (detached).

    A masked token's ratio is taken as 1 (its log-ratio never reaches
    ``exp``), and where :math:`\hat A_t \ge 0` the log-ratio is capped just
    above :math:`\log(1+\epsilon)`, where the clip already holds the term
    at :math:`(1+\epsilon)\hat A_t` with zero gradient: neither value nor
    gradient changes, but :math:`e^{1000}` never becomes inf (nor its
    gradient NaN). Where :math:`\hat A_t < 0` the ratio is needed: a ratio
    or a loss beyond the largest float is a ``ValueError`` naming
    ``logprobs`` (or ``advantages``), never an infinite loss.
    """
    logprobs = check_sequence_tensor(logprobs, "logprobs")
    old_logprobs = check_like(old_logprobs, "old_logprobs", logprobs, "logprobs").detach()
    advantages = check_like(advantages, "advantages", logprobs, "logprobs").detach()
    m = check_mask(mask, logprobs)
    m = torch.ones_like(logprobs) if m is None else m.to(logprobs.dtype)
    eps = check_nonnegative_scalar(clip_range, "clip_range")
    check_aggregation(aggregation)
    valid = m != 0
    zero = torch.zeros((), dtype=logprobs.dtype, device=logprobs.device)
    log_ratio = torch.where(valid, logprobs - old_logprobs, zero)
    log_ratio = torch.where(advantages >= 0, log_ratio.clamp(max=math.log1p(eps) + 1.0), log_ratio)
    ratio = torch.exp(log_ratio)
    if not bool(torch.isfinite(ratio.detach()).all()):
        raise ValueError(
            f"logprobs: the ratio exp(logprobs - old_logprobs) overflows {logprobs.dtype} at a valid token with a "
            "negative advantage, and the loss with it: the policy has moved too far from old_logprobs"
        )
    lo, hi = within_dtype(1 - eps, ratio.dtype), within_dtype(1 + eps, ratio.dtype)  # eps = 1e308: no clip, no error
    surrogate = torch.minimum(ratio * advantages, ratio.clamp(lo, hi) * advantages)
    clipped = ((ratio - 1).abs() > eps).to(logprobs.dtype)
    with torch.no_grad():
        fraction = (clipped * m).sum() / m.sum().clamp(min=1)
    loss = require_finite_result(-_aggregate(surrogate, m, aggregation), "advantages",
                                 f"the loss overflows {logprobs.dtype}: the advantages times the ratios exceed the largest float")
    return PolicyLoss(loss, fraction)


def group_advantages(returns: torch.Tensor, group: torch.Tensor, *, normalise: bool = True, eps: float = 1e-6) -> torch.Tensor:
    r"""A critic-free baseline (GRPO-style, as in Shao et al., 2024), equation :eq:`eq-group-advantage` of chapter 12 (:doc:`/chapters/12_critic_in_ppo`).

    :math:`\hat A_i = (R_i - \bar R_{g(i)})/(\sigma_{g(i)} + \epsilon)`: each response's
    return minus the mean over the responses to the same prompt, divided by
    their standard deviation when ``normalise``. ``returns`` has shape
    ``(B,)`` (one number per response); ``group`` (B,) long gives each
    response's group: any non-negative labels, on the device of ``returns``
    (a negative one is a ValueError naming ``group``; the labels are
    renumbered ``0..K-1`` first, so a label of ``2**40`` costs nothing).
    Every group needs at least two responses. ``normalise`` is a bool.
    """
    returns = check_sequence_tensor(returns, "returns")
    if returns.dim() != 1:
        raise ValueError(f"returns must have shape (B,), got {tuple(returns.shape)}")
    if not isinstance(group, torch.Tensor) or group.dtype != torch.long or group.shape != returns.shape:
        raise TypeError("group must be a long tensor of the shape of returns")
    group = check_index_range(group, "group", 0, dtypes=(torch.long,), device=returns.device,
                              message=lambda: f"group must hold non-negative labels, got {int(group.min())}")
    normalise = check_flag(normalise, "normalise")
    eps = check_nonnegative_scalar(eps, "eps")
    labels, label = torch.unique(group, return_inverse=True)  # 0..K-1: no tensor is sized by the largest label
    n = torch.zeros(labels.numel(), dtype=returns.dtype, device=returns.device).index_add_(0, label, torch.ones_like(returns))
    if bool(((n > 0) & (n < 2)).any()):
        raise ValueError("group: every group needs at least two responses")
    n = n.clamp(min=1)
    mean = torch.zeros_like(n).index_add_(0, label, returns) / n
    centred = returns - mean[label]
    if not normalise:
        if bool(torch.isfinite(centred).all()):
            return centred
        return _group_advantages_scaled(returns, label, n, normalise, eps)
    var = torch.zeros_like(n).index_add_(0, label, centred * centred) / (n - 1).clamp(min=1)
    sd = var.sqrt() + eps
    if bool((torch.isfinite(sd) & (sd > 0)).all()):  # one sync on the direct path
        return centred / sd[label]
    return _group_advantages_scaled(returns, label, n, normalise, eps)  # an overflow, or 0/0: take the safe path


def _group_advantages_scaled(returns: torch.Tensor, label: torch.Tensor, n: torch.Tensor, normalise: bool, eps: float) -> torch.Tensor:
    """:func:`group_advantages` in float64 on each group's own power-of-two scale (:func:`valuelab._engine.checks.scale_of`).

    The path taken only where the direct formula fails: a sum or a square
    that overflows the dtype (float32 ``[65504, -1.4, -1e20]`` would
    whiten to zeros), or a group whose values are all equal with ``eps =
    0`` (0/0): its advantages are then the centred values, 0, never NaN.
    A result beyond the dtype's range is a ValueError naming ``returns``.
    """
    x = returns.double()
    k = n.numel()
    zero = torch.zeros(k, dtype=torch.float64, device=x.device)
    top = zero.clone().scatter_reduce_(0, label, x.abs(), reduce="amax", include_self=True)
    _, e = torch.frexp(top)
    s = torch.where(top > 0, torch.ldexp(torch.ones_like(top), e - 1), torch.ones_like(top))
    xs = x / s[label]  # every |xs| < 2
    nn = n.double()
    c = xs - (zero.clone().index_add_(0, label, xs) / nn)[label]
    if not normalise:
        out = c * s[label]
    else:
        var = zero.clone().index_add_(0, label, c * c) / (nn - 1).clamp(min=1)
        d = (var.sqrt() + eps / s)[label]
        out = torch.where(d > 0, c / torch.where(d > 0, d, torch.ones_like(d)), c)
    return require_finite_result(out.to(returns.dtype), "returns",
                                 f"its group advantages overflow {returns.dtype}: rescale the returns")


class AdvantageFit(NamedTuple):
    """Output of :func:`advantage_fit`."""

    kappa: float
    """Slope :math:`\\kappa` of the estimate on the exact advantage (1: all of it recovered)."""
    offset: float
    """Intercept :math:`b`."""
    noise: float
    """Standard deviation of the residual."""


class _FitUndefined(ValueError):
    """:func:`advantage_fit` has no answer for these inputs (too few tokens, no spread): a ValueError, read as NaN by :func:`train_ppo`."""


def advantage_fit(estimate: torch.Tensor, exact: torch.Tensor, mask: torch.Tensor, t_max: int) -> AdvantageFit:
    r"""Least-squares fit :math:`\hat A_t \approx b + \kappa A^\pi_t` over valid tokens :math:`t < t_{\max}`, equation :eq:`eq-kappa` of chapter 12 (:doc:`/chapters/12_critic_in_ppo`).

    :math:`\kappa` is the fraction of the true advantage the estimate carries
    at the early tokens (chapter 10 (:doc:`/chapters/10_long_responses`)
    introduces it for a fixed policy).

    Raises:
        ValueError: fewer than two valid early tokens, or an exact advantage with no spread.
    """
    estimate = check_sequence_tensor(estimate, "estimate")
    exact = check_like(exact, "exact", estimate, "estimate")
    m = check_mask(mask, estimate)
    t_max = check_positive_int(t_max, "t_max")
    sel = m[..., :t_max] if m is not None else torch.ones_like(estimate[..., :t_max], dtype=torch.bool)
    sel = sel.bool()
    a = estimate[..., :t_max][sel].double()
    A = exact[..., :t_max][sel].double()
    if a.numel() < 2:
        raise _FitUndefined("mask must select at least two tokens before t_max")
    # on power-of-two scales (exact): no sum or square overflows, nor does a spread of 1e-300 square to 0
    ea, eA = (math.frexp(float(scale_of(x)))[1] - 1 for x in (a, A))
    a, A = torch.ldexp(a, torch.tensor(-ea, device=a.device)), torch.ldexp(A, torch.tensor(-eA, device=A.device))
    dA = A - A.mean()
    ss = float((dA * dA).sum())
    if ss == 0:
        raise _FitUndefined("exact: the exact advantages have no spread over the selected tokens")
    kappa = float((dA * (a - a.mean())).sum()) / ss  # on the scales: times 2**(ea - eA) below
    offset = float(a.mean()) - kappa * float(A.mean())  # times 2**ea below
    noise = float((a - offset - kappa * A).std())  # times 2**ea below
    why = "the fit does not fit a float64: estimate is too large against exact (or exact too small)"
    try:
        kappa, offset, noise = math.ldexp(kappa, ea - eA), math.ldexp(offset, ea), math.ldexp(noise, ea)
    except OverflowError:
        raise ValueError(f"estimate: {why}") from None
    for v in (kappa, offset, noise):
        require_finite_result(v, "estimate", why)
    return AdvantageFit(kappa, offset, noise)


@dataclass(frozen=True)
class Arm:
    """One way to train the critic and build the actor's advantages (chapter 12 (:doc:`/chapters/12_critic_in_ppo`)).

    Args:
        name: label of the arm.
        estimator: ``"gae"`` (a critic, advantages :eq:`eq-decoupled-gae`) or
            ``"group"`` (no critic: :func:`group_advantages` of the KL-shaped return).
        lam_actor: λ of the actor's advantages, or ``"adaptive"`` for
            :func:`valuelab.length_adaptive_lam` with ``alpha``.
        lam_critic: λ of the critic's target (the GAE λ-return).
        critic_start: ``"zero"`` or ``"reward-model"`` (:func:`valuelab.lab.policy.reward_model_start`).
        warmup: iterations of value pretraining before PPO (critic only,
            Monte-Carlo targets, the initial policy's responses).
        alpha: α of the length-adaptive λ.
    """

    name: str
    estimator: str = "gae"
    lam_actor: Union[float, str] = 0.95
    lam_critic: float = 0.95
    critic_start: str = "zero"
    warmup: int = 0
    alpha: float = 1.0

    def __post_init__(self) -> None:
        if not isinstance(self.name, str):
            raise TypeError("name must be a str")
        if self.estimator not in ("gae", "group"):
            raise ValueError(f"estimator must be 'gae' or 'group', got {self.estimator!r}")
        if self.lam_actor != "adaptive":
            lam = check_nonnegative_scalar(self.lam_actor, "lam_actor")
            if lam > 1:
                raise ValueError(f"lam_actor must lie in [0, 1] or be 'adaptive', got {self.lam_actor}")
        if not 0 <= check_nonnegative_scalar(self.lam_critic, "lam_critic") <= 1:
            raise ValueError(f"lam_critic must lie in [0, 1], got {self.lam_critic}")
        if self.critic_start not in ("zero", "reward-model"):
            raise ValueError(f"critic_start must be 'zero' or 'reward-model', got {self.critic_start!r}")
        if isinstance(self.warmup, bool) or not isinstance(self.warmup, numbers.Integral) or self.warmup < 0:
            raise ValueError(f"warmup must be a non-negative int, got {self.warmup!r}")
        if check_nonnegative_scalar(self.alpha, "alpha") == 0:
            raise ValueError("alpha must be positive")
        if self.estimator == "group" and (self.warmup or self.critic_start != "zero"):
            raise ValueError("the group estimator has no critic: leave warmup = 0 and critic_start = 'zero'")


@dataclass(frozen=True)
class PPOConfig:
    """Hyperparameters of :func:`train_ppo` (chapter 12 (:doc:`/chapters/12_critic_in_ppo`)); the defaults are the usual ones.

    ``samples_per_prompt * n_prompts`` responses per iteration and run, split
    into ``minibatches`` equal minibatches (it must divide) for each of
    ``epochs`` passes. ``value_clip=None`` turns the value clip off.
    ``early`` is :math:`t_{\\max}` of the κ fit.
    """

    iterations: int = 100
    samples_per_prompt: int = 16
    epochs: int = 2
    minibatches: int = 4
    actor_lr: float = 0.02
    critic_lr: float = 0.02
    clip_range: float = 0.2
    value_clip: Optional[float] = 0.2
    whiten: bool = True
    early: int = 4

    def __post_init__(self) -> None:
        for name in ("iterations", "samples_per_prompt", "epochs", "minibatches", "early"):
            check_positive_int(getattr(self, name), name)
        if self.samples_per_prompt < 2:
            raise ValueError("samples_per_prompt must be at least 2 (a group needs two responses)")
        for name in ("actor_lr", "critic_lr"):
            if check_nonnegative_scalar(getattr(self, name), name) == 0:
                raise ValueError(f"{name} must be positive")
        check_nonnegative_scalar(self.clip_range, "clip_range")
        if self.value_clip is not None:
            check_nonnegative_scalar(self.value_clip, "value_clip")
        check_flag(self.whiten, "whiten")


@dataclass
class PPOHistory:
    """What :func:`train_ppo` measures, one row per run (chapter 12 (:doc:`/chapters/12_critic_in_ppo`)).

    Arrays indexed by iteration ``k`` of shape ``(R, iterations + 1)`` hold
    the exact quantities of :math:`\\pi_k` (column 0: the initial policy);
    those of shape ``(R, iterations)`` are measured on iteration k's batch.
    """

    arm: Arm
    config: PPOConfig
    seeds: List[int]
    optimum: float
    """:math:`J^*`."""
    optimum_length: float
    """Exact mean length of :math:`\\pi^*`."""
    objective: np.ndarray
    """(R, I + 1): :math:`J(\\pi_k)`."""
    length: np.ndarray
    """(R, I + 1): exact mean length of :math:`\\pi_k`."""
    kl: np.ndarray
    """(R, I + 1): exact sequence KL of :math:`\\pi_k` to the reference."""
    kappa: np.ndarray
    """(R, I): :math:`\\kappa` of the actor's advantage (before whitening) on tokens t < ``early``; NaN where it is
    not defined (fewer than two such tokens, or exact advantages with no spread there: a tiny world)."""
    noise: np.ndarray
    """(R, I): the residual standard deviation of the same fit (the noise in :math:`\\hat A_t` at tokens t < ``early``); NaN where kappa is."""
    critic_rmse: np.ndarray
    """(R, I): RMS error of the critic against :math:`V^{\\pi_k}` over the batch's tokens (NaN for the group arm)."""
    early_bias: np.ndarray
    """(R, I): mean :math:`V_\\phi(s_t) - V^{\\pi_k}(s_t)` over tokens t < ``early`` (NaN for the group arm)."""
    clip_fraction: np.ndarray
    """(R, I): the fraction of tokens whose ratio was clipped, mean over the iteration's minibatch steps."""
    warmup_rmse: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))
    """(R, warmup + 1): the critic's RMS error against :math:`V^{\\pi_0}` during value pretraining."""

    @property
    def gap(self) -> np.ndarray:
        """(R, I + 1): :math:`J^* - J(\\pi_k) \\ge 0`."""
        return self.optimum - self.objective


def _per_run(x: torch.Tensor, runs: int) -> torch.Tensor:
    """Rows ordered by run, the same number per run: ``(R * n, T)`` to ``(R, n * T)``, one row per run."""
    return x.reshape(runs, -1)


def _run_rows(batch: PromptBatch, r: int) -> slice:
    n = batch.run.numel() // (int(batch.run.max()) + 1)
    return slice(r * n, (r + 1) * n)


def train_ppo(
    world: PromptWorld,
    arm: Arm,
    seeds: Sequence[int],
    config: PPOConfig = PPOConfig(),
    *,
    device: Optional[Union[str, torch.device]] = None,
) -> PPOHistory:
    """Train PPO from :math:`\\pi_0 = \\pi_\\text{ref}` on ``world``, one run per seed, the loop of chapter 12 (:doc:`/chapters/12_critic_in_ppo`).

    Each iteration k: evaluate :math:`\\pi_k` exactly (:func:`valuelab.lab.policy.evaluate_policy`);
    sample ``samples_per_prompt`` responses to every prompt
    (:func:`valuelab.lab.policy.sample_responses`); freeze the critic's values
    :math:`V_\\text{old}`; build advantages and targets
    (:func:`valuelab.decoupled_gae` with the arm's λs, or
    :func:`group_advantages`); whiten the advantages per run; then for each
    epoch, per-run shuffled minibatches: :func:`policy_loss` plus
    :func:`valuelab.value_loss` (clipped around :math:`V_\\text{old}`,
    token mean), one Adam step for each table.

    Args:
        world: from :func:`valuelab.lab.policy.make_prompt_world`.
        arm: the estimator and the critic's target, see :class:`Arm`.
        seeds: one run per seed (seeds the sampling and the minibatch order).
        config: see :class:`PPOConfig`.
        device: where the tables live (default :func:`valuelab.pick_device`).
    """
    if not isinstance(world, PromptWorld):
        raise TypeError(f"world must be a PromptWorld, got {type(world).__name__}")
    if not isinstance(arm, Arm):
        raise TypeError(f"arm must be an Arm, got {type(arm).__name__}")
    if not isinstance(config, PPOConfig):
        raise TypeError(f"config must be a PPOConfig, got {type(config).__name__}")
    if not isinstance(seeds, (list, tuple)) or not seeds:
        raise ValueError("seeds must be a non-empty list of ints")
    seeds = [check_seed(s, f"seeds[{i}]") for i, s in enumerate(seeds)]
    if (world.n_prompts * config.samples_per_prompt) % config.minibatches:
        raise ValueError("minibatches must divide n_prompts * samples_per_prompt (equal minibatches per run)")
    device = pick_device() if device is None else check_device(device)

    R, S, V = len(seeds), world.n_states, world.vocab_size
    gens = [torch.Generator().manual_seed(int(s)) for s in seeds]
    log_ref = torch.as_tensor(np.log(world.reference_policy()), dtype=torch.float32).reshape(S, V)
    logits = log_ref.repeat(R, 1).to(device).requires_grad_()
    start = torch.zeros(S) if arm.critic_start == "zero" else torch.as_tensor(reward_model_start(world).reshape(-1))
    table = start.to(torch.float32).repeat(R).to(device).requires_grad_()
    # fused Adam: the same update as the default one, in one kernel over the table (the tables are large, the batches small)
    opt_actor = torch.optim.Adam([logits], lr=config.actor_lr, fused=True)
    opt_critic = torch.optim.Adam([table], lr=config.critic_lr, fused=True)
    has_critic = arm.estimator == "gae"
    n_per_run = world.n_prompts * config.samples_per_prompt
    mb = n_per_run // config.minibatches

    def probs() -> torch.Tensor:
        return torch.softmax(logits.detach(), -1).reshape((R,) + world.state_shape + (V,))

    def evaluate(p: torch.Tensor):
        return evaluate_policy(world, p.double())

    def values_of(batch: PromptBatch) -> torch.Tensor:
        ro = batch.rollout
        return torch.where(ro.mask, table.detach()[ro.states], torch.zeros((), device=device))

    def per_run_rmse(batch: PromptBatch, v: torch.Tensor) -> np.ndarray:
        ro = batch.rollout
        sq = _per_run((v - ro.values_exact) ** 2, R)
        return masked_mean(sq, _per_run(ro.mask, R), dim=-1).sqrt().cpu().numpy()

    def shuffled() -> torch.Tensor:
        """Row indices of each run, shuffled by the run's own generator: (R, n_per_run)."""
        perms = [torch.randperm(n_per_run, generator=g) for g in gens]
        return (torch.stack(perms) + torch.arange(R)[:, None] * n_per_run).to(device)

    def fit(batch: PromptBatch, adv: Optional[torch.Tensor], targets: Optional[torch.Tensor], v_old: torch.Tensor,
            clip_value: Optional[float]) -> float:
        """The epochs of one iteration; adv None: critic only (value pretraining). Returns each run's mean clip fraction."""
        ro = batch.rollout
        fractions = []
        for _ in range(config.epochs):
            order = shuffled()
            for j in range(config.minibatches):
                idx = order[:, j * mb:(j + 1) * mb].reshape(-1)  # mb rows of every run, run-major
                states, tokens = ro.states[idx], ro.tokens[idx]
                m = ro.mask[idx]
                loss = torch.zeros((), device=device)
                if adv is not None:
                    logp = torch.log_softmax(logits[states], -1).gather(-1, tokens[..., None]).squeeze(-1)
                    pl = policy_loss(_per_run(logp, R), _per_run(ro.logprobs[idx], R), _per_run(adv[idx], R),
                                     mask=_per_run(m, R), clip_range=config.clip_range, aggregation="seq-mean-token-mean")
                    loss = loss + R * pl.loss  # the sum over runs of each run's token mean: runs stay independent
                    with torch.no_grad():
                        out = ((_per_run(logp, R) - _per_run(ro.logprobs[idx], R)).exp() - 1).abs() > config.clip_range
                        fractions.append(masked_mean(out.float(), _per_run(m, R), dim=-1).cpu().numpy())
                if targets is not None:
                    v = torch.where(m, table[states], torch.zeros((), device=device))
                    vl_ = value_loss(_per_run(v, R), _per_run(targets[idx], R), mask=_per_run(m, R),
                                     old_values=_per_run(v_old[idx], R), clip_range=clip_value,
                                     aggregation="seq-mean-token-mean")
                    loss = loss + R * vl_
                opt_actor.zero_grad(set_to_none=True)
                opt_critic.zero_grad(set_to_none=True)
                loss.backward()
                if adv is not None:
                    opt_actor.step()
                if targets is not None:
                    opt_critic.step()
        return np.mean(fractions, axis=0) if fractions else np.full(R, np.nan)

    # value pretraining: the critic alone, Monte-Carlo targets from the initial policy
    warm = np.zeros((R, arm.warmup + 1))
    if arm.warmup:
        p0 = probs()
        ev0 = evaluate(p0)
        for w in range(arm.warmup):
            batch = sample_responses(world, p0, config.samples_per_prompt, gens, evaluation=ev0)
            v_old = values_of(batch)
            warm[:, w] = per_run_rmse(batch, v_old)
            ro = batch.rollout
            targets = discounted_returns(ro.rewards, mask=ro.mask, gamma=world.gamma)
            fit(batch, None, targets, v_old, None)
        warm[:, -1] = per_run_rmse(batch, values_of(batch))

    optimum = soft_optimal(world)
    I = config.iterations
    objective, length, kl = np.zeros((R, I + 1)), np.zeros((R, I + 1)), np.zeros((R, I + 1))
    kappa, noise, rmse, bias, clipfrac = (np.full((R, I), np.nan) for _ in range(5))
    for k in range(I + 1):
        p_k = probs()
        ev = evaluate(p_k)
        objective[:, k], length[:, k], kl[:, k] = ev.objective, ev.length, ev.kl
        if k == I:
            break
        batch = sample_responses(world, p_k, config.samples_per_prompt, gens, evaluation=ev)
        ro = batch.rollout
        v_old = values_of(batch)
        if has_critic:
            lam_actor = length_adaptive_lam(ro.lengths, arm.alpha) if arm.lam_actor == "adaptive" else arm.lam_actor
            est = decoupled_gae(ro.rewards, v_old, mask=ro.mask, gamma=world.gamma, lam_actor=lam_actor,
                                lam_critic=arm.lam_critic)
            raw, targets = est.advantages, est.returns
            rmse[:, k] = per_run_rmse(batch, v_old)
            early = _per_run((v_old - ro.values_exact)[:, : config.early], R)
            bias[:, k] = masked_mean(early, _per_run(ro.mask[:, : config.early], R), dim=-1).cpu().numpy()
        else:
            total = ro.rewards.sum(-1)  # the KL-shaped return of each response, the same objective as the other arms
            zero = torch.zeros((), device=device)
            raw = torch.where(ro.mask, group_advantages(total, batch.group, normalise=False)[:, None], zero)
            adv = torch.where(ro.mask, group_advantages(total, batch.group)[:, None], zero)
            targets = None
        if has_critic:
            adv = raw
        if config.whiten:
            adv = torch.cat([masked_whiten(adv[_run_rows(batch, r)], ro.mask[_run_rows(batch, r)]) for r in range(R)])
        for r in range(R):  # raw: before any normalisation (the group arm's centred return), on the exact scale
            rows = _run_rows(batch, r)
            try:
                kappa[r, k], _, noise[r, k] = advantage_fit(raw[rows], ro.advantages_exact[rows], ro.mask[rows], config.early)
            except _FitUndefined:  # a world too small to measure kappa at this iteration: NaN, "not defined"
                pass
        clipfrac[:, k] = fit(batch, adv, targets, v_old, config.value_clip)
    return PPOHistory(
        arm=arm,
        config=config,
        seeds=[int(s) for s in seeds],
        optimum=optimum.objective,
        optimum_length=float(evaluate_policy(world, optimum.policy).length),
        objective=objective,
        length=length,
        kl=kl,
        kappa=kappa,
        noise=noise,
        critic_rmse=rmse,
        early_bias=bias,
        clip_fraction=clipfrac,
        warmup_rmse=warm,
    )


Job = Union[Tuple[PromptWorld, Arm, PPOConfig], Tuple[PromptWorld, Arm, PPOConfig, Sequence[int]]]


def _run_job(job: Tuple[PromptWorld, Arm, PPOConfig, List[int], str]) -> PPOHistory:
    world, arm, config, seeds, device = job
    torch.set_num_threads(1)
    return train_ppo(world, arm, seeds, config, device=device)


def _check_seeds(seeds: object, name: str) -> List[int]:
    if not isinstance(seeds, (list, tuple)) or not seeds:
        raise ValueError(f"{name} must be a non-empty list of ints")
    return [check_seed(s, f"{name}[{i}]") for i, s in enumerate(seeds)]


def train_many(
    jobs: Sequence[Job],
    seeds: Optional[Sequence[int]] = None,
    *,
    processes: int = 2,
    device: Optional[Union[str, torch.device]] = None,
) -> List[PPOHistory]:
    """:func:`train_ppo` for several jobs, spread over CPU processes (chapter 12 (:doc:`/chapters/12_critic_in_ppo`)).

    A job is ``(world, arm, config)``, trained on ``seeds``, or
    ``(world, arm, config, its_seeds)``. Each job is one :func:`train_ppo`
    call, run with one thread in a forked worker, so its history is the one
    that call gives in one process (and run ``i`` of a job depends only on
    its seed, so two jobs that share a seed can be compared run by run);
    jobs share nothing. ``processes=1``, or a CUDA device (a forked process
    cannot use its parent's CUDA context), runs the jobs one after the other
    here. Returns the histories in the order of ``jobs``.
    """
    check_positive_int(processes, "processes")
    if not isinstance(jobs, (list, tuple)):
        raise TypeError(f"jobs must be a list of (PromptWorld, Arm, PPOConfig[, seeds]) tuples, got {type(jobs).__name__}")
    jobs = list(jobs)
    default = None if seeds is None else _check_seeds(seeds, "seeds")
    device = pick_device() if device is None else check_device(device)
    work = []
    for i, job in enumerate(jobs):
        if not (isinstance(job, tuple) and len(job) in (3, 4) and isinstance(job[0], PromptWorld)
                and isinstance(job[1], Arm) and isinstance(job[2], PPOConfig)):
            raise TypeError(f"jobs[{i}] must be a (PromptWorld, Arm, PPOConfig[, seeds]) tuple")
        if len(job) == 4:
            own = _check_seeds(job[3], f"jobs[{i}] seeds")
        elif default is None:
            raise ValueError(f"jobs[{i}] has no seeds of its own and seeds is None")
        else:
            own = default
        work.append((job[0], job[1], job[2], own, str(device)))
    if processes == 1 or len(work) < 2 or device.type != "cpu":
        return [_run_job(w) for w in work]
    import importlib  # noqa: PLC0415
    import multiprocessing  # noqa: PLC0415

    importlib.import_module("torch._dynamo")  # Adam imports it on first use: once here, not once per worker

    with multiprocessing.get_context("fork").Pool(min(processes, len(work))) as pool:
        return pool.map(_run_job, work, chunksize=1)
