"""Tests of the PPO loop of chapter 12 (``valuelab.ppo``): the clipped surrogate, group advantages, the kappa fit, training.

The loss oracles are plain loops over tokens; the training tests use tiny
worlds and a few iterations so that the whole file runs in a few seconds.
"""

from __future__ import annotations

import math
import statistics

import numpy as np
import pytest
import torch

from valuelab.policy import evaluate_policy, make_prompt_world, soft_optimal
from valuelab.ppo import AdvantageFit, Arm, PolicyLoss, PPOConfig, PPOHistory, advantage_fit, group_advantages, policy_loss, train_ppo

# ---------------------------------------------------------------------------
# policy_loss
# ---------------------------------------------------------------------------


def surrogate_loop(logprobs, old, adv, mask, eps):
    """Per-token clipped surrogate min(rho A, clip(rho) A) as a list of rows of (valid, value)."""
    B, T = len(logprobs), len(logprobs[0])
    rows = []
    for b in range(B):
        row = []
        for t in range(T):
            rho = math.exp(logprobs[b][t] - old[b][t])
            clipped = min(max(rho, 1 - eps), 1 + eps)
            row.append((bool(mask[b][t]), min(rho * adv[b][t], clipped * adv[b][t])))
        rows.append(row)
    return rows


def aggregate_loop(rows, aggregation):
    """The three aggregations of valuelab.losses.aggregate, written out by hand."""
    if aggregation == "token-mean":
        values = [x for row in rows for valid, x in row if valid]
        return sum(values) / max(len(values), 1)
    per_seq = []
    for row in rows:
        values = [x for valid, x in row if valid]
        if not values:
            continue  # an empty sequence does not count
        per_seq.append(sum(values) / len(values) if aggregation == "seq-mean-token-mean" else sum(values))
    return sum(per_seq) / max(len(per_seq), 1)


@pytest.mark.parametrize("aggregation", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
@pytest.mark.parametrize("eps", [0.2, 0.05])
def test_policy_loss_matches_a_loop(aggregation, eps):
    g = torch.Generator().manual_seed(0)
    B, T = 5, 7
    logprobs = -torch.rand(B, T, generator=g, dtype=torch.float64) * 2
    old = logprobs + 0.3 * torch.randn(B, T, generator=g, dtype=torch.float64)
    adv = torch.randn(B, T, generator=g, dtype=torch.float64)
    lengths = [7, 3, 0, 1, 5]  # one empty row
    mask = torch.tensor([[t < n for t in range(T)] for n in lengths])
    out = policy_loss(logprobs, old, adv, mask=mask, clip_range=eps, aggregation=aggregation)
    assert isinstance(out, PolicyLoss)
    rows = surrogate_loop(logprobs.tolist(), old.tolist(), adv.tolist(), mask.tolist(), eps)
    assert out.loss.item() == pytest.approx(-aggregate_loop(rows, aggregation), abs=1e-12)
    # clip fraction: a direct count of the valid tokens whose ratio left [1 - eps, 1 + eps]
    n_valid = n_out = 0
    for b in range(B):
        for t in range(T):
            if mask[b, t]:
                n_valid += 1
                n_out += abs(math.exp(logprobs[b, t].item() - old[b, t].item()) - 1) > eps
    assert 0 < n_out < n_valid  # the inputs exercise both sides
    assert out.clip_fraction.item() == pytest.approx(n_out / n_valid, abs=1e-12)


def test_policy_loss_without_mask_is_the_token_mean_over_everything():
    g = torch.Generator().manual_seed(1)
    logprobs = -torch.rand(3, 4, generator=g, dtype=torch.float64)
    old = logprobs + 0.4 * torch.randn(3, 4, generator=g, dtype=torch.float64)
    adv = torch.randn(3, 4, generator=g, dtype=torch.float64)
    rows = surrogate_loop(logprobs.tolist(), old.tolist(), adv.tolist(), [[1] * 4] * 3, 0.2)
    assert policy_loss(logprobs, old, adv).loss.item() == pytest.approx(-aggregate_loop(rows, "token-mean"), abs=1e-12)


def test_policy_loss_gradient_vanishes_where_the_clip_binds():
    eps = 0.2
    # (ratio, advantage): clipped on the side the advantage pushes -> no gradient; otherwise the gradient of rho A
    cases = [
        (1.5, 1.0, False),  # ratio above 1 + eps, advantage pushes it higher: clipped
        (0.5, -1.0, False),  # ratio below 1 - eps, advantage pushes it lower: clipped
        (1.5, -2.0, True),  # outside, but the advantage pulls it back: gradient
        (0.5, 0.7, True),  # outside below, advantage pulls it up: gradient
        (1.1, 0.3, True),  # inside
        (0.9, -0.4, True),  # inside
    ]
    ratios = torch.tensor([[c[0] for c in cases]], dtype=torch.float64)
    adv = torch.tensor([[c[1] for c in cases]], dtype=torch.float64, requires_grad=True)
    old = torch.full_like(ratios, -1.0, requires_grad=True)
    logprobs = (old.detach() + ratios.log()).requires_grad_()
    out = policy_loss(logprobs, old, adv, clip_range=eps)
    out.loss.backward()
    n = len(cases)
    for j, (rho, a, live) in enumerate(cases):
        expected = -rho * a / n if live else 0.0  # d(-rho A / n)/d log pi = -rho A / n
        assert logprobs.grad[0, j].item() == pytest.approx(expected, abs=1e-12), (rho, a)
    assert adv.grad is None and old.grad is None  # advantages and old log-probs are constants
    assert out.clip_fraction.item() == pytest.approx(4 / 6, abs=1e-12)


def test_bad_policy_loss_arguments_raise():
    x = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="aggregation"):
        policy_loss(x, x, x, aggregation="sum")
    with pytest.raises(ValueError, match="clip_range"):
        policy_loss(x, x, x, clip_range=-0.1)
    with pytest.raises(ValueError, match="old_logprobs"):
        policy_loss(x, torch.zeros(2, 4), x)
    with pytest.raises(ValueError, match="advantages"):
        policy_loss(x, x, torch.zeros(3))


