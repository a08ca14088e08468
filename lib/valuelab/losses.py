"""The critic's loss and the masked statistics it needs.

Derived in :doc:`/chapters/06_value_loss`.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple, Optional

import torch

from ._engine.checks import (
    canonical_mask,
    check_count,
    check_dim,
    check_flag,
    check_like,
    check_mask,
    check_nonnegative_scalar,
    check_sequence_tensor,
    optional_like,
    require_finite,
    require_finite_result,
    scale_of,
    within_dtype,
)
from ._engine.dist import all_sum, check_group, global_sums
from ._engine.scan import as_batch

__all__ = ["masked_mean", "masked_var", "masked_whiten", "value_loss", "value_loss_stats", "ValueLossStats", "aggregate", "AGGREGATIONS"]

AGGREGATIONS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum")


def check_aggregation(aggregation: object) -> str:
    """``aggregation`` if it names one of :data:`AGGREGATIONS`; ValueError naming it otherwise (a list, None, a typo)."""
    if not isinstance(aggregation, str) or aggregation not in AGGREGATIONS:
        raise ValueError(f"aggregation must be one of {AGGREGATIONS}, got {aggregation!r:.80}")
    return aggregation


def _mask_for(x: torch.Tensor, mask: Optional[torch.Tensor]) -> torch.Tensor:
    return canonical_mask(check_mask(mask, x)).to(x.dtype)


def _wide(x: torch.Tensor) -> torch.Tensor:
    """``x`` in float64 (float16, bfloat16 and float32 statistics are taken there: their squares cannot overflow)."""
    return x if x.dtype == torch.float64 else x.double()


def _scale(x: torch.Tensor, m: torch.Tensor, dim: Optional[int]) -> torch.Tensor:
    """The power of two at the largest ``|x|`` among the valid entries (along ``dim``, kept), 1 where that is 0: the statistics' unit.

    Dividing by it first keeps every sum and square below the largest float
    (a mean of finite numbers is finite; so is a variance once scaled), and
    exactly (:func:`valuelab._engine.checks.scale_of`).
    """
    return scale_of(x, m, dim)


def _valid(x: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """``x`` where ``m`` is nonzero, 0 elsewhere: a masked entry never enters a sum, even as inf * 0 = NaN."""
    return torch.where(m != 0, x, torch.zeros((), dtype=x.dtype, device=x.device))


def _var_scaled(x: torch.Tensor, m: torch.Tensor, dim: Optional[int] = None, unbiased: bool = False):
    """``(v, s)``: the variance of the valid entries of ``x`` along ``dim`` (kept) is ``v * s**2``, with ``s`` a power of two (:func:`_scale`).

    ``v`` is taken on ``x / s`` (every entry below 2 in size), so it never
    overflows; the divisor is the count (``unbiased``: the count minus 1),
    at least 1.
    """
    s = _scale(x, m, dim)
    xs = _valid(x / s, m)
    keep = {} if dim is None else {"dim": dim, "keepdim": True}
    n = m.sum(**keep)
    mean = xs.sum(**keep) / n.clamp(min=1)
    mean = mean + _valid(xs - mean, m).sum(**keep) / n.clamp(min=1)  # corrected two-pass mean: equal entries have 0 spread
    centred = _valid(xs - mean, m)
    return (centred * centred).sum(**keep) / (n - 1 if unbiased else n).clamp(min=1), s


def _explained_variance(
    target: torch.Tensor, prediction: torch.Tensor, m: torch.Tensor, dim: Optional[int], no_spread: str, too_far: str
) -> torch.Tensor:
    r""":math:`1 - \mathrm{Var}(y - \hat y) / \mathrm{Var}(y)` over the valid entries (biased variances; along ``dim``, or all), float64.

    Both variances are taken on power-of-two scales (:func:`_var_scaled`),
    the residual on the common scale of ``y`` and :math:`\hat y`, so no
    finite input overflows on the way; only a ratio beyond the largest
    float is inf. ``ValueError(no_spread)`` where ``Var(y)`` is 0 (the
    statistic is not defined), ``ValueError(too_far)`` where the ratio
    overflows (the prediction's errors are more than 1e308 times the
    target's spread).
    """
    y, p, m = target.to(torch.float64), prediction.to(torch.float64), m.to(torch.float64)  # counts exact past 2**24
    s0 = torch.maximum(_scale(y, m, dim), _scale(p, m, dim))
    v_y, s_y = _var_scaled(y, m, dim)
    v_r, s_r = _var_scaled(_valid(y / s0 - p / s0, m), m, dim)
    if bool((v_y <= 0).any()):
        raise ValueError(no_spread)
    k = s_r * s0 / s_y  # a power of two
    ev = 1 - (v_r / v_y) * k * k
    return require_finite_result(ev if dim is None else ev.squeeze(dim), *too_far.split(": ", 1))


def masked_mean(
    x: torch.Tensor, mask: Optional[torch.Tensor] = None, dim: Optional[int] = None, *, group: Any = None
) -> torch.Tensor:
    r"""Mean of ``x`` over the entries where ``mask`` is 1: :math:`\sum_t m_t x_t / \sum_t m_t`.

    With ``dim=None`` the mean is over all valid entries of the batch (a
    scalar); otherwise along ``dim``. Where no entry is valid the mean is 0,
    never NaN. Taken in float64 on a scale of the largest valid entry, so the
    mean of finite entries is finite (``[3e38, 3e38]`` in float32 has mean
    3e38, not inf). Chapter 6.

    ``group``: a ``torch.distributed`` process group. The sum and the count
    are then all-reduced over its ranks, so every rank gets the mean of the
    whole data-parallel batch (``dim`` must be None); the gradient reaches
    this rank's entries only.

    Conventions: ``mask`` is 1/True on the tokens the policy generated
    (bool or real 0/1, ``x``'s shape); padding and holes never enter the
    sum nor the count. Nothing is detached: the mean carries ``x``'s
    gradient.

    Example::

        >>> import torch, valuelab as vl
        >>> x, mask = torch.tensor([1., 2., 99.]), torch.tensor([1, 1, 0])
        >>> vl.masked_mean(x, mask)  # the padding's 99 is not counted
        tensor(1.5000)
    """
    x = check_sequence_tensor(x, "x")
    m = _mask_for(x, mask)
    if dim is not None:
        dim = check_dim(dim, x.dim(), shape_of=f"x of shape {tuple(x.shape)}")
    if check_group(group) is not None:
        if dim is not None:
            raise ValueError("dim must be None with group (the mean over the whole distributed batch)")
        xw, mw = x.to(torch.float64), m.to(torch.float64)
        total, count = global_sums(group, _valid(xw, mw).sum(), mw.sum())  # one all-reduce
        out = (total / count.clamp(min=1)).to(x.dtype)
        return require_finite_result(out, "x", "the sum of its valid entries over the ranks overflows float64: rescale x")
    xw, mw = _wide(x), _wide(m)
    s = _scale(xw, mw, dim)
    if dim is None:  # mw: the weights 1/n of the valid entries, so that the scale multiplies a mean, never a sum
        xw, mw = _valid(xw, mw), mw / mw.sum().clamp(min=1)  # ([1e308, 1e308] has mean 1e308, not inf)
        out = s * ((xw / s) * mw).sum() / mw.sum().clamp(min=1)
    else:
        out = s.squeeze(dim) * (_valid(xw / s, mw).sum(dim) / mw.sum(dim).clamp(min=1))
    return out.to(x.dtype)


def masked_var(
    x: torch.Tensor, mask: Optional[torch.Tensor] = None, unbiased: bool = True, *, group: Any = None
) -> torch.Tensor:
    r"""Variance of the valid entries of ``x``: :math:`\sum_t m_t (x_t - \mu)^2 / (n - 1)` (``unbiased``) or :math:`/\,n`.

    The statistic :func:`valuelab.masked_whiten` divides by (chapter 6). verl and
    OpenRLHF differ here: verl's whitening uses the unbiased variance.
    Computed in float64; returned in ``x``'s dtype. ``group``: over the whole
    data-parallel batch, as in :func:`valuelab.masked_mean`.

    Conventions: ``mask`` is 1/True on the tokens the policy generated;
    padding and holes never enter the statistics. Nothing is detached.

    Raises:
        ValueError: fewer than two valid entries with ``unbiased`` (none without).

    Example::

        >>> import torch, valuelab as vl
        >>> x, mask = torch.tensor([1., 2., 99.]), torch.tensor([1, 1, 0])
        >>> vl.losses.masked_var(x, mask)  # unbiased, valid entries only
        tensor(0.5000)
    """
    x = check_sequence_tensor(x, "x")
    m = _mask_for(x, mask)
    if not isinstance(unbiased, bool):
        raise TypeError(f"unbiased must be a bool, got {type(unbiased).__name__}")
    if check_group(group) is not None:
        out = _moments(x, m, group, unbiased)[1].to(x.dtype)
    else:
        xw, mw = _wide(x), _wide(m)
        if mw.sum() < (2 if unbiased else 1):
            raise ValueError(f"mask must select at least {2 if unbiased else 1} entries for the {'un' if unbiased else ''}biased variance")
        v, s = _var_scaled(xw, mw, unbiased=unbiased)  # on x's scale: [1e308, 1e308] has variance 0, not NaN
        out = (v * s * s).to(x.dtype)
    return require_finite_result(out, "x", f"its variance exceeds the largest {x.dtype} (the spread is too large): rescale x")


def _moments(x: torch.Tensor, m: torch.Tensor, group: Any, unbiased: bool):
    """float64 mean and variance of the valid entries, over ``group``'s ranks when given (two all-reduces)."""
    xw, mw = x.to(torch.float64), m.to(torch.float64)
    total, count = global_sums(group, (xw * mw).sum(), mw.sum())
    if count < (2 if unbiased else 1):
        where = " over the ranks" if group is not None else ""
        raise ValueError(f"mask must select at least {2 if unbiased else 1} entries{where} for the {'un' if unbiased else ''}biased variance")
    mean = total / count
    centred = _valid(xw - mean, mw)
    (squares,) = global_sums(group, (centred * centred).sum())
    var = squares / (count - 1 if unbiased else count)
    require_finite_result(torch.stack([mean, var]), "x", "its mean or variance over the ranks overflows float64: rescale x")
    return mean, var


def masked_whiten(
    x: torch.Tensor,
    mask: Optional[torch.Tensor] = None,
    shift_mean: bool = True,
    eps: float = 1e-8,
    *,
    group: Any = None,
    unbiased: bool = True,
) -> torch.Tensor:
    r"""Normalise ``x`` with the mean and unbiased variance of its valid entries.

    :math:`(x - \mu)\,/\sqrt{\sigma^2 + \epsilon}` (``eps`` inside the square
    root), with :math:`\mu,\sigma^2` over valid entries only: padding never
    enters the statistics (chapter 6). With ``shift_mean=False`` the mean is
    added back. Masked entries of the result are 0.

    The statistics are taken in float64, on the scale :math:`s` of the
    largest valid :math:`|x|` (:math:`(x/s - \mu/s)/\sqrt{\sigma^2/s^2 + \epsilon/s^2}`
    is the same number and never overflows): float32 ``[3e38, -3e38, 0]``
    whitens to ``[1, -1, 0]``, not to zeros. When every valid entry is the
    same and ``eps = 0`` the variance is 0 and the result is 0 (the centred
    values), never NaN.

    ``group``: the mean and variance of the whole data-parallel batch
    (sums and counts all-reduced over the process group's ranks), as verl
    and OpenRLHF whiten; ``unbiased=False`` divides the variance by
    :math:`n` instead of :math:`n - 1`.

    Conventions: ``mask`` is 1/True on the tokens the policy generated;
    padding and holes never enter the statistics. Nothing is detached:
    whitening advantages that carry the critic's gradient (:func:`valuelab.gae`
    given the live critic's ``values``, the PPO trap) keeps that gradient;
    whiten detached advantages.

    Raises:
        ValueError: fewer than two valid entries (the unbiased variance is undefined).

    Example::

        >>> import torch, valuelab as vl
        >>> adv, mask = torch.tensor([1., 3., 99.]), torch.tensor([1, 1, 0])
        >>> vl.masked_whiten(adv, mask)  # mean 2, variance 2; padding: 0
        tensor([-0.7071,  0.7071,  0.0000])
    """
    x = check_sequence_tensor(x, "x")
    m = _mask_for(x, mask)
    shift_mean = check_flag(shift_mean, "shift_mean")
    eps = check_nonnegative_scalar(eps, "eps")
    if not isinstance(unbiased, bool):
        raise TypeError(f"unbiased must be a bool, got {type(unbiased).__name__}")
    if check_group(group) is not None:
        xw, mw = x.to(torch.float64), m.to(torch.float64)
        mean, var = _moments(x, m, group, unbiased)
        out = (xw - mean) * torch.rsqrt(var + eps) if float(var + eps) > 0 else (xw - mean)
        if not shift_mean:
            out = out + mean
        return (out * mw).to(x.dtype)
    out, mean = _whiten_everywhere(x, m, eps, unbiased, "mask")
    mw = _wide(m)
    if not shift_mean:
        out = out + mean
    return _valid(out, mw).to(x.dtype)


def _whiten_everywhere(x: torch.Tensor, m: torch.Tensor, eps: float, unbiased: bool, mask_name: str):
    r"""``((x - mu) / sqrt(sigma^2 + eps), mu)`` at *every* position, in float64, with :math:`\mu, \sigma^2` of the valid entries.

    Taken on the scale :math:`s` of the largest valid :math:`|x|`
    (:func:`_scale`), so no finite input overflows on the way; where
    :math:`\sigma^2 + \epsilon = 0` (every valid entry the same, ``eps`` 0)
    the result is the centred values, never NaN. A masked entry far from
    the valid ones may whiten to inf: :func:`masked_whiten` zeroes masked
    entries, :func:`valuelab.integrations.verl.whiten` refuses the overflow.
    Raises ValueError naming ``mask_name`` when too few entries are valid.
    """
    count = m.sum()
    if unbiased and count < 2:
        raise ValueError(f"{mask_name} must select at least two entries to whiten (unbiased variance)")
    if not unbiased and count < 1:
        raise ValueError(f"{mask_name} must select at least 1 entries for the biased variance")
    xw, mw = _wide(x), _wide(m)
    s = _scale(xw, mw, None)
    xs = xw / s
    mean = _valid(xs, mw).sum() / count
    mean = mean + _valid(xs - mean, mw).sum() / count  # corrected two-pass mean: exact for equal entries, so that a
    centred = _valid(xs - mean, mw)  # constant x whitens to 0, not to +-1 (its rounding noise divided by itself)
    if unbiased:
        var = (centred * centred).sum() / (count - 1)
    else:
        var = (centred * centred).sum() / count
    var = var + (math.sqrt(eps) / s) ** 2  # (sigma^2 + eps) / s^2
    var = torch.where(var > 0, var, torch.ones((), dtype=var.dtype, device=var.device))  # 0 only when centred is
    out = (xs - mean) * torch.rsqrt(var)
    return out, mean * s


def aggregate(per_token: torch.Tensor, mask: torch.Tensor, aggregation: str = "token-mean") -> torch.Tensor:
    r"""Reduce a per-token loss to a scalar over the valid tokens (chapter 6, :doc:`/chapters/06_value_loss`).

    ``"token-mean"``: :math:`\sum_{b,t} m\,x / \sum_{b,t} m` (every valid token
    weighs the same); ``"seq-mean-token-mean"``: the mean over each sequence's
    valid tokens, then over the non-empty sequences; ``"seq-mean-token-sum"``:
    the sum over each sequence, then the mean over the non-empty sequences.
    ``mask`` is a bool or real 0/1 tensor of ``per_token``'s shape (never
    broadcast; required). Masked entries may hold anything, NaN
    included; valid ones must be finite, and a result that overflows the
    dtype (a sum of ``[1e308, 1e308]``) is a ValueError naming ``per_token``.
    :func:`valuelab.value_loss` and :func:`valuelab.lab.ppo.policy_loss` use
    the same reduction on inputs they have checked.

    Conventions: ``mask`` is 1/True on the tokens the policy generated
    (padding and holes are 0), the mask the per-token loss was computed
    under; nothing is detached: the result carries ``per_token``'s gradient.

    Example::

        >>> import torch, valuelab as vl
        >>> x, m = torch.tensor([[1., 3.], [5., 0.]]), torch.tensor([[1, 1], [1, 0]])
        >>> vl.losses.aggregate(x, m, "seq-mean-token-mean")  # mean of 2 and 5
        tensor(3.5000)
    """
    check_aggregation(aggregation)
    x = check_sequence_tensor(per_token, "per_token", finite=False)
    m = canonical_mask(check_mask(mask, x, required=True)).to(x.dtype)
    require_finite(_valid(x, m), "per_token")
    out = _aggregate(x, m, aggregation)
    return require_finite_result(out, "per_token", f"its aggregate overflows {x.dtype}: rescale per_token")


def _aggregate(per_token: torch.Tensor, mask: torch.Tensor, aggregation: str) -> torch.Tensor:
    """:func:`aggregate` on checked inputs: ``mask`` a 0/1 tensor of ``per_token``'s dtype and shape."""
    x, m = as_batch(per_token), as_batch(mask)
    x = _valid(x, m)  # a masked entry (inf: inf * 0 = NaN) never reaches the sum, nor its gradient
    if aggregation == "token-mean":
        return (x * m).sum() / m.sum().clamp(min=1)
    per_seq = (x * m).sum(-1)
    if aggregation == "seq-mean-token-mean":
        per_seq = per_seq / m.sum(-1).clamp(min=1)
    nonempty = (m.sum(-1) > 0).to(x.dtype)  # an empty sequence has no token to average
    return (per_seq * nonempty).sum() / nonempty.sum().clamp(min=1)


def value_loss(
    values: torch.Tensor,
    returns: torch.Tensor,
    *,
    mask: Optional[torch.Tensor] = None,
    old_values: Optional[torch.Tensor] = None,
    clip_range: Optional[float] = None,
    aggregation: str = "token-mean",
    group: Any = None,
    global_count: Optional[float] = None,
) -> torch.Tensor:
    r"""Critic loss :math:`\tfrac12\,\overline{(V_\phi(s_t) - \hat G_t)^2}`, equation :eq:`eq-value-loss` of chapter 6.

    With ``clip_range`` :math:`c` it is PPO's clipped form :eq:`eq-value-clip`
    :math:`\tfrac12\max\big((V-\hat G)^2, (\mathrm{clip}(V, V_\text{old}-c, V_\text{old}+c)-\hat G)^2\big)`.

    Conventions: ``values[..., t]`` is :math:`V_\phi(s_t)`, the critic's value
    of the prefix *before* token :math:`t`, aligned with ``returns[..., t]``
    (the targets of :func:`valuelab.gae` or :func:`valuelab.td_targets`,
    built with the same alignment, the score as the reward of the last valid
    token, and ``bootstrap`` :math:`V(s_{T+1})`, 0 after EOS). Here
    ``values`` is the live critic's output and *should* carry the gradient;
    ``returns`` and ``old_values`` are detached by this function, so a
    target built from the live critic pushes no gradient through the
    target. The advantages are another matter: :func:`valuelab.gae` does not
    detach, so build them from detached values (the PPO trap).

    Args:
        values: :math:`V_\phi(s_t)` from the critic being trained (carries the gradient).
        returns: targets :math:`\hat G_t` (treated as constants: they are detached).
        mask: generated tokens; only they enter the mean.
        old_values: :math:`V_\text{old}(s_t)`, needed with ``clip_range``.
        clip_range: :math:`c \ge 0` or None for no clipping.
        aggregation: ``"token-mean"`` (every valid token of the batch weighs the
            same), ``"seq-mean-token-mean"`` (mean per sequence, then over
            sequences) or ``"seq-mean-token-sum"`` (sum per sequence, then mean).
        group: a ``torch.distributed`` process group when each rank holds a
            shard of the batch: the denominator (valid tokens, or non-empty
            sequences for the ``seq-mean`` modes) is all-reduced over its
            ranks, and the result is this rank's *term*: summed over the
            ranks it is the loss of the whole batch (data-parallel training
            averages gradients, so scale by the world size, as verl's
            ``dp_size`` factor does).
        global_count: that denominator, when the trainer has it already
            (verl passes the global token count of the mini-batch, which
            also covers gradient accumulation over micro-batches); overrides
            the all-reduce.

    Returns:
        A scalar tensor.

    Example::

        >>> import torch, valuelab as vl
        >>> v, ret = torch.tensor([1., 2.], requires_grad=True), torch.zeros(2)
        >>> vl.value_loss(v, ret)  # (1 + 4) / 2 tokens / 2
        tensor(1.2500, grad_fn=<MulBackward0>)
    """
    values = check_sequence_tensor(values, "values")
    returns = check_like(returns, "returns", values, "values").detach()
    m = _mask_for(values, mask)
    old_values = optional_like(old_values, "old_values", values, "values")
    check_aggregation(aggregation)
    # masked errors are zeroed before squaring: a huge masked return would
    # otherwise give 0 * inf = NaN in the gradient of the masked entry
    sq = _valid(values - returns, m) ** 2
    if clip_range is not None:
        c = check_nonnegative_scalar(clip_range, "clip_range")
        if old_values is None:
            raise ValueError("clip_range needs old_values (the critic's values when the targets were built)")
        old = old_values.detach()
        c = within_dtype(c, values.dtype)  # a clip range past the dtype's largest float clips nothing
        clipped = old + (values - old).clamp(-c, c)
        sq = torch.maximum(sq, _valid(clipped - returns, m) ** 2)
    if group is None and global_count is None:
        loss = 0.5 * _aggregate(sq, m, aggregation)
    else:
        loss = 0.5 * _shard_term(sq, m, aggregation, check_group(group), global_count)
    try:
        require_finite(loss, "loss")
    except ValueError:
        raise ValueError(
            f"values and returns are finite but differ too much for {values.dtype}: the squared error overflows; "
            "scale the returns (or use float64)"
        ) from None
    return loss


def _shard_term(sq: torch.Tensor, m: torch.Tensor, aggregation: str, group: Any, global_count: Optional[float]) -> torch.Tensor:
    """This shard's numerator over the global denominator (tokens, or non-empty sequences)."""
    x, mm = as_batch(sq), as_batch(m).to(sq.dtype)
    xm = _valid(x * mm, mm)
    if aggregation == "token-mean":
        num, local = xm.sum(), mm.sum()
        what = "this rank's count of valid tokens"
    else:
        per_seq = xm.sum(-1)
        if aggregation == "seq-mean-token-mean":
            per_seq = per_seq / mm.sum(-1).clamp(min=1)
        nonempty = (mm.sum(-1) > 0).to(sq.dtype)
        num, local = (per_seq * nonempty).sum(), nonempty.sum()
        what = "this rank's count of non-empty sequences"
    if global_count is not None:
        count = check_count(global_count, "global_count", at_least=float(local), what=what)
    else:
        count = float(all_sum(local.reshape(1), group)[0]) if group is not None else float(local)
    return num / max(count, 1.0)


class ValueLossStats(NamedTuple):
    """Output of :func:`valuelab.value_loss_stats`: the loss and what trainers log beside it."""

    loss: torch.Tensor
    """:func:`valuelab.value_loss` (this rank's term with ``group``)."""
    clip_fraction: torch.Tensor
    """Share of valid tokens whose clipped error exceeds the unclipped one (the clip binds; 0 without a clip)."""
    explained_variance: torch.Tensor
    """:math:`1 - \\mathrm{Var}(\\hat G - V)/\\mathrm{Var}(\\hat G)` over the valid tokens (biased variances)."""


def value_loss_stats(
    values: torch.Tensor,
    returns: torch.Tensor,
    *,
    mask: Optional[torch.Tensor] = None,
    old_values: Optional[torch.Tensor] = None,
    clip_range: Optional[float] = None,
    aggregation: str = "token-mean",
    group: Any = None,
    global_count: Optional[float] = None,
) -> ValueLossStats:
    r""":func:`value_loss` with the value clip fraction and the explained variance, each over the whole batch with ``group`` (chapter 6 (:doc:`/chapters/06_value_loss`)).

    Arguments as in :func:`value_loss`. The two statistics carry no gradient.

    Conventions: as in :func:`value_loss`: ``values[..., t]`` is
    :math:`V_\phi(s_t)`, the value of the prefix before token :math:`t`,
    aligned with ``returns[..., t]``; ``mask`` is 1/True on generated tokens;
    the loss carries the gradient of ``values``, ``returns`` and
    ``old_values`` are detached.

    Raises:
        ValueError: the returns have no spread over the valid tokens (the explained variance is undefined).

    Example::

        >>> import torch, valuelab as vl
        >>> v, ret = torch.tensor([0., 1.]), torch.tensor([0., 2.])
        >>> vl.value_loss_stats(v, ret)  # EV = 1 - Var(ret - v) / Var(ret)
        ValueLossStats(loss=tensor(0.2500), clip_fraction=tensor(0.), explained_variance=tensor(0.7500))
    """
    loss = value_loss(values, returns, mask=mask, old_values=old_values, clip_range=clip_range,
                      aggregation=aggregation, group=group, global_count=global_count)
    with torch.no_grad():
        m = _mask_for(values, mask)
        g = returns.detach().to(torch.float64)
        v = values.detach().to(torch.float64)
        if clip_range is None:
            fraction = torch.zeros((), dtype=values.dtype, device=values.device)
        else:
            old = old_values.detach().to(torch.float64)
            c = float(clip_range)
            binds = ((old + (v - old).clamp(-c, c) - g) ** 2 > (v - g) ** 2).to(torch.float64)
            fraction = masked_mean(binds, m, group=group).to(values.dtype)
        no_spread = "returns have no spread over the valid tokens: the explained variance is undefined"
        too_far = ("values: its errors are so much larger than the spread of the returns that the explained "
                   f"variance overflows {values.dtype}")
        if group is None:
            ev = _explained_variance(g, v, m, None, no_spread, too_far)
        else:
            total = masked_var(g, m, unbiased=False, group=group)
            if float(total) <= 0:
                raise ValueError(no_spread)
            ev = 1 - masked_var(_valid(g - v, m), m, unbiased=False, group=group) / total
        ev = require_finite_result(ev.to(values.dtype), *too_far.split(": ", 1))
    return ValueLossStats(loss, fraction, ev)
