"""The table of the property-based suite: every public function, its arguments' strategies and its oracle.

One entry per public function of ``valuelab``, ``valuelab.packed``,
``valuelab.losses``, ``valuelab.integrations`` (and its ``verl``,
``openrlhf``, ``trl``, ``torchrl`` adapters), ``valuelab.lab.stats``,
``valuelab.lab.policy``, ``valuelab.lab.ppo``, ``valuelab.lab.transformer`` and
``valuelab.distributed`` (``tests/test_fuzz.py`` fails when one is missing).
An entry is a strategy of *valid* keyword arguments (recipes, see
``fuzz_recipes``; ``extreme=True`` draws hostile values in the documented
shapes and types) and an oracle that checks a returned result: against
``valuelab.lab.reference`` or an independent computation (numpy loops, the
trainers' own code through ``valuelab.integrations.peers``, SciPy,
exhaustive enumeration of a tiny world's responses). The hostile calls are
made from the valid ones by ``fuzz_recipes.perturb`` (tests/test_fuzz.py).

An oracle raises :class:`Wrong` for a wrong result, and also when the call
should not have returned at all: a bool or a string accepted as a number, a
flag read by truthiness, a tensor of the wrong shape silently broadcast, a
meta tensor accepted.
"""

from __future__ import annotations

import math
import numbers
import re
import types
from dataclasses import dataclass, field
from fractions import Fraction
from functools import lru_cache
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Tuple

import numpy as np
import torch
from hypothesis import strategies as st

from fuzz_recipes import GPU, VALID_LAYOUTS, O, T, floats, value_list

# ---------------------------------------------------------------------------
# the table
# ---------------------------------------------------------------------------


class Wrong(AssertionError):
    """The oracle's verdict: a wrong result, or a result where the call should have raised."""


class Args(NamedTuple):
    """What an oracle sees: the built keyword arguments (and ``*args``), the mode, and whether the inputs were finite."""

    kw: Dict[str, Any]
    varargs: Tuple[Any, ...]
    mode: str
    finite: bool


@dataclass
class Target:
    """One public function: ``valid(extreme)`` draws keyword arguments (recipes); ``oracle(args, result)`` checks."""

    name: str
    valid: Callable[[bool], st.SearchStrategy]
    oracle: Optional[Callable[[Args, Any], None]] = None
    weight: float = 1.0
    """Share of the profile's ``max_examples`` (expensive functions run fewer examples)."""
    timeout: float = 10.0
    """Seconds one call may take in the worker before it counts as a hang."""
    must_return: bool = True
    """Whether a valid call must return (False: the function has no call that is valid outside its context)."""
    defined: Optional[Callable[[Dict[str, Any]], Optional[str]]] = None
    """For a valid call that raised: None if the result is defined (a failure), else why it is not."""
    nan_ok: Callable[[str], bool] = lambda path: False
    """Result paths documented to hold NaN."""
    aliases: Tuple[str, ...] = ()
    """Names an error message may use for an argument besides the parameters (fields of a structured argument)."""
    allowed: Tuple[type, ...] = ()
    """Exceptions besides TypeError/ValueError that are the documented behaviour (ImportError: a trainer not installed)."""
    modes: Tuple[str, ...] = ("valid", "valid", "extreme", "hostile", "hostile", "hostile")
    examples: List[Any] = field(default_factory=list)
    """Regression examples (``fuzz_runner.Call``), run before the drawn ones."""


TARGETS: Dict[str, Target] = {}

NOT_FUZZED = {
    # classes in __all__ that hold results and validate nothing: their constructors are not an input surface
    "valuelab.advantages.GAEResult": "NamedTuple of results",
    "valuelab.advantages.DecoupledGAE": "NamedTuple of results",
    "valuelab.losses.ValueLossStats": "NamedTuple of results",
    "valuelab.lab.stats.Interval": "frozen dataclass of results (pm is fuzzed with hostile Intervals)",
    "valuelab.lab.stats.Equivalence": "frozen dataclass of results",
    "valuelab.packed.Packing": "NamedTuple of results",
    "valuelab.integrations.trl.TRLBatch": "NamedTuple of results",
    "valuelab.integrations.torchrl.ValuelabBatch": "NamedTuple of results",
    "valuelab.lab.policy.PromptWorld": "frozen dataclass built by make_prompt_world (fuzzed there)",
    "valuelab.lab.policy.PolicyEvaluation": "NamedTuple of results",
    "valuelab.lab.policy.SoftOptimum": "NamedTuple of results",
    "valuelab.lab.policy.PromptBatch": "NamedTuple of results",
    "valuelab.lab.ppo.PolicyLoss": "NamedTuple of results",
    "valuelab.lab.ppo.AdvantageFit": "NamedTuple of results",
    "valuelab.lab.ppo.PPOHistory": "dataclass of results",
}


def target(name: str, **options: Any):
    """Register the decorated ``(draw, extreme) -> kwargs`` function as the valid-argument strategy of ``name``."""

    def register(fn):
        TARGETS[name] = Target(name, st.composite(fn), **options)
        return fn

    return register


# ---------------------------------------------------------------------------
# oracle helpers
# ---------------------------------------------------------------------------


def expect(ok: bool, message: str) -> None:
    if not ok:
        raise Wrong(message)


def arr(x: Any, name: str) -> np.ndarray:
    """``x`` as float64 numpy (a bool tensor read byte-wise: any nonzero byte is True); Wrong for a meta or complex one."""
    if isinstance(x, torch.Tensor):
        expect(not x.is_meta, f"returned a result computed from the meta tensor {name} (it holds no data)")
        expect(not x.is_complex(), f"accepted the complex tensor {name} ({x.dtype})")
        y = x.detach()
        if y.layout != torch.strided:
            y = y.to_dense()
        if y._is_zerotensor():
            y = torch.zeros(y.shape, dtype=y.dtype)
        y = y.resolve_neg().cpu()
        if y.dtype == torch.bool:
            return (y.view(torch.uint8) != 0).numpy().astype(np.float64)
        return y.double().numpy()
    if isinstance(x, (list, tuple)):  # 0-d tensors in a list, read as numbers (without a graph)
        x = [v.detach().cpu().resolve_conj().resolve_neg() if isinstance(v, torch.Tensor) else v for v in x]
    a = np.asarray(x)
    expect(a.dtype.kind not in "cOUSV", f"accepted {name}={x!r:.60}")
    return a.astype(np.float64)


def boolarr(x: Any, name: str) -> np.ndarray:
    return arr(x, name) != 0


def scalar(x: Any, name: str) -> float:
    """A number the documentation allows for ``name``: Wrong for a bool, a string, None, complex or a bool tensor."""
    if isinstance(x, torch.Tensor):
        expect(x.dtype != torch.bool, f"accepted the bool tensor {name}={x!r:.60} as a number")
        expect(x.numel() == 1, f"accepted {name} of shape {tuple(x.shape)} as a number")
        return float(arr(x, name).reshape(()))
    expect(not isinstance(x, (bool, np.bool_)), f"accepted {name}={x!r} (a bool) as a number")
    expect(isinstance(x, numbers.Real), f"accepted {name}={x!r:.60} ({type(x).__name__}) as a number")
    return float(x)


def flag(x: Any, name: str) -> bool:
    expect(isinstance(x, (bool, np.bool_)), f"accepted the flag {name}={x!r:.60} ({type(x).__name__}), not a bool: "
                                            "read by truthiness")
    return bool(x)


def index_tensor(x: Any, name: str) -> np.ndarray:
    """An integer tensor's entries as int64 numpy (Wrong for a float or bool one, or a meta one)."""
    expect(isinstance(x, torch.Tensor), f"accepted {name} of type {type(x).__name__}")
    expect(not x.is_meta, f"returned a result from the meta tensor {name}")
    expect(not x.is_floating_point() and not x.is_complex() and x.dtype != torch.bool,
           f"accepted {name} of dtype {x.dtype} as an index tensor")
    y = torch.zeros(x.shape, dtype=torch.long) if x._is_zerotensor() else x.detach()
    if y.layout != torch.strided:
        y = y.to_dense()
    return y.resolve_neg().cpu().long().numpy()


def eps_of(dtype: torch.dtype) -> float:
    return torch.finfo(dtype).eps if dtype.is_floating_point else 2.0**-52


def tiny_of(dtype: torch.dtype) -> float:
    """An absolute error floor: results in the subnormal range of ``dtype`` keep no relative precision."""
    return 4 * torch.finfo(dtype).tiny if dtype.is_floating_point else 1e-300


def close(name: str, got: Any, want: np.ndarray, tol: Any, *, where: str = "") -> None:
    """``|got - want| <= tol`` entry by entry (NaN in ``want``: not compared)."""
    g = arr(got, name) if not isinstance(got, np.ndarray) else got.astype(np.float64)
    want = np.asarray(want, dtype=np.float64)
    tol = np.where(np.isnan(tol), np.inf, tol)  # a bound that overflowed bounds nothing
    expect(g.shape == want.shape, f"{name} has shape {g.shape}, expected {want.shape}")
    ok = ~np.isfinite(want) | (np.abs(g - want) <= tol)
    if not ok.all():
        i = tuple(np.argwhere(~ok)[0])
        t = tol if np.isscalar(tol) else np.broadcast_to(tol, want.shape)[i]
        raise Wrong(f"{name}{list(i)} = {g[i]!r}, expected {want[i]!r} (tolerance {t:.3g}){where}")


def like_input(name: str, out: Any, ref: torch.Tensor) -> None:
    """``out`` is a tensor of ``ref``'s shape, dtype and device."""
    expect(isinstance(out, torch.Tensor), f"{name} is a {type(out).__name__}, not a tensor")
    expect(out.shape == ref.shape, f"{name} has shape {tuple(out.shape)}, expected {tuple(ref.shape)}")
    expect(out.dtype == ref.dtype, f"{name} has dtype {out.dtype}, expected {ref.dtype}")
    expect(out.device == ref.device, f"{name} is on {out.device}, expected {ref.device}")


def same_shape(x: Any, shape: Tuple[int, ...], name: str, of: str) -> None:
    if isinstance(x, (torch.Tensor, np.ndarray)):
        expect(tuple(x.shape) == tuple(shape), f"accepted {name} of shape {tuple(x.shape)} for {of} of shape "
                                               f"{tuple(shape)}: broadcast silently")


# ---------------------------------------------------------------------------
# argument strategies shared by many targets
# ---------------------------------------------------------------------------

FLOAT_DTYPE = st.sampled_from(["float32", "float64", "float32", "float64", "float16", "bfloat16"])
WIDE_DTYPE = st.sampled_from(["float32", "float64"])
LAYOUT = st.sampled_from(("plain", "plain", "plain") + VALID_LAYOUTS[1:])
INDEX_LAYOUT = st.sampled_from(("plain", "plain", "plain") + tuple(x for x in VALID_LAYOUTS[1:] if x != "expanded"))
"""Layouts that keep every entry (``expanded`` repeats the first row: offsets and labels would change)."""
DEVICE = st.sampled_from(("cpu",) + ((GPU,) if GPU else ()))
GRAD = st.sampled_from([False, False, False, True])
UNIT = st.floats(0, 1)


@st.composite
def batch_shape(draw, *, two_d: Optional[bool] = None, long_ok: bool = True, empty_ok: bool = True):
    """``(B, T)`` or ``(T,)``: short rows mostly, sometimes one token, empty, or long (300 or 1500 tokens)."""
    kinds = ["2d", "2d", "2d", "1d", "one"] + (["long"] if long_ok else []) + (["empty"] if empty_ok else [])
    kind = draw(st.sampled_from(kinds))
    if kind == "long":
        shape = (draw(st.sampled_from([300, 1500])),)
        shape = (1,) + shape if two_d or (two_d is None and draw(st.booleans())) else shape
    elif kind == "one":
        shape = (draw(st.integers(1, 3)), 1)
    elif kind == "empty":
        shape = draw(st.sampled_from([(0, 3), (2, 0), (0,), (0, 0)]))
    elif kind == "1d":
        shape = (draw(st.integers(1, 9)),)
    else:
        shape = (draw(st.integers(1, 4)), draw(st.integers(2, 9)))
    if two_d is True and len(shape) == 1:
        shape = (1,) + shape
    if two_d is False and len(shape) == 2:
        shape = shape[1:]
    return shape


@st.composite
def ftensor(draw, shape, extreme=False, dtype=None, device="cpu", elements=None, grad=None, layout=None):
    """A valid float tensor of ``shape`` (any valid layout), ordinary values or hostile ones (``extreme``)."""
    dtype = dtype or draw(FLOAT_DTYPE)
    vals = draw(value_list(dtype, math.prod(shape), extreme, elements=elements))
    return T(tuple(shape), dtype, vals, layout or draw(LAYOUT), device, draw(GRAD) if grad is None else grad)


@st.composite
def bits(draw, shape, *, kinds=("bool", "bool", "bool", "oddbool", "float", "int"), min_true=0, device="cpu"):
    """A mask of ``shape``: a bool tensor (any layout; odd bytes too), or real 0/1 (float, int)."""
    n = math.prod(shape)
    b = list(draw(st.lists(st.booleans(), min_size=n, max_size=n)))
    for i in range(min(min_true, n)):
        b[i] = True
    kind = draw(st.sampled_from(kinds))
    if kind == "oddbool":
        return T(tuple(shape), "bool", tuple(draw(st.integers(2, 255)) if v else 0 for v in b), "oddbool", device)
    if kind == "float":
        return T(tuple(shape), draw(WIDE_DTYPE), tuple(float(v) for v in b), draw(LAYOUT), device)
    if kind == "int":
        return T(tuple(shape), draw(st.sampled_from(["int64", "uint8", "int32"])), tuple(int(v) for v in b),
                 draw(LAYOUT), device)
    return T(tuple(shape), "bool", tuple(b), draw(st.sampled_from(["plain", "plain", "strided", "transposed",
                                                                     "expanded", "offset"])), device)


@st.composite
def unit_arg(draw, shape, device="cpu", tensors=True):
    """gamma or lam: a number in [0, 1] of any real type, or a tensor in [0, 1] broadcastable to ``shape``."""
    kinds = ["float", "float", "edge", "int", "numpy", "fraction"] + (["0d", "row", "step"] if tensors else [])
    kind = draw(st.sampled_from(kinds))
    x = draw(UNIT)
    if kind == "float":
        return x
    if kind == "edge":
        return draw(st.sampled_from([0.0, 1.0, 0.5, 0.99, 1e-300, 5e-324, 0.9999999]))
    if kind == "int":
        return draw(st.sampled_from([0, 1]))
    if kind == "numpy":
        return draw(st.sampled_from([np.float64(x), np.float32(min(x, 1.0)), np.int64(1)]))
    if kind == "fraction":
        return Fraction(1, draw(st.integers(1, 9)))
    if kind == "0d":
        return T((), draw(FLOAT_DTYPE), (x,), "plain", device, draw(GRAD))
    sub = (shape[0], 1) if kind == "row" and len(shape) == 2 else ((1,) if kind == "row" else tuple(shape))
    return draw(ftensor(sub, dtype=draw(WIDE_DTYPE), device=device, elements=UNIT))


def per_row(shape) -> Tuple[int, ...]:
    return tuple(shape[:-1])


@st.composite
def bootstrap_arg(draw, shape, extreme=False, device="cpu"):
    kind = draw(st.sampled_from(["none", "float", "int", "numpy", "tensor", "tensor"]))
    if kind == "none":
        return None
    if kind == "float":
        return draw(floats(extreme))
    if kind == "int":
        return draw(st.integers(-3, 3))
    if kind == "numpy":
        return np.float64(draw(floats(extreme)))
    return draw(ftensor(per_row(shape), extreme, device=device))


def as_batch(x: np.ndarray) -> np.ndarray:
    return x[None] if x.ndim == 1 else x


# ---------------------------------------------------------------------------
# the estimators: valuelab.discounted_returns ... decoupled_gae (reference: valuelab.lab.reference)
# ---------------------------------------------------------------------------


def _factor(x: Any, name: str, shape, dtype: torch.dtype = torch.float64) -> np.ndarray:
    """gamma or lam as the documentation allows it, broadcast to ``shape`` as float64 (Wrong when it must be refused).

    A number is rounded to ``dtype`` first, as documented (``1 + 1e-9`` is 1 in float32), then checked.
    """
    if isinstance(x, torch.Tensor) and x.dim() > 0:
        expect(x.dtype != torch.bool and not x.is_complex(), f"accepted {name} of dtype {x.dtype}")
        a = arr(torch.as_tensor(x).detach().to(dtype) if x.is_floating_point() else x, name)
        try:
            a = np.broadcast_to(a, shape)
        except ValueError:
            raise Wrong(f"accepted {name} of shape {a.shape}, which does not broadcast to {tuple(shape)}") from None
    else:
        v = scalar(x, name)
        if math.isfinite(v) and abs(v) < 1e300:
            v = torch.tensor(v, dtype=torch.float64).to(dtype).item()
        a = np.full(shape, v)
    expect(bool(np.all((a >= 0) & (a <= 1))), f"accepted {name} outside [0, 1] (or NaN): {a.reshape(-1)[:4]}")
    return a


def _boot(x: Any, shape) -> np.ndarray:
    rows = shape[:-1]
    if x is None:
        return np.zeros(rows)
    if isinstance(x, torch.Tensor):
        same_shape(x, rows, "bootstrap", "rewards.shape[:-1]")
        return arr(x, "bootstrap").reshape(rows)
    return np.full(rows, scalar(x, "bootstrap"))


class Rows(NamedTuple):
    """One call of an estimator, as float64 numpy ``(B, T)`` arrays, its rows compacted to their valid tokens."""

    r: np.ndarray
    v: Optional[np.ndarray]
    m: np.ndarray
    g: np.ndarray
    lam: Optional[np.ndarray]
    boot: np.ndarray
    dtype: torch.dtype


def estimator_args(a: Args, lam: Optional[str] = None) -> Rows:
    kw = a.kw
    rewards = kw["rewards"]
    shape = tuple(rewards.shape)
    r = arr(rewards, "rewards")
    v = None
    if "values" in kw:
        same_shape(kw["values"], shape, "values", "rewards")
        v = arr(kw["values"], "values")
    mask = kw.get("mask")
    if mask is None:
        m = np.ones(shape, dtype=bool)
    else:
        same_shape(mask, shape, "mask", "rewards")
        m = boolarr(mask, "mask")
    g = _factor(kw.get("gamma", 1.0), "gamma", shape, rewards.dtype)
    l_ = _factor(kw[lam], lam, shape, rewards.dtype) if lam else None
    b = _boot(kw.get("bootstrap"), shape)
    B = lambda x: None if x is None else as_batch(x)  # noqa: E731
    return Rows(B(r), B(v), B(m), B(g), B(l_), b.reshape(-1) if b.ndim else b.reshape(1), rewards.dtype)


def _scan(x: np.ndarray, d: np.ndarray, tail: float) -> np.ndarray:
    """``y_t = x_t + d_t y_{t+1}``, ``y_L = tail``: the backward recursion every estimator is."""
    y = np.zeros(len(x))
    nxt = tail
    for t in range(len(x) - 1, -1, -1):
        nxt = x[t] + d[t] * nxt
        y[t] = nxt
    return y