# ---------------------------------------------------------------------------
# group_advantages
# ---------------------------------------------------------------------------


def test_group_advantages_match_a_loop():
    g = torch.Generator().manual_seed(2)
    group = torch.tensor([3, 0, 3, 5, 0, 3, 5, 0, 0, 3])  # unsorted, with gaps in the ids
    returns = torch.randn(len(group), generator=g, dtype=torch.float64)
    out = group_advantages(returns, group)
    centred = group_advantages(returns, group, normalise=False)
    for i in range(len(group)):
        members = [returns[j].item() for j in range(len(group)) if group[j] == group[i]]
        mean = sum(members) / len(members)
        std = statistics.stdev(members)  # unbiased
        assert centred[i].item() == pytest.approx(returns[i].item() - mean, abs=1e-12)
        assert out[i].item() == pytest.approx((returns[i].item() - mean) / (std + 1e-6), abs=1e-12)
    for gid in (0, 3, 5):
        assert centred[group == gid].sum().item() == pytest.approx(0.0, abs=1e-12)
    assert group_advantages(returns, group, eps=0.5)[0].item() == pytest.approx(
        centred[0].item() / (statistics.stdev([returns[j].item() for j in (0, 2, 5, 9)]) + 0.5), abs=1e-12)


def test_group_advantages_of_equal_returns_are_zero():
    out = group_advantages(torch.tensor([2.0, 2.0, 1.0, 3.0]), torch.tensor([0, 0, 1, 1]))
    assert out[:2].abs().max().item() == 0.0
    assert out[2].item() == pytest.approx(-1 / (math.sqrt(2) + 1e-6), rel=1e-6)


