"""The one front door: every call is validated once, then runs on exactly one backend (valuelab._engine.problem)."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import valuelab as vl
from valuelab._engine import native as _native
from valuelab._engine import problem as _problem


@pytest.fixture
def ran(monkeypatch):
    """Record which backends run: 'c' (the kernel was handed the job), 'blocked', 'general'."""
    seen = []
    real_scan, real_fused = _native.scan, _problem.fused_returns

    def scan(*a):
        out = real_scan(*a)
        if out is not None:
            seen.append("c")
        return out

    def fused(*a):
        seen.append("blocked")
        return real_fused(*a)

    monkeypatch.setattr(_native, "scan", scan)
    monkeypatch.setattr(_problem, "fused_returns", fused)
    real_solve = _problem.solve

    def solve(p, general):
        def traced_general(q):
            seen.append("general")
            return general(q)

        return real_solve(p, traced_general)

    import valuelab.advantages as adv_mod
    import valuelab.returns as ret_mod

    real_fast = adv_mod.fast_gae

    def fast(*a):  # the commonest call goes straight to the kernel (_problem.fast_gae): the C backend too
        out = real_fast(*a)
        if out is not None:
            seen.append("c")
        return out

    monkeypatch.setattr(adv_mod, "fast_gae", fast)
    monkeypatch.setattr(adv_mod, "solve", solve)
    monkeypatch.setattr(ret_mod, "solve", solve)
    return seen


R = torch.randn(2, 50, generator=torch.Generator().manual_seed(0))
V = torch.randn(2, 50, generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize(
    "kwargs,dtype,grad,expect_c,expect_torch",
    [
        (dict(gamma=1.0, lam=0.95), torch.float32, False, "c", "blocked"),
        (dict(gamma=0.99, lam=1.0), torch.float64, False, "c", "blocked"),
        (dict(gamma=torch.tensor(0.99), lam=0.95), torch.float32, False, "general", "general"),
        (dict(gamma=1.0, lam=torch.full((2, 1), 0.9)), torch.float32, False, "general", "general"),
        (dict(gamma=1.0, lam=0.95), torch.float32, True, "general", "general"),
        (dict(gamma=1.0, lam=0.95), torch.float16, False, "general", "general"),
    ],
)
def test_each_call_runs_exactly_one_backend(ran, cpu_path, kwargs, dtype, grad, expect_c, expect_torch):
    r = R.to(dtype).detach().clone().requires_grad_(grad)
    out = vl.gae(r, V.to(dtype), **kwargs)
    assert ran == [expect_c if cpu_path == "c-kernel" else expect_torch]
    assert out.advantages.dtype == dtype and out.advantages.requires_grad == grad


def test_a_bad_argument_is_found_before_any_backend_runs(ran, cpu_path):
    with pytest.raises(ValueError, match="^lam must lie in"):
        vl.gae(R, V, lam=1.5)
    with pytest.raises(ValueError, match="^mask must have shape"):
        vl.discounted_returns(R, mask=torch.ones(3, 50, dtype=torch.bool))
    assert ran == []


def test_the_first_error_is_the_first_in_the_order(cpu_path):
    # rewards, values, mask, gamma, bootstrap, lam: finiteness waits, but never past a later argument's error
    bad = R.clone()
    bad[0, 3] = float("nan")
    with pytest.raises(ValueError, match="^rewards must be finite"):
        vl.gae(bad, V, lam=2.0)
    with pytest.raises(ValueError, match="^rewards must be finite"):
        vl.gae(bad, torch.zeros(2, 7))
    with pytest.raises(ValueError, match="^values must be finite"):
        vl.gae(R, bad, mask=torch.ones(3, 3))
    with pytest.raises(ValueError, match="^mask must have shape"):
        vl.gae(R, V, mask=torch.ones(3, 3), lam=2.0)


# ---------------------------------------------------------------------------
# the fast path of valuelab.gae's commonest call (_problem.fast_gae)
# ---------------------------------------------------------------------------

needs_kernel = pytest.mark.skipif(not _native.available(), reason=f"C kernel not available: {_native.status()}")


def _full_path(r, v, mask, gamma, lam):
    p = _problem.validate(r, v, mask, gamma, None, lam, need_values=True)
    return _problem.solve(p, lambda q: pytest.fail("the fused path applies"))


@needs_kernel
@settings(max_examples=60, deadline=None)
@given(B=st.integers(1, 5), T=st.integers(1, 90), f64=st.booleans(), masked=st.sampled_from([None, "rp", "holes"]),
       gamma=st.floats(0.0, 1.0), lam=st.floats(0.0, 1.0), seed=st.integers(0, 2**16))
def test_the_fast_path_gives_the_bits_of_the_full_path(B, T, f64, masked, gamma, lam, seed):
    gen = torch.Generator().manual_seed(seed)
    dtype = torch.float64 if f64 else torch.float32
    r = torch.randn(B, T, generator=gen, dtype=dtype)
    v = torch.randn(B, T, generator=gen, dtype=dtype)
    mask = None
    if masked == "rp":
        mask = torch.arange(T) < torch.randint(0, T + 1, (B, 1), generator=gen)
    elif masked == "holes":
        mask = torch.rand(B, T, generator=gen) < 0.7
    fast = _problem.fast_gae(r, v, mask, gamma, lam, None)
    assert fast is not None  # the commonest call takes it
    want = _full_path(r, v, mask, gamma, lam)
    assert torch.equal(fast[0], want[0]) and torch.equal(fast[1], want[1])
    out = vl.gae(r, v, mask=mask, gamma=gamma, lam=lam)  # and the public function returns the same
    assert torch.equal(out.advantages, want[0]) and torch.equal(out.returns, want[1])


class _Mode(torch.overrides.TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def _declined_calls():
    """(what, rewards, values, mask, gamma, lam, bootstrap) of calls the fast path must leave to the full one."""
    m = torch.ones(2, 50, dtype=torch.bool)
    return [
        ("one sequence", R[0], V[0], None, 1.0, 0.95, None),
        ("a tensor gamma", R, V, None, torch.tensor(1.0), 0.95, None),
        ("an int gamma", R, V, None, 1, 0.95, None),
        ("an int lam", R, V, None, 1.0, 1, None),
        ("gamma above 1", R, V, None, 1.5, 0.95, None),
        ("lam below 0", R, V, None, 1.0, -0.5, None),
        ("a NaN lam", R, V, None, 1.0, math.nan, None),
        ("a bootstrap", R, V, None, 1.0, 0.95, torch.zeros(2)),
        ("float16", R.half(), V.half(), None, 1.0, 0.95, None),
        ("values of another dtype", R, V.double(), None, 1.0, 0.95, None),
        ("values of another shape", R, V[:, :49], None, 1.0, 0.95, None),
        ("strided rewards", R.t().contiguous().t(), V, None, 1.0, 0.95, None),
        ("a float mask", R, V, m.float(), 1.0, 0.95, None),
        ("a mask of another shape", R, V, m[:, :49], 1.0, 0.95, None),
        ("a Parameter", torch.nn.Parameter(R.clone()), V, None, 1.0, 0.95, None),
        ("no tokens", R[:, :0], V[:, :0], None, 1.0, 0.95, None),
        ("no rows", R[:0], V[:0], None, 1.0, 0.95, None),
        ("a NaN reward", torch.where(torch.arange(50) == 7, math.nan, R), V, None, 1.0, 0.95, None),
        ("a nested tensor", torch.nested.nested_tensor([R[0], R[1, :5]]), V, None, 1.0, 0.95, None),
        ("a negative view", torch._neg_view(-R), V, None, 1.0, 0.95, None),
    ]


@needs_kernel
@pytest.mark.parametrize("case", _declined_calls(), ids=lambda c: c[0])
def test_the_fast_path_declines_every_other_call(case):
    _, r, v, mask, gamma, lam, boot = case
    assert _problem.fast_gae(r, v, mask, gamma, lam, boot) is None


@needs_kernel
def test_the_fast_path_declines_gradients_modes_and_a_switched_off_kernel():
    r = R.clone().requires_grad_(True)
    assert _problem.fast_gae(r, V, None, 1.0, 0.95, None) is None
    with torch.no_grad():  # nothing to differentiate: the fast path is fine
        assert _problem.fast_gae(r, V, None, 1.0, 0.95, None) is not None
    with _Mode():
        assert _problem.fast_gae(R, V, None, 1.0, 0.95, None) is None
    from torch.utils._python_dispatch import TorchDispatchMode

    class _Dispatch(TorchDispatchMode):  # a dispatch mode (as FakeTensorMode is) could replace empty_like's result
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    with _Dispatch():
        assert _problem.fast_gae(R, V, None, 1.0, 0.95, None) is None
    with _native.disabled():
        assert _problem.fast_gae(R, V, None, 1.0, 0.95, None) is None
    assert _problem.fast_gae(R, V, None, 1.0, 0.95, None) is not None
