"""Odd tensors at the C boundary: ``valuelab._engine.native.scan`` directly, and ``valuelab.gae`` / ``discounted_returns`` on both CPU paths.

``_native.scan`` hands raw pointers to ``_gae_kernel.c`` (chapter 9, "One
pass in C"), so every tensor must be what the pointer's reader assumes: a
dense, contiguous CPU array of the right dtype and shape whose memory is
alive. PyTorch has tensors that are not: views with the negative bit
(``torch._neg_view``, ``complex.conj().imag``: memory holds ``-x``), zero
tensors (``torch._efficientzerotensor``: no memory at all), freed storages
(``untyped_storage().resize_(0)``, as FSDP does), strided and expanded
views, bool tensors holding bytes other than 0 and 1. Each case is checked
on ``scan`` itself (the same kernel on a cleaned-up copy gives the same
bits, or the error names the argument) and through the public functions on
both CPU paths (``cpu_path``: the C kernel, then the PyTorch block scan);
public calls that could crash PyTorch itself (freed storage) run in a
separate process.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import warnings
from typing import Dict, List, Optional

import pytest
import torch

import valuelab
from valuelab._engine import native as _native

DTYPES = [torch.float32, torch.float64]
B, T = 4, 70  # T: four vectors of 16 float32 tokens and a tail; the mask has holes
ARGS = ["rewards", "values", "bootstrap"]
needs_kernel = pytest.mark.skipif(not _native.available(), reason=f"C kernel not available: {_native.status()}")


def _data(dtype: torch.dtype, seed: int = 0) -> Dict[str, torch.Tensor]:
    """Rewards, values, a mask with holes (and a fully masked and a fully valid row), a bootstrap."""
    gen = torch.Generator().manual_seed(seed)
    mask = torch.rand(B, T, generator=gen) < 0.7
    mask[0] = True
    mask[1] = False
    mask[2, 20:45] = True
    return {
        "rewards": torch.randn(B, T, generator=gen, dtype=torch.float64).to(dtype),
        "values": torch.randn(B, T, generator=gen, dtype=torch.float64).to(dtype),
        "mask": mask,
        "bootstrap": torch.randn(B, generator=gen, dtype=torch.float64).to(dtype),
    }


def _scan(d: Dict[str, object], gae: bool = True):
    """``_native.scan`` on the arguments in ``d`` (γ = 0.99, λ = 0.95)."""
    c = 0.99 * 0.95 if gae else 0.99
    return _native.scan(d["rewards"], d["values"] if gae else None, d["mask"], 0.99, c, d["bootstrap"])


def _same(a, b) -> None:
    """Two scan results are the same bits."""
    assert a is not None and b is not None
    (aa, ar, af), (ba, br, bf) = a, b
    assert af == bf
    assert torch.equal(ar, br)
    assert (aa is None and ba is None) or torch.equal(aa, ba)


def _public(d: Dict[str, object], gae: bool = True):
    """``valuelab.gae`` (advantages, returns) or ``valuelab.discounted_returns`` (returns) on ``d``."""
    if gae:
        out = valuelab.gae(d["rewards"], d["values"], mask=d["mask"], gamma=0.99, lam=0.95, bootstrap=d["bootstrap"])
        return out.advantages, out.returns
    return (valuelab.discounted_returns(d["rewards"], mask=d["mask"], gamma=0.99, bootstrap=d["bootstrap"]),)


def _public_same(a, b) -> None:
    for x, y in zip(a, b):
        assert x.dtype == y.dtype and x.shape == y.shape
        assert torch.equal(x, y)


def _with(d: Dict[str, object], name: str, x: object) -> Dict[str, object]:
    return {**d, name: x}


# ---------------------------------------------------------------------------
# odd views that must be resolved: negative bit, conjugate views, zero tensors, strides
# ---------------------------------------------------------------------------


def _neg_view(x: torch.Tensor) -> torch.Tensor:
    """A tensor equal to ``x`` whose memory holds ``-x`` and whose negative bit is set."""
    y = torch._neg_view((-x).contiguous())
    assert y.is_neg() and torch.equal(y.resolve_neg(), x)
    return y


def _conj_imag(x: torch.Tensor) -> torch.Tensor:
    """``complex.conj().imag`` equal to ``x``: a strided view with the negative bit."""
    c = torch.complex(torch.zeros_like(x), -x)
    y = c.conj().imag
    assert y.is_neg() and not y.is_contiguous() and torch.equal(y.resolve_neg(), x)
    return y


def _conj_real(x: torch.Tensor) -> torch.Tensor:
    """``complex.conj().real`` equal to ``x``: strided, no negative bit (conjugation leaves the real part)."""
    c = torch.complex(x, torch.ones_like(x))
    y = c.conj().real
    assert not y.is_neg() and not y.is_contiguous() and torch.equal(y, x)
    return y


VIEWS = {"neg_view": _neg_view, "conj_imag": _conj_imag, "conj_real": _conj_real}


@needs_kernel
@pytest.mark.parametrize("gae", [True, False], ids=["gae", "returns"])
@pytest.mark.parametrize("view", list(VIEWS))
@pytest.mark.parametrize("name", ARGS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_scan_resolves_negative_and_conjugate_views(dtype, name, view, gae):
    d = _data(dtype)
    if name == "values" and not gae:
        pytest.skip("no values in the Monte-Carlo return")
    odd = _with(d, name, VIEWS[view](d[name]))
    _same(_scan(odd, gae), _scan(d, gae))
    assert not torch.equal(_scan(_with(d, name, -d[name]), gae)[1], _scan(d, gae)[1])  # the sign is visible


@pytest.mark.parametrize("gae", [True, False], ids=["gae", "returns"])
@pytest.mark.parametrize("view", list(VIEWS))
@pytest.mark.parametrize("name", ARGS)
def test_public_functions_resolve_negative_and_conjugate_views(cpu_path, name, view, gae):
    d = _data(torch.float32, seed=1)
    if name == "values" and not gae:
        pytest.skip("no values in the Monte-Carlo return")
    _public_same(_public(_with(d, name, VIEWS[view](d[name])), gae), _public(d, gae))


def test_pytorch_puts_no_conjugate_bit_on_a_real_tensor():
    # why _native._for_c's fast path need not ask is_conj(): the dtypes it accepts are real
    x = torch.randn(3, 4)
    assert not x.conj().is_conj()
    with pytest.raises(RuntimeError):
        torch._C._set_conj(x, True)


def _zero(x: torch.Tensor) -> torch.Tensor:
    z = torch._efficientzerotensor(x.shape, dtype=x.dtype)
    assert z._is_zerotensor()
    return z


@needs_kernel
@pytest.mark.parametrize("gae", [True, False], ids=["gae", "returns"])
@pytest.mark.parametrize("name", ARGS + ["mask"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_scan_reads_a_zero_tensor_as_zeros(dtype, name, gae):
    d = _data(dtype)
    if name == "values" and not gae:
        pytest.skip("no values in the Monte-Carlo return")
    _same(_scan(_with(d, name, _zero(d[name])), gae), _scan(_with(d, name, torch.zeros_like(d[name])), gae))


@pytest.mark.parametrize("gae", [True, False], ids=["gae", "returns"])
@pytest.mark.parametrize("name", ARGS + ["mask"])
def test_public_functions_read_a_zero_tensor_as_zeros(cpu_path, name, gae):
    d = _data(torch.float64, seed=2)
    if name == "values" and not gae:
        pytest.skip("no values in the Monte-Carlo return")
    _public_same(_public(_with(d, name, _zero(d[name])), gae), _public(_with(d, name, torch.zeros_like(d[name])), gae))


def _strided(x: torch.Tensor, how: str) -> torch.Tensor:
    """A non-contiguous view: ``x`` in column-major memory, ``x`` in every other element, or x's first entries expanded (stride 0)."""
    if how == "transposed":
        if x.dim() == 1:
            pytest.skip("a 1-D tensor has no transpose")
        y = x.t().contiguous().t()
        assert torch.equal(y, x)
    elif how == "every_other":
        big = torch.zeros((*x.shape[:-1], 2 * x.shape[-1]), dtype=x.dtype)
        big[..., ::2] = x
        y = big[..., ::2]
        assert torch.equal(y, x)
    else:
        y = x[:1].expand(x.shape)
        assert 0 in y.stride()
    assert not y.is_contiguous()
    return y


