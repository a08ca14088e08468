"""Tests of the many-prompt world of chapter 12 (``valuelab.lab.policy``): exact evaluation, the soft optimum, sampling.

Every oracle is built independently of the code under test: Monte-Carlo
rollouts, enumeration of every response of a tiny world, or the Bellman
equation written as a plain loop over states and actions.
"""

from __future__ import annotations

import itertools
import math

import re

import numpy as np
import pytest
import torch

from valuelab import discounted_returns
from valuelab.lab.policy import (
    PolicyEvaluation,
    PromptBatch,
    PromptWorld,
    count_good,
    evaluate_policy,
    make_prompt_world,
    reward_model_start,
    sample_responses,
    soft_optimal,
)
from valuelab.lab.world import EOS, GOOD


def random_policy(world: PromptWorld, seed: int, lead: tuple = (), scale: float = 1.0) -> np.ndarray:
    """A random state-dependent policy: softmax of Gaussian logits, shape ``lead + state_shape + (V,)``."""
    rng = np.random.default_rng(seed)
    logits = scale * rng.standard_normal(lead + world.state_shape + (world.vocab_size,))
    e = np.exp(logits - logits.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def responses(world: PromptWorld):
    """Every response of the world: it ends at its first EOS or at max_len."""
    non_eos = [a for a in range(world.vocab_size) if a != EOS]
    for n in range(1, world.max_len + 1):
        for body in itertools.product(non_eos, repeat=n - 1):
            if n < world.max_len:
                yield body + (EOS,)
            else:
                for last in range(world.vocab_size):
                    yield body + (last,)


def walk(world: PromptWorld, p: int, y: tuple):
    """The states (t, c, k) a response passes through, k the true (unsaturated) GOOD count before token t."""
    c, k = world.bos, 0
    for t, a in enumerate(y):
        yield t, c, k, a
        c, k = a, k + (a == GOOD)


def brute_force(world: PromptWorld, probs: np.ndarray, score_fn, p: int):
    """J, score, KL and length of prompt p by enumerating every response (probs: one policy, unsaturated counts)."""
    g = world.gamma
    J = score = kl = length = total = 0.0
    for y in responses(world):
        prob, ret, klsum = 1.0, 0.0, 0.0
        for t, c, k, a in walk(world, p, y):
            pa = probs[p, t, c, k, a]
            prob *= pa
            log_ratio = math.log(pa) - math.log(world.pi_ref[p, c, a])
            ret += -world.beta * g**t * log_ratio
            klsum += g**t * log_ratio
        n = len(y)
        k_total = sum(a == GOOD for a in y)
        f = float(score_fn(np.float64(k_total), np.float64(n)))
        ret += g ** (n - 1) * f
        J += prob * ret
        score += prob * g ** (n - 1) * f
        kl += prob * klsum
        length += prob * n
        total += prob
    assert total == pytest.approx(1.0, abs=1e-12)
    return J, score, kl, length


def ref_probability(world: PromptWorld, p: int, y: tuple) -> float:
    prob = 1.0
    for _, c, _, a in walk(world, p, y):
        prob *= world.pi_ref[p, c, a]
    return prob


def decode(world: PromptWorld, flat: np.ndarray):
    """Flat index ``r * n_states + ((p * L + t) * C + c) * K + k`` to (r, p, t, c, k), written out by hand."""
    P, L, C, K = world.state_shape
    k = flat % K
    rest = flat // K
    c = rest % C
    rest = rest // C
    t = rest % L
    rest = rest // L
    p = rest % P
    r = rest // P
    return r, p, t, c, k


def small_score(k, L):
    """A score that is nonlinear in the count and depends on the length, so that both matter."""
    return np.sqrt(k) - 0.2 * L


# ---------------------------------------------------------------------------
# the world itself
# ---------------------------------------------------------------------------


def test_world_tables_follow_their_definition():
    w = make_prompt_world(n_prompts=4, vocab_size=5, max_len=7, eos_range=(0.1, 0.3), seed=3, score_fn=small_score)
    assert w.pi_ref.shape == (4, 6, 5) and w.state_shape == (4, 7, 6, 9) and w.max_count == 8
    np.testing.assert_allclose(w.pi_ref.sum(-1), 1.0, atol=1e-12)
    assert (w.pi_ref > 0).all()
    for p in range(4):
        eos = w.pi_ref[p, :, EOS]
        np.testing.assert_allclose(eos, eos[0], atol=0)  # one EOS probability per prompt, in every context
        assert 0.1 <= eos[0] <= 0.3
    for L in range(1, 8):
        for k in range(L + 1):
            assert w.score_table[L, k] == pytest.approx(np.sqrt(k) - 0.2 * L, abs=1e-12)
    ref = w.reference_policy()
    for p, t, c, k in itertools.product(range(4), range(7), range(6), range(9)):
        np.testing.assert_array_equal(ref[p, t, c, k], w.pi_ref[p, c])
    rm = reward_model_start(w)
    for t, k in itertools.product(range(7), range(9)):
        expected = w.score_table[max(t, 1), k]
        np.testing.assert_allclose(rm[:, t, :, k], expected)
    for p, t, c, k in [(0, 0, 5, 0), (3, 6, 2, 8), (1, 4, 0, 3)]:
        assert w.state_index(p, t, c, k) == np.ravel_multi_index((p, t, c, k), w.state_shape)


# ---------------------------------------------------------------------------
# evaluate_policy
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("gamma, seed", [(1.0, 0), (0.8, 1)])
def test_evaluate_policy_matches_monte_carlo_within_four_sigma(gamma, seed):
    w = make_prompt_world(n_prompts=3, vocab_size=3, max_len=6, eos_range=(0.1, 0.3), beta=0.2, gamma=gamma, seed=seed)
    probs = random_policy(w, seed=10 + seed)
    ev = evaluate_policy(w, probs)
    G = 20000
    batch = sample_responses(w, torch.as_tensor(probs)[None], G, [100 + seed], dtype=torch.float64)
    ro = batch.rollout
    if gamma == 1.0:
        returns = ro.rewards.sum(-1).numpy()
    else:
        returns = discounted_returns(ro.rewards, mask=ro.mask, gamma=gamma)[:, 0].numpy()
    prompt = batch.prompt.numpy()
    for p in range(w.n_prompts):
        x = returns[prompt == p]
        assert len(x) == G
        stderr = x.std(ddof=1) / math.sqrt(len(x))
        assert abs(x.mean() - ev.per_prompt[p]) < 4 * stderr, p
    # every prompt has G samples, so plain means over the batch estimate the prompt averages
    lengths = ro.lengths.numpy().astype(float)
    assert abs(lengths.mean() - ev.length) < 4 * lengths.std(ddof=1) / math.sqrt(len(lengths))
    # the score of a response sits on its last token, discounted by gamma^(L-1) like every reward
    score = ro.score.numpy() * gamma ** (lengths - 1)
    assert abs(score.mean() - ev.score) < 4 * score.std(ddof=1) / math.sqrt(len(score))
    assert abs(returns.mean() - ev.objective) < 4 * returns.std(ddof=1) / math.sqrt(len(returns))


def bellman_q(world: PromptWorld, probs: np.ndarray, values: np.ndarray, p: int, t: int, c: int, k: int, a: int) -> float:
    """Right-hand side of the Bellman equation for Q(s, a), one state and one action, as a plain loop body."""
    pa = probs[p, t, c, k, a]
    reward = -world.beta * (math.log(pa) - math.log(world.pi_ref[p, c, a]))
    k_after = min(k + (a == GOOD), world.max_count)
    if a == EOS or t == world.max_len - 1:
        return reward + world.score_table[t + 1, k_after]
    return reward + world.gamma * values[p, t + 1, a, k_after]


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(n_prompts=2, vocab_size=3, max_len=5, beta=0.3, gamma=0.9, score_fn=small_score),
        dict(n_prompts=3, vocab_size=4, max_len=6, beta=0.1, gamma=1.0, eos_range=(0.2, 0.4),
             score_fn=lambda k, L: count_good(k, L, scale=2.0), max_count=2),
    ],
)
def test_evaluate_policy_satisfies_bellman_equation_for_every_state(kwargs):
    w = make_prompt_world(seed=5, **kwargs)
    probs = random_policy(w, seed=6, scale=1.5)
    ev = evaluate_policy(w, probs)
    P, L, C, K = w.state_shape
    for p in range(P):
        for t in range(L):
            for c in range(C):
                for k in range(K):
                    v = 0.0
                    for a in range(w.vocab_size):
                        q = bellman_q(w, probs, ev.values, p, t, c, k, a)
                        assert ev.q[p, t, c, k, a] == pytest.approx(q, abs=1e-12)
                        v += probs[p, t, c, k, a] * q
                    assert ev.values[p, t, c, k] == pytest.approx(v, abs=1e-12)
    for p in range(P):
        assert ev.per_prompt[p] == ev.values[p, 0, w.bos, 0]
    assert ev.objective == pytest.approx(sum(ev.values[p, 0, w.bos, 0] for p in range(P)) / P, abs=1e-14)