def estimator_expected(a: Args, kind: str, n: Optional[int] = None, lam: str = "lam"):
    """The outputs an estimator must return, and their tolerance: per row, the recursion on the valid tokens in float64
    (the book's reference, ``valuelab.lab.reference``, for rows of at most 12 valid tokens). The tolerance is rounding
    (a few eps times the magnitude of the terms) plus underflow: a decay product below the smallest subnormal is 0
    in IEEE arithmetic, so ``gamma = 1e-300`` times a reward of ``1e308`` two steps on (``1e-292``) is lost by a scan
    that forms ``gamma**2`` first (the doubling of the differentiable path) and kept by one that does not (the loop);
    both are right to within ``denorm_min * max|input|`` per term."""
    from valuelab.lab import reference  # noqa: PLC0415

    p = estimator_args(a, lam if kind == "gae" else None)
    B, Tn = p.r.shape
    want = [np.zeros((B, Tn)) for _ in range(2 if kind == "gae" else 1)]
    mag, top = np.zeros((B, Tn)), np.zeros(B)
    for b in range(B):
        idx = np.flatnonzero(p.m[b])
        L = len(idx)
        if not L:
            continue
        r, g, boot = p.r[b, idx], p.g[b, idx], p.boot[b]
        v = p.v[b, idx] if p.v is not None else None
        nxt = np.append(v[1:], boot) if v is not None else None
        if kind == "returns":
            res, absr = [_scan(r, g, boot)], _scan(np.abs(r), g, abs(boot))
            if L <= 12:
                res = [reference.mc_returns(r, g, boot)]
        elif kind == "td_targets":
            res, absr = [r + g * nxt], np.abs(r) + g * np.abs(nxt)
        elif kind == "td_errors":
            res, absr = [r + g * nxt - v], np.abs(r) + g * np.abs(nxt) + np.abs(v)
        elif kind == "nstep":
            G, Ga = np.append(v, boot), np.append(np.abs(v), abs(boot))
            for _ in range(min(n, L)):
                G = np.append(r + g * G[1:], boot)
                Ga = np.append(np.abs(r) + g * Ga[1:], abs(boot))
            res, absr = [G[:-1]], Ga[:-1]
            if L <= 12:
                res = [reference.nstep_returns(r, v, n, g, boot)]
        else:  # gae
            lm = p.lam[b, idx]
            adv = _scan(r + g * nxt - v, g * lm, 0.0)
            if L <= 12:
                adv = reference.gae_recursion(r, v, g, lm, boot)
            res = [adv, adv + v]
            absr = _scan(np.abs(r) + g * np.abs(nxt) + np.abs(v), g * lm, 0.0) + np.abs(v)
        for w, x in zip(want, res):
            w[b, idx] = x
        mag[b, idx] = absr
        top[b] = max(np.abs(r).max(), abs(boot), np.abs(v).max() if v is not None else 0.0)
    # a product of decays below the smallest subnormal is 0 (and a subnormal one is off by up to half of it): each
    # of the up to Tn + 2 terms may be off by denorm_min * its input, however the scan groups the products
    denorm = torch.finfo(p.dtype).tiny * eps_of(p.dtype)
    tol = 16 * eps_of(p.dtype) * (Tn + 2) * mag + torch.finfo(p.dtype).tiny * 4 + (Tn + 2) * denorm * top[:, None]
    return want, tol


def estimator_oracle(kind: str, n: Optional[int] = None):
    """The oracle of one estimator: its outputs in the input's shape, dtype and device, equal to :func:`estimator_expected`."""

    def oracle(a: Args, out: Any) -> None:
        rewards = a.kw["rewards"]
        names = ("advantages", "returns") if kind == "gae" else ("result",)
        got = list(out) if kind == "gae" else [out]
        for name, y in zip(names, got):
            like_input(name, y, rewards)
        estimator_args(a, "lam" if kind == "gae" else None)  # refusals first: bools, strings, shapes
        if a.finite:
            want, tol = estimator_expected(a, kind, n)
            for name, y, w in zip(names, got, want):
                close(name, as_batch(arr(y, name)), w, tol)

    return oracle


@st.composite
def estimator_kwargs(draw, extreme, *, values=True, lam=(), n=False):
    shape = draw(batch_shape())
    dev = draw(DEVICE)
    dtype = draw(FLOAT_DTYPE)
    kw = {"rewards": draw(ftensor(shape, extreme, dtype, dev))}
    if values:
        kw["values"] = draw(ftensor(shape, extreme, dtype, dev))
    if n:
        kw["n"] = draw(st.one_of(st.integers(1, 12), st.sampled_from([1, 2, 3, 10**6, 2**40]),
                                 st.builds(np.int64, st.integers(1, 9))))
    kw["mask"] = draw(st.none() | bits(shape, device=dev))
    kw["gamma"] = draw(unit_arg(shape, dev))
    for name in lam:
        kw[name] = draw(unit_arg(shape, dev))
    kw["bootstrap"] = draw(bootstrap_arg(shape, extreme, dev))
    return kw


target("valuelab.returns.discounted_returns", oracle=estimator_oracle("returns"))(
    lambda draw, ex: draw(estimator_kwargs(ex, values=False)))
target("valuelab.returns.td_targets", oracle=estimator_oracle("td_targets"))(
    lambda draw, ex: draw(estimator_kwargs(ex)))
target("valuelab.advantages.td_errors", oracle=estimator_oracle("td_errors"))(
    lambda draw, ex: draw(estimator_kwargs(ex)))
target("valuelab.advantages.gae", oracle=estimator_oracle("gae"))(
    lambda draw, ex: draw(estimator_kwargs(ex, lam=("lam",))))


def _nstep_oracle(a: Args, out: Any) -> None:
    n = a.kw["n"]
    expect(isinstance(n, numbers.Integral) and not isinstance(n, (bool, np.bool_)), f"accepted n={n!r}")
    estimator_oracle("nstep", int(n))(a, out)


target("valuelab.returns.nstep_returns", oracle=_nstep_oracle)(lambda draw, ex: draw(estimator_kwargs(ex, n=True)))


def _decoupled_oracle(a: Args, out: Any) -> None:
    expect(isinstance(out, tuple) and len(out) == 2, f"returned {type(out).__name__}, not (advantages, returns)")
    rewards = a.kw["rewards"]
    for name, y in zip(("advantages", "returns"), out):
        like_input(name, y, rewards)
    actor = Args({**a.kw, "lam": a.kw["lam_actor"]}, (), a.mode, a.finite)
    critic = Args({**a.kw, "lam": a.kw["lam_critic"]}, (), a.mode, a.finite)
    estimator_args(actor, "lam"), estimator_args(critic, "lam")
    if a.finite:
        (adv, _), tol = estimator_expected(actor, "gae")
        close("advantages", as_batch(arr(out[0], "advantages")), adv, tol)
        (_, ret), tol = estimator_expected(critic, "gae")
        close("returns", as_batch(arr(out[1], "returns")), ret, tol)


target("valuelab.advantages.decoupled_gae", oracle=_decoupled_oracle)(
    lambda draw, ex: draw(estimator_kwargs(ex, lam=("lam_actor", "lam_critic"))))


@target("valuelab.advantages.length_adaptive_lam")
def _length_lam(draw, ex):
    B = draw(st.integers(0, 6))
    dtype = draw(st.sampled_from(["int64", "int32", "float32", "float64", "uint8"]))
    if dtype in ("float32", "float64"):
        vals = draw(value_list(dtype, B, ex, elements=st.floats(0, 1e6) if not ex else None))
    else:
        vals = draw(value_list(dtype, B, False, elements=st.integers(0, 200)))
    alpha = draw(st.one_of(st.floats(1e-3, 10), st.sampled_from([0.05, 1, 2, np.float64(0.5)])))
    return {"lengths": T((B,), dtype, vals, draw(LAYOUT)), "alpha": alpha}


def _length_lam_oracle(a: Args, out: Any) -> None:
    lengths = a.kw["lengths"]
    l_ = arr(lengths, "lengths")
    alpha = scalar(a.kw["alpha"], "alpha")
    expect(alpha > 0 and math.isfinite(alpha), f"accepted alpha={alpha}")
    expect(lengths.dim() == 1, f"accepted lengths of shape {tuple(lengths.shape)}")
    expect(bool(np.all(l_ >= 0)), "accepted negative lengths")
    expect(isinstance(out, torch.Tensor) and tuple(out.shape) == (len(l_), 1), f"result shape {getattr(out, 'shape', out)}")
    al = alpha * l_
    with np.errstate(divide="ignore"):
        want = np.where(al > 0, np.clip(1 - 1 / np.where(al > 0, al, 1), 0, 1), 0.0)
    close("lam", arr(out, "lam")[:, 0], want, 8 * eps_of(out.dtype) * (1 + np.abs(want)) + 1e-6 * (al < 1e-30))


TARGETS["valuelab.advantages.length_adaptive_lam"].oracle = _length_lam_oracle


# ---------------------------------------------------------------------------
# valuelab.rewards
# ---------------------------------------------------------------------------


def _k(rho: np.ndarray, estimator: str) -> np.ndarray:
    if estimator == "k1":
        return rho
    if estimator == "k2":
        return 0.5 * rho * rho
    return np.expm1(-rho) + rho


@st.composite
def _logprob_pair(draw, ex, shape=None):
    shape = shape or draw(batch_shape())
    dtype, dev = draw(FLOAT_DTYPE), draw(DEVICE)
    lp = st.floats(-8, 0, width=32)
    return shape, dtype, dev, draw(ftensor(shape, ex, dtype, dev, None if ex else lp)), \
        draw(ftensor(shape, ex, dtype, dev, None if ex else lp))


@target("valuelab.rewards.kl_penalty")
def _kl_penalty(draw, ex):
    _, _, _, lp, ref = draw(_logprob_pair(ex))
    return {"logprobs": lp, "ref_logprobs": ref, "estimator": draw(st.sampled_from(["k1", "k2", "k3"]))}


def _kl_penalty_oracle(a: Args, out: Any) -> None:
    lp, ref = a.kw["logprobs"], a.kw["ref_logprobs"]
    expect(a.kw["estimator"] in ("k1", "k2", "k3"), f"accepted estimator={a.kw['estimator']!r}")
    same_shape(ref, lp.shape, "ref_logprobs", "logprobs")
    like_input("result", out, lp)
    if not a.finite:
        return
    rho = arr(lp, "logprobs") - arr(ref, "ref_logprobs")
    want = _k(rho, a.kw["estimator"])
    close("result", out, want, 16 * eps_of(lp.dtype) * (1 + np.abs(want)) * (1 + np.abs(rho)) * (1 + np.exp(np.clip(-rho, -50, 50))))


TARGETS["valuelab.rewards.kl_penalty"].oracle = _kl_penalty_oracle


@target("valuelab.rewards.kl_shaped_rewards")
def _kl_shaped(draw, ex):
    shape, dtype, dev, lp, ref = draw(_logprob_pair(ex))
    score = draw(st.one_of(floats(ex), st.integers(-2, 2), ftensor(per_row(shape), ex, device=dev)))
    return {"logprobs": lp, "ref_logprobs": ref, "score": score, "mask": draw(st.none() | bits(shape, device=dev)),
            "beta": draw(st.one_of(st.floats(0, 1), st.sampled_from([0, 0.05, 1, np.float64(0.1)]))),
            "estimator": draw(st.sampled_from(["k1", "k2", "k3"]))}


def _kl_shaped_oracle(a: Args, out: Any) -> None:
    from valuelab.lab import reference  # noqa: PLC0415

    kw = a.kw
    lp = kw["logprobs"]
    shape = tuple(lp.shape)
    like_input("rewards", out, lp)
    beta = scalar(kw["beta"], "beta")
    expect(beta >= 0, f"accepted beta={beta}")
    expect(kw["estimator"] in ("k1", "k2", "k3"), f"accepted estimator={kw['estimator']!r}")
    m = np.ones(shape, bool) if kw["mask"] is None else boolarr(kw["mask"], "mask")
    if kw["mask"] is not None:
        same_shape(kw["mask"], shape, "mask", "logprobs")
    s = kw["score"]
    if isinstance(s, torch.Tensor):
        same_shape(s, shape[:-1], "score", "logprobs.shape[:-1]")
        score = arr(s, "score").reshape(shape[:-1])
    else:
        score = np.full(shape[:-1], scalar(s, "score"))
    if not a.finite:
        return
    rho = as_batch(arr(lp, "logprobs") - arr(kw["ref_logprobs"], "ref_logprobs"))
    m, score = as_batch(m), score.reshape(-1)
    want = np.zeros(rho.shape)
    mag = np.zeros(rho.shape)
    for b in range(rho.shape[0]):
        idx = np.flatnonzero(m[b])
        if len(idx):
            if np.all(np.abs(rho[b, idx]) < 700):  # the reference evaluates exp(-rho) for every estimator
                want[b, idx] = reference.kl_shaped_rewards(rho[b, idx], np.zeros(len(idx)), score[b], beta, kw["estimator"])
            else:
                want[b, idx] = -beta * _k(rho[b, idx], kw["estimator"])
                want[b, idx[-1]] += score[b]
            mag[b, idx] = beta * np.abs(_k(rho[b, idx], kw["estimator"])) * (1 + np.abs(rho[b, idx]))
            mag[b, idx[-1]] += abs(score[b])
    tol = 32 * eps_of(lp.dtype) * (1 + mag) * (1 + np.exp(np.clip(-rho, -50, 50)))
    close("rewards", as_batch(arr(out, "rewards")), want, tol)


TARGETS["valuelab.rewards.kl_shaped_rewards"].oracle = _kl_shaped_oracle


@target("valuelab.rewards.last_token_onehot")
def _last_token(draw, ex):
    shape = draw(batch_shape())
    return {"mask": draw(bits(shape))}


def _last_token_oracle(a: Args, out: Any) -> None:
    mask = a.kw["mask"]
    m = as_batch(boolarr(mask, "mask"))
    expect(isinstance(out, torch.Tensor) and out.dtype == torch.bool and out.shape == mask.shape,
           f"result {getattr(out, 'dtype', type(out))} {tuple(getattr(out, 'shape', ()))}, expected bool {tuple(mask.shape)}")
    want = np.zeros(m.shape, bool)
    for b in range(m.shape[0]):
        idx = np.flatnonzero(m[b])
        if len(idx):
            want[b, idx[-1]] = True
    got = as_batch(boolarr(out, "result"))
    expect(np.array_equal(got, want), f"result {got.astype(int).tolist()} != {want.astype(int).tolist()}")
    expect(bool((out.view(torch.uint8) <= 1).all()), "the result holds bool bytes other than 0 and 1")


TARGETS["valuelab.rewards.last_token_onehot"].oracle = _last_token_oracle


# ---------------------------------------------------------------------------
# valuelab.losses
# ---------------------------------------------------------------------------


def _mask_of(a: Args, x: torch.Tensor, name: str = "mask") -> np.ndarray:
    mask = a.kw.get(name)
    if mask is None:
        return np.ones(tuple(x.shape), bool)
    same_shape(mask, tuple(x.shape), name, "x")
    return boolarr(mask, name)


def _no_group(a: Args) -> None:
    expect(a.kw.get("group") is None, f"accepted group={a.kw.get('group')!r:.60} outside torch.distributed")


@st.composite
def _x_mask(draw, ex, *, min_true=0, grad=None):
    shape = draw(batch_shape())
    if min_true and math.prod(shape) < min_true:
        shape = (2, 3)
    dev = draw(DEVICE)
    x = draw(ftensor(shape, ex, device=dev, grad=grad))
    m = draw(bits(shape, min_true=min_true, device=dev) if min_true else st.none() | bits(shape, device=dev))
    return x, m


@target("valuelab.losses.masked_mean")
def _masked_mean(draw, ex):
    x, m = draw(_x_mask(ex))
    dim = draw(st.sampled_from([None, None, -1, 0] + ([1] if x.shape and len(x.shape) == 2 else [])))
    return {"x": x, "mask": m, "dim": dim, "group": None}


def _masked_mean_oracle(a: Args, out: Any) -> None:
    x = a.kw["x"]
    _no_group(a)
    m = _mask_of(a, x)
    dim = a.kw["dim"]
    if dim is not None:
        expect(isinstance(dim, numbers.Integral) and not isinstance(dim, (bool, np.bool_)), f"accepted dim={dim!r}")
    expect(out.dtype == x.dtype, f"result dtype {out.dtype}, expected {x.dtype}")
    if not a.finite:
        return
    xv = arr(x, "x")
    with np.errstate(over="ignore", invalid="ignore"):
        s = np.max(np.abs(xv * m), axis=dim, keepdims=True, initial=0.0)
        s = np.where(s > 0, s, 1.0)
        num = (xv / s * m).sum(axis=dim, keepdims=True)
        want = np.squeeze(s * num / np.maximum(m.sum(axis=dim, keepdims=True), 1), axis=dim)
        mag = np.squeeze(s, axis=dim)
    close("mean", arr(out, "mean"), want, 16 * eps_of(x.dtype) * mag + tiny_of(x.dtype))


TARGETS["valuelab.losses.masked_mean"].oracle = _masked_mean_oracle


def _var_defined(kw: Dict[str, Any]) -> Optional[str]:
    m = _count(kw)
    need = 2 if kw.get("unbiased", True) else 1
    return None if m >= need else f"{m} valid entries"


def _count(kw: Dict[str, Any]) -> int:
    x, mask = kw["x"], kw.get("mask")
    return int(x.numel()) if mask is None else int(boolarr(mask, "mask").sum())


@target("valuelab.losses.masked_var", defined=_var_defined)
def _masked_var(draw, ex):
    x, m = draw(_x_mask(ex, min_true=2))
    return {"x": x, "mask": m, "unbiased": draw(st.booleans()), "group": None}


def _moments(xv: np.ndarray, m: np.ndarray, unbiased: bool):
    top = float(np.max(np.abs(xv[m]), initial=0.0))
    s = np.float64(math.ldexp(1.0, math.frexp(top)[1] - 1) if top > 0 else 1.0)  # a power of two: dividing by it is exact, where
    y = xv[m] / s  # max|x| itself would round every entry and the variance of close numbers with them
    n = len(y)
    mean = y.mean()
    var = ((y - mean) ** 2).sum() / (n - 1 if unbiased else n)
    return mean, var, s


def _masked_var_oracle(a: Args, out: Any) -> None:
    x = a.kw["x"]
    _no_group(a)
    m = _mask_of(a, x)
    unbiased = flag(a.kw["unbiased"], "unbiased")
    expect(m.sum() >= (2 if unbiased else 1), f"returned a variance of {m.sum()} entries")
    if not a.finite:
        return
    _, var, s = _moments(arr(x, "x"), m, unbiased)
    want = var * s * s
    n = int(m.sum())
    if math.isfinite(want) and want < torch.finfo(x.dtype).max:  # two roundings of a sum of n squares each: (n + 2) eps
        close("var", arr(out, "var"), np.asarray(want),
              16 * eps_of(x.dtype) * ((n + 2) * abs(want) + s * s * 1e-12) + tiny_of(x.dtype))


TARGETS["valuelab.losses.masked_var"].oracle = _masked_var_oracle


@target("valuelab.losses.masked_whiten", defined=_var_defined)
def _masked_whiten(draw, ex):
    x, m = draw(_x_mask(ex, min_true=2))
    return {"x": x, "mask": m, "shift_mean": draw(st.booleans()),
            "eps": draw(st.sampled_from([1e-8, 0.0, 1e-3, 1, 0, np.float64(1e-6)])),
            "group": None, "unbiased": draw(st.booleans())}


