"""Argument validation shared by every public function of :mod:`valuelab`.

Each checker either returns a cleaned-up value or raises a :class:`TypeError`
(wrong kind of object, wrong dtype, wrong layout) or :class:`ValueError`
(wrong shape, wrong range, non-finite entries, no data) whose message starts
with the argument's name. Nothing downstream ever has to guard against a
silent NaN, and no kernel ever reads a tensor that has no data behind it: a
tensor argument is *dense* (strided, not nested, not sparse), holds data
(not a meta tensor, storage large enough for the view: a storage freed with
``untyped_storage().resize_(0)``, as FSDP does, would crash PyTorch itself),
and an efficient zero tensor is materialised.
"""

from __future__ import annotations

import math
import numbers
import os
from typing import Callable, Optional, Sequence, Tuple, Union

import numpy as np
import torch
import torch.autograd.forward_ad as _fwad

Scalar = Union[float, int]
ScalarOrTensor = Union[float, int, torch.Tensor]

__all__ = [
    "dense",
    "check_sequence_tensor",
    "check_like",
    "check_mask",
    "check_unit_interval",
    "check_bootstrap",
    "check_int",
    "check_dim",
    "renamed",
    "check_positive_int",
    "check_nonnegative_scalar",
    "real_number",
    "unit_scalar",
    "sum_is_finite",
    "require_finite",
    "traced",
    "check_scalar",
    "check_flag",
    "check_index_range",
    "check_seed",
    "check_memory",
    "check_device",
    "SEED_MAX",
]


# ---------------------------------------------------------------------------
# gradients
# ---------------------------------------------------------------------------


def _has_tangent(x: torch.Tensor) -> bool:
    return _fwad.unpack_dual(x).tangent is not None


def traced(*xs: object) -> bool:
    """Whether any tensor among ``xs`` must be differentiated through.

    True when grad mode is on and one requires grad (reverse mode), or when a
    forward-mode level is open and one is a dual tensor (``fwAD.make_dual``).
    Such inputs take the differentiable path: no ``out=``, no in-place update
    of a saved tensor, no trip through C.
    """
    grad = torch.is_grad_enabled()
    forward = getattr(_fwad, "_current_level", 0) >= 0
    for x in xs:
        if isinstance(x, torch.Tensor) and ((grad and x.requires_grad) or (forward and _has_tangent(x))):
            return True
    return False


# ---------------------------------------------------------------------------
# tensors
# ---------------------------------------------------------------------------


def dense(x: torch.Tensor, name: str) -> torch.Tensor:
    """``x`` if it is a dense tensor with data behind it (see the module docstring); a zero tensor is materialised.

    Raises TypeError for a sparse or nested tensor, ValueError for a meta
    tensor or one whose storage is smaller than its view needs (freed).
    """
    if x.layout is not torch.strided or x.is_nested or x.is_meta:
        if x.layout is not torch.strided:
            raise TypeError(f"{name} must be a dense (strided) tensor, got layout {x.layout}")
        if x.is_nested:
            raise TypeError(f"{name} must be a dense tensor, not a nested tensor")
        raise ValueError(f"{name} is a meta tensor: it has no data to compute with")
    if x._is_zerotensor():
        return torch.zeros(x.shape, dtype=x.dtype, device=x.device)
    n = x.numel()
    if n:
        if x.is_contiguous():
            last = x.storage_offset() + n - 1
        else:
            last = x.storage_offset() + sum((k - 1) * s for k, s in zip(x.shape, x.stride()))
        need = (last + 1) * x.element_size()
        if need > x.untyped_storage().nbytes():
            raise ValueError(
                f"{name}: its storage holds {x.untyped_storage().nbytes()} bytes, fewer than its view needs "
                f"({need}): it has been freed or resized (e.g. a sharded FSDP parameter)"
            )
    return x


def sum_is_finite(x: torch.Tensor) -> bool:
    """Whether ``x.sum()`` is finite: then every entry is (a NaN makes the sum NaN, an inf makes it inf or NaN)."""
    return not x.numel() or math.isfinite(float(x.detach().sum()))