@pytest.mark.parametrize("gamma", [1.0, 0.7])
def test_evaluate_policy_matches_enumeration_of_every_response(gamma):
    w = make_prompt_world(n_prompts=2, vocab_size=3, max_len=4, eos_range=(0.2, 0.4), beta=0.3, gamma=gamma,
                          score_fn=small_score, seed=2)
    stacked = random_policy(w, seed=4, lead=(2,), scale=1.5)  # two independent policies on a leading axis
    ev = evaluate_policy(w, torch.as_tensor(stacked))
    assert ev.values.shape == (2,) + w.state_shape and ev.per_prompt.shape == (2, 2) and ev.objective.shape == (2,)
    for i in range(2):
        per = [brute_force(w, stacked[i], small_score, p) for p in range(w.n_prompts)]
        for p in range(w.n_prompts):
            assert ev.per_prompt[i, p] == pytest.approx(per[p][0], abs=1e-12)
        J, score, kl, length = (np.mean([x[j] for x in per]) for j in range(4))
        assert ev.objective[i] == pytest.approx(J, abs=1e-12)
        assert ev.score[i] == pytest.approx(score, abs=1e-12)
        assert ev.kl[i] == pytest.approx(kl, abs=1e-12)
        assert ev.length[i] == pytest.approx(length, abs=1e-12)
        assert ev.objective[i] == pytest.approx(ev.score[i] - w.beta * ev.kl[i], abs=1e-12)


def test_reference_policy_has_zero_kl():
    w = make_prompt_world(n_prompts=3, vocab_size=4, max_len=7, seed=1)
    ev = evaluate_policy(w, w.reference_policy())
    assert ev.kl == pytest.approx(0.0, abs=1e-14)
    assert ev.objective == pytest.approx(ev.score, abs=1e-14)


def test_bad_evaluate_arguments_raise():
    w = make_prompt_world(n_prompts=2, vocab_size=3, max_len=4, seed=0)
    good = w.reference_policy()
    with pytest.raises(TypeError, match="world"):
        evaluate_policy("world", good)
    with pytest.raises(TypeError, match="probs"):
        evaluate_policy(w, good.tolist())
    with pytest.raises(ValueError, match="probs"):
        evaluate_policy(w, good[..., :2])
    with pytest.raises(ValueError, match="probs"):
        evaluate_policy(w, good * 0.5)
    bad = good.copy()
    bad[0, 0, 0, 0, 0] -= 0.5
    bad[0, 0, 0, 0, 1] += 0.5
    with pytest.raises(ValueError, match="probs"):
        evaluate_policy(w, bad)
    with pytest.raises(ValueError, match="beta"):
        soft_optimal(make_prompt_world(n_prompts=2, vocab_size=3, max_len=4, beta=0.0))


# ---------------------------------------------------------------------------
# soft_optimal
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("max_len, beta", [(3, 0.2), (4, 0.5)])
def test_soft_optimum_matches_brute_force(max_len, beta):
    w = make_prompt_world(n_prompts=2, vocab_size=3, max_len=max_len, eos_range=(0.2, 0.4), beta=beta,
                          score_fn=small_score, seed=7)
    opt = soft_optimal(w)
    for p in range(w.n_prompts):
        z = 0.0
        for y in responses(w):
            f = small_score(sum(a == GOOD for a in y), len(y))
            z += ref_probability(w, p, y) * math.exp(f / beta)
        assert opt.per_prompt[p] == pytest.approx(beta * math.log(z), abs=1e-12)
    assert opt.objective == pytest.approx(float(np.mean(opt.per_prompt)), abs=1e-14)


