r"""Per-step decay without a loop over tokens: blocked doubling over affine maps (derived in :doc:`/chapters/09_fast_gae`).

For :math:`y_t = x_t + d_t\,y_{t+1}`, :math:`y_T = 0` with a decay that changes
along time (per-step :math:`\gamma_t` or :math:`\lambda_t`), the recursion
composes the affine maps :math:`f_t(y) = x_t + d_t y`, and
:math:`(x_1, d_1)\circ(x_2, d_2) = (x_1 + d_1 x_2,\ d_1 d_2)` is associative,
so inside a block :math:`\log_2 C` Hillis--Steele doubling steps give every
token's map to the end of its block (:eq:`eq-fast-doubling`); the block
summaries satisfy the same recursion, solved recursively, and one
multiply-add puts the carries in. Only products of decays, never a division.

Entry point: :func:`valuelab._engine.fastscan.fast_backward_scan`.
"""

from __future__ import annotations

import torch

from .checks import traced

__all__ = ["BLOCK_STEP", "affine_scan"]

# Block length: log2(C) doubling steps per level.
BLOCK_STEP = 32


def _doubling(X: torch.Tensor, D: torch.Tensor, need_d: bool):
    """Compose each token's map with the following ones up to the end of its row (last axis).

    After the step with offset ``s`` the pair at ``t`` is the map of tokens
    ``t .. t+2s-1``: ``X[t] += D[t] * X[t+s]`` and ``D[t] *= D[t+s]`` (only
    products, never a division). Past the end of the row the identity map
    ``(0, 1)`` is used, i.e. the last ``s`` entries stay as they are. Returns
    ``X`` (the solution with zero beyond the row) and, when ``need_d``, ``D``
    (the product of ``d`` from ``t`` to the end of the row).
    """
    n = X.shape[-1]
    if traced(X, D):  # out= is not differentiable (reverse or forward mode)
        return _doubling_autograd(X, D)
    s = 1
    while s < n:
        k = n - s
        Xn = torch.empty_like(X)
        torch.addcmul(X[..., :k], D[..., :k], X[..., s:], out=Xn[..., :k])
        Xn[..., k:] = X[..., k:]
        if need_d or 2 * s < n:
            Dn = torch.empty_like(D)
            torch.mul(D[..., :k], D[..., s:], out=Dn[..., :k])
            Dn[..., k:] = D[..., k:]
            D = Dn
        X = Xn
        s *= 2
    return X, D


def _doubling_autograd(X: torch.Tensor, D: torch.Tensor):
    """:func:`_doubling` without ``out=`` (which autograd does not support); one extra copy per step."""
    n = X.shape[-1]
    s = 1
    while s < n:
        k = n - s
        X = torch.cat([torch.addcmul(X[..., :k], D[..., :k], X[..., s:]), X[..., k:]], dim=-1)
        D = torch.cat([D[..., :k] * D[..., s:], D[..., k:]], dim=-1)
        s *= 2
    return X, D


def affine_scan(x: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
    """:eq:`eq-fast-scan` with a per-step ``d``; both ``(B, T)`` contiguous, ``T >= 1``."""
    B, T = x.shape
    C = BLOCK_STEP
    if T <= C:
        return _doubling(x, d, need_d=False)[0]
    nb = -(-T // C)
    if nb * C != T:
        x = torch.nn.functional.pad(x, (0, nb * C - T))
        d = torch.nn.functional.pad(d, (0, nb * C - T))
    X, D = _doubling(x.reshape(B, nb, C), d.reshape(B, nb, C), need_d=True)
    # block summaries obey the same recursion: Y_k = X_k[0] + D_k[0] * Y_{k+1}
    Y = affine_scan(X[..., 0].contiguous(), D[..., 0].contiguous())
    carry = torch.nn.functional.pad(Y[:, 1:], (0, 1))
    X = X.addcmul(D, carry.unsqueeze(-1))  # y = X_local + (product to block end) * y at next block start
    y = X.view(B, nb * C)
    return y if nb * C == T else y[:, :T]

