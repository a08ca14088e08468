"""Literal, slow, single-sequence transcriptions of the book's definitions (plain numpy).

These are the oracles: every function is the formula on the page, written as
a sum or a loop with no cleverness, for one sequence with no mask (a masked
sequence is handled by first dropping its masked tokens: ``r[mask]``). The
chapters display them next to the fast batched functions of :mod:`valuelab`;
the tests use them to check those functions.

Indices follow the book: tokens :math:`t = 0, \\dots, T` (``len(rewards) = T + 1``),
``values[t]`` is :math:`V(s_t)`, and :math:`V(s_{T+1})` is ``bootstrap``.
``gamma`` is a float or an array of one discount per token; the discount
from token ``t`` to token ``k`` is :math:`\\prod_{j=t}^{k-1}\\gamma_j`, which is
:math:`\\gamma^{k-t}` for a constant :math:`\\gamma`.
"""

from __future__ import annotations

import math
from typing import Sequence, Union

import numpy as np

ArrayLike = Union[Sequence[float], np.ndarray]
FloatOrArray = Union[float, ArrayLike]

__all__ = [
    "discount",
    "mc_returns",
    "td_errors",
    "td_targets",
    "nstep_returns",
    "nstep_advantages",
    "lambda_returns",
    "gae_mixture",
    "gae_closed_form",
    "gae_recursion",
    "kl_shaped_rewards",
]


def _per_step(x: FloatOrArray, length: int) -> np.ndarray:
    return np.broadcast_to(np.asarray(x, dtype=np.float64), (length,)).copy()


def discount(gamma: FloatOrArray, t: int, k: int, length: int) -> float:
    """:math:`\\prod_{j=t}^{k-1}\\gamma_j` (1 when k == t)."""
    g = _per_step(gamma, length)
    return float(np.prod(g[t:k]))


def mc_returns(rewards: ArrayLike, gamma: FloatOrArray = 1.0, bootstrap: float = 0.0) -> np.ndarray:
    """:math:`G_t = \\sum_{k=t}^{T}\\gamma^{k-t}r_k + \\gamma^{T+1-t}V(s_{T+1})`, chapter 1, as a literal double sum."""
    r = np.asarray(rewards, dtype=np.float64)
    L = len(r)
    out = np.zeros(L)
    for t in range(L):
        out[t] = sum(discount(gamma, t, k, L) * r[k] for k in range(t, L)) + discount(gamma, t, L, L) * bootstrap
    return out


def _value_after(values: np.ndarray, k: int, bootstrap: float) -> float:
    return float(values[k]) if k < len(values) else float(bootstrap)


def td_targets(rewards: ArrayLike, values: ArrayLike, gamma: FloatOrArray = 1.0, bootstrap: float = 0.0) -> np.ndarray:
    """:math:`r_t + \\gamma V(s_{t+1})`, chapter 2."""
    r, v = np.asarray(rewards, dtype=np.float64), np.asarray(values, dtype=np.float64)
    g = _per_step(gamma, len(r))
    return np.array([r[t] + g[t] * _value_after(v, t + 1, bootstrap) for t in range(len(r))])


def td_errors(rewards: ArrayLike, values: ArrayLike, gamma: FloatOrArray = 1.0, bootstrap: float = 0.0) -> np.ndarray:
    """:math:`\\delta_t = r_t + \\gamma V(s_{t+1}) - V(s_t)`, chapter 4."""
    return td_targets(rewards, values, gamma, bootstrap) - np.asarray(values, dtype=np.float64)


def nstep_returns(
    rewards: ArrayLike, values: ArrayLike, n: int, gamma: FloatOrArray = 1.0, bootstrap: float = 0.0
) -> np.ndarray:
    """:math:`G_t^{(n)} = \\sum_{k=t}^{t+n-1}\\gamma^{k-t}r_k + \\gamma^{n}V(s_{t+n})`, chapter 4.

    A window that runs past the last token stops there: the sum ends at
    :math:`T` and the value after it is :math:`V(s_{T+1})` = ``bootstrap``.
    """
    r, v = np.asarray(rewards, dtype=np.float64), np.asarray(values, dtype=np.float64)
    L = len(r)
    out = np.zeros(L)
    for t in range(L):
        end = min(t + n, L)
        out[t] = sum(discount(gamma, t, k, L) * r[k] for k in range(t, end))
        out[t] += discount(gamma, t, end, L) * _value_after(v, end, bootstrap)
    return out


