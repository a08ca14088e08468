"""The C kernel (valuelab/_gae_kernel.c through valuelab._native) against the references and the PyTorch path.

The kernel cuts each row into runs of valid and masked tokens and scans a
valid run in vectors of W = 16 (float32) or 8 (float64) tokens, so the cases
that matter are run lengths around multiples of W, runs of length 1, rows
that are all masked, and holes next to the row's ends.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import valuelab
from valuelab import _native
from valuelab import reference as ref

DTYPES = [torch.float32, torch.float64]
HAVE_COMPILER = any(shutil.which(c) for c in (os.environ.get("CC", "cc"), "gcc", "clang"))
needs_kernel = pytest.mark.skipif(not _native.available(), reason=f"C kernel not available: {_native.status()}")


def _oracle(r, v, mask, gamma, lam, boot):
    """valuelab.reference.gae_recursion on each row's valid tokens (float64), 0 elsewhere; gamma, lam rounded to the dtype."""
    g = float(torch.tensor(gamma, dtype=r.dtype))
    lm = float(torch.tensor(lam, dtype=r.dtype))
    B, T = r.shape
    adv, ret = np.zeros((B, T)), np.zeros((B, T))
    for i in range(B):
        mi = mask[i].numpy()
        ri, vi = r[i].double().numpy()[mi], v[i].double().numpy()[mi]
        if len(ri):
            a = ref.gae_recursion(ri, vi, g, lm, float(boot[i]))
            adv[i, mi], ret[i, mi] = a, a + vi
    return adv, ret


def _scale(r, v, boot):
    return 1 + r.double().abs().sum(-1, keepdim=True).numpy() + v.double().abs().amax(-1, keepdim=True).numpy() + np.abs(boot.double().numpy())[:, None]


def _run_lengths_mask(B, T, gen, max_run):
    """Alternating valid and masked runs of random lengths 1 .. max_run, starting with either."""
    m = torch.zeros(B, T, dtype=torch.bool)
    for i in range(B):
        t, on = 0, bool(torch.randint(0, 2, (), generator=gen))
        while t < T:
            n = int(torch.randint(1, max_run + 1, (), generator=gen))
            m[i, t : t + n] = on
            t, on = t + n, not on
    return m


def test_kernel_is_built_where_a_compiler_exists():
    if not HAVE_COMPILER:
        pytest.skip("no C compiler on this machine: the PyTorch path is the CPU path")
    assert _native.available(), _native.status()
    assert _native.status().startswith("C kernel")


@needs_kernel
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("max_run", [1, 3, 8, 17, 40])
@pytest.mark.parametrize("gamma,lam", [(1.0, 0.95), (0.99, 0.0), (0.9, 1.0), (0.0, 0.5), (1.0, 1e-8)])
def test_runs_of_every_length_match_the_reference(max_run, gamma, lam, dtype):
    gen = torch.Generator().manual_seed(max_run * 7 + int(lam * 10))
    B, T = 6, 150
    r = torch.randn(B, T, generator=gen, dtype=torch.float64).to(dtype)
    v = torch.randn(B, T, generator=gen, dtype=torch.float64).to(dtype)
    mask = _run_lengths_mask(B, T, gen, max_run)
    mask[0] = False  # a row with no valid token
    mask[1] = True  # a row with no hole
    boot = torch.randn(B, generator=gen, dtype=torch.float64).to(dtype)
    out = valuelab.gae(r, v, mask=mask, gamma=gamma, lam=lam, bootstrap=boot)
    ea, er = _oracle(r, v, mask, gamma, lam, boot)
    tol = (4e-6 if dtype == torch.float32 else 1e-14) * _scale(r, v, boot)
    assert (np.abs(out.advantages.double().numpy() - ea) <= tol).all()
    assert (np.abs(out.returns.double().numpy() - er) <= tol).all()
    assert bool((out.advantages[~mask] == 0).all()) and bool((out.returns[~mask] == 0).all())