def test_soft_optimal_policy_is_the_tilted_sequence_distribution():
    """pi*(y | p) = pi_ref(y | p) exp(f(y) / beta) / Z_p, response by response."""
    w = make_prompt_world(n_prompts=2, vocab_size=3, max_len=4, eos_range=(0.1, 0.3), beta=0.3,
                          score_fn=small_score, seed=8)
    opt = soft_optimal(w)
    np.testing.assert_allclose(opt.policy.sum(-1), 1.0, atol=1e-12)
    for p in range(w.n_prompts):
        ys = list(responses(w))
        tilted = np.array([ref_probability(w, p, y) * math.exp(small_score(sum(a == GOOD for a in y), len(y)) / w.beta)
                           for y in ys])
        tilted /= tilted.sum()
        star = np.array([math.prod(opt.policy[p, t, c, k, a] for t, c, k, a in walk(w, p, y)) for y in ys])
        np.testing.assert_allclose(star, tilted, rtol=1e-10, atol=1e-14)


@pytest.mark.parametrize("gamma", [1.0, 0.85])
def test_soft_optimum_is_its_own_value_and_beats_random_policies(gamma):
    w = make_prompt_world(n_prompts=2, vocab_size=3, max_len=5, eos_range=(0.1, 0.3), beta=0.25, gamma=gamma,
                          score_fn=small_score, seed=9)
    opt = soft_optimal(w)
    own = evaluate_policy(w, opt.policy)
    assert float(own.objective) == pytest.approx(opt.objective, abs=1e-12)
    np.testing.assert_allclose(own.per_prompt, opt.per_prompt, atol=1e-12)
    # V* is the value of pi* at every state, not only at the start
    np.testing.assert_allclose(own.values, opt.values, atol=1e-12)
    policies = np.stack([random_policy(w, seed=s, scale=0.5 + 0.1 * s) for s in range(20)])
    J = evaluate_policy(w, policies).objective
    assert J.shape == (20,)
    assert (J < opt.objective - 1e-6).all(), opt.objective - J
    # a policy close to pi* is close to J* and still below it
    near = 0.99 * opt.policy + 0.01 * w.reference_policy()
    j_near = float(evaluate_policy(w, near).objective)
    assert opt.objective - 1e-3 < j_near < opt.objective


def test_random_policy_value_is_below_brute_force_optimum():
    """J(pi) <= J* with both sides by enumeration (no DP on either side)."""
    w = make_prompt_world(n_prompts=2, vocab_size=3, max_len=3, eos_range=(0.2, 0.4), beta=0.4,
                          score_fn=small_score, seed=11)
    for s in range(5):
        probs = random_policy(w, seed=s)
        for p in range(w.n_prompts):
            z = sum(ref_probability(w, p, y) * math.exp(small_score(sum(a == GOOD for a in y), len(y)) / w.beta)
                    for y in responses(w))
            assert brute_force(w, probs, small_score, p)[0] < w.beta * math.log(z)


# ---------------------------------------------------------------------------
# max_count
# ---------------------------------------------------------------------------


def lift(small: PromptWorld, big: PromptWorld, probs: np.ndarray) -> np.ndarray:
    """A policy of the saturated world as a policy of the full world: state (p, t, c, k) reads (p, t, c, min(k, s))."""
    out = np.zeros(big.state_shape + (big.vocab_size,))
    for k in range(big.n_counts):
        out[:, :, :, k] = probs[:, :, :, min(k, small.max_count)]
    return out


@pytest.mark.parametrize("scale", [2, 3])
def test_max_count_saturation_leaves_every_value_unchanged(scale):
    score = lambda k, L: count_good(k, L, scale=float(scale))  # noqa: E731
    kwargs = dict(n_prompts=3, vocab_size=3, max_len=7, eos_range=(0.05, 0.2), beta=0.1, score_fn=score, seed=4)
    small = make_prompt_world(max_count=scale, **kwargs)
    big = make_prompt_world(**kwargs)
    assert small.n_counts == scale + 1 and big.n_counts == 9
    np.testing.assert_array_equal(small.pi_ref, big.pi_ref)
    for probs_small, probs_big in [
        (small.reference_policy(), big.reference_policy()),
        (soft_optimal(small).policy, soft_optimal(big).policy),
    ]:
        a, b = evaluate_policy(small, probs_small), evaluate_policy(big, probs_big)
        np.testing.assert_allclose(a.per_prompt, b.per_prompt, atol=1e-12)
        for name in ("objective", "length", "score", "kl"):
            assert float(getattr(a, name)) == pytest.approx(float(getattr(b, name)), abs=1e-12), name
    assert soft_optimal(small).objective == pytest.approx(soft_optimal(big).objective, abs=1e-12)
    np.testing.assert_allclose(soft_optimal(small).per_prompt, soft_optimal(big).per_prompt, atol=1e-12)
    # a policy that reads the saturated count has the same value in both worlds
    probs = random_policy(small, seed=1)
    a, b = evaluate_policy(small, probs), evaluate_policy(big, lift(small, big, probs))
    np.testing.assert_allclose(a.per_prompt, b.per_prompt, atol=1e-12)
    assert float(a.length) == pytest.approx(float(b.length), abs=1e-12)


def test_max_count_that_changes_the_score_raises():
    with pytest.raises(ValueError, match="max_count"):
        make_prompt_world(n_prompts=2, vocab_size=3, max_len=6, max_count=2, score_fn=lambda k, L: k / L)
    with pytest.raises(ValueError, match="max_count"):  # count_good with scale 8 needs its counts up to 8
        make_prompt_world(n_prompts=2, vocab_size=3, max_len=10, max_count=7)
    with pytest.raises(ValueError, match="max_count"):
        make_prompt_world(n_prompts=2, vocab_size=3, max_len=6, max_count=8)
    # the cap sits where count_good stops paying: allowed
    assert make_prompt_world(n_prompts=2, vocab_size=3, max_len=10, max_count=8).n_counts == 9


@pytest.mark.parametrize(
    "kwargs, error",
    [
        (dict(n_prompts=0), ValueError),
        (dict(vocab_size=2), ValueError),
        (dict(max_len=0), ValueError),
        (dict(eos_range=(0.3, 0.1)), ValueError),
        (dict(eos_range=(0.0, 0.1)), ValueError),
        (dict(eos_range=0.1), TypeError),
        (dict(beta=-0.1), ValueError),
        (dict(gamma=1.5), ValueError),
        (dict(seed=1.5), TypeError),
        (dict(score_fn="f"), TypeError),
    ],
)
def test_bad_world_arguments_raise(kwargs, error):
    name = next(iter(kwargs))
    with pytest.raises(error, match=name):
        make_prompt_world(**kwargs)