def require_finite(x: torch.Tensor, name: str, mask: Optional[torch.Tensor] = None) -> None:
    """Raise unless every entry of ``x`` is finite, naming the first bad entry (and whether it is masked).

    A finite sum implies finite entries (a NaN makes the sum NaN, an inf makes
    it inf or NaN), and one reduction is about 20 times cheaper than
    ``isfinite(x).all()``. Only when the sum is not finite -- a non-finite
    entry, or finite entries whose sum overflowed -- is every entry looked at.
    ``mask`` (a bool tensor of ``x``'s shape, or None) only shapes the message:
    masked entries must be finite too.
    """
    if sum_is_finite(x):
        return
    bad = ~torch.isfinite(x.detach())
    if not bool(bad.any()):
        return
    where = tuple(int(i) for i in bad.nonzero()[0])
    value = float(x.detach()[where])
    pos = ", ".join(map(str, where))
    msg = f"{name} must be finite: it contains NaN or inf ({name}[{pos}] = {value})"
    if mask is not None and not bool(mask[where]):
        msg += (
            "; that position is masked, and masked entries (padding, holes) must be finite too: "
            "fill them with 0, not NaN"
        )
    raise ValueError(msg)


def check_sequence_tensor(x: object, name: str, *, finite: bool = True) -> torch.Tensor:
    """A dense float tensor of shape ``(T,)`` or ``(B, T)`` with finite entries (not looked at when ``finite=False``)."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if not torch.is_floating_point(x):
        raise TypeError(f"{name} must have a floating dtype (float32 or float64), got {x.dtype}")
    x = dense(x, name)
    if x.dim() not in (1, 2):
        raise ValueError(f"{name} must have shape (T,) or (B, T), got {tuple(x.shape)}")
    if finite:
        require_finite(x, name)
    return x


def check_like(x: object, name: str, like: torch.Tensor, like_name: str, *, finite: bool = True) -> torch.Tensor:
    """A tensor with the same shape, dtype and device as ``like`` (finite unless ``finite=False``)."""
    x = check_sequence_tensor(x, name, finite=False)
    if x.shape != like.shape:
        raise ValueError(
            f"{name} must have the same shape as {like_name}: {tuple(x.shape)} != {tuple(like.shape)}"
        )
    if x.dtype != like.dtype:
        raise TypeError(f"{name} must have the same dtype as {like_name}: {x.dtype} != {like.dtype}")
    if x.device != like.device:
        raise ValueError(f"{name} must be on the same device as {like_name}: {x.device} != {like.device}")
    if finite:
        require_finite(x, name)
    return x


def check_mask(
    mask: object, like: torch.Tensor, name: str = "mask", *, none_ok: bool = False, required: bool = False
) -> Optional[torch.Tensor]:
    """A boolean version of ``mask`` (all ones when ``mask`` is None, or None with ``none_ok``; a TypeError with ``required``).

    ``mask`` may be bool or real, but a real mask may only hold 0 and 1. A
    bool mask is returned as it is; one whose bytes are not all 0 or 1 (a
    ``uint8`` tensor viewed as bool) counts every nonzero byte as True on
    every path (:meth:`valuelab._engine.problem.Problem.torch_mask`).
    """
    if mask is None:
        if required:  # a function whose mask is not optional: None is not "every token"
            raise TypeError(f"{name} must be a torch.Tensor, got None")
        return None if none_ok else torch.ones(like.shape, dtype=torch.bool, device=like.device)
    if not isinstance(mask, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor or None, got {type(mask).__name__}")
    mask = dense(mask, name)
    if mask.shape != like.shape:
        raise ValueError(f"{name} must have shape {tuple(like.shape)}, got {tuple(mask.shape)}")
    if mask.device != like.device:
        raise ValueError(f"{name} must be on the same device as the data: {mask.device} != {like.device}")
    if mask.dtype == torch.bool:
        return mask
    if mask.is_complex():
        raise TypeError(f"{name} must be bool or real 0/1, got {mask.dtype}")
    if mask.numel() and not bool(((mask == 0) | (mask == 1)).all()):
        raise ValueError(f"{name} must hold only 0 and 1 (or be a bool tensor)")
    return mask != 0


def canonical_mask(mask: torch.Tensor) -> torch.Tensor:
    """A bool mask whose bytes are exactly 0 or 1 (any nonzero byte of ``mask`` is True)."""
    return mask.view(torch.uint8) != 0 if mask.dtype == torch.bool else mask != 0


# ---------------------------------------------------------------------------
# numbers
# ---------------------------------------------------------------------------


def real_number(x: numbers.Real, name: str) -> float:
    """``float(x)``; a number too large for a float (``10**400``) is a ValueError naming ``name``, not an OverflowError."""
    try:
        return float(x)
    except OverflowError:
        raise ValueError(f"{name} must be finite: {shown(x, 40)} is too large for a float") from None


def check_unit_interval(x: object, name: str, like: torch.Tensor) -> torch.Tensor:
    """``x`` (a float or a tensor) in [0, 1], broadcast to ``like``'s shape, dtype and device."""
    if isinstance(x, torch.Tensor):
        if x.dtype == torch.bool or x.is_complex():
            raise TypeError(f"{name} must be a real float tensor, got {x.dtype}")
        t = dense(x, name).to(device=like.device, dtype=like.dtype)
    else:
        t = torch.tensor(check_scalar(x, name, "a float or a tensor"), dtype=like.dtype, device=like.device)
    if t.numel() and bool(torch.isnan(t).any()):
        raise ValueError(f"{name} must not be NaN")
    if t.numel() and not bool(((t >= 0) & (t <= 1)).all()):
        raise ValueError(f"{name} must lie in [0, 1]")
    try:
        return torch.broadcast_to(t, like.shape)
    except RuntimeError:
        raise ValueError(
            f"{name} of shape {tuple(t.shape)} does not broadcast to {tuple(like.shape)}; "
            "a per-sequence value for a (B, T) batch has shape (B, 1)"
        ) from None