def test_bad_group_arguments_raise():
    r = torch.zeros(4)
    with pytest.raises(ValueError, match="group"):
        group_advantages(r, torch.tensor([0, 0, 1, 2]))  # groups 1 and 2 have one response each
    with pytest.raises(ValueError, match="group"):
        group_advantages(torch.zeros(1), torch.tensor([0]))
    with pytest.raises(TypeError, match="group"):
        group_advantages(r, torch.tensor([0.0, 0.0, 1.0, 1.0]))
    with pytest.raises(TypeError, match="group"):
        group_advantages(r, torch.tensor([0, 0, 1]))
    with pytest.raises(ValueError, match="returns"):
        group_advantages(torch.zeros(2, 2), torch.zeros(2, 2, dtype=torch.long))


# ---------------------------------------------------------------------------
# advantage_fit
# ---------------------------------------------------------------------------


def test_advantage_fit_recovers_an_exact_line():
    g = torch.Generator().manual_seed(3)
    exact = torch.randn(6, 9, generator=g, dtype=torch.float64)
    mask = torch.rand(6, 9, generator=g) < 0.7
    mask[:, 0] = True
    estimate = 0.3 + 0.45 * exact
    t_max = 4
    # what the fit must ignore: tokens at or after t_max and masked tokens
    estimate[:, t_max:] = 100.0
    estimate[~mask] = -100.0
    fit = advantage_fit(estimate, exact, mask, t_max)
    assert isinstance(fit, AdvantageFit)
    assert fit.kappa == pytest.approx(0.45, abs=1e-12)
    assert fit.offset == pytest.approx(0.3, abs=1e-12)
    assert fit.noise == pytest.approx(0.0, abs=1e-12)


def test_advantage_fit_with_noise_matches_least_squares():
    rng = np.random.default_rng(4)
    B, T, t_max = 400, 12, 5
    exact = rng.standard_normal((B, T))
    noise = 0.8 * rng.standard_normal((B, T))
    estimate = -0.2 + 0.6 * exact + noise
    mask = np.ones((B, T), dtype=bool)
    mask[:, 3] = False
    fit = advantage_fit(torch.as_tensor(estimate, dtype=torch.float32), torch.as_tensor(exact, dtype=torch.float32),
                        torch.as_tensor(mask), t_max)
    sel = mask[:, :t_max]
    x, y = exact[:, :t_max][sel], estimate[:, :t_max][sel]
    slope, intercept = np.polyfit(x, y, 1)
    assert fit.kappa == pytest.approx(slope, abs=1e-5)
    assert fit.offset == pytest.approx(intercept, abs=1e-5)
    # and the slope is the true one within four standard errors
    se = 0.8 / math.sqrt(((x - x.mean()) ** 2).sum())
    assert abs(fit.kappa - 0.6) < 4 * se
    assert fit.noise == pytest.approx(0.8, rel=0.1)


def test_bad_advantage_fit_arguments_raise():
    exact = torch.randn(3, 5, generator=torch.Generator().manual_seed(0))
    one = torch.zeros(3, 5, dtype=torch.bool)
    one[0, 0] = True
    with pytest.raises(ValueError, match="mask"):
        advantage_fit(exact, exact, one, 3)
    late = torch.zeros(3, 5, dtype=torch.bool)
    late[:, 4] = True
    with pytest.raises(ValueError, match="mask"):
        advantage_fit(exact, exact, late, 3)  # valid tokens only after t_max
    with pytest.raises(ValueError, match="exact"):
        advantage_fit(exact, torch.ones(3, 5), torch.ones(3, 5, dtype=torch.bool), 3)
    with pytest.raises(ValueError, match="t_max"):
        advantage_fit(exact, exact, torch.ones(3, 5, dtype=torch.bool), 0)


# ---------------------------------------------------------------------------
# train_ppo
# ---------------------------------------------------------------------------

WORLD = dict(n_prompts=3, vocab_size=3, max_len=8, seed=0)
SMALL = PPOConfig(iterations=4, samples_per_prompt=4, minibatches=2)
ARMS = [Arm("gae"), Arm("group", estimator="group")]


@pytest.fixture(scope="module")
def world():
    return make_prompt_world(**WORLD)


