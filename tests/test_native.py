"""The C kernel (valuelab/_engine/_gae_kernel.c through valuelab._engine.native): results, the install-time build, the loader.

The kernel cuts each row into runs of valid and masked tokens and scans a
valid run in vectors of W = 16 (float32) or 8 (float64) tokens, so the cases
that matter are run lengths around multiples of W, runs of length 1, rows
that are all masked, and holes next to the row's ends. Every build variant
(GCC and Clang; with the x86-64 clones, AVX2 and baseline only, a single
target) must give the same results. The build happens at install time
(setup.py) and the loader takes only the library inside the package, owned
by this user or root and writable by no one else, with the entry point and
built from the source next to it; anything else falls back to the PyTorch
path with one warning. The boundary checks of ``_native.scan`` are in
tests/test_adversarial_native.py.
"""

from __future__ import annotations

import ast
import ctypes
import hashlib
import itertools
import math
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import warnings
from pathlib import Path
from typing import List

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import valuelab
from valuelab._engine import native as _native
from valuelab.lab import reference as ref

DTYPES = [torch.float32, torch.float64]
ROOT = Path(__file__).resolve().parents[1]
INSTALLED = _native.LIBRARY  # where setup.py put the kernel (the loader fixture below points _native elsewhere)
COMPILERS = [c for c in ("gcc", "clang") if shutil.which(c)]
HAVE_COMPILER = bool(COMPILERS) or shutil.which("cc") is not None
X86_64 = platform.machine() in ("x86_64", "AMD64")
needs_kernel = pytest.mark.skipif(not _native.available(), reason=f"C kernel not available: {_native.status()}")
needs_compiler = pytest.mark.skipif(not COMPILERS, reason="no gcc or clang")


def _oracle(r, v, mask, gamma, lam, boot):
    """valuelab.lab.reference.gae_recursion on each row's valid tokens (float64), 0 elsewhere; gamma, lam rounded to the dtype."""
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



def _gae_still_right():
    """GAE on a small batch with holes matches the oracle (whichever CPU path runs)."""
    gen = torch.Generator().manual_seed(5)
    r = torch.randn(2, 40, generator=gen, dtype=torch.float64)
    v = torch.randn(2, 40, generator=gen, dtype=torch.float64)
    mask = _run_lengths_mask(2, 40, gen, 6)
    out = valuelab.gae(r, v, mask=mask, gamma=1.0, lam=0.9)
    ea, _ = _oracle(r, v, mask, 1.0, 0.9, torch.zeros(2, dtype=torch.float64))
    assert np.allclose(out.advantages.numpy(), ea, rtol=1e-12, atol=1e-12)


def _kernel_runs() -> bool:
    """Whether ``_native.scan`` runs C now (not None) on a small float64 batch."""
    r = torch.randn(2, 20, dtype=torch.float64)
    return _native.scan(r, r, None, 1.0, 0.9, None) is not None


def _results_match_the_oracle():
    """Both dtypes, holes, bootstrap: through ``valuelab.gae`` (on whatever ``_native._fn`` is) against the oracle."""
    gen = torch.Generator().manual_seed(8)
    # short runs; then long ones, whose vector blocks a streaming build aligns to cache lines
    for dtype, (B, T, run) in itertools.product(DTYPES, [(5, 333, 30), (3, 1501, 400)]):
        r = torch.randn(B, T, generator=gen, dtype=torch.float64).to(dtype)
        v = torch.randn(B, T, generator=gen, dtype=torch.float64).to(dtype)
        mask = _run_lengths_mask(B, T, gen, run)
        boot = torch.randn(B, generator=gen, dtype=torch.float64).to(dtype)
        out = valuelab.gae(r, v, mask=mask, gamma=0.99, lam=0.95, bootstrap=boot)
        ea, er = _oracle(r, v, mask, 0.99, 0.95, boot)
        tol = (4e-6 if dtype == torch.float32 else 1e-14) * _scale(r, v, boot)
        assert (np.abs(out.advantages.double().numpy() - ea) <= tol).all()
        assert (np.abs(out.returns.double().numpy() - er) <= tol).all()


