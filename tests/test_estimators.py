"""The batched torch API of valuelab against the literal numpy oracle in valuelab.lab.reference."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import valuelab as vl
from valuelab.lab import reference as ref

TOL64 = dict(rtol=1e-9, atol=1e-9)
# float32 against the float64 oracle: rewards/values are O(1) and sequences are short here
TOL32 = dict(rtol=1e-4, atol=1e-4)

unit = st.one_of(st.sampled_from([0.0, 1.0]), st.floats(0.0, 1.0))


@st.composite
def batches(draw, per_step=True):
    """A random (B, T) problem: rewards, values, a mask with padding and/or holes, gamma, lam, bootstrap."""
    B = draw(st.integers(1, 4))
    T = draw(st.integers(0, 9))
    seed = draw(st.integers(0, 2**31 - 1))
    rng = np.random.default_rng(seed)
    rewards = rng.normal(size=(B, T))
    values = rng.normal(size=(B, T))
    kind = draw(st.sampled_from(["none", "right", "holes", "empty-row"]))
    if kind == "none":
        mask = np.ones((B, T), bool)
    elif kind == "right":
        lengths = rng.integers(0, T + 1, size=B)
        mask = np.arange(T)[None, :] < lengths[:, None]
    else:
        mask = rng.random((B, T)) < 0.6
        if kind == "empty-row" and B > 1:
            mask[0] = False
    mode = draw(st.sampled_from(["scalar", "per-seq", "per-step"] if per_step else ["scalar"]))
    if mode == "scalar":
        gamma, lam = draw(unit), draw(unit)
        g_arr, l_arr = np.full((B, T), gamma), np.full((B, T), lam)
    elif mode == "per-seq":
        g_arr = np.broadcast_to(rng.choice([0.0, 1.0, rng.random()], size=(B, 1)), (B, T)).copy()
        l_arr = np.broadcast_to(rng.random((B, 1)), (B, T)).copy()
        gamma, lam = torch.tensor(g_arr[:, :1]), torch.tensor(l_arr[:, :1])
    else:
        g_arr = np.where(rng.random((B, T)) < 0.2, 0.0, rng.random((B, T)))
        l_arr = rng.random((B, T))
        gamma, lam = torch.tensor(g_arr), torch.tensor(l_arr)
    boot = draw(st.sampled_from(["none", "float", "tensor"]))
    b_arr = {"none": np.zeros(B), "float": np.full(B, 0.7), "tensor": rng.normal(size=B)}[boot]
    bootstrap = {"none": None, "float": 0.7, "tensor": torch.tensor(b_arr)}[boot]
    return dict(
        rewards=torch.tensor(rewards), values=torch.tensor(values), mask=torch.tensor(mask),
        gamma=gamma, lam=lam, bootstrap=bootstrap,
        np=dict(r=rewards, v=values, m=mask, g=g_arr, l=l_arr, b=b_arr),
    )


def per_row(case, fn):
    """Apply a single-sequence reference to each row's valid (compacted) tokens; 0 elsewhere."""
    n = case["np"]
    out = np.zeros_like(n["r"])
    for i in range(n["r"].shape[0]):
        m = n["m"][i]
        out[i, m] = fn(n["r"][i, m], n["v"][i, m], n["g"][i, m], n["l"][i, m], n["b"][i])
    return out


def close(a, b, **tol):
    np.testing.assert_allclose(a.detach().cpu().numpy(), b, **(tol or TOL64))


@given(batches())
def test_discounted_returns_matches_reference(case):
    got = vl.discounted_returns(case["rewards"], mask=case["mask"], gamma=case["gamma"], bootstrap=case["bootstrap"])
    close(got, per_row(case, lambda r, v, g, l, b: ref.mc_returns(r, g, b)))


@given(batches())
def test_td_targets_and_errors_match_reference(case):
    kw = dict(mask=case["mask"], gamma=case["gamma"], bootstrap=case["bootstrap"])
    close(vl.td_targets(case["rewards"], case["values"], **kw), per_row(case, lambda r, v, g, l, b: ref.td_targets(r, v, g, b)))
    close(vl.td_errors(case["rewards"], case["values"], **kw), per_row(case, lambda r, v, g, l, b: ref.td_errors(r, v, g, b)))


@given(batches(), st.integers(1, 12))
def test_nstep_returns_match_reference(case, n):
    got = vl.nstep_returns(case["rewards"], case["values"], n, mask=case["mask"], gamma=case["gamma"], bootstrap=case["bootstrap"])
    close(got, per_row(case, lambda r, v, g, l, b: ref.nstep_returns(r, v, n, g, b)))


