"""Per-token rewards of RLHF: a KL penalty on every token, the reward-model score on the last.

Derived in :doc:`/chapters/03_kl_rewards`. With the log-ratio
:math:`\\rho_t = \\log\\pi_\\text{old}(a_t|s_t) - \\log\\pi_\\text{ref}(a_t|s_t)` the
three classical estimators of :math:`\\mathrm{KL}(\\pi_\\text{old}\\|\\pi_\\text{ref})`
are (Schulman's "approximating KL" note):

* ``k1`` = :math:`\\rho` (unbiased, can be negative),
* ``k2`` = :math:`\\rho^2/2` (biased, low variance),
* ``k3`` = :math:`e^{-\\rho} - 1 + \\rho` (unbiased, never negative).
"""

from __future__ import annotations

from typing import Optional, Union

import torch

from ._engine.checks import canonical_mask, check_bootstrap, check_like, check_mask, check_nonnegative_scalar, check_sequence_tensor, require_finite
from ._engine.scan import as_batch

__all__ = ["kl_penalty", "kl_shaped_rewards", "last_token_onehot", "KL_ESTIMATORS"]

KL_ESTIMATORS = ("k1", "k2", "k3")


def kl_penalty(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, estimator: str = "k1") -> torch.Tensor:
    r"""Per-token estimate of :math:`\mathrm{KL}(\pi_\text{old}\|\pi_\text{ref})`, equation :eq:`eq-kl-estimators` of chapter 3.

    ``logprobs`` are :math:`\log\pi_\text{old}(a_t|s_t)` of the sampled tokens,
    ``ref_logprobs`` the reference model's log-probabilities of the same tokens.

    Conventions: position :math:`t` is token :math:`a_t`, drawn in state
    :math:`s_t` (the prefix before it), the alignment of ``values[..., t]``
    in the estimators; no mask is applied here (padding gets whatever its
    log-probabilities give: :func:`kl_shaped_rewards` zeroes it). Nothing is
    detached: log-probabilities with ``requires_grad`` give a penalty that
    carries their gradient; a reward is a constant, so pass the rollout's
    detached log-probabilities.

    Example::

        >>> import torch, valuelab as vl
        >>> logp, ref = torch.tensor([-1.0, -2.0]), torch.tensor([-1.5, -2.0])
        >>> vl.kl_penalty(logp, ref, "k1")  # log pi_old - log pi_ref
        tensor([0.5000, 0.0000])
    """
    logprobs = check_sequence_tensor(logprobs, "logprobs")
    ref_logprobs = check_like(ref_logprobs, "ref_logprobs", logprobs, "logprobs")
    if estimator not in KL_ESTIMATORS:
        raise ValueError(f"estimator must be one of {KL_ESTIMATORS}, got {estimator!r}")
    rho = logprobs - ref_logprobs
    if estimator == "k1":
        k = rho
    elif estimator == "k2":
        k = 0.5 * rho * rho
    else:
        k = torch.expm1(-rho) + rho
    _require_representable(k, estimator, logprobs.dtype)
    return k


def _require_representable(k: torch.Tensor, estimator: str, dtype: torch.dtype) -> None:
    """Finite log-probabilities whose KL estimate overflows (k3 once rho < -88 in float32) are an error, not an inf."""
    try:
        require_finite(k, "k")
    except ValueError:
        raise ValueError(
            f"logprobs - ref_logprobs is too large in magnitude for {estimator} in {dtype}: the estimate overflows "
            "(k3 = exp(-rho) - 1 + rho needs rho > -88 in float32); use k1, or float64"
        ) from None


