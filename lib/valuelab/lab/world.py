"""A toy language-model world whose value function is known exactly (chapter 7 (:doc:`/chapters/07_propagation`)).

The world is small enough to solve and rich enough to look like RLHF:

* a vocabulary of ``vocab_size`` tokens; token ``EOS = 0`` ends a response,
  token ``GOOD = 1`` is the one the reward model likes, and a response that
  reaches ``max_len`` tokens is cut there (its last token is the last one, the
  episode ends, the score is given on that token, nothing is bootstrapped);
* a policy :math:`\\pi_\\text{old}(a\\mid c)` and a reference
  :math:`\\pi_\\text{ref}(a\\mid c)` that are fixed, seeded bigram tables (the
  next token depends on the previous token ``c`` only, ``BOS`` before the
  first token); :math:`P(\\text{EOS}) = ` ``eos_prob`` at every step, so the
  length is geometric with mean about ``1 / eos_prob`` (cut at ``max_len``),
  and ``eos_prob = 0`` gives fixed-length responses of exactly ``max_len``
  tokens; :math:`\\pi_\\text{ref}` is :math:`\\pi_\\text{old}` with its logits
  perturbed by ``ref_shift`` times seeded Gaussian noise;
* a reward model whose score :math:`r_\\text{RM} = f(\\text{count}, \\text{length})`
  depends on the response only through the number of ``GOOD`` tokens and its
  length (default: the fraction of ``GOOD`` tokens), plus optional zero-mean
  Gaussian noise ``score_noise`` (which changes no expectation);
* the per-token reward of chapter 3, :math:`r_t = -\\beta\\,(\\log\\pi_\\text{old}
  - \\log\\pi_\\text{ref})(a_t\\mid s_t) + [t = T]\\, r_\\text{RM}`, built with
  :func:`valuelab.kl_shaped_rewards` (estimator k1).

The state before token :math:`t` is therefore Markov as
:math:`s_t = (t, c_t, k_t)`: the position, the previous token and the count of
``GOOD`` tokens so far. Backward dynamic programming over these states gives
the exact :math:`V^\\pi(s)` of every state, equation :eq:`eq-world-bellman`

.. math:: V(s) = \\sum_a \\pi_\\text{old}(a\\mid s)\\,\\big[\\bar r(s, a) + \\gamma\\,[a\\ \\text{not final}]\\, V(s')\\big],

where :math:`\\bar r(s, a) = -\\beta\\rho(a\\mid c) + [a\\ \\text{final}]\\, f(k', t+1)`
is the expected reward, a deterministic function of :math:`(s, a)` up to the
score noise. A token is final when it is EOS or sits at position ``max_len - 1``.
"""

from __future__ import annotations

import dataclasses
import numbers
from dataclasses import dataclass
from typing import Callable, Optional, Union

import numpy as np
import torch

from .._engine.checks import check_device, check_nonnegative_scalar, check_positive_int, check_seed, dense
from ..advantages import td_errors
from ..rewards import kl_shaped_rewards

__all__ = [
    "EOS",
    "GOOD",
    "World",
    "Rollout",
    "make_world",
    "fraction_good",
    "exact_q",
    "sample",
]

EOS = 0
"""Token id of end-of-sequence."""
GOOD = 1
"""Token id of the token the reward model counts."""

ScoreFn = Callable[[np.ndarray, np.ndarray], np.ndarray]


def fraction_good(count: np.ndarray, length: np.ndarray) -> np.ndarray:
    """Default reward model :math:`f(k, L) = k / L`, the fraction of GOOD tokens (chapter 7 (:doc:`/chapters/07_propagation`))."""
    return count / length