# ---------------------------------------------------------------------------
# sample_responses
# ---------------------------------------------------------------------------


def test_rows_are_ordered_run_prompt_sample():
    w = make_prompt_world(n_prompts=3, vocab_size=3, max_len=6, seed=0)
    R, G = 2, 4
    probs = torch.as_tensor(random_policy(w, seed=1, lead=(R,)))
    batch = sample_responses(w, probs, G, [0, 1])
    assert isinstance(batch, PromptBatch)
    assert batch.rollout.tokens.shape[0] == R * w.n_prompts * G
    row = 0
    for r in range(R):
        for p in range(w.n_prompts):
            for _ in range(G):
                assert int(batch.run[row]) == r
                assert int(batch.prompt[row]) == p
                assert int(batch.group[row]) == r * w.n_prompts + p
                row += 1
    for name in ("run", "prompt", "group"):
        assert getattr(batch, name).dtype == torch.long


def test_run_draws_depend_only_on_its_generator():
    w = make_prompt_world(n_prompts=2, vocab_size=4, max_len=8, eos_range=(0.2, 0.5), seed=1)
    probs = torch.as_tensor(random_policy(w, seed=2, lead=(2,)))
    both = sample_responses(w, probs, 5, [torch.Generator().manual_seed(10), torch.Generator().manual_seed(11)])
    n = w.n_prompts * 5
    for r, seed in [(0, 10), (1, 11)]:
        alone = sample_responses(w, probs[r:r + 1], 5, [torch.Generator().manual_seed(seed)])
        T = alone.rollout.tokens.shape[1]
        rows = slice(r * n, (r + 1) * n)
        assert torch.equal(both.rollout.tokens[rows, :T], alone.rollout.tokens)
        assert not both.rollout.mask[rows, T:].any()
        assert torch.equal(both.rollout.lengths[rows], alone.rollout.lengths)
        torch.testing.assert_close(both.rollout.rewards[rows, :T], alone.rollout.rewards)
    # an int seed is the same as a generator seeded with it
    seeded = sample_responses(w, probs, 5, [10, 11])
    assert torch.equal(seeded.rollout.tokens, both.rollout.tokens)


def test_generator_state_after_a_batch_does_not_depend_on_the_other_runs():
    w = make_prompt_world(n_prompts=2, vocab_size=3, max_len=8, eos_range=(0.5, 0.6), seed=0)
    probs = torch.as_tensor(w.reference_policy())[None].repeat(2, 1, 1, 1, 1, 1)
    shared = [torch.Generator().manual_seed(0), torch.Generator().manual_seed(1)]
    alone = [torch.Generator().manual_seed(0)]
    n = w.n_prompts * 4
    for _ in range(3):  # consecutive batches from the same generators, as in train_ppo
        both = sample_responses(w, probs, 4, shared)
        one = sample_responses(w, probs[:1], 4, alone)
        T = one.rollout.tokens.shape[1]
        assert torch.equal(both.rollout.tokens[:n, :T], one.rollout.tokens)


@pytest.mark.parametrize("gamma", [1.0, 0.9])
def test_sampled_states_rewards_and_exact_quantities(gamma):
    score = lambda k, L: count_good(k, L, scale=3.0)  # noqa: E731
    w = make_prompt_world(n_prompts=3, vocab_size=4, max_len=7, eos_range=(0.1, 0.3), beta=0.3, gamma=gamma,
                          score_fn=score, max_count=3, seed=2)
    R, G = 2, 40
    probs_np = random_policy(w, seed=3, lead=(R,))
    ev = evaluate_policy(w, probs_np)
    batch = sample_responses(w, torch.as_tensor(probs_np), G, [5, 6], evaluation=ev, dtype=torch.float64)
    ro = batch.rollout
    tokens, mask, states = ro.tokens.numpy(), ro.mask.numpy(), ro.states.numpy()
    r_, p_, t_, c_, k_ = decode(w, states)
    B, T = tokens.shape
    assert T == int(ro.lengths.max())
    for b in range(B):
        r, p = int(batch.run[b]), int(batch.prompt[b])
        n = int(ro.lengths[b])
        assert mask[b, :n].all() and not mask[b, n:].any()
        assert (tokens[b, : n - 1] != EOS).all() and (tokens[b, n - 1] == EOS or n == w.max_len)
        assert (tokens[b, n:] == EOS).all() and (ro.rewards[b, n:] == 0).all()
        c, k = w.bos, 0
        expected_rewards = []
        for t in range(n):
            a = int(tokens[b, t])
            ks = min(k, w.max_count)
            assert (r_[b, t], p_[b, t], t_[b, t], c_[b, t], k_[b, t]) == (r, p, t, c, ks)
            pa = probs_np[r, p, t, c, ks, a]
            assert ro.logprobs[b, t].item() == pytest.approx(math.log(pa), abs=1e-12)
            assert ro.ref_logprobs[b, t].item() == pytest.approx(math.log(w.pi_ref[p, c, a]), abs=1e-12)
            expected_rewards.append(-w.beta * (math.log(pa) - math.log(w.pi_ref[p, c, a])))
            assert ro.values_exact[b, t].item() == pytest.approx(ev.values[r, p, t, c, ks], abs=1e-12)
            adv = ev.q[r, p, t, c, ks, a] - ev.values[r, p, t, c, ks]
            assert ro.advantages_exact[b, t].item() == pytest.approx(adv, abs=1e-12)
            c, k = a, k + (a == GOOD)
        f = float(score(np.float64(k), np.float64(n)))
        assert ro.score[b].item() == pytest.approx(f, abs=1e-12)
        expected_rewards[-1] += f
        np.testing.assert_allclose(ro.rewards[b, :n].numpy(), expected_rewards, atol=1e-12)
    # the exact advantages, decoded straight from the flat index of each valid token
    flat_q = ev.q.reshape(-1, w.vocab_size)
    flat_v = ev.values.reshape(-1)
    idx = r_ * w.n_states + ((p_ * w.max_len + t_) * w.n_contexts + c_) * w.n_counts + k_
    np.testing.assert_array_equal(idx, states)
    expected = np.where(mask, flat_q[states, tokens] - flat_v[states], 0.0)
    np.testing.assert_allclose(ro.advantages_exact.numpy(), expected, atol=1e-12)
    assert ro.gamma == gamma