def unit_scalar(x: object, name: str, dtype: torch.dtype) -> Optional[float]:
    """``x`` as a Python float rounded to ``dtype`` when it is a real number in [0, 1]; None when it is not a number.

    The scalar case of :func:`check_unit_interval`, without making a tensor:
    the same rounding to ``dtype`` first (so ``1 + 1e-9`` is 1 in float32, as
    there) and the same errors. A tensor gives None: call
    :func:`check_unit_interval`.
    """
    if type(x) is float and 0.0 <= x <= 1.0:  # the common case, without the checks below
        return x if dtype == torch.float64 else (float(np.float32(x)) if dtype == torch.float32 else torch.tensor(x, dtype=dtype).item())
    if not isinstance(x, (numbers.Real, np.bool_)):
        return None
    v = check_scalar(x, name, "a float or a tensor")  # TypeError for a bool
    if dtype == torch.float32 and 0.0 <= v <= 1.0:
        v = float(np.float32(v))  # IEEE round to nearest, as torch.tensor(v, dtype=float32)
    elif dtype != torch.float64 or not 0.0 <= v <= 1.0:  # NaN fails the comparison
        v = torch.tensor(v, dtype=dtype).item()
    if v != v:
        raise ValueError(f"{name} must not be NaN")
    if not 0.0 <= v <= 1.0:
        raise ValueError(f"{name} must lie in [0, 1]")
    return v


def within_dtype(x: float, dtype: torch.dtype) -> float:
    """``x`` clamped to the finite range of ``dtype``: a bound for ``Tensor.clamp`` that the dtype can hold.

    ``clamp(-c, c)`` with a user's ``c = 1e308`` on a float32 tensor is
    torch's RuntimeError "value cannot be converted to type float without
    overflow"; a bound beyond every float of the dtype bounds nothing, and
    so does the dtype's largest float. Identity for every ``x`` in range.
    """
    top = torch.finfo(dtype).max
    return min(max(x, -top), top)


