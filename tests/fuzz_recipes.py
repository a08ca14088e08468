"""Recipes for the property-based suite (tests/test_fuzz.py): hostile arguments as plain, printable data.

Hypothesis draws *recipes*, not tensors: a :class:`T` says which tensor to
build (shape, dtype, values, layout, device), an :class:`O` which object
(a world, a model, a generator, a numpy array...). A recipe pickles, so the
worker process that runs the call (``fuzz_runner``) builds the arguments
itself, and it prints as Python, so a failing example can be pasted into an
``example(...)`` of the suite. The generic strategies for hostile values
live here too: scalars of every Python type, every dtype, every layout.
"""

from __future__ import annotations

import math
from decimal import Decimal
from fractions import Fraction
from typing import Any, Dict, NamedTuple, Tuple

import numpy as np
import torch
from hypothesis import strategies as st

nan, inf = math.nan, math.inf  # so that printed recipes evaluate

FLOAT_DTYPES = ("float32", "float64", "float16", "bfloat16")
INT_DTYPES = ("int64", "int32", "int16", "int8", "uint8")
OTHER_DTYPES = ("bool", "complex64", "complex128")
ALL_DTYPES = FLOAT_DTYPES + INT_DTYPES + OTHER_DTYPES

# layouts that keep a tensor valid (the same logical values, another memory layout)
VALID_LAYOUTS = ("plain", "strided", "transposed", "expanded", "neg", "offset")
# layouts with no data behind them, or not dense
HOSTILE_LAYOUTS = ("conj", "zero", "oddbool", "freed", "sparse")
ALL_LAYOUTS = VALID_LAYOUTS + HOSTILE_LAYOUTS

DEVICES = ("cpu", "meta") + (("cuda",) if torch.cuda.is_available() else ())
GPU = "cuda" if torch.cuda.is_available() else None


class T(NamedTuple):
    """A tensor to build: ``values`` (cycled to fill ``shape``) of ``dtype``, laid out as ``layout``, on ``device``.

    Layouts: ``plain``; ``strided`` (every other element of a larger tensor
    whose gaps hold NaN or 7), ``transposed`` (column-major), ``expanded``
    (the first row broadcast, stride 0), ``neg`` (a negative view of the
    negated values, as ``z.conj().imag`` makes: float and complex only),
    ``offset`` (storage offset 3 behind garbage), ``conj`` (a conjugate
    view), ``zero`` (an efficient zero tensor), ``oddbool`` (a bool view of
    bytes 0..255), ``freed`` (storage resized to 0 bytes: no data),
    ``sparse`` (COO). ``grad``: requires grad.
    """

    shape: Tuple[int, ...]
    dtype: str = "float32"
    values: Tuple[Any, ...] = ()
    layout: str = "plain"
    device: str = "cpu"
    grad: bool = False


class O(NamedTuple):
    """An object to build: ``FACTORIES[kind](*args)`` (a world, a model, a numpy array, a generator...)."""

    kind: str
    args: Tuple[Any, ...] = ()


# ---------------------------------------------------------------------------
# building (in the worker)
# ---------------------------------------------------------------------------


def _fill(values: Tuple[Any, ...], n: int) -> list:
    if not values:
        return [0] * n
    return [values[i % len(values)] for i in range(n)]


def build_tensor(t: T) -> torch.Tensor:
    dtype = getattr(torch, t.dtype)
    n = math.prod(t.shape)
    vals = _fill(t.values, n)
    if t.layout == "oddbool" and dtype == torch.bool:
        base = torch.tensor([int(abs(v)) % 256 if not isinstance(v, complex) else 1 for v in vals] or [],
                            dtype=torch.uint8).reshape(t.shape).view(torch.bool)
    else:
        base = torch.tensor(vals, dtype=dtype).reshape(t.shape)
    x = _lay_out(base, t.layout)
    if t.device != "cpu" and t.layout not in ("freed",):
        x = x.to(t.device)
    if t.grad and (x.is_floating_point() or x.is_complex()) and t.layout not in ("freed", "sparse", "zero"):
        x = x.detach().requires_grad_(True)
    return x


def _garbage(dtype: torch.dtype):
    if dtype.is_floating_point or dtype.is_complex:
        return math.nan
    return True if dtype == torch.bool else 7