def _whiten_ref(xv, m, shift_mean, eps, unbiased):
    mean, var, s = _moments(xv, m, unbiased)
    with np.errstate(over="ignore", divide="ignore"):  # s * s underflows to 0 for s = 2**-997: eps / 0 is inf, not an error
        denom = var + (np.float64(eps) / (s * s) if eps > 0 else 0.0)
    out = (xv / s - mean) / math.sqrt(denom) if denom > 0 else (xv / s - mean)
    if not shift_mean:
        out = out + mean * s
    return np.where(m, out, 0.0), 1.0 / math.sqrt(denom) if denom > 0 else 1.0


def _masked_whiten_oracle(a: Args, out: Any) -> None:
    x = a.kw["x"]
    _no_group(a)
    m = _mask_of(a, x)
    shift, unbiased = flag(a.kw["shift_mean"], "shift_mean"), flag(a.kw["unbiased"], "unbiased")
    eps = scalar(a.kw["eps"], "eps")
    expect(eps >= 0 and math.isfinite(eps), f"accepted eps={eps}")
    like_input("result", out, x)
    if not a.finite:
        return
    xv = arr(x, "x")
    want, gain = _whiten_ref(xv, m, shift, eps, unbiased)
    mean_mag = 0 if shift else np.max(np.abs(xv[m]), initial=0)
    close("whitened", arr(out, "whitened"), want, 64 * eps_of(x.dtype) * (1 + np.abs(want) + gain + mean_mag))


TARGETS["valuelab.losses.masked_whiten"].oracle = _masked_whiten_oracle


AGGREGATIONS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum")


def _aggregate(x: np.ndarray, m: np.ndarray, how: str, count: Optional[float] = None) -> float:
    x, m = as_batch(x), as_batch(m).astype(np.float64)
    if how == "token-mean":
        num, den = (x * m).sum(), m.sum()
    else:
        per = (x * m).sum(-1)
        if how == "seq-mean-token-mean":
            per = per / np.maximum(m.sum(-1), 1)
        nonempty = m.sum(-1) > 0
        num, den = per[nonempty].sum(), nonempty.sum()
    return num / max(den if count is None else count, 1)


def _local_count(m: np.ndarray, how: str) -> float:
    m = as_batch(m)
    return float(m.sum()) if how == "token-mean" else float((m.sum(-1) > 0).sum())


@target("valuelab.losses.aggregate")
def _aggregate_args(draw, ex):
    shape = draw(batch_shape())
    x = draw(ftensor(shape, ex, dtype=draw(WIDE_DTYPE)))
    m = draw(bits(shape, kinds=("float",)))
    return {"per_token": x, "mask": m._replace(dtype=x.dtype), "aggregation": draw(st.sampled_from(AGGREGATIONS))}


def _aggregate_oracle(a: Args, out: Any) -> None:
    x, mask, how = a.kw["per_token"], a.kw["mask"], a.kw["aggregation"]
    expect(how in AGGREGATIONS, f"accepted aggregation={how!r}")
    same_shape(mask, tuple(x.shape), "mask", "per_token")
    mv = arr(mask, "mask")
    expect(bool(np.all((mv == 0) | (mv == 1))), f"accepted mask values other than 0 and 1: {np.unique(mv)[:4]}")
    if not a.finite:
        return
    xv = arr(x, "per_token")
    with np.errstate(over="ignore", invalid="ignore"):
        want = _aggregate(xv, mv != 0, how)
        mag = _aggregate(np.abs(xv), mv != 0, how)
    if math.isfinite(want):
        eps = max(eps_of(x.dtype), eps_of(out.dtype))
        close("aggregate", arr(out, "aggregate").reshape(()), np.asarray(want),
              16 * eps * mag * (1 + (x.shape[-1] if x.dim() else 1)) + tiny_of(out.dtype))


TARGETS["valuelab.losses.aggregate"].oracle = _aggregate_oracle


@st.composite
def _loss_kwargs(draw, ex):
    shape = draw(batch_shape(empty_ok=False))
    dev, dtype = draw(DEVICE), draw(WIDE_DTYPE)
    clip = draw(st.one_of(st.none(), st.floats(0, 2), st.sampled_from([0, 0.2, np.float64(0.1)])))
    kw = {"values": draw(ftensor(shape, ex, dtype, dev)), "returns": draw(ftensor(shape, ex, dtype, dev)),
          "mask": draw(st.none() | bits(shape, device=dev)),
          "old_values": draw(ftensor(shape, ex, dtype, dev)) if clip is not None or draw(st.booleans()) else None,
          "clip_range": clip, "aggregation": draw(st.sampled_from(AGGREGATIONS)), "group": None}
    kw["global_count"] = None
    if draw(st.booleans()):
        m = np.ones(shape, bool) if kw["mask"] is None else np.asarray(_fill_bool(kw["mask"]))
        local = _local_count(m, kw["aggregation"])
        kw["global_count"] = draw(st.sampled_from([local, local + 1, float(local) * 3, int(local) + 7, 1e9]))
        if local == 0 and kw["global_count"] == 0:
            kw["global_count"] = 1
    return kw


def _fill_bool(t: T) -> np.ndarray:
    n = math.prod(t.shape)
    vals = [t.values[i % len(t.values)] for i in range(n)] if t.values else [0] * n
    x = np.array([bool(v) for v in vals], dtype=bool).reshape(t.shape)
    if t.layout == "expanded" and t.shape and t.shape[0] > 0:
        x = np.broadcast_to(x[:1], t.shape)
    return x


def _loss_ref(a: Args):
    kw = a.kw
    v, g = kw["values"], kw["returns"]
    same_shape(g, tuple(v.shape), "returns", "values")
    m = _mask_of(a, v)
    how = kw["aggregation"]
    expect(how in AGGREGATIONS, f"accepted aggregation={how!r}")
    _no_group(a)
    vv, gv = arr(v, "values"), arr(g, "returns")
    sq = (vv - gv) ** 2
    clip = kw["clip_range"]
    binds = np.zeros(sq.shape, bool)
    old = None
    if kw.get("old_values") is not None:
        same_shape(kw["old_values"], tuple(v.shape), "old_values", "values")
        old = arr(kw["old_values"], "old_values")
    if clip is not None:
        c = scalar(clip, "clip_range")
        expect(c >= 0 and math.isfinite(c), f"accepted clip_range={c}")
        expect(old is not None, "accepted clip_range without old_values")
        clipped = old + np.clip(vv - old, -c, c)
        csq = (clipped - gv) ** 2
        binds = csq > sq
        sq = np.maximum(sq, csq)
    count = kw.get("global_count")
    if count is not None:
        count = scalar(count, "global_count")
        local = _local_count(m, how)
        expect(count >= local and count > 0,
               f"accepted global_count={count} below this shard's own count {local} (or not positive)")
    return sq, m, how, count, binds, vv, gv


def _loss_oracle(a: Args, out: Any) -> None:
    sq, m, how, count, *_ = _loss_ref(a)
    v = a.kw["values"]
    expect(isinstance(out, torch.Tensor) and out.dim() == 0, f"the loss is {type(out).__name__} {getattr(out, 'shape', '')}")
    if not a.finite:
        return
    with np.errstate(over="ignore", invalid="ignore"):
        want = 0.5 * _aggregate(sq, m, how, count)
    if math.isfinite(want) and abs(want) < torch.finfo(v.dtype).max:
        # each difference is off by up to delta (the clip bounds round to the dtype): the squares by 2|d| delta + delta^2
        old = a.kw.get("old_values")
        c = abs(scalar(a.kw["clip_range"], "clip_range")) if a.kw["clip_range"] is not None else 0.0
        scale = max([np.abs(arr(x, "x")).max(initial=0) for x in (v, a.kw["returns"]) + ((old,) if old is not None else ())]
                    + [c])
        delta = 4 * eps_of(v.dtype) * min(scale, float(torch.finfo(v.dtype).max))  # a clip bound past the dtype is its max
        with np.errstate(over="ignore"):
            tol = float(64 * eps_of(v.dtype) * abs(want) + 4 * math.sqrt(2 * abs(want)) * delta + np.float64(delta)**2
                        + tiny_of(v.dtype))
        close("loss", arr(out, "loss").reshape(()), np.asarray(want), tol)


def _loss_stats_defined(kw: Dict[str, Any]) -> Optional[str]:
    g = arr(kw["returns"], "returns")
    m = np.ones(g.shape, bool) if kw.get("mask") is None else boolarr(kw["mask"], "mask")
    sel = g[m]
    if not (sel.size and np.var(sel) > 0):
        return "returns have no spread over the valid tokens"
    return _ev_fits(g, arr(kw["values"], "values"), m, kw["values"])


def _ev_fits(g: np.ndarray, v: np.ndarray, m: np.ndarray, like: Any) -> Optional[str]:
    """None when the explained variance of ``v`` against ``g`` fits ``like``'s dtype; else why a refusal is right."""
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        ev = 1 - np.var((g - v)[m]) / np.var(g[m])
    top = torch.finfo(like.dtype).max if isinstance(like, torch.Tensor) else np.inf
    if not np.isfinite(ev) or abs(ev) > top / 2:  # errors of 2 against a spread of 1e-38: EV of -3e76, past float32
        return "the explained variance does not fit the dtype"
    return None


def _loss_stats_oracle(a: Args, out: Any) -> None:
    sq, m, how, count, binds, vv, gv = _loss_ref(a)
    v = a.kw["values"]
    expect(isinstance(out, tuple) and len(out) == 3, f"returned {type(out).__name__}")
    _loss_oracle(a, out[0])
    if not a.finite:
        return
    frac = binds[m].mean() if m.any() else 0.0
    close("clip_fraction", arr(out[1], "clip_fraction").reshape(()), np.asarray(frac), 1e-6)
    with np.errstate(over="ignore", invalid="ignore"):
        tot = np.var(gv[m])
        ev = 1 - np.var((gv - vv)[m]) / tot if tot > 0 else np.nan
    if np.isfinite(ev) and abs(ev) < 1e6:
        # a variance of numbers of size s spread by sd is off by about eps * s / sd relatively (the mean's rounding,
        # each difference's): values of 5e15 against returns spread by 3e4 leave EV uncertain at 1e-5, not 1e-11
        n, top, sd = int(m.sum()), float(max(np.abs(gv[m]).max(), np.abs(vv[m]).max())), math.sqrt(tot)
        k = 16 * n * eps_of(v.dtype) * top / sd
        close("explained_variance", arr(out[2], "explained_variance").reshape(()), np.asarray(ev),
              64 * eps_of(v.dtype) * (1 + abs(ev)) * 1e3 + k * (1 + abs(ev)) + k * k)


target("valuelab.losses.value_loss", oracle=_loss_oracle)(lambda draw, ex: draw(_loss_kwargs(ex)))
target("valuelab.losses.value_loss_stats", oracle=_loss_stats_oracle, defined=_loss_stats_defined)(
    lambda draw, ex: draw(_loss_kwargs(ex)))


# ---------------------------------------------------------------------------
# valuelab.runtime, valuelab.lab.stats
# ---------------------------------------------------------------------------

SEEDS = st.one_of(st.integers(0, 2**63 - 1), st.sampled_from([0, 1, 2**32, 2**63 - 1, np.int64(7), np.uint32(5)]))


@target("valuelab.runtime.pick_device")
def _pick_device(draw, ex):
    return draw(st.just({}))


def _pick_device_oracle(a: Args, out: Any) -> None:
    expect(isinstance(out, torch.device) and out.type == ("cuda" if torch.cuda.is_available() else "cpu"),
           f"pick_device() = {out!r}")


TARGETS["valuelab.runtime.pick_device"].oracle = _pick_device_oracle


@target("valuelab.runtime.seed_everything")
def _seed_everything(draw, ex):
    return {"seed": draw(SEEDS)}


def _seed_oracle(a: Args, out: Any) -> None:
    seed = a.kw["seed"]
    expect(isinstance(seed, numbers.Integral) and not isinstance(seed, (bool, np.bool_)), f"accepted seed={seed!r}")
    expect(0 <= int(seed) <= 2**63 - 1, f"accepted seed={seed!r} outside [0, 2**63 - 1]")
    expect(isinstance(out, torch.Generator) and out.initial_seed() == int(seed),
           f"returned {out!r} (initial seed {getattr(out, 'initial_seed', lambda: None)()}), expected a generator seeded {seed}")


TARGETS["valuelab.runtime.seed_everything"].oracle = _seed_oracle


@st.composite
def sample(draw, ex, n=None):
    n = draw(st.integers(2, 12)) if n is None else n
    vals = draw(st.lists(floats(ex) if ex else st.floats(-1e3, 1e3), min_size=n, max_size=n))
    if not ex and len(set(vals)) == 1:
        vals[0] += 1.0
    kind = draw(st.sampled_from(["list", "numpy", "tensor", "tuple"]))
    if kind == "list":
        return list(vals)
    if kind == "tuple":
        return tuple(vals)
    t = T((n,), draw(WIDE_DTYPE), tuple(vals), draw(LAYOUT))
    return O("numpy", (t,)) if kind == "numpy" else t


LEVEL = st.one_of(st.floats(0.5, 0.999), st.sampled_from([0.95, 0.9, 0.99, 0.5]))


def _t_ppf(p: float, df: int) -> float:
    from scipy.stats import t as student  # noqa: PLC0415

    return float(student.ppf(p, df))


def _sample_of(x: Any, name: str) -> np.ndarray:
    a = arr(x, name)
    expect(a.ndim == 1 and a.size >= 2, f"returned an interval for {name} of shape {a.shape}")
    return a


def _check_interval(ci: Any, x: np.ndarray, level: float, name: str = "interval") -> None:
    from valuelab.lab.stats import Interval  # noqa: PLC0415

    expect(isinstance(ci, Interval), f"{name} is a {type(ci).__name__}")
    n = x.size
    scale = np.max(np.abs(x))
    mean = float(np.mean(x / scale) * scale) if scale > 0 else 0.0
    sd = float(np.std(x / scale, ddof=1) * scale) if scale > 0 else 0.0
    half = _t_ppf(0.5 + level / 2, n - 1) * sd / math.sqrt(n)
    expect(ci.n == n and ci.level == level, f"{name}: n={ci.n}, level={ci.level}, expected {n}, {level}")
    if not all(map(math.isfinite, (mean, half, mean - half, mean + half))):
        return  # the true interval does not fit a float: the library must raise, checked as non-finite output
    tol = 1e-6 * (abs(half) + abs(mean)) + 1e-300
    for k, want in (("mean", mean), ("half", half), ("lo", mean - half), ("hi", mean + half)):
        expect(abs(getattr(ci, k) - want) <= tol + 1e-12 * scale, f"{name}.{k} = {getattr(ci, k)!r}, expected {want!r}")


@target("valuelab.lab.stats.mean_ci")
def _mean_ci(draw, ex):
    return {"x": draw(sample(ex)), "level": draw(LEVEL)}


def _mean_ci_oracle(a: Args, out: Any) -> None:
    level = scalar(a.kw["level"], "level")
    expect(0 < level < 1, f"accepted level={level}")
    x = _sample_of(a.kw["x"], "x")
    if a.finite:
        _check_interval(out, x, level)


TARGETS["valuelab.lab.stats.mean_ci"].oracle = _mean_ci_oracle


@target("valuelab.lab.stats.paired_ci")
def _paired_ci(draw, ex):
    n = draw(st.integers(2, 12))
    return {"a": draw(sample(ex, n)), "b": draw(sample(ex, n)), "level": draw(LEVEL)}


def _paired_ci_oracle(a: Args, out: Any) -> None:
    level = scalar(a.kw["level"], "level")
    expect(0 < level < 1, f"accepted level={level}")
    x, y = _sample_of(a.kw["a"], "a"), _sample_of(a.kw["b"], "b")
    expect(x.size == y.size, f"paired {x.size} runs with {y.size}")
    d = x - y
    if a.finite and np.isfinite(d).all():
        _check_interval(out, d, level)


TARGETS["valuelab.lab.stats.paired_ci"].oracle = _paired_ci_oracle


@target("valuelab.lab.stats.t_quantile")
def _t_quantile(draw, ex):
    p = draw(st.one_of(st.floats(0.5, 0.9995), st.sampled_from([0.5, 0.975, 0.995, 0.9995])))
    return {"p": p, "df": draw(st.one_of(st.integers(1, 60), st.sampled_from([1, 2, 1000, 10**6])))}


def _t_quantile_oracle(a: Args, out: Any) -> None:
    p, df = scalar(a.kw["p"], "p"), a.kw["df"]
    expect(isinstance(df, numbers.Integral) and not isinstance(df, (bool, np.bool_)) and df >= 1, f"accepted df={df!r}")
    expect(0.5 <= p < 1, f"accepted p={p}")
    expect(isinstance(out, float) and math.isfinite(out), f"t_quantile = {out!r}")
    if p <= 0.9995:
        from scipy.stats import norm  # noqa: PLC0415

        want = _t_ppf(p, int(df)) if df <= 10**9 else float(norm.ppf(p))
        expect(abs(out - want) <= 1e-6 * max(1.0, abs(want)), f"t_quantile({p}, {df}) = {out!r}, scipy gives {want!r}")


TARGETS["valuelab.lab.stats.t_quantile"].oracle = _t_quantile_oracle


@target("valuelab.lab.stats.equivalence")
def _equivalence(draw, ex):
    return {"x": draw(sample(ex)), "margin": draw(st.one_of(st.floats(1e-3, 1e3), st.sampled_from([1, 0.5]))),
            "alpha": draw(st.one_of(st.floats(0.001, 0.25), st.sampled_from([0.05, 0.1])))}


def _equivalence_oracle(a: Args, out: Any) -> None:
    margin, alpha = scalar(a.kw["margin"], "margin"), scalar(a.kw["alpha"], "alpha")
    expect(margin > 0 and math.isfinite(margin), f"accepted margin={margin}")
    expect(0 < alpha < 0.5, f"accepted alpha={alpha}")
    x = _sample_of(a.kw["x"], "x")
    if not a.finite:
        return
    _check_interval(out.interval, x, 1 - 2 * alpha, "interval")
    ci = out.interval
    expect(out.equivalent == bool(-margin < ci.lo and ci.hi < margin), f"equivalent={out.equivalent} for {ci}")


TARGETS["valuelab.lab.stats.equivalence"].oracle = _equivalence_oracle


@target("valuelab.lab.stats.pm")
def _pm(draw, ex):
    if draw(st.booleans()):
        ci = O("interval_of", (draw(sample(False)), draw(LEVEL)))
    else:
        f = floats(ex) if ex else st.floats(-1e6, 1e6)
        ci = O("interval", (draw(f), draw(f), draw(f), draw(f), draw(st.integers(2, 9)), 0.95))
    return {"ci": ci, "decimals": draw(st.one_of(st.integers(0, 12), st.sampled_from([0, 2, 3, np.int64(2)])))}


def _pm_oracle(a: Args, out: Any) -> None:
    from valuelab.lab.stats import Interval  # noqa: PLC0415

    ci, d = a.kw["ci"], a.kw["decimals"]
    expect(isinstance(ci, Interval), f"accepted ci of type {type(ci).__name__}")
    expect(isinstance(d, numbers.Integral) and not isinstance(d, (bool, np.bool_)) and d >= 0, f"accepted decimals={d!r}")
    want = f"{round(ci.mean, int(d)) + 0.0:.{int(d)}f} ± {ci.half:.{int(d)}f}"
    expect(out == want, f"pm = {out!r:.80}, expected {want!r:.80}")


TARGETS["valuelab.lab.stats.pm"].oracle = _pm_oracle


# ---------------------------------------------------------------------------
# valuelab.packed
# ---------------------------------------------------------------------------