def check_bootstrap(bootstrap: object, like: torch.Tensor, name: str = "bootstrap") -> torch.Tensor:
    """The value after the last valid token: a tensor of shape ``like.shape[:-1]`` (default 0)."""
    batch_shape = like.shape[:-1]
    if bootstrap is None:
        return torch.zeros(batch_shape, dtype=like.dtype, device=like.device)
    if not isinstance(bootstrap, torch.Tensor):
        v = check_scalar(bootstrap, name, "a float or a tensor")
        if math.isfinite(v) and abs(v) > torch.finfo(like.dtype).max:
            raise ValueError(f"{name} must be finite in {like.dtype}: {v} is beyond its largest value, {torch.finfo(like.dtype).max:g}")
        b = torch.full(batch_shape, v, dtype=like.dtype, device=like.device)
    else:
        if not torch.is_floating_point(bootstrap):
            raise TypeError(f"{name} must have a floating dtype, got {bootstrap.dtype}")
        bootstrap = dense(bootstrap, name)
        if bootstrap.shape != batch_shape:
            raise ValueError(
                f"{name} must be a float or have shape {tuple(batch_shape)} (rewards.shape[:-1]), "
                f"got {tuple(bootstrap.shape)}"
            )
        b = bootstrap.to(device=like.device, dtype=like.dtype)
    require_finite(b, name)
    return b


def check_int(n: object, name: str) -> int:
    """A Python int (not bool), as an ``int``; ``TypeError`` naming ``name`` otherwise."""
    if isinstance(n, bool) or not isinstance(n, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(n).__name__}")
    return int(n)


def check_dim(dim: object, ndim: int, name: str = "dim", *, shape_of: str = "x") -> int:
    """An axis of a tensor with ``ndim`` dimensions (a 0-d tensor has one axis, as torch's reductions take), as an ``int`` in ``[0, ndim)``.

    TypeError naming ``name`` for a non-int (bool included); ValueError
    naming it for an axis out of range, instead of torch's IndexError.
    """
    d = check_int(dim, name)
    rank = max(ndim, 1)
    if not -rank <= d < rank:
        raise ValueError(f"{name} must lie in [{-rank}, {rank - 1}] for {shape_of} with {ndim} dimensions, got {_short_int(d)}")
    return d % rank


def renamed(call: Callable[[], object], inner: str, outer: str):
    """``call()``; a TypeError or ValueError whose message starts with the callee's argument name ``inner`` is re-raised
    naming ``outer``, the caller's argument that was passed as ``inner``.

    For a public function that hands its argument to another public
    function under another name (``decoupled_gae``'s ``lam_critic`` is
    ``gae``'s ``lam``; ``batch_statistics``' ``returns`` is
    ``masked_var``'s ``x``): the caller reads the name it wrote.
    """
    try:
        return call()
    except (TypeError, ValueError) as e:
        msg = str(e)
        if msg.startswith((inner + " ", inner + ":", inner + "[")):
            raise type(e)(outer + msg[len(inner):]) from None
        raise


def check_positive_int(n: object, name: str) -> int:
    """A Python int (not bool) that is at least 1."""
    if isinstance(n, bool) or not isinstance(n, numbers.Integral):
        raise TypeError(f"{name} must be a positive int, got {type(n).__name__}")
    if int(n) < 1:
        raise ValueError(f"{name} must be a positive int, got {n}")
    return int(n)


def check_nonnegative_scalar(x: object, name: str) -> float:
    """A finite real number that is at least 0."""
    x = check_scalar(x, name)
    if x != x or x in (float("inf"), float("-inf")):
        raise ValueError(f"{name} must be finite, got {x}")
    if x < 0:
        raise ValueError(f"{name} must be non-negative, got {x}")
    return x


def optional_like(x: Optional[object], name: str, like: torch.Tensor, like_name: str) -> Optional[torch.Tensor]:
    """``check_like`` that lets None through."""
    return None if x is None else check_like(x, name, like, like_name)


