"""The loop-free backward scan (valuelab._fastscan) against the per-token loop.

Every comparison uses an error bound scaled by the condition of the problem:
the same recursion run on |x| in float64, S_t = sum_j |coef_tj x_j|, so
|fast - exact| <= k * eps(dtype) * S_t is "equal to float rounding".
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch.utils._python_dispatch import TorchDispatchMode

import valuelab
from valuelab import _fastscan as fs
from valuelab._fastscan import (
    _naive_rescaled_scan,
    fast_backward_scan,
    fast_nstep_returns,
    pack_fast,
    time_invariant_decay,
    valid_first_order,
)
from valuelab._scan import backward_scan, pack, prepare

DTYPES = [torch.float32, torch.float64]
CONSTANTS = [0.0, 1e-8, 0.5, 0.95, 0.999, 1.0]
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
# k in |err| <= k * eps * S: the blocked forms sum at most a few dozen terms per level
K_ROUND = 64


def _loop64(x: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
    """The loop (valuelab._scan.backward_scan) in float64 on the CPU: the oracle."""
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
    a, b = pack(mask), pack_fast(mask)
    assert torch.equal(a.valid, b.valid)
    assert (a.order is None) == (b.order is None)
    if a.order is not None:
        assert torch.equal(a.order, b.order)


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
# the wiring: the estimators through the fast path give the loop's answers
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("holes", [False, True])
@pytest.mark.parametrize(
    "gamma,lam",
    [(1.0, 0.95), (0.99, 1.0), (1.0, 0.0), ("per_row", 0.9), (1.0, "per_row"), ("per_step", 0.95), (0.99, "per_step")],
)
def test_wired_gae_matches_library_gae(gamma, lam, holes, dtype):
    from valuelab.bench import _gae_wired

    B, T = 5, 300
    r, v, mask = _masked_batch(B, T, dtype, seed=11, holes=holes)

    def arg(a):
        if a == "per_row":
            return torch.tensor([[0.0], [0.3], [0.9], [0.999], [1.0]], dtype=dtype)
        if a == "per_step":
            return torch.rand(B, T, dtype=torch.float64).to(dtype)
        return a

    g, l = arg(gamma), arg(lam)
    boot = torch.randn(B, dtype=dtype)
    exp = valuelab.gae(r, v, mask=mask, gamma=g, lam=l, bootstrap=boot)
    got = _gae_wired(r, v, mask=mask, gamma=g, lam=l, bootstrap=boot)
    tol = 1e-4 if dtype == torch.float32 else 1e-11
    for a, b in zip(got, exp):
        assert a.shape == b.shape and a.dtype == b.dtype
        assert torch.allclose(a, b, rtol=tol, atol=tol * (1 + r.abs().sum(-1, keepdim=True) + v.abs().sum(-1, keepdim=True)).max().item())
        assert bool((a[~mask] == 0).all())


def test_wired_discounted_returns_matches_library():
    # the one-line change proposed for returns.discounted_returns
    from valuelab._scan import shift_next

    r, _, mask = _masked_batch(3, 500, torch.float64, seed=5)
    for gamma in (0.97, torch.tensor([[0.9], [1.0], [0.0]], dtype=torch.float64)):
        p = prepare(r, None, mask, gamma, 0.5, need_values=False)
        valid = p.packed.valid
        zero = torch.zeros((), dtype=r.dtype)
        tail = shift_next(torch.zeros_like(p.rewards), valid, p.bootstrap)
        x = torch.where(valid, p.rewards + p.gamma * tail, zero)
        d = torch.where(valid, p.gamma, zero)
        c = time_invariant_decay(x, gamma)
        assert c is not None
        got = p.out(fast_backward_scan(x, d if c is None else c))
        exp = valuelab.discounted_returns(r, mask=mask, gamma=gamma, bootstrap=0.5)
        assert torch.allclose(got, exp, rtol=1e-12, atol=1e-10)


# ---------------------------------------------------------------------------
# the benchmark runs (tiny grid)
# ---------------------------------------------------------------------------


def test_bench_smoke(tmp_path, capsys):
    from valuelab import bench

    old = bench.QUICK_GRID
    bench.QUICK_GRID = [(2, 40)]
    try:
        rows = bench.main(["--quick", "--device", "cpu", "--dtype", "float32", "--out", str(tmp_path / "b.csv")])
    finally:
        bench.QUICK_GRID = old
    assert len(rows) == 2 and {r["mask"] for r in rows} == {"right-padded", "holes"}
    assert (tmp_path / "b.csv").read_text().startswith("device,dtype,B,T,mask")
    assert all(math.isfinite(r["loop/fast"]) for r in rows)
