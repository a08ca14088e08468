"""valuelab.integrations.torchrl's GAE drop-ins against TorchRL's own functional GAE, and the hardened from_torchrl.

``generalized_advantage_estimate`` and ``vec_generalized_advantage_estimate``
of :mod:`valuelab.integrations.torchrl` are compared with *both* of TorchRL's
functions of those names (``torchrl.objectives.value.functional``, TorchRL
0.14.1 in CI). The parametrised cases are ported from TorchRL's own test
suite, ``test/objectives/test_values.py`` of pytorch/rl (the stored copy at
commit 0089c1b7f07c5b74fc3f154eec2ba09e93987a19; an older stored copy lacks
only the ``tensor_zero_dim`` case of ``test_gae_param_as_tensor``), class
``TestValues``, with their parametrisations and data (seed 0, ``bernoulli_(0.1)``
``done`` / ``terminated``, ``randn`` values):

* ``test_gae`` -> :func:`test_gae`: gamma, lmbda in {0.99, 0.5, 0.1}, N in
  {(1,), (3,), (7, 3)}, T in {200, 5, 3}, float32 / float64, with and without
  ``done``;
* ``test_gae_param_as_tensor`` -> :func:`test_gae_param_as_tensor`: gamma = 0.95,
  lmbda = 0.9 as scalars, full tensors, 0-d and one-element tensors, N in
  {(1,), (8,), (7, 3)}, T = 200;
* ``test_gae_multidim`` -> :func:`test_gae_multidim`: feature dims [5] and
  [2, 5] with ``time_dim = -1 - len(F)``, N in {(3,), (7, 3)}, T in {100, 3},
  and upstream's check that each feature is its own problem;
* ``test_args_kwargs_timedim`` -> :func:`test_args_kwargs_timedim`:
  ``[2, 3, 20, 4, 1]`` tensors with ``time_dim = -3`` and ``2``, positional
  and keyword arguments, ``time_dim`` keyword-only;
* ``test_successive_traj_gae`` -> :func:`test_successive_traj_gae`: a row of
  two trajectories equals the two halves computed apart.

Tolerances. TorchRL rounds a Python-float ``gamma`` to torch's *default*
dtype (it multiplies it by an integer tensor), so on float64 inputs it is only
float32-accurate unless the default dtype is float64: TorchRL is therefore run
with the default dtype set to the inputs' dtype (:func:`torchrl_default_dtype`),
where its loop computes the recursion exactly in that dtype, and
:func:`test_torchrl_rounds_a_float_gamma_to_the_default_dtype` shows the
default-dtype case separately. Then ``|ours - theirs| <= atol + rtol * |theirs|`` with

* float64: ``rtol = atol = 1e-10`` (times the batch's largest advantage):
  both sides sum the same terms in another order, a few ulps (2e-16) per
  term over at most a few hundred terms;
* float32: ``rtol = atol = 1e-5`` (times the batch's largest advantage), the
  same argument at float32's 6e-8 per term;
* against TorchRL's *vectorised* function, plus the exact bound of what it
  drops: its geometric kernel stops where ``(gamma * lmbda)**k`` falls below
  1e-7 (:func:`vec_truncation_bound`); where a float32 tensor ``gamma`` or
  ``lmbda`` meets float64 data TorchRL forms ``gamma * lmbda`` in float32 and
  the float32 tolerance applies.

Then a hypothesis test over 1000 random layouts (batch and feature dims,
T = 1 included, every ``time_dim``, ``done`` / ``terminated`` densities,
``terminated`` without ``done``, scalar and tensor discounts), the error
paths (each error names its argument), inputs left unmodified, gradients
equal to TorchRL's, and planted slips (ignoring ``terminated``, resetting one
step late, bootstrapping from the next state's value instead of
``next_state_value``) that the comparison catches.
"""

from __future__ import annotations

import contextlib
import math
import os

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import valuelab as vl
from valuelab.integrations import torchrl as ours
from valuelab.integrations.torchrl import from_torchrl, generalized_advantage_estimate, to_torchrl, vec_generalized_advantage_estimate

OURS = [generalized_advantage_estimate, vec_generalized_advantage_estimate]
THR = 1e-7  # TorchRL's _fast_vec_gae drops the terms of its geometric kernel below this
TOL = {torch.float32: 1e-5, torch.float64: 1e-10}


@pytest.fixture(scope="module")
def F():
    """``torchrl.objectives.value.functional`` (CI has torchrl; elsewhere the comparisons skip, unless REQUIRE_PEERS)."""
    if os.environ.get("REQUIRE_PEERS"):
        import torchrl.objectives.value.functional as functional

        return functional
    return pytest.importorskip("torchrl.objectives.value.functional")


@contextlib.contextmanager
def torchrl_default_dtype(dtype):
    """Run TorchRL with torch's default dtype set to the data's: its Python-float gamma then stays in that dtype."""
    prev = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(prev)


def vec_truncation_bound(gamma, lmbda, delta, T: int) -> float:
    """A bound on what TorchRL's vectorised GAE drops: the terms of its kernel below :data:`THR`.

    With a scalar ``c = gamma * lmbda`` TorchRL keeps ``lim = int(log(thr) / log(c))``
    terms, ``1, c, ..., c**(lim-1)``: the rest sums to at most
    ``max|delta| * sum(c**k, lim <= k < T)``. With a tensor ``c`` (more than
    one element) it cuts where every cumulative product is below ``thr``:
    each dropped weight is below ``thr``, at most ``T`` of them.
    """
    dmax = float(delta.abs().max()) if delta.numel() else 0.0
    c = gamma * lmbda
    if isinstance(c, torch.Tensor) and c.numel() > 1:
        return THR * T * dmax
    c = float(c)
    if c <= 0.0 or c >= 1.0:
        return 0.0
    lim = int(math.log(THR) / math.log(c))
    return dmax * sum(c ** k for k in range(lim, T))