# ---------------------------------------------------------------------------
# the four shared checks of issue 25: scalars, flags, index ranges, seeds
# ---------------------------------------------------------------------------

SEED_MAX = 2**63 - 1
"""The largest seed valuelab takes. Every seed argument accepts exactly ``[0, 2**63 - 1]``: numpy's
``default_rng`` refuses negative seeds, ``torch.Generator.manual_seed`` refuses seeds above ``2**64 - 1``,
and an int64 holds every seed of the range."""

_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


def _short_int(n: int) -> str:
    """``str(n)``, or its size when it is too long to print (Python refuses ``str`` of ints over 4300 digits)."""
    return str(n) if n.bit_length() <= 128 else f"an int of {n.bit_length()} bits"


def check_scalar(x: object, name: str, what: str = "a real number") -> float:
    """``x`` as a float when it is a real number: the one test of "is this a number" (the scalar check).

    A bool (Python's or numpy's) is refused with ``TypeError("{name} must be
    {what}, not bool")`` -- ``True`` is not a discount -- and anything that is
    not a real number (a string, a complex number, None, an array, a tensor)
    with ``TypeError("{name} must be {what}, got <type>")``: ``"0.9"`` is
    not 0.9. Callers that also take a tensor branch on it before calling. A
    number too large for a float is a ValueError (:func:`real_number`); NaN
    and inf come back as floats for the caller's range check.
    """
    if isinstance(x, (bool, np.bool_)):
        raise TypeError(f"{name} must be {what}, not bool")
    if not isinstance(x, numbers.Real):
        raise TypeError(f"{name} must be {what}, got {type(x).__name__}")
    return real_number(x, name)


def check_flag(
    x: object,
    name: str,
    *,
    shape: Optional[Sequence[int]] = None,
    device: Optional[torch.device] = None,
    hint: str = "",
    like_name: Optional[str] = None,
) -> Union[bool, torch.Tensor]:
    """A flag, read as documented and never by truthiness (the flag check).

    ``shape`` None: a Python bool (or numpy's), returned as ``bool``; any other
    object (``"no"``, ``1``, None, a tensor) is a TypeError naming ``name``,
    where ``if x:`` would have read ``"no"`` as True and None as False.

    ``shape`` given: a bool tensor of exactly that shape (never broadcast, and
    an integer 0/1 tensor is refused: ``~1 == -2``), dense with data (no meta
    tensor, :func:`dense`), on ``device`` when given. ``hint`` ends the type
    and shape messages (``", one flag per sequence"``); ``like_name`` names
    the tensor whose shape and device it must share.
    """
    if shape is None:
        if isinstance(x, (bool, np.bool_)):
            return bool(x)
        raise TypeError(f"{name} must be a bool (True or False), got {type(x).__name__}")
    if not isinstance(x, torch.Tensor) or x.dtype != torch.bool:
        raise TypeError(f"{name} must be a bool tensor{hint}")
    x = dense(x, name)
    shape = tuple(shape)
    if tuple(x.shape) != shape:
        where = f"the shape of {like_name}, {shape}" if like_name else f"shape {shape}"
        raise ValueError(f"{name} must have {where}{hint}, got {tuple(x.shape)}")
    if device is not None and x.device != device:
        raise ValueError(f"{name} must be on the device of {like_name or 'the data'}: {x.device} != {device}")
    return x


