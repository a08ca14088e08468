"""The one front door: every call is validated once, then runs on exactly one backend (valuelab._problem)."""

from __future__ import annotations

import pytest
import torch

import valuelab as vl
from valuelab import _native, _problem


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