def _lay_out(base: torch.Tensor, layout: str) -> torch.Tensor:
    dtype = base.dtype
    if layout == "strided" and base.dim() >= 1:
        big = torch.full(base.shape[:-1] + (2 * base.shape[-1],), _garbage(dtype), dtype=dtype)
        big[..., ::2] = base
        return big[..., ::2]
    if layout == "transposed" and base.dim() >= 2:
        return base.mT.contiguous().mT
    if layout == "expanded" and base.dim() >= 1 and base.shape[0] > 0:
        return base[:1].expand(base.shape)
    if layout == "neg" and (dtype.is_floating_point or dtype.is_complex):  # as z.conj().imag gives (no int views)
        return torch._neg_view(base.neg())
    if layout == "offset":
        store = torch.full((base.numel() + 3,), _garbage(dtype), dtype=dtype)
        store[3:] = base.reshape(-1)
        return store[3:].view(base.shape)
    if layout == "conj" and base.is_complex():
        return base.conj().resolve_conj().conj()
    if layout == "zero":
        return torch._efficientzerotensor(base.shape, dtype=dtype)
    if layout == "freed" and base.numel():
        x = base.clone()
        x.untyped_storage().resize_(0)
        return x
    if layout == "sparse" and base.dim() >= 1:
        return base.to_sparse()
    return base


def build(x: Any) -> Any:
    """The Python object a recipe stands for (recursively through lists, tuples and dicts)."""
    if isinstance(x, T):
        return build_tensor(x)
    if isinstance(x, O):
        from fuzz_targets import FACTORIES  # noqa: PLC0415 - the factories need the targets' helpers

        return FACTORIES[x.kind](*[build(a) for a in x.args])
    if isinstance(x, list):
        return [build(e) for e in x]
    if isinstance(x, tuple) and type(x) is tuple:
        return tuple(build(e) for e in x)
    if isinstance(x, dict):
        return {k: build(v) for k, v in x.items()}
    return x


# ---------------------------------------------------------------------------
# rendering a recipe as a Python snippet (for the findings file)
# ---------------------------------------------------------------------------


def render(x: Any) -> str:
    """A readable Python expression for a recipe (tensor layouts named in a trailing comment-like call)."""
    if isinstance(x, T):
        n = math.prod(x.shape)
        vals = _fill(x.values, n)
        body = f"torch.tensor({vals!r}, dtype=torch.{x.dtype})" if n <= 24 else \
            f"torch.tensor({x.values!r} cycled to {n}, dtype=torch.{x.dtype})"
        if x.shape != (n,):
            body += f".reshape{x.shape!r}"
        extras = [f"layout={x.layout}"] if x.layout != "plain" else []
        extras += [f"device={x.device}"] if x.device != "cpu" else []
        extras += ["requires_grad"] if x.grad else []
        return body + (f"  [{', '.join(extras)}]" if extras else "")
    if isinstance(x, O):
        return f"{x.kind}({', '.join(render(a) for a in x.args)})"
    if isinstance(x, list):
        return "[" + ", ".join(render(e) for e in x) + "]"
    if isinstance(x, tuple) and type(x) is tuple:
        return "(" + ", ".join(render(e) for e in x) + ("," if len(x) == 1 else "") + ")"
    if isinstance(x, dict):
        return "{" + ", ".join(f"{k!r}: {render(v)}" for k, v in x.items()) + "}"
    return repr(x)


# ---------------------------------------------------------------------------
# values
# ---------------------------------------------------------------------------

NICE = st.floats(-4, 4, width=32)
"""Ordinary finite values (zeros and float32 subnormals included)."""

EXTREME_FLOATS = (nan, inf, -inf, 1e308, -1e308, 1.7976931348623157e308, 3.4e38, -3.4e38, 3.5e38, 1e38, 6.6e4,
                  65504.0, 1e-40, -1e-45, 5e-324, 2.2e-308, 1e-300, 0.0, -0.0, 1e20, -1e20, 1e10)
INT64_EXTREMES = (-(2**63), 2**63 - 1, -(2**62), 2**62, 2**40, -(2**31), 2**31 - 1, 2**32, -1, 0, 1, 2)


def floats(extreme: bool = False) -> st.SearchStrategy:
    """Finite, ordinary floats; with ``extreme`` also NaN, ±inf, subnormals, ±1e308 and anything in between."""
    if not extreme:
        return NICE
    return st.one_of(NICE, st.sampled_from(EXTREME_FLOATS), st.floats(allow_nan=True, allow_infinity=True))


def ints_for(dtype: str, extreme: bool = True) -> st.SearchStrategy:
    info = torch.iinfo(getattr(torch, dtype))
    edges = [v for v in INT64_EXTREMES if info.min <= v <= info.max] + [info.min, info.max]
    small = st.integers(max(info.min, -3), min(info.max, 9))
    return st.one_of(small, st.sampled_from(edges)) if extreme else small