def check_index_range(
    x: object,
    name: str,
    low: int,
    high: Optional[int] = None,
    *,
    dtypes: Tuple[torch.dtype, ...] = (torch.int32, torch.int64),
    nondecreasing: bool = False,
    device: Optional[torch.device] = None,
    message: Union[str, Callable[[], str], None] = None,
) -> torch.Tensor:
    """An integer tensor whose entries all lie in ``[low, high]`` (``high`` None: no upper bound), as int64 (the range check).

    For offsets, lengths, token ids and labels: every entry is *compared*
    with the bounds, never combined with another entry. Arithmetic on the
    entries can wrap around in int64 -- ``cu[1:] - cu[:-1]`` of
    ``[0, 2**63 - 1, -2, 4]`` is ``[2**63 - 1, 2**63 - 1, 6]``, all
    "non-negative", and such offsets reach ``repeat_interleave`` and crash
    the process -- and so can the bounds themselves: PyTorch compares an
    int64 tensor with ``2**63`` (or an int32 one with ``2**40``) wrongly, so
    a bound outside int64 is clamped here first. ``nondecreasing``: a 1-D
    tensor that never decreases, checked as ``x[1:] >= x[:-1]``.

    A meta tensor (or one whose storage was freed) is refused by
    :func:`dense` before any ``.item()`` could fail; ``device``: where it
    must live. Raises TypeError naming ``name`` for a non-tensor or a dtype
    outside ``dtypes`` (bool included), ValueError with ``message`` (a
    string, or a function giving it; default ``"{name} must lie in [low,
    high]"``) for an entry out of range or a decrease.
    """
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in dtypes:
        kinds = " or ".join(str(d).replace("torch.", "") for d in dtypes)
        raise TypeError(f"{name} must be an {kinds} tensor, got {x.dtype}")
    x = dense(x, name)
    if device is not None and x.device != device:
        raise ValueError(f"{name} must be on the device of the data: {x.device} != {device}")
    x = x.long()

    def refused() -> ValueError:
        if callable(message):
            return ValueError(message())
        if message is not None:
            return ValueError(message)
        return ValueError(f"{name} must lie in [{low}, {high}]" if high is not None else f"{name} must be at least {low}")

    if not x.numel():
        return x
    if low > _INT64_MAX or (high is not None and (high < _INT64_MIN or high < low)):
        raise refused()  # no int64 lies in the range
    bad = torch.zeros((), dtype=torch.bool, device=x.device)
    if low > _INT64_MIN:
        bad = bad | (x < low).any()
    if high is not None and high < _INT64_MAX:
        bad = bad | (x > high).any()
    if nondecreasing:
        if x.dim() != 1:
            raise ValueError(f"{name} must be 1-D, got shape {tuple(x.shape)}")
        bad = bad | (x[1:] < x[:-1]).any()
    if bool(bad):
        raise refused()
    return x


def check_seed(seed: object, name: str = "seed", *, none_ok: bool = False) -> Optional[int]:
    """A seed as an ``int`` in ``[0, 2**63 - 1]`` (:data:`SEED_MAX`), the same range for every seed argument (the seed check).

    TypeError naming ``name`` for a bool, a float or anything not an int
    (numpy ints are ints); ValueError naming ``name`` outside the range,
    instead of numpy's "expected non-negative integer" or torch's "Overflow
    when unpacking long long". ``none_ok``: None is returned as None.
    """
    if seed is None and none_ok:
        return None
    if isinstance(seed, (bool, np.bool_)) or not isinstance(seed, numbers.Integral):
        raise TypeError(f"{name} must be an int{' or None' if none_ok else ''}, got {type(seed).__name__}")
    s = int(seed)
    if not 0 <= s <= SEED_MAX:
        raise ValueError(f"{name} must lie in [0, 2**63 - 1] (the seeds every generator of valuelab takes), got {_short_int(s)}")
    return s


# ---------------------------------------------------------------------------
# issue 25: statistics that cannot overflow, counts, switches
# ---------------------------------------------------------------------------