@needs_kernel
@pytest.mark.parametrize("how", ["transposed", "every_other", "expanded"])
@pytest.mark.parametrize("name", ARGS + ["mask"])
def test_scan_copies_strided_views(name, how):
    d = _data(torch.float32)
    odd = _with(d, name, _strided(d[name], how))
    _same(_scan(odd), _scan(_with(d, name, odd[name].contiguous())))


@pytest.mark.parametrize("gae", [True, False], ids=["gae", "returns"])
@pytest.mark.parametrize("how", ["transposed", "every_other", "expanded"])
@pytest.mark.parametrize("name", ARGS + ["mask"])
def test_public_functions_read_strided_views(cpu_path, name, how, gae):
    d = _data(torch.float32, seed=3)
    if name == "values" and not gae:
        pytest.skip("no values in the Monte-Carlo return")
    odd = _with(d, name, _strided(d[name], how))
    _public_same(_public(odd, gae), _public(_with(d, name, odd[name].contiguous()), gae))


# ---------------------------------------------------------------------------
# a bool mask whose bytes are not 0 and 1
# ---------------------------------------------------------------------------


def _odd_bool_mask(seed: int = 0) -> torch.Tensor:
    """A bool (B, T) mask whose bytes are 0, 1, 2, 127 and 255, with runs of 8+ equal nonzero bytes (the kernel reads 8 at a time)."""
    gen = torch.Generator().manual_seed(seed)
    raw = torch.tensor([0, 1, 2, 127, 255], dtype=torch.uint8)[torch.randint(0, 5, (B, T), generator=gen)]
    raw[0] = 2  # a whole row of 2s: valid everywhere
    raw[1, :32] = 255
    raw[1, 32:] = 0
    raw[2, 8:24] = torch.tensor([1, 2] * 8, dtype=torch.uint8)
    m = raw.view(torch.bool)
    assert m.dtype == torch.bool and int(m.view(torch.uint8).max()) > 1
    return m