def values_for(dtype: str, extreme: bool = True) -> st.SearchStrategy:
    """One entry of a tensor of ``dtype``: hostile values when ``extreme``."""
    if dtype in FLOAT_DTYPES:
        return floats(extreme)
    if dtype in INT_DTYPES:
        return ints_for(dtype, extreme)
    if dtype == "bool":
        return st.booleans()
    return st.builds(complex, floats(extreme), floats(extreme))


@st.composite
def value_list(draw, dtype: str, n: int, extreme: bool = True, elements=None):
    """Values for ``n`` entries (at most 48 drawn, then cycled)."""
    if n == 0:
        return ()
    return tuple(draw(st.lists(values_for(dtype, extreme) if elements is None else elements, min_size=1, max_size=min(n, 48))))


# ---------------------------------------------------------------------------
# hostile objects of every kind
# ---------------------------------------------------------------------------

STRINGS = ("", "0.5", "1", "0", "nan", "True", "False", "no", "off", "k1", "token-mean", "skip", "cpu", "\x00")


def numpy_scalars() -> st.SearchStrategy:
    return st.one_of(
        st.builds(np.float64, floats(True)),
        st.builds(np.float32, st.floats(width=32, allow_nan=True, allow_infinity=True)),
        st.builds(np.float16, st.floats(width=16, allow_nan=True, allow_infinity=True)),
        st.builds(np.int64, st.integers(-(2**63), 2**63 - 1)),
        st.builds(np.int8, st.integers(-128, 127)),
        st.just(np.uint64(2**64 - 1)),
        st.builds(np.bool_, st.booleans()),
    )


def scalars() -> st.SearchStrategy:
    """A scalar of every Python type: bool, int (huge too), float (NaN, inf), str, None, numpy scalars, 0-d tensors..."""
    return st.one_of(
        st.booleans(),
        st.integers(-3, 3),
        st.sampled_from([2**31, 2**63 - 1, 2**63, 2**64, -(2**63) - 1, 10**30, 10**400, -(10**400)]),
        floats(True),
        st.sampled_from(STRINGS),
        st.none(),
        numpy_scalars(),
        st.builds(complex, floats(), floats()),
        st.sampled_from([Fraction(1, 2), Fraction(3, 2), Decimal("0.5"), b"1", [0.5], (0.5,), {}, O("object")]),
        zero_d_tensors(),
    )


def zero_d_tensors() -> st.SearchStrategy:
    return st.sampled_from(ALL_DTYPES).flatmap(
        lambda d: st.builds(lambda v, dev: T((), d, (v,), device=dev), values_for(d), st.sampled_from(DEVICES)))


def shapes_near(shape: Tuple[int, ...]) -> st.SearchStrategy:
    """Shapes close to ``shape``: transposed, one more or one fewer axis, size 1 or 0 along one, empty, 0-d."""
    cands = {(), (0,), (1,), (2, 0), (0, 2), (1, 1)}
    if shape:
        cands |= {shape[:-1], shape + (1,), (1,) + shape, shape[::-1], shape[:-1] + (shape[-1] + 1,),
                  (1,) + shape[1:], shape[:-1] + (1,), (shape[0] + 1,) + shape[1:]}
        if shape[-1] > 1:
            cands.add(shape[:-1] + (shape[-1] - 1,))
    cands.discard(shape)
    cands = sorted(c for c in cands if math.prod(c) <= 4096)
    return st.sampled_from(cands)


@st.composite
def any_tensor(draw, shape=None, extreme: bool = True):
    """Any tensor: every dtype, layout and device, hostile values."""
    dtype = draw(st.sampled_from(ALL_DTYPES))
    if shape is None:
        shape = draw(st.sampled_from([(), (0,), (1,), (3,), (2, 3), (1, 5), (3, 0), (2, 2, 1)]))
    layout = draw(st.sampled_from(ALL_LAYOUTS))
    device = draw(st.sampled_from(DEVICES))
    return T(shape, dtype, draw(value_list(dtype, math.prod(shape), extreme)), layout, device, draw(st.booleans()))


def junk() -> st.SearchStrategy:
    """Anything at all: a scalar of any type, any tensor, a numpy array, a list."""
    return st.one_of(
        scalars(),
        any_tensor(),
        any_tensor().map(lambda t: O("numpy", (t._replace(layout="plain", device="cpu", grad=False),))),
        st.lists(floats(True), max_size=4),
    )