def scale_of(x: torch.Tensor, mask: Optional[torch.Tensor] = None, dim: Optional[int] = None) -> torch.Tensor:
    """The unit a statistic of ``x`` is taken in: the power of two ``s`` with ``s <= max|x| < 2 s``.

    The maximum is over the valid entries (``mask != 0``; all when ``mask`` is None), along ``dim``
    (kept, for broadcasting) or over everything; 1 where no valid entry is
    nonzero. Every ``|x / s| < 2``, so sums and squares of the scaled
    entries stay far below the largest float, and dividing by a power of
    two is exact (outside subnormals): a statistic taken on ``x / s`` and
    multiplied back by ``s`` (or ``s**2``) is the unscaled formula's number
    wherever that one does not overflow, and finite wherever the true value
    is representable (the mean of ``[1e308, 1e308]`` is ``1e308``, not inf).
    No gradient flows through ``s``.
    """
    a = x.detach().abs()
    if mask is not None:
        a = torch.where(mask != 0, a, torch.zeros((), dtype=a.dtype, device=a.device))
    if a.numel() == 0:
        shape = () if dim is None else tuple(1 if i == dim % max(a.dim(), 1) else k for i, k in enumerate(a.shape))
        return torch.ones(shape, dtype=a.dtype, device=a.device)
    m = a.amax() if dim is None else a.amax(dim, keepdim=True)
    _, e = torch.frexp(m)  # m = f * 2**e with f in [0.5, 1)
    s = torch.ldexp(torch.ones_like(m), e - 1)
    return torch.where(m > 0, s, torch.ones((), dtype=a.dtype, device=a.device))


def shown(x: object, width: int = 80) -> str:
    """``repr(x)`` cut to ``width`` characters for an error message, without reading a tensor's data.

    A tensor is described by its shape, dtype and device: its repr reads the
    data, and the data of a freed tensor (storage resized to 0) or a meta
    tensor is not there to read (a SIGSEGV or a RuntimeError, not the error
    the message was for).
    """
    if isinstance(x, torch.Tensor):
        return f"a tensor of shape {tuple(x.shape)}, {x.dtype}, on {x.device.type}"
    try:
        text = repr(x)
    except Exception:  # noqa: BLE001 - a hostile __repr__ must not replace the error being raised
        text = f"a {type(x).__name__}"
    return text[:width]


def require_finite_result(x: Union[torch.Tensor, float], name: str, why: str) -> Union[torch.Tensor, float]:
    """``x``, a result computed from finite inputs, if it is finite; else ``ValueError("{name}: {why}")``.

    The last line of defence of the rule "finite inputs never give NaN or
    inf silently": a statistic whose true value does not fit the float (a
    variance of ``[1e308, -1e308]``, a policy ratio :math:`e^{1000}`) is an
    error naming the argument responsible, never an inf returned.
    """
    if isinstance(x, torch.Tensor):  # one reduction when the sum is finite (then every entry is), else every entry
        ok = sum_is_finite(x) or bool(torch.isfinite(x.detach()).all())
    else:
        ok = math.isfinite(x)
    if not ok:
        raise ValueError(f"{name}: {why}")
    return x


def check_count(count: object, name: str, *, at_least: float, what: str) -> float:
    """A count given by the caller (a total over ranks, micro-batches...): a finite real number ``>= at_least`` and ``> 0``.

    ``at_least`` is what this process alone holds (its local count): a
    global count below it cannot be a total, and dividing by it would make
    the local term too large. ``what`` names the local count in the message.
    TypeError for a non-number (bool included), ValueError naming ``name``
    otherwise.
    """
    c = check_scalar(count, name)
    if not math.isfinite(c):
        raise ValueError(f"{name} must be finite, got {c}")
    if c < 0:
        raise ValueError(f"{name} must be non-negative, got {c}")
    if c == 0:
        raise ValueError(f"{name} must be positive, got {count}")
    if c < at_least:
        raise ValueError(f"{name} must be at least {what} ({at_least:g}): a total over the ranks cannot be below one rank's share, got {count}")
    return c


