"""Putting a valuelab function into a trainer's module or class, and taking it out again (chapter 14 (:doc:`/chapters/14_trainers`)).

One rule for every trainer: :func:`swap` remembers the trainer's original
the first time, on the object it patches, so a second install does nothing
new and a restore always puts the trainer's own function back, however many
installs came before. The inputs the trainers' functions accept are checked
here too, once for all adapters: the discount-like scalars (:func:`rate`)
and the dtype of the outputs (:func:`promoted`).
"""

from __future__ import annotations

from typing import Any, Callable, MutableMapping, Optional, Tuple, Union

import torch

from .._engine.checks import check_scalar, dense

__all__ = ["swap", "rate", "promoted", "refuse_nonfinite"]

_ORIGINALS = "_valuelab_originals"


def swap(owner: Any, name: str, replacement: Callable, *, registry: Optional[MutableMapping] = None,
         key: Optional[str] = None) -> Callable[[], None]:
    """Set ``owner.name`` (and ``registry[key]``) to ``replacement``; return a function that restores the originals.

    Idempotent: the originals are taken only at the first call and stored on
    ``owner`` (attribute ``_valuelab_originals``), so ``swap`` twice then
    restore leaves the trainer's own function in place.
    """
    if not hasattr(owner, name):
        raise TypeError(f"{owner!r} has no attribute {name!r}: not the trainer object this adapter patches")
    originals = vars(owner).get(_ORIGINALS)
    if originals is None:
        originals = {}
        setattr(owner, _ORIGINALS, originals)
    originals.setdefault(name, vars(owner).get(name, getattr(owner, name)))
    if registry is not None:
        originals.setdefault(("registry", key), registry.get(key))
    setattr(owner, name, replacement)
    if registry is not None:
        registry[key] = replacement

    def restore() -> None:
        setattr(owner, name, originals[name])
        if registry is not None:
            registry[key] = originals[("registry", key)]

    return restore


def installed(owner: Any, name: str, replacement: Callable) -> bool:
    """True when ``owner.name`` is ``replacement`` (the swap is in force)."""
    return vars(owner).get(name, getattr(owner, name, None)) is replacement


def rate(x: object, name: str, rows: int, *, per_row: bool) -> Union[float, torch.Tensor]:
    """A discount-like argument as the trainers accept it: a real number in [0, 1], a 0-d tensor, or (``per_row``) a ``(rows,)`` tensor.

    Returns a float, or a ``(rows, 1)`` tensor for :func:`valuelab.gae`.
    Bools and strings are refused (``True`` is not a discount), as
    :func:`valuelab.gae` refuses them.
    """
    if isinstance(x, torch.Tensor):
        if x.dtype == torch.bool:
            raise TypeError(f"{name} must be a real number or a float tensor, not bool")
        if not torch.is_floating_point(x):
            raise TypeError(f"{name} must be a float tensor, got {x.dtype}")
        x = dense(x, name)
        if x.dim() == 0:
            v = float(x.detach())
        elif per_row and x.shape == (rows,):
            if not bool(((x >= 0) & (x <= 1)).all()):  # NaN fails both comparisons
                raise ValueError(f"{name} must lie in [0, 1]")
            return x.detach().reshape(rows, 1)
        else:
            allowed = f"a 0-d tensor or shape ({rows},), one per row" if per_row else "a 0-d tensor"
            raise ValueError(f"{name} must be a number or {allowed}; got shape {tuple(x.shape)}")
    else:
        v = check_scalar(x, name, "a real number or a float tensor")  # bools and strings refused, as valuelab.gae does
    if not 0.0 <= v <= 1.0:  # NaN fails the comparison
        raise ValueError(f"{name} must lie in [0, 1], got {v}")
    return v


def promoted(*named: Tuple[str, torch.Tensor]) -> Tuple[torch.dtype, Tuple[torch.Tensor, ...]]:
    """The output dtype the trainers' arithmetic gives (``torch.result_type`` rules), and the tensors cast for computing.

    verl and OpenRLHF compute ``reward + gamma * value - value`` on the
    tensors they are given, so bf16 values with fp32 rewards give fp32
    advantages: the first return value. The tensors come back in that dtype,
    except half precision (bf16, fp16), which is computed in float32 and
    rounded once at the end by the caller: the trainers' loops round at every
    step, so in half precision valuelab is the more accurate of the two. All
    tensors must be on one device.
    """
    dtype = named[0][1].dtype
    for _, x in named[1:]:
        dtype = torch.promote_types(dtype, x.dtype)
    device = named[0][1].device
    for n, x in named:
        if x.device != device:
            raise ValueError(f"{n} must be on the device of {named[0][0]} ({device}), got {x.device}")
    work = dtype if dtype in (torch.float32, torch.float64) else torch.float32
    return dtype, tuple(x.to(work) for _, x in named)


def refuse_nonfinite(x: torch.Tensor, name: str, mask: Optional[torch.Tensor], trainer: str) -> None:
    """Refuse NaN or inf in ``x``, saying where it is and what the trainer would have done with it.

    verl and OpenRLHF multiply by the mask, and ``NaN * 0`` is NaN, so a NaN
    even at a masked position spreads to every earlier advantage of its row
    in the trainer; valuelab raises instead.
    """
    bad = ~torch.isfinite(x)
    if not bool(bad.any()):
        return
    where = "at masked positions only" if mask is not None and not bool((bad & mask).any()) else "at valid positions"
    raise ValueError(f"{name} holds NaN or inf ({where}): {trainer}'s loop multiplies by the mask and NaN * 0 is NaN, "
                     f"so {trainer} would return NaN advantages for the row; valuelab refuses. Zero the entries first "
                     "(valuelab.integrations.zero_holes).")
