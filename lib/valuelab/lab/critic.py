"""Critics for the toy world and the refresh-then-fit loop that trains them (chapter 7 (:doc:`/chapters/07_propagation`)).

Training a critic in PPO alternates two things, and this module keeps them apart:

1. **refresh**: freeze the critic, :math:`V_{\\bar\\phi} \\leftarrow V_\\phi`, and
   build fixed targets :math:`\\hat G_t` for the batch from the rewards and
   the frozen values (Monte Carlo, TD(0), n-step or the GAE λ-return, with
   the functions of :mod:`valuelab.returns` and :mod:`valuelab.advantages`);
2. **fit**: take ``steps_per_refresh`` optimisation steps of
   :func:`valuelab.value_loss` toward those fixed targets.

Because the targets are computed once per refresh, freezing the critic is
the same as evaluating it once under ``torch.no_grad()`` before the steps
(no copy of the weights is needed). With the :class:`TabularCritic` and the
``"exact"`` optimiser each fit is the exact least-squares solution, so one
can count refreshes: with a reward only at the end of length-``T`` episodes
the value at token 0 needs ``T`` refreshes with TD(0), ``ceil(T/n)`` with
n-step returns and one with Monte Carlo (equation :eq:`eq-refresh-count`).
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field
from typing import Callable, List, Literal, NamedTuple, Optional, Union

import torch
from torch import nn
from tqdm import tqdm

from .._engine.checks import check_nonnegative_scalar, check_positive_int, check_seed, shown
from ..advantages import gae
from ..losses import masked_mean, value_loss
from ..returns import discounted_returns, nstep_returns, td_targets
from .world import Rollout, World

__all__ = [
    "TARGETS",
    "TabularCritic",
    "TinyCritic",
    "critic_targets",
    "CriticError",
    "value_error",
    "FitHistory",
    "fit_critic",
    "propagation_fraction",
]

Target = Literal["mc", "td0", "nstep", "gae"]
TARGETS = ("mc", "td0", "nstep", "gae")
OPTIMIZERS = ("adam", "sgd", "exact")


def _check_rollout(rollout: object, name: str = "rollout") -> Rollout:
    if not isinstance(rollout, Rollout):
        raise TypeError(f"{name} must be a Rollout (see valuelab.lab.world.sample), got {type(rollout).__name__}")
    return rollout


def _check_step(step: object, name: str = "step") -> float:
    step = check_nonnegative_scalar(step, name)
    if not 0.0 < step <= 1.0:
        raise ValueError(f"{name} must lie in (0, 1] for the exact fit, got {step}")
    return step


class TabularCritic(nn.Module):
    """One parameter per world state, :math:`V_\\phi(s) = \\phi_s` (chapter 7 (:doc:`/chapters/07_propagation`)).

    ``forward(rollout)`` returns the ``(B, T)`` values :math:`\\phi_{s_t}`, 0 at
    padding. :meth:`fit_exact_` is the exact minimiser of the token-mean value
    loss :eq:`eq-value-loss`: every visited state gets the mean of its targets.
    """

    def __init__(self, world: World, init: float = 0.0) -> None:
        super().__init__()
        if not isinstance(world, World):
            raise TypeError(f"world must be a World (see make_world), got {type(world).__name__}")
        if isinstance(init, bool) or not isinstance(init, numbers.Real) or init != init:
            raise TypeError(f"init must be a real number, got {shown(init)}")
        self.n_states = world.n_states
        self.table = nn.Parameter(torch.full((world.n_states,), float(init)))

    def forward(self, rollout: Rollout) -> torch.Tensor:
        """:math:`V_\\phi(s_t) = \\phi_{s_t}` for every token of the batch, equation :eq:`eq-tabular-critic` of chapter 7 (:doc:`/chapters/07_propagation`)."""
        rollout = _check_rollout(rollout)
        v = self.table[rollout.states].to(rollout.rewards.dtype)
        return torch.where(rollout.mask, v, torch.zeros((), dtype=v.dtype, device=v.device))

    @torch.no_grad()
    def fit_exact_(self, rollout: Rollout, targets: torch.Tensor, step: float = 1.0) -> None:
        """Move every visited state toward the mean of its targets, equation :eq:`eq-tabular-critic` of chapter 7 (:doc:`/chapters/07_propagation`).

        :math:`\\phi_s \\leftarrow (1-\\alpha)\\,\\phi_s + \\alpha\\,\\operatorname{mean}\\{\\hat G_t : s_t = s\\}`
        with :math:`\\alpha` = ``step`` in (0, 1]; unvisited states keep their value.
        ``step = 1`` (default) is the closed-form argmin of the token-mean loss
        :eq:`eq-value-loss` of chapter 6 over a table, used in chapter
        07_propagation to count refreshes; ``step < 1`` is a partial fit, a
        per-state running average over refreshes (chapter 8, :doc:`/chapters/08_bias_variance`).
        """
        rollout = _check_rollout(rollout)
        if not isinstance(targets, torch.Tensor) or targets.shape != rollout.mask.shape:
            raise ValueError(f"targets must be a tensor of shape {tuple(rollout.mask.shape)}")
        step = _check_step(step)
        states = rollout.states[rollout.mask]
        sums = torch.zeros(self.n_states, dtype=torch.float64, device=self.table.device)
        sums.index_add_(0, states, targets[rollout.mask].to(torch.float64))
        counts = torch.zeros_like(sums).index_add_(0, states, torch.ones_like(states, dtype=torch.float64))
        visited = counts > 0
        mean = sums[visited] / counts[visited]
        if step != 1.0:  # step = 1 sets the mean exactly (no rounding through the blend)
            mean = (1.0 - step) * self.table[visited].to(torch.float64) + step * mean
        self.table[visited] = mean.to(self.table.dtype)


class TinyCritic(nn.Module):
    """A small recurrent critic over the token prefix: embedding, GRU, linear value head (chapter 7 (:doc:`/chapters/07_propagation`)).

    The value at token :math:`t` reads only the prefix :math:`a_0..a_{t-1}`:
    the input at position :math:`t` is the previous token (BOS at
    :math:`t = 0`) and the normalised position :math:`t / L_{\\max}` (``max_len``),
    so the GRU state can hold the position and the count of GOOD tokens,
    which is all the exact value depends on. Every tensor it creates lives on
    the device of the input; move the module with ``.to(device)``.

    Args:
        vocab_size: the world's vocabulary size (BOS gets one extra embedding).
        max_len: the world's ``max_len`` (scales the position feature).
        embed_dim, hidden_size: sizes of the embedding and of the GRU state.
        seed: seeds the initial weights without touching the global RNG
            (None: use the global RNG, as ``nn.Module`` does); an int in
            ``[0, 2**63 - 1]``, as every seed of valuelab.
    """

    def __init__(
        self, vocab_size: int, max_len: int, *, embed_dim: int = 8, hidden_size: int = 32, seed: Optional[int] = None
    ) -> None:
        super().__init__()
        self.vocab_size = check_positive_int(vocab_size, "vocab_size")
        self.max_len = check_positive_int(max_len, "max_len")
        embed_dim = check_positive_int(embed_dim, "embed_dim")
        hidden_size = check_positive_int(hidden_size, "hidden_size")
        seed = check_seed(seed, none_ok=True)
        with torch.random.fork_rng(devices=[], enabled=seed is not None):
            if seed is not None:
                torch.manual_seed(seed)
            self.embed = nn.Embedding(self.vocab_size + 1, embed_dim)
            self.gru = nn.GRU(embed_dim + 1, hidden_size, batch_first=True)
            self.head = nn.Linear(hidden_size, 1)

    def forward(self, rollout: Rollout) -> torch.Tensor:
        """:math:`V_\\phi(s_t) = w^\\top h_t + b`, :math:`h_t = \\mathrm{GRU}(h_{t-1}, [e(a_{t-1}), t/L])`, chapter 7 (:doc:`/chapters/07_propagation`); 0 at padding."""
        rollout = _check_rollout(rollout)
        tokens, mask = rollout.tokens, rollout.mask
        B, T = tokens.shape
        bos = torch.full((B, 1), self.vocab_size, dtype=tokens.dtype, device=tokens.device)
        prev = torch.cat([bos, tokens[:, :-1]], dim=1)  # input at t is the token before t: no peeking
        x = self.embed(prev)
        pos = torch.arange(T, device=tokens.device, dtype=x.dtype) / self.max_len
        x = torch.cat([x, pos.expand(B, T).unsqueeze(-1)], dim=-1)
        h, _ = self.gru(x)
        v = self.head(h).squeeze(-1).to(rollout.rewards.dtype)
        return torch.where(mask, v, torch.zeros((), dtype=v.dtype, device=v.device))


def critic_targets(
    rollout: Rollout,
    old_values: torch.Tensor,
    target: Target,
    *,
    n: Optional[int] = None,
    lam: Optional[float] = None,
    gamma: Optional[float] = None,
) -> torch.Tensor:
    """Targets :math:`\\hat G_t` for the critic from the frozen values :math:`V_{\\bar\\phi}` (chapter 7 (:doc:`/chapters/07_propagation`)).

    ``"mc"``: :func:`valuelab.discounted_returns` :eq:`eq-mc-return`;
    ``"td0"``: :func:`valuelab.td_targets` :eq:`eq-td-target`;
    ``"nstep"``: :func:`valuelab.nstep_returns` with ``n`` :eq:`eq-nstep-return`;
    ``"gae"``: the λ-return of :func:`valuelab.gae` with ``lam`` :eq:`eq-lambda-return`.
    ``gamma`` defaults to the rollout's (the one its exact values use).
    """
    rollout = _check_rollout(rollout)
    if target not in TARGETS:
        raise ValueError(f"target must be one of {TARGETS}, got {target!r}")
    if target == "nstep" and n is None:
        raise ValueError("n must be given with target='nstep'")
    if target != "nstep" and n is not None:
        raise ValueError(f"n is only used with target='nstep', got target={target!r}")
    if target == "gae" and lam is None:
        raise ValueError("lam must be given with target='gae'")
    if target != "gae" and lam is not None:
        raise ValueError(f"lam is only used with target='gae', got target={target!r}")
    gamma = rollout.gamma if gamma is None else gamma
    r, m = rollout.rewards, rollout.mask
    old_values = old_values.detach()
    if target == "mc":
        return discounted_returns(r, mask=m, gamma=gamma)
    if target == "td0":
        return td_targets(r, old_values, mask=m, gamma=gamma)
    if target == "nstep":
        return nstep_returns(r, old_values, n, mask=m, gamma=gamma)
    return gae(r, old_values, mask=m, gamma=gamma, lam=lam).returns


class CriticError(NamedTuple):
    """Errors of a critic against the exact values, from :func:`value_error` (chapter 7 (:doc:`/chapters/07_propagation`))."""

    mse: float
    """Mean of :math:`(V_\\phi(s_t) - V^\\pi(s_t))^2` over the valid tokens of the batch."""
    first_token: float
    """Mean over the batch of :math:`|V_\\phi(s_0) - V^\\pi(s_0)|` (the state before token 0)."""
    per_position: torch.Tensor
    """(T,): mean squared error at each position over the responses that reach it."""


@torch.no_grad()
def value_error(critic: nn.Module, rollout: Rollout) -> CriticError:
    """Error of a critic against the exact :math:`V^\\pi` of the world, :math:`\\overline{(V_\\phi - V^\\pi)^2}` (chapter 7 (:doc:`/chapters/07_propagation`))."""
    rollout = _check_rollout(rollout)
    return _errors(critic(rollout), rollout)


def _errors(v: torch.Tensor, rollout: Rollout) -> CriticError:
    sq = (v - rollout.values_exact) ** 2
    first = (v[:, 0] - rollout.values_exact[:, 0]).abs().mean()
    return CriticError(
        mse=float(masked_mean(sq, rollout.mask)),
        first_token=float(first),
        per_position=masked_mean(sq, rollout.mask, dim=0),
    )


@dataclass
class FitHistory:
    """What :func:`fit_critic` records (chapter 7 (:doc:`/chapters/07_propagation`)).

    Lists indexed by ``k`` have ``refreshes + 1`` entries, entry ``k`` after
    ``k`` refreshes (entry 0: before training), ready for a plot against
    ``range(refreshes + 1)``. The losses have one entry per refresh.
    """

    mse: List[float] = field(default_factory=list)
    """Mean squared error to the exact values over valid tokens, after k refreshes."""
    first_token_error: List[float] = field(default_factory=list)
    """Mean :math:`|V_\\phi(s_0) - V^\\pi(s_0)|`, after k refreshes."""
    first_token_value: List[float] = field(default_factory=list)
    """Mean :math:`V_\\phi(s_0)`, after k refreshes."""
    loss_start: List[float] = field(default_factory=list)
    """Value loss against the refresh's targets before its first step (refreshes 1..R)."""
    loss_end: List[float] = field(default_factory=list)
    """Value loss against the refresh's targets after its last step (refreshes 1..R)."""

    def _record(self, critic: nn.Module, rollout: Rollout) -> None:
        with torch.no_grad():
            v = critic(rollout)
        err = _errors(v, rollout)
        self.mse.append(err.mse)
        self.first_token_error.append(err.first_token)
        self.first_token_value.append(float(v[:, 0].mean()))


