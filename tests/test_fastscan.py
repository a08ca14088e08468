"""The loop-free backward scan (valuelab._engine.fastscan) against the per-token loop.

Every comparison uses an error bound scaled by the condition of the problem:
the same recursion run on |x| in float64, S_t = sum_j |coef_tj x_j|, so
|fast - exact| <= k * eps(dtype) * S_t is "equal to float rounding".
"""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch.utils._python_dispatch import TorchDispatchMode

import valuelab
from valuelab.lab import reference as ref
from valuelab._engine import fastscan as fs
from valuelab._engine import native as _native
from valuelab._engine.fastscan import (
    _naive_rescaled_scan,
    fast_backward_scan,
    fast_nstep_returns,
    time_invariant_decay,
    valid_first_order,
)
from valuelab._engine.scan import backward_scan, pack, prepare

from conftest import CPU_PATHS, cpu_path_context

DTYPES = [torch.float32, torch.float64]
CONSTANTS = [0.0, 1e-8, 0.5, 0.95, 0.999, 1.0]
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
# k in |err| <= k * eps * S: the blocked forms sum at most a few dozen terms per level
K_ROUND = 64


def _loop64(x: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
    """The loop (valuelab._engine.scan.backward_scan) in float64 on the CPU: the oracle."""
    return backward_scan(x.detach().cpu().double(), d.detach().cpu().double().expand(x.shape))


def _full(d, x: torch.Tensor) -> torch.Tensor:
    """Any accepted form of d as the (B, T) tensor the loop takes (rounded to x's dtype, like the loop)."""
    if isinstance(d, float):
        d = torch.tensor(d, dtype=x.dtype)
    return d.to(x.dtype).cpu().expand(x.shape)


def assert_scan_close(y: torch.Tensor, x: torch.Tensor, dfull: torch.Tensor, k: float = K_ROUND) -> None:
    ref = _loop64(x, dfull)
    cond = _loop64(x.abs(), dfull)
    eps = torch.finfo(x.dtype).eps
    tiny = torch.finfo(x.dtype).tiny
    err = (y.detach().cpu().double() - ref).abs()
    bound = k * eps * cond + 4 * tiny
    assert y.shape == x.shape and y.dtype == x.dtype and y.device == x.device
    assert bool(torch.isfinite(y).all())
    assert bool((err <= bound).all()), f"max err {err.max().item():.3e} > bound {bound.max().item():.3e}"


def _x(B, T, dtype, device="cpu", seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(B, T, generator=g, dtype=torch.float64).to(dtype).to(device)


# ---------------------------------------------------------------------------
# constant and per-row decay: the blocked Toeplitz form
# ---------------------------------------------------------------------------

SHAPES = [(0, 5), (3, 0), (0, 0), (1, 1), (2, 2), (2, 15), (3, 16), (2, 17), (2, 128), (2, 129), (2, 255), (4, 257), (2, 1000), (2, 4100)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("c", CONSTANTS)
@pytest.mark.parametrize("B,T", SHAPES)
def test_constant_decay_matches_loop(B, T, c, dtype, device):
    x = _x(B, T, dtype, device, seed=B * 10007 + T)
    dfull = _full(c, x)
    for d in (c, torch.tensor(c, dtype=dtype, device=device), torch.full((B, 1), c, dtype=dtype, device=device)):
        y = fast_backward_scan(x, d)
        assert_scan_close(y, x, dfull)
    # and the general (per-step) form on the same problem
    assert_scan_close(fast_backward_scan(x, dfull.to(device)), x, dfull)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("T", [1, 7, 16, 300, 5000])
def test_per_row_decay_matches_loop(T, dtype):
    c = torch.tensor([[0.0], [1e-8], [0.5], [0.999], [1.0]], dtype=dtype)
    x = _x(5, T, dtype, seed=T)
    y = fast_backward_scan(x, c)
    assert_scan_close(y, x, c.expand(5, T))
    # a float64 per-row decay on float32 data is cast first, like everything else
    assert_scan_close(fast_backward_scan(x, c.double()), x, c.to(dtype).expand(5, T))


def test_one_dimensional_input():
    x = _x(1, 600, torch.float64)[0]
    for d in (0.9, torch.tensor(0.9, dtype=torch.float64), torch.full((600,), 0.9, dtype=torch.float64)):
        y = fast_backward_scan(x, d)
        assert y.shape == (600,)
        assert_scan_close(y.unsqueeze(0), x.unsqueeze(0), torch.full((1, 600), 0.9, dtype=torch.float64))


def test_empty_shapes_keep_dtype_and_shape():
    for shape in [(0, 4), (4, 0), (0, 0)]:
        for d in (0.5, torch.rand(shape)):
            y = fast_backward_scan(torch.zeros(shape), d)
            assert y.shape == shape and y.dtype == torch.float32


# ---------------------------------------------------------------------------
# per-step decay: blocked doubling
# ---------------------------------------------------------------------------


def _per_step_d(B, T, dtype, seed, kind):
    g = torch.Generator().manual_seed(seed)
    u = torch.rand(B, T, generator=g, dtype=torch.float64)
    if kind == "uniform":
        d = u
    elif kind == "near_one":  # per-step gamma * lam as in RLHF: products underflow over long rows
        d = 0.9 + 0.1 * u
    elif kind == "zeros_ones":  # episode boundaries (0) and undiscounted steps (1)
        d = (u > 0.3).double()
    else:  # a mix of exact 0, exact 1, tiny and ordinary values
        d = torch.where(u < 0.1, 0.0, torch.where(u < 0.4, 1.0, torch.where(u < 0.5, 1e-8, u)))
    return d.to(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", ["uniform", "near_one", "zeros_ones", "mixed"])
@pytest.mark.parametrize("B,T", [(1, 1), (3, 2), (2, 16), (2, 17), (3, 255), (2, 257), (2, 3000)])
def test_per_step_decay_matches_loop(B, T, kind, dtype):
    x = _x(B, T, dtype, seed=T)
    d = _per_step_d(B, T, dtype, seed=T + 1, kind=kind)
    assert_scan_close(fast_backward_scan(x, d), x, d)


def test_per_step_decay_broadcast_over_rows():
    x = _x(4, 100, torch.float32)
    d = torch.rand(100)  # one decay per step, shared by the rows
    assert_scan_close(fast_backward_scan(x, d), x, d.expand(4, 100))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    B=st.integers(0, 4),
    T=st.integers(0, 600),
    dtype=st.sampled_from(DTYPES),
    form=st.sampled_from(["float", "scalar_tensor", "per_row", "per_step"]),
    c=st.one_of(st.sampled_from([0.0, 1.0, 1e-8, 0.5, 0.999]), st.floats(0.0, 1.0)),
    seed=st.integers(0, 2**31 - 1),
)
def test_hypothesis_all_forms_match_loop(B, T, dtype, form, c, seed):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(B, T, generator=g, dtype=torch.float64) * 10 ** torch.randint(-3, 4, (B, 1), generator=g)).to(dtype)
    if form == "float":
        d, dfull = c, _full(c, x)
    elif form == "scalar_tensor":
        d = torch.tensor(c, dtype=dtype)
        dfull = _full(d, x)
    elif form == "per_row":
        d = (torch.rand(B, 1, generator=g, dtype=torch.float64) * c).to(dtype)
        dfull = d.expand(B, T)
    else:
        d = (torch.rand(B, T, generator=g, dtype=torch.float64) ** (1 - c)).to(dtype)
        d = torch.where(torch.rand(B, T, generator=g) < 0.1, torch.ones((), dtype=dtype), d)
        dfull = d
    assert_scan_close(fast_backward_scan(x, d), x, dfull)


@pytest.mark.parametrize("T", [1, 5, 40, 300])
def test_gradients_match_the_loop(T):
    # not needed by the estimators (targets carry no gradient), but the scan is a linear map
    g = torch.Generator().manual_seed(T)
    x = torch.randn(3, T, generator=g, dtype=torch.float64, requires_grad=True)
    d = torch.rand(3, T, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(3, T, generator=g, dtype=torch.float64)
    for dd in (0.9, torch.rand(3, 1, generator=g, dtype=torch.float64), d):
        dfull = (dd if torch.is_tensor(dd) else torch.tensor(dd, dtype=torch.float64)).expand(3, T)
        got = torch.autograd.grad((fast_backward_scan(x, dd) * w).sum(), x)[0]
        exp = torch.autograd.grad((backward_scan(x, dfull) * w).sum(), x)[0]
        assert torch.allclose(got, exp, rtol=1e-12, atol=1e-12)
    got = torch.autograd.grad((fast_backward_scan(x, d) * w).sum(), d)[0]
    exp = torch.autograd.grad((backward_scan(x, d) * w).sum(), d)[0]
    assert torch.allclose(got, exp, rtol=1e-12, atol=1e-12)


# ---------------------------------------------------------------------------
# long rows: T = 100 000 in float32
# ---------------------------------------------------------------------------


def _python_scan(x: np.ndarray, d) -> np.ndarray:
    """The recursion with Python floats (IEEE doubles): an independent float64 loop, fast enough for 1e5."""
    xs = x.astype(np.float64).tolist()
    ds = [float(d)] * len(xs) if np.isscalar(d) else np.asarray(d, dtype=np.float64).tolist()
    out = [0.0] * len(xs)
    acc = 0.0
    for t in range(len(xs) - 1, -1, -1):
        acc = xs[t] + ds[t] * acc
        out[t] = acc
    return np.array(out)


@pytest.mark.parametrize("c", [0.0, 1e-8, 0.5, 0.95, 0.999, 1.0])
def test_long_rows_float32_constant(c):
    T = 100_000
    x = _x(1, T, torch.float32, seed=7)
    c32 = float(torch.tensor(c, dtype=torch.float32))  # the decay as float32 holds it
    ref = _python_scan(x[0].numpy(), c32)
    cond = _python_scan(np.abs(x[0].numpy()), c32)
    for d in (c, torch.tensor(c, dtype=torch.float32)):
        y = fast_backward_scan(x, d)[0].double().numpy()
        err = np.abs(y - ref)
        assert np.isfinite(y).all()
        assert (err <= K_ROUND * 2**-23 * cond + 1e-37).all(), (c, err.max(), (err / cond).max())


@pytest.mark.parametrize("kind", ["near_one", "mixed"])
def test_long_rows_float32_per_step(kind):
    T = 100_000
    x = _x(1, T, torch.float32, seed=8)
    d = _per_step_d(1, T, torch.float32, seed=9, kind=kind)
    ref = _python_scan(x[0].numpy(), d[0].numpy())
    cond = _python_scan(np.abs(x[0].numpy()), d[0].numpy())
    y = fast_backward_scan(x, d)[0].double().numpy()
    assert np.isfinite(y).all()
    assert (np.abs(y - ref) <= K_ROUND * 2**-23 * cond + 1e-37).all()


def test_long_row_float32_is_more_accurate_than_the_float32_loop():
    # with c = 1 the loop accumulates T roundings; the blocked form sums in a tree
    T = 100_000
    x = _x(1, T, torch.float32, seed=3).abs()
    ref = _python_scan(x[0].numpy(), 1.0)
    fast_err = np.abs(fast_backward_scan(x, 1.0)[0].double().numpy() - ref).max()
    # the float32 loop, emulated with numpy float32 scalars (the torch loop over 1e5 tokens takes seconds)
    acc = np.float32(0.0)
    xs = x[0].numpy()
    loop = np.empty(T, dtype=np.float32)
    for t in range(T - 1, -1, -1):
        acc = np.float32(xs[t] + acc)
        loop[t] = acc
    loop_err = np.abs(loop.astype(np.float64) - ref).max()
    assert fast_err <= loop_err


# ---------------------------------------------------------------------------
# why not the closed form with a cumulative sum
# ---------------------------------------------------------------------------


def test_naive_rescaled_scan_is_right_on_short_rows():
    x = _x(2, 50, torch.float64)
    assert torch.allclose(_naive_rescaled_scan(x, 0.95), backward_scan(x, torch.full_like(x, 0.95)), rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize(
    "c,T,dtype",
    [(0.95, 4096, torch.float32), (0.5, 300, torch.float32), (0.999, 100_000, torch.float32), (0.95, 20_000, torch.float64)],
)
def test_naive_rescaled_scan_fails_where_ours_does_not(c, T, dtype):
    # c^-t overflows to inf past T ~ log(max float) / log(1/c), and c^t underflows: inf * 0 = nan
    x = _x(1, T, dtype, seed=1)
    naive = _naive_rescaled_scan(x, c)
    ours = fast_backward_scan(x, c)
    ref = torch.from_numpy(_python_scan(x[0].double().numpy(), float(torch.tensor(c, dtype=dtype))))
    cond = torch.from_numpy(_python_scan(x[0].double().abs().numpy(), float(torch.tensor(c, dtype=dtype))))
    assert not bool(torch.isfinite(naive).all())
    assert bool(torch.isfinite(ours).all())
    assert bool(((ours[0].double() - ref).abs() <= K_ROUND * torch.finfo(dtype).eps * cond + 1e-37).all())


def test_naive_rescaled_scan_is_fine_while_in_range():
    # the failure is one of range only: float32, c = 0.95, T = 1500 < 1730
    x = _x(1, 1500, torch.float32, seed=2)
    ref = torch.from_numpy(_python_scan(x[0].double().numpy(), float(torch.tensor(0.95))))
    naive = _naive_rescaled_scan(x, 0.95)[0].double()
    assert bool(torch.isfinite(naive).all())
    assert float(((naive - ref).abs() / (1 + ref.abs())).max()) < 1e-5


# ---------------------------------------------------------------------------
# no Python loop over tokens: the number of tensor ops does not grow with T
# ---------------------------------------------------------------------------


class _CountOps(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.n = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.n += 1
        return func(*args, **(kwargs or {}))


def _ops(fn) -> int:
    with _CountOps() as c:
        fn()
    return c.n


def test_op_count_grows_only_logarithmically():
    for make_d in (lambda x: 0.95, lambda x: torch.rand_like(x)):
        small = _x(2, 1000, torch.float32)
        big = _x(2, 100_000, torch.float32)
        ds, db = make_d(small), make_d(big)
        n_small = _ops(lambda: fast_backward_scan(small, ds))
        n_big = _ops(lambda: fast_backward_scan(big, db))
        assert n_big <= 3 * n_small, (n_small, n_big)  # a per-token loop would need ~100x more


# ---------------------------------------------------------------------------
# the API: argument forms and errors
# ---------------------------------------------------------------------------


def test_bad_arguments():
    x = torch.zeros(2, 5)
    with pytest.raises(ValueError):
        fast_backward_scan(x, 1.5)
    with pytest.raises(ValueError):
        fast_backward_scan(x, -0.1)
    with pytest.raises(TypeError):
        fast_backward_scan(x, True)
    with pytest.raises(TypeError):
        fast_backward_scan(x, "0.5")
    with pytest.raises(TypeError):
        fast_backward_scan(torch.zeros(2, 5, dtype=torch.int64), 0.5)
    with pytest.raises(ValueError):
        fast_backward_scan(torch.zeros(2, 3, 4), 0.5)
    with pytest.raises(ValueError):
        fast_backward_scan(x, torch.zeros(3, 5))


def test_time_invariant_decay():
    like = torch.zeros(3, 7)
    assert time_invariant_decay(like, 0.9, 0.95) == float(torch.tensor(0.9) * torch.tensor(0.95))
    assert time_invariant_decay(like, 1.0) == 1.0
    t = time_invariant_decay(like, torch.tensor(0.9), 0.5)
    assert torch.is_tensor(t) and t.dim() == 0
    pr = time_invariant_decay(like, torch.full((3, 1), 0.5), 0.9)
    assert pr.shape == (3, 1) and pr.dtype == torch.float32
    assert time_invariant_decay(like, torch.full((3, 7), 0.5), 0.9) is None
    assert time_invariant_decay(like, torch.full((7,), 0.5)) is None


# ---------------------------------------------------------------------------
# pack without argsort
# ---------------------------------------------------------------------------


@settings(max_examples=80, deadline=None)
@given(B=st.integers(0, 5), T=st.integers(0, 70), p=st.floats(0.0, 1.0), seed=st.integers(0, 2**31 - 1))
def test_valid_first_order_is_the_stable_argsort(B, T, p, seed):
    g = torch.Generator().manual_seed(seed)
    mask = torch.rand(B, T, generator=g) < p
    expected = torch.argsort((~mask).to(torch.int8), dim=-1, stable=True)
    assert torch.equal(valid_first_order(mask), expected)
    assert torch.equal(valid_first_order(mask, mask.sum(-1, keepdim=True)), expected)
    packed = pack(mask)
    lengths = mask.sum(-1, keepdim=True)
    prefix = torch.arange(T) < lengths
    assert torch.equal(packed.valid, prefix)
    assert (packed.order is None) == bool((mask == prefix).all())  # nothing moves only when right-padded
    if packed.order is not None:
        assert torch.equal(packed.order, expected)


# ---------------------------------------------------------------------------
# n-step returns by sparse-table doubling
# ---------------------------------------------------------------------------


def _masked_batch(B, T, dtype, seed, holes=True):
    g = torch.Generator().manual_seed(seed)
    r = torch.randn(B, T, generator=g, dtype=torch.float64).to(dtype)
    v = torch.randn(B, T, generator=g, dtype=torch.float64).to(dtype)
    lengths = torch.randint(0, T + 1, (B, 1), generator=g)
    mask = torch.arange(T) < lengths
    if holes:
        mask &= torch.rand(B, T, generator=g) < 0.8
    return r, v, mask


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [1, 2, 3, 5, 8, 13, 40, 64, 65, 200])
@pytest.mark.parametrize("gamma_kind", ["float", "per_row", "per_step"])
def test_fast_nstep_matches_loop(n, gamma_kind, dtype):
    B, T = 4, 64
    r, v, mask = _masked_batch(B, T, dtype, seed=n)
    gamma = {"float": 0.97, "per_row": torch.tensor([[0.0], [0.5], [0.99], [1.0]], dtype=dtype),
             "per_step": torch.rand(B, T, dtype=torch.float64).to(dtype)}[gamma_kind]
    boot = torch.randn(B, dtype=dtype)
    expected = valuelab.nstep_returns(r, v, n, mask=mask, gamma=gamma, bootstrap=boot)
    p = prepare(r, v, mask, gamma, boot, need_values=True)
    got = p.out(fast_nstep_returns(p.rewards, p.values, p.gamma, p.packed.valid, p.bootstrap, n))
    tol = 1e-5 if dtype == torch.float32 else 1e-12
    scale = 1 + r.abs().sum(-1, keepdim=True) + v.abs().amax(-1, keepdim=True) + boot.abs().unsqueeze(-1)
    assert got.shape == expected.shape
    assert bool(((got - expected).abs() <= tol * scale).all())


def test_fast_nstep_empty():
    z = torch.zeros(0, 5)
    assert fast_nstep_returns(z, z, z, z.bool(), torch.zeros(0), 3).shape == (0, 5)


# ---------------------------------------------------------------------------
# the fused estimators (fused_returns behind gae and discounted_returns)
# ---------------------------------------------------------------------------


def _oracle_gae(r, v, mask, gamma, lam, boot):
    """valuelab.lab.reference.gae_recursion (a numpy float64 loop) on each row's valid tokens; 0 elsewhere.

    gamma and lam are rounded to the data's dtype first, as the library does.
    """
    dt = r.dtype
    g = float(torch.tensor(gamma, dtype=dt)) if not torch.is_tensor(gamma) else gamma
    lm = float(torch.tensor(lam, dtype=dt)) if not torch.is_tensor(lam) else lam
    B, T = r.shape
    m = torch.ones(B, T, dtype=torch.bool) if mask is None else mask
    b = torch.zeros(B, dtype=torch.float64) if boot is None else (boot.double() if torch.is_tensor(boot) else torch.full((B,), float(boot), dtype=torch.float64))
    adv = np.zeros((B, T))
    ret = np.zeros((B, T))
    for i in range(B):
        mi = m[i].numpy()
        ri, vi = r[i].double().numpy()[mi], v[i].double().numpy()[mi]
        gi = g if not torch.is_tensor(g) else g.expand(B, T)[i].double().numpy()[mi]
        li = lm if not torch.is_tensor(lm) else lm.expand(B, T)[i].double().numpy()[mi]
        if len(ri):
            a = ref.gae_recursion(ri, vi, gi, li, float(b[i]))
            adv[i, mi] = a
            ret[i, mi] = a + vi
    return adv, ret


def _scale(r, v, boot=None):
    """A per-row magnitude for tolerances: sum |r| + max |v| (+ |bootstrap|)."""
    vmax = v.double().abs().amax(-1, keepdim=True) if v.shape[-1] else torch.zeros(v.shape[0], 1, dtype=torch.float64)
    s = r.double().abs().sum(-1, keepdim=True) + vmax
    if torch.is_tensor(boot):
        s = s + boot.double().abs().unsqueeze(-1)
    elif boot is not None:
        s = s + abs(float(boot))
    return (1 + s).numpy()


def _mask(B, T, kind, g):
    if kind == "none":
        return None
    lengths = torch.randint(0, T + 1, (B, 1), generator=g)
    m = torch.arange(T) < lengths
    if kind == "holes":
        m = torch.rand(B, T, generator=g) < 0.7
    elif kind == "spans":  # a few long holes, as tool outputs in a multi-turn rollout
        for _ in range(3):
            start = torch.randint(0, max(T, 1), (B, 1), generator=g)
            m &= ~((torch.arange(T) >= start) & (torch.arange(T) < start + max(T // 10, 1)))
    elif kind == "empty-rows":
        m[::2] = False
    return m


def _check_gae(r, v, mask, gamma, lam, boot, tol):
    out = valuelab.gae(r, v, mask=mask, gamma=gamma, lam=lam, bootstrap=boot)
    ea, er = _oracle_gae(r, v, mask, gamma, lam, boot)
    sc = _scale(r, v, boot)
    for got, exp in ((out.advantages, ea), (out.returns, er)):
        assert got.shape == r.shape and got.dtype == r.dtype and got.is_contiguous()
        err = np.abs(got.double().numpy() - exp)
        assert (err <= tol * sc).all(), f"max err {err.max():.3e}"
        if mask is not None:
            assert bool((got[~mask] == 0).all())
    return out


GL = [(1.0, 0.95), (0.99, 1.0), (1.0, 0.0), (0.0, 0.5), (0.97, 0.3), (1.0, 1e-8), (1e-8, 1.0), (1.0, 1.0), (0.5, 0.5)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", ["none", "right", "holes", "spans", "empty-rows"])
@pytest.mark.parametrize("gamma,lam", GL)
@pytest.mark.parametrize("T", [0, 1, 2, 17, 128, 129, 300, 2100])
def test_fused_gae_matches_reference(T, gamma, lam, kind, dtype, cpu_path):
    g = torch.Generator().manual_seed(T * 31 + int(lam * 100))
    B = 3
    r = torch.randn(B, T, generator=g, dtype=torch.float64).to(dtype)
    v = torch.randn(B, T, generator=g, dtype=torch.float64).to(dtype)
    mask = _mask(B, T, kind, g)
    boot = torch.randn(B, generator=g, dtype=torch.float64).to(dtype) if T % 2 else (0.7 if T == 2100 else None)
    tol = 2e-5 if dtype == torch.float32 else 1e-12
    _check_gae(r, v, mask, gamma, lam, boot, tol)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    B=st.integers(1, 4),
    T=st.integers(0, 700),
    gamma=st.one_of(st.sampled_from([0.0, 1.0, 1e-8]), st.floats(0.0, 1.0)),
    lam=st.one_of(st.sampled_from([0.0, 1.0, 1e-8, 0.5, 0.4999]), st.floats(0.0, 1.0)),
    kind=st.sampled_from(["none", "right", "holes", "spans", "empty-rows"]),
    boot=st.sampled_from(["none", "float", "tensor"]),
    dtype=st.sampled_from(DTYPES),
    seed=st.integers(0, 2**31 - 1),
)
def test_hypothesis_fused_gae_matches_reference(B, T, gamma, lam, kind, boot, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    r = (torch.randn(B, T, generator=g, dtype=torch.float64) * 3).to(dtype)
    v = (torch.randn(B, T, generator=g, dtype=torch.float64) * 3).to(dtype)
    mask = _mask(B, T, kind, g)
    b = {"none": None, "float": -1.5, "tensor": torch.randn(B, generator=g, dtype=torch.float64).to(dtype)}[boot]
    for path in CPU_PATHS if _native.available() else CPU_PATHS[1:]:
        with cpu_path_context(path):
            _check_gae(r, v, mask, gamma, lam, b, 5e-5 if dtype == torch.float32 else 1e-11)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", ["right", "holes"])
def test_fused_gae_equals_general_path(kind, dtype, cpu_path):
    # scalar gamma/lam take the fused path; the same values as 0-dim tensors take the general one
    g = torch.Generator().manual_seed(5)
    B, T = 4, 3000
    r = torch.randn(B, T, generator=g, dtype=torch.float64).to(dtype)
    v = torch.randn(B, T, generator=g, dtype=torch.float64).to(dtype)
    mask = _mask(B, T, kind, g)
    boot = torch.randn(B, generator=g, dtype=torch.float64).to(dtype)
    for gamma, lam in [(1.0, 0.95), (0.99, 0.3)]:
        fused = valuelab.gae(r, v, mask=mask, gamma=gamma, lam=lam, bootstrap=boot)
        general = valuelab.gae(r, v, mask=mask, gamma=torch.tensor(gamma, dtype=torch.float64), lam=torch.tensor(lam, dtype=torch.float64), bootstrap=boot)
        tol = 1e-4 if dtype == torch.float32 else 1e-10
        for a, b in zip(fused, general):
            assert torch.allclose(a, b, rtol=tol, atol=tol * float(_scale(r, v, boot).max()))


@pytest.mark.parametrize("lam", [0.95, 0.3, 1.0])
@pytest.mark.parametrize("kind", ["right", "spans"])
def test_fused_gae_long_rows_float32(kind, lam, cpu_path):
    # T = 100 000 in float32 against the float64 loop, with a bound scaled by the condition of the sums
    T = 100_000
    g = torch.Generator().manual_seed(11)
    r = torch.randn(1, T, generator=g, dtype=torch.float64).float()
    v = torch.randn(1, T, generator=g, dtype=torch.float64).float()
    mask = _mask(1, T, kind, g)
    if kind == "right":
        mask = torch.arange(T).unsqueeze(0) < 97_000
    out = valuelab.gae(r, v, mask=mask, gamma=1.0, lam=lam)
    m = mask[0].numpy()
    rc, vc = r[0].double().numpy()[m], v[0].double().numpy()[m]
    c = float(np.float32(1.0) * np.float32(lam))
    vn = np.append(vc[1:], 0.0)
    delta = rc + vn - vc
    exact = _python_scan(delta, c)
    cond = _python_scan(np.abs(rc) + np.abs(vn) + np.abs(vc), c) + np.abs(vc)
    got = out.advantages[0].double().numpy()[m]
    assert np.isfinite(got).all()
    assert (np.abs(got - exact) <= K_ROUND * 2**-23 * cond).all()
    assert bool((out.advantages[0][~mask[0]] == 0).all()) and bool((out.returns[0][~mask[0]] == 0).all())


def test_fused_gae_accepts_views_and_1d(cpu_path):
    g = torch.Generator().manual_seed(2)
    base_r = torch.randn(300, 6, generator=g, dtype=torch.float64)
    base_v = torch.randn(300, 6, generator=g, dtype=torch.float64)
    r, v = base_r.T, base_v.T  # non-contiguous (6, 300)
    mask = (torch.rand(300, 6, generator=g) < 0.8).T
    _check_gae(r, v, mask, 0.99, 0.9, None, 1e-12)
    _check_gae(r[:, ::2], v[:, ::2], mask[:, ::2], 1.0, 0.95, 0.5, 1e-12)
    one = valuelab.gae(r[0].contiguous(), v[0].contiguous(), gamma=0.9, lam=0.8, bootstrap=0.3)
    full = valuelab.gae(r[:1].contiguous(), v[:1].contiguous(), gamma=0.9, lam=0.8, bootstrap=torch.tensor([0.3], dtype=torch.float64))
    assert one.advantages.shape == (300,) and torch.allclose(one.advantages, full.advantages[0])
    # a 0/1 float mask takes the same path as a bool one
    fm = mask.double()
    a = valuelab.gae(r, v, mask=fm, gamma=0.99, lam=0.9)
    b = valuelab.gae(r, v, mask=mask, gamma=0.99, lam=0.9)
    assert torch.equal(a.advantages, b.advantages)


def test_fused_gae_garbage_in_masked_slots_never_leaks(cpu_path):
    g = torch.Generator().manual_seed(3)
    B, T = 4, 500
    r = torch.randn(B, T, generator=g, dtype=torch.float64)
    v = torch.randn(B, T, generator=g, dtype=torch.float64)
    for kind in ("right", "holes", "spans"):
        mask = _mask(B, T, kind, g)
        junk_r = torch.where(mask, r, torch.full((), 1e30, dtype=torch.float64))
        junk_v = torch.where(mask, v, torch.full((), -3e29, dtype=torch.float64))
        for lam in (0.95, 0.3):
            clean = valuelab.gae(r, v, mask=mask, gamma=1.0, lam=lam, bootstrap=0.25)
            junk = valuelab.gae(junk_r, junk_v, mask=mask, gamma=1.0, lam=lam, bootstrap=0.25)
            assert torch.equal(clean.advantages, junk.advantages) and torch.equal(clean.returns, junk.returns)


def test_fused_gae_outputs_are_fresh_and_scratch_is_per_thread(cpu_path):
    import threading

    g = torch.Generator().manual_seed(4)
    r = torch.randn(8, 3000, generator=g)
    v = torch.randn(8, 3000, generator=g)
    mask = _mask(8, 3000, "spans", g)
    first = valuelab.gae(r, v, mask=mask, gamma=1.0, lam=0.95)
    keep = first.advantages.clone(), first.returns.clone()
    valuelab.gae(r * 2, v * 3, mask=mask, gamma=0.5, lam=0.5)  # reuses the scratch buffers
    assert torch.equal(first.advantages, keep[0]) and torch.equal(first.returns, keep[1])
    results = {}

    def work(i):
        for _ in range(5):
            results[i] = valuelab.gae(r * (i + 1), v, mask=mask, gamma=1.0, lam=0.95).advantages

    threads = [threading.Thread(target=work, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i in range(3):
        exp = valuelab.gae(r * (i + 1), v, mask=mask, gamma=1.0, lam=0.95).advantages
        assert torch.equal(results[i], exp)
    fs.clear_scratch()
    assert torch.equal(valuelab.gae(r, v, mask=mask, gamma=1.0, lam=0.95).advantages, keep[0])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", ["none", "right", "holes", "empty-rows"])
def test_fused_discounted_returns(kind, dtype, cpu_path):
    g = torch.Generator().manual_seed(6)
    B, T = 3, 2500
    r = torch.randn(B, T, generator=g, dtype=torch.float64).to(dtype)
    mask = _mask(B, T, kind, g)
    for gamma, boot in [(1.0, None), (0.97, 0.5), (0.0, torch.ones(B, dtype=dtype)), (1e-8, None)]:
        got = valuelab.discounted_returns(r, mask=mask, gamma=gamma, bootstrap=boot)
        general = valuelab.discounted_returns(r, mask=mask, gamma=torch.tensor(gamma, dtype=torch.float64), bootstrap=boot)
        m = torch.ones(B, T, dtype=torch.bool) if mask is None else mask
        b = [0.0] * B if boot is None else ([float(boot)] * B if not torch.is_tensor(boot) else boot.tolist())
        gq = float(torch.tensor(gamma, dtype=dtype))
        for i in range(B):
            ri = r[i].double().numpy()[m[i].numpy()]
            exp = _python_scan(ri, gq)
            if len(ri):
                exp = exp + gq ** np.arange(len(ri), 0, -1) * b[i]
            tol = 1e-4 if dtype == torch.float32 else 1e-10
            sc = 1 + np.abs(ri).sum() + abs(b[i])
            assert np.abs(got[i].double().numpy()[m[i].numpy()] - exp).max(initial=0) <= tol * sc
        assert torch.allclose(got, general, rtol=1e-4, atol=1e-3 if dtype == torch.float32 else 1e-9)
        if mask is not None:
            assert bool((got[~mask] == 0).all())


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("where", [0, 5, 17, 110, 199, 250, 299])
def test_a_bad_entry_anywhere_is_found(where, dtype, cpu_path):
    # in a valid run, on its first or last tokens (done one by one by the kernel), in a hole, in the padding
    R, V = torch.zeros(2, 300, dtype=dtype), torch.zeros(2, 300, dtype=dtype)
    mask = torch.arange(300) < torch.tensor([[200], [300]])
    mask[:, 100:121] = False
    for bad in (math.nan, math.inf):
        r = R.clone()
        r[0, where] = bad
        with pytest.raises(ValueError, match="rewards must be finite"):
            valuelab.gae(r, V, mask=mask)
        with pytest.raises(ValueError, match="values must be finite"):
            valuelab.gae(R, r, mask=mask)
        with pytest.raises(ValueError, match="rewards must be finite"):
            valuelab.discounted_returns(r, mask=mask, gamma=0.9)


def test_fused_path_errors_match_the_general_path(cpu_path):
    R, V = torch.zeros(2, 300), torch.zeros(2, 300)
    mask = torch.arange(300) < torch.tensor([[200], [300]])
    for bad in (math.nan, math.inf, -math.inf):
        r = R.clone()
        r[0, 250] = bad  # a masked slot: checked all the same
        with pytest.raises(ValueError, match="rewards must be finite"):
            valuelab.gae(r, V, mask=mask)
        with pytest.raises(ValueError, match="values must be finite"):
            valuelab.gae(R, r, mask=mask, lam=1.0)
        with pytest.raises(ValueError, match="rewards must be finite"):
            valuelab.discounted_returns(r, mask=mask)
        # the first error in the general path's order wins: rewards before lam, values before gamma
        with pytest.raises(ValueError, match="rewards must be finite"):
            valuelab.gae(r, V, mask=mask, lam=2.0)
        with pytest.raises(ValueError, match="values must be finite"):
            valuelab.gae(R, r, mask=mask, gamma=-1.0)
    with pytest.raises(ValueError, match="values"):
        valuelab.gae(R, torch.zeros(2, 5), lam=7.0)
    # finite inputs whose returns overflow are an error too, never a silent inf (as on the general path)
    big = torch.full((1, 300), 3e38)
    with pytest.raises(ValueError, match="rewards .* too large .* returns overflow"):
        valuelab.gae(big, torch.zeros(1, 300), gamma=1.0, lam=1.0)
    with pytest.raises(ValueError, match="rewards .* too large .* returns overflow"):
        valuelab.discounted_returns(big)
    with pytest.raises(ValueError, match="rewards .* too large .* returns overflow"):
        valuelab.gae(big, torch.zeros(1, 300), gamma=torch.tensor(1.0), lam=1.0)  # the general path
    # entries whose sum overflows but whose returns do not (they cancel): no error, the right answer
    alt = torch.tensor([[3e38, -3e38] * 150])
    out = valuelab.gae(alt, torch.zeros(1, 300), gamma=1.0, lam=0.0)
    assert torch.equal(out.advantages, alt) and torch.equal(out.returns, alt)


def test_unit_scalar_rounds_and_checks_like_check_unit_interval():
    from valuelab._engine.checks import check_unit_interval, unit_scalar

    like32, like64 = torch.zeros(1, 3), torch.zeros(1, 3, dtype=torch.float64)
    for x in [0.0, 1.0, 0.95, 1e-8, 1 + 1e-9, -1e-50, 1 / 3]:
        for like in (like32, like64):
            try:
                exp = float(check_unit_interval(x, "gamma", like)[0, 0])
            except ValueError as e:
                with pytest.raises(ValueError, match=re.escape(str(e))):
                    unit_scalar(x, "gamma", like.dtype)
                continue
            assert unit_scalar(x, "gamma", like.dtype) == exp
    for bad in (1.01, -0.1, math.nan, math.inf):
        with pytest.raises(ValueError, match="gamma"):
            unit_scalar(bad, "gamma", torch.float32)
    with pytest.raises(TypeError, match="gamma"):
        unit_scalar(True, "gamma", torch.float32)
    assert unit_scalar(torch.tensor(0.5), "gamma", torch.float32) is None


def test_right_padded_rows_and_compaction_index():
    from valuelab._engine.fastscan import compaction_index, float_mask, right_padded_rows

    g = torch.Generator().manual_seed(8)
    for T in (1, 2, 5, 64, 5792, 5793, 9000):
        lengths = torch.randint(0, T + 1, (6, 1), generator=g)
        rp = torch.arange(T) < lengths
        for dtype in DTYPES:
            assert right_padded_rows(float_mask(rp, dtype))
            bad = rp.clone()
            i = int(torch.randint(0, T, (1,), generator=g))
            bad[2, i] = ~bad[2, i]  # one token flipped: right-padded only if it was at the boundary
            expected = bool((torch.arange(T) < bad.sum(-1, keepdim=True)).eq(bad).all())
            assert right_padded_rows(float_mask(bad, dtype)) == expected
            late = torch.zeros(6, T, dtype=torch.bool)
            late[:, -1] = True  # one valid token at the end
            assert right_padded_rows(float_mask(late, dtype)) == (T == 1)
    mask = torch.rand(5, 40, generator=g) < 0.6
    mask[0] = True
    mask[1] = False
    dest, L = compaction_index(mask)
    cs = mask.long().cumsum(-1)
    assert torch.equal(L[:, 0], mask.sum(-1))
    assert torch.equal(dest[mask], (cs - 1)[mask]) and bool((dest[~mask] == 39).all())
    x = torch.randn(5, 40, dtype=torch.float64)
    comp = torch.zeros_like(x).scatter_(-1, dest, x * mask)
    comp[:, -1:] *= (L == 40)
    for i in range(5):
        assert torch.equal(comp[i, : int(L[i])], x[i][mask[i]]) and bool((comp[i, int(L[i]):] == 0).all())
    assert torch.equal(comp.gather(-1, dest) * mask, x * mask)


def test_gae_op_count_grows_only_logarithmically(cpu_path):
    # the whole estimator, not only the scan: no Python loop over tokens anywhere
    for kind in ("right", "spans"):
        g = torch.Generator().manual_seed(9)
        small = [torch.randn(2, 1000, generator=g), torch.randn(2, 1000, generator=g), _mask(2, 1000, kind, g)]
        big = [torch.randn(2, 100_000, generator=g), torch.randn(2, 100_000, generator=g), _mask(2, 100_000, kind, g)]
        n_small = _ops(lambda: valuelab.gae(*small[:2], mask=small[2], gamma=1.0, lam=0.95))
        n_big = _ops(lambda: valuelab.gae(*big[:2], mask=big[2], gamma=1.0, lam=0.95))
        assert n_big <= 2 * n_small, (n_small, n_big)