@pytest.mark.parametrize("arm", ARMS, ids=lambda a: a.name)
def test_runs_are_independent(world, arm):
    both = train_ppo(world, arm, [0, 1], SMALL, device="cpu")
    alone = train_ppo(world, arm, [1], SMALL, device="cpu")
    np.testing.assert_allclose(both.objective[1], alone.objective[0], atol=1e-6, rtol=0)
    np.testing.assert_allclose(both.length[1], alone.length[0], atol=1e-5, rtol=0)


@pytest.mark.parametrize("arm", ARMS, ids=lambda a: a.name)
def test_runs_are_independent_when_batches_end_early(arm):
    w = make_prompt_world(n_prompts=3, vocab_size=3, max_len=8, eos_range=(0.5, 0.6), seed=0)
    both = train_ppo(w, arm, [0, 1], SMALL, device="cpu")
    alone = train_ppo(w, arm, [1], SMALL, device="cpu")
    np.testing.assert_allclose(both.objective[1], alone.objective[0], atol=1e-6, rtol=0)


@pytest.mark.parametrize("arm", ARMS, ids=lambda a: a.name)
def test_history_shapes_and_exact_start(world, arm):
    R, I = 2, SMALL.iterations
    h = train_ppo(world, arm, [3, 4], SMALL, device="cpu")
    assert isinstance(h, PPOHistory) and h.arm is arm and h.config is SMALL and h.seeds == [3, 4]
    for name in ("objective", "length", "kl", "gap"):
        assert getattr(h, name).shape == (R, I + 1), name
    for name in ("kappa", "critic_rmse", "early_bias", "clip_fraction"):
        assert getattr(h, name).shape == (R, I), name
    ev0 = evaluate_policy(world, world.reference_policy())
    np.testing.assert_allclose(h.objective[:, 0], ev0.objective, atol=1e-6)
    np.testing.assert_allclose(h.length[:, 0], ev0.length, atol=1e-5)
    np.testing.assert_allclose(h.kl[:, 0], 0.0, atol=1e-5)
    opt = soft_optimal(world)
    assert h.optimum == pytest.approx(opt.objective, abs=1e-12)
    assert h.optimum_length == pytest.approx(float(evaluate_policy(world, opt.policy).length), abs=1e-12)
    assert (h.gap >= -1e-9).all()
    np.testing.assert_allclose(h.gap, opt.objective - h.objective, atol=1e-12)
    assert (h.kl >= -1e-6).all()
    assert np.isfinite(h.kappa).all()
    assert ((h.clip_fraction >= 0) & (h.clip_fraction <= 1)).all()
    if arm.estimator == "group":
        assert np.isnan(h.critic_rmse).all() and np.isnan(h.early_bias).all()
    else:
        assert np.isfinite(h.critic_rmse).all() and (h.critic_rmse > 0).all() and np.isfinite(h.early_bias).all()
    assert h.warmup_rmse.shape == (R, 1)
    # training moved the policy
    assert (h.kl[:, -1] > 1e-4).all()


@pytest.mark.parametrize("arm", ARMS, ids=lambda a: a.name)
def test_ppo_raises_the_objective(world, arm):
    h = train_ppo(world, arm, [0, 1, 2], PPOConfig(iterations=30, samples_per_prompt=4, minibatches=2), device="cpu")
    assert (h.objective[:, -1] > h.objective[:, 0] + 0.05).all(), h.objective[:, [0, -1]]
    assert (h.gap[:, -1] < h.gap[:, 0]).all()


def test_warmup_reduces_the_critic_error(world):
    h = train_ppo(world, Arm("warm", warmup=6), [0, 1], PPOConfig(iterations=1, samples_per_prompt=4, minibatches=2),
                  device="cpu")
    assert h.warmup_rmse.shape == (2, 7)
    assert (h.warmup_rmse[:, -1] < h.warmup_rmse[:, 0]).all(), h.warmup_rmse
    # the zero critic's first error is the RMS of V^pi0 itself over the first batch: it is positive
    assert (h.warmup_rmse[:, 0] > 0).all()