@dataclass(frozen=True, eq=False)
class World:
    """A solved toy world (chapter 7 (:doc:`/chapters/07_propagation`)): its tables and its exact values.

    Build it with :func:`make_world`. Contexts are token ids ``0..V-1`` plus
    ``bos = V``; a state :math:`s_t = (t, c, k)` has position ``0 <= t < max_len``,
    previous token (context) ``c`` and count ``k`` of GOOD tokens so far, and
    flat index ``(t * n_contexts + c) * n_counts + k`` (see :meth:`state_index`).
    Unreachable states (e.g. ``k > t``) are in the tables too; their values
    satisfy the same Bellman equation and are never used.
    """

    vocab_size: int
    max_len: int
    eos_prob: float
    beta: float
    gamma: float
    score_noise: float
    seed: int
    pi_old: np.ndarray
    """(V + 1, V) float64: :math:`\\pi_\\text{old}(a\\mid c)`, row ``c`` the context (row ``V`` is BOS)."""
    pi_ref: np.ndarray
    """(V + 1, V) float64: :math:`\\pi_\\text{ref}(a\\mid c)`."""
    kl_reward: np.ndarray
    """(V + 1, V) float64: :math:`-\\beta(\\log\\pi_\\text{old} - \\log\\pi_\\text{ref})(a\\mid c)` (0 where :math:`\\pi_\\text{old} = 0`)."""
    score_table: np.ndarray
    """(max_len + 1, max_len + 2) float64: ``score_table[L, k]`` = :math:`f(k, L)`, the noise-free score (row 0 unused)."""
    values: np.ndarray
    """(max_len, V + 1, max_len + 2) float64: exact :math:`V^\\pi(t, c, k)`."""

    @property
    def bos(self) -> int:
        """Context id of the empty prefix (never a sampled token)."""
        return self.vocab_size

    @property
    def n_contexts(self) -> int:
        """Number of contexts: the ``V`` tokens and BOS."""
        return self.vocab_size + 1

    @property
    def n_counts(self) -> int:
        """Size of the count axis (``max_len + 2``: counts ``0..max_len`` and one spare slot)."""
        return self.max_len + 2

    @property
    def n_states(self) -> int:
        """Number of (t, c, k) states in the tables, reachable or not."""
        return self.max_len * self.n_contexts * self.n_counts

    @property
    def v0(self) -> float:
        """:math:`V^\\pi(s_0)`, the exact value of the empty response (the state before token 0)."""
        return float(self.values[0, self.bos, 0])

    def state_index(self, t, context, count):
        """Flat index ``(t * n_contexts + context) * n_counts + count`` of state (t, c, k); works on ints, arrays, tensors."""
        return (t * self.n_contexts + context) * self.n_counts + count

    def decode_state(self, index):
        """Inverse of :meth:`state_index`: ``(t, context, count)`` of flat indices (ints, arrays or tensors)."""
        return index // (self.n_contexts * self.n_counts), (index // self.n_counts) % self.n_contexts, index % self.n_counts

    def value(self, t: int, context: int, count: int) -> float:
        """Exact :math:`V^\\pi(s)` of one state, equation :eq:`eq-world-bellman` of chapter 7 (:doc:`/chapters/07_propagation`)."""
        return float(self.values[t, context, count])


def _check_unit(x: object, name: str, *, closed_top: bool = True) -> float:
    x = check_nonnegative_scalar(x, name)
    if x > 1 or (not closed_top and x == 1):
        raise ValueError(f"{name} must lie in [0, 1{']' if closed_top else ')'}, got {x}")
    return x


def _score_table(score_fn: ScoreFn, max_len: int) -> np.ndarray:
    lengths = np.arange(max_len + 1, dtype=np.float64)[:, None]
    counts = np.arange(max_len + 2, dtype=np.float64)[None, :]
    lengths_b, counts_b = np.broadcast_arrays(lengths, counts)
    # row 0 (length 0) never ends an episode; evaluate it at length 1 to avoid 0/0
    with np.errstate(divide="ignore", invalid="ignore"):
        table = np.asarray(score_fn(counts_b, np.maximum(lengths_b, 1.0)), dtype=np.float64)
    if table.shape != lengths_b.shape:
        raise ValueError(
            f"score_fn must return an array of the shape of its arguments {lengths_b.shape}, got {table.shape}"
        )
    reachable = counts_b <= np.maximum(lengths_b, 1.0)
    if not np.isfinite(table[reachable]).all():
        raise ValueError("score_fn must return finite scores for every count 0..length and length 1..max_len")
    return np.where(reachable, table, 0.0)


def _solve_values(pi: np.ndarray, kl_reward: np.ndarray, score: np.ndarray, max_len: int, gamma: float) -> np.ndarray:
    """Backward DP for :math:`V^\\pi(t, c, k)`, equation :eq:`eq-world-bellman`, vectorised over (c, k)."""
    n_ctx, V = pi.shape
    K = max_len + 2
    values = np.zeros((max_len, n_ctx, K))
    expected_kl = (pi * kl_reward).sum(-1)  # (C,)
    k_next = np.minimum(np.arange(K) + 1, K - 1)  # count after a GOOD token (the spare slot absorbs overflow)
    for t in range(max_len - 1, -1, -1):
        # cont[k, a]: what follows action a from count k, apart from the KL reward; it does not depend on c
        cont = np.empty((K, V))
        final = t == max_len - 1
        nxt = score[t + 1] if final else gamma * values[t + 1]  # (K,) or (C, K)
        for a in range(V):
            k_after = k_next if a == GOOD else np.arange(K)
            if a == EOS:
                cont[:, a] = score[t + 1]
            elif final:
                cont[:, a] = nxt[k_after]
            else:
                cont[:, a] = nxt[a, k_after]
        values[t] = expected_kl[:, None] + pi @ cont.T
    return values