# ---------------------------------------------------------------------------
# the build: at install time (setup.py), portable, every variant alike
# ---------------------------------------------------------------------------


def _setup_flags() -> List[str]:
    """``FLAGS`` of setup.py (the install build's compiler flags), read without running setup()."""
    for node in ast.parse((ROOT / "setup.py").read_text()).body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "FLAGS":
            return ast.literal_eval(node.value)
    raise AssertionError("setup.py has no FLAGS")


def _bind(monkeypatch, path: Path) -> str:
    """Make ``_native.scan`` call the kernel built at ``path`` (a test build, past the loader); its valuelab_target()."""
    lib = ctypes.CDLL(str(path))
    fn = lib.valuelab_scan
    fn.restype, fn.argtypes = ctypes.c_int, _native._ARGTYPES
    monkeypatch.setattr(_native, "_fn", fn)
    monkeypatch.setattr(_native, "_tried", True)
    monkeypatch.setattr(_native, "_enabled", True)
    target = lib.valuelab_target
    target.restype = ctypes.c_char_p
    return target().decode()


def _cpu_flags() -> List[str]:
    return open("/proc/cpuinfo").read().split() if os.path.exists("/proc/cpuinfo") else []


def _widest(max_bytes: int = 64) -> str:
    """What valuelab_target() says on this CPU for a build whose widest kernel has ``max_bytes`` vectors."""
    flags = _cpu_flags()
    if not X86_64:
        return "16-byte vectors (single target)"
    if max_bytes >= 64 and {"avx512f", "avx512vl", "fma"} <= set(flags):
        return "64-byte vectors (AVX-512)"
    if max_bytes >= 32 and {"avx2", "fma"} <= set(flags):
        return "32-byte vectors (AVX2)"
    return "16-byte vectors (baseline)"


VARIANTS = {  # name: (extra flags, what valuelab_target() says)
    "widest": ([], _widest()),
    "max-32": (["-DVALUELAB_MAX_VECTOR=32"], _widest(32)),  # the AVX2 kernel on an AVX-512 CPU
    "single-target": (["-DVALUELAB_NO_CLONES"], "16-byte vectors (single target)"),
    # every call streams its outputs (non-temporal stores, blocks aligned to cache lines): the same results,
    # with each width's own store instruction
    "streaming": (["-DVALUELAB_STREAM_BYTES=0"], _widest()),
    "streaming-max-32": (["-DVALUELAB_STREAM_BYTES=0", "-DVALUELAB_MAX_VECTOR=32"], _widest(32)),
    "streaming-single-target": (["-DVALUELAB_STREAM_BYTES=0", "-DVALUELAB_NO_CLONES"],
                                "16-byte vectors (single target)"),
}


@pytest.fixture(scope="session")
def variant_builds(tmp_path_factory):
    """Build the kernel once per (compiler, variant) with setup.py's flags, on demand."""
    folder = tmp_path_factory.mktemp("variants")
    built = {}

    def build(compiler: str, variant: str) -> Path:
        if (compiler, variant) not in built:
            out = folder / f"{compiler}-{variant}.so"
            cmd = [compiler, *_setup_flags(), "-fPIC", "-shared", *VARIANTS[variant][0], "-o", str(out),
                   str(_native.SOURCE)]
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
            assert proc.returncode == 0, proc.stderr
            assert "warning" not in proc.stderr, proc.stderr  # a clean build, with either compiler
            built[compiler, variant] = out
        return built[compiler, variant]

    return build


@needs_compiler
@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("compiler", COMPILERS)
def test_every_build_variant_gives_the_same_results(compiler, variant, variant_builds, monkeypatch):
    target = _bind(monkeypatch, variant_builds(compiler, variant))
    assert VARIANTS[variant][1] in target  # the variant asked for is the one built
    _results_match_the_oracle()


