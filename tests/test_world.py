"""Tests of the toy world of chapter 7 (``chapters/07_propagation``): exact DP values, sampling, rewards, arguments."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from valuelab import discounted_returns
from valuelab.lab.world import EOS, GOOD, Rollout, World, exact_q, make_world, sample


def bellman_rhs(world: World, t: int, c: int, k: int) -> float:
    """The right-hand side of the Bellman equation for one state, written as a plain loop."""
    total = 0.0
    for a in range(world.vocab_size):
        p = world.pi_old[c, a]
        if p == 0:
            continue
        kl = -world.beta * (math.log(p) - math.log(world.pi_ref[c, a]))
        k_after = k + (a == GOOD)
        if a == EOS or t == world.max_len - 1:
            cont = world.score_table[t + 1, k_after]
        else:
            cont = world.gamma * world.values[t + 1, a, k_after]
        total += p * (kl + cont)
    return total


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(vocab_size=4, max_len=6, eos_prob=0.2, beta=0.1, gamma=0.9, ref_shift=0.7),
        dict(vocab_size=5, max_len=5, eos_prob=0.0, beta=0.3, gamma=1.0, score_fn=lambda c, L: np.sqrt(c) - L / 10),
    ],
)
def test_dp_satisfies_bellman_equation_for_every_state(kwargs):
    w = make_world(seed=3, **kwargs)
    for t in range(w.max_len):
        for c in range(w.n_contexts):
            for k in range(t + 1):
                assert w.values[t, c, k] == pytest.approx(bellman_rhs(w, t, c, k), abs=1e-12)


def test_exact_q_averages_to_v_and_matches_advantages():
    w = make_world(vocab_size=5, max_len=10, eos_prob=0.15, beta=0.2, gamma=0.95, seed=1)
    t, c, k = np.meshgrid(np.arange(w.max_len), np.arange(w.n_contexts), np.arange(w.max_len + 1), indexing="ij")
    q = exact_q(w, t, c, k)
    np.testing.assert_allclose((w.pi_old[c] * q).sum(-1), w.values[t, c, k], atol=1e-12)

    r = sample(w, 256, 0, dtype=torch.float64)
    tt, cc, kk = (x.numpy() for x in w.decode_state(r.states))
    q_taken = np.take_along_axis(exact_q(w, tt, cc, kk), r.tokens.numpy()[..., None], -1)[..., 0]
    expected = np.where(r.mask.numpy(), q_taken - w.values[tt, cc, kk], 0.0)
    np.testing.assert_allclose(r.advantages_exact.numpy(), expected, atol=1e-12)


def test_reward_is_a_deterministic_function_of_state_and_action():
    w = make_world(vocab_size=5, max_len=12, eos_prob=0.1, beta=0.3, seed=2)
    r = sample(w, 128, 5, dtype=torch.float64)
    t, c, k = (x.numpy() for x in w.decode_state(r.states))
    a = r.tokens.numpy()
    final = (a == EOS) | (t == w.max_len - 1)
    expected = w.kl_reward[c, a] + np.where(final, w.score_table[t + 1, k + (a == GOOD)], 0.0)
    m = r.mask.numpy()
    np.testing.assert_allclose(r.rewards.numpy()[m], expected[m], atol=1e-12)
    assert (r.rewards.numpy()[~m] == 0).all()


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(max_len=64, eos_prob=0.05, beta=0.05),
        dict(max_len=32, eos_prob=0.1, beta=0.2, gamma=0.9, score_noise=0.5, score_fn=lambda c, L: c - 0.3 * L),
        dict(max_len=16, eos_prob=0.0, beta=0.0, score_fn=lambda c, L: 1.0 + c),
    ],
)
def test_exact_v0_agrees_with_monte_carlo_within_four_sigma(kwargs):
    w = make_world(seed=0, **kwargs)
    r = sample(w, 20000, 7, dtype=torch.float64)
    g0 = discounted_returns(r.rewards, mask=r.mask, gamma=w.gamma)[:, 0]
    stderr = float(g0.std()) / math.sqrt(len(g0))
    assert abs(float(g0.mean()) - w.v0) < 4 * stderr + 1e-12


def test_values_along_sampled_sequences_match_the_table_and_the_state_is_tracked():
    w = make_world(vocab_size=6, max_len=20, eos_prob=0.1, seed=4)
    r = sample(w, 300, 11, dtype=torch.float64)
    assert isinstance(r, Rollout)
    B, T = r.tokens.shape
    tokens, mask = r.tokens.numpy(), r.mask.numpy()
    t, c, k = (x.numpy() for x in w.decode_state(r.states))
    for b in range(B):
        n = int(r.lengths[b])
        assert mask[b, :n].all() and not mask[b, n:].any()
        assert tokens[b, n - 1] == EOS or n == w.max_len
        assert (tokens[b, : n - 1] != EOS).all()
        np.testing.assert_array_equal(t[b, :n], np.arange(n))
        np.testing.assert_array_equal(c[b, :n], np.r_[w.bos, tokens[b, : n - 1]])
        np.testing.assert_array_equal(k[b, :n], np.r_[0, np.cumsum(tokens[b, : n - 1] == GOOD)])
        np.testing.assert_allclose(r.values_exact[b, :n].numpy(), w.values[t[b, :n], c[b, :n], k[b, :n]])
        assert (r.values_exact[b, n:] == 0).all()
    np.testing.assert_allclose(r.values_exact[:, 0].numpy(), w.v0)
    assert T == int(r.lengths.max())


def test_eos_prob_zero_gives_fixed_length_and_the_score_sits_on_the_last_token():
    w = make_world(max_len=9, eos_prob=0.0, beta=0.0, seed=0)
    r = sample(w, 64, 0)
    assert r.tokens.shape == (64, 9) and bool(r.mask.all()) and bool((r.tokens != EOS).all())
    torch.testing.assert_close(r.rewards[:, -1], r.score)
    assert bool((r.rewards[:, :-1] == 0).all())


def test_sampling_is_deterministic_and_a_generator_advances():
    w = make_world(max_len=32, score_noise=0.3)
    a, b = sample(w, 64, 123), sample(w, 64, 123)
    for name in ("tokens", "mask", "rewards", "score", "values_exact", "states"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name
    gen = torch.Generator().manual_seed(123)
    first, second = sample(w, 64, gen), sample(w, 64, gen)
    assert torch.equal(first.tokens, a.tokens)
    assert not torch.equal(second.tokens[:, :8], first.tokens[:, :8])
    assert torch.equal(sample(w, 64, 123, dtype=torch.float64).tokens, a.tokens)


def test_rollout_to_moves_every_tensor():
    r = sample(make_world(max_len=8), 4, 0).to("meta")
    assert r.device.type == "meta" and r.values_exact.device.type == "meta" and r.gamma == 1.0


@pytest.mark.parametrize(
    "kwargs, error",
    [
        (dict(vocab_size=2), ValueError),
        (dict(vocab_size=4.0), TypeError),
        (dict(max_len=0), ValueError),
        (dict(eos_prob=1.0), ValueError),
        (dict(eos_prob=-0.1), ValueError),
        (dict(beta=-1.0), ValueError),
        (dict(beta=float("nan")), ValueError),
        (dict(gamma=1.5), ValueError),
        (dict(seed="a"), TypeError),
        (dict(score_fn=3), TypeError),
        (dict(score_fn=lambda c, L: c[0]), ValueError),
        (dict(score_fn=lambda c, L: c / (L - 1)), ValueError),  # inf at length 1
    ],
)
def test_bad_world_arguments_raise(kwargs, error):
    name = next(iter(kwargs))
    with pytest.raises(error, match=name):
        make_world(**kwargs)


def test_bad_sample_arguments_raise():
    w = make_world(max_len=8)
    with pytest.raises(TypeError, match="world"):
        sample("world", 4)
    with pytest.raises(ValueError, match="batch_size"):
        sample(w, 0)
    with pytest.raises(TypeError, match="generator"):
        sample(w, 4, "seed")
    with pytest.raises(TypeError, match="dtype"):
        sample(w, 4, 0, dtype=torch.long)
    with pytest.raises(ValueError, match="^t must"):
        exact_q(w, 8, 0, 0)
    with pytest.raises(TypeError, match="count"):
        exact_q(w, 0, 0, 0.5)


def test_dp_is_fast_for_long_responses():
    import time

    start = time.perf_counter()
    w = make_world(max_len=512, eos_prob=0.01)
    assert time.perf_counter() - start < 2.0
    assert np.isfinite(w.values).all() and w.values.shape == (512, 7, 514)