@st.composite
def cu_seqlens(draw, n_tokens=None):
    lengths = draw(st.lists(st.integers(0, 6), min_size=1, max_size=6))
    if n_tokens is not None:
        lengths[-1] = max(0, n_tokens - sum(lengths[:-1]))
        if sum(lengths) != n_tokens:
            lengths = [n_tokens]
    cu = [0]
    for k in lengths:
        cu.append(cu[-1] + k)
    return T((len(cu),), draw(st.sampled_from(["int64", "int32"])), tuple(cu), draw(INDEX_LAYOUT))


def _cu(x: Any, n_tokens: int) -> np.ndarray:
    cu = index_tensor(x, "cu_seqlens")
    expect(cu.ndim == 1 and cu.size >= 2, f"accepted cu_seqlens of shape {cu.shape}")
    expect(cu[0] == 0 and cu[-1] == n_tokens and bool(np.all(cu[1:] >= cu[:-1])),
           f"accepted cu_seqlens={cu.tolist()[:12]} for {n_tokens} tokens")
    return cu


@target("valuelab.packed.packing")
def _packing(draw, ex):
    cu = draw(cu_seqlens())
    return {"cu_seqlens": cu, "n_tokens": cu.values[-1]}


def _packing_oracle(a: Args, out: Any) -> None:
    n = a.kw["n_tokens"]
    expect(isinstance(n, numbers.Integral) and not isinstance(n, (bool, np.bool_)), f"accepted n_tokens={n!r}")
    cu = _cu(a.kw["cu_seqlens"], int(n))
    rows = np.concatenate([np.full(cu[i + 1] - cu[i], i) for i in range(len(cu) - 1)] + [np.zeros(0, int)])
    cols = np.concatenate([np.arange(cu[i + 1] - cu[i]) for i in range(len(cu) - 1)] + [np.zeros(0, int)])
    expect(np.array_equal(out.rows.cpu().numpy(), rows) and np.array_equal(out.cols.cpu().numpy(), cols),
           f"rows/cols {out.rows.tolist()[:10]}/{out.cols.tolist()[:10]} != {rows.tolist()[:10]}/{cols.tolist()[:10]}")
    lengths = np.diff(cu)
    expect(out.n_seqs == len(lengths) and out.width == (int(lengths.max()) if len(lengths) else 0),
           f"n_seqs={out.n_seqs}, width={out.width}")


TARGETS["valuelab.packed.packing"].oracle = _packing_oracle


@st.composite
def _packed_kwargs(draw, ex, values=True):
    cu = draw(cu_seqlens())
    N, S = cu.values[-1], len(cu.values) - 1
    dtype = draw(FLOAT_DTYPE)
    kw = {"rewards": draw(ftensor((N,), ex, dtype))}
    if values:
        kw["values"] = draw(ftensor((N,), ex, dtype))
    kw["cu_seqlens"] = cu
    kw["gamma"] = draw(unit_arg((N,), tensors=False))
    if values:
        kw["lam"] = draw(unit_arg((N,), tensors=False))
    kind = draw(st.sampled_from(["none", "some", "all"]))
    if kind == "none":
        kw["truncated"], kw["bootstrap"] = None, None
    else:
        trunc = tuple(draw(st.lists(st.booleans(), min_size=S, max_size=S))) if kind == "some" else (True,) * S
        kw["truncated"] = T((S,), "bool", trunc, draw(LAYOUT))
        kw["bootstrap"] = draw(ftensor((S,), ex, dtype=draw(WIDE_DTYPE)))
    return kw


def _packed_oracle(kind: str):
    def oracle(a: Args, out: Any) -> None:
        kw = a.kw
        r = kw["rewards"]
        expect(r.dim() == 1, f"accepted rewards of shape {tuple(r.shape)}")
        cu = _cu(kw["cu_seqlens"], r.numel())
        S = len(cu) - 1
        g = _factor(kw["gamma"], "gamma", (1,), r.dtype)[0]
        lam = _factor(kw["lam"], "lam", (1,), r.dtype)[0] if kind == "gae" else None
        for name in ("gamma", "lam") if kind == "gae" else ("gamma",):  # numbers: a per-token tensor has no layout here
            x = kw[name]
            expect(not isinstance(x, torch.Tensor) or x.numel() == 1, f"accepted {name} of shape {tuple(getattr(x, 'shape', ()))}")
        boot = np.zeros(S)
        trunc = kw.get("truncated")
        if trunc is not None:
            expect(isinstance(trunc, torch.Tensor) and trunc.dtype == torch.bool,
                   f"accepted truncated={trunc!r:.60} (not a bool tensor)")
            same_shape(trunc, (S,), "truncated", "the sequences")
            tb = boolarr(trunc, "truncated")
            b = kw.get("bootstrap")
            if tb.any():
                expect(b is not None, "accepted truncated sequences without bootstrap")
                same_shape(b, (S,), "bootstrap", "the sequences")
                boot = np.where(tb, arr(b, "bootstrap"), 0.0)
        else:
            expect(kw.get("bootstrap") is None, "accepted bootstrap without truncated")
        outs = ("advantages", "returns") if kind == "gae" else ("returns",)
        got = list(out) if kind == "gae" else [out]
        for name, y in zip(outs, got):
            like_input(name, y, r)
        if not a.finite:
            return
        rv = arr(r, "rewards")
        vv = arr(kw["values"], "values") if kind == "gae" else None
        want = [np.zeros(len(rv)) for _ in outs]
        mag = np.zeros(len(rv))
        for s in range(S):
            sl = slice(cu[s], cu[s + 1])
            L = cu[s + 1] - cu[s]
            if not L:
                continue
            gg = np.full(L, g)
            if kind == "gae":
                v = vv[sl]
                nxt = np.append(v[1:], boot[s])
                adv = _scan(rv[sl] + g * nxt - v, gg * lam, 0.0)
                want[0][sl], want[1][sl] = adv, adv + v
                mag[sl] = _scan(np.abs(rv[sl]) + g * np.abs(nxt) + np.abs(v), gg * lam, 0.0) + np.abs(v)
            else:
                want[0][sl] = _scan(rv[sl], gg, boot[s])
                mag[sl] = _scan(np.abs(rv[sl]), gg, abs(boot[s]))
        tol = 16 * eps_of(r.dtype) * (len(rv) + 2) * mag + torch.finfo(r.dtype).tiny * 4
        for name, y, w in zip(outs, got, want):
            close(name, arr(y, name), w, tol)

    return oracle


target("valuelab.packed.gae_packed", oracle=_packed_oracle("gae"))(lambda draw, ex: draw(_packed_kwargs(ex)))
target("valuelab.packed.discounted_returns_packed", oracle=_packed_oracle("returns"))(
    lambda draw, ex: draw(_packed_kwargs(ex, values=False)))


# ---------------------------------------------------------------------------
# valuelab.integrations: hole conventions, verl, OpenRLHF, TRL, TorchRL
# ---------------------------------------------------------------------------


@target("valuelab.integrations._conventions.hole_convention")
def _hole_convention(draw, ex):
    return {"name": draw(st.sampled_from(["skip", "zero"]))}


def _hole_convention_oracle(a: Args, out: Any) -> None:
    from valuelab.integrations import HOLE_CONVENTIONS  # noqa: PLC0415

    name = a.kw["name"]
    expect(isinstance(name, str) and name in HOLE_CONVENTIONS, f"accepted name={name!r:.60}")
    expect(out == HOLE_CONVENTIONS[name], f"hole_convention({name!r}) = {out!r:.60}")


TARGETS["valuelab.integrations._conventions.hole_convention"].oracle = _hole_convention_oracle


@st.composite
def _x_and_mask(draw, ex):
    shape = draw(batch_shape())
    return {"x": draw(ftensor(shape, ex)), "mask": draw(bits(shape))}


def _holes_oracle(kind: str):
    def oracle(a: Args, out: Any) -> None:
        x = a.kw["x"]
        same_shape(a.kw["mask"], tuple(x.shape), "mask", "x")
        like_input("result", out, x)
        if not a.finite:
            return
        xv, m = as_batch(arr(x, "x")), as_batch(boolarr(a.kw["mask"], "mask"))
        want = np.where(m, xv, 0.0)
        if kind == "carry":
            for b in range(xv.shape[0]):
                nxt = 0.0
                for t in range(xv.shape[1] - 1, -1, -1):
                    if m[b, t]:
                        nxt = xv[b, t]
                    want[b, t] = nxt
        close("result", as_batch(arr(out, "result")), want, 0.0)

    return oracle


target("valuelab.integrations._conventions.zero_holes", oracle=_holes_oracle("zero"))(
    lambda draw, ex: draw(_x_and_mask(ex)))
target("valuelab.integrations._conventions.carry_into_holes", oracle=_holes_oracle("carry"))(
    lambda draw, ex: draw(_x_and_mask(ex)))


@lru_cache(maxsize=None)
def _peer(name: str):
    from valuelab.integrations import peers  # noqa: PLC0415

    if not peers.installed({"verl": "verl", "openrlhf": "openrlhf"}[name]):
        return None
    return peers.verl_gae() if name == "verl" else peers.openrlhf_gae()


def _trainer_rate(x: Any, name: str, rows: int, per_row: bool) -> Any:
    """gamma/lam as verl and OpenRLHF take them (a number, a 0-d tensor, or per row a (rows,) tensor), float64."""
    if isinstance(x, torch.Tensor) and x.dim() > 0:
        expect(per_row and tuple(x.shape) == (rows,), f"accepted {name} of shape {tuple(x.shape)}")
        a = arr(x, name)
        expect(bool(np.all((a >= 0) & (a <= 1))), f"accepted {name} outside [0, 1]")
        return torch.tensor(a)
    v = scalar(x, name)
    expect(0 <= v <= 1, f"accepted {name}={v}")
    return v


@st.composite
def _trainer_kwargs(draw, ex, names, per_row):
    shape = draw(batch_shape(empty_ok=False))
    if math.prod(shape) < 2:
        shape = (2, 3)
    dt = draw(WIDE_DTYPE)
    r = draw(ftensor(shape, ex, dt))
    v = draw(ftensor(shape, ex, draw(st.sampled_from([dt, dt, "float32", "float64", "bfloat16"]))))
    m = draw(bits(shape, min_true=2))
    rows = shape[0] if len(shape) == 2 else 1
    rate = lambda: draw(st.one_of(UNIT, st.sampled_from([0, 1, 0.99, np.float64(0.9)]),  # noqa: E731
                                   st.builds(lambda x: T((), "float32", (x,)), UNIT),
                                   *([st.builds(lambda x: T((rows,), "float64", (x,)), UNIT)] if per_row and len(shape) == 2 else [])))
    return dict(zip(names, [r, v, m, rate(), rate()]))


def _advantage_pair(out: Any, like: torch.Tensor, other: torch.Tensor) -> torch.dtype:
    """A trainer adapter's ``(advantages, returns)``: two tensors of ``like``'s shape in the promoted dtype (returned)."""
    expect(isinstance(out, tuple) and len(out) == 2, f"returned {type(out).__name__}")
    dtype = torch.promote_types(like.dtype, other.dtype)
    for name, y in zip(("advantages", "returns"), out):
        expect(y.dtype == dtype and y.shape == like.shape,
               f"{name}: {y.dtype} {tuple(y.shape)}, expected {dtype} {tuple(like.shape)}")
    return dtype


def _verl_oracle(a: Args, out: Any) -> None:
    kw = a.kw
    r, v, mask = kw["token_level_rewards"], kw["values"], kw["response_mask"]
    same_shape(v, tuple(r.shape), "values", "token_level_rewards")
    same_shape(mask, tuple(r.shape), "response_mask", "token_level_rewards")
    rows = r.shape[0] if r.dim() == 2 else 1
    g = _trainer_rate(kw["gamma"], "gamma", rows, r.dim() == 2)
    lam = _trainer_rate(kw["lam"], "lam", rows, r.dim() == 2)
    dtype = _advantage_pair(out, r, v)
    peer = _peer("verl")
    if not a.finite or peer is None:
        return
    m = torch.tensor(as_batch(boolarr(mask, "response_mask")), dtype=torch.float64)
    if m.sum() < 2:
        return
    rr, vv = torch.tensor(as_batch(arr(r, "r"))), torch.tensor(as_batch(arr(v, "v")))
    adv, ret = peer(rr, vv, m, g, lam)
    scale = 1 + float(rr.abs().sum() + vv.abs().sum())
    tol = 64 * eps_of(dtype) * (r.shape[-1] + 2) * scale
    close("returns", as_batch(arr(out[1], "returns")), ret.numpy(), tol)
    raw = ret - vv  # the advantages before whitening (verl's returns are advantages + values)
    mean = float((raw * m).sum() / m.sum())
    var = float(((raw - mean) ** 2 * m).sum() / (m.sum() - 1))
    if var < 1e-6:  # no spread: verl's mean (over mask.sum() + 1e-8) leaves a residue that its 1e-8 then amplifies
        return
    if math.sqrt(var) <= tol:  # a spread below the inputs' rounding (65504 next to 9e15 in float32): whitening
        return                 # divides by rounding noise, and no answer in the dtype is more right than another
    gain = 1 / math.sqrt(var + 1e-8)
    # verl's masked_mean divides by mask.sum() + 1e-8: its mean is off by |mean| 1e-8 / n, whitened by the gain
    slack = 1e-7 * gain * (1 + np.abs(adv.numpy())) + 2e-8 * abs(mean) * gain
    close("advantages", as_batch(arr(out[0], "advantages")), adv.numpy(), tol * (1 + gain) + slack)


target("valuelab.integrations.verl.compute_gae_advantage_return", oracle=_verl_oracle)(
    lambda draw, ex: draw(_trainer_kwargs(ex, ["token_level_rewards", "values", "response_mask", "gamma", "lam"], True)))


@target("valuelab.integrations.verl.whiten", defined=lambda kw: None if _count({"x": kw["values"], "mask": kw["mask"]}) >= 2 else "fewer than 2 valid")
def _verl_whiten(draw, ex):
    shape = draw(batch_shape(empty_ok=False))
    return {"values": draw(ftensor(shape, ex)), "mask": draw(bits(shape, min_true=2)),
            "eps": draw(st.sampled_from([1e-8, 0.0, 1e-3, 1]))}


def _verl_whiten_oracle(a: Args, out: Any) -> None:
    x, mask = a.kw["values"], a.kw["mask"]
    same_shape(mask, tuple(x.shape), "mask", "values")
    eps = scalar(a.kw["eps"], "eps")
    expect(eps >= 0 and math.isfinite(eps), f"accepted eps={eps}")
    like_input("result", out, x)
    if not a.finite:
        return
    xv, m = arr(x, "values"), boolarr(mask, "mask")
    mean, var, s = _moments(xv, m, True)
    with np.errstate(over="ignore", divide="ignore"):  # in units of s: var * s * s is subnormal for a spread of 1e-161
        denom = var + (np.float64(eps) / (s * s) if eps > 0 else 0.0)  # (precision lost); s * s may underflow to 0
    if denom > 0 and math.isfinite(denom):
        with np.errstate(over="ignore"):
            want = (xv / s - mean) / math.sqrt(denom)
        if np.isfinite(want).all():
            close("whitened", arr(out, "whitened"), want, 64 * eps_of(x.dtype) * (1 + np.abs(want) + 1 / math.sqrt(denom)))


TARGETS["valuelab.integrations.verl.whiten"].oracle = _verl_whiten_oracle


def _openrlhf_oracle(a: Args, out: Any) -> None:
    kw = a.kw
    v, r, mask = kw["values"], kw["rewards"], kw["action_mask"]
    same_shape(r, tuple(v.shape), "rewards", "values")
    if mask is not None:
        same_shape(mask, tuple(v.shape), "action_mask", "values")
    g = _trainer_rate(kw["gamma"], "gamma", 1, False)
    lam = _trainer_rate(kw["lambd"], "lambd", 1, False)
    dtype = _advantage_pair(out, v, r)
    peer = _peer("openrlhf")
    if not a.finite or peer is None:
        return
    if v.shape[-1] == 0:  # no token: OpenRLHF's own loop stacks an empty list and fails; valuelab returns empty tensors
        expect(out[0].numel() == 0 and out[1].numel() == 0, "returned entries for a batch with no token")
        return
    m = None if mask is None else torch.tensor(as_batch(boolarr(mask, "action_mask")), dtype=torch.float64)
    rr, vv = torch.tensor(as_batch(arr(r, "rewards"))), torch.tensor(as_batch(arr(v, "values")))
    adv, ret = peer(vv, rr, m, g, lam)
    tol = 64 * eps_of(dtype) * (v.shape[-1] + 2) * (1 + float(rr.abs().sum() + vv.abs().sum()))
    close("advantages", as_batch(arr(out[0], "advantages")), adv.numpy(), tol)
    close("returns", as_batch(arr(out[1], "returns")), ret.numpy(), tol)


@st.composite
def _openrlhf_kwargs(draw, ex, with_self):
    kw = draw(_trainer_kwargs(ex, ["rewards", "values", "action_mask", "gamma", "lambd"], False))
    if draw(st.booleans()):
        kw["action_mask"] = None
    out = {"self": draw(st.sampled_from([None, 0, "maker"]))} if with_self else {}
    out.update(values=kw["values"], rewards=kw["rewards"], action_mask=kw["action_mask"], gamma=kw["gamma"],
               lambd=kw["lambd"])
    return out


target("valuelab.integrations.openrlhf.advantages_and_returns", oracle=_openrlhf_oracle)(
    lambda draw, ex: draw(_openrlhf_kwargs(ex, False)))
target("valuelab.integrations.openrlhf.get_advantages_and_returns", oracle=_openrlhf_oracle)(
    lambda draw, ex: draw(_openrlhf_kwargs(ex, True)))


def _fake_verl() -> types.ModuleType:
    mod = types.ModuleType("fake_core_algos")
    mod.compute_gae_advantage_return = _original_gae
    mod.ADV_ESTIMATOR_REGISTRY = {"gae": _original_gae}
    return mod


def _original_gae(*args, **kwargs):  # the "trainer's own" function of the fake modules
    return None


class _FakeMaker:
    def get_advantages_and_returns(self, *args, **kwargs):
        return None


def _fake_maker() -> type:
    return type("FakeExperienceMaker", (_FakeMaker,), {"get_advantages_and_returns": _FakeMaker.get_advantages_and_returns})


def _install_oracle(module: str, attr: str, owner_kw: str):
    def oracle(a: Args, restore: Any) -> None:
        import importlib  # noqa: PLC0415

        adapter = importlib.import_module(module)
        owner = a.kw.get(owner_kw)
        expect(callable(restore), f"install returned {restore!r}, not a restore function")
        if owner is not None:
            expect(getattr(owner, attr) is getattr(adapter, attr), f"install did not put valuelab's {attr} in place")
        expect(adapter.is_installed(owner) is True, "is_installed() is not True after install")
        restore()
        expect(adapter.is_installed(owner) is False, "is_installed() is not False after restore")
        if owner is not None:
            want = _original_gae if module.endswith("verl") else _FakeMaker.get_advantages_and_returns
            expect(getattr(owner, attr) is want, "restore did not put the trainer's function back")

    return oracle


def _is_installed_oracle(module: str, attr: str, owner_kw: str):
    def oracle(a: Args, out: Any) -> None:
        expect(isinstance(out, bool), f"is_installed returned {out!r}")
        owner = a.kw.get(owner_kw)
        if owner is not None:
            import importlib  # noqa: PLC0415

            adapter = importlib.import_module(module)
            expect(out == (getattr(owner, attr) is getattr(adapter, attr)), f"is_installed() = {out}")

    return oracle