def make_world(
    vocab_size: int = 6,
    max_len: int = 64,
    *,
    eos_prob: float = 0.05,
    beta: float = 0.05,
    gamma: float = 1.0,
    ref_shift: float = 0.5,
    logit_scale: float = 1.0,
    score_fn: Optional[ScoreFn] = None,
    score_noise: float = 0.0,
    seed: int = 0,
) -> World:
    """Build the toy world of chapter 7 (:doc:`/chapters/07_propagation`) and solve it exactly by backward DP, equation :eq:`eq-world-bellman`.

    Args:
        vocab_size: number of tokens ``V >= 3``, EOS (0) and GOOD (1) included.
        max_len: longest response; a response that reaches it ends there.
        eos_prob: :math:`\\pi_\\text{old}(\\text{EOS}\\mid c)` at every step, in [0, 1);
            0 means "no EOS": every response has exactly ``max_len`` tokens.
        beta: KL coefficient :math:`\\beta \\ge 0` of the per-token reward.
        gamma: discount in [0, 1] used by the DP (and stored on the rollouts).
        ref_shift: standard deviation of the noise added to the policy's
            logits to make :math:`\\pi_\\text{ref}` (0: :math:`\\pi_\\text{ref}=\\pi_\\text{old}`).
        logit_scale: standard deviation of the policy's seeded bigram logits.
        score_fn: reward model :math:`f(k, L)` of the GOOD count and the length
            (numpy arrays in, an array of the same shape out); default
            :func:`fraction_good`.
        score_noise: standard deviation of zero-mean Gaussian noise added to
            each sampled score (exact values are unchanged).
        seed: seeds the tables (not the sampling; see :func:`sample`), an int in [0, 2**63 - 1].
    """
    vocab_size = check_positive_int(vocab_size, "vocab_size")
    if vocab_size < 3:
        raise ValueError(f"vocab_size must be at least 3 (EOS, GOOD and one more), got {vocab_size}")
    max_len = check_positive_int(max_len, "max_len")
    eos_prob = _check_unit(eos_prob, "eos_prob", closed_top=False)
    beta = check_nonnegative_scalar(beta, "beta")
    gamma = _check_unit(gamma, "gamma")
    ref_shift = check_nonnegative_scalar(ref_shift, "ref_shift")
    logit_scale = check_nonnegative_scalar(logit_scale, "logit_scale")
    score_noise = check_nonnegative_scalar(score_noise, "score_noise")
    seed = check_seed(seed)
    if score_fn is None:
        score_fn = fraction_good
    elif not callable(score_fn):
        raise TypeError(f"score_fn must be callable (count, length) -> score, got {type(score_fn).__name__}")

    rng = np.random.default_rng(int(seed))
    n_ctx = vocab_size + 1
    logits = logit_scale * rng.standard_normal((n_ctx, vocab_size - 1))  # non-EOS tokens
    body = np.exp(logits - logits.max(-1, keepdims=True))
    body /= body.sum(-1, keepdims=True)
    pi_old = np.concatenate([np.full((n_ctx, 1), eos_prob), (1.0 - eos_prob) * body], axis=-1)

    with np.errstate(divide="ignore"):
        log_old = np.log(pi_old)
    ref_logits = log_old + ref_shift * rng.standard_normal(pi_old.shape)  # -inf stays -inf: no EOS stays no EOS
    pi_ref = np.exp(ref_logits - ref_logits.max(-1, keepdims=True))
    pi_ref /= pi_ref.sum(-1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        kl_reward = np.where(pi_old > 0, -beta * (log_old - np.log(pi_ref)), 0.0)

    score = _score_table(score_fn, max_len)
    values = _solve_values(pi_old, kl_reward, score, max_len, gamma)
    return World(
        vocab_size=vocab_size,
        max_len=max_len,
        eos_prob=eos_prob,
        beta=beta,
        gamma=gamma,
        score_noise=score_noise,
        seed=int(seed),
        pi_old=pi_old,
        pi_ref=pi_ref,
        kl_reward=kl_reward,
        score_table=score,
        values=values,
    )


def exact_q(world: World, t, context, count) -> np.ndarray:
    """Exact :math:`Q^\\pi(s, a) = \\bar r(s, a) + \\gamma [a\\ \\text{not final}] V(s')` for every action (chapter 7 (:doc:`/chapters/07_propagation`)).

    ``t``, ``context`` and ``count`` are ints or integer arrays that broadcast
    together; the result has their broadcast shape plus a last axis of size
    ``vocab_size``. :math:`\\sum_a\\pi(a\\mid s)Q(s,a) = V(s)`, and the exact
    advantage is :math:`A(s,a) = Q(s,a) - V(s)`.
    """
    t, context, count = (dense(x, name) if isinstance(x, torch.Tensor) else x for name, x in (("t", t), ("context", context), ("count", count)))
    t, context, count = np.broadcast_arrays(np.asarray(t), np.asarray(context), np.asarray(count))
    for name, x, hi in (("t", t, world.max_len), ("context", context, world.n_contexts), ("count", count, world.max_len + 1)):
        if not np.issubdtype(x.dtype, np.integer):
            raise TypeError(f"{name} must be an int or an integer array, got {x.dtype}")
        if x.size and (x.min() < 0 or x.max() >= hi):
            raise ValueError(f"{name} must lie in [0, {hi - 1}]")
    V = world.vocab_size
    q = np.empty(t.shape + (V,))
    final = t == world.max_len - 1
    for a in range(V):
        k_after = count + (a == GOOD)
        if a == EOS:
            cont = world.score_table[t + 1, count]
        else:
            score_if_cut = world.score_table[t + 1, k_after]
            t_next = np.minimum(t + 1, world.max_len - 1)
            bootstrap = world.gamma * world.values[t_next, a, k_after]
            cont = np.where(final, score_if_cut, bootstrap)
        q[..., a] = world.kl_reward[context, a] + cont
    return q


@dataclass(frozen=True)
class Rollout:
    """A batch of sampled responses with everything a critic experiment needs (chapter 7 (:doc:`/chapters/07_propagation`)).

    All ``(B, T)`` tensors are right-padded after each response's last token
    (``T`` is the longest response of the batch); padding is 0 (EOS in
    ``tokens``) and ``mask`` is False there.
    """

    tokens: torch.Tensor
    """(B, T) long: :math:`a_t`."""
    mask: torch.Tensor
    """(B, T) bool: generated tokens."""
    logprobs: torch.Tensor
    """(B, T): :math:`\\log\\pi_\\text{old}(a_t\\mid s_t)`."""
    ref_logprobs: torch.Tensor
    """(B, T): :math:`\\log\\pi_\\text{ref}(a_t\\mid s_t)`."""
    score: torch.Tensor
    """(B,): the reward model's score (with noise when the world has ``score_noise``)."""
    rewards: torch.Tensor
    """(B, T): :math:`r_t` from :func:`valuelab.kl_shaped_rewards` with the world's ``beta`` (k1)."""
    values_exact: torch.Tensor
    """(B, T): :math:`V^\\pi(s_t)`, the exact value of the state before token t."""
    advantages_exact: torch.Tensor
    """(B, T): :math:`A^\\pi(s_t,a_t) = \\bar r(s_t,a_t) + \\gamma V^\\pi(s_{t+1}) - V^\\pi(s_t)` (noise-free score)."""
    lengths: torch.Tensor
    """(B,) long: number of generated tokens (EOS included)."""
    states: torch.Tensor
    """(B, T) long: flat index of :math:`s_t` in the world's tables (0 at padding)."""
    gamma: float
    """The discount the exact values were computed with."""

    @property
    def device(self) -> torch.device:
        """Device of every tensor of the rollout."""
        return self.tokens.device

    def to(self, device: Union[str, torch.device]) -> "Rollout":
        """A copy of the rollout on ``device``."""
        moved = {
            f.name: getattr(self, f.name).to(device)
            for f in dataclasses.fields(self)
            if isinstance(getattr(self, f.name), torch.Tensor)
        }
        return dataclasses.replace(self, **moved)


def _generator(generator: Union[int, torch.Generator], name: str = "generator") -> torch.Generator:
    """A CPU ``torch.Generator``, or one seeded by an int seed in ``[0, 2**63 - 1]`` (``valuelab._engine.checks.check_seed``); errors name ``name``."""
    if isinstance(generator, torch.Generator):
        if generator.device.type != "cpu":
            raise ValueError(f"{name} must be a CPU torch.Generator, got one on {generator.device}")
        return generator
    if isinstance(generator, (bool, np.bool_)) or not isinstance(generator, numbers.Integral):
        raise TypeError(f"{name} must be an int seed or a torch.Generator, got {type(generator).__name__}")
    return torch.Generator().manual_seed(check_seed(generator, name))


def sample(
    world: World,
    batch_size: int,
    generator: Union[int, torch.Generator] = 0,
    *,
    device: Optional[Union[str, torch.device]] = None,
    dtype: torch.dtype = torch.float32,
) -> Rollout:
    """Sample ``batch_size`` responses from :math:`\\pi_\\text{old}` and attach rewards and exact values (chapter 7 (:doc:`/chapters/07_propagation`)).

    Rewards follow equation :eq:`eq-kl-reward` of chapter 3 through
    :func:`valuelab.kl_shaped_rewards`; exact advantages are
    :func:`valuelab.td_errors` of the noise-free rewards and the exact values.

    Args:
        world: from :func:`make_world`.
        batch_size: number of responses B.
        generator: an int seed or a CPU ``torch.Generator`` (advanced in place,
            so successive calls give fresh batches). The random numbers are
            drawn on the CPU, so a seed gives the same batch on every device.
        device: where the tensors live (default CPU).
        dtype: float dtype of the float tensors.

    The loop runs over positions (at most ``max_len``), vectorised over the batch.
    """
    if not isinstance(world, World):
        raise TypeError(f"world must be a World (see make_world), got {type(world).__name__}")
    B = check_positive_int(batch_size, "batch_size")
    g = _generator(generator)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating torch.dtype, got {dtype}")
    device = torch.device("cpu") if device is None else check_device(device)

    L, V, C, K = world.max_len, world.vocab_size, world.n_contexts, world.n_counts
    cdf = torch.as_tensor(np.cumsum(world.pi_old, -1), device=device)
    cdf[:, -1] = 1.0  # no rounding gap above the last token
    log_old = torch.as_tensor(np.log(np.where(world.pi_old > 0, world.pi_old, 1.0)), device=device)
    log_ref = torch.as_tensor(np.log(np.where(world.pi_ref > 0, world.pi_ref, 1.0)), device=device)

    tokens = torch.zeros(B, L, dtype=torch.long, device=device)
    states = torch.zeros(B, L, dtype=torch.long, device=device)
    contexts = torch.zeros(B, L, dtype=torch.long, device=device)
    mask = torch.zeros(B, L, dtype=torch.bool, device=device)
    ctx = torch.full((B,), world.bos, dtype=torch.long, device=device)
    count = torch.zeros(B, dtype=torch.long, device=device)
    alive = torch.ones(B, dtype=torch.bool, device=device)
    T = L
    for t in range(L):
        u = torch.rand(B, 1, generator=g, dtype=torch.float64).to(device)
        # token j is drawn when cdf[j-1] <= u < cdf[j]: tokens of probability 0 are never drawn
        a = torch.searchsorted(cdf[ctx], u, right=True).squeeze(-1).clamp_(max=V - 1)
        a = torch.where(alive, a, torch.zeros_like(a))
        tokens[:, t] = a
        mask[:, t] = alive
        contexts[:, t] = ctx
        states[:, t] = torch.where(alive, world.state_index(t, ctx, count), torch.zeros_like(a))
        count = count + (alive & (a == GOOD)).long()
        alive = alive & (a != EOS)
        ctx = a
        if not bool(alive.any()):
            T = t + 1
            break
    tokens, states, contexts, mask = tokens[:, :T], states[:, :T], contexts[:, :T], mask[:, :T]
    lengths = mask.sum(-1)

    zero = torch.zeros((), dtype=dtype, device=device)
    logprobs = torch.where(mask, log_old[contexts, tokens].to(dtype), zero)
    ref_logprobs = torch.where(mask, log_ref[contexts, tokens].to(dtype), zero)
    score_table = torch.as_tensor(world.score_table, device=device)
    score_mean = score_table[lengths, count].to(dtype)
    score = score_mean
    if world.score_noise > 0:
        noise = torch.randn(B, generator=g, dtype=torch.float64).to(device=device, dtype=dtype)
        score = score_mean + world.score_noise * noise
    rewards = kl_shaped_rewards(logprobs, ref_logprobs, score, mask=mask, beta=world.beta)
    expected_rewards = kl_shaped_rewards(logprobs, ref_logprobs, score_mean, mask=mask, beta=world.beta)

    values_table = torch.as_tensor(world.values.reshape(-1), device=device)
    values_exact = torch.where(mask, values_table[states].to(dtype), zero)
    advantages_exact = td_errors(expected_rewards, values_exact, mask=mask, gamma=world.gamma)
    return Rollout(
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