def nstep_advantages(
    rewards: ArrayLike, values: ArrayLike, n: int, gamma: FloatOrArray = 1.0, bootstrap: float = 0.0
) -> np.ndarray:
    """:math:`\\hat A_t^{(n)} = G_t^{(n)} - V(s_t)`, chapter 4."""
    return nstep_returns(rewards, values, n, gamma, bootstrap) - np.asarray(values, dtype=np.float64)


def lambda_returns(
    rewards: ArrayLike, values: ArrayLike, gamma: FloatOrArray = 1.0, lam: float = 0.95, bootstrap: float = 0.0
) -> np.ndarray:
    """The λ-return as the mixture of n-step returns with a finite horizon, chapter 5.

    :math:`G^\\lambda_t = (1-\\lambda)\\sum_{n=1}^{N-1}\\lambda^{n-1}G_t^{(n)} + \\lambda^{N-1}G_t^{(N)}`,
    :math:`N = T - t + 1` tokens remain, and :math:`G_t^{(N)}` is the Monte-Carlo
    return: the weight of all longer windows collapses onto it. ``lam`` is a float.
    """
    r = np.asarray(rewards, dtype=np.float64)
    L = len(r)
    lam = float(lam)
    out = np.zeros(L)
    all_n = [nstep_returns(rewards, values, n, gamma, bootstrap) for n in range(1, L + 1)]
    for t in range(L):
        N = L - t
        mix = sum((1 - lam) * lam ** (n - 1) * all_n[n - 1][t] for n in range(1, N))
        out[t] = mix + lam ** (N - 1) * all_n[N - 1][t]
    return out


def gae_mixture(
    rewards: ArrayLike, values: ArrayLike, gamma: FloatOrArray = 1.0, lam: float = 0.95, bootstrap: float = 0.0
) -> np.ndarray:
    """GAE by its definition, the λ-weighted mixture of n-step advantages, chapter 5."""
    return lambda_returns(rewards, values, gamma, lam, bootstrap) - np.asarray(values, dtype=np.float64)


def gae_closed_form(
    rewards: ArrayLike, values: ArrayLike, gamma: float = 1.0, lam: float = 0.95, bootstrap: float = 0.0
) -> np.ndarray:
    """:math:`\\hat A_t = \\sum_{l=0}^{T-t}(\\gamma\\lambda)^l\\delta_{t+l}` for constant γ and λ, chapter 5."""
    d = td_errors(rewards, values, gamma, bootstrap)
    L = len(d)
    return np.array([sum((gamma * lam) ** l * d[t + l] for l in range(L - t)) for t in range(L)])


def gae_recursion(
    rewards: ArrayLike, values: ArrayLike, gamma: FloatOrArray = 1.0, lam: FloatOrArray = 0.95, bootstrap: float = 0.0
) -> np.ndarray:
    """:math:`\\hat A_T = \\delta_T`, :math:`\\hat A_t = \\delta_t + \\gamma_t\\lambda_t\\hat A_{t+1}`, chapter 5 (per-step γ, λ allowed)."""
    d = td_errors(rewards, values, gamma, bootstrap)
    L = len(d)
    g, lm = _per_step(gamma, L), _per_step(lam, L)
    out = np.zeros(L)
    nxt = 0.0
    for t in reversed(range(L)):
        nxt = d[t] + g[t] * lm[t] * nxt
        out[t] = nxt
    return out


def kl_shaped_rewards(
    logprobs: ArrayLike, ref_logprobs: ArrayLike, score: float, beta: float = 0.05, estimator: str = "k1"
) -> np.ndarray:
    """:math:`r_t = -\\beta k(\\rho_t)`, plus the score on the last token, chapter 3."""
    out = []
    for lp, rl in zip(logprobs, ref_logprobs):
        rho = float(lp) - float(rl)
        k = {"k1": rho, "k2": 0.5 * rho**2, "k3": math.exp(-rho) - 1 + rho}[estimator]
        out.append(-beta * k)
    out = np.array(out, dtype=np.float64)
    if len(out):
        out[-1] += score
    return out