def last_token_onehot(mask: torch.Tensor) -> torch.Tensor:
    """A bool tensor, True at the last valid entry of each row of ``mask`` (none for an empty row).

    The slot where the reward-model score belongs: the last *generated* token
    (EOS), never the first padding slot after it (chapter 3, "where the score
    goes"). ``mask`` has shape ``(T,)`` or ``(B, T)`` and is bool or real
    0/1, as everywhere in the package.

    Conventions: the mask may have holes (tool tokens); the slot is the last
    *valid* token, wherever the padding starts. The estimators read the
    score from that slot as the reward of the last valid token, and
    ``bootstrap``, :math:`V(s_{T+1})`, is the value after it (0 after EOS).

    Example::

        >>> import torch, valuelab as vl
        >>> mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
        >>> vl.last_token_onehot(mask)
        tensor([[False,  True, False],
                [False, False,  True]])
    """
    if not isinstance(mask, torch.Tensor):
        raise TypeError(f"mask must be a torch.Tensor, got {type(mask).__name__}")
    if mask.dim() not in (1, 2):
        raise ValueError(f"mask must have shape (T,) or (B, T), got {tuple(mask.shape)}")
    m = as_batch(canonical_mask(check_mask(mask, mask)))
    T = m.shape[-1]
    out = torch.zeros_like(m)
    if T == 0:
        return out.reshape(mask.shape)
    last = T - 1 - torch.flip(m, dims=[-1]).to(torch.int8).argmax(-1)
    out.scatter_(-1, last.unsqueeze(-1), m.any(-1, keepdim=True))
    return out.reshape(mask.shape)


def kl_shaped_rewards(
    logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor,
    score: Union[float, torch.Tensor],
    *,
    mask: Optional[torch.Tensor] = None,
    beta: float = 0.05,
    estimator: str = "k1",
) -> torch.Tensor:
    r"""Token rewards :math:`r_t = -\beta\,k(\rho_t) + [t = T]\, r_\text{RM}(x, y)`, equation :eq:`eq-kl-reward` of chapter 3.

    Conventions: the score is the reward of the last valid token
    (:func:`last_token_onehot`), the slot of EOS, never the first padding
    slot; it then reaches every earlier position through the recursion of
    :func:`valuelab.gae`, whose ``values[..., t]`` is :math:`V(s_t)`, the
    value of the prefix before token :math:`t`, and whose ``bootstrap``
    (:math:`V(s_{T+1})`, 0 after EOS) is the value after that slot. Nothing
    is detached: inputs with ``requires_grad`` give rewards that carry their
    gradient; rewards are constants of the PPO update, so build them from
    the rollout's detached log-probabilities.

    Args:
        logprobs: :math:`\log\pi_\text{old}(a_t|s_t)`, shape ``(T,)`` or ``(B, T)``.
        ref_logprobs: :math:`\log\pi_\text{ref}(a_t|s_t)`, same shape.
        score: reward-model score per sequence, shape ``logprobs.shape[:-1]``
            (a float is broadcast). It is added on the last valid token.
        mask: generated tokens; masked tokens get reward 0.
        beta: KL coefficient :math:`\beta \ge 0`.
        estimator: ``"k1"`` (the usual choice in the reward), ``"k2"`` or ``"k3"``.

    Returns:
        Rewards of ``logprobs``' shape, dtype and device. An all-masked row is
        all zeros (there is no token to carry its score).

    Example::

        >>> import torch, valuelab as vl
        >>> logp, ref = torch.tensor([-1., -1., 0.]), torch.tensor([-1.5, -1., 0.])
        >>> vl.kl_shaped_rewards(logp, ref, 1.0, mask=torch.tensor([1, 1, 0]), beta=0.1)
        tensor([-0.0500,  1.0000,  0.0000])
    """
    per_token = kl_penalty(logprobs, ref_logprobs, estimator)
    beta = check_nonnegative_scalar(beta, "beta")
    m = canonical_mask(check_mask(mask, logprobs))
    if score is None:  # check_bootstrap reads None as "no value after the end", 0; a missing score is not a score of 0
        raise TypeError("score must be a float or a tensor of shape logprobs.shape[:-1], got None")
    s = check_bootstrap(score, logprobs, "score")
    zero = torch.zeros((), dtype=logprobs.dtype, device=logprobs.device)
    rewards = torch.where(m, -beta * per_token, zero)
    last = last_token_onehot(m)
    out = rewards + torch.where(last, s.unsqueeze(-1), zero)
    try:
        require_finite(out, "rewards")
    except ValueError:
        raise ValueError(f"beta times the KL estimate overflows {logprobs.dtype}: lower beta or use float64") from None
    return out
