"""A token world with many prompts and a learnable policy, solved exactly (chapter 12 (:doc:`/chapters/12_critic_in_ppo`)).

Chapter 7's world keeps the policy fixed; here it moves. The world is the
same kind of object (a vocabulary with ``EOS = 0`` and ``GOOD = 1``, responses
cut at ``max_len``, a reward model :math:`f(k, L)` of the GOOD count and the
length, the per-token KL-shaped reward of chapter 3), with two changes:

* **many prompts** :math:`p = 0..P-1`: each prompt has its own reference
  :math:`\\pi_\\text{ref}(a\\mid p, c)` (a seeded bigram table with its own
  EOS probability), so a critic must learn a prompt-dependent baseline;
* **a learnable policy** :math:`\\pi(a\\mid s)`, one distribution per state
  :math:`s = (p, t, c, k)` (prompt, position, previous token, GOOD count),
  EOS included, so that the length can grow or collapse.

For a state-dependent policy everything is exact by backward dynamic
programming over these states (:func:`evaluate_policy`, equation
:eq:`eq-policy-bellman`): the value :math:`V^\\pi`, the action value
:math:`Q^\\pi`, the KL-regularised objective
:math:`J(\\pi) = \\E_p\\,\\E_{y\\sim\\pi}\\big[f(y) - \\beta\\,\\mathrm{KL}_\\text{seq}\\big]`,
its two parts and the mean length. The best policy of that objective and its
value :math:`J^*` come from the soft Bellman equation :eq:`eq-soft-bellman`
(:func:`soft_optimal`). :func:`sample_responses` draws a batch from a
policy, for many independent runs at once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple, Optional, Sequence, Union

import numpy as np
import torch

from .._engine.checks import (check_memory, check_nonnegative_scalar, check_positive_int, check_scalar, check_seed, dense, require_finite,
                      require_finite_result)
from ..advantages import td_errors
from ..rewards import kl_shaped_rewards
from .world import EOS, GOOD, Rollout, ScoreFn, _check_unit, _generator, _score_table, fraction_good

__all__ = [
    "PromptWorld",
    "make_prompt_world",
    "PolicyEvaluation",
    "evaluate_policy",
    "SoftOptimum",
    "soft_optimal",
    "reward_model_start",
    "PromptBatch",
    "sample_responses",
    "count_good",
]


def count_good(count: np.ndarray, length: np.ndarray, scale: float = 8.0) -> np.ndarray:
    """A reward model that pays for GOOD tokens, :math:`f(k, L) = \\min(k, s)/s` with ``s = scale`` (chapter 12 (:doc:`/chapters/12_critic_in_ppo`)).

    Unlike :func:`valuelab.lab.world.fraction_good` it rewards length: a response
    needs ``scale`` GOOD tokens for the full score, as a long reasoning chain
    needs its steps.

    ``count``: a number, a numpy array or a tensor of real numbers; the
    result is float64, of the same kind (a tensor for a tensor), computed in
    float64 whatever ``count``'s dtype (a float32 ``scale`` of 1e-300 would
    round to 0). ``length`` is not read. ``scale``: a finite real number
    above 0 (``scale = 0`` would divide by zero). TypeError or ValueError
    naming the argument otherwise, and a ValueError naming ``scale`` when
    ``count / scale`` overflows float64.
    """
    s = check_scalar(scale, "scale")
    if not (math.isfinite(s) and s > 0):
        raise ValueError(f"scale must be a finite number above 0, got {s}")
    why = "count / scale overflows float64: scale is too small for these counts"
    if isinstance(count, torch.Tensor):
        if count.dtype == torch.bool or count.is_complex():
            raise TypeError(f"count must hold real numbers, got {count.dtype}")
        c = dense(count, "count").to(torch.float64)
        require_finite(c, "count")
        return require_finite_result(torch.clamp(c, max=s) / s, "scale", why)
    c = np.asarray(count)
    if c.dtype.kind not in "iuf":
        raise TypeError(f"count must hold real numbers, got {c.dtype}")
    c = c.astype(np.float64)
    if not np.isfinite(c).all():
        raise ValueError("count must be finite: it contains NaN or inf")
    with np.errstate(over="ignore"):
        out = np.minimum(c, s) / s
    if not np.isfinite(out).all():
        raise ValueError(f"scale: {why}")
    return out


@dataclass(frozen=True, eq=False)
class PromptWorld:
    """A world of ``n_prompts`` prompts whose policy can be any table over states (chapter 12 (:doc:`/chapters/12_critic_in_ppo`)).

    Build it with :func:`make_prompt_world`. A state :math:`s = (p, t, c, k)`
    has prompt ``p``, position ``0 <= t < max_len``, previous token ``c``
    (``bos = vocab_size`` before the first token) and GOOD count ``k``; its
    flat index is ``((p * max_len + t) * n_contexts + c) * n_counts + k``
    (:meth:`state_index`). A policy is an array of shape
    ``state_shape + (vocab_size,)`` (any leading axes: one per run).
    """

    n_prompts: int
    vocab_size: int
    max_len: int
    max_count: int
    """Counts saturate here: the state keeps :math:`\\min(k, \\text{max\\_count})`."""
    beta: float
    gamma: float
    seed: int
    pi_ref: np.ndarray
    """(P, V + 1, V) float64: :math:`\\pi_\\text{ref}(a\\mid p, c)`, every entry positive."""
    score_table: np.ndarray
    """(max_len + 1, max_count + 1) float64: ``score_table[L, k]`` = :math:`f(k, L)` (row 0: the score at length 1)."""

    @property
    def bos(self) -> int:
        """Context id of the empty prefix."""
        return self.vocab_size

    @property
    def n_contexts(self) -> int:
        """Number of contexts: the ``V`` tokens and BOS."""
        return self.vocab_size + 1

    @property
    def n_counts(self) -> int:
        """Size of the count axis, ``max_count + 1`` (counts 0..max_count)."""
        return self.max_count + 1

    @property
    def state_shape(self) -> tuple:
        """``(P, max_len, n_contexts, n_counts)``: the axes of a value table."""
        return (self.n_prompts, self.max_len, self.n_contexts, self.n_counts)

    @property
    def n_states(self) -> int:
        """Number of states in the tables, reachable or not."""
        return int(np.prod(self.state_shape))

    def state_index(self, p, t, context, count):
        """Flat index of state (p, t, c, k); works on ints, arrays and tensors."""
        return ((p * self.max_len + t) * self.n_contexts + context) * self.n_counts + count

    def reference_policy(self) -> np.ndarray:
        """:math:`\\pi_\\text{ref}` as a policy table of shape ``state_shape + (V,)`` (the same at every t and k)."""
        P, L, C, K = self.state_shape
        return np.broadcast_to(self.pi_ref[:, None, :, None, :], (P, L, C, K, self.vocab_size)).copy()


def make_prompt_world(
    n_prompts: int = 8,
    vocab_size: int = 4,
    max_len: int = 16,
    *,
    eos_range: Sequence[float] = (0.05, 0.2),
    beta: float = 0.05,
    gamma: float = 1.0,
    logit_scale: float = 1.0,
    score_fn: Optional[ScoreFn] = None,
    max_count: Optional[int] = None,
    seed: int = 0,
) -> PromptWorld:
    """Build the many-prompt world of chapter 12 (:doc:`/chapters/12_critic_in_ppo`).

    Prompt ``p`` gets its own reference: an EOS probability drawn uniformly
    from ``eos_range`` (the same in every context) and seeded bigram logits
    of standard deviation ``logit_scale`` for the other tokens.

    Args:
        n_prompts: number of prompts P (each sampled equally often).
        vocab_size: tokens ``V >= 3``, EOS (0) and GOOD (1) included.
        max_len: longest response; a response that reaches it is cut there.
        eos_range: ``(low, high)`` with ``0 < low <= high < 1``.
        beta: KL coefficient :math:`\\beta \\ge 0` of the per-token reward.
        gamma: discount in [0, 1].
        logit_scale: spread of the reference's bigram logits.
        score_fn: reward model :math:`f(k, L)` (default :func:`count_good`).
        max_count: where the GOOD count saturates in the state (default
            ``max_len + 1``: never). It must not change the score:
            :math:`f(k, L) = f(\\min(k, \\text{max\\_count}), L)` for every
            reachable :math:`k \\le L`, else ``ValueError``. ``count_good``
            with scale ``s`` allows ``max_count = s``: a smaller state space,
            the same values.
        seed: seeds the tables, an int in [0, 2**63 - 1] (as every seed of valuelab).
    """
    n_prompts = check_positive_int(n_prompts, "n_prompts")
    vocab_size = check_positive_int(vocab_size, "vocab_size")
    if vocab_size < 3:
        raise ValueError(f"vocab_size must be at least 3 (EOS, GOOD and one more), got {vocab_size}")
    max_len = check_positive_int(max_len, "max_len")
    if not isinstance(eos_range, (tuple, list)) or len(eos_range) != 2:
        raise TypeError("eos_range must be a pair (low, high)")
    low = _check_unit(eos_range[0], "eos_range[0]", closed_top=False)
    high = _check_unit(eos_range[1], "eos_range[1]", closed_top=False)
    if not 0 < low <= high:
        raise ValueError(f"eos_range must satisfy 0 < low <= high < 1, got {tuple(eos_range)}")
    beta = check_nonnegative_scalar(beta, "beta")
    gamma = _check_unit(gamma, "gamma")
    logit_scale = check_nonnegative_scalar(logit_scale, "logit_scale")
    seed = check_seed(seed)
    check_memory(8 * 8 * n_prompts * (vocab_size + 1) * vocab_size, "vocab_size" if vocab_size >= n_prompts else "n_prompts")
    check_memory(8 * 8 * (max_len + 1) * (max_len + 2), "max_len")
    if score_fn is None:
        score_fn = count_good
    elif not callable(score_fn):
        raise TypeError(f"score_fn must be callable (count, length) -> score, got {type(score_fn).__name__}")

    full = _score_table(score_fn, max_len)  # (L + 1, L + 2)
    if max_count is None:
        max_count = max_len + 1
    max_count = check_positive_int(max_count, "max_count")
    if max_count > max_len + 1:
        raise ValueError(f"max_count must be at most max_len + 1 = {max_len + 1}, got {max_count}")
    lengths = np.arange(max_len + 1)[:, None]
    counts = np.arange(max_len + 2)[None, :]
    reachable = counts <= np.maximum(lengths, 1)
    capped = full[:, np.minimum(counts[0], max_count)]
    if not np.allclose(np.where(reachable, full, 0.0), np.where(reachable, capped, 0.0), rtol=0, atol=1e-12):
        raise ValueError(f"max_count = {max_count} changes the score: score_fn must depend on k only through min(k, max_count)")

    rng = np.random.default_rng(int(seed))
    C = vocab_size + 1
    eos = rng.uniform(low, high, size=(n_prompts, 1, 1))
    logits = logit_scale * rng.standard_normal((n_prompts, C, vocab_size - 1))
    body = np.exp(logits - logits.max(-1, keepdims=True))
    body /= body.sum(-1, keepdims=True)
    pi_ref = np.concatenate([np.broadcast_to(eos, (n_prompts, C, 1)), (1.0 - eos) * body], axis=-1)
    if not (pi_ref > 0).all():
        raise ValueError("logit_scale is too large: a reference probability underflows to 0")
    return PromptWorld(
        n_prompts=n_prompts,
        vocab_size=vocab_size,
        max_len=max_len,
        max_count=max_count,
        beta=beta,
        gamma=gamma,
        seed=int(seed),
        pi_ref=pi_ref,
        score_table=full[:, : max_count + 1].copy(),
    )


def _check_world(world: object) -> PromptWorld:
    if not isinstance(world, PromptWorld):
        raise TypeError(f"world must be a PromptWorld (see make_prompt_world), got {type(world).__name__}")
    return world


def _check_policy(world: PromptWorld, probs: object, name: str = "probs") -> np.ndarray:
    """A policy table as float64 numpy, shape ``(..., P, L, C, K, V)``, rows on the simplex."""
    if isinstance(probs, torch.Tensor):
        probs = dense(probs, name).detach().to("cpu", torch.float64).numpy()
    if not isinstance(probs, np.ndarray):
        raise TypeError(f"{name} must be a numpy array or a torch tensor, got {type(probs).__name__}")
    if not np.issubdtype(probs.dtype, np.floating):
        raise TypeError(f"{name} must hold floats, got {probs.dtype}")
    tail = world.state_shape + (world.vocab_size,)
    if probs.shape[probs.ndim - len(tail):] != tail or probs.ndim < len(tail):
        raise ValueError(f"{name} must have shape (..., {', '.join(map(str, tail))}), got {probs.shape}")
    probs = probs.astype(np.float64, copy=False)
    if not np.isfinite(probs).all() or (probs < 0).any():
        raise ValueError(f"{name} must hold finite, non-negative probabilities")
    if not np.allclose(probs.sum(-1), 1.0, rtol=0, atol=1e-6):
        raise ValueError(f"{name} must sum to 1 over its last axis (the next token)")
    return probs


def _transitions(world: PromptWorld):
    """For each (t, k, a): the count after a, whether a ends the response, and the score it then earns."""
    L, K, V = world.max_len, world.n_counts, world.vocab_size
    k = np.arange(K)[:, None]
    a = np.arange(V)[None, :]
    k_after = np.minimum(k + (a == GOOD), K - 1)  # (K, V): the count saturates at max_count
    t = np.arange(L)[:, None, None]
    final = (a[None] == EOS) | (t == L - 1)  # (L, 1, V)
    final = np.broadcast_to(final, (L, K, V))
    final_score = np.where(final, world.score_table[np.arange(1, L + 1)[:, None, None], k_after[None]], 0.0)
    return k_after, final, final_score


def _backward(
    world: PromptWorld, probs: np.ndarray, step_reward: np.ndarray, final_reward: np.ndarray, gamma: float, want_q: bool = True
):
    """Backward DP of equation :eq:`eq-policy-bellman` for any per-(s, a) reward; returns (V, Q) (Q None unless ``want_q``)."""
    lead = probs.shape[:-5]
    P, L, C, K = world.state_shape
    V = world.vocab_size
    k_after, final, _ = _transitions(world)
    values = np.zeros(lead + (P, L, C, K))
    q = np.zeros(lead + (P, L, C, K, V)) if want_q else None
    nxt = np.zeros(lead + (P, K, V))  # V(s') for each (k, a), s' = (p, t + 1, a, k_after)
    a_idx = np.arange(V)[None, :]
    for t in range(L - 1, -1, -1):
        cont = np.where(final[t], 0.0, gamma * nxt)  # (..., P, K, V)
        step_t = step_reward[..., t if step_reward.shape[-4] > 1 else 0, :, :, :]  # an axis of size 1 broadcasts over t
        final_t = final_reward[t if final_reward.shape[0] > 1 else 0]
        q_t = step_t + final_t + cont[..., :, None, :, :]  # (..., P, C, K, V)
        if want_q:
            q[..., t, :, :, :] = q_t
        values[..., t, :, :] = (probs[..., t, :, :, :] * q_t).sum(-1)
        if t > 0:
            nxt = values[..., t, :, :][..., a_idx, k_after]  # (..., P, K, V): V(p, t, c = a, k_after(k, a))
    return values, q


def _log_ratio(world: PromptWorld, probs: np.ndarray) -> np.ndarray:
    """:math:`\\log\\pi(a\\mid s) - \\log\\pi_\\text{ref}(a\\mid p, c)`, 0 where :math:`\\pi = 0` (its weight in every sum)."""
    log_ref = np.log(world.pi_ref)[:, None, :, None, :]  # (P, 1, C, 1, V)
    with np.errstate(divide="ignore"):
        log_pi = np.log(probs)
    return np.where(probs > 0, log_pi - log_ref, 0.0)


class PolicyEvaluation(NamedTuple):
    """Exact evaluation of a policy, from :func:`evaluate_policy` (chapter 12 (:doc:`/chapters/12_critic_in_ppo`)).

    Leading axes (one per run) come first in every field.
    """

    values: np.ndarray
    """(..., P, L, C, K): :math:`V^\\pi(s)` of the KL-shaped reward."""
    q: np.ndarray
    """(..., P, L, C, K, V): :math:`Q^\\pi(s, a)`; :math:`A^\\pi = Q^\\pi - V^\\pi` (for an action of probability 0 its KL term is left out: it is never taken)."""
    objective: np.ndarray
    """(...,): :math:`J(\\pi) = \\E_p V^\\pi(p, s_0)`, the KL-regularised objective."""
    score: np.ndarray
    """(...,): the expected reward-model score, discounted to the start, :math:`\\E[\\gamma^{L-1} f(y)]` (the plain mean score when :math:`\\gamma = 1`)."""
    kl: np.ndarray
    """(...,): the expected discounted sequence KL (the sequence KL when :math:`\\gamma = 1`); :math:`J = \\text{score} - \\beta\\,\\text{kl}`."""
    length: np.ndarray
    """(...,): the expected number of generated tokens (EOS included)."""
    per_prompt: np.ndarray
    """(..., P): :math:`V^\\pi(p, s_0)` of each prompt."""


def evaluate_policy(world: PromptWorld, probs: Union[np.ndarray, torch.Tensor]) -> PolicyEvaluation:
    """Evaluate a state-dependent policy exactly by backward DP, equation :eq:`eq-policy-bellman` of chapter 12 (:doc:`/chapters/12_critic_in_ppo`).

    .. math::

        Q^\\pi(s, a) = \\bar r(s, a) + \\gamma\\,[a\\ \\text{not final}]\\,V^\\pi(s'),

        V^\\pi(s) = \\sum_a \\pi(a\\mid s)\\,Q^\\pi(s, a),

    with :math:`\\bar r(s, a) = -\\beta\\log\\frac{\\pi(a\\mid s)}{\\pi_\\text{ref}(a\\mid p, c)} + [a\\ \\text{final}]\\,f(k', t + 1)`,
    the expectation of the k1 KL-shaped reward of chapter 3 (the policy
    being evaluated is the one that samples, :math:`\\pi_\\text{old}`).

    Args:
        world: from :func:`make_prompt_world`.
        probs: the policy, shape ``(..., P, L, C, K, V)`` (numpy or torch);
            every row sums to 1. Leading axes are independent policies.
    """
    world = _check_world(world)
    probs = _check_policy(world, probs)
    _, _, final_score = _transitions(world)
    final_score = final_score[:, None]  # (L, 1, K, V): broadcast over contexts
    none = np.zeros((1, 1, 1, 1))
    rho = _log_ratio(world, probs)
    values, q = _backward(world, probs, -world.beta * rho, final_score, world.gamma)
    kl_v, _ = _backward(world, probs, rho, none, world.gamma, want_q=False)
    score_v = values + world.beta * kl_v  # the score part of V, by linearity of the DP in the reward
    length_v, _ = _backward(world, probs, np.ones((1, 1, 1, 1, 1)), none, 1.0, want_q=False)  # one per generated token
    s0 = (slice(None), 0, world.bos, 0)

    def start(x: np.ndarray) -> np.ndarray:
        return x[(Ellipsis,) + s0]

    per_prompt = start(values)
    return PolicyEvaluation(
        values=values,
        q=q,
        objective=per_prompt.mean(-1),
        score=start(score_v).mean(-1),
        kl=start(kl_v).mean(-1),
        length=start(length_v).mean(-1),
        per_prompt=per_prompt,
    )


class SoftOptimum(NamedTuple):
    """The best policy of the KL-regularised objective, from :func:`soft_optimal` (chapter 12 (:doc:`/chapters/12_critic_in_ppo`))."""

    values: np.ndarray
    """(P, L, C, K): :math:`V^*(s)`."""
    policy: np.ndarray
    """(P, L, C, K, V): :math:`\\pi^*(a\\mid s) = \\pi_\\text{ref}(a\\mid p, c)\\,e^{(Q^*(s, a) - V^*(s))/\\beta}`."""
    objective: float
    """:math:`J^* = \\E_p V^*(p, s_0) = \\max_\\pi J(\\pi)`."""
    per_prompt: np.ndarray
    """(P,): :math:`V^*(p, s_0)`."""


def soft_optimal(world: PromptWorld) -> SoftOptimum:
    """Solve the soft Bellman equation :eq:`eq-soft-bellman` of chapter 12 (:doc:`/chapters/12_critic_in_ppo`) by backward DP.

    .. math::

        Q^*(s, a) = [a\\ \\text{final}]\\,f(k', t+1) + \\gamma\\,[a\\ \\text{not final}]\\,V^*(s'),

        V^*(s) = \\beta\\log\\sum_a \\pi_\\text{ref}(a\\mid p, c)\\,e^{Q^*(s, a)/\\beta}.

    :math:`V^*(p, s_0)` is the largest :math:`J` any policy reaches on prompt
    ``p``; with :math:`\\gamma = 1` it equals
    :math:`\\beta\\log\\E_{y\\sim\\pi_\\text{ref}}e^{f(y)/\\beta}`. Needs :math:`\\beta > 0`.
    """
    world = _check_world(world)
    if world.beta <= 0:
        raise ValueError("world.beta must be positive for the soft optimum (beta = 0 has no KL term to soften the max)")
    P, L, C, K = world.state_shape
    V = world.vocab_size
    k_after, final, final_score = _transitions(world)
    log_ref = np.log(world.pi_ref)[:, :, None, :]  # (P, C, 1, V)
    values = np.zeros((P, L, C, K))
    policy = np.zeros((P, L, C, K, V))
    nxt = np.zeros((P, K, V))
    a_idx = np.arange(V)[None, :]
    for t in range(L - 1, -1, -1):
        q_t = final_score[t] + np.where(final[t], 0.0, world.gamma * nxt)  # (P, K, V)
        z = log_ref + q_t[:, None] / world.beta  # (P, C, K, V)
        zmax = z.max(-1, keepdims=True)
        lse = zmax[..., 0] + np.log(np.exp(z - zmax).sum(-1))
        values[:, t] = world.beta * lse
        policy[:, t] = np.exp(z - lse[..., None])
        nxt = values[:, t][:, a_idx, k_after]
    per_prompt = values[:, 0, world.bos, 0]
    return SoftOptimum(values=values, policy=policy, objective=float(per_prompt.mean()), per_prompt=per_prompt)


def reward_model_start(world: PromptWorld) -> np.ndarray:
    """The critic a reward model gives at the start, :math:`V_0(p, t, c, k) = f(k, t)` (chapter 12 (:doc:`/chapters/12_critic_in_ppo`)).

    A reward model trained on finished responses, read at the state before
    token :math:`t`, scores the prefix of :math:`t` tokens as if it were the
    whole response (the "prefix as finished" critic of chapter 10; at
    :math:`t = 0` the score of length 1). Shape ``state_shape``.
    """
    world = _check_world(world)
    P, L, C, K = world.state_shape
    table = world.score_table[np.arange(L)]  # (L, K): row t is f(., t), row 0 at length 1
    return np.broadcast_to(table[None, :, None, :], (P, L, C, K)).copy()


class PromptBatch(NamedTuple):
    """A batch of responses for many runs, from :func:`sample_responses` (chapter 12 (:doc:`/chapters/12_critic_in_ppo`)).

    Rows are ordered run, then prompt, then sample: row
    ``(r * P + p) * G + g``; ``rollout.states`` index the flat table of all
    runs (``r * n_states + s``).
    """

    rollout: Rollout
    run: torch.Tensor
    """(B,) long: the run of each row."""
    prompt: torch.Tensor
    """(B,) long: the prompt of each row."""
    group: torch.Tensor
    """(B,) long: ``run * P + prompt``, the group of the responses to one prompt in one run."""


def sample_responses(
    world: PromptWorld,
    probs: torch.Tensor,
    samples_per_prompt: int,
    generators: Sequence[Union[int, torch.Generator]],
    *,
    evaluation: Optional[PolicyEvaluation] = None,
    dtype: torch.dtype = torch.float32,
) -> PromptBatch:
    """Sample ``samples_per_prompt`` responses to every prompt for each run (chapter 12 (:doc:`/chapters/12_critic_in_ppo`)).

    Args:
        world: from :func:`make_prompt_world`.
        probs: ``(R, P, L, C, K, V)`` tensor, the policy of each of R runs
            (it samples: :math:`\\pi_\\text{old}`). The batch lives on its device.
        samples_per_prompt: G responses per prompt and run.
        generators: R CPU generators (or int seeds), one per run: run r's
            draws come from its own generator only, so a run does not depend
            on which other runs share the batch.
        evaluation: :func:`evaluate_policy` of ``probs``; when given, the
            rollout's ``values_exact`` and ``advantages_exact`` hold
            :math:`V^\\pi` and :math:`A^\\pi`, else zeros.
        dtype: float dtype of the float tensors.

    Rewards are :func:`valuelab.kl_shaped_rewards` (k1) with the world's
    ``beta``; the score has no noise.
    """
    world = _check_world(world)
    if not isinstance(probs, torch.Tensor):
        raise TypeError(f"probs must be a torch.Tensor, got {type(probs).__name__}")
    probs = dense(probs, "probs")
    shape = world.state_shape + (world.vocab_size,)
    if probs.dim() != len(shape) + 1 or tuple(probs.shape[1:]) != shape:
        raise ValueError(f"probs must have shape (R, {', '.join(map(str, shape))}), got {tuple(probs.shape)}")
    if not probs.is_floating_point() or not bool(torch.isfinite(probs).all()) or bool((probs < 0).any()):
        raise ValueError("probs must hold finite, non-negative probabilities")
    if not bool(torch.allclose(probs.sum(-1), torch.ones((), dtype=probs.dtype, device=probs.device), rtol=0, atol=1e-5)):
        raise ValueError("probs must sum to 1 over its last axis (the next token)")
    G = check_positive_int(samples_per_prompt, "samples_per_prompt")
    R = probs.shape[0]
    check_memory(R * world.n_prompts * G * world.max_len * 128, "samples_per_prompt", probs.device)  # (B, T) tensors
    if not isinstance(generators, (list, tuple)) or len(generators) != R:
        raise ValueError(f"generators must be a list of {R} generators or seeds, one per run")
    gens = [_generator(g, f"generators[{i}]") for i, g in enumerate(generators)]
    if evaluation is not None and (
        not isinstance(evaluation, PolicyEvaluation) or evaluation.values.shape != (R,) + world.state_shape
    ):
        raise ValueError(f"evaluation must be the PolicyEvaluation of probs (values of shape {(R,) + world.state_shape})")
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating torch.dtype, got {dtype}")

    device = probs.device
    P, L, C, K = world.state_shape
    S, V = world.n_states, world.vocab_size
    flat = probs.detach().reshape(R * S, V).double()
    cdf = flat.cumsum(-1)
    cdf[:, -1] = 1.0
    log_pi = torch.log(flat)
    log_ref = torch.as_tensor(np.log(world.pi_ref), device=device)  # (P, C, V)

    B = R * P * G
    run = torch.arange(R, device=device).repeat_interleave(P * G)
    prompt = torch.arange(P, device=device).repeat_interleave(G).repeat(R)
    tokens = torch.zeros(B, L, dtype=torch.long, device=device)
    states = torch.zeros(B, L, dtype=torch.long, device=device)
    contexts = torch.zeros(B, L, dtype=torch.long, device=device)
    mask = torch.zeros(B, L, dtype=torch.bool, device=device)
    ctx = torch.full((B,), world.bos, dtype=torch.long, device=device)
    count = torch.zeros(B, dtype=torch.long, device=device)
    alive = torch.ones(B, dtype=torch.bool, device=device)
    T = L
    for t in range(L):
        # a run draws only while one of its own responses is alive, so its generator never depends on the other runs
        running = alive.reshape(R, P * G).any(-1).tolist()
        u = torch.cat([
            torch.rand(P * G, 1, generator=g, dtype=torch.float64) if on else torch.zeros(P * G, 1, dtype=torch.float64)
            for g, on in zip(gens, running)
        ]).to(device)
        s = run * S + world.state_index(prompt, t, ctx, count)
        a = torch.searchsorted(cdf[s], u, right=True).squeeze(-1).clamp_(max=V - 1)
        a = torch.where(alive, a, torch.zeros_like(a))
        tokens[:, t] = a
        mask[:, t] = alive
        contexts[:, t] = ctx
        states[:, t] = torch.where(alive, s, torch.zeros_like(s))
        count = (count + (alive & (a == GOOD)).long()).clamp_(max=world.max_count)
        alive = alive & (a != EOS)
        ctx = a
        if not bool(alive.any()):
            T = t + 1
            break
    tokens, states, contexts, mask = tokens[:, :T], states[:, :T], contexts[:, :T], mask[:, :T]
    lengths = mask.sum(-1)

    zero = torch.zeros((), dtype=dtype, device=device)
    logprobs = torch.where(mask, log_pi[states, tokens].to(dtype), zero)
    ref_logprobs = torch.where(mask, log_ref[prompt[:, None], contexts, tokens].to(dtype), zero)
    score = torch.as_tensor(world.score_table, device=device)[lengths, count].to(dtype)
    rewards = kl_shaped_rewards(logprobs, ref_logprobs, score, mask=mask, beta=world.beta)
    if evaluation is None:
        values_exact = torch.zeros_like(rewards)
        advantages_exact = torch.zeros_like(rewards)
    else:
        table = torch.as_tensor(evaluation.values.reshape(-1), device=device)
        values_exact = torch.where(mask, table[states].to(dtype), zero)
        advantages_exact = td_errors(rewards, values_exact, mask=mask, gamma=world.gamma)
    rollout = Rollout(
        tokens=tokens,
        mask=mask,
        logprobs=logprobs,
        ref_logprobs=ref_logprobs,
        score=score,
        rewards=rewards,
        values_exact=values_exact,
        advantages_exact=advantages_exact,
        lengths=lengths,
        states=states,
        gamma=world.gamma,
    )
    return PromptBatch(rollout=rollout, run=run, prompt=prompt, group=run * P + prompt)
