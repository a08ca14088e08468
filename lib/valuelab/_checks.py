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
from typing import Optional, Union

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
    "check_positive_int",
    "check_nonnegative_scalar",
    "real_number",
    "unit_scalar",
    "sum_is_finite",
    "require_finite",
    "traced",
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


def check_mask(mask: object, like: torch.Tensor, name: str = "mask", *, none_ok: bool = False) -> Optional[torch.Tensor]:
    """A boolean version of ``mask`` (all ones when ``mask`` is None, or None with ``none_ok``).

    ``mask`` may be bool or real, but a real mask may only hold 0 and 1. A
    bool mask is returned as it is; one whose bytes are not all 0 or 1 (a
    ``uint8`` tensor viewed as bool) counts every nonzero byte as True on
    every path (:meth:`valuelab._problem.Problem.torch_mask`).
    """
    if mask is None:
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
        raise ValueError(f"{name} must be finite: {x!r:.40} is too large for a float") from None


def check_unit_interval(x: object, name: str, like: torch.Tensor) -> torch.Tensor:
    """``x`` (a float or a tensor) in [0, 1], broadcast to ``like``'s shape, dtype and device."""
    if isinstance(x, bool):
        raise TypeError(f"{name} must be a float or a tensor, not bool")
    if isinstance(x, numbers.Real):
        t = torch.tensor(real_number(x, name), dtype=like.dtype, device=like.device)
    elif isinstance(x, torch.Tensor):
        if x.dtype == torch.bool or x.is_complex():
            raise TypeError(f"{name} must be a real float tensor, got {x.dtype}")
        t = dense(x, name).to(device=like.device, dtype=like.dtype)
    else:
        raise TypeError(f"{name} must be a float or a torch.Tensor, got {type(x).__name__}")
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
    if isinstance(x, bool):
        raise TypeError(f"{name} must be a float or a tensor, not bool")
    if not isinstance(x, numbers.Real):
        return None
    v = real_number(x, name)
    if dtype == torch.float32 and 0.0 <= v <= 1.0:
        v = float(np.float32(v))  # IEEE round to nearest, as torch.tensor(v, dtype=float32)
    elif dtype != torch.float64 or not 0.0 <= v <= 1.0:  # NaN fails the comparison
        v = torch.tensor(v, dtype=dtype).item()
    if v != v:
        raise ValueError(f"{name} must not be NaN")
    if not 0.0 <= v <= 1.0:
        raise ValueError(f"{name} must lie in [0, 1]")
    return v


def check_bootstrap(bootstrap: object, like: torch.Tensor, name: str = "bootstrap") -> torch.Tensor:
    """The value after the last valid token: a tensor of shape ``like.shape[:-1]`` (default 0)."""
    batch_shape = like.shape[:-1]
    if bootstrap is None:
        return torch.zeros(batch_shape, dtype=like.dtype, device=like.device)
    if isinstance(bootstrap, bool):
        raise TypeError(f"{name} must be a float or a tensor, not bool")
    if isinstance(bootstrap, numbers.Real):
        v = real_number(bootstrap, name)
        b = torch.full(batch_shape, v, dtype=like.dtype, device=like.device)
    elif isinstance(bootstrap, torch.Tensor):
        if not torch.is_floating_point(bootstrap):
            raise TypeError(f"{name} must have a floating dtype, got {bootstrap.dtype}")
        bootstrap = dense(bootstrap, name)
        if bootstrap.shape != batch_shape:
            raise ValueError(
                f"{name} must be a float or have shape {tuple(batch_shape)} (rewards.shape[:-1]), "
                f"got {tuple(bootstrap.shape)}"
            )
        b = bootstrap.to(device=like.device, dtype=like.dtype)
    else:
        raise TypeError(f"{name} must be a float or a torch.Tensor, got {type(bootstrap).__name__}")
    require_finite(b, name)
    return b


def check_int(n: object, name: str) -> int:
    """A Python int (not bool), as an ``int``; ``TypeError`` naming ``name`` otherwise."""
    if isinstance(n, bool) or not isinstance(n, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(n).__name__}")
    return int(n)


def check_positive_int(n: object, name: str) -> int:
    """A Python int (not bool) that is at least 1."""
    if isinstance(n, bool) or not isinstance(n, numbers.Integral):
        raise TypeError(f"{name} must be a positive int, got {type(n).__name__}")
    if int(n) < 1:
        raise ValueError(f"{name} must be a positive int, got {n}")
    return int(n)


def check_nonnegative_scalar(x: object, name: str) -> float:
    """A finite real number that is at least 0."""
    if isinstance(x, bool) or not isinstance(x, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {type(x).__name__}")
    x = real_number(x, name)
    if x != x or x in (float("inf"), float("-inf")):
        raise ValueError(f"{name} must be finite, got {x}")
    if x < 0:
        raise ValueError(f"{name} must be non-negative, got {x}")
    return x


def optional_like(x: Optional[object], name: str, like: torch.Tensor, like_name: str) -> Optional[torch.Tensor]:
    """``check_like`` that lets None through."""
    return None if x is None else check_like(x, name, like, like_name)