def test_the_install_build_is_portable():
    flags = _setup_flags()
    assert "-O3" in flags and "-ffp-contract=fast" in flags
    assert not any(f.startswith(("-march", "-mtune", "-mcpu")) for f in flags)  # the built file may run elsewhere


@needs_kernel
def test_the_installed_kernel_runs_the_best_clone_this_cpu_has():
    assert _native.status().startswith(f"C kernel ({_widest()}; threads: ")


@needs_kernel
@pytest.mark.skipif(sys.platform != "linux", reason="libgomp and /proc/self/maps")
def test_the_installed_kernel_shares_pytorchs_openmp_runtime():
    # built with -fopenmp (setup.py's first try, which works with gcc here): the kernel's threads are
    # PyTorch's, so one libgomp is mapped, the one torch loaded, not a second runtime beside it
    if "OpenMP" not in _native.status():
        pytest.skip(f"built without OpenMP: {_native.status()}")
    code = ("import torch, valuelab._engine.native as n; assert n.available(); "
            "print(sorted({l.split()[-1] for l in open('/proc/self/maps') if 'libgomp' in l}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    mapped = ast.literal_eval(out.stdout.strip())
    assert len(mapped) == 1 and Path(mapped[0]).parent == Path(torch.__file__).parent / "lib", mapped


def _setup_build_ext(tmp_path: Path, cc: str):
    """``python setup.py build_ext`` into tmp_path with ``CC=cc`` and umask 002; (process, built libraries)."""
    env = dict(os.environ, CC=cc)
    proc = subprocess.run(
        [sys.executable, "setup.py", "build_ext", "--build-lib", str(tmp_path / "lib"),
         "--build-temp", str(tmp_path / "temp")],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, preexec_fn=lambda: os.umask(0o002),
    )
    return proc, sorted((tmp_path / "lib").rglob("_gae_kernel*"))


@pytest.mark.parametrize("cc", ["false", "true"])  # a compiler that fails; one that succeeds and writes nothing
def test_an_install_without_a_working_compiler_succeeds_without_the_kernel(tmp_path, cc):
    if shutil.which(cc) is None:
        pytest.skip(f"no {cc} command")
    proc, built = _setup_build_ext(tmp_path, shutil.which(cc))
    assert proc.returncode == 0, proc.stderr
    assert built == []
    assert "C kernel was not built" in proc.stdout + proc.stderr


@needs_compiler
@pytest.mark.parametrize("compiler", COMPILERS)
def test_the_install_build_loads_and_is_writable_by_its_owner_only(tmp_path, compiler, monkeypatch):
    proc, built = _setup_build_ext(tmp_path, compiler)
    assert proc.returncode == 0, proc.stderr
    assert [p.name for p in built] == [INSTALLED.name]
    assert built[0].stat().st_mode & 0o022 == 0  # built under umask 002: setup.py took the group's w bit away
    lib = ctypes.CDLL(str(built[0]))
    lib.valuelab_source_sha256.restype = ctypes.c_char_p
    assert lib.valuelab_source_sha256().decode() == hashlib.sha256(_native.SOURCE.read_bytes()).hexdigest()
    _bind(monkeypatch, built[0])
    _results_match_the_oracle()


@pytest.mark.skipif(not HAVE_COMPILER, reason="no C compiler on this machine: the PyTorch path is the CPU path")
def test_kernel_is_built_where_a_compiler_exists():
    assert _native.available(), _native.status()  # if this fails after editing the C file: pip install -e .
    assert _native.status().startswith("C kernel")
    assert _native.library_path() == INSTALLED
    assert INSTALLED.parent == Path(valuelab.__file__).resolve().parent / "_engine"  # inside the package, nowhere else


# ---------------------------------------------------------------------------
# the loader: only the package's own library, only when it can be trusted
# ---------------------------------------------------------------------------


@pytest.fixture
def loader(monkeypatch, tmp_path):
    """A process that has not loaded the kernel yet and looks for it at the returned path (in a 0755 folder).

    Every piece of the loader's state is restored after the test.
    """
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    os.chmod(pkg, 0o755)
    for name, value in (("_fn", None), ("_path", None), ("_tried", False), ("_status", "not loaded yet"),
                        ("_warned", False), ("_enabled", True)):
        monkeypatch.setattr(_native, name, value)
    target = pkg / INSTALLED.name
    monkeypatch.setattr(_native, "LIBRARY", target)
    return target


def _plant(target: Path, mode: int = 0o755) -> Path:
    """A copy of the installed kernel at ``target``."""
    if not INSTALLED.exists():
        pytest.skip("the kernel is not built here")
    shutil.copyfile(INSTALLED, target)
    os.chmod(target, mode)
    return target


def _refused(*words: str) -> None:
    """The loader refused: nothing loaded, the status names the reason, the PyTorch path gives the right answer."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert not _native.available()
        assert not _kernel_runs()
        _gae_still_right()
    assert _native.library_path() is None
    status = _native.status()
    assert status.endswith("PyTorch block scan")
    for w in words:
        assert w in status, status


def test_a_planted_copy_of_the_kernel_loads(loader):
    # the control for every refusal below: the same file, trusted, loads
    _plant(loader)
    assert _native.available(), _native.status()
    assert _native.library_path() == loader and _kernel_runs()
    _gae_still_right()


@pytest.mark.parametrize("mode", [0o775, 0o757, 0o777])
def test_a_group_or_world_writable_library_is_refused(loader, mode):
    _plant(loader, mode)
    _refused("refused", "writable", str(loader), "chmod go-w")


@pytest.mark.parametrize("mode", [0o775, 0o777, 0o1777])  # 1777: like /tmp
def test_a_library_in_a_group_or_world_writable_folder_is_refused(loader, mode):
    _plant(loader)
    os.chmod(loader.parent, mode)
    _refused("refused", "writable", str(loader.parent))


def test_a_link_to_a_library_in_a_world_writable_folder_is_refused(loader, tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    real = _plant(shared / "kernel.so")
    os.chmod(shared, 0o1777)
    loader.symlink_to(real)
    _refused("refused", str(shared))


def test_a_link_to_a_library_in_a_private_folder_loads(loader, tmp_path):
    private = tmp_path / "private"
    private.mkdir()
    os.chmod(private, 0o755)
    loader.symlink_to(_plant(private / "kernel.so"))
    assert _native.available(), _native.status()


def _stat_as(monkeypatch, owners):
    """Make the loader's stat report ``owners[path]`` as the owner of each path in ``owners``."""
    real_stat = os.stat

    def fake(path, *args, **kwargs):
        st = real_stat(path, *args, **kwargs)
        uid = owners.get(Path(path))
        if uid is None:
            return st
        fields = list(st[:10])
        fields[4] = uid  # st_uid
        return os.stat_result(fields)

    monkeypatch.setattr(_native, "_stat", fake)


@pytest.mark.parametrize("which", ["library", "folder"])
def test_a_library_owned_by_another_user_is_refused(loader, monkeypatch, which):
    _plant(loader)
    me = os.getuid()
    stranger = 4321 if me != 4321 else 4322
    _stat_as(monkeypatch, {loader if which == "library" else loader.parent: stranger})
    _refused("refused", f"owned by uid {stranger}", f"uid {me}")


@pytest.mark.parametrize("owner", ["root", "this user"])
def test_a_library_owned_by_root_or_this_user_loads(loader, monkeypatch, owner):
    _plant(loader)
    monkeypatch.setattr(_native.os, "getuid", lambda: 4321)
    uid = 0 if owner == "root" else 4321
    _stat_as(monkeypatch, {loader: uid, loader.parent: uid})
    assert _native.available(), _native.status()


@needs_compiler
def test_a_library_without_the_entry_point_is_refused_and_stays_refused(loader, tmp_path):
    src = tmp_path / "other.c"
    src.write_text("int something_else(void) { return 1; }\n")
    subprocess.run([COMPILERS[0], "-shared", "-fPIC", "-o", str(loader), str(src)], check=True, timeout=120)
    os.chmod(loader, 0o755)
    _refused("lacks an entry point", "valuelab_scan")
    for _ in range(3):  # no AttributeError, no second try: the same answer every call
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            assert not _kernel_runs()
    assert _native._tried and _native._fn is None


@pytest.mark.parametrize("content", [b"", b"\x7fELF but not really a library"])  # CC=/bin/true left empty files
def test_a_file_that_is_not_a_library_is_refused(loader, content):
    loader.write_bytes(content)
    os.chmod(loader, 0o755)
    _refused("does not load")


def test_a_library_built_from_another_source_is_refused(loader, monkeypatch, tmp_path):
    _plant(loader)
    edited = tmp_path / "_gae_kernel.c"
    edited.write_bytes(_native.SOURCE.read_bytes() + b"/* edited after the build */\n")
    monkeypatch.setattr(_native, "SOURCE", edited)
    _refused("built from another version", "pip install")


def test_nothing_is_compiled_or_read_from_a_cache_at_run_time(loader, monkeypatch, tmp_path):
    # the old loader compiled into $VALUELAB_CACHE_DIR, ~/.cache/valuelab or /tmp/valuelab-<uid> and loaded from there
    cache, tmp = tmp_path / "cache", tmp_path / "tmp"
    for folder in (cache / "valuelab", cache, tmp / f"valuelab-{os.getuid()}"):
        folder.mkdir(parents=True, exist_ok=True)
        if INSTALLED.exists():
            shutil.copyfile(INSTALLED, folder / "gae_kernel-0123456789abcdef.so")
    monkeypatch.setenv("VALUELAB_CACHE_DIR", str(cache))
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))

    def no_compiler(*args, **kwargs):
        raise AssertionError(f"a process was started at run time: {args}")

    monkeypatch.setattr(subprocess, "run", no_compiler)
    monkeypatch.setattr(subprocess, "Popen", no_compiler)
    _refused("not built")
    assert not loader.exists()


