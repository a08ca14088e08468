"""The two ways trainers treat a hole in a response's mask (chapter 11 (:doc:`/chapters/11_pitfalls`))."""

from __future__ import annotations

import torch

from .._engine.checks import check_mask, check_sequence_tensor

__all__ = ["HOLE_CONVENTIONS", "hole_convention", "carry_into_holes", "zero_holes"]

HOLE_CONVENTIONS = {
    "skip": "a masked position is skipped: the recursion jumps from the last valid token before it to the "
    "first valid token after it, with one factor of gamma (and gamma * lambda); its reward and value are "
    "never read (valuelab.gae; verl since PR 2337)",
    "zero": "a masked position is a token with reward 0 and value 0: the recursion runs through it, so "
    "a valid token before a hole bootstraps from V = 0 and its advantage decays across the hole "
    "(OpenRLHF's get_advantages_and_returns)",
}
"""The hole conventions, by name: ``"skip"`` (valuelab, verl) and ``"zero"`` (OpenRLHF)."""


def hole_convention(name: str) -> str:
    """What ``"skip"`` or ``"zero"`` means, in words (the dict ``valuelab.integrations.HOLE_CONVENTIONS``)."""
    if not isinstance(name, str):
        raise TypeError(f"name must be a str, one of {tuple(HOLE_CONVENTIONS)}, got {type(name).__name__}")
    if name not in HOLE_CONVENTIONS:
        raise ValueError(f"name must be one of {tuple(HOLE_CONVENTIONS)}, got {name!r}")
    return HOLE_CONVENTIONS[name]


def zero_holes(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``x`` with every masked entry set to 0: the input a "zero" trainer's recursion reads. ``mask`` is required."""
    x = check_sequence_tensor(x, "x")
    m = check_mask(mask, x, required=True)
    return torch.where(m, x, torch.zeros((), dtype=x.dtype, device=x.device))


def carry_into_holes(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Each masked entry takes the value of the next valid entry to its right (0 after the last one).

    What verl's loop leaves at masked positions: its running advantage is
    carried through a hole unchanged. Valid entries are returned as they are.
    """
    x = check_sequence_tensor(x, "x")
    m = check_mask(mask, x, required=True)
    T = x.shape[-1]
    pos = torch.arange(T, device=x.device).expand_as(x)
    sentinel = torch.full_like(pos, T)
    nxt = torch.where(m, pos, sentinel).flip(-1).cummin(-1).values.flip(-1)  # index of the next valid entry, T if none
    padded = torch.cat([torch.where(m, x, torch.zeros((), dtype=x.dtype, device=x.device)),
                        torch.zeros_like(x[..., :1])], dim=-1)
    return padded.gather(-1, nxt)