def assert_agrees(got, want, dtype, extra_atol=0.0, what=""):
    """``got`` equals ``want`` (advantage and value target) to the tolerance of ``dtype`` (module docstring)."""
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype, (what, g.shape, w.shape, g.dtype, w.dtype)
        scale = max(1.0, float(w.abs().max())) if w.numel() else 1.0
        tol = TOL[dtype] * scale
        torch.testing.assert_close(g, w, rtol=TOL[dtype], atol=tol + extra_atol, msg=lambda m: f"{what}: {m}")


def _delta(gamma, state_value, next_state_value, reward, terminated):
    g = gamma if not isinstance(gamma, torch.Tensor) else gamma.to(reward.dtype)
    return reward + g * (~terminated).to(reward.dtype) * next_state_value - state_value


def compare_with_torchrl(F, gamma, lmbda, sv, nsv, r, done, terminated, time_dim=-2, base_dtype=None,
                         vec_ok=True, what=""):
    """Both of ours against both of TorchRL's on one batch (TorchRL's default dtype set to the data's)."""
    dtype = base_dtype or r.dtype
    kw = dict(time_dim=time_dim)
    with torchrl_default_dtype(r.dtype):
        want_loop = F.generalized_advantage_estimate(gamma, lmbda, sv, nsv, r, done, terminated, **kw)
        want_vec = F.vec_generalized_advantage_estimate(gamma, lmbda, sv, nsv, r, done, terminated, **kw) if vec_ok else None
    if r.dim() == 1 and time_dim == 0:
        # TorchRL's decorator turns a 1-D (T,) input with time_dim=0 into (T, 1) and does not squeeze it back
        # (it squeezes dim -2, of size T): the same numbers in another shape
        assert want_loop[0].shape == (r.shape[0], 1)
        want_loop = tuple(w.reshape(r.shape) for w in want_loop)
        want_vec = None if want_vec is None else tuple(w.reshape(r.shape) for w in want_vec)
    T = r.shape[time_dim]
    bound = vec_truncation_bound(gamma, lmbda, _delta(gamma, sv, nsv, r, terminated), T)
    for fn in OURS:
        got = fn(gamma, lmbda, sv, nsv, r, done, terminated, **kw)
        assert_agrees(got, want_loop, dtype, what=f"{what} {fn.__name__} vs torchrl loop")
        if want_vec is not None:
            assert_agrees(got, want_vec, dtype, extra_atol=bound, what=f"{what} {fn.__name__} vs torchrl vec")
    return want_loop


def upstream_batch(N, T, D=(1,), dtype=torch.float32, has_done=True):
    """The data of TorchRL's tests: seed 0, done / terminated by bernoulli_(0.1) (terminated implies done), randn values."""
    torch.manual_seed(0)
    done = torch.zeros(*N, T, *D, dtype=torch.bool)
    terminated = done.clone()
    if has_done:
        terminated = terminated.bernoulli_(0.1)
        done = done.bernoulli_(0.1) | terminated
    reward = torch.randn(*N, T, *D, dtype=dtype)
    state_value = torch.randn(*N, T, *D, dtype=dtype)
    next_state_value = torch.randn(*N, T, *D, dtype=dtype)
    return state_value, next_state_value, reward, done, terminated


# ---------------------------------------------------------------------------
# ported from pytorch/rl test/objectives/test_values.py (TestValues)
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("gamma", [0.99, 0.5, 0.1])
@pytest.mark.parametrize("lmbda", [0.99, 0.5, 0.1])
@pytest.mark.parametrize("N", [(1,), (3,), (7, 3)])
@pytest.mark.parametrize("T", [200, 5, 3])
@pytest.mark.parametrize("dtype", [torch.float, torch.double])
@pytest.mark.parametrize("has_done", [False, True])
def test_gae(F, gamma, lmbda, N, T, dtype, has_done):
    """Upstream ``test_gae``."""
    sv, nsv, r, done, terminated = upstream_batch(N, T, dtype=dtype, has_done=has_done)
    compare_with_torchrl(F, gamma, lmbda, sv, nsv, r, done, terminated, what="test_gae")


@pytest.mark.parametrize("N", [(1,), (8,), (7, 3)])
@pytest.mark.parametrize("dtype", [torch.float, torch.double])
@pytest.mark.parametrize("has_done", [True, False])
@pytest.mark.parametrize("gamma_tensor", ["scalar", "tensor", "tensor_single_element"])
@pytest.mark.parametrize("lmbda_tensor", ["scalar", "tensor", "tensor_zero_dim", "tensor_single_element"])
def test_gae_param_as_tensor(F, N, dtype, has_done, gamma_tensor, lmbda_tensor):
    """Upstream ``test_gae_param_as_tensor``: ours with tensor discounts against TorchRL's with the same tensors and with floats."""
    gamma, lmbda, T = 0.95, 0.90, 200
    sv, nsv, r, done, terminated = upstream_batch(N, T, dtype=dtype, has_done=has_done)
    # as upstream: the one-element and 0-d tensors have torch's default dtype (float32), the full ones the data's
    gamma_vec = {"tensor": lambda: torch.full_like(r, gamma), "tensor_single_element": lambda: torch.as_tensor([gamma]),
                 "scalar": lambda: gamma}[gamma_tensor]()
    lmbda_vec = {"tensor": lambda: torch.full_like(r, lmbda), "tensor_zero_dim": lambda: torch.as_tensor(lmbda),
                 "tensor_single_element": lambda: torch.as_tensor([lmbda]), "scalar": lambda: lmbda}[lmbda_tensor]()
    # a float32 discount on float64 data: TorchRL forms gamma * lmbda in float32, so its result is float32-accurate
    f32 = any(isinstance(x, torch.Tensor) and x.dtype == torch.float32 for x in (gamma_vec, lmbda_vec))
    base = torch.float32 if f32 else dtype
    compare_with_torchrl(F, gamma_vec, lmbda_vec, sv, nsv, r, done, terminated, base_dtype=base,
                         what="test_gae_param_as_tensor")
    # upstream's own assertion: with tensors, the result is the scalar one (as TorchRL's loop with floats)
    with torchrl_default_dtype(dtype):
        want = F.generalized_advantage_estimate(gamma, lmbda, sv, nsv, r, done=done, terminated=terminated)
    for fn in OURS:
        assert_agrees(fn(gamma_vec, lmbda_vec, sv, nsv, r, done=done, terminated=terminated), want, torch.float32)