def test_loading_from_many_threads_at_once_gives_one_answer(loader):
    _plant(loader)
    answers, start = [], threading.Barrier(8)

    def worker():
        start.wait()
        answers.append(_kernel_runs())

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert answers == [True] * 8


# ---------------------------------------------------------------------------
# the warning: once per process, only for a missing or refused kernel
# ---------------------------------------------------------------------------


def _batch():
    gen = torch.Generator().manual_seed(11)
    return torch.randn(3, 50, generator=gen), torch.randn(3, 50, generator=gen)


def _our_warnings(record):
    return [w for w in record if "valuelab" in str(w.message) and "PyTorch block scan" in str(w.message)]


def test_a_missing_kernel_warns_once_at_the_callers_line(loader):
    r, v = _batch()
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        valuelab.gae(r, v, gamma=1.0, lam=0.95)
        valuelab.gae(r, v, gamma=0.9, lam=0.5)
        valuelab.discounted_returns(r, gamma=0.9)
    ours = _our_warnings(record)
    assert len(ours) == 1, [str(w.message) for w in record]
    assert ours[0].category is UserWarning
    assert "not built" in str(ours[0].message)
    assert ours[0].filename == __file__  # it points at the user's call, not into valuelab


def test_a_refused_kernel_warns_once(loader):
    _plant(loader, 0o777)
    r, v = _batch()
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        for _ in range(3):
            valuelab.gae(r, v, gamma=1.0, lam=0.95)
    ours = _our_warnings(record)
    assert len(ours) == 1 and "refused" in str(ours[0].message)


