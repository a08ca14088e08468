r"""TorchRL's GAE, and valuelab's batch layout to TorchRL's and back (chapter 11 (:doc:`/chapters/11_pitfalls`)).

TorchRL's advantage functions (``torchrl.objectives.value.functional``,
checked against TorchRL 0.14.1) read tensors of shape ``[*B, T, *F]`` with
time on dimension ``time_dim`` (default -2, e.g. ``(B, T, 1)``): the value of
each state, the value of the *next* state at each step, the reward, ``done``
(a trajectory stops here: the recursion restarts) and ``terminated`` (it
stops because the episode ended, so the next value is not used). A row may
hold any number of trajectories, one after the other. A response cut by
the length limit is ``done`` but not ``terminated``, and TorchRL bootstraps
from its next value: valuelab's ``bootstrap``.

* :func:`generalized_advantage_estimate` and
  :func:`vec_generalized_advantage_estimate`: drop-ins for TorchRL's two
  functions of those names (same signature, same ``(advantage,
  value_target)``), any number of trajectories per row, any ``time_dim``,
  feature dimensions, tensor ``gamma`` / ``lmbda``; computed by valuelab's
  scan (``valuelab._engine.fastscan.fast_backward_scan``) without a Python loop
  over the steps.
* :func:`to_torchrl` and :func:`from_torchrl`: valuelab's right-padded
  ``(B, T)`` batch (one trajectory per row, a mask) as TorchRL's ``(B, T, 1)``
  keyword arguments, and back; :func:`from_torchrl` keeps that
  one-trajectory-per-row contract and refuses rows with several.
"""

from __future__ import annotations

from typing import Dict, NamedTuple, Optional, Tuple, Union

import torch

from .._engine.checks import (check_flag, check_int, check_mask, check_sequence_tensor, check_unit_interval, dense, require_finite,
                       require_finite_result,
                       unit_scalar)
from .._engine.fastscan import fast_backward_scan

__all__ = [
    "generalized_advantage_estimate",
    "vec_generalized_advantage_estimate",
    "to_torchrl",
    "from_torchrl",
    "ValuelabBatch",
]

Discount = Union[float, torch.Tensor]

_MULTI = ("valuelab.integrations.torchrl.generalized_advantage_estimate computes GAE on rows holding "
          "several trajectories (TorchRL's layout) directly")


# ---------------------------------------------------------------------------
# GAE with TorchRL's signature and semantics
# ---------------------------------------------------------------------------


def _value_tensor(x: object, name: str) -> torch.Tensor:
    """A dense floating tensor with finite entries (any shape)."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if not torch.is_floating_point(x):
        raise TypeError(f"{name} must have a floating dtype (float32 or float64), got {x.dtype}")
    x = dense(x, name)
    require_finite(x, name)
    return x


def _like_reward(x: object, name: str, reward: torch.Tensor) -> torch.Tensor:
    """A value tensor of exactly ``reward``'s shape (no broadcasting, as TorchRL), dtype and device."""
    x = _value_tensor(x, name)
    if x.shape != reward.shape:
        raise ValueError(f"{name} must have the shape of reward, {tuple(reward.shape)}, got {tuple(x.shape)} "
                         "(TorchRL requires one shape for all the tensors; nothing is broadcast)")
    return _kind_of_reward(x, name, reward)


def _kind_of_reward(x: torch.Tensor, name: str, reward: torch.Tensor) -> torch.Tensor:
    """``x`` (a tensor of ``reward``'s shape) if it has ``reward``'s dtype and device: nothing is cast or moved."""
    if x.dtype != reward.dtype:
        raise TypeError(f"{name} must have the dtype of reward: {x.dtype} != {reward.dtype}")
    if x.device != reward.device:
        raise ValueError(f"{name} must be on the device of reward: {x.device} != {reward.device}")
    return x


