r"""The one front door of the estimators: validate once, then dispatch to one backend.

Every estimator of :mod:`valuelab.returns` and :mod:`valuelab.advantages`
starts with :func:`validate`, which checks its arguments in one fixed order
-- ``rewards``, ``values``, ``mask``, ``gamma``, ``bootstrap``, ``lam`` --
and returns a :class:`Problem`: the arguments as ``(B, T)`` tensors and
Python floats, plus whether any input needs gradients. The only check that
waits is the finiteness of ``rewards`` and ``values`` (a pass over every
entry): the backend that runs takes it during its own pass (the C kernel) or
with one reduction, and :meth:`Problem.check_finite` names the first bad
entry. When a later argument is wrong, the finiteness of the earlier ones is
checked first, so the first error is always the one the order says.

:func:`solve` then runs GAE or the Monte-Carlo return on exactly one of
three backends:

=================  =============================================  ==========================
backend            when                                           module
=================  =============================================  ==========================
C kernel           numeric γ and λ, float32/64, CPU, no grad      :mod:`valuelab._engine.native`
PyTorch blocked    numeric γ and λ, float32/64, no grad           :mod:`valuelab._engine.blocked`
general            tensor γ or λ, other dtypes, or gradients      the estimator's own code,
                   (reverse or forward mode)                      on :mod:`valuelab._engine.scan`
=================  =============================================  ==========================

Derived in :doc:`/chapters/09_fast_gae` (the fast paths) and :doc:`/chapters/05_gae`
(the recursion all three compute).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Tuple, Union

import torch

from . import native as _native
from .blocked import decay, fused_returns
from .checks import (
    canonical_mask,
    check_bootstrap,
    check_like,
    check_mask,
    check_sequence_tensor,
    check_unit_interval,
    require_finite,
    sum_is_finite,
    traced,
    unit_scalar,
)

__all__ = ["Problem", "validate", "solve", "check_outputs", "fast_gae"]

Factor = Union[float, torch.Tensor]
Pair = Tuple[Optional[torch.Tensor], torch.Tensor]


@dataclass
class Problem:
    """The validated arguments of one estimator call, as ``(B, T)`` tensors.

    ``gamma`` and ``lam`` are Python floats (rounded to the dtype) when the
    caller gave numbers, else tensors broadcast to ``(B, T)`` (a per-sequence
    ``(B, 1)`` one keeps stride 0 along time); ``lam`` is None for the
    estimators without λ. ``mask`` is None when every token is valid;
    ``bootstrap`` is None when it is 0. ``rewards`` and ``values`` are not
    yet known to be finite: see :meth:`check_finite`.
    """

    rewards: torch.Tensor
    values: Optional[torch.Tensor]
    mask: Optional[torch.Tensor]
    gamma: Factor
    lam: Optional[Factor]
    bootstrap: Optional[torch.Tensor]
    squeeze: bool
    traced: bool

    @property
    def fused(self) -> bool:
        """Whether a fused backend (C kernel or PyTorch blocked scan) applies: numeric γ, λ; float32/64; no gradients."""
        return (
            isinstance(self.gamma, float)
            and (self.lam is None or isinstance(self.lam, float))
            and self.rewards.dtype in (torch.float32, torch.float64)
            and not self.traced
        )

    def check_finite(self) -> None:
        """Raise the error of the first non-finite entry of ``rewards``, then ``values`` (masked entries included)."""
        require_finite(self.rewards, "rewards", self.mask)
        if self.values is not None:
            require_finite(self.values, "values", self.mask)

    def torch_mask(self) -> Optional[torch.Tensor]:
        """The mask with bytes exactly 0 and 1, for the PyTorch backends (None: all valid)."""
        return None if self.mask is None else canonical_mask(self.mask)

    def out(self, y: torch.Tensor) -> torch.Tensor:
        """``y`` in the caller's shape (``(T,)`` when the caller passed one sequence)."""
        return y.squeeze(0) if self.squeeze else y


_NO_LAM = object()


def _as_batch(x: torch.Tensor) -> torch.Tensor:
    return x.unsqueeze(0) if x.dim() == 1 else x


def _factor(x: object, name: str, rewards: torch.Tensor) -> Factor:
    """γ or λ: a float rounded to the dtype, or a tensor in [0, 1] broadcast to ``rewards`` (then made 2-D)."""
    v = unit_scalar(x, name, rewards.dtype)
    return v if v is not None else _as_batch(check_unit_interval(x, name, rewards))


def validate(
    rewards: object,
    values: object,
    mask: object,
    gamma: object,
    bootstrap: object,
    lam: object = _NO_LAM,
    *,
    need_values: bool,
) -> Problem:
    """Check every argument once, in the order of the module docstring, into a :class:`Problem`.

    ``values`` is ignored unless ``need_values``; ``lam`` is checked only when
    given (the estimators without λ leave it out).
    """
    deferred: List[Tuple[torch.Tensor, str]] = []  # tensors whose finiteness is checked later
    try:
        r = check_sequence_tensor(rewards, "rewards", finite=False)
        deferred.append((r, "rewards"))
        v = None
        if need_values:
            v = check_like(values, "values", r, "rewards", finite=False)
            deferred.append((v, "values"))
        m = check_mask(mask, r, none_ok=True)
        g = _factor(gamma, "gamma", r)
        b = None if bootstrap is None else check_bootstrap(bootstrap, r)
        l = None if lam is _NO_LAM else _factor(lam, "lam", r)
    except (TypeError, ValueError):
        for x, name in deferred:  # an earlier argument's error comes first
            require_finite(x, name)
        raise
    squeeze = r.dim() == 1
    r2 = _as_batch(r)
    return Problem(
        rewards=r2,
        values=None if v is None else _as_batch(v),
        mask=None if m is None else _as_batch(m),
        gamma=g,
        lam=l,
        bootstrap=None if b is None else b.reshape(r2.shape[0]),
        squeeze=squeeze,
        traced=traced(r, v, g, l, b),
    )