@needs_kernel
@settings(max_examples=60, deadline=None)
@given(
    B=st.integers(1, 5),
    T=st.integers(1, 90),
    density=st.floats(0.0, 1.0),
    gamma=st.floats(0.0, 1.0),
    lam=st.floats(0.0, 1.0),
    f64=st.booleans(),
    seed=st.integers(0, 2**31 - 1),
)
def test_hypothesis_kernel_equals_pytorch_path(B, T, density, gamma, lam, f64, seed):
    dtype = torch.float64 if f64 else torch.float32
    gen = torch.Generator().manual_seed(seed)
    r = torch.randn(B, T, generator=gen, dtype=torch.float64).to(dtype)
    v = torch.randn(B, T, generator=gen, dtype=torch.float64).to(dtype)
    mask = torch.rand(B, T, generator=gen) < density
    boot = torch.randn(B, generator=gen, dtype=torch.float64).to(dtype)
    kernel = valuelab.gae(r, v, mask=mask, gamma=gamma, lam=lam, bootstrap=boot)
    ret_k = valuelab.discounted_returns(r, mask=mask, gamma=gamma, bootstrap=boot)
    with _native.disabled():
        block = valuelab.gae(r, v, mask=mask, gamma=gamma, lam=lam, bootstrap=boot)
        ret_b = valuelab.discounted_returns(r, mask=mask, gamma=gamma, bootstrap=boot)
    tol = (2e-5 if dtype == torch.float32 else 1e-12) * torch.from_numpy(_scale(r, v, boot)).to(dtype)
    for a, b in ((kernel.advantages, block.advantages), (kernel.returns, block.returns), (ret_k, ret_b)):
        assert a.dtype == b.dtype == dtype and a.shape == b.shape
        assert bool(((a - b).abs() <= tol).all())
        assert bool((a[~mask] == 0).all())


@needs_kernel
@pytest.mark.parametrize("dtype", DTYPES)
def test_threads_give_the_same_bits(dtype, monkeypatch):
    gen = torch.Generator().manual_seed(3)
    B, T = 9, 1000
    r = torch.randn(B, T, generator=gen, dtype=torch.float64).to(dtype)
    v = torch.randn(B, T, generator=gen, dtype=torch.float64).to(dtype)
    mask = _run_lengths_mask(B, T, gen, 50)
    one = valuelab.gae(r, v, mask=mask, gamma=1.0, lam=0.95)
    torch_threads = torch.get_num_threads()
    monkeypatch.setattr(_native, "_PARALLEL_GRAIN", 1)
    torch.set_num_threads(4)
    try:
        assert _native.threads_for(B * T) == 4
        many = valuelab.gae(r, v, mask=mask, gamma=1.0, lam=0.95)
    finally:
        torch.set_num_threads(torch_threads)
    assert torch.equal(one.advantages, many.advantages) and torch.equal(one.returns, many.returns)


def test_thread_count_rule():
    assert _native.threads_for(0) == 1 and _native.threads_for(10) == 1
    assert _native.threads_for(10**12) == torch.get_num_threads()


@needs_kernel
def test_monte_carlo_return_through_the_kernel():
    gen = torch.Generator().manual_seed(4)
    r = torch.randn(3, 70, generator=gen, dtype=torch.float64)
    mask = _run_lengths_mask(3, 70, gen, 9)
    got = valuelab.discounted_returns(r, mask=mask, gamma=0.9, bootstrap=torch.tensor([0.0, 1.0, -2.0], dtype=torch.float64))
    for i, b in enumerate((0.0, 1.0, -2.0)):
        exp = ref.mc_returns(r[i][mask[i]].numpy(), 0.9, b)
        assert np.allclose(got[i][mask[i]].numpy(), exp, rtol=1e-13, atol=1e-13)
    assert bool((got[~mask] == 0).all())


def _fresh_state(monkeypatch, tmp_path):
    """Forget the loaded kernel (restored after the test) and build into tmp_path."""
    monkeypatch.setattr(_native, "_lib", None)
    monkeypatch.setattr(_native, "_tried", False)
    monkeypatch.setattr(_native, "_status", "not loaded yet")
    monkeypatch.setattr(_native, "_enabled", True)
    monkeypatch.setenv("VALUELAB_CACHE_DIR", str(tmp_path))


@pytest.fixture
def fresh_build(monkeypatch, tmp_path):
    """A process that has not loaded the kernel yet and builds it into tmp_path (needs a compiler)."""
    if not HAVE_COMPILER:
        pytest.skip("no C compiler")
    _fresh_state(monkeypatch, tmp_path)
    return tmp_path