def _canonical(m: torch.Tensor) -> torch.Tensor:
    """The same mask with bytes 0 and 1 only: True where the byte is nonzero."""
    return m.view(torch.uint8) != 0


def test_the_kernel_reads_a_mask_byte_as_byte_nonzero():
    m = _odd_bool_mask()
    assert set(m.view(torch.uint8).unique().tolist()) == {0, 1, 2, 127, 255}
    assert bool(_canonical(m)[0].all()) and int(_canonical(m)[1].sum()) == 32


@needs_kernel
@pytest.mark.parametrize("gae", [True, False], ids=["gae", "returns"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_scan_treats_any_nonzero_mask_byte_as_true(dtype, gae):
    d = _data(dtype)
    m = _odd_bool_mask()
    got = _scan(_with(d, "mask", m), gae)
    _same(got, _scan(_with(d, "mask", _canonical(m)), gae))
    assert bool((got[1][~_canonical(m)] == 0).all())  # masked tokens: exactly 0


@pytest.mark.parametrize("gae", [True, False], ids=["gae", "returns"])
def test_public_functions_treat_any_nonzero_mask_byte_as_true(cpu_path, gae):
    d = _data(torch.float64, seed=4)
    m = _odd_bool_mask(seed=1)
    _public_same(_public(_with(d, "mask", m), gae), _public(_with(d, "mask", _canonical(m)), gae))


# ---------------------------------------------------------------------------
# freed and too-small storage: an error naming the argument, never a read
# ---------------------------------------------------------------------------


def _freed(x: torch.Tensor, keep_bytes: int = 0) -> torch.Tensor:
    """A copy of ``x`` whose storage is then shrunk to ``keep_bytes`` (0: freed, as FSDP frees a shard)."""
    y = x.clone()
    y.untyped_storage().resize_(keep_bytes)
    return y


@needs_kernel
@pytest.mark.parametrize("name", ARGS + ["mask"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_scan_refuses_a_freed_storage(dtype, name):
    d = _data(dtype)
    with pytest.raises(ValueError, match=rf"^{name}: its storage has been freed \(size 0\)"):
        _scan(_with(d, name, _freed(d[name])))


@needs_kernel
@pytest.mark.parametrize("name", ARGS + ["mask"])
def test_scan_refuses_a_storage_smaller_than_its_view(name):
    d = _data(torch.float64)
    x = d[name]
    with pytest.raises(ValueError, match=rf"^{name}: its storage holds 8 bytes but the view needs"):
        _scan(_with(d, name, _freed(x, keep_bytes=8)))
    offset = torch.cat([torch.zeros(1, dtype=x.dtype), x.reshape(-1)])[1:].view(x.shape)  # storage_offset 1
    offset.untyped_storage().resize_(x.numel() * x.element_size())  # one element short at the end
    with pytest.raises(ValueError, match=rf"^{name}: its storage holds"):
        _scan(_with(d, name, offset))


@needs_kernel
def test_scan_accepts_a_freed_storage_of_an_empty_tensor():
    # nothing to read: a (0, T) batch with freed storages is fine
    x = _freed(torch.zeros(0, T))
    adv, ret, finite = _native.scan(x, x, None, 1.0, 0.9, _freed(torch.zeros(0)))
    assert adv.shape == ret.shape == (0, T) and finite


_FREED_SCRIPT = textwrap.dedent(
    """
    import json, sys, torch, valuelab
    from valuelab._engine import native as _native
    cases = json.loads(sys.argv[1])
    for case in cases:
        print(json.dumps({"start": case}), flush=True)
        fn, name, path = case
        gen = torch.Generator().manual_seed(0)
        d = {"rewards": torch.randn(3, 40, generator=gen), "values": torch.randn(3, 40, generator=gen),
             "mask": torch.rand(3, 40, generator=gen) < 0.8, "bootstrap": torch.randn(3, generator=gen)}
        d[name] = d[name].clone()
        d[name].untyped_storage().resize_(0)
        try:
            with (_native.disabled() if path == "pytorch" else torch.no_grad()):
                if fn == "gae":
                    valuelab.gae(d["rewards"], d["values"], mask=d["mask"], gamma=0.99, lam=0.95,
                                 bootstrap=d["bootstrap"])
                else:
                    valuelab.discounted_returns(d["rewards"], mask=d["mask"], gamma=0.99, bootstrap=d["bootstrap"])
            out = {"error": None}
        except Exception as e:
            out = {"error": type(e).__name__, "message": str(e)}
        print(json.dumps({"done": case, **out}), flush=True)
    """
)
_FREED_CASES = [[fn, name, path] for fn in ("gae", "discounted_returns") for name in ("rewards", "values", "mask", "bootstrap")
                for path in ("c-kernel", "pytorch") if not (fn == "discounted_returns" and name == "values")]


@pytest.fixture(scope="module")
def freed_results() -> Dict[tuple, dict]:
    """Every public freed-storage case, run in child processes: a case that crashes the child is recorded as such."""
    results: Dict[tuple, dict] = {}
    todo: List[list] = list(_FREED_CASES)
    while todo:
        proc = subprocess.run([sys.executable, "-c", _FREED_SCRIPT, json.dumps(todo)], capture_output=True,
                              text=True, timeout=600)
        started: Optional[list] = None
        for line in proc.stdout.splitlines():
            rec = json.loads(line)
            if "start" in rec:
                started = rec["start"]
            else:
                results[tuple(rec.pop("done"))] = rec
                started = None
        if started is not None:  # the child died inside this case
            results[tuple(started)] = {"error": "crash", "message": f"exit code {proc.returncode}: {proc.stderr[-500:]}"}
        todo = [c for c in todo if tuple(c) not in results]
        if started is None and todo:
            raise AssertionError(f"the child stopped early (exit code {proc.returncode}): {proc.stderr[-2000:]}")
    return results


@pytest.mark.parametrize("case", _FREED_CASES, ids=["-".join(c) for c in _FREED_CASES])
def test_public_functions_refuse_a_freed_storage(case, freed_results):
    fn, name, path = case
    if path == "c-kernel" and not _native.available():
        pytest.skip(f"C kernel not available here: {_native.status()}")
    rec = freed_results[tuple(case)]
    assert rec["error"] == "ValueError", rec
    assert rec["message"].startswith(name), rec["message"]


# ---------------------------------------------------------------------------
# what the caller must get right: types, dtypes, shapes, devices (scan checks them again)
# ---------------------------------------------------------------------------


WRONG_DTYPES = [
    ("rewards", torch.float16), ("rewards", torch.int64), ("rewards", torch.bool),
    ("values", torch.float64), ("values", torch.int32),
    ("mask", torch.uint8), ("mask", torch.float32),
    ("bootstrap", torch.float64), ("bootstrap", torch.float16),
]


@needs_kernel
@pytest.mark.parametrize("name,dtype", WRONG_DTYPES)
def test_scan_refuses_a_wrong_dtype(name, dtype):
    d = _data(torch.float32)
    with pytest.raises(TypeError, match=rf"^{name}: "):
        _scan(_with(d, name, d[name].to(dtype)))


WRONG_SHAPES = [
    ("rewards", (T,)), ("rewards", (B, T, 1)),
    ("values", (B, T + 1)), ("values", (B * T,)), ("values", (B + 1, T)),
    ("mask", (B, T - 1)), ("mask", (T,)),
    ("bootstrap", (B + 1,)), ("bootstrap", (B, 1)), ("bootstrap", ()),
]


@needs_kernel
@pytest.mark.parametrize("name,shape", WRONG_SHAPES)
def test_scan_refuses_a_wrong_shape(name, shape):
    d = _data(torch.float32)
    x = d[name]
    odd = torch.zeros(shape, dtype=x.dtype)
    with pytest.raises(ValueError, match=rf"^{name}: shape"):
        if name == "rewards":  # values and mask then follow the odd rewards' shape where they can
            _native.scan(odd, None, None, 0.99, 0.99, None)
        else:
            _scan(_with(d, name, odd))


@needs_kernel
@pytest.mark.parametrize("name", ["values", "mask", "bootstrap"])
def test_scan_refuses_a_tensor_on_another_device(name):
    d = _data(torch.float32)
    with pytest.raises(ValueError, match=rf"^{name}: on meta"):
        _scan(_with(d, name, d[name].to("meta")))


@needs_kernel
@pytest.mark.parametrize("name", ARGS + ["mask"])
def test_scan_refuses_what_is_not_a_tensor(name):
    d = _data(torch.float32)
    with pytest.raises(TypeError, match=rf"^{name}: expected a torch.Tensor, got list"):
        _scan(_with(d, name, d[name].tolist()))


@needs_kernel
@pytest.mark.parametrize("name", ARGS + ["mask"])
def test_scan_refuses_a_sparse_tensor(name):
    d = _data(torch.float32)
    with pytest.raises(TypeError, match=rf"^{name}: layout torch.sparse_coo"):
        _scan(_with(d, name, d[name].to_sparse()))


@needs_kernel
@pytest.mark.parametrize("layout", [torch.strided, torch.jagged])
@pytest.mark.parametrize("name", ARGS + ["mask"])
def test_scan_refuses_a_nested_tensor(name, layout):
    d = _data(torch.float32)
    rows = list(d[name].unsqueeze(-1) if name == "bootstrap" else d[name])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # PyTorch's: nested tensors are a prototype
        nested = torch.nested.nested_tensor(rows, layout=layout)
    assert nested.is_nested
    with pytest.raises(TypeError, match=rf"^{name}: a nested tensor"):
        _scan(_with(d, name, nested))


def test_scan_leaves_non_cpu_rewards_to_the_pytorch_path():
    d = _data(torch.float32)
    assert _scan(_with(d, "rewards", d["rewards"].to("meta"))) is None
    if torch.cuda.is_available():
        assert _scan({k: v.cuda() for k, v in d.items()}) is None


class _Sub(torch.Tensor):
    """A tensor subclass: it may override anything, so C never reads it."""


@needs_kernel
@pytest.mark.parametrize("name", ARGS + ["mask"])
def test_scan_leaves_tensor_subclasses_to_the_pytorch_path(name):
    d = _data(torch.float32)
    assert _scan(_with(d, name, d[name].as_subclass(_Sub))) is None


@needs_kernel
def test_scan_leaves_tensors_without_storage_to_the_pytorch_path():
    # under torch.vmap the per-sample tensors are wrappers with no storage of their own
    d = _data(torch.float32)
    seen = []

    def one(r):
        seen.append(_native.scan(r.unsqueeze(0), None, None, 0.99, 0.99, None))
        return r.sum()

    torch.vmap(one)(d["rewards"])
    assert seen == [None]


# ---------------------------------------------------------------------------
# the outputs
# ---------------------------------------------------------------------------


@needs_kernel
@pytest.mark.parametrize("dtype", DTYPES)
def test_outputs_are_fresh_dense_cpu_tensors_even_under_a_default_device(dtype):
    d = _data(dtype)
    expected = _scan(d)
    with torch.device("meta"):  # a default device for factories: the outputs and materialised zeros stay on the CPU
        got = _scan(d)
        got_zero = _scan(_with(d, "values", _zero(d["values"])))
    _same(got, expected)
    adv, ret, _ = got_zero
    assert adv.device.type == ret.device.type == "cpu"
    for out in got[:2]:
        assert out.is_contiguous() and out.dtype == dtype and out.shape == (B, T)
        assert all(out.untyped_storage().data_ptr() != x.untyped_storage().data_ptr() for x in d.values())


@needs_kernel
def test_scan_of_an_empty_batch():
    for shape in ((0, T), (B, 0)):
        x = torch.zeros(shape)
        adv, ret, finite = _native.scan(x, x, torch.zeros(shape, dtype=torch.bool), 1.0, 0.9, torch.zeros(shape[0]))
        assert adv.shape == ret.shape == shape and finite
