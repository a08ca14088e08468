"""Docstring text shared by the estimators: each restates the conventions it depends on (issue 26), written once here."""

from __future__ import annotations

import textwrap
from typing import Callable, TypeVar

F = TypeVar("F", bound=Callable)

PADDED_CONVENTIONS = (
    "Conventions: ``values[..., t]`` is :math:`V(s_t)`, the value of the prefix *before* token :math:`t`; the "
    "reward-model score is the reward of the last valid token (:func:`valuelab.kl_shaped_rewards` puts it there, "
    ":func:`valuelab.last_token_onehot` finds the slot); ``bootstrap`` is :math:`V(s_{{T+1}})`, the value after each "
    "row's last valid token: a float for every row or a tensor of shape ``rewards.shape[:-1]`` (one per row), "
    "default 0 (after EOS; give it for a response cut at the length limit). Nothing is detached: the critic's live "
    "output (``requires_grad``) passed as ``values`` makes {carries} carry its gradient, the PPO trap; pass "
    "``values.detach()`` or values computed under ``torch.no_grad()``."
)


def padded_conventions(carries: str) -> Callable[[F], F]:
    """Fill the ``{conventions}`` line of the decorated function's docstring with :data:`PADDED_CONVENTIONS`.

    ``carries`` names what the function returns that would carry the
    critic's gradient ("the TD errors", "the advantages and the returns").
    """

    def fill(fn: F) -> F:
        text = textwrap.fill(PADDED_CONVENTIONS.format(carries=carries), 76, subsequent_indent="    ")
        if fn.__doc__ is None:  # python -OO strips docstrings
            return fn
        if fn.__doc__.count("{conventions}") != 1:
            raise ValueError(f"{fn.__qualname__}: its docstring needs one {{conventions}} line to fill")
        fn.__doc__ = fn.__doc__.replace("{conventions}", text)
        return fn

    return fill