@pytest.mark.parametrize("gamma", [0.99, 0.5, 0.1])
@pytest.mark.parametrize("lmbda", [0.99, 0.5, 0.1])
@pytest.mark.parametrize("N", [(3,), (7, 3)])
@pytest.mark.parametrize("T", [100, 3])
@pytest.mark.parametrize("dtype", [torch.float, torch.double])
@pytest.mark.parametrize("feature_dim", [[5], [2, 5]])
@pytest.mark.parametrize("has_done", [True, False])
def test_gae_multidim(F, gamma, lmbda, N, T, dtype, has_done, feature_dim):
    """Upstream ``test_gae_multidim``: feature dims after time, ``time_dim = -1 - len(F)``."""
    D = feature_dim
    time_dim = -1 - len(D)
    sv, nsv, r, done, terminated = upstream_batch(N, T, D=D, dtype=dtype, has_done=has_done)
    compare_with_torchrl(F, gamma, lmbda, sv, nsv, r, done, terminated, time_dim=time_dim, what="test_gae_multidim")
    # upstream's r3 / r4: every feature is its own problem, equal to the (.., T, 1) call on its slice
    for fn in OURS:
        adv, vt = fn(gamma, lmbda, sv, nsv, r, done=done, terminated=terminated, time_dim=time_dim)
        flat = [x.flatten(-len(D)) for x in (sv, nsv, r, done, terminated, adv, vt)]
        for j in range(flat[0].shape[-1]):
            s = [x[..., j:j + 1] for x in flat]
            a, v = fn(gamma, lmbda, s[0], s[1], s[2], done=s[3], terminated=s[4], time_dim=-2)
            assert torch.equal(a, s[5]) and torch.equal(v, s[6])