def test_without_evaluation_the_exact_fields_are_zero():
    w = make_prompt_world(n_prompts=2, vocab_size=3, max_len=5, seed=0)
    batch = sample_responses(w, torch.as_tensor(w.reference_policy())[None], 8, [0])
    assert (batch.rollout.values_exact == 0).all() and (batch.rollout.advantages_exact == 0).all()
    assert batch.rollout.rewards.dtype == torch.float32


def test_tokens_with_zero_probability_are_never_drawn():
    w = make_prompt_world(n_prompts=3, vocab_size=4, max_len=6, eos_range=(0.1, 0.3), seed=3)
    probs = random_policy(w, seed=4)
    last = w.vocab_size - 1
    probs[0, ..., GOOD] = 0.0  # prompt 0 never says GOOD
    probs[1, ..., last] = 0.0  # prompt 1 never says the last token (the top of the cdf)
    probs[2, : w.max_len - 1, ..., EOS] = 0.0  # prompt 2 never stops early (the bottom of the cdf)
    probs[2, :, :, :, 2] = 0.0  # ... nor says token 2 (the middle)
    probs /= probs.sum(-1, keepdims=True)
    batch = sample_responses(w, torch.as_tensor(probs)[None], 3000, [7])
    ro = batch.rollout
    tokens, mask, prompt = ro.tokens.numpy(), ro.mask.numpy(), batch.prompt.numpy()
    valid = lambda p: tokens[(prompt == p)[:, None] & mask]  # noqa: E731
    assert (valid(0) != GOOD).all() and (valid(0) == EOS).any()
    assert (valid(1) != last).all()
    assert (valid(2) != 2).all()
    assert (ro.lengths.numpy()[prompt == 2] == w.max_len).all()
    assert np.isfinite(ro.logprobs.numpy()).all()
    # and the tokens that remain are drawn: every allowed token of prompt 1 occurs
    assert set(np.unique(valid(1))) == {EOS, GOOD, 2}


def test_bad_sample_arguments_raise():
    w = make_prompt_world(n_prompts=2, vocab_size=3, max_len=5, seed=0)
    probs = torch.as_tensor(w.reference_policy())[None]
    ev = evaluate_policy(w, probs)
    with pytest.raises(TypeError, match="world"):
        sample_responses("world", probs, 4, [0])
    with pytest.raises(TypeError, match="probs"):
        sample_responses(w, probs.numpy(), 4, [0])
    with pytest.raises(ValueError, match="probs"):
        sample_responses(w, probs[0], 4, [0])  # no run axis
    with pytest.raises(ValueError, match="probs"):
        sample_responses(w, probs[..., :2], 4, [0])
    bad = probs.clone()
    bad[0, 0, 0, 0, 0, 0] -= 0.5
    bad[0, 0, 0, 0, 0, 1] += 0.5
    with pytest.raises(ValueError, match="probs"):
        sample_responses(w, bad, 4, [0])
    nan = probs.clone()
    nan[0, 0, 0, 0, 0, 0] = float("nan")
    with pytest.raises(ValueError, match="probs"):
        sample_responses(w, nan, 4, [0])
    with pytest.raises(ValueError, match="generators"):
        sample_responses(w, probs, 4, [0, 1])
    with pytest.raises(ValueError, match="generators"):
        sample_responses(w, probs.repeat(2, 1, 1, 1, 1, 1), 4, [0])
    with pytest.raises(ValueError, match="generators"):
        sample_responses(w, probs, 4, 0)
    with pytest.raises(TypeError, match="generator"):
        sample_responses(w, probs, 4, ["seed"])
    with pytest.raises(ValueError, match="samples_per_prompt"):
        sample_responses(w, probs, 0, [0])
    with pytest.raises(ValueError, match="evaluation"):
        sample_responses(w, probs.repeat(2, 1, 1, 1, 1, 1), 4, [0, 1], evaluation=ev)
    with pytest.raises(ValueError, match="evaluation"):
        sample_responses(w, probs, 4, [0], evaluation=tuple(ev))
    with pytest.raises(TypeError, match="dtype"):
        sample_responses(w, probs, 4, [0], dtype=torch.long)
    assert isinstance(ev, PolicyEvaluation)


# ---------------------------------------------------------------------------
# every refusal names its argument: the whole message (a check that names the wrong argument is a slip too)
# ---------------------------------------------------------------------------

_W = make_prompt_world(n_prompts=2, vocab_size=3, max_len=5, seed=0)
_GOOD = _W.reference_policy()
_PROBS = torch.as_tensor(_GOOD)[None]
_EV = evaluate_policy(_W, _PROBS)


def _moved(x, value):
    """``x`` with its first probability set to ``value`` and the second one balancing it (the row still sums to 1)."""
    y = x.copy() if isinstance(x, np.ndarray) else x.clone()
    first = (0,) * (x.ndim - 1)
    old = float(y[first + (0,)])
    y[first + (0,)] = value
    if value == value:
        y[first + (1,)] += old - value
    return y


_NOT_A_WORLD = "world must be a PromptWorld (see make_prompt_world), got str"
_SHAPE = "probs must have shape (..., 2, 5, 4, 7, 3), got "
_RUN_SHAPE = "probs must have shape (R, 2, 5, 4, 7, 3), got "
_NOT_PROBS = "probs must hold finite, non-negative probabilities"
_SUM = "probs must sum to 1 over its last axis (the next token)"
_GENS = "generators must be a list of 1 generators or seeds, one per run"