def _flag(x: object, name: str, reward: torch.Tensor) -> torch.Tensor:
    """A bool tensor of exactly ``reward``'s shape, on its device (``valuelab._engine.checks.check_flag``)."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a bool torch.Tensor, got {type(x).__name__}")
    if x.dtype != torch.bool:
        raise TypeError(
            f"{name} must be a bool tensor, got {x.dtype}: TorchRL takes ~{name}, which on an integer tensor is a "
            f"bitwise NOT (~1 == -2, not 0) and on a float tensor fails; pass {name}.bool()"
        )
    return check_flag(x, name, shape=reward.shape, device=reward.device, like_name="reward")


def _time_axis(time_dim: object, reward: torch.Tensor) -> int:
    """``time_dim`` as a non-negative axis of ``reward``."""
    t = check_int(time_dim, "time_dim")
    n = reward.dim()
    if not -n <= t < n:
        raise ValueError(f"time_dim={t} is not a dimension of reward, of shape {tuple(reward.shape)}")
    return t % n


def _discount(x: object, name: str, reward: torch.Tensor) -> Discount:
    """``gamma`` or ``lmbda``: a Python float in [0, 1], or a tensor in [0, 1] broadcast to ``reward``.

    A number stays a Python float (rounded to ``reward.dtype`` only where it
    meets a tensor, as in TorchRL); a tensor is cast to ``reward``'s dtype
    and device and broadcast to its shape, in the caller's layout (a
    ``(B, 1, 1)`` tensor is one discount per row of a ``(B, T, 1)`` batch).
    """
    if isinstance(x, torch.Tensor):
        if x.dtype == torch.bool or x.is_complex():
            raise TypeError(f"{name} must be a real number or a real tensor, got a {x.dtype} tensor")
        try:
            shape = torch.broadcast_shapes(x.shape, reward.shape)
        except RuntimeError:
            shape = None
        if shape != reward.shape:
            raise ValueError(f"{name} of shape {tuple(x.shape)} does not broadcast to reward's shape "
                             f"{tuple(reward.shape)}")
        return check_unit_interval(x, name, reward)
    v = unit_scalar(x, name, reward.dtype)  # TypeError for bool, ValueError for NaN or outside [0, 1]
    if v is None:
        raise TypeError(f"{name} must be a real number or a torch.Tensor, got {type(x).__name__}")
    exact = float(x)  # the product gamma * lmbda is taken on the numbers given, then rounded once (TorchRL)
    return exact if 0.0 <= exact <= 1.0 else v


def _gae(gamma: object, lmbda: object, state_value: object, next_state_value: object, reward: object,
         done: object, terminated: object, time_dim: object) -> Tuple[torch.Tensor, torch.Tensor]:
    """The computation shared by :func:`generalized_advantage_estimate` and :func:`vec_generalized_advantage_estimate`."""
    reward = _value_tensor(reward, "reward")
    state_value = _like_reward(state_value, "state_value", reward)
    next_state_value = _like_reward(next_state_value, "next_state_value", reward)
    done = _flag(done, "done", reward)
    terminated = done if terminated is None else _flag(terminated, "terminated", reward)
    axis = _time_axis(time_dim, reward)
    gamma = _discount(gamma, "gamma", reward)
    lmbda = _discount(lmbda, "lmbda", reward)
    dtype = reward.dtype

    # TD errors, elementwise, in TorchRL's order of operations: r + (gamma * not_terminated) * V' - V
    delta = reward + ((~terminated).to(dtype) * gamma) * next_state_value - state_value
    if reward.numel() == 0:
        return delta.clone(), delta + state_value  # nothing to scan (empty, with the graph of the inputs)
    T = reward.shape[axis]
    # time last, every other axis flattened into rows: one (N, T) problem for the scan
    x = delta.movedim(axis, -1)
    moved = x.shape
    x = x.reshape(-1, T)
    # the per-step decay gamma * lmbda * (1 - done): 0 where a trajectory ends, so the next one is not carried over
    decay = lmbda * gamma
    if isinstance(decay, torch.Tensor):
        decay = decay.movedim(axis, -1).reshape(-1, T)
    d = (~done).movedim(axis, -1).reshape(-1, T).to(dtype) * decay
    adv = fast_backward_scan(x, d).reshape(moved).movedim(-1, axis)
    if not adv.is_contiguous():
        adv = adv.contiguous()
    target = adv + state_value
    why = f"the advantages or value targets overflow {dtype} (finite inputs, a sum beyond the largest float): rescale the rewards"
    return require_finite_result(adv, "reward", why), require_finite_result(target, "reward", why)


def generalized_advantage_estimate(
    gamma: Discount,
    lmbda: Discount,
    state_value: torch.Tensor,
    next_state_value: torch.Tensor,
    reward: torch.Tensor,
    done: torch.Tensor,
    terminated: Optional[torch.Tensor] = None,
    *,
    time_dim: int = -2,
) -> Tuple[torch.Tensor, torch.Tensor]:
    r"""Generalized advantage estimation with TorchRL's signature: the GAE recursion on any number of trajectories per row.

    A drop-in for TorchRL's ``torchrl.objectives.value.functional.generalized_advantage_estimate``
    (TorchRL 0.14.1): the same signature, the same ``(advantage, value_target)``
    of ``reward``'s shape, with ``value_target = advantage + state_value``. It
    computes the GAE recursion, equation :eq:`eq-gae-recursion` of chapter 5
    (:doc:`/chapters/05_gae`), with TorchRL's ``done`` / ``terminated``:

    .. math::

        \begin{aligned}
        \delta_t &= r_t + \gamma_t (1 - \text{term}_t) V'_t - V_t,\\
        \hat A_t &= \delta_t + \gamma_t \lambda_t (1 - \text{done}_t) \hat A_{t+1},\\
        \hat A_T &= 0,
        \end{aligned}

    along ``time_dim``, where ``V'`` is ``next_state_value``, term is ``terminated``, and ``gamma_t``,
    ``lmbda_t`` are the entries at step ``t`` (tensor discounts). A row may
    hold any number of trajectories: each ``done`` restarts the recursion,
    and every step that is not ``terminated`` bootstraps from its own next
    value (a step that is ``terminated`` but not ``done`` uses no next value
    and still carries the advantage of the next step, as TorchRL does). The
    end of the row ends the last trajectory, bootstrapped from its next value
    unless it is ``terminated``.

    No Python loop over the steps: the TD errors are computed elementwise,
    time is moved to the last axis and the other axes flattened into rows,
    and valuelab's scan ``valuelab._engine.fastscan.fast_backward_scan`` solves
    the recursion with the per-step decay ``gamma * lmbda * (1 - done)``
    (:eq:`eq-fast-scan` of chapter 9). TorchRL's two functions compute the
    same thing; so do valuelab's two, which share this implementation. The
    result is differentiable in ``state_value``, ``next_state_value``,
    ``reward`` and tensor ``gamma`` / ``lmbda``, as TorchRL's.

    Args:
        gamma: the discount: a real number in [0, 1] or a real tensor with
            entries in [0, 1] that broadcasts to ``reward``'s shape (a 0-d or
            one-element tensor, one per row, one per step...).
        lmbda: the GAE λ, as ``gamma``.
        state_value: ``V(s_t)``, a float tensor ``[*B, T, *F]``.
        next_state_value: ``V(s_{t+1})``, same shape, dtype and device.
        reward: ``r_t``, same shape, dtype and device.
        done: bool tensor of the same shape: a trajectory ends at this step.
        terminated: bool tensor of the same shape: the episode ended, the
            next value is not used; default ``done``.
        time_dim: the time dimension (keyword only), default -2.

    Returns:
        ``(advantage, value_target)``, each of ``reward``'s shape and dtype.

    Raises:
        TypeError: a value tensor that is not a floating tensor, or whose
            dtype differs from ``reward``'s; ``done`` or ``terminated`` not a
            bool tensor (TorchRL takes ``~done``: on an integer tensor a
            bitwise NOT, so ``done = 1`` would silently read as "not done");
            ``gamma`` or ``lmbda`` a bool, a string, a bool or complex tensor;
            ``time_dim`` not an int.
        ValueError: shapes that are not all equal (TorchRL broadcasts
            nothing either), ``gamma`` / ``lmbda`` outside [0, 1] or NaN or
            not broadcastable to ``reward``, non-finite values, a
            ``time_dim`` that is not a dimension of ``reward``, tensors on
            different devices. Each message starts with the argument's name.

    Differences from TorchRL 0.14.1, all deliberate and tested in
    ``tests/test_torchrl_gae.py``:

    * stricter arguments: ``gamma`` and ``lmbda`` in [0, 1] (as every
      estimator of valuelab; TorchRL accepts any number), finite values, one
      dtype for the three value tensors, ``done`` / ``terminated`` bool
      (TorchRL checks none of these);
    * the inputs' dtype throughout: TorchRL multiplies a Python-float
      ``gamma`` by an integer tensor, which rounds it to torch's *default*
      dtype, so on float64 inputs its results are float32-accurate (about
      1e-7 relative) unless the default dtype is float64, where they equal
      these to float64 rounding; a float32 tensor ``gamma`` times a float
      ``lmbda`` is likewise formed in float32 there;
    * no truncation: TorchRL's vectorised function drops the terms of its
      geometric kernel below 1e-7 (an error of up to about
      ``1e-7 / (1 - gamma * lmbda)`` times the largest TD error), and fails
      when ``gamma * lmbda`` is below 1e-7 (0 included) or the batch is
      empty; both are computed here;
    * shapes: a tensor ``gamma`` / ``lmbda`` with fewer dimensions than
      ``reward`` is broadcast in the caller's layout (TorchRL transposes it
      on its own dimensions when ``time_dim != -2``, which agrees only for a
      negative ``time_dim`` within its dimensions); a 1-D input with
      ``time_dim=0`` comes back 1-D (TorchRL returns ``(T, 1)``), and a 1-D
      input of one step is computed (TorchRL fails).
    """
    return _gae(gamma, lmbda, state_value, next_state_value, reward, done, terminated, time_dim)


def vec_generalized_advantage_estimate(
    gamma: Discount,
    lmbda: Discount,
    state_value: torch.Tensor,
    next_state_value: torch.Tensor,
    reward: torch.Tensor,
    done: torch.Tensor,
    terminated: Optional[torch.Tensor] = None,
    *,
    time_dim: int = -2,
) -> Tuple[torch.Tensor, torch.Tensor]:
    r"""GAE under the name of TorchRL's vectorised function: the same computation as :func:`generalized_advantage_estimate`.

    A drop-in for TorchRL's
    ``torchrl.objectives.value.functional.vec_generalized_advantage_estimate``
    (TorchRL 0.14.1): the GAE recursion, equation :eq:`eq-gae-recursion` of
    chapter 5 (:doc:`/chapters/05_gae`),
    :math:`\hat A_t = \delta_t + \gamma_t \lambda_t (1 - \text{done}_t) \hat A_{t+1}` with
    :math:`\delta_t = r_t + \gamma_t (1 - \text{terminated}_t) V'_t - V_t`,
    returning ``(advantage, value_target)``. TorchRL's vectorised function
    computes what its loop computes, by a convolution with the geometric
    kernel (truncated below 1e-7) when ``gamma * lmbda`` is a scalar, or a
    ``(B, T, T)`` kernel when it is a tensor; valuelab's two functions share
    one implementation, valuelab's scan, with the arguments, errors and
    differences from TorchRL documented in :func:`generalized_advantage_estimate`.
    """
    return _gae(gamma, lmbda, state_value, next_state_value, reward, done, terminated, time_dim)


# ---------------------------------------------------------------------------
# valuelab's layout <-> TorchRL's
# ---------------------------------------------------------------------------


def _right_padded(m: torch.Tensor) -> torch.Tensor:
    lengths = m.sum(-1)
    if bool((lengths < 1).any()):
        raise ValueError("mask: every row needs at least one valid token")
    if not torch.equal(m, torch.arange(m.shape[-1], device=m.device) < lengths[:, None]):
        raise ValueError("mask must be right-padded (no holes): TorchRL has no notion of a hole inside a trajectory")
    return lengths


def to_torchrl(
    rewards: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    *,
    truncated: Optional[torch.Tensor] = None,
    bootstrap: Optional[torch.Tensor] = None,
) -> Dict[str, torch.Tensor]:
    """The keyword arguments of TorchRL's GAE for a right-padded ``(B, T)`` batch.

    ``done`` is True at each row's last valid token; ``terminated`` there too
    unless the row is ``truncated`` (``(B,)`` bool), whose next value is then
    ``bootstrap`` (``(B,)``). The padding after a row's end is a trajectory
    of its own for TorchRL: ignore its outputs (mask them). ``bootstrap``
    without ``truncated`` is refused (ValueError), not ignored. ``values``
    must have the dtype of ``rewards`` (TorchRL's GAE takes its value
    tensors in one dtype; TypeError otherwise); ``bootstrap`` is cast to it,
    as it becomes an entry of ``next_state_value``.
    """
    rewards = check_sequence_tensor(rewards, "rewards")
    values = check_sequence_tensor(values, "values")
    if rewards.dim() != 2 or values.shape != rewards.shape:
        raise ValueError(f"rewards and values must be (B, T) of one shape, got {tuple(rewards.shape)} and {tuple(values.shape)}")
    if values.dtype != rewards.dtype:  # TorchRL's GAE takes its three value tensors in one dtype; no silent rounding here
        raise TypeError(f"values must have the dtype of rewards: {values.dtype} != {rewards.dtype}")
    m = check_mask(mask, rewards)
    lengths = _right_padded(m)
    B, T = rewards.shape
    last = torch.arange(T, device=rewards.device) == (lengths - 1)[:, None]
    cut = torch.zeros(B, dtype=torch.bool, device=rewards.device)
    if truncated is None and bootstrap is not None:
        raise ValueError("bootstrap is given but truncated is not: say which rows were cut (truncated=...)")
    if truncated is not None:
        cut = check_flag(truncated, "truncated", shape=(B,), hint=", one flag per row").to(rewards.device)
    next_values = torch.zeros_like(values)
    next_values[:, :-1] = values[:, 1:]
    if bool(cut.any()):
        if bootstrap is None:
            raise ValueError("truncated rows need bootstrap, the value of the state after their last token")
        bootstrap = check_sequence_tensor(bootstrap, "bootstrap")
        if bootstrap.shape != (B,):
            raise ValueError(f"bootstrap must have shape ({B},), got {tuple(bootstrap.shape)}")
        next_values = torch.where(last & cut[:, None], bootstrap.to(values.dtype)[:, None], next_values)  # values' dtype
    next_values = torch.where(last & ~cut[:, None], torch.zeros_like(next_values), next_values)
    col = lambda x: x.unsqueeze(-1)  # noqa: E731
    return dict(state_value=col(values), next_state_value=col(next_values), reward=col(rewards),
                done=col(last), terminated=col(last & ~cut[:, None]))


class ValuelabBatch(NamedTuple):
    """Output of :func:`from_torchrl`: the arguments of :func:`valuelab.gae`."""

    rewards: torch.Tensor
    values: torch.Tensor
    mask: torch.Tensor
    bootstrap: torch.Tensor
    """(B,): the next value at a truncated row's end, 0 where the row terminated."""