def check_device(device: object, name: str = "device") -> torch.device:
    """``device`` (a string or a ``torch.device``) as a ``torch.device`` this machine has: the CPU, or a CUDA device that exists.

    TypeError naming ``name`` for anything else (an int, a bool, a numpy
    scalar: ``torch.device(99)`` would mean ``cuda:99``); ValueError naming
    it for a string that is not a device, a device type other than cpu and
    cuda, or a CUDA device this machine does not have -- instead of
    PyTorch's "Cannot access accelerator device" deep inside the call.
    """
    if not isinstance(device, (str, torch.device)):
        raise TypeError(f"{name} must be a string or a torch.device ('cpu', 'cuda', 'cuda:0'), got {type(device).__name__}")
    try:
        d = torch.device(device)
    except (RuntimeError, ValueError):
        raise ValueError(f"{name} must name a device ('cpu', 'cuda', 'cuda:0'), got {shown(device, 40)}") from None
    if d.type == "cpu":
        return d
    if d.type != "cuda":
        raise ValueError(f"{name} must be a cpu or cuda device, got {d}")
    if not torch.cuda.is_available():
        raise ValueError(f"{name} is {d}, but this machine has no CUDA device")
    if d.index is not None and d.index >= torch.cuda.device_count():
        raise ValueError(f"{name} is {d}, but this machine has {torch.cuda.device_count()} CUDA device(s)")
    return d


def memory_total(device: Union[str, torch.device] = "cpu") -> int:
    """Bytes of memory this process can have on ``device`` in all: a GPU's total memory; on the host, its physical memory,
    or less where an address-space limit (``ulimit -v``, ``RLIMIT_AS``) leaves this process less room (``2**40`` if unknown).

    Without an address-space limit it is the machine's size, not what
    happens to be free now: a size check against it gives the same verdict
    whatever else the machine is doing. Under such a limit it is the room
    left below the limit at the call, which shrinks as this process grows.
    """
    device = torch.device(device)
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).total_memory)
    if device.type == "meta":
        return 2**62
    try:
        total = int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        total = 2**40
    try:
        import resource

        cap = resource.getrlimit(resource.RLIMIT_AS)[0]
        if cap != resource.RLIM_INFINITY:
            with open("/proc/self/statm") as f:
                used = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
            total = min(total, max(cap - used, 0))
    except (ImportError, OSError, ValueError):
        pass
    return total


def check_memory(nbytes: int, name: str, device: Union[str, torch.device] = "cpu") -> None:
    """Refuse, before allocating, a call whose tensors need more than half the memory ``device`` has in all (the size check).

    Half: the call's own temporaries (a copy made while another is read)
    and any use of its result need room too; a result that fills the
    machine is an out-of-memory error one line later.

    ``nbytes``: what the call will allocate, computed from its integer
    arguments (exact Python ints, so ``2**63`` rows cannot wrap around).
    A size argument such as ``rows=2**31`` is then a ValueError naming
    ``name`` -- the argument that sets the size -- instead of PyTorch's
    allocator error, numpy's "array is too big", or a machine that swaps
    until it stops answering.
    """
    have = memory_total(device)
    if nbytes > have // 2:  # the call's own temporaries and any use of its result need the other half
        need = f"{nbytes / 2**30:.3g} GiB" if nbytes.bit_length() < 1000 else f"about 2**{nbytes.bit_length() - 1} bytes"
        raise ValueError(
            f"{name}: the call needs {need} on {torch.device(device)}, "
            f"more than half of the {have / 2**30:.3g} GiB this process can have there"
        )


_SWITCH_ON = ("1", "true", "yes", "on")
_SWITCH_OFF = ("0", "false", "no", "off")


def env_switch(var: str, default: bool) -> bool:
    """The on/off environment variable ``var``: ``1/true/yes/on`` or ``0/false/no/off`` in any case and with spaces around.

    Unset or empty: ``default``. Any other value is not ignored silently: a
    ``UserWarning`` names the variable, the value and the spellings
    accepted, and ``default`` is kept (a typo in a switch read at import
    must not make ``import valuelab`` fail).
    """
    import warnings

    raw = os.environ.get(var)
    if raw is None or not raw.strip():
        return default
    value = raw.strip().lower()
    if value in _SWITCH_ON:
        return True
    if value in _SWITCH_OFF:
        return False
    warnings.warn(
        f"{var}={raw!r} is neither on (1, true, yes, on) nor off (0, false, no, off; any case): "
        f"ignored, {var} stays {'on' if default else 'off'}",
        UserWarning,
        stacklevel=2,
    )
    return default
