"""Tests of value pretraining (VC-PPO), chapter 10_long_responses."""

from __future__ import annotations

import pytest
import torch

from valuelab.lab.critic import TabularCritic, TinyCritic, fit_critic, value_error
from valuelab.lab.pretrain import pretrain_value
from valuelab.lab.world import make_world, sample


@pytest.fixture(scope="module")
def world():
    # responses of up to 24 tokens, a KL reward on every token and the score on the last
    return make_world(vocab_size=5, max_len=24, eos_prob=0.05, beta=0.05, seed=3)


@pytest.fixture(scope="module")
def batches(world):
    gen = torch.Generator().manual_seed(0)
    return {"train": sample(world, 2048, gen, dtype=torch.float64), "eval": sample(world, 2048, gen, dtype=torch.float64)}


def bad_tabular(world):
    """A critic that says 5 everywhere, far from every exact value (they lie in [-2, 1])."""
    assert abs(world.values).max() < 2
    return TabularCritic(world, init=5.0).double()


def test_exact_pretraining_removes_most_of_a_bad_init(world, batches):
    critic = bad_tabular(world)
    before = value_error(critic, batches["eval"]).mse
    hist = pretrain_value(critic, batches["train"], optimizer="exact", eval_rollout=batches["eval"])
    after = value_error(critic, batches["eval"]).mse
    assert before > 10 and after < 0.05 * before
    assert hist.mse[0] == pytest.approx(before) and hist.mse[-1] == pytest.approx(after)
    assert hist.first_token_error[-1] < 0.05  # the state before token 0 is visited by every response


def test_adam_pretraining_of_a_network_reduces_the_error(world):
    gen = torch.Generator().manual_seed(2)
    train, held_out = sample(world, 256, gen), sample(world, 256, gen)
    critic = TinyCritic(world.vocab_size, world.max_len, hidden_size=16, seed=0)
    with torch.no_grad():
        critic.head.bias.fill_(3.0)  # a bad init: about 3 everywhere
    before = value_error(critic, held_out).mse
    pretrain_value(critic, train, refreshes=2, steps_per_refresh=25, lr=5e-2)
    after = value_error(critic, held_out).mse
    assert before > 5 and after < 0.1 * before


def test_fresh_batches_per_refresh(world, batches):
    gen = torch.Generator().manual_seed(1)
    critic = bad_tabular(world)
    seen = []
    hist = pretrain_value(
        critic, lambda k: seen.append(k) or sample(world, 512, gen, dtype=torch.float64),
        refreshes=3, optimizer="exact", eval_rollout=batches["eval"],
    )
    assert seen == [0, 1, 2] and len(hist.mse) == 4
    assert hist.mse[-1] < 0.05 * hist.mse[0]


def test_it_is_fit_critic_with_monte_carlo_targets(world, batches):
    a, b = bad_tabular(world), bad_tabular(world)
    h_pre = pretrain_value(a, batches["train"], refreshes=2, steps_per_refresh=5, lr=0.1)
    h_fit = fit_critic(b, batches["train"], target="mc", refreshes=2, steps_per_refresh=5, lr=0.1)
    assert torch.equal(a.table, b.table)
    assert h_pre.mse == h_fit.mse and h_pre.loss_end == h_fit.loss_end


def test_the_target_does_not_depend_on_the_initial_critic(world, batches):
    """Monte-Carlo targets ignore the critic: two different inits end at the same table on visited states."""
    a, b = TabularCritic(world, init=-3.0).double(), TabularCritic(world, init=4.0).double()
    for c in (a, b):
        pretrain_value(c, batches["train"], optimizer="exact")
    assert torch.allclose(a(batches["train"]), b(batches["train"]), atol=1e-12)
    assert not torch.allclose(a(batches["eval"]), b(batches["eval"]))  # states never visited keep their init


@pytest.mark.parametrize(
    "kwargs, exc, name",
    [
        (dict(critic="not a module"), TypeError, "critic"),
        (dict(data=[1, 2]), TypeError, "data"),
        (dict(refreshes=0), ValueError, "refreshes"),
        (dict(refreshes=1.5), TypeError, "refreshes"),
        (dict(refreshes=True), TypeError, "refreshes"),
        (dict(steps_per_refresh=0), ValueError, "steps_per_refresh"),
        (dict(lr=0.0), ValueError, "lr"),
        (dict(lr=-1e-3), ValueError, "lr"),
        (dict(lr=float("nan")), ValueError, "lr"),
        (dict(lr="big"), TypeError, "lr"),
        (dict(optimizer="rmsprop"), ValueError, "optimizer"),
        (dict(optimizer="exact", lr=1.5), ValueError, "lr"),
        (dict(gamma=1.5), ValueError, "gamma"),
        (dict(gamma=-0.1), ValueError, "gamma"),
        (dict(gamma="one"), TypeError, "gamma"),
        (dict(gamma=True), TypeError, "gamma"),
    ],
)
def test_arguments_are_validated(world, batches, kwargs, exc, name):
    args = dict(critic=TabularCritic(world).double(), data=batches["train"])
    args.update(kwargs)
    critic, data = args.pop("critic"), args.pop("data")
    with pytest.raises(exc, match=name):
        pretrain_value(critic, data, **args)


def test_a_target_argument_is_refused(world, batches):
    """Pretraining means Monte-Carlo targets: there is no way to ask for another one."""
    with pytest.raises(TypeError):
        pretrain_value(TabularCritic(world).double(), batches["train"], target="td0")