def test_args_kwargs_timedim(F):
    """Upstream ``test_args_kwargs_timedim``: ``[*N, T, *B, 1]`` with time_dim -3 or 2, args or kwargs; time_dim keyword-only."""
    torch.manual_seed(0)
    lmbda, gamma, N, B, T = 0.95, 0.95, (2, 3), (4,), 20
    terminated = torch.zeros(*N, T, *B, 1, dtype=torch.bool)
    terminated[..., T // 2 - 1, :, :] = 1
    done = terminated.clone()
    done[..., -1, :, :] = 1
    reward = torch.randn(*N, T, *B, 1)
    state_value = torch.randn(*N, T, *B, 1)
    next_state_value = torch.randn(*N, T, *B, 1)
    want = compare_with_torchrl(F, gamma, lmbda, state_value, next_state_value, reward, done, terminated, time_dim=-3)
    for fn in OURS:
        v1 = fn(gamma, lmbda, state_value, next_state_value, reward, done=done, terminated=terminated, time_dim=-3)[0]
        v2 = fn(gamma=gamma, lmbda=lmbda, state_value=state_value, next_state_value=next_state_value, reward=reward,
                done=done, terminated=terminated, time_dim=-3)[0]
        with pytest.raises(TypeError, match="positional argument"):
            fn(gamma, lmbda, state_value, next_state_value, reward, done, terminated, -3)
        v3 = fn(gamma, lmbda, state_value, next_state_value, reward, done, terminated, time_dim=-3)[0]
        v4 = fn(gamma, lmbda, state_value, next_state_value, reward, done, terminated, time_dim=2)[0]
        for v in (v2, v3, v4):
            assert torch.equal(v1, v)
        assert_agrees((v1,), (want[0],), torch.float32)


@pytest.mark.parametrize("N", [(3,), (3, 7)])
@pytest.mark.parametrize("T", [3, 5, 200])
def test_successive_traj_gae(F, N, T):
    """Upstream ``test_successive_traj_gae``: a row of two trajectories is the two halves computed apart."""
    torch.manual_seed(0)
    lmbda = torch.rand([]).item()
    terminated = torch.zeros(*N, T, 1, dtype=torch.bool)
    terminated[..., T // 2 - 1, :] = 1
    done = terminated.clone()
    done[..., -1, :] = 1
    reward = torch.randn(*N, T, 1)
    state_value = torch.randn(*N, T, 1)
    next_state_value = torch.randn(*N, T, 1)
    gamma = 0.95
    compare_with_torchrl(F, gamma, lmbda, state_value, next_state_value, reward, done, terminated)
    h = T // 2
    for fn in OURS:
        whole = fn(gamma, lmbda, state_value, next_state_value, reward, done=done, terminated=terminated)[0]
        a = fn(gamma, lmbda, state_value[..., :h, :], next_state_value[..., :h, :], reward[..., :h, :],
               done=done[..., :h, :], terminated=terminated[..., :h, :])[0]
        b = fn(gamma, lmbda, state_value[..., h:, :], next_state_value[..., h:, :], reward[..., h:, :],
               done=done[..., h:, :], terminated=terminated[..., h:, :])[0]
        assert_agrees((whole,), (torch.cat([a, b], -2),), torch.float32)


# ---------------------------------------------------------------------------
# random layouts
# ---------------------------------------------------------------------------


def _layout(draw_params):
    """The tensors of one random layout: ``(gamma, lmbda, sv, nsv, r, done, terminated, time_dim, dtype)``."""
    (batch, T, feats, neg_time_dim, dtype, p_done, p_term, term_within_done, gkind, lkind, g0, l0, seed) = draw_params
    gen = torch.Generator().manual_seed(seed)
    shape = (*batch, T, *feats)
    axis = len(batch)
    time_dim = axis - len(shape) if neg_time_dim else axis
    r = torch.randn(shape, generator=gen, dtype=dtype)
    sv = torch.randn(shape, generator=gen, dtype=dtype)
    nsv = torch.randn(shape, generator=gen, dtype=dtype)
    done = torch.rand(shape, generator=gen) < p_done
    terminated = torch.rand(shape, generator=gen) < p_term
    if term_within_done:
        terminated &= done  # TorchRL does not require it: a terminated step may be not done (no bootstrap, no reset)

    def discount(kind, value):
        if kind == "float":
            return value
        if kind == "0d":
            return torch.tensor(value, dtype=dtype)
        if kind == "one":
            return torch.tensor([value], dtype=dtype)
        if kind == "full":
            return torch.rand(shape, generator=gen, dtype=dtype) * value
        if kind == "per-row":  # same number of dims, 1 along time and features: one discount per trajectory row
            return torch.rand((*batch, 1, *[1] * len(feats)), generator=gen, dtype=dtype) * value
        if kind == "per-step":  # one discount per time step, shared by the rows
            return torch.rand((*[1] * len(batch), T, *[1] * len(feats)), generator=gen, dtype=dtype) * value
        raise AssertionError(kind)

    return discount(gkind, g0), discount(lkind, l0), sv, nsv, r, done, terminated, time_dim, dtype


unit = st.one_of(st.sampled_from([0.0, 1.0, 0.5, 0.99, 0.95]), st.floats(0.0, 1.0))
layouts = st.tuples(
    st.lists(st.integers(1, 4), min_size=0, max_size=2),  # batch dims
    st.sampled_from([1, 1, 2, 3, 7, 16, 40]),  # T, 1 included
    st.lists(st.integers(1, 3), min_size=0, max_size=2),  # feature dims
    st.booleans(),  # time_dim negative or positive
    st.sampled_from([torch.float32, torch.float64]),
    st.sampled_from([0.0, 0.05, 0.2, 0.5, 1.0]),  # done density
    st.sampled_from([0.0, 0.1, 0.5, 1.0]),  # terminated density
    st.booleans(),  # terminated implies done
    st.sampled_from(["float", "0d", "one", "full", "per-row", "per-step"]),
    st.sampled_from(["float", "0d", "one", "full", "per-row", "per-step"]),
    unit, unit,
    st.integers(0, 2**31 - 1),
)


def _torchrl_defined(gamma, lmbda, r) -> tuple:
    """``(loop_ok, vec_ok)``: where TorchRL 0.14.1 computes anything (its failures are tested apart)."""
    if r.dim() == 1 and r.numel() <= 1:
        return False, False  # its time_dim decorator leaves a one-element 1-D tensor 1-D, then fails
    c = gamma * lmbda
    scalar_c = not isinstance(c, torch.Tensor) or c.numel() <= 1
    # its vectorised GAE keeps int(log(1e-7) / log(c)) terms of its kernel: none, and an IndexError, below c = 1e-7
    return True, not (scalar_c and float(c) < THR)


@settings(max_examples=1000, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(layouts)
def test_hypothesis_random_layouts_match_torchrl(F, params):
    gamma, lmbda, sv, nsv, r, done, terminated, time_dim, dtype = _layout(params)
    loop_ok, vec_ok = _torchrl_defined(gamma, lmbda, r)
    if loop_ok:
        compare_with_torchrl(F, gamma, lmbda, sv, nsv, r, done, terminated, time_dim=time_dim, vec_ok=vec_ok,
                             what=str(params[:-1]))
    # the recursion itself, one step at a time, on the time-last layout (also where TorchRL fails)
    want = _loop_reference(gamma, lmbda, sv, nsv, r, done, terminated, time_dim)
    assert_agrees(generalized_advantage_estimate(gamma, lmbda, sv, nsv, r, done, terminated, time_dim=time_dim),
                  want, dtype, what="loop reference")


def _loop_reference(gamma, lmbda, sv, nsv, r, done, terminated, time_dim):
    """The recursion of the docstring, one Python step per t, in float64, then cast (the test's own reference)."""
    shape = r.shape

    def full(x):  # a discount as a float64 tensor of the data's shape, time last
        x = torch.as_tensor(x, dtype=torch.float64).expand(shape)
        return x.movedim(time_dim, -1)

    g, lm = full(gamma), full(lmbda)
    r64, sv64, nsv64 = (x.double().movedim(time_dim, -1) for x in (r, sv, nsv))
    d, te = done.movedim(time_dim, -1), terminated.movedim(time_dim, -1)
    adv = torch.zeros_like(r64)
    nxt = torch.zeros_like(r64[..., 0])
    for t in reversed(range(r64.shape[-1])):
        delta = r64[..., t] + g[..., t] * (~te[..., t]).double() * nsv64[..., t] - sv64[..., t]
        nxt = delta + g[..., t] * lm[..., t] * (~d[..., t]).double() * nxt
        adv[..., t] = nxt
    adv = adv.movedim(-1, time_dim).to(r.dtype)
    return adv, adv + sv


# ---------------------------------------------------------------------------
# a slipped implementation is caught
# ---------------------------------------------------------------------------


def _ignores_terminated(gamma, lmbda, sv, nsv, r, done, terminated, time_dim):
    """Bootstraps at every step, terminated or not."""
    return generalized_advantage_estimate(gamma, lmbda, sv, nsv, r, done, torch.zeros_like(done), time_dim=time_dim)


def _resets_one_step_late(gamma, lmbda, sv, nsv, r, done, terminated, time_dim):
    """Cuts the recursion after the step following ``done`` instead of at ``done``."""
    late = torch.zeros_like(done)
    n = done.shape[time_dim]
    late.narrow(time_dim, 1, n - 1).copy_(done.narrow(time_dim, 0, n - 1))
    return generalized_advantage_estimate(gamma, lmbda, sv, nsv, r, late, terminated, time_dim=time_dim)


def _bootstraps_from_the_next_state(gamma, lmbda, sv, nsv, r, done, terminated, time_dim):
    """Uses ``state_value`` shifted by one step as the next value (wrong at every ``done`` that is not ``terminated``)."""
    shifted = torch.zeros_like(sv)
    n = sv.shape[time_dim]
    shifted.narrow(time_dim, 0, n - 1).copy_(sv.narrow(time_dim, 1, n - 1))
    return generalized_advantage_estimate(gamma, lmbda, sv, shifted, r, done, terminated, time_dim=time_dim)


SLIPS = [_ignores_terminated, _resets_one_step_late, _bootstraps_from_the_next_state]


def _slip_layouts(n=40):
    """Deterministic random layouts with a few done and terminated steps (where the slips matter)."""
    out = []
    for seed in range(n):
        g = np.random.default_rng(seed)
        batch = [int(g.integers(1, 4))]
        feats = [int(g.integers(1, 3))] if seed % 2 else []
        params = (batch, int(g.integers(8, 40)), feats, bool(seed % 3), torch.float64, 0.2, 0.5, bool(seed % 2),
                  "float", "float", 0.99, 0.95, seed)
        out.append(_layout(params))
    return out


@pytest.mark.parametrize("slip", SLIPS, ids=lambda f: f.__name__)
def test_a_slipped_implementation_disagrees_with_torchrl(F, slip):
    caught = 0
    layouts_ = _slip_layouts()
    for gamma, lmbda, sv, nsv, r, done, terminated, time_dim, dtype in layouts_:
        with torchrl_default_dtype(dtype):
            want = F.generalized_advantage_estimate(gamma, lmbda, sv, nsv, r, done, terminated, time_dim=time_dim)
        # the real one agrees on every layout ...
        assert_agrees(generalized_advantage_estimate(gamma, lmbda, sv, nsv, r, done, terminated, time_dim=time_dim),
                      want, dtype)
        # ... the slipped one on few, if any
        try:
            assert_agrees(slip(gamma, lmbda, sv, nsv, r, done, terminated, time_dim), want, dtype)
        except AssertionError:
            caught += 1
    assert caught >= len(layouts_) - 2, f"{slip.__name__} disagreed on only {caught} of {len(layouts_)} layouts"


# ---------------------------------------------------------------------------
# TorchRL's rounding and failures, and what valuelab does there
# ---------------------------------------------------------------------------


def test_torchrl_rounds_a_float_gamma_to_the_default_dtype(F):
    """With the default dtype float32, TorchRL's float64 GAE uses float32(gamma): it moves by ~1e-7, ours does not."""
    sv, nsv, r, done, terminated = upstream_batch((3,), 200, dtype=torch.float64)
    theirs = F.generalized_advantage_estimate(0.99, 0.95, sv, nsv, r, done, terminated)[0]
    with torchrl_default_dtype(torch.float64):
        exact = F.generalized_advantage_estimate(0.99, 0.95, sv, nsv, r, done, terminated)[0]
    got = generalized_advantage_estimate(0.99, 0.95, sv, nsv, r, done, terminated)[0]
    torch.testing.assert_close(got, exact, rtol=1e-10, atol=1e-10)
    gap = float((theirs - exact).abs().max())
    assert 1e-9 < gap < 1e-5  # float32's rounding of 0.99 (3e-9 relative... times the values and the horizon)
    # with a gamma that float32 holds exactly, there is nothing to round
    theirs = F.generalized_advantage_estimate(0.5, 0.5, sv, nsv, r, done, terminated)[0]
    torch.testing.assert_close(generalized_advantage_estimate(0.5, 0.5, sv, nsv, r, done, terminated)[0], theirs,
                               rtol=1e-12, atol=1e-12)


def test_where_torchrl_fails_valuelab_computes(F):
    sv, nsv, r, done, terminated = upstream_batch((3,), 20)
    # TorchRL's vectorised GAE with gamma * lmbda == 0 (or below 1e-7): an IndexError; the advantage is the TD error
    for lmbda in (0.0, 1e-8):
        with pytest.raises(IndexError):
            F.vec_generalized_advantage_estimate(0.9, lmbda, sv, nsv, r, done, terminated)
        assert_agrees(vec_generalized_advantage_estimate(0.9, lmbda, sv, nsv, r, done, terminated),
                      F.generalized_advantage_estimate(0.9, lmbda, sv, nsv, r, done, terminated), torch.float32)
    adv, vt = vec_generalized_advantage_estimate(0.9, 0.0, sv, nsv, r, done, terminated)
    torch.testing.assert_close(adv, r + 0.9 * (~terminated) * nsv - sv)
    assert_agrees((adv, vt), F.generalized_advantage_estimate(0.9, 0.0, sv, nsv, r, done, terminated), torch.float32)
    # an empty batch: TorchRL's vectorised GAE fails, its loop and ours return empty tensors
    e = [x[:0] for x in (sv, nsv, r, done, terminated)]
    with pytest.raises(RuntimeError):
        F.vec_generalized_advantage_estimate(0.9, 0.9, *e)
    for fn in OURS:
        adv, vt = fn(0.9, 0.9, *e)
        assert adv.shape == vt.shape == e[0].shape
    # one step on a 1-D row (time_dim=-1): TorchRL's decorator leaves it 1-D and fails; ours is the TD error
    one = [x[0, :1, 0] for x in (sv, nsv, r, done, terminated)]
    with pytest.raises(ValueError):
        F.generalized_advantage_estimate(0.9, 0.9, *one, time_dim=-1)
    adv, _ = generalized_advantage_estimate(0.9, 0.9, *one, time_dim=-1)
    torch.testing.assert_close(adv, one[2] + 0.9 * (~one[4]) * one[1] - one[0])
    # a 1-D row with time_dim=0: TorchRL returns (T, 1) (its decorator squeezes the wrong dimension); ours (T,)
    row = [x[0, :, 0] for x in (sv, nsv, r, done, terminated)]
    theirs = F.generalized_advantage_estimate(0.9, 0.9, *row, time_dim=0)[0]
    adv = generalized_advantage_estimate(0.9, 0.9, *row, time_dim=0)[0]
    assert theirs.shape == (20, 1) and adv.shape == (20,)
    torch.testing.assert_close(adv, theirs.reshape(20), rtol=1e-5, atol=1e-5)


def test_lower_dimensional_discounts(F):
    """A discount tensor with fewer dims than reward: as TorchRL at time_dim=-2 or a negative time_dim within its dims."""
    g = torch.Generator().manual_seed(2)
    shape = (4, 30, 2, 3)
    sv, nsv, r = (torch.randn(shape, generator=g, dtype=torch.float64) for _ in range(3))
    done = torch.rand(shape, generator=g) < 0.1
    terminated = done & (torch.rand(shape, generator=g) < 0.5)
    per_step = torch.rand(30, 2, 3, generator=g, dtype=torch.float64)  # (T, F1, F2), time at -3
    compare_with_torchrl(F, per_step, 0.9, sv, nsv, r, done, terminated, time_dim=-3)
    per_feature = torch.rand(3, generator=g, dtype=torch.float64)  # broadcast on the last axis, time_dim=-2 layout
    x = [t.flatten(-2) for t in (sv, nsv, r, done, terminated)]  # (4, 30, 6)
    compare_with_torchrl(F, 0.95, per_feature.repeat(2), *x)
    # positive time_dim: TorchRL transposes (T, F1, F2) on its own dims (its axis 1 is F1) and fails to broadcast;
    # ours broadcasts it in the caller's layout, as at time_dim=-3
    with pytest.raises(RuntimeError, match="must match"):
        F.generalized_advantage_estimate(per_step, 0.9, sv, nsv, r, done, terminated, time_dim=1)
    ours_pos = generalized_advantage_estimate(per_step, 0.9, sv, nsv, r, done, terminated, time_dim=1)
    ours_neg = generalized_advantage_estimate(per_step, 0.9, sv, nsv, r, done, terminated, time_dim=-3)
    assert all(torch.equal(a, b) for a, b in zip(ours_pos, ours_neg))


def test_gradients_equal_torchrls(F):
    """TorchRL's outputs carry gradients to the values, the rewards and tensor discounts: ours the same ones."""
    torch.manual_seed(1)
    shape = (3, 30, 2)
    leaves = [torch.randn(shape, dtype=torch.float64, requires_grad=True) for _ in range(3)]
    # inside (0, 1), away from its ends: gradcheck's steps must not leave [0, 1]
    gamma = (torch.rand(shape, dtype=torch.float64) * 0.4 + 0.5).requires_grad_()
    lmbda = (torch.rand(3, 1, 1, dtype=torch.float64) * 0.5 + 0.25).requires_grad_()
    done = torch.rand(shape) < 0.15
    terminated = done & (torch.rand(shape) < 0.5)
    w = torch.randn(shape, dtype=torch.float64)
    wrt = (*leaves, gamma, lmbda)

    def grads(fn):
        a, v = fn(gamma, lmbda, *leaves, done, terminated)
        return torch.autograd.grad((a * w).sum() + (v * w).sum(), wrt)

    with torchrl_default_dtype(torch.float64):
        want = grads(F.generalized_advantage_estimate)
        want_vec = grads(F.vec_generalized_advantage_estimate)
    for fn in OURS:
        for g, w1, w2 in zip(grads(fn), want, want_vec):
            torch.testing.assert_close(g, w1, rtol=1e-10, atol=1e-10)
            torch.testing.assert_close(g, w2, rtol=1e-6, atol=1e-6)  # TorchRL's vec truncates its kernel
    assert torch.autograd.gradcheck(lambda *x: generalized_advantage_estimate(x[3], x[4], *x[:3], done, terminated),
                                    wrt)


# ---------------------------------------------------------------------------
# without TorchRL: errors, inputs, the recursion
# ---------------------------------------------------------------------------


def _ok(B=2, T=5, F_=1, dtype=torch.float32):
    g = torch.Generator().manual_seed(0)
    shape = (B, T, F_)
    done = torch.zeros(shape, dtype=torch.bool)
    done[:, -1] = True
    done[0, 1] = True
    return dict(gamma=0.99, lmbda=0.95, state_value=torch.randn(shape, generator=g, dtype=dtype),
                next_state_value=torch.randn(shape, generator=g, dtype=dtype),
                reward=torch.randn(shape, generator=g, dtype=dtype), done=done, terminated=done.clone())


def _with(**changes):
    kw = _ok()
    kw.update(changes)
    return kw


_S = _ok()["reward"]
BAD = [
    # (keyword arguments, error, the argument named at the start of the message)
    (_with(reward=[[0.0]]), TypeError, "reward"),
    (_with(reward=_S.long()), TypeError, "reward"),
    (_with(state_value=_S.double()), TypeError, "state_value"),
    (_with(state_value=_S[:, :1]), ValueError, "state_value"),  # broadcastable, not equal: refused, as TorchRL
    (_with(next_state_value=_S[..., 0]), ValueError, "next_state_value"),
    (_with(next_state_value=_S.clone().fill_(float("nan"))), ValueError, "next_state_value"),
    (_with(reward=_S.clone().fill_(float("inf"))), ValueError, "reward"),
    (_with(state_value=np.zeros(_S.shape)), TypeError, "state_value"),
    (_with(done=_ok()["done"].long()), TypeError, "done"),
    (_with(done=_ok()["done"].to(torch.uint8)), TypeError, "done"),
    (_with(done=_ok()["done"].float()), TypeError, "done"),
    (_with(done=_ok()["done"].numpy()), TypeError, "done"),
    (_with(done=_ok()["done"][:, :1]), ValueError, "done"),
    (_with(terminated=_ok()["done"].int()), TypeError, "terminated"),
    (_with(terminated=_ok()["done"][0]), ValueError, "terminated"),
    (_with(gamma=True), TypeError, "gamma"),
    (_with(lmbda=False), TypeError, "lmbda"),
    (_with(gamma="0.99"), TypeError, "gamma"),
    (_with(lmbda=None), TypeError, "lmbda"),
    (_with(gamma=torch.tensor(True)), TypeError, "gamma"),
    (_with(lmbda=torch.tensor(0.5 + 0j)), TypeError, "lmbda"),
    (_with(gamma=1.5), ValueError, "gamma"),
    (_with(lmbda=-0.1), ValueError, "lmbda"),
    (_with(gamma=float("nan")), ValueError, "gamma"),
    (_with(gamma=torch.full((2, 5, 1), 1.2)), ValueError, "gamma"),
    (_with(lmbda=torch.full((3,), 0.5)), ValueError, "lmbda"),  # does not broadcast to (2, 5, 1)
    (_with(lmbda=torch.full((4, 2, 5, 1), 0.5)), ValueError, "lmbda"),  # broadcasts, but to a bigger shape
]


@pytest.mark.parametrize("fn", OURS, ids=lambda f: f.__name__)
@pytest.mark.parametrize("i", range(len(BAD)))
def test_bad_arguments_raise_naming_the_argument(fn, i):
    kw, error, name = BAD[i]
    with pytest.raises(error, match=f"^{name}"):
        fn(**kw)


@pytest.mark.parametrize("fn", OURS, ids=lambda f: f.__name__)
def test_bad_time_dim(fn):
    kw = _ok()
    for bad, error in ((3, ValueError), (-4, ValueError), (1.0, TypeError), (True, TypeError), ("-2", TypeError)):
        with pytest.raises(error, match="^time_dim"):
            fn(**kw, time_dim=bad)
    with pytest.raises(ValueError, match="^time_dim"):  # a 1-D row has no dimension -2 (TorchRL fails there too)
        fn(0.9, 0.9, *(kw[k][0, :, 0] for k in ("state_value", "next_state_value", "reward", "done")))


@pytest.mark.parametrize("fn", OURS, ids=lambda f: f.__name__)
@pytest.mark.parametrize("tensor_discounts", [False, True])
def test_inputs_are_not_modified(fn, tensor_discounts):
    kw = _ok(B=3, T=9, F_=2)
    if tensor_discounts:
        kw["gamma"] = torch.rand(3, 9, 2)
        kw["lmbda"] = torch.tensor(0.9)
    before = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in kw.items()}
    adv, vt = fn(**kw, time_dim=1)
    for k, v in kw.items():
        assert (torch.equal(v, before[k]) if isinstance(v, torch.Tensor) else v == before[k]), k
    for out in (adv, vt):
        assert all(out.data_ptr() != v.data_ptr() for v in kw.values() if isinstance(v, torch.Tensor))
    adv.add_(1.0)  # writing to an output leaves the inputs alone
    assert all(torch.equal(v, before[k]) for k, v in kw.items() if isinstance(v, torch.Tensor))


def test_terminated_defaults_to_done_and_discounts_broadcast():
    kw = _ok(B=3, T=9, F_=2)
    full = generalized_advantage_estimate(**kw)
    kw.pop("terminated")
    assert all(torch.equal(a, b) for a, b in zip(generalized_advantage_estimate(**kw), full))
    # a (B, 1, 1) lmbda is one per row: the same as the row's float
    lm = torch.tensor([0.9, 0.5, 0.0]).reshape(3, 1, 1)
    adv = generalized_advantage_estimate(kw["gamma"], lm, kw["state_value"], kw["next_state_value"], kw["reward"],
                                         kw["done"])[0]
    for b in range(3):
        row = generalized_advantage_estimate(kw["gamma"], float(lm[b]), kw["state_value"][b:b + 1],
                                             kw["next_state_value"][b:b + 1], kw["reward"][b:b + 1],
                                             kw["done"][b:b + 1])[0]
        torch.testing.assert_close(adv[b:b + 1], row)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_each_trajectory_of_a_row_is_valuelab_gae_of_its_own_row(dtype):
    """Without TorchRL: split a multi-trajectory row at its done steps; each piece is valuelab.gae with its bootstrap."""
    g = torch.Generator().manual_seed(3)
    T = 60
    r, v, boots = (torch.randn(1, T, 1, generator=g, dtype=dtype) for _ in range(3))
    done = torch.zeros(1, T, 1, dtype=torch.bool)
    done[0, [9, 10, 30, 41]] = True
    # inside a trajectory the next value is the next step's value; at its end, its own (the bootstrap)
    nv = torch.where(done, boots, torch.cat([v[:, 1:], boots[:, -1:]], 1))
    done[0, -1] = False  # the row's end closes the last trajectory anyway
    terminated = torch.zeros_like(done)
    terminated[0, [9, 41]] = True
    adv, vt = generalized_advantage_estimate(0.97, 0.9, v, nv, r, done, terminated)
    ends = [9, 10, 30, 41, T - 1]
    start = 0
    for e in ends:
        sl = slice(start, e + 1)
        boot = 0.0 if terminated[0, e, 0] else float(nv[0, e, 0])
        want = vl.gae(r[0, sl, 0][None], v[0, sl, 0][None], gamma=0.97, lam=0.9,
                      bootstrap=torch.tensor([boot], dtype=dtype))
        tol = TOL[dtype] * 10
        torch.testing.assert_close(adv[0, sl, 0], want.advantages[0], rtol=tol, atol=tol)
        torch.testing.assert_close(vt[0, sl, 0], want.returns[0], rtol=tol, atol=tol)
        start = e + 1


def test_module_exports():
    assert {"generalized_advantage_estimate", "vec_generalized_advantage_estimate", "to_torchrl", "from_torchrl",
            "ValuelabBatch"} <= set(ours.__all__)
    for fn in OURS:
        assert "eq-gae-recursion" in fn.__doc__ and f"torchrl.objectives.value.functional.{fn.__name__}" in fn.__doc__


# ---------------------------------------------------------------------------
# from_torchrl: one trajectory per row, or a clear error
# ---------------------------------------------------------------------------


def _torchrl_layout(B=3, T=8):
    g = torch.Generator().manual_seed(5)
    rewards = torch.randn(B, T, generator=g)
    values = torch.randn(B, T, generator=g)
    mask = torch.arange(T)[None] < torch.tensor([T, 3, 5])[:, None]
    return to_torchrl(rewards, values, mask, truncated=torch.tensor([False, True, False]),
                      bootstrap=torch.tensor([0.0, 0.7, 0.0]))


def test_from_torchrl_round_trip_still_works():
    kw = _torchrl_layout()
    back = from_torchrl(**kw)
    assert back.mask.sum(-1).tolist() == [8, 3, 5]
    assert back.bootstrap.tolist() == pytest.approx([0.0, 0.7, 0.0])


def test_from_torchrl_refuses_non_bool_flags():
    kw = _torchrl_layout()
    with pytest.raises(TypeError, match="^done"):
        from_torchrl(**dict(kw, done=kw["done"].long()))
    with pytest.raises(TypeError, match="^done"):
        from_torchrl(**dict(kw, done=kw["done"].float()))
    with pytest.raises(TypeError, match="^terminated"):
        from_torchrl(**dict(kw, terminated=kw["terminated"].to(torch.uint8)))


def test_from_torchrl_refuses_shapes_that_disagree():
    kw = _torchrl_layout()
    with pytest.raises(ValueError, match="^done"):
        from_torchrl(**dict(kw, done=kw["done"][:, :-1]))
    with pytest.raises(ValueError, match="^terminated"):
        from_torchrl(**dict(kw, terminated=kw["terminated"][:2]))
    with pytest.raises(ValueError, match="^state_value"):
        from_torchrl(**dict(kw, state_value=kw["state_value"][:, :-1]))
    with pytest.raises(ValueError, match="^next_state_value"):
        from_torchrl(**dict(kw, next_state_value=kw["next_state_value"][:2]))
    with pytest.raises(TypeError, match="^reward"):
        from_torchrl(**dict(kw, reward=kw["reward"].long()))


def test_from_torchrl_points_to_generalized_advantage_estimate_for_several_trajectories():
    kw = _torchrl_layout()
    two = kw["done"].clone()
    two[1, 6] = True  # row 1 ends at t = 2; a second done at t = 6: its steps 3..6 are a trajectory, not padding
    with pytest.raises(ValueError, match=r"^done: row 1 has 2 done steps \(t = 2, 6\).*generalized_advantage_estimate"):
        from_torchrl(**dict(kw, done=two, terminated=two & kw["terminated"]))
    none = kw["done"].clone()
    none[2] = False  # row 2 never ends
    with pytest.raises(ValueError, match=r"^done: row 2 has no done step.*generalized_advantage_estimate"):
        from_torchrl(**dict(kw, done=none, terminated=none & kw["terminated"]))
    stray = kw["terminated"].clone()
    stray[0, 3] = True  # terminated inside row 0's trajectory
    with pytest.raises(ValueError, match=r"^terminated: row 0 is terminated at t = 3.*generalized_advantage_estimate"):
        from_torchrl(**dict(kw, terminated=stray))
    # the same layout with several trajectories, computed by the drop-in: no error
    adv, _ = generalized_advantage_estimate(0.99, 0.95, kw["state_value"], kw["next_state_value"], kw["reward"], two,
                                            two & kw["terminated"])
    assert adv.shape == kw["reward"].shape and bool(torch.isfinite(adv).all())