def _one_trajectory_rows(d: torch.Tensor, term: torch.Tensor) -> torch.Tensor:
    """Each ``(B, T)`` row's end: its only ``done`` step; ValueError for a row with none or several, or a stray ``terminated``."""
    count = d.sum(-1)
    if bool((count == 0).any()):
        row = int((count == 0).nonzero()[0])
        raise ValueError(
            f"done: row {row} has no done step, so it does not say where its trajectory ends (TorchRL would end it "
            f"at the row's last step and bootstrap there); from_torchrl reads one trajectory per row, ended by its "
            f"first done. Mark the end, or use {_MULTI}"
        )
    if bool((count > 1).any()):
        row = int((count > 1).nonzero()[0])
        steps = d[row].nonzero().flatten().tolist()
        raise ValueError(
            f"done: row {row} has {len(steps)} done steps (t = {', '.join(map(str, steps[:5]))}"
            f"{', ...' if len(steps) > 5 else ''}): the steps after its first done are another trajectory, not "
            f"padding (padding has no done). from_torchrl reads one trajectory per row; {_MULTI}"
        )
    stray = term & ~d
    if bool(stray.any()):
        row, t = (int(i) for i in stray.nonzero()[0])
        raise ValueError(
            f"terminated: row {row} is terminated at t = {t}, which is not its done step: inside a trajectory "
            f"(no bootstrap there, the recursion carried on) or in its padding, valuelab's one-trajectory batch "
            f"cannot say that; {_MULTI}"
        )
    T = d.shape[-1]
    return torch.where(d, torch.arange(T, device=d.device), torch.full_like(d, T, dtype=torch.long)).min(-1).values