REFUSALS = [
    (lambda: evaluate_policy("world", _GOOD), TypeError, _NOT_A_WORLD),
    (lambda: evaluate_policy(_W, _GOOD.tolist()), TypeError, "probs must be a numpy array or a torch tensor, got list"),
    (lambda: evaluate_policy(_W, _GOOD.astype(np.int64)), TypeError, "probs must hold floats, got int64"),
    (lambda: evaluate_policy(_W, _GOOD[..., :2]), ValueError, _SHAPE + "(2, 5, 4, 7, 2)"),
    (lambda: evaluate_policy(_W, _GOOD[0]), ValueError, _SHAPE + "(5, 4, 7, 3)"),
    (lambda: evaluate_policy(_W, _GOOD * 0.5), ValueError, _SUM),
    (lambda: evaluate_policy(_W, _moved(_GOOD, -0.1)), ValueError, _NOT_PROBS),
    (lambda: evaluate_policy(_W, _moved(_GOOD, float("nan"))), ValueError, _NOT_PROBS),
    (lambda: evaluate_policy(_W, _moved(_GOOD, float("inf"))), ValueError, _NOT_PROBS),
    (lambda: soft_optimal(make_prompt_world(n_prompts=2, vocab_size=3, max_len=4, beta=0.0)), ValueError,
     "world.beta must be positive for the soft optimum (beta = 0 has no KL term to soften the max)"),
    (lambda: soft_optimal("w"), TypeError, _NOT_A_WORLD),
    (lambda: reward_model_start("w"), TypeError, _NOT_A_WORLD),
    (lambda: make_prompt_world(n_prompts=0), ValueError, "n_prompts must be a positive int, got 0"),
    (lambda: make_prompt_world(n_prompts=1.5), TypeError, "n_prompts must be a positive int, got float"),
    (lambda: make_prompt_world(vocab_size=2), ValueError, "vocab_size must be at least 3 (EOS, GOOD and one more), got 2"),
    (lambda: make_prompt_world(vocab_size=0), ValueError, "vocab_size must be a positive int, got 0"),
    (lambda: make_prompt_world(max_len=0), ValueError, "max_len must be a positive int, got 0"),
    (lambda: make_prompt_world(eos_range=(0.3, 0.1)), ValueError, "eos_range must satisfy 0 < low <= high < 1, got (0.3, 0.1)"),
    (lambda: make_prompt_world(eos_range=(0.0, 0.1)), ValueError, "eos_range must satisfy 0 < low <= high < 1, got (0.0, 0.1)"),
    (lambda: make_prompt_world(eos_range=(-0.1, 0.1)), ValueError, "eos_range[0] must be non-negative, got -0.1"),
    (lambda: make_prompt_world(eos_range=(0.1, 1.0)), ValueError, "eos_range[1] must lie in [0, 1), got 1.0"),
    (lambda: make_prompt_world(eos_range=0.1), TypeError, "eos_range must be a pair (low, high)"),
    (lambda: make_prompt_world(eos_range=(0.1, 0.2, 0.3)), TypeError, "eos_range must be a pair (low, high)"),
    (lambda: make_prompt_world(beta=-0.1), ValueError, "beta must be non-negative, got -0.1"),
    (lambda: make_prompt_world(gamma=1.5), ValueError, "gamma must lie in [0, 1], got 1.5"),
    (lambda: make_prompt_world(logit_scale=-1.0), ValueError, "logit_scale must be non-negative, got -1.0"),
    (lambda: make_prompt_world(logit_scale=1000.0), ValueError, "logit_scale is too large: a reference probability underflows to 0"),
    (lambda: make_prompt_world(seed=1.5), TypeError, "seed must be an int, got float"),
    (lambda: make_prompt_world(score_fn="f"), TypeError, "score_fn must be callable (count, length) -> score, got str"),
    (lambda: make_prompt_world(max_len=6, max_count=8), ValueError, "max_count must be at most max_len + 1 = 7, got 8"),
    (lambda: make_prompt_world(max_len=6, max_count=0), ValueError, "max_count must be a positive int, got 0"),
    (lambda: make_prompt_world(n_prompts=2, vocab_size=3, max_len=6, max_count=2, score_fn=lambda k, L: k / L), ValueError,
     "max_count = 2 changes the score: score_fn must depend on k only through min(k, max_count)"),
    (lambda: sample_responses("world", _PROBS, 4, [0]), TypeError, _NOT_A_WORLD),
    (lambda: sample_responses(_W, _PROBS.numpy(), 4, [0]), TypeError, "probs must be a torch.Tensor, got ndarray"),
    (lambda: sample_responses(_W, _PROBS[0], 4, [0]), ValueError, _RUN_SHAPE + "(2, 5, 4, 7, 3)"),
    (lambda: sample_responses(_W, _PROBS[..., :2], 4, [0]), ValueError, _RUN_SHAPE + "(1, 2, 5, 4, 7, 2)"),
    (lambda: sample_responses(_W, _moved(_PROBS, -0.1), 4, [0]), ValueError, _NOT_PROBS),
    (lambda: sample_responses(_W, _moved(_PROBS, float("nan")), 4, [0]), ValueError, _NOT_PROBS),
    (lambda: sample_responses(_W, _moved(_PROBS, float("inf")), 4, [0]), ValueError, _NOT_PROBS),
    (lambda: sample_responses(_W, _PROBS.long(), 4, [0]), ValueError, _NOT_PROBS),
    (lambda: sample_responses(_W, _PROBS * 0.5, 4, [0]), ValueError, _SUM),
    (lambda: sample_responses(_W, _PROBS, 4, [0, 1]), ValueError, _GENS),
    (lambda: sample_responses(_W, _PROBS, 4, 0), ValueError, _GENS),
    (lambda: sample_responses(_W, _PROBS, 4, ["seed"]), TypeError, "generators[0] must be an int seed or a torch.Generator, got str"),
    (lambda: sample_responses(_W, _PROBS, 0, [0]), ValueError, "samples_per_prompt must be a positive int, got 0"),
    (lambda: sample_responses(_W, _PROBS, 4, [0], evaluation=tuple(_EV)), ValueError,
     "evaluation must be the PolicyEvaluation of probs (values of shape (1, 2, 5, 4, 7))"),
    (lambda: sample_responses(_W, _PROBS.repeat(2, 1, 1, 1, 1, 1), 4, [0, 1], evaluation=_EV), ValueError,
     "evaluation must be the PolicyEvaluation of probs (values of shape (2, 2, 5, 4, 7))"),
    (lambda: sample_responses(_W, _PROBS, 4, [0], dtype=torch.long), TypeError, "dtype must be a floating torch.dtype, got torch.int64"),
    (lambda: sample_responses(_W, _PROBS, 4, [0], dtype="float"), TypeError, "dtype must be a floating torch.dtype, got float"),
]


