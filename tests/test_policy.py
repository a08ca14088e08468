"""Tests of the many-prompt world of chapter 12 (``valuelab.policy``): exact evaluation, the soft optimum, sampling.

Every oracle is built independently of the code under test: Monte-Carlo
rollouts, enumeration of every response of a tiny world, or the Bellman
equation written as a plain loop over states and actions.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch

from valuelab import discounted_returns
from valuelab.policy import (
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
from valuelab.world import EOS, GOOD


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