def test_no_warning_when_switched_off_or_off_the_cpu(loader):
    r, v = _batch()
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        with _native.disabled():
            valuelab.gae(r, v, gamma=1.0, lam=0.95)
        meta = torch.empty(3, 50, device="meta")  # any non-CPU tensor: what a GPU batch does
        assert _native.scan(meta, meta, None, 1.0, 0.95, None) is None
        if torch.cuda.is_available():
            valuelab.gae(r.cuda(), v.cuda(), gamma=1.0, lam=0.95)
    assert _our_warnings(record) == [] and not _native._warned


def test_no_warning_when_the_kernel_loads(loader):
    _plant(loader)
    r, v = _batch()
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        valuelab.gae(r, v, gamma=1.0, lam=0.95)
    assert _our_warnings(record) == []


# ---------------------------------------------------------------------------
# switches and the command line
# ---------------------------------------------------------------------------


def test_environment_switch_turns_the_kernel_off():
    code = "from valuelab._engine import native as _native; print(_native.status())"
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



def test_widths_fill_64_32_and_16_byte_vectors():
    # the widths the chapter's SymPy proof uses are the kernel's, read from its source
    assert _native.widths() == {torch.float32: (16, 8, 4), torch.float64: (8, 4, 2)}
    for dt, ws in _native.widths().items():
        assert [w * torch.tensor([], dtype=dt).element_size() for w in ws] == [64, 32, 16]