def _gae_still_right():
    gen = torch.Generator().manual_seed(5)
    r = torch.randn(2, 40, generator=gen, dtype=torch.float64)
    v = torch.randn(2, 40, generator=gen, dtype=torch.float64)
    mask = _run_lengths_mask(2, 40, gen, 6)
    out = valuelab.gae(r, v, mask=mask, gamma=1.0, lam=0.9)
    ea, _ = _oracle(r, v, mask, 1.0, 0.9, torch.zeros(2, dtype=torch.float64))
    assert np.allclose(out.advantages.numpy(), ea, rtol=1e-12, atol=1e-12)


def test_without_a_compiler_the_pytorch_path_runs(monkeypatch, tmp_path):
    _fresh_state(monkeypatch, tmp_path)
    monkeypatch.setattr(_native.shutil, "which", lambda name: None)
    assert not _native.available()
    assert _native.status() == "no C compiler found: PyTorch block scan"
    _gae_still_right()


def test_a_source_that_does_not_compile_falls_back(monkeypatch, fresh_build):
    tmp_path = fresh_build
    broken = tmp_path / "broken.c"
    broken.write_text("this is not C\n")
    monkeypatch.setattr(_native, "SOURCE", broken)
    assert not _native.available()
    assert "did not compile" in _native.status()
    assert not list(tmp_path.glob("*.so"))  # no half-written library left behind
    _gae_still_right()


def test_the_build_is_cached_under_a_hash(monkeypatch, fresh_build):
    tmp_path = fresh_build
    assert _native.available(), _native.status()
    built = list(tmp_path.glob("gae_kernel-*.so"))
    assert len(built) == 1
    stamp = built[0].stat().st_mtime_ns
    monkeypatch.setattr(_native, "_lib", None)
    monkeypatch.setattr(_native, "_tried", False)
    assert _native.available() and built[0].stat().st_mtime_ns == stamp  # loaded, not rebuilt
    _gae_still_right()


def test_environment_switch_turns_the_kernel_off():
    code = "from valuelab import _native; print(_native.status())"
    env = dict(os.environ, VALUELAB_NATIVE="0")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "C kernel switched off: PyTorch block scan"


def test_disabled_is_restored_after_an_exception():
    before = _native._enabled
    with pytest.raises(RuntimeError):
        with _native.disabled():
            assert not _native.available()
            raise RuntimeError("boom")
    assert _native._enabled == before


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_tensors_never_reach_the_kernel():
    r = torch.randn(2, 50, device="cuda")
    assert _native.scan(r, r, None, 1.0, 0.95, None) is None


def test_an_unwritable_cache_falls_back_to_a_private_temporary_folder(monkeypatch, fresh_build):
    tmp_path = fresh_build
    blocked = tmp_path / "file-not-folder"
    blocked.write_text("")
    monkeypatch.setenv("VALUELAB_CACHE_DIR", str(blocked / "cache"))  # cannot be created
    monkeypatch.setattr(_native.tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    assert _native.available(), _native.status()
    assert list((tmp_path / "tmp").glob("valuelab-*/gae_kernel-*.so"))
    _gae_still_right()


def test_the_portable_build_gives_the_same_results(monkeypatch, fresh_build):
    # the second flag set (no -march=native: 64-byte vectors split into SSE2 pieces), used where the first fails
    monkeypatch.setattr(_native, "_FLAG_SETS", [["-O3"]])
    assert _native.available(), _native.status()
    assert _native.status().endswith("-O3)")
    gen = torch.Generator().manual_seed(8)
    for dtype in DTYPES:
        r = torch.randn(5, 333, generator=gen, dtype=torch.float64).to(dtype)
        v = torch.randn(5, 333, generator=gen, dtype=torch.float64).to(dtype)
        mask = _run_lengths_mask(5, 333, gen, 30)
        boot = torch.randn(5, generator=gen, dtype=torch.float64).to(dtype)
        out = valuelab.gae(r, v, mask=mask, gamma=0.99, lam=0.95, bootstrap=boot)
        ea, er = _oracle(r, v, mask, 0.99, 0.95, boot)
        tol = (4e-6 if dtype == torch.float32 else 1e-14) * _scale(r, v, boot)
        assert (np.abs(out.advantages.double().numpy() - ea) <= tol).all()
        assert (np.abs(out.returns.double().numpy() - er) <= tol).all()


def test_lanes_fill_one_64_byte_vector():
    # the widths the chapter's SymPy proof uses are the kernel's, read from its source
    assert _native.lanes() == {torch.float32: 16, torch.float64: 8}
    assert all(w * torch.tensor([], dtype=dt).element_size() == 64 for dt, w in _native.lanes().items())