@pytest.mark.parametrize("call, error, message", REFUSALS, ids=[str(i) for i in range(len(REFUSALS))])
def test_refusals_name_their_argument(call, error, message):
    with pytest.raises(error, match="^" + re.escape(message) + "$"):
        call()


def test_sample_accepts_rows_that_sum_to_one_within_1e5_only():
    probs = _PROBS.clone()
    row = (0, 0, 0, 0, 0, 0)
    near = probs.clone()
    near[row] += 5e-6  # a row summing to 1 + 5e-6: inside the tolerance of 1e-5
    sample_responses(_W, near, 2, [0])
    far = probs.clone()
    far[row] += 1.5e-5  # 1 + 1.5e-5: outside
    with pytest.raises(ValueError, match=r"^probs must sum to 1 over its last axis \(the next token\)$"):
        sample_responses(_W, far, 2, [0])


def test_soft_optimum_with_a_tiny_beta_stays_finite():
    w = make_prompt_world(n_prompts=2, vocab_size=3, max_len=4, beta=1e-4, seed=0)
    opt = soft_optimal(w)  # Q / beta spans thousands across states: the log-sum-exp must shift per row
    assert np.isfinite(opt.values).all() and np.isfinite(opt.policy).all()
    np.testing.assert_allclose(opt.policy.sum(-1), 1.0, atol=1e-9)
    assert float(opt.values.max()) <= 1.0 + 1e-9 and opt.objective > 0


@pytest.mark.parametrize("kwargs", [dict(n_prompts=1, max_len=4), dict(n_prompts=2, max_len=2), dict(n_prompts=1, max_len=1)])
def test_evaluate_policy_on_one_prompt_and_short_responses(kwargs):
    """The DP's time axis must not be confused with the prompt axis, nor broadcast when it has length 2."""
    w = make_prompt_world(vocab_size=3, beta=0.3, gamma=0.8, score_fn=small_score, seed=3, **kwargs)
    probs = random_policy(w, seed=1, scale=1.5)
    ev = evaluate_policy(w, probs)
    for p in range(w.n_prompts):
        J, score, kl, length = brute_force(w, probs, small_score, p)
        assert ev.per_prompt[p] == pytest.approx(J, abs=1e-12)
    J, score, kl, length = (np.mean([brute_force(w, probs, small_score, p)[j] for p in range(w.n_prompts)]) for j in range(4))
    assert (float(ev.score), float(ev.kl), float(ev.length)) == pytest.approx((score, kl, length), abs=1e-12)


def test_an_action_of_probability_zero_has_no_kl_term():
    w = make_prompt_world(n_prompts=2, vocab_size=3, max_len=4, beta=0.3, gamma=0.9, score_fn=small_score, seed=5)
    probs = random_policy(w, seed=2, scale=1.0)
    probs[..., 2] = 0.0  # token 2 is never taken
    probs /= probs.sum(-1, keepdims=True)
    ev = evaluate_policy(w, probs)
    assert np.isfinite(ev.values).all() and np.isfinite(ev.q).all() and np.isfinite(ev.kl).all()
    P, L, C, K = w.state_shape
    for p in range(P):
        for t in range(L):
            for c in range(C):
                for k in range(K):
                    for a in range(w.vocab_size):
                        k_after = min(k + (a == GOOD), w.max_count)
                        if a == EOS or t == L - 1:
                            rest = w.score_table[t + 1, k_after]
                        else:
                            rest = w.gamma * ev.values[p, t + 1, a, k_after]
                        kl = 0.0 if a == 2 else -w.beta * (math.log(probs[p, t, c, k, a]) - math.log(w.pi_ref[p, c, a]))
                        assert ev.q[p, t, c, k, a] == pytest.approx(kl + rest, abs=1e-12)
    for p in range(P):
        assert ev.per_prompt[p] == pytest.approx(brute_force_without(w, probs, p, 2), abs=1e-12)


def brute_force_without(world, probs, p, banned):
    """J of prompt p over the responses that never take ``banned`` (the others have probability 0)."""
    J = 0.0
    for y in responses(world):
        if banned in y:
            continue
        prob, ret = 1.0, 0.0
        for t, c, k, a in walk(world, p, y):
            prob *= probs[p, t, c, k, a]
            ret += -world.beta * world.gamma**t * (math.log(probs[p, t, c, k, a]) - math.log(world.pi_ref[p, c, a]))
        n = len(y)
        ret += world.gamma ** (n - 1) * float(small_score(np.float64(sum(a == GOOD for a in y)), np.float64(n)))
        J += prob * ret
    return J


def sample_by_hand(world, probs, G, seeds, dtype):
    """sample_responses written out: per step, each run draws float64 uniforms from its own generator while one of
    its responses is alive, and takes the first token whose cumulative probability exceeds its draw."""
    R = probs.shape[0]
    P, L, C, K = world.state_shape
    V = world.vocab_size
    gens = [torch.Generator().manual_seed(s) for s in seeds]
    flat = probs.reshape(R, -1, V).double()
    rows = []
    for r in range(R):
        for p in range(P):
            for g in range(G):
                rows.append(dict(r=r, p=p, ctx=world.bos, k=0, alive=True, tokens=[], states=[], contexts=[]))
    for t in range(L):
        if not any(x["alive"] for x in rows):
            break
        for r in range(R):
            mine = rows[r * P * G:(r + 1) * P * G]
            if not any(x["alive"] for x in mine):
                continue
            u = torch.rand(P * G, 1, generator=gens[r], dtype=torch.float64)[:, 0].tolist()
            for x, ur in zip(mine, u):
                if not x["alive"]:
                    continue
                s = world.state_index(x["p"], t, x["ctx"], x["k"])
                cdf = flat[r, s].cumsum(0).tolist()
                cdf[-1] = 1.0
                a = next(i for i, c in enumerate(cdf) if c > ur)
                x["tokens"].append(a)
                x["states"].append(r * world.n_states + s)
                x["contexts"].append(x["ctx"])
                x["k"] = min(x["k"] + (a == GOOD), world.max_count)
                x["ctx"] = a
                x["alive"] = a != EOS
    return rows


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("eos", [(0.05, 0.1), (0.6, 0.7)])
def test_sample_responses_is_the_sampler_written_out(dtype, eos):
    w = make_prompt_world(n_prompts=2, vocab_size=3, max_len=6, eos_range=eos, seed=4)
    probs = torch.as_tensor(np.stack([random_policy(w, seed=9), w.reference_policy()]))
    probs[1, ..., EOS] *= 30.0  # run 1 ends much sooner than run 0
    probs[1] /= probs[1].sum(-1, keepdim=True)
    ev = evaluate_policy(w, probs)
    b = sample_responses(w, probs, 3, [11, 12], evaluation=ev, dtype=dtype)
    ro = b.rollout
    rows = sample_by_hand(w, probs, 3, [11, 12], dtype)
    T = max(len(x["tokens"]) for x in rows)
    assert ro.tokens.shape == (len(rows), T) and ro.mask.shape == (len(rows), T)  # cut at the longest response
    for i, x in enumerate(rows):
        n = len(x["tokens"])
        assert ro.tokens[i, :n].tolist() == x["tokens"] and (ro.tokens[i, n:] == 0).all()
        assert ro.states[i, :n].tolist() == x["states"] and (ro.states[i, n:] == 0).all()
        assert ro.mask[i].tolist() == [True] * n + [False] * (T - n)
        assert int(ro.lengths[i]) == n
    assert ro.logprobs.dtype == dtype and ro.score.dtype == dtype and ro.rewards.dtype == dtype
    assert ro.values_exact.dtype == dtype and ro.advantages_exact.dtype == dtype
    table = ev.values.reshape(-1)
    for i, x in enumerate(rows):
        want = [table[s] for s in x["states"]]
        np.testing.assert_allclose(ro.values_exact[i, :len(want)].double().numpy(), want,
                                   rtol=0, atol=1e-6 if dtype == torch.float32 else 1e-12)
    if eos[0] > 0.5:
        assert T < w.max_len  # every response ended before max_len: the batch is cut