@needs_kernel
def test_lanes_are_the_width_this_cpu_runs():
    size = int(_widest().split("-")[0])
    assert _native.lanes() == {torch.float32: size // 4, torch.float64: size // 8}


def _info(env=None, code=None):
    """``python -m valuelab info`` (or ``code`` run the same way) in a fresh process: (return code, name -> value)."""
    cmd = [sys.executable, "-m", "valuelab", "info"] if code is None else [sys.executable, "-c", code]
    proc = subprocess.run(cmd, env=dict(os.environ, **(env or {})), capture_output=True, text=True, timeout=300)
    return proc.returncode, dict(line.split(": ", 1) for line in proc.stdout.splitlines() if ": " in line)


def test_info_prints_the_versions_the_path_and_the_widths():
    rc, lines = _info()
    assert rc == 0
    assert lines["valuelab"] == valuelab.__version__
    assert lines["torch"] == torch.__version__
    assert lines["CPU path"] == _native.status()
    assert lines["library"] == (str(INSTALLED) if _native.available() else "none loaded")
    size = int(_widest().split("-")[0]) if _native.available() else None
    if size is None:
        assert lines["vector width"] == "none (the C kernel is not loaded)"
    else:
        assert lines["vector width float32"] == f"{size // 4} lanes ({size} bytes)"
        assert lines["vector width float64"] == f"{size // 8} lanes ({size} bytes)"


def test_info_when_switched_off():
    rc, lines = _info(env={"VALUELAB_NATIVE": "0"})
    assert rc == 0 and lines["CPU path"] == "C kernel switched off: PyTorch block scan"


def test_info_when_the_kernel_is_missing(tmp_path):
    code = ("import sys; from pathlib import Path; from valuelab._engine import native as _native; "
            f"_native.LIBRARY = Path({str(tmp_path / 'none.so')!r}); "
            "from valuelab.__main__ import main; sys.exit(main(['info']))")
    rc, lines = _info(code=code)
    assert rc == 0
    assert "not built" in lines["CPU path"] and lines["library"] == "none loaded"


# ---------------------------------------------------------------------------
# the kernel's persistent thread pool: reused, shared between Python threads, safe across fork
# ---------------------------------------------------------------------------


def _pool_batch(seed: int = 11):
    gen = torch.Generator().manual_seed(seed)
    r = torch.randn(16, 700, generator=gen)
    v = torch.randn(16, 700, generator=gen)
    return r, v, _run_lengths_mask(16, 700, gen, 60)


@needs_kernel
def test_the_pool_is_reused_and_shared_between_python_threads(monkeypatch):
    import threading

    r, v, mask = _pool_batch()
    one = valuelab.gae(r, v, mask=mask, gamma=1.0, lam=0.95)  # one thread
    monkeypatch.setattr(_native, "_PARALLEL_GRAIN", 1)
    torch_threads = torch.get_num_threads()
    torch.set_num_threads(3)
    results, errors = [], []

    def work():
        try:
            for _ in range(50):  # concurrent callers: one gets the pool, the others run their rows alone
                out = valuelab.gae(r, v, mask=mask, gamma=1.0, lam=0.95)
                results.append(torch.equal(out.advantages, one.advantages) and torch.equal(out.returns, one.returns))
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    try:
        threads = [threading.Thread(target=work) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        assert not any(t.is_alive() for t in threads), "a caller hung in the kernel's pool"
    finally:
        torch.set_num_threads(torch_threads)
    assert not errors and len(results) == 200 and all(results)


def _child_gae(q) -> None:
    r, v, mask = _pool_batch()
    _native._PARALLEL_GRAIN = 1
    torch.set_num_threads(2)
    out = valuelab.gae(r, v, mask=mask, gamma=1.0, lam=0.95)
    q.put((out.advantages.numpy().tobytes(), out.returns.numpy().tobytes()))


@needs_kernel
@pytest.mark.skipif(sys.platform != "linux", reason="fork start method")
def test_a_forked_child_gets_the_same_bits(monkeypatch):
    # the child has none of the parent's workers: its calls must neither hang nor differ (a call whose
    # helpers never come scans every chunk on its own thread; pthread_atfork gives the child fresh ones)
    import multiprocessing as mp

    r, v, mask = _pool_batch()
    monkeypatch.setattr(_native, "_PARALLEL_GRAIN", 1)
    torch_threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        expect = valuelab.gae(r, v, mask=mask, gamma=1.0, lam=0.95)  # the parent's pool now has a worker
    finally:
        torch.set_num_threads(torch_threads)
    ctx = mp.get_context("fork")  # the child inherits the pool's state, not its threads
    q = ctx.Queue()
    p = ctx.Process(target=_child_gae, args=(q,))
    p.start()
    got = q.get(timeout=120)
    p.join(timeout=60)
    assert p.exitcode == 0
    assert got == (expect.advantages.numpy().tobytes(), expect.returns.numpy().tobytes())


@needs_compiler
@pytest.mark.parametrize("variant", ["widest", "streaming", "streaming-max-32", "streaming-single-target"])
def test_a_non_finite_input_anywhere_in_a_long_row_clears_the_finite_flag(variant, variant_builds, monkeypatch):
    """The kernel sums only the returns of valid tokens (and the inputs of masked ones): a NaN or an infinity at
    any position, valid (first or last of a run, inside a vector block) or masked, still clears its flag, and
    ``valuelab.gae`` names the argument; finite inputs leave the flag set."""
    _bind(monkeypatch, variant_builds(COMPILERS[0], variant))
    gen = torch.Generator().manual_seed(11)
    B, T = 2, 700
    for dtype in DTYPES:
        r = torch.randn(B, T, generator=gen, dtype=torch.float64).to(dtype)
        v = torch.randn(B, T, generator=gen, dtype=torch.float64).to(dtype)
        mask = _run_lengths_mask(B, T, gen, 200)
        # lam > 0 and lam = 0 (c = 0: the shifts of the vector scan still carry a NaN, as 0 * NaN is NaN)
        for lam in (0.95, 0.0):
            assert _native.scan(r, v, mask, 0.99, 0.99 * lam, None)[2] is True
            for name, bad, pos in itertools.product(("rewards", "values"), (math.nan, math.inf, -math.inf),
                                                    range(0, T, 23)):
                r2, v2 = r.clone(), v.clone()
                (r2 if name == "rewards" else v2)[1, pos] = bad
                assert _native.scan(r2, v2, mask, 0.99, 0.99 * lam, None)[2] is False, (name, bad, pos, lam)
                with pytest.raises(ValueError, match=name):
                    valuelab.gae(r2, v2, mask=mask, gamma=0.99, lam=lam)