@given(batches())
def test_gae_matches_backward_recursion_reference(case):
    out = vl.gae(case["rewards"], case["values"], mask=case["mask"], gamma=case["gamma"], lam=case["lam"], bootstrap=case["bootstrap"])
    expected = per_row(case, lambda r, v, g, l, b: ref.gae_recursion(r, v, g, l, b))
    close(out.advantages, expected)
    close(out.returns, expected + np.where(case["np"]["m"], case["np"]["v"], 0.0))


@given(batches(per_step=False))
def test_gae_matches_lambda_mixture_definition(case):
    """The batched GAE equals GAE's definition: the (1-λ)λ^{n-1}-weighted mixture of n-step advantages."""
    out = vl.gae(case["rewards"], case["values"], mask=case["mask"], gamma=case["gamma"], lam=case["lam"], bootstrap=case["bootstrap"])
    lam = float(case["lam"])
    close(out.advantages, per_row(case, lambda r, v, g, l, b: ref.gae_mixture(r, v, g, lam, b)), rtol=1e-8, atol=1e-8)


@given(batches())
def test_gae_limits(case):
    kw = dict(mask=case["mask"], gamma=case["gamma"], bootstrap=case["bootstrap"])
    r, v, m = case["rewards"], case["values"], case["mask"]
    close(vl.gae(r, v, lam=0.0, **kw).advantages, vl.td_errors(r, v, **kw).numpy())
    mc = vl.discounted_returns(r, **kw) - torch.where(m, v, torch.zeros(()))
    close(vl.gae(r, v, lam=1.0, **kw).advantages, mc.numpy())
    close(vl.nstep_returns(r, v, 1, **kw), vl.td_targets(r, v, **kw).numpy())


@given(batches())
def test_holes_equal_compacted_sequence(case):
    """gae on a row with holes equals gae on the hole-free compacted row, scattered back."""
    out = vl.gae(case["rewards"], case["values"], mask=case["mask"], gamma=case["gamma"], lam=case["lam"], bootstrap=case["bootstrap"])
    n = case["np"]
    for i in range(n["r"].shape[0]):
        m = n["m"][i]
        b = float(n["b"][i])
        sub = vl.gae(torch.tensor(n["r"][i, m]), torch.tensor(n["v"][i, m]), gamma=torch.tensor(n["g"][i, m]),
                     lam=torch.tensor(n["l"][i, m]), bootstrap=b)
        close(out.advantages[i][torch.tensor(m)], sub.advantages.numpy())
        assert bool((out.advantages[i][~torch.tensor(m)] == 0).all())
        assert bool((out.returns[i][~torch.tensor(m)] == 0).all())


@given(batches())
def test_masked_outputs_are_exactly_zero_even_with_garbage_padding(case):
    m = case["mask"]
    r = torch.where(m, case["rewards"], torch.full((), 100.0, dtype=torch.float64))
    v = torch.where(m, case["values"], torch.full((), 100.0, dtype=torch.float64))
    a = vl.gae(r, v, mask=m, gamma=case["gamma"], lam=case["lam"], bootstrap=case["bootstrap"])
    clean = vl.gae(case["rewards"], case["values"], mask=m, gamma=case["gamma"], lam=case["lam"], bootstrap=case["bootstrap"])
    assert torch.equal(a.advantages, clean.advantages)  # padding values never leak
    assert bool((a.advantages[~m] == 0).all()) and bool((a.returns[~m] == 0).all())
    for f in (vl.discounted_returns(r, mask=m), vl.td_targets(r, v, mask=m), vl.td_errors(r, v, mask=m), vl.nstep_returns(r, v, 3, mask=m)):
        assert bool((f[~m] == 0).all())


@given(batches())
def test_float32_agrees_with_float64(case):
    kw = dict(mask=case["mask"], gamma=case["gamma"], lam=case["lam"], bootstrap=case["bootstrap"])
    f64 = vl.gae(case["rewards"], case["values"], **kw).advantages
    kw32 = {k: (x.float() if isinstance(x, torch.Tensor) and x.is_floating_point() else x) for k, x in kw.items()}
    f32 = vl.gae(case["rewards"].float(), case["values"].float(), **kw32).advantages
    assert f32.dtype == torch.float32
    close(f32, f64.numpy(), **TOL32)


