"""SymPy constructors for the derivation chapters (:doc:`/chapters/04_nstep`, :doc:`/chapters/05_gae`).

The chapters prove their identities on *unevaluated* SymPy expressions: sums
with symbolic upper limits, so that a claim is checked for every horizon
:math:`T` and every window :math:`n`, not for a few sizes. This module builds
those expressions once, in the book's notation (notation page), so that the
two chapters and the tests share one definition of each object:

* :math:`r_k` is ``r[k]`` and :math:`V(s_k)` is ``V[k]`` (``IndexedBase``);
  :math:`V(s_{T+1})` is ``V[T + 1]``, which is 0 after EOS and the
  bootstrap value for a response cut at the length limit;
* :math:`\\gamma` and :math:`\\lambda` are nonnegative real symbols
  (:math:`0 \\le \\gamma, \\lambda \\le 1` in the book);
* :math:`\\delta_j` is either written out, :math:`r_j + \\gamma V(s_{j+1}) - V(s_j)`
  (the default), or kept as the atom ``delta[j]`` when a chapter wants to
  read off the coefficient of each TD error (pass ``delta=symbols().delta``).

:func:`lambdify_sequence` and :func:`evaluate` turn a concrete expression
(integer ``t``, ``T``, ``n``) into numbers, so the tests can compare the
symbolic definitions with the batched functions of :mod:`valuelab`.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass
from functools import lru_cache
from typing import Callable, Optional, Sequence, Union

import numpy as np
import sympy as sp

__all__ = [
    "Symbols",
    "symbols",
    "mc_return",
    "nstep_return",
    "nstep_advantage",
    "td_error",
    "nstep_telescoped",
    "lambda_weight",
    "lambda_return_finite",
    "gae_mixture_finite",
    "gae_closed_form",
    "gae_recursion",
    "unroll",
    "lambdify_sequence",
    "evaluate",
]

Index = Union[int, sp.Expr]


@dataclass(frozen=True)
class Symbols:
    """The standard symbols of the book (see the notation page)."""

    t: sp.Symbol
    """token index, integer, nonnegative"""
    T: sp.Symbol
    """index of the last token (EOS), integer, nonnegative"""
    k: sp.Symbol
    """summation index over tokens"""
    l: sp.Symbol
    """summation index over TD errors, :math:`\\delta_{t+l}`"""
    n: sp.Symbol
    """window length of an n-step return, :math:`n \\ge 1`"""
    N: sp.Symbol
    """number of tokens left from ``t``: :math:`N = T - t + 1`"""
    gamma: sp.Symbol
    """discount :math:`\\gamma`, nonnegative"""
    lam: sp.Symbol
    """GAE parameter :math:`\\lambda`, nonnegative"""
    r: sp.IndexedBase
    """rewards, ``r[k]`` is :math:`r_k`"""
    V: sp.IndexedBase
    """values, ``V[k]`` is :math:`V(s_k)`"""
    delta: sp.IndexedBase
    """TD errors as atoms, ``delta[j]`` is :math:`\\delta_j`"""


@lru_cache(maxsize=None)
def symbols() -> Symbols:
    """The shared symbols: ``t, T, k, l, n, N`` (integer, nonnegative), ``gamma``, ``lam``, ``r``, ``V``, ``delta``."""
    t, T, k, l, n, N = sp.symbols("t T k l n N", integer=True, nonnegative=True)
    return Symbols(
        t=t, T=T, k=k, l=l, n=n, N=N,
        gamma=sp.Symbol("gamma", nonnegative=True),
        lam=sp.Symbol("lambda", nonnegative=True),
        r=sp.IndexedBase("r"),
        V=sp.IndexedBase("V"),
        delta=sp.IndexedBase("delta"),
    )


def mc_return(t: Index, T: Index, *, bootstrap: bool = False) -> sp.Expr:
    """Monte-Carlo return :math:`G_t=\\sum_{k=t}^{T}\\gamma^{k-t}r_k`, equation :eq:`eq-mc-return` of chapter 1.

    With ``bootstrap=True`` the term :math:`\\gamma^{T+1-t}V(s_{T+1})` is
    added: the return of a response cut after token ``T`` (after EOS
    :math:`V(s_{T+1}) = 0` and the term vanishes).
    """
    s = symbols()
    G = sp.Sum(s.gamma ** (s.k - t) * s.r[s.k], (s.k, t, T))
    return G + s.gamma ** (T + 1 - t) * s.V[T + 1] if bootstrap else G


def nstep_return(t: Index, n: Index, T: Optional[int] = None) -> sp.Expr:
    """n-step return :math:`G_t^{(n)}=\\sum_{k=t}^{t+n-1}\\gamma^{k-t}r_k+\\gamma^n V(s_{t+n})`.

    Equation :eq:`eq-nstep-return` of chapter 4. With an integer ``T`` (and
    integer ``t``, ``n``) the window is clipped at the end of the response,
    as :func:`valuelab.nstep_returns` does: a window with :math:`t+n>T+1`
    becomes :math:`G_t^{(T+1-t)}`, the Monte-Carlo return plus the
    discounted :math:`V(s_{T+1})`.
    """
    s = symbols()
    if T is not None:
        if not all(isinstance(x, numbers.Integral) for x in (t, n, T)):
            raise TypeError("nstep_return: clipping at T needs integer t, n and T")
        n = min(int(n), int(T) + 1 - int(t))
    return sp.Sum(s.gamma ** (s.k - t) * s.r[s.k], (s.k, t, t + n - 1)) + s.gamma**n * s.V[t + n]


def nstep_advantage(t: Index, n: Index, T: Optional[int] = None) -> sp.Expr:
    """n-step advantage :math:`\\hat A_t^{(n)} = G_t^{(n)} - V(s_t)`, chapter 4 (``T`` clips as in :func:`nstep_return`)."""
    return nstep_return(t, n, T) - symbols().V[t]


def td_error(t: Index) -> sp.Expr:
    """TD error :math:`\\delta_t = r_t + \\gamma V(s_{t+1}) - V(s_t)`, equation :eq:`eq-td-error` of chapter 4."""
    s = symbols()
    return s.r[t] + s.gamma * s.V[t + 1] - s.V[t]


def _delta(j: Index, delta: Optional[sp.IndexedBase]) -> sp.Expr:
    return td_error(j) if delta is None else delta[j]


def nstep_telescoped(t: Index, n: Index, delta: Optional[sp.IndexedBase] = None) -> sp.Expr:
    """:math:`\\sum_{l=0}^{n-1}\\gamma^l\\delta_{t+l}`, the right side of :eq:`eq-nstep-telescoping` of chapter 4.

    ``delta=None`` writes each :math:`\\delta` out in rewards and values;
    ``delta=symbols().delta`` keeps them as atoms.
    """
    s = symbols()
    return sp.Sum(s.gamma**s.l * _delta(t + s.l, delta), (s.l, 0, n - 1))


def lambda_weight(n: Index) -> sp.Expr:
    """λ-weight of the n-step advantage, :math:`w_n = (1-\\lambda)\\lambda^{n-1}`, equation :eq:`eq-lambda-weights` of chapter 5."""
    s = symbols()
    return (1 - s.lam) * s.lam ** (n - 1)


def lambda_return_finite(t: Index, T: Index) -> sp.Expr:
    """Finite-horizon λ-return, the mixture of n-step returns of chapter 5 (``eq-lambda-return``).

    :math:`\\sum_{n=1}^{N-1} w_n G_t^{(n)} + \\lambda^{N-1} G_t^{(N)}` with
    :math:`N = T - t + 1` tokens left: every window longer than :math:`N`
    equals :math:`G_t^{(N)}` (the Monte-Carlo return plus
    :math:`\\gamma^N V(s_{T+1})`), so the tail weight
    :math:`\\sum_{n\\ge N} w_n = \\lambda^{N-1}` collapses onto it. The weights
    sum to 1 for every :math:`\\lambda \\in [0, 1]`, including 1.
    """
    s = symbols()
    N = T - t + 1
    mix = sp.Sum(lambda_weight(s.n) * nstep_return(t, s.n), (s.n, 1, N - 1))
    return mix + s.lam ** (N - 1) * nstep_return(t, N)


def gae_mixture_finite(t: Index, T: Index) -> sp.Expr:
    """GAE by its definition :eq:`eq-gae-def`, the finite λ-mixture of n-step advantages: :func:`lambda_return_finite` minus :math:`V(s_t)`."""
    return lambda_return_finite(t, T) - symbols().V[t]


def gae_closed_form(t: Index, T: Index, delta: Optional[sp.IndexedBase] = None) -> sp.Expr:
    """:math:`\\hat A_t = \\sum_{l=0}^{T-t}(\\gamma\\lambda)^l\\delta_{t+l}`, equation :eq:`eq-gae-closed` of chapter 5.

    ``T`` is the index of the last token, so the last TD error is
    :math:`\\delta_T = r_T + \\gamma V(s_{T+1}) - V(s_T)`. ``delta`` as in
    :func:`nstep_telescoped`.
    """
    s = symbols()
    return sp.Sum((s.gamma * s.lam) ** s.l * _delta(t + s.l, delta), (s.l, 0, T - t))


def gae_recursion(t: int, T: int, delta: Optional[sp.IndexedBase] = None) -> sp.Expr:
    """The backward recursion :eq:`eq-gae-recursion` of chapter 5 unrolled for integers ``t <= T``.

    :math:`\\hat A_T = \\delta_T`, :math:`\\hat A_t = \\delta_t + \\gamma\\lambda\\hat A_{t+1}`.
    """
    if not (isinstance(t, numbers.Integral) and isinstance(T, numbers.Integral)):
        raise TypeError("gae_recursion: t and T must be integers (use gae_closed_form for symbolic ones)")
    if t > T:
        raise ValueError(f"gae_recursion: t must be <= T, got t={t}, T={T}")
    s = symbols()
    out = _delta(T, delta)
    for j in range(T - 1, t - 1, -1):
        out = _delta(j, delta) + s.gamma * s.lam * out
    return out


def unroll(expr: sp.Expr) -> sp.Expr:
    """Write every ``Sum`` with integer limits out as an explicit ``Add`` (nested sums too).

    The same value as ``expr.doit()`` for these finite sums (including SymPy's
    convention that a sum whose upper limit is below its lower limit minus
    one counts negatively), but much faster, since nothing is simplified. A
    limit that is still symbolic raises ``ValueError``.
    """
    if isinstance(expr, sp.Sum):
        *inner, (var, lo, hi) = expr.limits
        if not (lo.is_Integer and hi.is_Integer):
            raise ValueError(f"expr: the sum over {var} from {lo} to {hi} needs integer limits")
        body = sp.Sum(expr.function, *inner) if inner else expr.function
        lo, hi = int(lo), int(hi)
        sign, idx = (1, range(lo, hi + 1)) if hi >= lo else (-1, range(hi + 1, lo))
        return sign * sp.Add(*[unroll(body.xreplace({var: sp.Integer(i)})) for i in idx])
    if not expr.args or expr.is_Atom or isinstance(expr, sp.Indexed):
        return expr
    return expr.func(*[unroll(a) for a in expr.args])


def lambdify_sequence(exprs: Sequence[sp.Expr], length: int) -> Callable[..., np.ndarray]:
    """Compile concrete expressions into ``f(rewards, values, gamma=1.0, lam=1.0, bootstrap=0.0) -> ndarray``.

    ``length`` is the number of tokens :math:`T + 1`: ``rewards`` and
    ``values`` are arrays of that length, ``r[k]`` and ``V[k]`` read them,
    and ``V[length]`` (that is :math:`V(s_{T+1})`) is ``bootstrap``. The
    expressions may contain unevaluated sums with integer limits (they are
    written out by :func:`unroll`) but no ``delta`` atoms and no free
    integer symbols. An index outside the sequence raises ``ValueError``
    naming it: that is how an off-by-one in a formula shows up.
    """
    s = symbols()
    if not isinstance(length, numbers.Integral) or isinstance(length, bool) or length < 1:
        raise ValueError(f"length must be a positive int, got {length!r}")
    rs = [sp.Symbol(f"r_{i}") for i in range(length)]
    vs = [sp.Symbol(f"V_{i}") for i in range(length)]
    b = sp.Symbol("b")
    flat = []
    for e in exprs:
        e = unroll(sp.sympify(e))
        swap, outside = {}, []
        for a in sorted(e.atoms(sp.Indexed), key=sp.default_sort_key):
            (i,) = a.indices
            if not i.is_Integer:
                raise ValueError(f"exprs: {a} has a non-integer index; substitute t, T, n first")
            i = int(i)
            if a.base not in (s.r, s.V):
                raise ValueError(f"exprs: {a} is neither a reward nor a value; build TD errors with delta=None")
            if a.base == s.r and 0 <= i < length:
                swap[a] = rs[i]
            elif a.base == s.V and 0 <= i < length:
                swap[a] = vs[i]
            elif a.base == s.V and i == length:
                swap[a] = b
            else:
                outside.append(str(a))
        if outside:
            verb = "lies" if len(outside) == 1 else "lie"
            raise ValueError(f"exprs: {', '.join(outside)} {verb} outside a sequence of {length} tokens")
        flat.append(e.xreplace(swap))
    f = sp.lambdify([rs, vs, s.gamma, s.lam, b], flat, modules="numpy")

    def run(rewards, values, gamma: float = 1.0, lam: float = 1.0, bootstrap: float = 0.0) -> np.ndarray:
        r = np.asarray(rewards, dtype=np.float64)
        v = np.asarray(values, dtype=np.float64)
        if r.shape != (length,) or v.shape != (length,):
            raise ValueError(f"rewards and values must have shape ({length},), got {r.shape} and {v.shape}")
        return np.asarray(f(list(r), list(v), float(gamma), float(lam), float(bootstrap)), dtype=np.float64)

    return run


def evaluate(expr: sp.Expr, rewards, values, gamma: float = 1.0, lam: float = 1.0, bootstrap: float = 0.0) -> float:
    """The value of one concrete expression on numbers (see :func:`lambdify_sequence`)."""
    return float(lambdify_sequence([expr], len(rewards))(rewards, values, gamma, lam, bootstrap)[0])