def fit_critic(
    critic: nn.Module,
    data: Union[Rollout, Callable[[int], Rollout]],
    *,
    target: Target = "td0",
    n: Optional[int] = None,
    lam: Optional[float] = None,
    gamma: Optional[float] = None,
    refreshes: int = 10,
    steps_per_refresh: int = 10,
    lr: Optional[float] = None,
    optimizer: Literal["adam", "sgd", "exact"] = "adam",
    clip_range: Optional[float] = None,
    aggregation: str = "token-mean",
    max_grad_norm: Optional[float] = None,
    eval_rollout: Optional[Rollout] = None,
    callback: Optional[Callable[[int, nn.Module, FitHistory], None]] = None,
    progress: Optional[bool] = False,
) -> FitHistory:
    """Train a critic by refreshing frozen targets and fitting them, the loop of chapter 7 (:doc:`/chapters/07_propagation`).

    For ``k = 1..refreshes``: take the batch (``data`` itself, or ``data(k - 1)``
    for a fresh batch per refresh), freeze :math:`V_{\\bar\\phi} = V_\\phi` on it,
    build :math:`\\hat G_t` with :func:`critic_targets`, then minimise
    :func:`valuelab.value_loss` :eq:`eq-value-loss` toward those fixed targets
    with ``steps_per_refresh`` full-batch steps (``optimizer="exact"``: the
    closed-form fit of a :class:`TabularCritic`, or a move of a fraction ``lr``
    toward it, equation :eq:`eq-tabular-critic`; steps ignored). The optimiser
    state carries over refreshes, as in PPO.

    Args:
        critic: a module mapping a :class:`~valuelab.lab.world.Rollout` to ``(B, T)``
            values, on the rollouts' device.
        data: a fixed rollout, or a function of the refresh index returning one,
            e.g. ``lambda k: sample(world, 256, gen, device=device)`` with a shared
            ``gen = torch.Generator().manual_seed(0)``.
        target, n, lam, gamma: see :func:`critic_targets`.
        refreshes: number of target refreshes R.
        steps_per_refresh: optimisation steps per refresh.
        lr: learning rate of ``"adam"`` or ``"sgd"`` (default 1e-2); with
            ``"exact"``, the step :math:`\\alpha \\in (0, 1]` of
            :meth:`TabularCritic.fit_exact_` (default 1: the exact minimiser).
        clip_range, aggregation: passed to :func:`valuelab.value_loss`
            (the clip is around the frozen values).
        max_grad_norm: clip the gradient norm (None: no clipping).
        eval_rollout: where errors to the exact values are measured (default:
            the batch of each refresh).
        callback: called as ``callback(k, critic, history)`` after refresh k.
        progress: True shows a tqdm bar, False (default) hides it, None lets
            tqdm decide (shown on a terminal).

    Returns:
        A :class:`FitHistory`.
    """
    if not isinstance(critic, nn.Module):
        raise TypeError(f"critic must be a torch.nn.Module, got {type(critic).__name__}")
    if not isinstance(data, Rollout) and not callable(data):
        raise TypeError(f"data must be a Rollout or a callable k -> Rollout, got {type(data).__name__}")
    if eval_rollout is not None:
        _check_rollout(eval_rollout, "eval_rollout")
    refreshes = check_positive_int(refreshes, "refreshes")
    steps_per_refresh = check_positive_int(steps_per_refresh, "steps_per_refresh")
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {optimizer!r}")
    if callback is not None and not callable(callback):
        raise TypeError(f"callback must be callable or None, got {type(callback).__name__}")
    if progress is not None and not isinstance(progress, bool):
        raise TypeError(f"progress must be True, False or None, got {type(progress).__name__}")
    params = [p for p in critic.parameters() if p.requires_grad]
    if not params:
        raise ValueError("critic must have trainable parameters")
    if optimizer == "exact":
        if not hasattr(critic, "fit_exact_"):
            raise ValueError("optimizer='exact' needs a critic with a closed-form fit (TabularCritic)")
        if clip_range is not None or aggregation != "token-mean":
            raise ValueError("optimizer='exact' solves the unclipped token-mean loss: use clip_range=None, aggregation='token-mean'")
        opt = None
        step = 1.0 if lr is None else _check_step(lr, "lr")
    else:
        lr = 1e-2 if lr is None else check_nonnegative_scalar(lr, "lr")
        if lr == 0:
            raise ValueError("lr must be positive")
        opt = torch.optim.Adam(params, lr=lr) if optimizer == "adam" else torch.optim.SGD(params, lr=lr)
    if max_grad_norm is not None:
        max_grad_norm = check_nonnegative_scalar(max_grad_norm, "max_grad_norm")

    def get_batch(k: int) -> Rollout:
        batch = _check_rollout(data if isinstance(data, Rollout) else data(k), "data(k)")
        if batch.device != params[0].device:
            raise ValueError(f"critic is on {params[0].device} but the rollout is on {batch.device}: move one of them")
        return batch

    def loss_fn(batch: Rollout, targets: torch.Tensor, old: torch.Tensor) -> torch.Tensor:
        return value_loss(
            critic(batch), targets, mask=batch.mask, old_values=old, clip_range=clip_range, aggregation=aggregation
        )

    history = FitHistory()
    for k in tqdm(range(refreshes), disable=None if progress is None else not progress, desc=f"fit {target}"):
        batch = get_batch(k)
        if k == 0:
            history._record(critic, eval_rollout if eval_rollout is not None else batch)
        with torch.no_grad():
            old = critic(batch)  # the frozen critic V_phi-bar, evaluated once: the targets stay fixed
        targets = critic_targets(batch, old, target, n=n, lam=lam, gamma=gamma)
        with torch.no_grad():
            history.loss_start.append(float(loss_fn(batch, targets, old)))
        if opt is None:
            critic.fit_exact_(batch, targets, step)
        else:
            for _ in range(steps_per_refresh):
                loss = loss_fn(batch, targets, old)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                if max_grad_norm is not None:
                    nn.utils.clip_grad_norm_(params, max_grad_norm)
                opt.step()
        with torch.no_grad():
            history.loss_end.append(float(loss_fn(batch, targets, old)))
        history._record(critic, eval_rollout if eval_rollout is not None else batch)
        if callback is not None:
            callback(k + 1, critic, history)
    return history


def propagation_fraction(k: int, d: int, lam: float) -> float:
    """:math:`c_k(d) = \\Pr[\\mathrm{Bin}(d - 1, 1 - \\lambda) \\le k - 1]`, equation :eq:`eq-lambda-propagation` of chapter 7 (:doc:`/chapters/07_propagation`).

    The fraction of the value that :math:`k` refreshes of exact tabular fits
    to GAE(:math:`\\lambda`) targets carry to a token :math:`d` tokens from
    the end, from :math:`V_0 \\equiv 0`, when the only reward is the score on
    the last token. ``lam`` in [0, 1]; 0 for ``k = 0``.
    """
    if isinstance(k, bool) or not isinstance(k, numbers.Integral) or k < 0:
        raise ValueError(f"k must be an int >= 0, got {k!r}")
    d = check_positive_int(d, "d")
    lam = check_nonnegative_scalar(lam, "lam")
    if lam > 1:
        raise ValueError(f"lam must lie in [0, 1], got {lam}")
    return float(sum(math.comb(d - 1, j) * (1 - lam) ** j * lam ** (d - 1 - j) for j in range(min(int(k), d))))
