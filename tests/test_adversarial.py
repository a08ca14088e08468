"""The public front door under attack: gradients everywhere they are promised, odd tensors, odd numbers.

Each case below was once a silent wrong result, a crash or a confusing error
(issue "The engine, safe and conventional"). The C boundary itself
(``valuelab._engine.native.scan`` called directly) is attacked in
``tests/test_adversarial_native.py``. Public-function cases that touch the
fused estimators run on both CPU paths (the ``cpu_path`` fixture: the C
kernel, then the PyTorch block scan).
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.autograd.forward_ad as fwAD
from torch.autograd import gradcheck

import valuelab as vl

D = torch.float64
HOLES = torch.tensor([[1, 1, 0, 1, 1, 0, 0], [0, 1, 1, 1, 0, 1, 1]], dtype=torch.bool)
MASKS = {"all valid": None, "holes": HOLES}


def _data(B=2, T=7, seed=0):
    g = torch.Generator().manual_seed(seed)
    r = torch.randn(B, T, generator=g, dtype=D)
    v = torch.randn(B, T, generator=g, dtype=D)
    b = torch.randn(B, generator=g, dtype=D)
    gs = 0.4 + 0.5 * torch.rand(B, T, generator=g, dtype=D)  # per-step gamma, away from 0 and 1
    ls = 0.4 + 0.5 * torch.rand(B, T, generator=g, dtype=D)
    return r, v, b, gs, ls


def _check(fn, *inputs):
    """Reverse and forward mode against finite differences (float64)."""
    inputs = tuple(x.detach().clone().requires_grad_() for x in inputs)
    assert gradcheck(fn, inputs, eps=1e-6, atol=1e-6, check_forward_ad=True)


def _long_mask(T, seed=1):
    g = torch.Generator().manual_seed(seed)
    m = torch.rand(1, T, generator=g) < 0.7
    m[0, -3:] = False
    return m


# ---------------------------------------------------------------------------
# gradients: every estimator, every float input (gradcheck, float64)
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("mask", MASKS.values(), ids=MASKS.keys())
def test_gae_gradients_in_every_input(mask, cpu_path):
    r, v, b, gs, ls = _data()
    _check(lambda r, v, b: vl.gae(r, v, mask=mask, gamma=0.9, lam=0.8, bootstrap=b), r, v, b)
    _check(lambda g, l: vl.gae(r, v, mask=mask, gamma=g, lam=l, bootstrap=b), gs, ls)  # per step
    _check(lambda g, l: vl.gae(r, v, mask=mask, gamma=g, lam=l, bootstrap=b), gs[:, :1], ls[:, :1])  # per row
    _check(lambda g, l: vl.gae(r, v, mask=mask, gamma=g, lam=l), torch.tensor(0.95, dtype=D), torch.tensor(0.7, dtype=D))


@pytest.mark.parametrize("mask", MASKS.values(), ids=MASKS.keys())
def test_returns_and_td_gradients_in_every_input(mask, cpu_path):
    r, v, b, gs, _ = _data()
    _check(lambda r, b: vl.discounted_returns(r, mask=mask, gamma=0.9, bootstrap=b), r, b)
    _check(lambda g: vl.discounted_returns(r, mask=mask, gamma=g, bootstrap=b), gs)
    _check(lambda g: vl.discounted_returns(r, mask=mask, gamma=g, bootstrap=b), torch.tensor(0.9, dtype=D))
    _check(lambda r, v, b, g: vl.td_targets(r, v, mask=mask, gamma=g, bootstrap=b), r, v, b, gs)
    _check(lambda r, v, b, g: vl.td_errors(r, v, mask=mask, gamma=g, bootstrap=b), r, v, b, gs)


@pytest.mark.parametrize("n", range(1, 13))
@pytest.mark.parametrize("mask", MASKS.values(), ids=MASKS.keys())
def test_nstep_gradients_for_every_n(n, mask):
    # n = 3, 5, 10 (two or more bits set) once failed: an in-place update of a tensor autograd had saved
    r, v, b, gs, _ = _data()
    _check(lambda r, v, b, g: vl.nstep_returns(r, v, n, mask=mask, gamma=g, bootstrap=b), r, v, b, gs)
    _check(lambda r, v: vl.nstep_returns(r, v, n, mask=mask, gamma=0.9), r, v)


@pytest.mark.parametrize("mask", MASKS.values(), ids=MASKS.keys())
def test_decoupled_gae_and_length_adaptive_lam_gradients(mask, cpu_path):
    r, v, b, gs, ls = _data()
    _check(lambda r, v, b: vl.decoupled_gae(r, v, mask=mask, gamma=0.9, lam_actor=0.8, lam_critic=1.0, bootstrap=b), r, v, b)
    _check(lambda g, la: vl.decoupled_gae(r, v, mask=mask, gamma=g, lam_actor=la, lam_critic=0.97), gs, ls[:, :1])
    lengths = torch.tensor([40.0, 120.0], dtype=D)  # alpha * l > 1: inside (0, 1), where lambda is smooth
    _check(lambda l: vl.length_adaptive_lam(l, alpha=0.05), lengths)
    _check(lambda l: vl.gae(r, v, mask=mask, gamma=0.99, lam=vl.length_adaptive_lam(l, alpha=0.05)), lengths)


def test_long_rows_take_the_blocked_forms_and_keep_their_gradients(cpu_path):
    # T = 150 crosses the one-block limit of the Toeplitz form (128) and the doubling block (32)
    r, v, b, gs, ls = _data(B=1, T=150, seed=3)
    m = _long_mask(150)
    _check(lambda r: vl.gae(r, v, mask=m, gamma=0.99, lam=0.95, bootstrap=b).advantages, r)
    _check(lambda g: vl.gae(r, v, mask=m, gamma=g, lam=ls, bootstrap=b).returns, gs)
    _check(lambda g: vl.discounted_returns(r, mask=m, gamma=g), torch.tensor(0.97, dtype=D))


def test_losses_and_rewards_gradients():
    r, v, b, _, _ = _data()
    old = v + 0.05
    _check(lambda x: vl.masked_whiten(x, HOLES), r)
    _check(lambda x: vl.masked_whiten(x, HOLES, shift_mean=False), r)
    _check(lambda x: vl.masked_mean(x, HOLES, dim=-1), r)
    for agg in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum"):
        _check(lambda x: vl.value_loss(x, v, mask=HOLES, old_values=old, clip_range=0.2, aggregation=agg), r)
    for est in ("k1", "k2", "k3"):
        _check(lambda lp, s: vl.kl_shaped_rewards(lp, v, s, mask=HOLES, beta=0.1, estimator=est), r, b)


def test_a_bootstrap_that_needs_gradients_gets_them_with_numeric_gamma_and_lam(cpu_path):
    # once lost silently on the C path, and an out= error on the PyTorch path
    r, v, _, _, _ = _data()
    b = torch.tensor([0.5, -1.0], dtype=D, requires_grad=True)
    gamma, lam = 0.9, 0.8
    out = vl.gae(r, v, gamma=gamma, lam=lam, bootstrap=b)
    assert out.advantages.requires_grad and out.returns.requires_grad
    out.advantages.sum().backward()
    T = r.shape[1]
    # A_t contains (gamma lam)^(T-1-t) gamma b: the derivative of sum_t A_t in b
    expect = sum((gamma * lam) ** (T - 1 - t) * gamma for t in range(T))
    assert torch.allclose(b.grad, torch.full((2,), expect, dtype=D), rtol=1e-12)
    b.grad = None
    vl.discounted_returns(r, gamma=gamma, bootstrap=b).sum().backward()
    assert torch.allclose(b.grad, torch.full((2,), sum(gamma ** (T - t) for t in range(T)), dtype=D), rtol=1e-12)


def test_forward_mode_tangents_are_not_dropped(cpu_path):
    # a dual tensor does not require grad: it once took the C path and lost its tangent
    r, v, _, _, _ = _data()
    t = torch.randn_like(r)
    for fn in (
        lambda x: vl.gae(x, v, mask=HOLES, gamma=0.9, lam=0.8).advantages,
        lambda x: vl.discounted_returns(x, mask=HOLES, gamma=0.9),
        lambda x: vl.nstep_returns(x, v, 3, mask=HOLES),
    ):
        with fwAD.dual_level():
            out = fn(fwAD.make_dual(r, t))
            tangent = fwAD.unpack_dual(out).tangent
        assert tangent is not None
        # the maps are linear in the rewards: the tangent is fn(r + t) - fn(r)
        assert torch.allclose(tangent, fn(r + t) - fn(r), atol=1e-12)


def test_without_grad_mode_the_fused_path_runs_and_nothing_is_traced(cpu_path):
    r, v, _, _, _ = _data()
    with torch.no_grad():
        out = vl.gae(r.requires_grad_(), v, gamma=0.9, lam=0.8)
    assert not out.advantages.requires_grad


# ---------------------------------------------------------------------------
# odd tensors at the front door
# ---------------------------------------------------------------------------

R = torch.randn(3, 40, generator=torch.Generator().manual_seed(7), dtype=torch.float32)
V = torch.randn(3, 40, generator=torch.Generator().manual_seed(8), dtype=torch.float32)
MB = torch.rand(3, 40, generator=torch.Generator().manual_seed(9)) < 0.6

CALLS = {
    "gae": lambda r, v, m: vl.gae(r, v, mask=m, gamma=0.99, lam=0.95).advantages,
    "gae returns": lambda r, v, m: vl.gae(r, v, mask=m, gamma=0.99, lam=0.95).returns,
    "discounted_returns": lambda r, v, m: vl.discounted_returns(r, mask=m, gamma=0.9),
    "td_targets": lambda r, v, m: vl.td_targets(r, v, mask=m),
    "td_errors": lambda r, v, m: vl.td_errors(r, v, mask=m),
    "nstep_returns": lambda r, v, m: vl.nstep_returns(r, v, 5, mask=m),
    "masked_whiten": lambda r, v, m: vl.masked_whiten(r, m),
    "masked_mean": lambda r, v, m: vl.masked_mean(r, m, dim=-1),
    "value_loss": lambda r, v, m: vl.value_loss(r, v, mask=m, old_values=v, clip_range=0.2),
    "kl_shaped_rewards": lambda r, v, m: vl.kl_shaped_rewards(r, v, 1.0, mask=m, estimator="k3"),
}


NO_VALUES = ("masked_whiten", "masked_mean", "discounted_returns")  # calls whose second tensor is not read


def _odd_bytes(mask: torch.Tensor) -> torch.Tensor:
    """The same mask as bool, but with arbitrary nonzero bytes where it is True."""
    noise = torch.randint(1, 256, mask.shape, generator=torch.Generator().manual_seed(0), dtype=torch.int32)
    return (mask.to(torch.int32) * noise).to(torch.uint8).view(torch.bool)


@pytest.mark.parametrize("name", CALLS)
def test_a_bool_mask_with_bytes_other_than_0_and_1_means_nonzero(name, cpu_path):
    odd = _odd_bytes(MB)
    assert int(odd.view(torch.uint8).max()) > 1
    assert torch.equal(CALLS[name](R, V, odd), CALLS[name](R, V, MB))
    if name == "gae":
        assert torch.equal(vl.last_token_onehot(odd), vl.last_token_onehot(MB))


@pytest.mark.parametrize("name", CALLS)
def test_neg_bit_views_keep_their_sign(name, cpu_path):
    neg_r = torch._neg_view(-R)  # holds -R in memory, reads as R
    assert neg_r.is_neg()
    neg_v = torch.complex(torch.zeros_like(V), -V).conj().imag  # reads as V, through a neg bit
    assert neg_v.is_neg()
    assert torch.equal(CALLS[name](neg_r, neg_v, MB), CALLS[name](R, V, MB))


@pytest.mark.parametrize("name", CALLS)
def test_efficient_zero_tensors_are_zeros(name, cpu_path):
    z = torch._efficientzerotensor(R.shape, dtype=R.dtype)
    assert z._is_zerotensor()
    zeros = torch.zeros_like(R)
    assert torch.equal(CALLS[name](z, V, MB), CALLS[name](zeros, V, MB))
    if name not in NO_VALUES:
        assert torch.equal(CALLS[name](R, z, MB), CALLS[name](R, zeros, MB))


def _freed(x: torch.Tensor) -> torch.Tensor:
    y = x.clone()
    y.untyped_storage().resize_(0)  # what FSDP does to a sharded parameter between uses
    return y


@pytest.mark.parametrize("name", CALLS)
def test_a_freed_storage_is_an_error_never_a_read(name, cpu_path):
    with pytest.raises(ValueError, match=r"^(rewards|x|values|logprobs): its storage holds 0 bytes"):
        CALLS[name](_freed(R), V, MB)
    if name not in NO_VALUES:
        with pytest.raises(ValueError, match=r"^(values|returns|ref_logprobs): its storage holds 0 bytes"):
            CALLS[name](R, _freed(V), MB)
    with pytest.raises(ValueError, match=r"^mask: its storage holds 0 bytes"):
        CALLS[name](R, V, _freed(MB))


def test_a_freed_bootstrap_gamma_or_lengths_is_an_error():
    b = _freed(torch.zeros(3))
    with pytest.raises(ValueError, match="^bootstrap: its storage"):
        vl.gae(R, V, bootstrap=b)
    with pytest.raises(ValueError, match="^gamma: its storage"):
        vl.gae(R, V, gamma=_freed(torch.full((3, 1), 0.9)))
    with pytest.raises(ValueError, match="^lam: its storage"):
        vl.gae(R, V, lam=_freed(torch.full((3, 1), 0.9)))
    with pytest.raises(ValueError, match="^lengths: its storage"):
        vl.length_adaptive_lam(_freed(torch.tensor([3, 4])))


@pytest.mark.parametrize("name", CALLS)
def test_meta_sparse_and_nested_tensors_are_refused_by_name(name):
    meta = torch.empty(R.shape, device="meta")
    with pytest.raises(ValueError, match=r"^(rewards|x|values|logprobs) is a meta tensor"):
        CALLS[name](meta, V, MB)
    with pytest.raises(TypeError, match=r"^(rewards|x|values|logprobs) must be a dense \(strided\) tensor"):
        CALLS[name](R.to_sparse(), V, MB)
    with pytest.raises(TypeError, match=r"^mask must be a dense \(strided\) tensor"):
        CALLS[name](R, V, MB.to_sparse())
    nested = torch.nested.nested_tensor([R[0], R[1, :5]])
    with pytest.raises(TypeError, match=r"^(rewards|x|values|logprobs) must be a dense tensor, not a nested"):
        CALLS[name](nested, V, MB)


def test_odd_tensors_as_gamma_lam_bootstrap_and_lengths():
    with pytest.raises(ValueError, match="^gamma is a meta tensor"):
        vl.gae(R, V, gamma=torch.empty(3, 1, device="meta"))
    with pytest.raises(TypeError, match="^bootstrap must be a dense"):
        vl.gae(R, V, bootstrap=torch.zeros(3).to_sparse())
    with pytest.raises(TypeError, match="^lengths must be a dense"):
        vl.length_adaptive_lam(torch.tensor([3.0, 4.0]).to_sparse())
    neg_b = torch._neg_view(-torch.tensor([1.0, 2.0, 3.0]))
    assert torch.equal(vl.gae(R, V, bootstrap=neg_b).advantages, vl.gae(R, V, bootstrap=torch.tensor([1.0, 2.0, 3.0])).advantages)
    z = torch._efficientzerotensor((3,))
    assert torch.equal(vl.gae(R, V, bootstrap=z).advantages, vl.gae(R, V).advantages)


# ---------------------------------------------------------------------------
# numbers: overflow, NaN, and never a silent non-finite output
# ---------------------------------------------------------------------------

HUGE = 10**400  # a Python int no float can hold: float(HUGE) raises OverflowError


@pytest.mark.parametrize(
    "name,call",
    [
        ("gamma", lambda: vl.gae(R, V, gamma=HUGE)),
        ("lam", lambda: vl.gae(R, V, lam=HUGE)),
        ("gamma", lambda: vl.discounted_returns(R, gamma=HUGE)),
        ("gamma", lambda: vl.td_targets(R, V, gamma=HUGE)),
        ("bootstrap", lambda: vl.gae(R, V, bootstrap=HUGE)),
        ("bootstrap", lambda: vl.nstep_returns(R, V, 2, bootstrap=-HUGE)),
        ("clip_range", lambda: vl.value_loss(R, V, old_values=V, clip_range=HUGE)),
        ("beta", lambda: vl.kl_shaped_rewards(R, V, 1.0, beta=HUGE)),
        ("score", lambda: vl.kl_shaped_rewards(R, V, HUGE)),
        ("alpha", lambda: vl.length_adaptive_lam(torch.tensor([3, 4]), alpha=HUGE)),
        ("eps", lambda: vl.masked_whiten(R, eps=HUGE)),
    ],
)
def test_numbers_too_large_for_a_float_are_a_value_error_naming_the_argument(name, call):
    with pytest.raises(ValueError, match=f"^{name} "):
        call()


def test_whitening_never_gives_nan_or_collapses():
    assert torch.equal(vl.masked_whiten(torch.ones(2, 3), eps=0.0), torch.zeros(2, 3))  # was all NaN
    big = torch.tensor([3e38, -3e38, 0.0])  # float32: the squares overflow
    out = vl.masked_whiten(big)
    assert torch.allclose(out, torch.tensor([1.0, -1.0, 0.0]))  # was all zeros
    assert torch.allclose(vl.masked_whiten(big, shift_mean=False), torch.tensor([1.0, -1.0, 0.0]))
    tiny = torch.tensor([1e-30, -1e-30, 0.0], dtype=D)
    assert torch.allclose(vl.masked_whiten(tiny, eps=0.0), torch.tensor([1.0, -1.0, 0.0], dtype=D))
    for x in (torch.tensor([1e308, -1e308, 5e307], dtype=D), torch.tensor([3.0e38, 3.0e38, 1.0e38])):
        y = vl.masked_whiten(x)
        assert bool(torch.isfinite(y).all()) and abs(float(y.double().sum())) < 1e-5
    # the textbook case is unchanged
    x = torch.randn(4, 9, generator=torch.Generator().manual_seed(2), dtype=D)
    m = x > -0.5
    expect = torch.where(m, (x - x[m].mean()) / torch.sqrt(x[m].var() + 1e-8), torch.zeros((), dtype=D))
    assert torch.allclose(vl.masked_whiten(x, m), expect, rtol=1e-12, atol=1e-12)


def test_the_mean_of_finite_entries_is_finite():
    assert float(vl.masked_mean(torch.tensor([3e38, 3e38]))) == pytest.approx(3e38, rel=1e-6)
    out = vl.masked_mean(torch.tensor([[3e38, 3e38], [1.0, 2.0]]), dim=-1)
    assert torch.allclose(out, torch.tensor([3e38, 1.5]))


def test_finite_inputs_whose_results_overflow_are_errors_not_infs(cpu_path):
    big = torch.full((1, 300), 3e38)
    zero = torch.zeros(1, 300)
    for call in (
        lambda: vl.gae(big, zero, gamma=1.0, lam=1.0),
        lambda: vl.discounted_returns(big),
        lambda: vl.td_targets(big, big),
        lambda: vl.td_errors(big, -big),
        lambda: vl.nstep_returns(big, zero, 4),
        lambda: vl.gae(big, zero, gamma=torch.tensor(1.0), lam=1.0),  # the general path
    ):
        with pytest.raises(ValueError, match="^rewards and values are finite but too large"):
            call()
    with pytest.raises(ValueError, match="^values and returns are finite but differ too much"):
        vl.value_loss(big, -big)
    with pytest.raises(ValueError, match="^logprobs - ref_logprobs is too large"):
        vl.kl_penalty(torch.tensor([-100.0]), torch.tensor([0.0]), "k3")  # exp(100) overflows float32
    assert math.isfinite(float(vl.kl_penalty(torch.tensor([-100.0], dtype=D), torch.tensor([0.0], dtype=D), "k3")))


def test_length_adaptive_lam_refuses_nan_and_odd_dtypes():
    for bad in (math.nan, math.inf):
        with pytest.raises(ValueError, match="^lengths must be finite"):
            vl.length_adaptive_lam(torch.tensor([bad, 3.0]))  # a NaN length was taken as lambda = 0
    with pytest.raises(TypeError, match="^lengths must hold real numbers"):
        vl.length_adaptive_lam(torch.tensor([True, False]))
    assert torch.equal(vl.length_adaptive_lam(torch.tensor([40, 40])), vl.length_adaptive_lam(torch.tensor([40.0, 40.0])))


@pytest.mark.parametrize("dtype", [torch.int64, torch.int8, torch.float32, torch.float64, torch.uint8])
def test_last_token_onehot_takes_numeric_masks(dtype):
    m = torch.tensor([[1, 1, 0, 0], [0, 1, 0, 1], [0, 0, 0, 0]], dtype=dtype)  # once a scatter() dtype error
    expect = torch.tensor([[0, 1, 0, 0], [0, 0, 0, 1], [0, 0, 0, 0]], dtype=torch.bool)
    assert torch.equal(vl.last_token_onehot(m), expect)
    assert torch.equal(vl.last_token_onehot(m[0]), expect[0])
    with pytest.raises(ValueError, match="^mask must hold only 0 and 1"):
        vl.last_token_onehot(2 * m)
    with pytest.raises(TypeError, match="^mask must be a torch.Tensor"):
        vl.last_token_onehot([1, 0])


@pytest.mark.parametrize("where", [(0, 1), (1, 4), (0, 39)])
def test_a_nan_at_a_masked_position_says_where_and_why(where, cpu_path):
    mask = torch.ones(2, 40, dtype=torch.bool)
    mask[0, :2] = False
    mask[1, 4] = False
    mask[0, 39] = False
    v = torch.zeros(2, 40)
    v[where] = math.nan
    msg = rf"^values must be finite: it contains NaN or inf \(values\[{where[0]}, {where[1]}\] = nan\); that position is masked"
    with pytest.raises(ValueError, match=msg):
        vl.gae(torch.zeros(2, 40), v, mask=mask)
    with pytest.raises(ValueError, match=msg):
        vl.td_errors(torch.zeros(2, 40), v, mask=mask)
    v[where] = 0.0
    v[1, 0] = math.inf  # a valid position: no word about masks
    with pytest.raises(ValueError, match=r"\(values\[1, 0\] = inf\)$"):
        vl.gae(torch.zeros(2, 40), v, mask=mask)