for _mod, _attr, _kw, _fake in (("valuelab.integrations.verl", "compute_gae_advantage_return", "core_algos", "fake_verl"),
                                ("valuelab.integrations.openrlhf", "get_advantages_and_returns", "experience_maker",
                                 "fake_maker")):
    target(f"{_mod}.install", oracle=_install_oracle(_mod, _attr, _kw), allowed=(ImportError,), weight=0.3, timeout=60)(
        (lambda kw, fake: lambda draw, ex: {kw: draw(st.sampled_from([O(fake), O(fake), None]))})(_kw, _fake))
    target(f"{_mod}.is_installed", oracle=_is_installed_oracle(_mod, _attr, _kw), allowed=(ImportError,), weight=0.3,
           timeout=60)((lambda kw, fake: lambda draw, ex: {kw: draw(st.sampled_from([O(fake), O(fake), None]))})(_kw, _fake))


def _ray_setup_oracle(module: str):
    def oracle(a: Args, out: Any) -> None:
        import importlib  # noqa: PLC0415

        adapter = importlib.import_module(module)
        expect(out is None, f"ray_worker_setup() returned {out!r}")
        expect(adapter.is_installed() is True, "valuelab is not installed after ray_worker_setup()")
        adapter.install()()  # put the trainer's own function back in this worker

    return oracle


for _mod in ("valuelab.integrations.verl", "valuelab.integrations.openrlhf"):
    target(f"{_mod}.ray_worker_setup", oracle=_ray_setup_oracle(_mod), allowed=(ImportError,), weight=0.05,
           timeout=60)(lambda draw, ex: draw(st.just({})))


@st.composite
def _trl_kwargs(draw, ex, with_rates):
    B, Tn = draw(st.integers(1, 4)), draw(st.integers(1, 9))
    dt = draw(WIDE_DTYPE)
    n = tuple(draw(st.lists(st.integers(0, Tn - 1), min_size=B, max_size=B)))
    kw = {"rewards": draw(ftensor((B, Tn), ex, dt)), "values": draw(ftensor((B, Tn), ex, dt)),
          "sequence_lengths": T((B,), draw(st.sampled_from(["int64", "int32"])), n, draw(INDEX_LAYOUT))}
    if with_rates:
        kw["gamma"], kw["lam"] = draw(UNIT), draw(UNIT)
    else:
        kw["phantom"] = draw(st.booleans())
    return kw


def _trl_check(a: Args):
    r, v, n = a.kw["rewards"], a.kw["values"], a.kw["sequence_lengths"]
    expect(r.dim() == 2, f"accepted rewards of shape {tuple(r.shape)}")
    same_shape(v, tuple(r.shape), "values", "rewards")
    nv = index_tensor(n, "sequence_lengths")
    same_shape(nv, (r.shape[0],), "sequence_lengths", "the rows")
    expect(bool(np.all((nv >= 0) & (nv < r.shape[1]))), f"accepted sequence_lengths={nv.tolist()}")
    return arr(r, "rewards"), arr(v, "values"), nv


def _from_trl_oracle(a: Args, out: Any) -> None:
    rv, vv, n = _trl_check(a)
    phantom = flag(a.kw["phantom"], "phantom")
    B, Tn = rv.shape
    end = np.where(n + 1 < Tn, n + 1, n)
    idx = np.arange(Tn)
    if phantom:
        want_r, want_m = rv, idx[None] <= end[:, None]
    else:
        want_r = rv.copy()
        for b in range(B):
            if end[b] != n[b]:
                want_r[b, n[b]] += rv[b, end[b]]
                want_r[b, end[b]] = 0.0
        want_m = idx[None] <= n[:, None]
    expect(out.mask.dtype == torch.bool and np.array_equal(boolarr(out.mask, "mask"), want_m), f"mask {out.mask.tolist()}")
    close("values", out.values, vv, 0.0)
    close("rewards", out.rewards, want_r, 4 * eps_of(a.kw["rewards"].dtype) * (np.abs(rv).max(initial=0) * 2))


def _trl_adv_defined(kw: Dict[str, Any]) -> Optional[str]:
    n = index_tensor(kw["sequence_lengths"], "sequence_lengths")
    return None if (n + 1).sum() >= 2 else "a single valid token: the whitening's unbiased variance is undefined"


def _trl_adv_oracle(a: Args, out: Any) -> None:
    rv, vv, n = _trl_check(a)
    g, lam = scalar(a.kw["gamma"], "gamma"), scalar(a.kw["lam"], "lam")
    expect(0 <= g <= 1 and 0 <= lam <= 1, f"accepted gamma={g}, lam={lam}")
    if not a.finite:
        return
    B, Tn = rv.shape
    end = np.where(n + 1 < Tn, n + 1, n)
    keep = np.arange(Tn)[None] <= end[:, None]
    r0, v0 = np.where(keep, rv, 0.0), np.where(keep, vv, 0.0)  # TRL's tensors: zero after the phantom step
    adv = np.zeros((B, Tn))
    last = np.zeros(B)
    for t in range(Tn - 1, -1, -1):
        nxt = v0[:, t + 1] if t < Tn - 1 else 0.0
        last = r0[:, t] + g * nxt - v0[:, t] + g * lam * last
        adv[:, t] = last
    ret = adv + v0
    valid = np.arange(Tn)[None] <= n[:, None]
    sel = adv[valid]
    if sel.size < 2:
        return
    mean, var = sel.mean(), sel.var(ddof=1)
    white = np.where(valid, (adv - mean) / math.sqrt(var + 1e-8), 0.0)
    dtype = a.kw["rewards"].dtype
    tol = 64 * eps_of(dtype) * (Tn + 2) * (1 + np.abs(rv).sum() + np.abs(vv).sum())
    close("returns", out[1], ret, tol)
    close("advantages", out[0], white, tol * (1 + 1 / math.sqrt(var + 1e-8)))


target("valuelab.integrations.trl.from_trl", oracle=_from_trl_oracle)(lambda draw, ex: draw(_trl_kwargs(ex, False)))
target("valuelab.integrations.trl.trl_advantages", oracle=_trl_adv_oracle, defined=_trl_adv_defined)(
    lambda draw, ex: draw(_trl_kwargs(ex, True)))


@st.composite
def _torchrl_kwargs(draw, ex):
    layout = draw(st.sampled_from(["BT1", "BT1", "T", "BTF", "TB"]))
    B, Tn, F = draw(st.integers(1, 3)), draw(st.integers(1, 7)), draw(st.integers(1, 2))
    shape, time_dim = {"BT1": ((B, Tn, 1), -2), "T": ((Tn,), draw(st.sampled_from([0, -1]))),
                       "BTF": ((B, Tn, F), draw(st.sampled_from([1, -2]))), "TB": ((Tn, B), 0)}[layout]
    dt = draw(WIDE_DTYPE)
    done = tuple(draw(st.lists(st.booleans(), min_size=math.prod(shape), max_size=math.prod(shape))))
    term = tuple(d and draw(st.booleans()) for d in done) if draw(st.booleans()) else None
    rate = lambda: draw(st.one_of(UNIT, st.sampled_from([0, 1, 0.99]),  # noqa: E731
                                   st.builds(lambda x: T((), dt, (x,)), UNIT),
                                   ftensor(shape, dtype=dt, elements=UNIT, grad=False)))
    kw = {"gamma": rate(), "lmbda": rate(), "state_value": draw(ftensor(shape, ex, dt)),
          "next_state_value": draw(ftensor(shape, ex, dt)), "reward": draw(ftensor(shape, ex, dt)),
          "done": T(shape, "bool", done, draw(LAYOUT)),
          "terminated": None if term is None else T(shape, "bool", term, draw(LAYOUT))}
    if time_dim != -2 or draw(st.booleans()):
        kw["time_dim"] = time_dim
    return kw


def _torchrl_gae_oracle(a: Args, out: Any) -> None:
    kw = a.kw
    r = kw["reward"]
    shape = tuple(r.shape)
    for name in ("state_value", "next_state_value", "done"):
        same_shape(kw[name], shape, name, "reward")
    for name in ("done", "terminated"):
        x = kw.get(name)
        if x is not None:
            expect(isinstance(x, torch.Tensor) and x.dtype == torch.bool, f"accepted {name} of dtype {getattr(x, 'dtype', type(x))}")
            same_shape(x, shape, name, "reward")
    time_dim = kw.get("time_dim", -2)
    expect(isinstance(time_dim, numbers.Integral) and not isinstance(time_dim, (bool, np.bool_)), f"accepted time_dim={time_dim!r}")
    expect(-len(shape) <= time_dim < len(shape), f"accepted time_dim={time_dim} for shape {shape}")
    g = _factor(kw["gamma"], "gamma", shape, r.dtype)
    lm = _factor(kw["lmbda"], "lmbda", shape, r.dtype)
    expect(isinstance(out, tuple) and len(out) == 2, f"returned {type(out).__name__}")
    for name, y in zip(("advantage", "value_target"), out):
        like_input(name, y, r)
    if not a.finite:
        return
    ax = time_dim % len(shape)
    mv = lambda x: np.moveaxis(x, ax, -1)  # noqa: E731
    rv, v, v2 = mv(arr(r, "reward")), mv(arr(kw["state_value"], "state_value")), mv(arr(kw["next_state_value"], "n"))
    done = mv(boolarr(kw["done"], "done"))
    term = done if kw.get("terminated") is None else mv(boolarr(kw["terminated"], "terminated"))
    g, lm = mv(g), mv(lm)
    delta = rv + g * (~term) * v2 - v
    adv = np.zeros(delta.shape)
    mag = np.zeros(delta.shape)
    nxt, nmag = np.zeros(delta.shape[:-1]), np.zeros(delta.shape[:-1])
    for t in range(delta.shape[-1] - 1, -1, -1):
        d = g[..., t] * lm[..., t] * (~done[..., t])
        nxt = delta[..., t] + d * nxt
        nmag = np.abs(rv[..., t]) + np.abs(v2[..., t]) + np.abs(v[..., t]) + d * nmag
        adv[..., t], mag[..., t] = nxt, nmag
    back = lambda x: np.moveaxis(x, -1, ax)  # noqa: E731
    tol = back(16 * eps_of(r.dtype) * (delta.shape[-1] + 2) * (mag + np.abs(v))) + 4 * torch.finfo(r.dtype).tiny
    close("advantage", out[0], back(adv), tol)
    close("value_target", out[1], back(adv + v), tol)


for _name in ("generalized_advantage_estimate", "vec_generalized_advantage_estimate"):
    target(f"valuelab.integrations.torchrl.{_name}", oracle=_torchrl_gae_oracle)(lambda draw, ex: draw(_torchrl_kwargs(ex)))


@st.composite
def _right_padded(draw, B, Tn, min_len=1):
    lengths = draw(st.lists(st.integers(min_len, Tn), min_size=B, max_size=B))
    return lengths, tuple(t < lengths[b] for b in range(B) for t in range(Tn))


@target("valuelab.integrations.torchrl.to_torchrl")
def _to_torchrl(draw, ex):
    B, Tn = draw(st.integers(1, 4)), draw(st.integers(1, 8))
    dt = draw(WIDE_DTYPE)
    lengths, m = draw(_right_padded(B, Tn))
    kw = {"rewards": draw(ftensor((B, Tn), ex, dt)), "values": draw(ftensor((B, Tn), ex, dt)),
          "mask": T((B, Tn), "bool", m, draw(LAYOUT)), "truncated": None, "bootstrap": None}
    if draw(st.booleans()):
        kw["truncated"] = T((B,), "bool", tuple(draw(st.lists(st.booleans(), min_size=B, max_size=B))))
        kw["bootstrap"] = draw(ftensor((B,), ex, dt))
    return kw


def _to_torchrl_oracle(a: Args, out: Any) -> None:
    kw = a.kw
    r, v, mask = kw["rewards"], kw["values"], kw["mask"]
    expect(r.dim() == 2, f"accepted rewards of shape {tuple(r.shape)}")
    same_shape(v, tuple(r.shape), "values", "rewards")
    same_shape(mask, tuple(r.shape), "mask", "rewards")
    expect(v.dtype == r.dtype, f"accepted values of dtype {v.dtype} with rewards of {r.dtype} (TorchRL's GAE takes one)")
    m = np.ones(tuple(r.shape), bool) if mask is None else boolarr(mask, "mask")  # None: every token valid
    B, Tn = m.shape
    lengths = m.sum(-1).astype(int)
    expect(bool(np.all(lengths >= 1)) and np.array_equal(m, np.arange(Tn)[None] < lengths[:, None]),
           f"accepted a mask that is not right-padded with a token in every row: {m.astype(int).tolist()}")
    cut = np.zeros(B, bool)
    boot = np.zeros(B)
    if kw["truncated"] is not None:
        tr = kw["truncated"]
        expect(isinstance(tr, torch.Tensor) and tr.dtype == torch.bool, f"accepted truncated={tr!r:.60}")
        same_shape(tr, (B,), "truncated", "the rows")
        cut = boolarr(tr, "truncated")
        if cut.any():
            expect(kw["bootstrap"] is not None, "accepted truncated rows without bootstrap")
            same_shape(kw["bootstrap"], (B,), "bootstrap", "the rows")
            boot = arr(kw["bootstrap"].to(v.dtype), "bootstrap")  # documented: cast to the values' dtype
    vv = arr(v, "values")
    last = np.arange(Tn)[None] == (lengths - 1)[:, None]
    nxt = np.zeros((B, Tn))
    nxt[:, :-1] = vv[:, 1:]
    nxt = np.where(last & cut[:, None], boot[:, None], nxt)
    nxt = np.where(last & ~cut[:, None], 0.0, nxt)
    want = {"state_value": vv, "next_state_value": nxt, "reward": arr(r, "rewards"), "done": last,
            "terminated": last & ~cut[:, None]}
    expect(isinstance(out, dict) and set(out) == set(want), f"returned keys {list(out) if isinstance(out, dict) else out}")
    for k, w in want.items():
        expect(tuple(out[k].shape) == (B, Tn, 1), f"{k} has shape {tuple(out[k].shape)}")
        close(k, arr(out[k], k)[..., 0], w.astype(np.float64), 0.0)
    expect(out["done"].dtype == torch.bool and out["terminated"].dtype == torch.bool, "done/terminated are not bool")


TARGETS["valuelab.integrations.torchrl.to_torchrl"].oracle = _to_torchrl_oracle


@target("valuelab.integrations.torchrl.from_torchrl")
def _from_torchrl(draw, ex):
    B, Tn = draw(st.integers(1, 4)), draw(st.integers(1, 8))
    dt = draw(WIDE_DTYPE)
    ends = draw(st.lists(st.integers(0, Tn - 1), min_size=B, max_size=B))
    done = tuple(t == ends[b] for b in range(B) for t in range(Tn))
    term = tuple(d and draw(st.booleans()) for d in done)
    f = lambda: draw(ftensor((B, Tn, 1), ex, dt))  # noqa: E731
    return {"state_value": f(), "next_state_value": f(), "reward": f(), "done": T((B, Tn, 1), "bool", done, draw(INDEX_LAYOUT)),
            "terminated": draw(st.sampled_from([None, T((B, Tn, 1), "bool", term)]))}


def _from_torchrl_oracle(a: Args, out: Any) -> None:
    kw = a.kw
    r = kw["reward"]
    shape = tuple(r.shape)
    expect(len(shape) == 3 and shape[-1] == 1, f"accepted reward of shape {shape}")
    for name in ("state_value", "next_state_value", "done") + (("terminated",) if kw["terminated"] is not None else ()):
        same_shape(kw[name], shape, name, "reward")
    for name in ("done", "terminated"):
        x = kw[name]
        if x is not None:
            expect(isinstance(x, torch.Tensor) and x.dtype == torch.bool, f"accepted {name} of dtype {getattr(x, 'dtype', type(x))}")
    done = boolarr(kw["done"], "done")[..., 0]
    term = done if kw["terminated"] is None else boolarr(kw["terminated"], "terminated")[..., 0]
    expect(bool(np.all(done.sum(-1) == 1)), f"accepted rows without exactly one done step: {done.astype(int).tolist()}")
    expect(not np.any(term & ~done), "accepted terminated at a step that is not done")
    B, Tn = done.shape
    end = done.argmax(-1)
    mask = np.arange(Tn)[None] <= end[:, None]
    rows = np.arange(B)
    nxt = arr(kw["next_state_value"], "next_state_value")[..., 0]
    boot = np.where(term[rows, end], 0.0, nxt[rows, end])
    expect(np.array_equal(boolarr(out.mask, "mask"), mask), f"mask {out.mask.tolist()} != {mask.tolist()}")
    close("rewards", out.rewards, np.where(mask, arr(r, "reward")[..., 0], 0.0), 0.0)
    close("values", out.values, np.where(mask, arr(kw["state_value"], "state_value")[..., 0], 0.0), 0.0)
    close("bootstrap", out.bootstrap, boot, 0.0)


TARGETS["valuelab.integrations.torchrl.from_torchrl"].oracle = _from_torchrl_oracle


# ---------------------------------------------------------------------------
# valuelab.lab.policy: a tiny world, solved by enumerating every response
# ---------------------------------------------------------------------------


def score_length(count, length):
    """A reward model that pays for length (module level: recipes name it)."""
    return np.asarray(length, dtype=np.float64) / 4.0 + 0 * np.asarray(count)


def score_huge(count, length):
    return np.full(np.broadcast(count, length).shape, 1e300)


def score_nan(count, length):
    return np.full(np.broadcast(count, length).shape, np.nan)


def score_scalar(count, length):
    return 1.0


SCORE_FNS = {"count_good": "valuelab.lab.policy.count_good", "length": "fuzz_targets.score_length",
             "huge": "fuzz_targets.score_huge", "nan": "fuzz_targets.score_nan", "scalar": "fuzz_targets.score_scalar"}


@st.composite
def world_kwargs(draw, tiny=True):
    V = draw(st.integers(3, 4))
    L = draw(st.integers(1, 4 if V == 3 else 3))
    lo = draw(st.floats(0.01, 0.9))
    hi = draw(st.floats(lo, 0.99))
    kw = {"n_prompts": draw(st.integers(1, 3)), "vocab_size": V, "max_len": L, "eos_range": (lo, hi),
          "beta": draw(st.sampled_from([0.05, 0.5, 1.0, 0.0, 0.01])), "gamma": draw(st.sampled_from([1.0, 0.9, 0.0, 0.5])),
          "logit_scale": draw(st.sampled_from([1.0, 0.0, 3.0])), "seed": draw(st.integers(0, 2**20))}
    fn = draw(st.sampled_from(["default", "default", "count_good", "length"]))
    if fn != "default":
        kw["score_fn"] = O("fn", (SCORE_FNS[fn],))
    if fn != "length" and draw(st.booleans()):
        kw["max_count"] = L + 1
    return kw


def _world(kw: Dict[str, Any]):
    from valuelab.lab.policy import make_prompt_world  # noqa: PLC0415

    return make_prompt_world(**kw)


@target("valuelab.lab.policy.make_prompt_world", aliases=("eos_range",))
def _make_world(draw, ex):
    return draw(world_kwargs())


