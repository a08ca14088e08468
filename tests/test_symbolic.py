"""The SymPy definitions of valuelab.lab.symbolic, evaluated on numbers, against the batched torch functions.

Chapters 4 and 5 prove identities about the expressions of
:mod:`valuelab.lab.symbolic`; these tests close the loop by checking that those
very expressions compute what :mod:`valuelab` computes.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import pytest
import sympy as sp
import torch

import valuelab as vl
from valuelab.lab import reference as ref
from valuelab.lab import symbolic as sy

TOL = dict(rtol=1e-10, atol=1e-10)
LENGTHS = [1, 2, 3, 5, 7]
SEEDS = [0, 1, 2]
# (gamma, lam) including the edges 0 and 1
COEFS = [(1.0, 1.0), (1.0, 0.95), (0.9, 0.0), (0.0, 0.7), (0.0, 0.0), (0.63, 1.0), (0.8, 0.45)]
BOOTSTRAPS = [0.0, 0.7]


def problem(L: int, seed: int):
    rng = np.random.default_rng(1000 * L + seed)
    return rng.normal(size=L), rng.normal(size=L)


@lru_cache(maxsize=None)
def compiled(name: str, L: int, n: int = 0):
    """One compiled vector of expressions, one entry per token t = 0..T (T = L - 1)."""
    T = L - 1
    build = {
        "mc": lambda t: sy.mc_return(t, T, bootstrap=True),
        "td": lambda t: sy.td_error(t),
        "nstep": lambda t: sy.nstep_return(t, n, T),
        "nstep_adv": lambda t: sy.nstep_advantage(t, n, T),
        "telescoped": lambda t: sy.nstep_telescoped(t, min(n, T + 1 - t)),
        "gae_closed": lambda t: sy.gae_closed_form(t, T),
        "gae_rec": lambda t: sy.gae_recursion(t, T),
        "gae_mix": lambda t: sy.gae_mixture_finite(t, T),
        "lam_return": lambda t: sy.lambda_return_finite(t, T),
    }[name]
    return sy.lambdify_sequence([build(t) for t in range(L)], L)


def cases():
    for L in LENGTHS:
        for seed in SEEDS:
            for gamma, lam in COEFS:
                for b in BOOTSTRAPS:
                    yield L, seed, gamma, lam, b


def tt(x):
    return torch.tensor(x, dtype=torch.float64)


@pytest.mark.parametrize("L", LENGTHS)
def test_mc_and_td_errors(L):
    for _, seed, gamma, lam, b in (c for c in cases() if c[0] == L):
        r, v = problem(L, seed)
        got_mc = compiled("mc", L)(r, v, gamma, lam, b)
        np.testing.assert_allclose(got_mc, vl.discounted_returns(tt(r), gamma=gamma, bootstrap=b).numpy(), **TOL)
        got_td = compiled("td", L)(r, v, gamma, lam, b)
        np.testing.assert_allclose(got_td, vl.td_errors(tt(r), tt(v), gamma=gamma, bootstrap=b).numpy(), **TOL)
        np.testing.assert_allclose(got_td, ref.td_errors(r, v, gamma, b), **TOL)


@pytest.mark.parametrize("L", LENGTHS)
def test_nstep_returns_and_telescoping(L):
    for _, seed, gamma, lam, b in (c for c in cases() if c[0] == L):
        r, v = problem(L, seed)
        for n in range(1, L + 3):  # windows that run past the end are clipped
            fast = vl.nstep_returns(tt(r), tt(v), n, gamma=gamma, bootstrap=b).numpy()
            np.testing.assert_allclose(compiled("nstep", L, n)(r, v, gamma, lam, b), fast, **TOL)
            np.testing.assert_allclose(fast, ref.nstep_returns(r, v, n, gamma, b), **TOL)
            adv = compiled("nstep_adv", L, n)(r, v, gamma, lam, b)
            np.testing.assert_allclose(adv, fast - v, **TOL)
            # (eq-nstep-telescoping): the n-step advantage is the discounted sum of TD errors
            np.testing.assert_allclose(compiled("telescoped", L, n)(r, v, gamma, lam, b), adv, **TOL)


@pytest.mark.parametrize("L", LENGTHS)
def test_gae_three_ways(L):
    for _, seed, gamma, lam, b in (c for c in cases() if c[0] == L):
        r, v = problem(L, seed)
        res = vl.gae(tt(r), tt(v), gamma=gamma, lam=lam, bootstrap=b)
        adv, ret = res.advantages.numpy(), res.returns.numpy()
        for name in ("gae_closed", "gae_rec", "gae_mix"):
            np.testing.assert_allclose(compiled(name, L)(r, v, gamma, lam, b), adv, **TOL, err_msg=name)
        np.testing.assert_allclose(compiled("lam_return", L)(r, v, gamma, lam, b), ret, **TOL)
        np.testing.assert_allclose(ret, ref.lambda_returns(r, v, gamma, lam, b), **TOL)


def test_gae_limits_are_td_error_and_monte_carlo():
    L = 6
    r, v = problem(L, 7)
    for gamma in (0.0, 0.9, 1.0):
        closed = compiled("gae_closed", L)
        np.testing.assert_allclose(closed(r, v, gamma, 0.0, 0.4), compiled("td", L)(r, v, gamma, 0.0, 0.4), **TOL)
        mc = compiled("mc", L)(r, v, gamma, 1.0, 0.4)
        np.testing.assert_allclose(closed(r, v, gamma, 1.0, 0.4), mc - v, **TOL)


def test_lambda_weights_sum_to_one_for_symbolic_horizon():
    s = sy.symbols()
    finite = sp.summation(sy.lambda_weight(s.n), (s.n, 1, s.N - 1)) + s.lam ** (s.N - 1)
    assert sp.simplify(finite - 1) == 0
    assert sp.simplify(finite.subs(s.lam, 1) - 1) == 0


def test_telescoping_induction_step_symbolic():
    s = sy.symbols()
    t, n = s.t, s.n
    one = sp.Sum(s.gamma ** (s.k - t) * s.r[s.k], (s.k, t + n, t + n))  # gamma^n r_{t+n} as a one-term sum
    inc = one + s.gamma ** (n + 1) * s.V[t + n + 1] - s.gamma**n * s.V[t + n]
    assert sp.simplify(sy.nstep_advantage(t, n) + inc - sy.nstep_advantage(t, n + 1)) == 0
    assert sp.simplify(inc.doit() - s.gamma**n * sy.td_error(t + n)) == 0


def test_gae_recursion_step_symbolic():
    s = sy.symbols()
    t, T, l = s.t, s.T, s.l
    gl = s.gamma * s.lam
    shifted = sp.Sum(gl ** (l + 1) * s.delta[t + l + 1], (l, 0, T - t - 1))
    assert sp.simplify(gl * sy.gae_closed_form(t + 1, T, s.delta) - shifted) == 0
    head = sp.Sum(gl**l * s.delta[t + l], (l, 0, 0))
    assert sp.simplify(head + shifted.change_index(l, l + 1) - sy.gae_closed_form(t, T, s.delta)) == 0


def test_lambdify_rejects_indices_outside_the_sequence():
    wrong = sy.gae_closed_form(0, 4)  # upper limit read as a length: reads r[4] in a 4-token sequence
    with pytest.raises(ValueError, match=r"r\[4\]"):
        sy.lambdify_sequence([wrong], 4)
    with pytest.raises(ValueError, match="non-integer index"):
        sy.lambdify_sequence([sy.td_error(sy.symbols().t)], 4)
    with pytest.raises(ValueError, match="shape"):
        sy.lambdify_sequence([sy.td_error(0)], 3)(np.zeros(2), np.zeros(3))
    with pytest.raises(ValueError, match="length"):
        sy.lambdify_sequence([sy.td_error(0)], 0)
    with pytest.raises(ValueError, match="neither a reward nor a value"):
        sy.lambdify_sequence([sy.gae_closed_form(0, 2, sy.symbols().delta)], 3)


def test_constructors_reject_symbolic_sizes_where_they_need_integers():
    s = sy.symbols()
    with pytest.raises(TypeError, match="integer"):
        sy.nstep_return(s.t, 2, T=5)
    with pytest.raises(TypeError, match="integers"):
        sy.gae_recursion(s.t, 5)
    with pytest.raises(ValueError, match="t must be <= T"):
        sy.gae_recursion(3, 2)


def test_evaluate_one_expression():
    r, v = problem(4, 3)
    got = sy.evaluate(sy.nstep_return(1, 2, 3), r, v, gamma=0.5, bootstrap=0.2)
    assert got == pytest.approx(ref.nstep_returns(r, v, 2, 0.5, 0.2)[1], rel=1e-12)


def test_unroll_agrees_with_doit():
    s = sy.symbols()
    for e in (sy.lambda_return_finite(1, 4), sy.gae_closed_form(0, 3), sp.Sum(s.r[s.k], (s.k, 3, 1))):
        assert sp.expand(sy.unroll(e) - e.doit()) == 0
    with pytest.raises(ValueError, match="integer limits"):
        sy.unroll(sy.mc_return(0, s.T))
