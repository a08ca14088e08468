"""Tests of the critics and the refresh-then-fit loop of chapter 7 (``chapters/07_propagation``)."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from valuelab import value_loss
from valuelab.lab.critic import TabularCritic, TinyCritic, critic_targets, fit_critic, value_error
from valuelab.lab.world import make_world, sample

T = 8


@pytest.fixture(scope="module")
def terminal_world():
    """Fixed-length episodes of T tokens, no KL, a score 1 + count on the last token only."""
    return make_world(vocab_size=5, max_len=T, eos_prob=0.0, beta=0.0, score_fn=lambda c, L: 1.0 + c, seed=0)


@pytest.fixture(scope="module")
def terminal_batch(terminal_world):
    return sample(terminal_world, 4096, 0, dtype=torch.float64)


def refreshes_until_correct(world, batch, tol=0.1, refreshes=T + 3, **kwargs):
    """Fit a zero-initialised table exactly at every refresh; return the refresh at which V(s_0) becomes right."""
    critic = TabularCritic(world).double()
    history = fit_critic(critic, batch, optimizer="exact", refreshes=refreshes, **kwargs)
    first = next(k for k, e in enumerate(history.first_token_error) if e < tol)
    # before that refresh nothing has reached token 0; after it, the value at token 0 no longer moves
    assert all(v == 0.0 for v in history.first_token_value[:first])
    assert all(v == pytest.approx(history.first_token_value[first], abs=1e-12) for v in history.first_token_value[first:])
    return first


@pytest.mark.parametrize(
    "kwargs, expected",
    [
        (dict(target="mc"), 1),
        (dict(target="td0"), T),
        (dict(target="nstep", n=1), T),
        (dict(target="nstep", n=2), math.ceil(T / 2)),
        (dict(target="nstep", n=3), math.ceil(T / 3)),
        (dict(target="nstep", n=T), 1),
        (dict(target="gae", lam=0.0), T),
        (dict(target="gae", lam=1.0), 1),
    ],
)
def test_refreshes_needed_for_the_first_token_value(terminal_world, terminal_batch, kwargs, expected):
    assert terminal_world.v0 > 1.0  # far from the initial value 0, so "correct" is unambiguous
    assert refreshes_until_correct(terminal_world, terminal_batch, **kwargs) == expected


def test_count_also_holds_with_a_fresh_batch_per_refresh(terminal_world):
    gen = torch.Generator().manual_seed(1)
    critic = TabularCritic(terminal_world)
    h = fit_critic(critic, lambda k: sample(terminal_world, 4096, gen), target="nstep", n=3, optimizer="exact", refreshes=5)
    assert h.first_token_value[:3] == [0.0, 0.0, 0.0]
    assert all(e < 0.1 for e in h.first_token_error[3:])


def test_exact_fit_is_the_minimiser_of_the_value_loss(terminal_world, terminal_batch):
    critic = TabularCritic(terminal_world).double()
    targets = critic_targets(terminal_batch, critic(terminal_batch), "mc")
    critic.fit_exact_(terminal_batch, targets)
    loss = value_loss(critic(terminal_batch), targets, mask=terminal_batch.mask)
    loss.backward()
    assert critic.table.grad.abs().max() < 1e-12


@pytest.mark.parametrize("make_critic", [lambda w: TinyCritic(w.vocab_size, w.max_len, seed=0), lambda w: TabularCritic(w)])
def test_a_training_step_lowers_the_loss(make_critic):
    w = make_world(max_len=24, eos_prob=0.1, beta=0.1, seed=0)
    r = sample(w, 64, 0)
    critic = make_critic(w)
    with torch.no_grad():
        old = critic(r)
    targets = critic_targets(r, old, "gae", lam=0.9)
    opt = torch.optim.SGD(critic.parameters(), lr=1e-1)
    before = value_loss(critic(r), targets, mask=r.mask)
    opt.zero_grad()
    before.backward()
    opt.step()
    after = value_loss(critic(r), targets, mask=r.mask)
    assert after.item() < before.item()


def test_network_fit_is_deterministic_on_cpu_and_learns():
    w = make_world(max_len=16, eos_prob=0.1, beta=0.05, score_fn=lambda c, L: c / L + 0.5, seed=0)
    ev = sample(w, 128, 99)

    def run(seed):
        gen = torch.Generator().manual_seed(seed)
        critic = TinyCritic(w.vocab_size, w.max_len, hidden_size=16, seed=seed)
        h = fit_critic(critic, lambda k: sample(w, 64, gen), target="gae", lam=0.95, refreshes=6,
                       steps_per_refresh=5, lr=1e-2, eval_rollout=ev)
        return critic, h

    (c1, h1), (c2, h2), (_, h3) = run(0), run(0), run(1)
    assert h1 == h2
    for p1, p2 in zip(c1.parameters(), c2.parameters()):
        assert torch.equal(p1, p2)
    assert h1 != h3
    assert len(h1.mse) == len(h1.first_token_error) == 7 and len(h1.loss_start) == len(h1.loss_end) == 6
    assert h1.mse[-1] < h1.mse[0]
    assert value_error(c1, ev).mse == pytest.approx(h1.mse[-1])


def test_tiny_critic_reads_only_the_prefix():
    w = make_world(max_len=12, eos_prob=0.0, seed=0)
    r = sample(w, 2, 0)
    critic = TinyCritic(w.vocab_size, w.max_len, seed=0)
    tokens = r.tokens.clone()
    tokens[:, 5] = (tokens[:, 5] + 1) % w.vocab_size
    changed = dataclasses.replace(r, tokens=tokens)
    with torch.no_grad():
        v, v2 = critic(r), critic(changed)
    assert torch.equal(v[:, :6], v2[:, :6])  # V(s_t) for t <= 5 does not see token 5
    assert not torch.equal(v[:, 6:], v2[:, 6:])


def test_value_error_and_callback():
    w = make_world(max_len=10, seed=0)
    r = sample(w, 32, 0)
    critic = TabularCritic(w)
    err = value_error(critic, r)
    assert err.first_token == pytest.approx(abs(w.v0), rel=1e-6)
    assert err.per_position.shape == (r.tokens.shape[1],)
    seen = []
    fit_critic(critic, r, target="td0", refreshes=3, steps_per_refresh=2, callback=lambda k, c, h: seen.append((k, len(h.mse))))
    assert seen == [(1, 2), (2, 3), (3, 4)]


def test_critics_create_their_tensors_on_the_input_device():
    w = make_world(max_len=8, seed=0)
    r = sample(w, 4, 0).to("meta")  # a device with no data: any tensor made on the CPU would clash
    for critic in (TinyCritic(w.vocab_size, w.max_len, seed=0), TabularCritic(w)):
        assert critic.to("meta")(r).device.type == "meta"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_fit_runs_on_cuda():
    w = make_world(max_len=16, seed=0)
    gen = torch.Generator().manual_seed(0)
    critic = TinyCritic(w.vocab_size, w.max_len, seed=0).to("cuda")
    h = fit_critic(critic, lambda k: sample(w, 32, gen, device="cuda"), target="nstep", n=4, refreshes=2, steps_per_refresh=2)
    assert len(h.mse) == 3
    table = TabularCritic(w).to("cuda")
    fit_critic(table, sample(w, 32, 0, device="cuda"), target="td0", optimizer="exact", refreshes=2)


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(target="td1"), ValueError, "target"),
        (dict(target="nstep"), ValueError, "n must"),
        (dict(target="td0", n=3), ValueError, "n is only"),
        (dict(target="gae"), ValueError, "lam must"),
        (dict(target="mc", lam=0.9), ValueError, "lam is only"),
        (dict(target="nstep", n=0), ValueError, "n must"),
        (dict(target="gae", lam=1.5), ValueError, "lam"),
        (dict(refreshes=0), ValueError, "refreshes"),
        (dict(steps_per_refresh=1.5), TypeError, "steps_per_refresh"),
        (dict(lr=0.0), ValueError, "lr"),
        (dict(optimizer="lbfgs"), ValueError, "optimizer"),
        (dict(optimizer="exact"), ValueError, "exact"),
        (dict(progress="yes"), TypeError, "progress"),
        (dict(gamma=2.0), ValueError, "gamma"),
    ],
)
def test_bad_fit_arguments_raise(kwargs, error, match):
    w = make_world(max_len=8, seed=0)
    r = sample(w, 4, 0)
    with pytest.raises(error, match=match):
        fit_critic(TinyCritic(w.vocab_size, w.max_len, seed=0), r, **{"refreshes": 1, **kwargs})


def test_bad_data_and_critic_raise():
    w = make_world(max_len=8, seed=0)
    r = sample(w, 4, 0)
    with pytest.raises(TypeError, match="data"):
        fit_critic(TabularCritic(w), [r])
    with pytest.raises(TypeError, match="data"):
        fit_critic(TabularCritic(w), lambda k: "batch")
    with pytest.raises(TypeError, match="critic"):
        fit_critic(lambda r: r.values_exact, r)
    with pytest.raises(ValueError, match="critic is on"):
        fit_critic(TabularCritic(w).to("meta"), r)
    with pytest.raises(ValueError, match="exact"):
        fit_critic(TabularCritic(w), r, optimizer="exact", clip_range=0.2)
    with pytest.raises(TypeError, match="world"):
        TabularCritic("world")
    with pytest.raises(TypeError, match="rollout"):
        TinyCritic(5, 8)(r.tokens)


def test_partial_exact_fit_moves_a_fraction_of_the_way_and_leaves_unvisited_states():
    w = make_world(max_len=6, eos_prob=0.2, beta=0.1, seed=0)
    r = sample(w, 64, 0, dtype=torch.float64)
    critic = TabularCritic(w, init=0.5).double()
    targets = critic_targets(r, critic(r), "gae", lam=0.8)
    full = TabularCritic(w, init=0.5).double()
    full.fit_exact_(r, targets)  # step 1: the per-state mean of the targets
    critic.fit_exact_(r, targets, step=0.25)
    visited = torch.zeros(w.n_states, dtype=torch.bool)
    visited[r.states[r.mask]] = True
    torch.testing.assert_close(critic.table[visited], 0.75 * 0.5 + 0.25 * full.table[visited], rtol=0, atol=1e-12)
    assert bool((critic.table[~visited] == 0.5).all())
    for _ in range(3):  # fixed targets: the remaining gap shrinks by (1 - step) per call
        critic.fit_exact_(r, targets, step=0.25)
    gap = (critic.table - full.table)[visited]
    torch.testing.assert_close(gap, 0.75**4 * (0.5 - full.table[visited]), rtol=0, atol=1e-12)


def test_fit_critic_exact_uses_lr_as_the_step_and_defaults_to_the_exact_fit(terminal_world, terminal_batch):
    def manual(step, refreshes):
        critic = TabularCritic(terminal_world).double()
        for _ in range(refreshes):
            with torch.no_grad():
                targets = critic_targets(terminal_batch, critic(terminal_batch), "gae", lam=0.7)
            critic.fit_exact_(terminal_batch, targets, step=step)
        return critic.table

    for lr, step in ((None, 1.0), (1.0, 1.0), (0.3, 0.3)):
        critic = TabularCritic(terminal_world).double()
        fit_critic(critic, terminal_batch, target="gae", lam=0.7, optimizer="exact", lr=lr, refreshes=4)
        assert torch.equal(critic.table, manual(step, 4)), lr


@pytest.mark.parametrize("step", [0.0, 1.5, -0.1, float("nan")])
def test_bad_exact_step_raises(step):
    w = make_world(max_len=8, seed=0)
    r = sample(w, 4, 0)
    critic = TabularCritic(w)
    with pytest.raises(ValueError, match="step"):
        critic.fit_exact_(r, torch.zeros_like(r.rewards), step=step)
    with pytest.raises(ValueError, match="lr"):
        fit_critic(critic, r, optimizer="exact", lr=step, refreshes=1)