def _make_world_oracle(a: Args, w: Any) -> None:
    kw = a.kw
    for name in ("n_prompts", "vocab_size", "max_len"):
        if name in kw:
            x = kw[name]
            expect(isinstance(x, numbers.Integral) and not isinstance(x, (bool, np.bool_)) and x >= 1, f"accepted {name}={x!r}")
    if "seed" in kw:
        s = kw["seed"]
        expect(isinstance(s, numbers.Integral) and not isinstance(s, (bool, np.bool_)) and 0 <= s <= 2**63 - 1,
               f"accepted seed={s!r} (seeds lie in [0, 2**63 - 1])")
    for name in ("beta", "gamma", "logit_scale"):
        if name in kw:
            v = scalar(kw[name], name)
            expect(v >= 0 and math.isfinite(v), f"accepted {name}={v}")
    expect(0 <= w.gamma <= 1, f"gamma={w.gamma}")
    P, V = w.n_prompts, w.vocab_size
    expect(w.pi_ref.shape == (P, V + 1, V) and np.all(w.pi_ref > 0), "pi_ref is not positive")
    expect(np.allclose(w.pi_ref.sum(-1), 1, atol=1e-12), "pi_ref rows do not sum to 1")
    lo, hi = kw.get("eos_range", (0.05, 0.2))
    expect(np.all((w.pi_ref[..., 0] >= lo - 1e-12) & (w.pi_ref[..., 0] <= hi + 1e-12)), "EOS probability outside eos_range")
    L, K = w.max_len, w.max_count
    expect(w.score_table.shape == (L + 1, K + 1), f"score_table shape {w.score_table.shape}")
    f = kw.get("score_fn")
    if f is None:
        from valuelab.lab.policy import count_good as f  # noqa: PLC0415
    for length in range(1, L + 1):
        for k in range(min(length, K) + 1):
            want = float(np.asarray(f(np.float64(k), np.float64(length))))
            expect(abs(w.score_table[length, k] - want) <= 1e-12 * (1 + abs(want)),
                   f"score_table[{length}, {k}] = {w.score_table[length, k]}, score_fn gives {want}")


TARGETS["valuelab.lab.policy.make_prompt_world"].oracle = _make_world_oracle


def enumerate_world(w, probs: np.ndarray, p: int):
    """Every response of prompt ``p`` under the policy table ``probs`` (P, L, C, K, V): (prob, disc. kl, disc. score, length)."""
    from valuelab.lab.world import EOS, GOOD  # noqa: PLC0415

    out = []
    L, K = w.max_len, w.max_count

    def go(t, c, k, prob, kl, disc):
        for a_ in range(w.vocab_size):
            q = probs[p, t, c, k, a_]
            if q <= 0:
                continue
            rho = math.log(q) - math.log(w.pi_ref[p, c, a_])
            k2 = min(k + (a_ == GOOD), K)
            if a_ == EOS or t == L - 1:
                out.append((prob * q, kl + disc * rho, disc * w.score_table[t + 1, k2], t + 1))
            else:
                go(t + 1, a_, k2, prob * q, kl + disc * rho, disc * w.gamma)

    go(0, w.bos, 0, 1.0, 0.0, 1.0)
    return out


def _probs_table(w, probs) -> np.ndarray:
    return arr(probs, "probs")


@st.composite
def probs_recipe(draw, world_kw, lead=()):
    kind = draw(st.sampled_from(["ref", "random", "random", "onehot"]))
    return O("probs", (O("world", (world_kw,)), lead, kind, draw(st.integers(0, 2**16)),
                       draw(st.sampled_from(["numpy", "torch", "torch32"]))))


def make_probs(w, lead, kind, seed, container):
    shape = tuple(lead) + w.state_shape + (w.vocab_size,)
    rng = np.random.default_rng(seed)
    if kind == "ref":
        p = np.broadcast_to(w.reference_policy(), shape).copy()
    elif kind == "onehot":
        p = np.zeros(shape)
        idx = rng.integers(0, w.vocab_size, shape[:-1])
        np.put_along_axis(p, idx[..., None], 1.0, -1)
    else:
        p = rng.random(shape) ** 3
        p /= p.sum(-1, keepdims=True)
    if container == "numpy":
        return p
    return torch.tensor(p, dtype=torch.float64 if container == "torch" else torch.float32)


@target("valuelab.lab.policy.evaluate_policy")
def _evaluate_policy(draw, ex):
    wk = draw(world_kwargs())
    lead = draw(st.sampled_from([(), (), (2,)]))
    return {"world": O("world", (wk,)), "probs": draw(probs_recipe(wk, lead))}


def _evaluate_oracle(a: Args, ev: Any) -> None:
    from valuelab.lab.policy import PromptWorld  # noqa: PLC0415

    w, probs = a.kw["world"], a.kw["probs"]
    expect(isinstance(w, PromptWorld), f"accepted world of type {type(w).__name__}")
    p = _probs_table(w, probs)
    lead = p.shape[: p.ndim - 5]
    flat = p.reshape((-1,) + p.shape[-5:])
    # rows may sum to 1 within 1e-6 (float32 tables): the DP and the enumeration then differ by about L times that
    dev = float(np.max(np.abs(p.sum(-1) - 1), initial=0.0))
    with np.errstate(divide="ignore"):
        rho = np.where(p > 0, np.log(np.where(p > 0, p, 1)) - np.log(w.pi_ref)[:, None, :, None, :], 0.0)
    size = 1 + np.abs(w.score_table).max() + w.beta * np.abs(rho).max() + w.max_len
    for r in range(flat.shape[0]):
        obj = score = kl = length = 0.0
        per = []
        for q in range(w.n_prompts):
            resp = enumerate_world(w, flat[r], q)
            s = sum(x[0] * x[2] for x in resp)
            k = sum(x[0] * x[1] for x in resp)
            per.append(s - w.beta * k)
            score += s / w.n_prompts
            kl += k / w.n_prompts
            length += sum(x[0] * x[3] for x in resp) / w.n_prompts
        obj = float(np.mean(per))
        at = np.unravel_index(r, lead) if lead else ()
        for name, want in (("objective", obj), ("score", score), ("kl", kl), ("length", length)):
            got = float(np.asarray(getattr(ev, name))[at])
            tol = 1e-9 * (1 + abs(want)) + 4 * w.max_len * dev * size
            expect(abs(got - want) <= tol, f"{name} = {got!r}, enumeration gives {want!r}")
        close("per_prompt", np.asarray(ev.per_prompt)[at], np.array(per), 1e-9 * (1 + np.abs(per)) + 4 * w.max_len * dev * size)


TARGETS["valuelab.lab.policy.evaluate_policy"].oracle = _evaluate_oracle


@target("valuelab.lab.policy.soft_optimal", defined=lambda kw: None if kw["world"].beta > 0 else "beta = 0")
def _soft_optimal(draw, ex):
    wk = draw(world_kwargs())
    wk["beta"] = draw(st.sampled_from([0.05, 0.5, 1.0, 0.01, 1e-3]))
    return {"world": O("world", (wk,))}


def _soft_oracle(a: Args, so: Any) -> None:
    from valuelab.lab.world import EOS, GOOD  # noqa: PLC0415

    w = a.kw["world"]
    expect(w.beta > 0, f"returned a soft optimum for beta = {w.beta}")
    L, K, beta = w.max_len, w.max_count, w.beta

    def V(p, t, c, k):
        qs = []
        for a_ in range(w.vocab_size):
            k2 = min(k + (a_ == GOOD), K)
            final = a_ == EOS or t == L - 1
            q = w.score_table[t + 1, k2] if final else w.gamma * V(p, t + 1, a_, k2)
            qs.append(math.log(w.pi_ref[p, c, a_]) + q / beta)
        m = max(qs)
        return beta * (m + math.log(sum(math.exp(x - m) for x in qs)))

    per = np.array([V(p, 0, w.bos, 0) for p in range(w.n_prompts)])
    close("per_prompt", np.asarray(so.per_prompt), per, 1e-9 * (1 + np.abs(per)))
    expect(abs(so.objective - per.mean()) <= 1e-9 * (1 + abs(per.mean())), f"objective {so.objective} != {per.mean()}")
    expect(np.allclose(so.policy.sum(-1), 1, atol=1e-9), "the soft-optimal policy does not sum to 1")


TARGETS["valuelab.lab.policy.soft_optimal"].oracle = _soft_oracle


@target("valuelab.lab.policy.reward_model_start")
def _policy_rm_start(draw, ex):
    return {"world": O("world", (draw(world_kwargs()),))}


def _policy_rm_oracle(a: Args, out: Any) -> None:
    w = a.kw["world"]
    P, L, C, K = w.state_shape
    expect(out.shape == (P, L, C, K), f"shape {out.shape}")
    for t in range(L):
        close("V0", out[:, t], np.broadcast_to(w.score_table[t][None, None, :], (P, C, K)), 0.0)


TARGETS["valuelab.lab.policy.reward_model_start"].oracle = _policy_rm_oracle


@target("valuelab.lab.policy.sample_responses", weight=0.5)
def _sample_responses(draw, ex):
    wk = draw(world_kwargs())
    R = draw(st.integers(1, 3))
    seeds = draw(st.lists(st.integers(0, 2**31), min_size=R, max_size=R))
    gens = [draw(st.sampled_from([s, O("gen", (s,)), np.int64(s)])) for s in seeds]
    probs = draw(probs_recipe(wk, (R,)))
    probs = O("probs", probs.args[:4] + (draw(st.sampled_from(["torch", "torch32"])),))
    evaluation = draw(st.sampled_from([None, O("evaluation", (O("world", (wk,)), probs))]))
    return {"world": O("world", (wk,)), "probs": probs, "samples_per_prompt": draw(st.integers(1, 4)),
            "generators": gens, "evaluation": evaluation,
            "dtype": draw(st.sampled_from([torch.float32, torch.float64]))}


def _sample_oracle(a: Args, batch: Any) -> None:
    from valuelab.lab.world import EOS, GOOD  # noqa: PLC0415

    kw = a.kw
    w, probs, G = kw["world"], kw["probs"], kw["samples_per_prompt"]
    expect(isinstance(G, numbers.Integral) and not isinstance(G, (bool, np.bool_)) and G >= 1, f"accepted samples_per_prompt={G!r}")
    p = _probs_table(w, probs)
    R, P = p.shape[0], w.n_prompts
    for g in kw["generators"]:
        if not isinstance(g, torch.Generator):
            expect(isinstance(g, numbers.Integral) and not isinstance(g, (bool, np.bool_)) and 0 <= g <= 2**63 - 1,
                   f"accepted the generator seed {g!r}")
    ro = batch.rollout
    B = R * P * int(G)  # int: np.int8(34) * 9 wraps around to 50 in numpy's arithmetic
    expect(tuple(ro.tokens.shape[:1]) == (B,), f"{ro.tokens.shape[0]} rows, expected {B}")
    tokens, m = ro.tokens.cpu().numpy(), ro.mask.cpu().numpy()
    lengths = m.sum(-1)
    Tn = m.shape[1]
    expect(np.array_equal(m, np.arange(Tn)[None] < lengths[:, None]), "mask is not right-padded")
    expect(np.array_equal(ro.lengths.cpu().numpy(), lengths), "lengths != mask.sum(-1)")
    run, prompt = batch.run.cpu().numpy(), batch.prompt.cpu().numpy()
    expect(np.array_equal(run, np.repeat(np.arange(R), P * G)), "run order")
    expect(np.array_equal(prompt, np.tile(np.repeat(np.arange(P), G), R)), "prompt order")
    lp = ro.logprobs.detach().cpu().double().numpy()
    # every row when there are few; else 512 spread over the batch, both ends included (a Python loop over millions of
    # rows would take longer than the call)
    for b in (range(B) if B <= 512 else np.unique(np.linspace(0, B - 1, 512).astype(np.int64))):
        L = lengths[b]
        expect(1 <= L <= w.max_len, f"row {b} has length {L}")
        seq = tokens[b, :L]
        expect(np.all(tokens[b, L:] == 0), f"row {b}: padding tokens {tokens[b, L:]}")
        expect(bool(np.all((seq >= 0) & (seq < w.vocab_size))), f"row {b}: tokens {seq}")
        expect(L == w.max_len or seq[-1] == EOS, f"row {b} stops at {L} without EOS")
        expect(not np.any(seq[:-1] == EOS), f"row {b} continues after EOS")
        c, k = w.bos, 0
        for t, tok in enumerate(seq):
            q = p[run[b], prompt[b], t, c, k, tok]
            expect(q > 0, f"row {b} drew token {tok} of probability 0 at t={t}")
            expect(abs(lp[b, t] - math.log(q)) <= 1e-5 * (1 + abs(math.log(q))), f"row {b} logprob {lp[b, t]} != log {q}")
            c, k = tok, min(k + (tok == GOOD), w.max_count)
    expect(ro.rewards.dtype == kw["dtype"], f"rewards dtype {ro.rewards.dtype}")


TARGETS["valuelab.lab.policy.sample_responses"].oracle = _sample_oracle


@target("valuelab.lab.policy.count_good")
def _count_good(draw, ex):
    n = draw(st.integers(0, 6))
    count = O("numpy", (T((n,), "int64", draw(value_list("int64", n, False, st.integers(0, 20)))),))
    length = O("numpy", (T((n,), "int64", draw(value_list("int64", n, False, st.integers(1, 20)))),))
    return {"count": count, "length": length, "scale": draw(st.one_of(st.floats(0.5, 64), st.sampled_from([8.0, 1, 3])))}


def _count_good_oracle(a: Args, out: Any) -> None:
    s = scalar(a.kw["scale"], "scale")
    expect(s > 0 and math.isfinite(s), f"accepted scale={s}")
    c = arr(a.kw["count"], "count")
    got = arr(out, "score")
    eps = eps_of(out.dtype) if isinstance(out, torch.Tensor) else 2.0**-52
    want = np.minimum(c, s) / s
    close("score", got, want, 4 * eps * (1 + np.abs(want)))


TARGETS["valuelab.lab.policy.count_good"].oracle = _count_good_oracle


# ---------------------------------------------------------------------------
# valuelab.lab.ppo
# ---------------------------------------------------------------------------


@target("valuelab.lab.ppo.policy_loss")
def _policy_loss(draw, ex):
    shape = draw(batch_shape(empty_ok=False))
    dt, dev = draw(WIDE_DTYPE), draw(DEVICE)
    lp = st.floats(-6, 0, width=32)
    return {"logprobs": draw(ftensor(shape, ex, dt, dev, None if ex else lp)),
            "old_logprobs": draw(ftensor(shape, ex, dt, dev, None if ex else lp)),
            "advantages": draw(ftensor(shape, ex, dt, dev)), "mask": draw(st.none() | bits(shape, device=dev)),
            "clip_range": draw(st.one_of(st.floats(0, 1), st.sampled_from([0.2, 0, 10]))),
            "aggregation": draw(st.sampled_from(AGGREGATIONS))}


def _policy_loss_oracle(a: Args, out: Any) -> None:
    kw = a.kw
    lp = kw["logprobs"]
    shape = tuple(lp.shape)
    for name in ("old_logprobs", "advantages"):
        same_shape(kw[name], shape, name, "logprobs")
    m = _mask_of(Args({"mask": kw["mask"]}, (), a.mode, a.finite), lp)
    eps = scalar(kw["clip_range"], "clip_range")
    expect(eps >= 0 and math.isfinite(eps), f"accepted clip_range={eps}")
    how = kw["aggregation"]
    expect(how in AGGREGATIONS, f"accepted aggregation={how!r}")
    if not a.finite:
        return
    with np.errstate(over="ignore", invalid="ignore"):
        rho = arr(lp, "logprobs") - arr(kw["old_logprobs"], "old_logprobs")
        ratio = np.exp(rho)
        A = arr(kw["advantages"], "advantages")
        sur = np.minimum(ratio * A, np.clip(ratio, 1 - eps, 1 + eps) * A)
        want = -_aggregate(sur, m, how)
        frac = ((np.abs(ratio - 1) > eps) & m).sum() / max(m.sum(), 1)
        # a ratio within rounding of the clip edge (exp(1e-8) is 1 in float32) may count either way
        ties = ((np.abs(np.abs(ratio - 1) - eps) <= 4 * eps_of(lp.dtype) * (1 + ratio)) & m).sum() / max(m.sum(), 1)
        mag = _aggregate(np.abs(ratio * A) + np.abs(A) * (1 + eps), m, how)
    if math.isfinite(want) and abs(want) < torch.finfo(lp.dtype).max:
        close("loss", out.loss.reshape(()), np.asarray(want),
              64 * eps_of(lp.dtype) * (1 + np.max(np.abs(rho), initial=0)) * mag + tiny_of(lp.dtype))
        close("clip_fraction", out.clip_fraction.reshape(()), np.asarray(frac), 1e-6 + 2.0 / max(m.sum(), 1) + ties)


TARGETS["valuelab.lab.ppo.policy_loss"].oracle = _policy_loss_oracle


def _groups_defined(kw):
    g = index_tensor(kw["group"], "group")
    _, counts = np.unique(g, return_counts=True)
    return None if counts.size and counts.min() >= 2 else "a group of one response"


@target("valuelab.lab.ppo.group_advantages", defined=_groups_defined)
def _group_advantages(draw, ex):
    k = draw(st.integers(1, 4))
    labels = draw(st.lists(st.integers(0, 9), min_size=k, max_size=k, unique=True))
    group = [lab for lab in labels for _ in range(draw(st.integers(2, 4)))]
    group = draw(st.permutations(group))
    n = len(group)
    return {"returns": draw(ftensor((n,), ex, draw(WIDE_DTYPE))), "group": T((n,), "int64", tuple(group), draw(INDEX_LAYOUT)),
            "normalise": draw(st.booleans()), "eps": draw(st.sampled_from([1e-6, 0.0, 1e-3, 1]))}


def _group_oracle(a: Args, out: Any) -> None:
    kw = a.kw
    r, g = arr(kw["returns"], "returns"), index_tensor(kw["group"], "group")
    same_shape(kw["group"], tuple(kw["returns"].shape), "group", "returns")
    expect(bool(np.all(g >= 0)), f"accepted negative group labels {g[g < 0][:4]}")
    normalise = flag(kw["normalise"], "normalise")
    eps = scalar(kw["eps"], "eps")
    expect(eps >= 0 and math.isfinite(eps), f"accepted eps={eps}")
    like_input("advantages", out, kw["returns"])
    if not a.finite:
        return
    want, tol = np.zeros(len(r)), np.zeros(len(r))
    for lab in np.unique(g):
        sel = g == lab
        expect(sel.sum() >= 2, f"accepted group {lab} of one response")
        x = r[sel]
        s = np.max(np.abs(x)) or 1.0
        c = (x / s - (x / s).mean()) * s
        gain = 1.0
        if normalise:
            sd = np.std(x / s, ddof=1) * s
            gain = 1 / (sd + eps) if sd + eps > 0 else 0.0
            c = c * gain if sd + eps > 0 else np.full(len(x), np.nan)
        want[sel], tol[sel] = c, 64 * eps_of(kw["returns"].dtype) * (1 + np.abs(c) + s * gain)
    close("advantages", out, want, tol)


TARGETS["valuelab.lab.ppo.group_advantages"].oracle = _group_oracle


def _fit_defined(kw):
    try:
        e, x = arr(kw["estimate"], "e"), arr(kw["exact"], "x")
        m = boolarr(kw["mask"], "m")
        t = kw["t_max"]
        sel = m[..., :t]
        A = x[..., :t][sel]
        return None if sel.sum() >= 2 and np.ptp(A) > 0 else "fewer than two tokens or no spread"
    except Exception:  # noqa: BLE001
        return "undefined"