@st.composite
def perturb_tensor(draw, t: T):
    """``t`` with one thing changed: dtype, shape, layout, device, values (NaN, inf, extremes), grad; or junk."""
    how = draw(st.sampled_from(["dtype", "shape", "layout", "device", "values", "grad", "junk", "wrap"]))
    n = math.prod(t.shape)
    if how == "wrap" and t.dtype in ("int64", "int32") and n >= 2 and t.values:
        # offsets whose differences wrap around: [0, 2**63 - 1, -2, 4] passes a check by subtraction
        big = 2**63 - 1 if t.dtype == "int64" else 2**31 - 1
        vals = list(_fill(t.values, n))
        i = draw(st.integers(0, n - 2))
        vals[i], vals[i + 1] = draw(st.sampled_from([(big, -2), (big, -big - 1), (-big - 1, big), (big, 0)]))
        return t._replace(values=tuple(vals))
    if how == "wrap":
        how = "values"
    if how == "dtype":
        d = draw(st.sampled_from([x for x in ALL_DTYPES if x != t.dtype]))
        return t._replace(dtype=d, values=draw(value_list(d, n, False)),
                          layout="plain" if t.layout in ("oddbool",) else t.layout)
    if how == "shape":
        shape = draw(shapes_near(t.shape))
        vals = t.values if t.values else draw(value_list(t.dtype, math.prod(shape), False))
        return t._replace(shape=shape, values=vals)
    if how == "layout":
        return t._replace(layout=draw(st.sampled_from([x for x in ALL_LAYOUTS if x != t.layout])))
    if how == "device":
        return t._replace(device=draw(st.sampled_from([x for x in DEVICES if x != t.device] or ["meta"])))
    if how == "values":
        if n == 0:  # one hostile entry in an otherwise empty tensor
            return t._replace(shape=(t.shape[:-1] + (1,)) if t.shape else (1,), values=(draw(values_for(t.dtype, True)),))
        return t._replace(values=draw(value_list(t.dtype, n, True)))
    if how == "grad":
        return t._replace(grad=not t.grad)
    return draw(junk())


def perturb_int(v: int) -> st.SearchStrategy:
    return st.one_of(
        st.sampled_from([0, -1, v - 1, v + 1, 2**31, 2**63, 2**64 + 1, 10**30, -(10**30), 10**400]),
        st.sampled_from([True, False, float(v), v + 0.5, str(v), None, np.int64(v), np.uint8(max(0, min(v, 255))),
                         np.float64(v), Fraction(v), T((), "int64", (v,)), T((1,), "int64", (v,))]),
        scalars(),
    )


def perturb_float(v: float) -> st.SearchStrategy:
    return st.one_of(
        st.sampled_from([-1e-9, 1 + 1e-9, 1.0000001, -0.0, 2.0, -1.0, nan, inf, -inf, 1e308, 10**400]),
        st.sampled_from([True, False, str(v), None, np.float32(v), np.float64(v), np.bool_(True), complex(v, 0),
                         Fraction(1, 3), T((), "float32", (v,)), T((), "float64", (v,), grad=True),
                         T((1,), "float32", (v,)), T((), "bool", (True,)), T((), "int64", (1,))]),
        scalars(),
    )


def perturb_flag(v: bool) -> st.SearchStrategy:
    return st.one_of(
        st.sampled_from([0, 1, 2, -1, "no", "False", "", "off", None, np.bool_(not v), np.bool_(v), 1.0,
                         T((), "bool", (v,)), T((2,), "bool", (v, not v)), T((), "int64", (int(v),)), [v]]),
        scalars(),
    )


def perturb_str(v: str) -> st.SearchStrategy:
    return st.one_of(
        st.sampled_from([v.upper(), v + " ", " " + v, v[:-1], "", None, 0, 1, True, [v], (v,), {v: 1}, v.encode(),
                         np.str_(v), T((), "float32", (0.0,))]),
        scalars(),
    )


@st.composite
def perturb(draw, value: Any):
    """A hostile replacement for one argument, near its valid ``value`` when that helps (the type decides how)."""
    if isinstance(value, T):
        return draw(perturb_tensor(value))
    if isinstance(value, bool):
        return draw(perturb_flag(value))
    if isinstance(value, int):
        return draw(perturb_int(value))
    if isinstance(value, float):
        return draw(perturb_float(value))
    if isinstance(value, str):
        return draw(perturb_str(value))
    if isinstance(value, list) and value:
        i = draw(st.integers(0, len(value) - 1))
        kind = draw(st.sampled_from(["element", "empty", "tuple", "junk"]))
        if kind == "element":
            return value[:i] + [draw(perturb(value[i]))] + value[i + 1:]
        if kind == "empty":
            return []
        if kind == "tuple":
            return tuple(value)
    return draw(junk())


def merge(*dicts: Dict[str, Any]) -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    for d in dicts:
        out.update(d)
    return out