def test_other_arms_run(world):
    for arm in (Arm("rm", critic_start="reward-model"), Arm("adaptive", lam_actor="adaptive", alpha=0.5),
                Arm("mc", lam_actor=1.0, lam_critic=1.0)):
        h = train_ppo(world, arm, [0], PPOConfig(iterations=2, samples_per_prompt=4, minibatches=2,
                                                 value_clip=None, whiten=False), device="cpu")
        assert np.isfinite(h.objective).all() and np.isfinite(h.critic_rmse).all(), arm.name


def test_training_is_deterministic(world):
    arm = Arm("gae", lam_actor=0.9, lam_critic=1.0)
    a = train_ppo(world, arm, [5, 6], SMALL, device="cpu")
    b = train_ppo(world, arm, [5, 6], SMALL, device="cpu")
    for name in ("objective", "length", "kl", "kappa", "critic_rmse", "early_bias", "clip_fraction", "warmup_rmse"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)
    c = train_ppo(world, arm, [7, 6], SMALL, device="cpu")
    assert not np.array_equal(a.objective[0], c.objective[0])  # the seed matters


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(estimator="foo"), ValueError, "estimator"),
        (dict(lam_actor=1.5), ValueError, "lam_actor"),
        (dict(lam_actor=-0.1), ValueError, "lam_actor"),
        (dict(lam_actor="fixed"), TypeError, "lam_actor"),
        (dict(lam_critic=1.2), ValueError, "lam_critic"),
        (dict(critic_start="random"), ValueError, "critic_start"),
        (dict(warmup=-1), ValueError, "warmup"),
        (dict(warmup=1.5), ValueError, "warmup"),
        (dict(warmup=True), ValueError, "warmup"),
        (dict(alpha=0.0), ValueError, "alpha"),
        (dict(estimator="group", warmup=2), ValueError, "warmup"),
        (dict(estimator="group", critic_start="reward-model"), ValueError, "critic_start"),
        (dict(name=3), TypeError, "name"),
    ],
)
def test_bad_arm_raises(kwargs, error, match):
    kwargs = {"name": "x", **kwargs}
    with pytest.raises(error, match=match):
        Arm(**kwargs)


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(iterations=0), ValueError, "iterations"),
        (dict(samples_per_prompt=1), ValueError, "samples_per_prompt"),
        (dict(epochs=0), ValueError, "epochs"),
        (dict(minibatches=2.0), TypeError, "minibatches"),
        (dict(actor_lr=0.0), ValueError, "actor_lr"),
        (dict(critic_lr=-1.0), ValueError, "critic_lr"),
        (dict(clip_range=-0.1), ValueError, "clip_range"),
        (dict(value_clip=-0.1), ValueError, "value_clip"),
        (dict(whiten=1), TypeError, "whiten"),
        (dict(early=0), ValueError, "early"),
    ],
)
def test_bad_config_raises(kwargs, error, match):
    with pytest.raises(error, match=match):
        PPOConfig(**kwargs)


def test_bad_train_arguments_raise(world):
    arm = Arm("gae")
    with pytest.raises(ValueError, match="minibatches"):
        train_ppo(world, arm, [0], PPOConfig(iterations=1, samples_per_prompt=4, minibatches=5))  # 12 rows per run
    with pytest.raises(ValueError, match="seeds"):
        train_ppo(world, arm, [], SMALL)
    with pytest.raises(ValueError, match="seeds"):
        train_ppo(world, arm, 0, SMALL)
    with pytest.raises(TypeError, match="seeds"):
        train_ppo(world, arm, [0.5], SMALL)
    with pytest.raises(TypeError, match="seeds"):
        train_ppo(world, arm, [True], SMALL)
    with pytest.raises(TypeError, match="world"):
        train_ppo("world", arm, [0], SMALL)
    with pytest.raises(TypeError, match="arm"):
        train_ppo(world, "gae", [0], SMALL)
    with pytest.raises(TypeError, match="config"):
        train_ppo(world, arm, [0], dict(iterations=1))