@target("valuelab.lab.ppo.advantage_fit", defined=_fit_defined)
def _advantage_fit(draw, ex):
    shape = draw(batch_shape(empty_ok=False))
    dt = draw(WIDE_DTYPE)
    return {"estimate": draw(ftensor(shape, ex, dt)), "exact": draw(ftensor(shape, ex, dt)),
            "mask": draw(bits(shape, min_true=2)), "t_max": draw(st.integers(1, 12))}


def _fit_oracle(a: Args, out: Any) -> None:
    kw = a.kw
    t = kw["t_max"]
    expect(isinstance(t, numbers.Integral) and not isinstance(t, (bool, np.bool_)) and t >= 1, f"accepted t_max={t!r}")
    same_shape(kw["exact"], tuple(kw["estimate"].shape), "exact", "estimate")
    if kw["mask"] is not None:  # None is documented: every token before t_max
        same_shape(kw["mask"], tuple(kw["estimate"].shape), "mask", "estimate")
    if not a.finite:
        return
    e, x = arr(kw["estimate"], "estimate"), arr(kw["exact"], "exact")
    m = np.ones(e.shape, bool) if kw["mask"] is None else boolarr(kw["mask"], "mask")
    sel = m[..., :t]
    y, A = e[..., :t][sel], x[..., :t][sel]
    dA = A - A.mean()
    kappa = (dA * (y - y.mean())).sum() / (dA * dA).sum()
    offset = y.mean() - kappa * A.mean()
    noise = np.std(y - offset - kappa * A, ddof=1)
    scale = 1 + np.abs(y).max() + np.abs(A).max()
    for name, want in (("kappa", kappa), ("offset", offset), ("noise", noise)):
        if math.isfinite(want):
            got = getattr(out, name)
            expect(abs(got - want) <= 1e-6 * scale * (1 + abs(want)) * (1 + scale / max(np.ptp(A), 1e-300)),
                   f"{name} = {got!r}, expected {want!r}")


TARGETS["valuelab.lab.ppo.advantage_fit"].oracle = _fit_oracle


@st.composite
def arm_kwargs(draw):
    est = draw(st.sampled_from(["gae", "gae", "group"]))
    kw = {"name": draw(st.sampled_from(["arm", "a", ""])), "estimator": est,
          "lam_actor": draw(st.sampled_from([0.95, 1.0, 0.0, "adaptive", 0.5])),
          "lam_critic": draw(st.sampled_from([0.95, 1.0, 0.0])), "alpha": draw(st.sampled_from([1.0, 0.05, 2]))}
    if est == "gae":
        kw["critic_start"] = draw(st.sampled_from(["zero", "reward-model"]))
        kw["warmup"] = draw(st.integers(0, 1))
    return kw


@st.composite
def config_kwargs(draw, n_prompts=1):
    G = draw(st.integers(2, 4))
    n = n_prompts * G
    return {"iterations": draw(st.integers(1, 2)), "samples_per_prompt": G, "epochs": 1,
            "minibatches": draw(st.sampled_from([d for d in (1, 2) if n % d == 0])),
            "actor_lr": draw(st.sampled_from([0.02, 0.1])), "critic_lr": 0.02,
            "clip_range": draw(st.sampled_from([0.2, 0.0, 1.0])), "value_clip": draw(st.sampled_from([0.2, None])),
            "whiten": draw(st.booleans()), "early": draw(st.integers(1, 4))}


@st.composite
def small_world(draw):
    wk = draw(world_kwargs())
    wk["beta"] = draw(st.sampled_from([0.05, 0.5, 1.0]))  # train_ppo needs the soft optimum: beta > 0
    wk.update(n_prompts=draw(st.integers(1, 2)), vocab_size=3, max_len=draw(st.integers(2, 3)))
    wk.pop("max_count", None)
    return wk


@target("valuelab.lab.ppo.Arm", aliases=("warmup", "critic_start", "estimator", "lam_actor", "lam_critic", "alpha", "name"),
        weight=0.5)
def _arm(draw, ex):
    return draw(arm_kwargs())


@target("valuelab.lab.ppo.PPOConfig", weight=0.5)
def _config(draw, ex):
    return draw(config_kwargs())


def _train_checks(world, arm, config, seeds, h) -> None:
    R, I = len(seeds), config.iterations
    expect(h.objective.shape == (R, I + 1) and h.kappa.shape == (R, I), f"history shapes {h.objective.shape}, {h.kappa.shape}")
    # J(pi) <= J*; the policy is a float32 softmax, so its rows sum to 1 within about 1e-7
    expect(bool(np.all(h.objective <= h.optimum + 1e-5 * (1 + abs(h.optimum)))),
           f"an objective {h.objective.max()} above the optimum {h.optimum}")
    expect(bool(np.all((h.length >= 1 - 1e-9) & (h.length <= world.max_len + 1e-9))), f"lengths {h.length}")
    expect(h.seeds == [int(s) for s in seeds], f"seeds {h.seeds}")


def _train_nan_ok(path: str) -> bool:
    return path.split(".")[-1] in ("critic_rmse", "early_bias", "kappa", "noise") or ".arm." in path or ".config." in path


def _seeds_ok(seeds, name="seeds") -> None:
    expect(isinstance(seeds, (list, tuple)) and len(seeds) > 0, f"accepted {name}={seeds!r:.60}")
    for s in seeds:
        expect(isinstance(s, numbers.Integral) and not isinstance(s, (bool, np.bool_)) and 0 <= s <= 2**63 - 1,
               f"accepted the seed {s!r} in {name} (seeds lie in [0, 2**63 - 1])")


@target("valuelab.lab.ppo.train_ppo", weight=0.08, timeout=120, nan_ok=_train_nan_ok,
        aliases=("minibatches", "samples_per_prompt", "n_prompts"))
def _train_ppo(draw, ex):
    wk = draw(small_world())
    return {"world": O("world", (wk,)), "arm": O("arm", (draw(arm_kwargs()),)),
            "seeds": draw(st.lists(st.integers(0, 2**31), min_size=1, max_size=2)),
            "config": O("config", (draw(config_kwargs(wk["n_prompts"])),)), "device": draw(st.sampled_from([None, "cpu"]))}


def _train_oracle(a: Args, h: Any) -> None:
    kw = a.kw
    _seeds_ok(kw["seeds"])
    _train_checks(kw["world"], kw["arm"], kw["config"], kw["seeds"], h)


TARGETS["valuelab.lab.ppo.train_ppo"].oracle = _train_oracle


@target("valuelab.lab.ppo.train_many", weight=0.04, timeout=180, nan_ok=_train_nan_ok,
        aliases=("jobs", "minibatches", "samples_per_prompt", "n_prompts"))
def _train_many(draw, ex):
    jobs = []
    for _ in range(draw(st.integers(1, 2))):
        wk = draw(small_world())
        job = (O("world", (wk,)), O("arm", (draw(arm_kwargs()),)), O("config", (draw(config_kwargs(wk["n_prompts"])),)))
        if draw(st.booleans()):
            job += (draw(st.lists(st.integers(0, 2**31), min_size=1, max_size=2)),)
        jobs.append(job)
    seeds = draw(st.lists(st.integers(0, 2**31), min_size=1, max_size=2))
    return {"jobs": jobs, "seeds": seeds, "processes": draw(st.sampled_from([1, 1, 2])), "device": None}


def _train_many_oracle(a: Args, hs: Any) -> None:
    from valuelab.lab.ppo import train_ppo  # noqa: PLC0415

    kw = a.kw
    p = kw["processes"]
    expect(isinstance(p, numbers.Integral) and not isinstance(p, (bool, np.bool_)) and p >= 1, f"accepted processes={p!r}")
    jobs = list(kw["jobs"])
    expect(isinstance(hs, list) and len(hs) == len(jobs), f"{len(hs)} histories for {len(jobs)} jobs")
    for i, (job, h) in enumerate(zip(jobs, hs)):
        seeds = job[3] if len(job) == 4 else kw["seeds"]
        _seeds_ok(seeds, f"jobs[{i}] seeds")
        _train_checks(job[0], job[1], job[2], seeds, h)
    if not jobs:
        return
    job = jobs[0]
    seeds = job[3] if len(job) == 4 else kw["seeds"]
    direct = train_ppo(job[0], job[1], list(seeds), job[2], device="cpu")
    expect(np.allclose(direct.objective, hs[0].objective, rtol=1e-5, atol=1e-7),
           f"job 0's objective {hs[0].objective.tolist()} differs from train_ppo's {direct.objective.tolist()}")


TARGETS["valuelab.lab.ppo.train_many"].oracle = _train_many_oracle


# ---------------------------------------------------------------------------
# valuelab.lab.transformer
# ---------------------------------------------------------------------------


@st.composite
def model_kwargs(draw):
    H = draw(st.integers(1, 2))
    return {"n_models": draw(st.integers(1, 3)), "n_tokens": draw(st.integers(1, 8)), "max_positions": draw(st.integers(1, 8)),
            "d_model": H * draw(st.integers(1, 4)), "n_layers": draw(st.integers(1, 2)), "n_heads": H,
            "d_ff": draw(st.integers(1, 6)), "seed": draw(st.one_of(st.none(), st.integers(0, 2**32)))}


@target("valuelab.lab.transformer.TinyTransformer", weight=0.5, aliases=("d_model", "n_heads"), timeout=60)
# (60 s: a d_model of 5020 is 600 million weights, 2.4 GB that fit the size check and take 9 s to draw on one thread)
def _tiny(draw, ex):
    return draw(model_kwargs())


def _tiny_oracle(a: Args, m: Any) -> None:
    kw = a.kw
    for name in ("n_models", "n_tokens", "max_positions", "d_model", "n_layers", "n_heads", "d_ff"):
        if name in kw:
            x = kw[name]
            expect(isinstance(x, numbers.Integral) and not isinstance(x, (bool, np.bool_)) and x >= 1, f"accepted {name}={x!r}")
    s = kw.get("seed")
    if s is not None:
        expect(isinstance(s, numbers.Integral) and not isinstance(s, (bool, np.bool_)) and 0 <= s <= 2**63 - 1,
               f"accepted seed={s!r} (seeds lie in [0, 2**63 - 1])")
    R, D = m.n_models, m.d_model
    expect(tuple(m.tok.shape) == (R, m.n_tokens, D) and tuple(m.head_w.shape) == (R, D), "parameter shapes")
    if s is not None:
        from valuelab.lab.transformer import TinyTransformer  # noqa: PLC0415

        again = TinyTransformer(**kw)
        expect(all(torch.equal(p, q) for p, q in zip(m.parameters(), again.parameters())), "the same seed gave other weights")


TARGETS["valuelab.lab.transformer.TinyTransformer"].oracle = _tiny_oracle


@st.composite
def inputs_recipe(draw, mk):
    R, S = mk["n_models"], draw(st.integers(2, mk["max_positions"])) if mk["max_positions"] >= 2 else 1
    B = draw(st.integers(1, 3))
    ids = draw(value_list("int64", R * B * S, False, st.integers(0, mk["n_tokens"] - 1)))
    return T((R, B, S), "int64", ids, draw(INDEX_LAYOUT))


@st.composite
def model_and_inputs(draw):
    mk = draw(model_kwargs())
    mk["max_positions"] = max(mk["max_positions"], 2)
    return mk, draw(inputs_recipe(mk))


def _forward_checks(model, inputs, out, cut_last: bool) -> None:
    """Causality (position j reads x_0..x_j only) and independence of the models, against the model's own forward."""
    x = inputs.clone()
    full = model(x).detach()
    S = x.shape[-1]
    if S >= 2:
        y = x.clone()
        y[..., -1] = (y[..., -1] + 1) % model.n_tokens
        other = model(y).detach()
        expect(torch.allclose(other[..., :-1], full[..., :-1], atol=1e-6), "an earlier position read a later token")
    if x.shape[0] >= 2:
        y = x.clone()
        y[1:] = (y[1:] + 1) % model.n_tokens
        expect(torch.allclose(model(y).detach()[0], full[0], atol=1e-6), "model 0 read another model's inputs")
    want = full[..., :-1] if cut_last else full
    expect(tuple(out.shape) == tuple(want.shape), f"shape {tuple(out.shape)}, expected {tuple(want.shape)}")
    expect(torch.allclose(out.detach(), want, atol=1e-6), "result differs from the model's forward pass")


@target("valuelab.lab.transformer.state_values")
def _state_values(draw, ex):
    mk, inputs = draw(model_and_inputs())
    return {"model": O("model", (mk,)), "inputs": inputs}


def _state_values_oracle(a: Args, out: Any) -> None:
    x = a.kw["inputs"]
    expect(isinstance(x, torch.Tensor) and x.dtype == torch.long, f"accepted inputs of {getattr(x, 'dtype', type(x))}")
    _forward_checks(a.kw["model"], x, out, True)


TARGETS["valuelab.lab.transformer.state_values"].oracle = _state_values_oracle


@target("valuelab.lab.transformer.final_scores")
def _final_scores(draw, ex):
    mk, inputs = draw(model_and_inputs())
    R, B, S = inputs.shape
    shape = draw(st.sampled_from([(B,), (R, B)]))
    lengths = draw(value_list("int64", math.prod(shape), False, st.integers(1, max(1, S - 1))))
    return {"model": O("model", (mk,)), "inputs": inputs, "lengths": T(shape, "int64", lengths, draw(INDEX_LAYOUT))}


def _final_scores_oracle(a: Args, out: Any) -> None:
    model, x, lengths = a.kw["model"], a.kw["inputs"], a.kw["lengths"]
    n = index_tensor(lengths, "lengths")
    R, B, S = x.shape
    expect(n.shape in ((B,), (R, B)), f"accepted lengths of shape {n.shape}")
    expect(bool(np.all((n >= 1) & (n <= S - 1))), f"accepted lengths {n.tolist()} for {S} positions")
    full = model(x).detach()
    want = full.gather(-1, torch.as_tensor(np.broadcast_to(n, (R, B)).copy())[..., None]).squeeze(-1)
    expect(torch.allclose(out.detach(), want, atol=1e-6), f"scores {out.tolist()} != {want.tolist()}")


TARGETS["valuelab.lab.transformer.final_scores"].oracle = _final_scores_oracle


def _copy_checks(src, out, index: List[int], axis_of) -> None:
    from valuelab.lab.transformer import TinyTransformer  # noqa: PLC0415

    expect(isinstance(out, TinyTransformer) and out.n_models == len(index), f"n_models {getattr(out, 'n_models', None)}")
    idx = torch.tensor(index, dtype=torch.long)
    mine = dict(out.named_parameters())
    for name, p in src.named_parameters():
        q = mine[name]
        expect(q.untyped_storage().data_ptr() != p.untyped_storage().data_ptr(), f"{name} shares storage with the input")
        want = p.detach().index_select(axis_of(name), idx)
        expect(torch.equal(q.detach(), want), f"{name} is not the chosen models' copy")


def _axis(name: str) -> int:
    from valuelab.lab.transformer import TinyTransformer  # noqa: PLC0415

    return 1 if name in TinyTransformer.LAYER_PARAMS else 0


@target("valuelab.lab.transformer.reward_model_start")
def _tr_rm_start(draw, ex):
    return {"reward_model": O("model", (draw(model_kwargs()),))}


TARGETS["valuelab.lab.transformer.reward_model_start"].oracle = lambda a, out: _copy_checks(
    a.kw["reward_model"], out, list(range(a.kw["reward_model"].n_models)), _axis)


@target("valuelab.lab.transformer.tile")
def _tile(draw, ex):
    return {"model": O("model", (draw(model_kwargs()),)), "times": draw(st.integers(1, 3))}