def test_world_defaults_and_edges():
    w = make_prompt_world()
    assert (w.n_prompts, w.vocab_size, w.max_len, w.beta, w.gamma, w.seed, w.max_count) == (8, 4, 16, 0.05, 1.0, 0, 17)
    eos = w.pi_ref[..., EOS]
    assert (eos >= 0.05).all() and (eos <= 0.2).all()
    same = make_prompt_world(n_prompts=8, vocab_size=4, max_len=16, eos_range=(0.05, 0.2), beta=0.05, gamma=1.0,
                             logit_scale=1.0, score_fn=count_good, seed=0)
    np.testing.assert_array_equal(w.pi_ref, same.pi_ref)
    np.testing.assert_array_equal(w.score_table, same.score_table)
    assert make_prompt_world(eos_range=(0.1, 0.1)).pi_ref[..., EOS].min() == pytest.approx(0.1)  # low == high is allowed
    with pytest.raises(ValueError, match=r"^eos_range\[0\] must lie in \[0, 1\), got 1\.0$"):
        make_prompt_world(eos_range=(1.0, 1.0))
    with pytest.raises(ValueError, match=r"^max_count = 5 changes the score"):  # k = L = 6 is reachable (six GOODs)
        make_prompt_world(max_len=6, max_count=5)
    # a score that depends on min(k, 1) only allows max_count = 1 (the unreachable k = 2 at length 0 is not compared)
    assert make_prompt_world(max_len=4, max_count=1, score_fn=lambda k, L: np.minimum(k, 1.0)).n_counts == 2


def test_count_good_values():
    np.testing.assert_allclose(count_good(np.array([0.0, 4.0, 8.0, 12.0]), np.array([5.0, 5.0, 9.0, 12.0])), [0, 0.5, 1, 1])
    np.testing.assert_allclose(count_good(np.array([1.0, 3.0]), np.array([3.0, 3.0]), scale=2.0), [0.5, 1.0])


def test_evaluate_accepts_float32_and_rows_within_1e6_only():
    w = make_prompt_world(n_prompts=2, vocab_size=3, max_len=3, seed=0)
    good = w.reference_policy()
    ev = evaluate_policy(w, good.astype(np.float32) / good.astype(np.float32).sum(-1, keepdims=True))
    assert np.isfinite(ev.objective).all()
    near = good.copy()
    near[0, 0, 0, 0, 0] += 5e-7  # a row summing to 1 + 5e-7: inside the tolerance of 1e-6
    evaluate_policy(w, near)
    far = good.copy()
    far[0, 0, 0, 0, 0] += 5e-6  # 1 + 5e-6: outside
    with pytest.raises(ValueError, match=r"^probs must sum to 1 over its last axis \(the next token\)$"):
        evaluate_policy(w, far)


@pytest.mark.parametrize("kwargs", [dict(), dict(n_prompts=3, vocab_size=4, eos_range=(0.3, 0.6), logit_scale=2.5, seed=7),
                                    dict(n_prompts=3, vocab_size=4, logit_scale=200.0, seed=0)])
def test_reference_is_its_seeded_definition(kwargs):
    """pi_ref(a | p, c): EOS with prompt p's probability drawn from eos_range, the rest a softmax of seeded logits."""
    w = make_prompt_world(**kwargs)
    P, V, C = w.n_prompts, w.vocab_size, w.vocab_size + 1
    low, high = kwargs.get("eos_range", (0.05, 0.2))
    rng = np.random.default_rng(kwargs.get("seed", 0))
    eos = rng.uniform(low, high, size=P)
    logits = kwargs.get("logit_scale", 1.0) * rng.standard_normal((P, C, V - 1))
    for p in range(P):
        for c in range(C):
            z = logits[p, c] - logits[p, c].max()  # large logits (scale 200) only work shifted by the row's own max
            body = np.exp(z) / np.exp(z).sum()
            np.testing.assert_allclose(w.pi_ref[p, c], [eos[p]] + list((1 - eos[p]) * body), rtol=1e-12, atol=0)
    assert len(np.unique(w.pi_ref[:, 0, EOS])) == P  # each prompt its own EOS probability


def test_max_count_check_is_exact():
    # a cap that changes the score by 1e-10 somewhere reachable changes it: refused
    with pytest.raises(ValueError, match=r"^max_count = 1 changes the score"):
        make_prompt_world(max_len=4, max_count=1, score_fn=lambda k, L: np.minimum(k, 1.0) + 1e-10 * (k >= 2))


def test_score_table_has_one_column_per_count():
    w = make_prompt_world(n_prompts=2, vocab_size=3, max_len=10, max_count=8)
    assert w.score_table.shape == (11, 9) and w.n_counts == 9
    assert reward_model_start(w).shape == w.state_shape