def from_torchrl(state_value: torch.Tensor, next_state_value: torch.Tensor, reward: torch.Tensor,
                 done: torch.Tensor, terminated: Optional[torch.Tensor] = None) -> ValuelabBatch:
    """TorchRL's ``(B, T, 1)`` tensors, one trajectory per row starting at t = 0, as valuelab's ``(B, T)`` batch.

    Each row's ``done`` step ends its trajectory (the later steps are
    padding: no ``done`` and no ``terminated`` there); where it is not
    ``terminated`` (default: ``done``) the bootstrap is that step's next
    value. The layout :func:`to_torchrl` writes.

    Raises:
        TypeError: a value tensor that is not a float tensor, or whose
            dtype differs from ``reward``'s (nothing is cast); ``done`` or
            ``terminated`` not a bool tensor.
        ValueError: a value tensor not ``(B, T, 1)``, or shapes that
            disagree (nothing is broadcast); tensors on different devices,
            or meta tensors; a row without a ``done`` step, or with several (a
            row of several trajectories: use
            :func:`generalized_advantage_estimate`, which computes GAE on
            TorchRL's layout directly); a ``terminated`` step that is not
            its row's ``done`` step.
    """
    for name, x in (("state_value", state_value), ("next_state_value", next_state_value), ("reward", reward)):
        if not isinstance(x, torch.Tensor) or not x.is_floating_point():
            raise TypeError(f"{name} must be a float tensor, got "
                            f"{x.dtype if isinstance(x, torch.Tensor) else type(x).__name__}")
        if x.dim() != 3 or x.shape[-1] != 1:
            raise ValueError(f"{name} must have shape (B, T, 1), got {tuple(x.shape)}")
    reward = dense(reward, "reward")
    for name, x in (("state_value", state_value), ("next_state_value", next_state_value)):
        if x.shape != reward.shape:
            raise ValueError(f"{name} must have the shape of reward, {tuple(reward.shape)}, got {tuple(x.shape)}")
        _kind_of_reward(dense(x, name), name, reward)
    done = _flag(done, "done", reward)
    terminated = done if terminated is None else _flag(terminated, "terminated", reward)
    d, term = done.squeeze(-1), terminated.squeeze(-1)
    end = _one_trajectory_rows(d, term)
    T = d.shape[-1]
    mask = torch.arange(T, device=d.device) <= end[:, None]
    rows = torch.arange(d.shape[0], device=d.device)
    nxt = next_state_value.squeeze(-1)[rows, end]
    boot = torch.where(term[rows, end], torch.zeros_like(nxt), nxt)
    zero = torch.zeros((), dtype=reward.dtype, device=reward.device)
    return ValuelabBatch(torch.where(mask, reward.squeeze(-1), zero), torch.where(mask, state_value.squeeze(-1), zero),
                         mask, boot)