def _tile_oracle(a: Args, out: Any) -> None:
    from valuelab.lab.transformer import TinyTransformer  # noqa: PLC0415

    t = a.kw["times"]
    expect(isinstance(t, numbers.Integral) and not isinstance(t, (bool, np.bool_)) and t >= 1, f"accepted times={t!r}")
    t, src = int(t), a.kw["model"]
    R = src.n_models
    if t <= 8:
        _copy_checks(src, out, [r for _ in range(t) for r in range(R)], _axis)
        return
    # millions of copies: the shapes, and the first, second, middle and last copy (an index list would take longer
    # than the call itself)
    expect(isinstance(out, TinyTransformer) and out.n_models == R * t, f"n_models {getattr(out, 'n_models', None)}")
    mine = dict(out.named_parameters())
    for name, p in src.named_parameters():
        q, ax = mine[name].detach(), _axis(name)
        expect(q.untyped_storage().data_ptr() != p.untyped_storage().data_ptr(), f"{name} shares storage with the input")
        want = list(p.shape)
        want[ax] *= t
        expect(list(q.shape) == want, f"{name} has shape {tuple(q.shape)}, not {tuple(want)}")
        for c in sorted({0, 1, t // 2, t - 1}):
            expect(torch.equal(q.narrow(ax, c * R, R), p.detach()), f"{name}: copy {c} is not the model's")


TARGETS["valuelab.lab.transformer.tile"].oracle = _tile_oracle


@target("valuelab.lab.transformer.select")
def _select(draw, ex):
    mk = draw(model_kwargs())
    models = draw(st.lists(st.integers(0, mk["n_models"] - 1), min_size=1, max_size=mk["n_models"], unique=True))
    return {"model": O("model", (mk,)), "models": draw(st.sampled_from([models, tuple(models)]))}


def _select_oracle(a: Args, out: Any) -> None:
    idx = list(a.kw["models"])
    for i in idx:
        expect(isinstance(i, numbers.Integral) and not isinstance(i, (bool, np.bool_)), f"accepted models={idx!r}")
    R = a.kw["model"].n_models
    expect(len(idx) > 0 and len(set(idx)) == len(idx) and all(0 <= i < R for i in idx), f"accepted models={idx!r}")
    _copy_checks(a.kw["model"], out, [int(i) for i in idx], _axis)


TARGETS["valuelab.lab.transformer.select"].oracle = _select_oracle


@target("valuelab.lab.transformer.sequence_inputs")
def _sequence_inputs(draw, ex):
    wk = draw(world_kwargs())
    R, G = draw(st.integers(1, 2)), draw(st.integers(1, 3))
    batch = O("batch", (wk, R, G, draw(st.integers(0, 2**20))))
    rows = None
    if draw(st.booleans()):
        Bn = R * wk["n_prompts"] * G
        k, b = draw(st.integers(1, 3)), draw(st.integers(1, 4))
        rows = T((k, b), "int64", draw(value_list("int64", k * b, False, st.integers(0, Bn - 1))), draw(INDEX_LAYOUT))
    return {"world": O("world", (wk,)), "batch": batch, "rows": rows}


def _sequence_inputs_oracle(a: Args, out: Any) -> None:
    w, batch, rows = a.kw["world"], a.kw["batch"], a.kw["rows"]
    tokens = batch.rollout.tokens.cpu().numpy()
    seq = np.concatenate([(w.vocab_size + batch.prompt.cpu().numpy())[:, None], tokens], axis=1)
    if rows is None:
        want = seq[None]
    else:
        r = index_tensor(rows, "rows")
        expect(r.ndim == 2 and bool(np.all((r >= 0) & (r < len(seq)))), f"accepted rows={r.tolist()}")
        want = seq[r]
    expect(isinstance(out, torch.Tensor) and out.dtype == torch.long, f"result {type(out).__name__}")
    expect(np.array_equal(out.cpu().numpy(), want), f"inputs {out.tolist()} != {want.tolist()}")


TARGETS["valuelab.lab.transformer.sequence_inputs"].oracle = _sequence_inputs_oracle


def _ev_defined(kw):
    t, m = arr(kw["target"], "t"), boolarr(kw["mask"], "m")
    dim = kw["dim"]
    tt = np.moveaxis(t, dim, -1)
    mm = np.moveaxis(m, dim, -1)
    for idx in np.ndindex(tt.shape[:-1]):
        sel = tt[idx][mm[idx]]
        if sel.size == 0 or np.ptp(sel) <= 0:  # entries that differ have spread, even if np.var underflows to 0
            return "a slice without spread"
        yh = np.moveaxis(arr(kw["prediction"], "p"), dim, -1)[idx][mm[idx]]
        sc = max(np.abs(sel).max(), np.abs(yh).max())
        if _ev_fits(sel / sc, yh / sc, np.ones(sel.shape, bool), kw["target"]) is not None:
            return "the explained variance does not fit the dtype"
    return None


@target("valuelab.lab.transformer.explained_variance", defined=_ev_defined)
def _explained_variance(draw, ex):
    shape = draw(st.sampled_from([(2, 5), (3, 4), (6,), (2, 3, 4)]))
    dt = draw(WIDE_DTYPE)
    return {"prediction": draw(ftensor(shape, ex, dt)), "target": draw(ftensor(shape, ex, dt)),
            "mask": draw(bits(shape, kinds=("bool",), min_true=math.prod(shape))),
            "dim": draw(st.sampled_from(list(range(-len(shape), len(shape)))))}


def _ev_oracle(a: Args, out: Any) -> None:
    kw = a.kw
    p, t, mask, dim = kw["prediction"], kw["target"], kw["mask"], kw["dim"]
    same_shape(p, tuple(t.shape), "prediction", "target")
    same_shape(mask, tuple(t.shape), "mask", "target")
    expect(isinstance(mask, torch.Tensor) and mask.dtype == torch.bool, "accepted a non-bool mask")
    if not a.finite:
        return
    pv, tv, m = arr(p, "prediction"), arr(t, "target"), boolarr(mask, "mask")
    tv, pv, m = np.moveaxis(tv, dim, -1), np.moveaxis(pv, dim, -1), np.moveaxis(m, dim, -1)
    want, tol = np.zeros(tv.shape[:-1]), np.zeros(tv.shape[:-1])
    for idx in np.ndindex(tv.shape[:-1]):
        y, yh = tv[idx][m[idx]], pv[idx][m[idx]]
        expect(y.size and np.ptp(y) > 0, "returned an explained variance for a target without spread")
        sc = max(np.abs(y).max(), np.abs(yh).max())  # on the scale of the largest entry: [0, -3e-279] has variance
        with np.errstate(over="ignore"):  # 2.3e-558, which np.var of the raw numbers underflows to 0
            vy = np.var(y / sc)
            want[idx] = 1 - np.var(y / sc - yh / sc) / vy
        tol[idx] = 64 * eps_of(t.dtype) * (1 + abs(want[idx])) * (1 + 1 / vy) * len(y)
    if np.isfinite(want).all():
        close("explained_variance", out, want, tol)


TARGETS["valuelab.lab.transformer.explained_variance"].oracle = _ev_oracle


# ---------------------------------------------------------------------------
# valuelab.distributed
# ---------------------------------------------------------------------------


def rank_echo(rank: int, world_size: int, *args: Any) -> Tuple[int, int, Tuple[Any, ...]]:
    """A module-level function run_on_ranks can spawn: what it was called with."""
    return rank, world_size, args


def _stats_ref(values, returns, old, mask, clip_range, dtype=torch.float64):
    """batch_statistics computed by numpy (statistics) and by plain float64 torch autograd (the losses' gradients).

    Where the clipped and unclipped squared errors are equal to within the rounding of ``dtype`` (a tie: in float32
    ``(2e15 - 3.9)**2`` and ``(2e15 - 0.2)**2`` are one number), either branch's gradient is right; ``_alt_grad_*``
    holds the gradient with every tie resolved the other way."""
    v, g, o = arr(values, "values"), arr(returns, "returns"), arr(old, "old")
    m = boolarr(mask, "mask")
    sel = g[m]
    out = {"mean": sel.mean(), "var_unbiased": sel.var(ddof=1), "var_biased": sel.var()}
    for name, ub in (("whiten", True), ("whiten_biased", False)):
        w, _ = _whiten_ref(g, m, True, 1e-8, ub)
        out[name] = w
    c = clip_range
    gt, ot, mt = torch.tensor(g), torch.tensor(o), torch.tensor(m, dtype=torch.float64)
    for how in AGGREGATIONS:
        for key, pick in ((f"grad_{how}", 0), (f"_alt_grad_{how}", 1)):
            vt = torch.tensor(v, requires_grad=True)
            su, sc = (vt - gt) ** 2, (ot + (vt - ot).clamp(-c, c) - gt) ** 2
            tie = (su - sc).abs().detach() <= 16 * eps_of(dtype) * torch.maximum(su, sc).detach()
            sq = torch.where(tie, su if pick == 0 else sc, torch.maximum(su, sc))
            if how == "token-mean":
                loss = (sq * mt).sum() / mt.sum().clamp(min=1)
            else:
                per = (sq * mt).sum(-1)
                if how == "seq-mean-token-mean":
                    per = per / mt.sum(-1).clamp(min=1)
                ne = (mt.sum(-1) > 0).double()
                loss = (per * ne).sum() / ne.sum().clamp(min=1)
            loss = 0.5 * loss
            (grad,) = torch.autograd.grad(loss, vt)
            out[key] = grad.numpy()
            if pick == 0:
                out[f"loss_{how}"] = float(loss)
    binds = ((o + np.clip(v - o, -c, c) - g) ** 2 > (v - g) ** 2)
    out["clip_fraction"] = binds[m].mean()
    out["explained_variance"] = 1 - np.var((g - v)[m]) / np.var(sel)
    out["_scale"] = float(max(np.abs(g[m]).max(), np.abs(v[m]).max(), np.abs(o[m]).max(), 1e-300))
    out["_n"], out["_var"] = int(m.sum()), float(np.var(sel))
    return out


def _compare_stats(got: Dict[str, Any], want: Dict[str, Any], dtype: torch.dtype, rows=None) -> None:
    """``got`` against :func:`_stats_ref`, each statistic within its rounding: the mean of n entries of size s is off
    by up to delta = 8 n eps s, a variance by 2 s delta, a whitened entry by delta / sd, a clip fraction by a tie."""
    expect(isinstance(got, dict) and {k for k in want if not k.startswith("_")} <= set(got),
           f"keys {sorted(got) if isinstance(got, dict) else got}")
    rel = 1e-4 if dtype != torch.float64 else 1e-9
    s, n, var = want["_scale"], want["_n"], want["_var"]
    delta = 8 * n * eps_of(dtype) * s
    extra = {"mean": delta, "var_unbiased": 2 * s * delta + delta**2, "var_biased": 2 * s * delta + delta**2,
             "whiten": delta / math.sqrt(var + 1e-8), "whiten_biased": delta / math.sqrt(var + 1e-8),
             "clip_fraction": 1.0 / max(n, 1), "explained_variance": 4 * s * delta / var if var > 0 else math.inf}
    for k, w in want.items():
        if k.startswith("_"):
            continue
        w = np.asarray(w)
        if rows is not None and w.ndim == 2:
            w = w[rows]
        add = extra.get(k, 2 * s * delta if k.startswith("loss") else delta)
        if k.startswith("grad_"):  # at a tie either branch's gradient is right, or their mean (autograd's maximum
            alt = np.asarray(want["_alt_" + k])  # splits an exact tie): the nearest of the three, entry by entry
            alt = alt[rows] if rows is not None and alt.ndim == 2 else alt
            g = np.asarray(arr(got[k], k), dtype=np.float64).reshape(w.shape)
            for cand in (alt, 0.5 * (w + alt)):
                w = np.where(np.abs(g - cand) < np.abs(g - w), cand, w)
        close(k, got[k], w, rel * (1 + np.abs(w)) + add)


@st.composite
def stats_kwargs(draw, ex):
    B, Tn = draw(st.integers(1, 4)), draw(st.integers(2, 6))
    dt = draw(WIDE_DTYPE)
    f = lambda: draw(ftensor((B, Tn), ex, dt, grad=False))  # noqa: E731
    return {"values": f(), "returns": f(), "old": f(), "mask": draw(bits((B, Tn), kinds=("bool",), min_true=2)),
            "group": None, "clip_range": draw(st.sampled_from([0.2, 0.0, 1.0]))}


def _batch_stats_defined(kw):
    g, m = arr(kw["returns"], "g"), boolarr(kw["mask"], "m")
    if not (m.sum() >= 2 and np.var(g[m]) > 0):  # (a spread whose float64 variance underflows counts as none here)
        return "no spread"
    return _ev_fits(g, arr(kw["values"], "values"), m, kw["values"])


@target("valuelab.distributed.batch_statistics", defined=_batch_stats_defined, weight=0.5)
def _batch_statistics(draw, ex):
    return draw(stats_kwargs(ex))


def _batch_stats_oracle(a: Args, out: Any) -> None:
    kw = a.kw
    _no_group(a)
    shape = tuple(kw["returns"].shape)
    for name in ("values", "old", "mask"):
        same_shape(kw[name], shape, name, "returns")
    c = scalar(kw["clip_range"], "clip_range")
    expect(c >= 0 and math.isfinite(c), f"accepted clip_range={c}")
    if a.finite and _batch_stats_defined(kw) is None:  # else no float64 reference to compare with (a returned value
        _compare_stats(out, _stats_ref(kw["values"], kw["returns"], kw["old"], kw["mask"], c, kw["returns"].dtype),
                       kw["returns"].dtype)  # is still checked for shape, finiteness and unchanged inputs)


TARGETS["valuelab.distributed.batch_statistics"].oracle = _batch_stats_oracle


@target("valuelab.distributed.demo_batch", timeout=60)  # a hostile size of 2 GB takes seconds to fill, not a hang
def _demo_batch(draw, ex):
    return {"seed": draw(SEEDS), "rows": draw(st.integers(1, 6)), "length": draw(st.integers(1, 8))}


def _demo_batch_oracle(a: Args, out: Any) -> None:
    from valuelab.distributed import demo_batch  # noqa: PLC0415

    kw = a.kw
    s = kw["seed"]
    expect(isinstance(s, numbers.Integral) and not isinstance(s, (bool, np.bool_)) and 0 <= s <= 2**63 - 1,
           f"accepted seed={s!r} (seeds lie in [0, 2**63 - 1])")
    for name, low in (("rows", 1), ("length", 0)):
        x = kw[name]
        expect(isinstance(x, numbers.Integral) and not isinstance(x, (bool, np.bool_)) and x >= low, f"accepted {name}={x!r}")
    values, returns, old, mask = out
    shape = (int(kw["rows"]), int(kw["length"]))
    for name, x in zip(("values", "returns", "old"), (values, returns, old)):
        expect(tuple(x.shape) == shape and x.dtype == torch.float64, f"{name}: {x.dtype} {tuple(x.shape)}")
    m = mask.numpy()
    lengths = m.sum(-1)
    expect(np.array_equal(m, np.arange(shape[1])[None] < lengths[:, None]) and lengths[0] == shape[1], "mask")
    if shape[0] * shape[1] > 10**6:  # a second copy of a hostile size may no longer fit under the worker's
        return                          # address-space cap (check_memory counts the room left): check small ones
    again = demo_batch(**kw)
    expect(all(torch.equal(x, y) for x, y in zip(out, again)), "the same seed gave another batch")


TARGETS["valuelab.distributed.demo_batch"].oracle = _demo_batch_oracle


@target("valuelab.distributed.shard_statistics", must_return=False, weight=0.5)
def _shard_statistics(draw, ex):
    sizes = draw(st.lists(st.integers(1, 4), min_size=1, max_size=3))
    return {"rank": draw(st.integers(0, len(sizes) - 1)), "world_size": len(sizes), "sizes": sizes,
            "seed": draw(st.integers(0, 2**31))}


def _shard_oracle(a: Args, out: Any) -> None:
    from valuelab.distributed import demo_batch  # noqa: PLC0415

    kw = a.kw
    sizes, rank = kw["sizes"], kw["rank"]
    expect(isinstance(rank, numbers.Integral) and not isinstance(rank, (bool, np.bool_)) and 0 <= rank < len(sizes),
           f"accepted rank={rank!r}")
    values, returns, old, mask = demo_batch(kw["seed"], rows=sum(sizes))
    start = sum(sizes[:rank])
    rows = slice(start, start + sizes[rank])
    m = mask[rows]
    if m.sum() >= 2 and float(returns[rows][m].var()) > 0:
        _compare_stats(out, _stats_ref(values[rows], returns[rows], old[rows], m, 0.2), torch.float64)


TARGETS["valuelab.distributed.shard_statistics"].oracle = _shard_oracle


@target("valuelab.distributed.run_on_ranks", weight=0.03, timeout=120)
def _run_on_ranks(draw, ex):
    if draw(st.booleans()):
        ws = draw(st.integers(1, 2))
        return {"fn": O("fn", ("fuzz_targets.rank_echo",)), "world_size": ws,
                "*args": tuple(draw(st.lists(st.integers(0, 9), max_size=2)))}
    sizes = draw(st.lists(st.integers(1, 3), min_size=2, max_size=2))
    return {"fn": O("fn", ("valuelab.distributed.shard_statistics",)), "world_size": len(sizes),
            "*args": (sizes, draw(st.integers(0, 2**20)))}


def _run_on_ranks_oracle(a: Args, out: Any) -> None:
    from valuelab.distributed import batch_statistics, demo_batch, shard_statistics  # noqa: PLC0415

    fn, ws = a.kw["fn"], a.kw["world_size"]
    expect(isinstance(ws, numbers.Integral) and not isinstance(ws, (bool, np.bool_)) and ws >= 1, f"accepted world_size={ws!r}")
    expect(isinstance(out, list) and len(out) == ws, f"{len(out)} results for world_size {ws}")
    if fn is rank_echo:
        want = [(r, ws, a.varargs) for r in range(ws)]
        expect(out == want, f"results {out!r:.200} != {want!r:.200}")
    elif fn is shard_statistics and len(a.varargs) == 2:
        sizes, seed = a.varargs
        expect(len(sizes) == ws, f"accepted sizes={sizes} for world_size={ws}")
        whole = batch_statistics(*demo_batch(seed, rows=sum(sizes)))
        for k in ("mean", "var_unbiased", "var_biased", "clip_fraction", "explained_variance"):
            for r in range(ws):
                close(f"rank {r} {k}", out[r][k], whole[k].numpy(), 1e-9)
        for k in [f"loss_{h}" for h in AGGREGATIONS]:
            close(k + " (sum over ranks)", np.asarray(sum(float(o[k]) for o in out)), whole[k].numpy(), 1e-9)
        for k in ["whiten", "whiten_biased"] + [f"grad_{h}" for h in AGGREGATIONS]:
            close(k + " (ranks' rows)", torch.cat([o[k] for o in out]), whole[k].numpy(), 1e-9)


TARGETS["valuelab.distributed.run_on_ranks"].oracle = _run_on_ranks_oracle


# ---------------------------------------------------------------------------
# the objects recipes can name
# ---------------------------------------------------------------------------


def _to_numpy(t: torch.Tensor) -> np.ndarray:
    t = t.detach().cpu().resolve_neg()
    return (t.float() if t.dtype == torch.bfloat16 else t).numpy()


def _resolve(dotted: str):
    import importlib  # noqa: PLC0415

    module, _, name = dotted.rpartition(".")
    return getattr(importlib.import_module(module), name)


def _batch(wk, R, G, seed):
    from valuelab.lab.policy import sample_responses  # noqa: PLC0415

    w = _world(wk)
    probs = torch.tensor(np.broadcast_to(w.reference_policy(), (R,) + w.state_shape + (w.vocab_size,)).copy())
    return sample_responses(w, probs, G, [seed + r for r in range(R)])


def _interval(mean, lo, hi, half, n, level):
    from valuelab.lab.stats import Interval  # noqa: PLC0415

    return Interval(mean=mean, lo=lo, hi=hi, half=half, n=n, level=level)


def _interval_of(x, level):
    from valuelab.lab.stats import mean_ci  # noqa: PLC0415

    return mean_ci(x, level)


def _evaluation(w, probs):
    from valuelab.lab.policy import evaluate_policy  # noqa: PLC0415

    return evaluate_policy(w, probs)


def _model(kw):
    from valuelab.lab.transformer import TinyTransformer  # noqa: PLC0415

    return TinyTransformer(**kw)


def _arm_of(kw):
    from valuelab.lab.ppo import Arm  # noqa: PLC0415

    return Arm(**kw)


def _config_of(kw):
    from valuelab.lab.ppo import PPOConfig  # noqa: PLC0415

    return PPOConfig(**kw)


FACTORIES: Dict[str, Callable[..., Any]] = {
    "object": object,
    "numpy": _to_numpy,
    "gen": lambda seed: torch.Generator().manual_seed(seed),
    "fn": _resolve,
    "world": _world,
    "probs": make_probs,
    "evaluation": _evaluation,
    "batch": _batch,
    "model": _model,
    "arm": _arm_of,
    "config": _config_of,
    "interval": _interval,
    "interval_of": _interval_of,
    "fake_verl": _fake_verl,
    "fake_maker": _fake_maker,
}


CELLS = st.one_of(st.text(max_size=8), st.integers(-10**6, 10**6), st.floats(allow_nan=True),
                  st.sampled_from([True, None, b"x", "a|b", "two\nlines", np.float32(1.5), np.int64(3)]))


@target("valuelab.lab.stats.markdown_table")
def _markdown_table(draw, ex):
    cols = draw(st.integers(0 if ex else 1, 4))
    header = draw(st.lists(st.one_of(st.text(max_size=6), st.just(1)) if ex else st.text("abc |", min_size=1, max_size=6),
                           min_size=cols, max_size=cols))
    rows = draw(st.lists(st.lists(CELLS if ex else st.one_of(st.text("xyz |", max_size=5), st.integers(-99, 99)),
                                  min_size=max(0, cols - bool(ex and draw(st.booleans()))), max_size=cols), max_size=4))
    shape = draw(st.sampled_from(["list", "tuple", "str"] if ex else ["list", "tuple"]))
    header = tuple(header) if shape == "tuple" else ("abc" if shape == "str" else header)
    return {"header": header, "rows": rows}


def _markdown_table_oracle(a: Args, out: Any) -> None:
    header, rows = a.kw["header"], a.kw["rows"]
    expect(isinstance(header, (list, tuple)) and len(header) > 0 and all(isinstance(h, str) for h in header),
           f"accepted header={header!r:.80}")
    ok = lambda x: isinstance(x, (str, numbers.Real)) and not isinstance(x, (bool, np.bool_))  # noqa: E731
    expect(all(len(r) == len(header) and all(ok(x) and "\n" not in str(x) for x in r) for r in rows),
           f"accepted rows={rows!r:.120}")
    lines = out.split("\n")
    expect(len(lines) == len(rows) + 2, f"{len(lines)} lines for {len(rows)} rows")
    for line in lines:  # one unescaped pipe per cell boundary
        expect(len(re.findall(r"(?<!\\)\|", line)) == len(header) + 1, f"line {line!r:.80} has the wrong cell count")
    for r, line in zip(rows, lines[2:]):
        expect(line == "| " + " | ".join(str(x).replace("|", "\\|") for x in r) + " |", f"row {line!r:.80}")


TARGETS["valuelab.lab.stats.markdown_table"].oracle = _markdown_table_oracle