@pytest.mark.parametrize("fn", ["discounted_returns", "td_targets", "td_errors", "nstep_returns", "gae"])
@pytest.mark.parametrize("shape", [(0,), (1,), (5,), (3, 0), (3, 1), (2, 7)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_outputs_keep_shape_dtype_device(fn, shape, dtype):
    r = torch.randn(shape, dtype=dtype, generator=torch.Generator().manual_seed(0))
    v = torch.randn(shape, dtype=dtype, generator=torch.Generator().manual_seed(1))
    f = getattr(vl, fn)
    out = {"discounted_returns": lambda: f(r), "nstep_returns": lambda: f(r, v, 2), "gae": lambda: f(r, v).advantages}.get(
        fn, lambda: f(r, v)
    )()
    assert out.shape == r.shape and out.dtype == dtype and out.device == r.device
    assert bool(torch.isfinite(out).all())


def test_all_masked_rows_give_zeros_not_nan():
    r = torch.randn(2, 4)
    m = torch.zeros(2, 4, dtype=torch.bool)
    out = vl.gae(r, r, mask=m)
    assert torch.equal(out.advantages, torch.zeros(2, 4)) and torch.equal(out.returns, torch.zeros(2, 4))
    assert vl.masked_mean(r, m).item() == 0.0
    assert vl.value_loss(r, r + 1, mask=m).item() == 0.0


def test_bootstrap_enters_at_last_valid_token_only():
    r = torch.tensor([[1.0, 2.0, 0.0]])
    m = torch.tensor([[1, 1, 0]])
    g = vl.discounted_returns(r, mask=m, gamma=0.5, bootstrap=torch.tensor([4.0]))
    assert torch.allclose(g, torch.tensor([[1 + 0.5 * 2 + 0.25 * 4, 2 + 0.5 * 4, 0.0]]))


def test_cuda_when_present():
    if not torch.cuda.is_available():
        pytest.skip("no GPU on this machine")
    r = torch.randn(4, 33, device="cuda")
    m = torch.rand(4, 33, device="cuda") < 0.7
    out = vl.gae(r, r * 0.5, mask=m, gamma=0.99, lam=0.9)
    cpu = vl.gae(r.cpu(), r.cpu() * 0.5, mask=m.cpu(), gamma=0.99, lam=0.9)
    assert out.advantages.device.type == "cuda"
    assert torch.allclose(out.advantages.cpu(), cpu.advantages, atol=1e-5)


# ---------------------------------------------------------------------------
# messages: each estimate and argument is named (mutation testing: tools/mutation_score.py)
# ---------------------------------------------------------------------------


def test_overflow_messages_name_the_estimate():
    big = torch.tensor([[3e38, 3e38]], dtype=torch.float32)
    with pytest.raises(ValueError, match=r"^rewards and values are finite but too large for torch\.float32: the TD targets "
                                         r"overflow at \[0, 0\]; scale the rewards \(or use float64\)$"):
        vl.td_targets(big, big)
    with pytest.raises(ValueError, match=r"the n-step returns overflow at \[0, 0\];"):
        vl.nstep_returns(big, big, 2)
    with pytest.raises(ValueError, match=r"the TD errors overflow at \[0, 1\];"):
        vl.td_errors(big, -big)


def test_nstep_checks_n_by_name():
    x = torch.zeros(2, 3)
    with pytest.raises(ValueError, match=r"^n must be a positive int, got 0$"):
        vl.nstep_returns(x, x, 0)
    with pytest.raises(TypeError, match=r"^n must be a positive int, got float$"):
        vl.nstep_returns(x, x, 2.0)


# ---------------------------------------------------------------------------
# decoupled GAE and the length-adaptive λ (chapter 10)
# ---------------------------------------------------------------------------


@given(batches(per_step=False), unit, unit)
def test_decoupled_gae_is_gae_with_each_lambda(case, lam_actor, lam_critic):
    r, v = case["rewards"], case["values"]
    out = vl.decoupled_gae(r, v, mask=case["mask"], gamma=case["gamma"], lam_actor=lam_actor, lam_critic=lam_critic,
                           bootstrap=case["bootstrap"])
    assert isinstance(out, vl.DecoupledGAE)
    m = case["np"]["m"]
    close(out.advantages, per_row(case, lambda r, v, g, l, b: ref.gae_recursion(r, v, g, np.full_like(r, lam_actor), b)))
    critic = per_row(case, lambda r, v, g, l, b: ref.gae_recursion(r, v, g, np.full_like(r, lam_critic), b))
    close(out.returns, critic + np.where(m, case["np"]["v"], 0.0))


def test_decoupled_gae_defaults_are_gamma_one_lam_actor_095_lam_critic_one():
    g = torch.Generator().manual_seed(0)
    r, v = torch.randn(3, 6, generator=g, dtype=torch.float64), torch.randn(3, 6, generator=g, dtype=torch.float64)
    out = vl.decoupled_gae(r, v)
    for t in range(6):  # λ_critic = 1, γ = 1: the return is the Monte-Carlo return, whatever the values
        torch.testing.assert_close(out.returns[:, t], r[:, t:].sum(-1))
    torch.testing.assert_close(out.advantages, vl.gae(r, v, gamma=1.0, lam=0.95).advantages)
    mask = torch.ones(3, 6, dtype=torch.bool)
    mask[0, 4:] = False
    boot = torch.tensor([0.0, 2.0, -1.0], dtype=torch.float64)
    both = vl.decoupled_gae(r, v, mask=mask, gamma=0.9, lam_actor=0.5, lam_critic=0.7, bootstrap=boot)
    torch.testing.assert_close(both.advantages, vl.gae(r, v, mask=mask, gamma=0.9, lam=0.5, bootstrap=boot).advantages)
    torch.testing.assert_close(both.returns, vl.gae(r, v, mask=mask, gamma=0.9, lam=0.7, bootstrap=boot).returns)


def test_length_adaptive_lam_values():
    lengths = torch.tensor([0, 1, 2, 4, 10, 1000])
    lam = vl.length_adaptive_lam(lengths, alpha=0.5)  # 1 - 1/(0.5 l), clamped to [0, 1]
    assert lam.shape == (6, 1) and lam.dtype == torch.float32
    want = [0.0, 0.0, 0.0, 0.5, 0.8, 0.998]
    torch.testing.assert_close(lam[:, 0], torch.tensor(want), rtol=0, atol=1e-7)
    lam64 = vl.length_adaptive_lam(torch.tensor([3.0, 8.0, 0.0, 1e-300], dtype=torch.float64), alpha=2.0)
    assert lam64.dtype == torch.float64 and lam64.shape == (4, 1)
    torch.testing.assert_close(lam64[:, 0], torch.tensor([1 - 1 / 6, 1 - 1 / 16, 0.0, 0.0], dtype=torch.float64))
    assert vl.length_adaptive_lam(torch.tensor([40])).item() == pytest.approx(0.5)  # default alpha = 0.05
    assert vl.length_adaptive_lam(torch.zeros(0, dtype=torch.long)).shape == (0, 1)
    tiny = vl.length_adaptive_lam(torch.tensor([1e-45, 3.0]), alpha=1.0)  # a subnormal length: λ = 0, not NaN
    torch.testing.assert_close(tiny[:, 0], torch.tensor([0.0, 2 / 3]))


def test_length_adaptive_lam_messages():
    with pytest.raises(TypeError, match=r"^lengths must be a torch\.Tensor, got list$"):
        vl.length_adaptive_lam([3, 4])
    with pytest.raises(TypeError, match=r"^lengths must hold real numbers \(int or float\), got torch\.bool$"):
        vl.length_adaptive_lam(torch.tensor([True, False]))
    with pytest.raises(TypeError, match=r"^lengths must hold real numbers \(int or float\), got torch\.complex64$"):
        vl.length_adaptive_lam(torch.tensor([1 + 0j, 2 + 0j], dtype=torch.complex64))
    with pytest.raises(ValueError, match=r"^lengths must have shape \(B,\), got \(2, 2\)$"):
        vl.length_adaptive_lam(torch.ones(2, 2))
    with pytest.raises(ValueError, match=r"^lengths must be finite: it contains NaN or inf$"):
        vl.length_adaptive_lam(torch.tensor([3.0, float("inf")]))
    with pytest.raises(ValueError, match=r"^lengths must be non-negative$"):
        vl.length_adaptive_lam(torch.tensor([3, -1]))
    with pytest.raises(ValueError, match=r"^alpha must be positive$"):
        vl.length_adaptive_lam(torch.tensor([3, 4]), alpha=0.0)
    with pytest.raises(ValueError, match=r"^alpha must be non-negative, got -1\.0$"):
        vl.length_adaptive_lam(torch.tensor([3, 4]), alpha=-1.0)
    with pytest.raises(TypeError, match=r"^lengths must be a dense \(strided\) tensor, got layout torch\.sparse_coo$"):
        vl.length_adaptive_lam(torch.tensor([3.0, 4.0]).to_sparse())
    assert vl.length_adaptive_lam(torch.tensor([], dtype=torch.float32)).shape == (0, 1)  # no entries: nothing to check


def test_length_adaptive_lam_gradient_is_finite_at_length_zero():
    lengths = torch.tensor([0.0, 3.0, 0.5], dtype=torch.float64, requires_grad=True)
    vl.length_adaptive_lam(lengths, alpha=1.0).sum().backward()
    torch.testing.assert_close(lengths.grad, torch.tensor([0.0, 1 / 9, 0.0], dtype=torch.float64))  # d(1 - 1/l)/dl = 1/l²