def fast_gae(
    rewards: object, values: object, mask: object, gamma: object, lam: object, bootstrap: object
) -> Optional[Tuple[torch.Tensor, torch.Tensor]]:
    """``(advantages, returns)`` of :func:`valuelab.gae` for its commonest call, straight to the C kernel; else None.

    The commonest call -- ``(B, T)`` float32 or float64 CPU tensors C can
    read as they are (:func:`valuelab._engine.native.plain`), a bool mask or None,
    Python floats γ and λ in [0, 1], no bootstrap, nothing to differentiate,
    no ``__torch_function__`` or dispatch mode -- needs none of
    :func:`validate`'s conversions: it is recognised by O(1) queries and sent
    to the kernel with the same γ, λ and c as :func:`solve` would send, so the
    bits are the same. None for every other call (the caller then takes
    :func:`validate` and :func:`solve`), and when the kernel says an input or
    a sum was not finite (the full path then finds, and names, the entry).
    Chapter 9, "Large batches" (the fixed price of a call).
    """
    if not (_native._fn is not None and _native._enabled and bootstrap is None
            and type(gamma) is float and type(lam) is float and 0.0 <= gamma <= 1.0 and 0.0 <= lam <= 1.0
            and type(rewards) is torch.Tensor and not rewards.is_nested):  # a nested tensor has no .shape
        return None
    dtype, shape = rewards.dtype, rewards.shape
    if (dtype != torch.float32 and dtype != torch.float64) or len(shape) != 2 or not shape[0] or not shape[1]:
        return None
    if not (_native.plain(rewards, dtype, shape) and _native.plain(values, dtype, shape)
            and (mask is None or _native.plain(mask, torch.bool, shape))):
        return None
    if traced(rewards, values) or torch._C._len_torch_function_stack() or torch._C._len_torch_dispatch_stack():
        return None
    g, l = unit_scalar(gamma, "gamma", dtype), unit_scalar(lam, "lam", dtype)
    adv, ret, finite = _native.run(rewards, values, mask, None, g, decay(g, l, dtype, True))
    return (adv, ret) if finite else None


def solve(p: Problem, general: Callable[[Problem], Pair]) -> Pair:
    r"""``(advantages, returns)`` of GAE (``p.values`` given) or ``(None, returns)`` of the Monte-Carlo return.

    Runs the C kernel, else the PyTorch blocked scan, when :attr:`Problem.fused`;
    otherwise ``general(p)``, the estimator's differentiable path. On every
    path the inputs are checked for finiteness and so are the outputs
    (:func:`check_outputs`). The outputs are ``(B, T)``.
    """
    finite: Optional[bool] = None
    if not p.fused:
        adv, ret = general(p)
    else:
        lam = 1.0 if p.lam is None else p.lam
        c = decay(p.gamma, lam, p.rewards.dtype, p.values is not None)
        native = _native.scan(p.rewards, p.values, p.mask, p.gamma, c, p.bootstrap)
        if native is not None:
            adv, ret, finite = native  # finite: the sum of every input read and every return written
        else:
            adv, ret = fused_returns(p.rewards, p.values, p.torch_mask(), p.gamma, lam, p.bootstrap)
    check_outputs(p, {"returns": ret, "advantages": adv}, finite)
    return adv, ret


def check_outputs(p: Problem, outputs: Dict[str, Optional[torch.Tensor]], finite: Optional[bool] = None) -> None:
    """Raise unless the inputs and the outputs of ``p`` are all finite; ``finite`` is a sum already taken (or None).

    One reduction (one device sync) over the inputs and outputs together, when
    ``finite`` is not given: a finite sum means every entry is finite. Only
    when it is not are the entries looked at: first the inputs
    (:meth:`Problem.check_finite`, which names the first bad one), then the
    outputs -- finite inputs whose result overflows the dtype (returns near
    the largest float) are an error too, never a silent inf.
    """
    if finite is None:
        parts = [p.rewards, p.values, *outputs.values()]
        sums = [x.detach().sum().double() for x in parts if x is not None and x.numel()]
        finite = not sums or bool(torch.isfinite(torch.stack(sums).sum()))
    if finite:
        return
    p.check_finite()
    for name, y in outputs.items():
        if y is not None and not sum_is_finite(y) and not bool(torch.isfinite(y.detach()).all()):
            where = tuple(int(i) for i in (~torch.isfinite(y.detach())).nonzero()[0])
            raise ValueError(
                f"rewards and values are finite but too large for {p.rewards.dtype}: the {name} overflow at "
                f"{list(where)}; scale the rewards (or use float64)"
            )
