"""Tests of the PPO loop of chapter 12 (``valuelab.lab.ppo``): the clipped surrogate, group advantages, the kappa fit, training.

The loss oracles are plain loops over tokens; the training tests use tiny
worlds and a few iterations so that the whole file runs in a few seconds.
"""

from __future__ import annotations

import math
import statistics

import numpy as np
import pytest
import torch

from valuelab.lab.policy import evaluate_policy, make_prompt_world, soft_optimal
from valuelab.lab.ppo import AdvantageFit, Arm, PolicyLoss, PPOConfig, PPOHistory, advantage_fit, group_advantages, policy_loss, train_ppo

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
    [  # the whole message: a check that names the wrong argument is a slip too
        (dict(estimator="foo"), ValueError, r"^estimator must be 'gae' or 'group', got 'foo'$"),
        (dict(lam_actor=1.5), ValueError, r"^lam_actor must lie in \[0, 1\] or be 'adaptive', got 1\.5$"),
        (dict(lam_actor=-0.1), ValueError, r"^lam_actor must be non-negative, got -0\.1$"),
        (dict(lam_actor="fixed"), TypeError, r"^lam_actor must be a real number, got str$"),
        (dict(lam_critic=1.2), ValueError, r"^lam_critic must lie in \[0, 1\], got 1\.2$"),
        (dict(lam_critic=-0.5), ValueError, r"^lam_critic must be non-negative, got -0\.5$"),
        (dict(critic_start="random"), ValueError, r"^critic_start must be 'zero' or 'reward-model', got 'random'$"),
        (dict(warmup=-1), ValueError, r"^warmup must be a non-negative int, got -1$"),
        (dict(warmup=1.5), ValueError, r"^warmup must be a non-negative int, got 1\.5$"),
        (dict(warmup=True), ValueError, r"^warmup must be a non-negative int, got True$"),
        (dict(alpha=0.0), ValueError, r"^alpha must be positive$"),
        (dict(alpha=-2.0), ValueError, r"^alpha must be non-negative, got -2\.0$"),
        (dict(estimator="group", warmup=2), ValueError,
         r"^the group estimator has no critic: leave warmup = 0 and critic_start = 'zero'$"),
        (dict(estimator="group", critic_start="reward-model"), ValueError,
         r"^the group estimator has no critic: leave warmup = 0 and critic_start = 'zero'$"),
        (dict(name=3), TypeError, r"^name must be a str$"),
    ],
)
def test_bad_arm_raises(kwargs, error, match):
    kwargs = {"name": "x", **kwargs}
    with pytest.raises(error, match=match):
        Arm(**kwargs)


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(iterations=0), ValueError, r"^iterations must be a positive int, got 0$"),
        (dict(samples_per_prompt=1), ValueError, r"^samples_per_prompt must be at least 2 \(a group needs two responses\)$"),
        (dict(samples_per_prompt=0), ValueError, r"^samples_per_prompt must be a positive int, got 0$"),
        (dict(epochs=0), ValueError, r"^epochs must be a positive int, got 0$"),
        (dict(minibatches=2.0), TypeError, r"^minibatches must be a positive int, got float$"),
        (dict(early=0), ValueError, r"^early must be a positive int, got 0$"),
        (dict(actor_lr=0.0), ValueError, r"^actor_lr must be positive$"),
        (dict(actor_lr=-1.0), ValueError, r"^actor_lr must be non-negative, got -1\.0$"),
        (dict(critic_lr=0.0), ValueError, r"^critic_lr must be positive$"),
        (dict(critic_lr=-1.0), ValueError, r"^critic_lr must be non-negative, got -1\.0$"),
        (dict(clip_range=-0.1), ValueError, r"^clip_range must be non-negative, got -0\.1$"),
        (dict(value_clip=-0.1), ValueError, r"^value_clip must be non-negative, got -0\.1$"),
        (dict(whiten=1), TypeError, r"^whiten must be a bool \(True or False\), got int$"),
    ],
)
def test_bad_config_raises(kwargs, error, match):
    with pytest.raises(error, match=match):
        PPOConfig(**kwargs)


def test_bad_train_arguments_raise(world):
    arm = Arm("gae")
    with pytest.raises(ValueError, match=r"^minibatches must divide n_prompts \* samples_per_prompt \(equal minibatches per run\)$"):
        train_ppo(world, arm, [0], PPOConfig(iterations=1, samples_per_prompt=4, minibatches=5))  # 12 rows per run
    with pytest.raises(ValueError, match=r"^seeds must be a non-empty list of ints$"):
        train_ppo(world, arm, [], SMALL)
    with pytest.raises(ValueError, match=r"^seeds must be a non-empty list of ints$"):
        train_ppo(world, arm, 0, SMALL)
    with pytest.raises(TypeError, match=r"^seeds\[0\] must be an int"):
        train_ppo(world, arm, [0.5], SMALL)
    with pytest.raises(TypeError, match=r"^seeds\[0\] must be an int"):
        train_ppo(world, arm, [True], SMALL)
    with pytest.raises(TypeError, match=r"^world must be a PromptWorld, got str$"):
        train_ppo("world", arm, [0], SMALL)
    with pytest.raises(TypeError, match=r"^arm must be an Arm, got str$"):
        train_ppo(world, "gae", [0], SMALL)
    with pytest.raises(TypeError, match=r"^config must be a PPOConfig, got dict$"):
        train_ppo(world, arm, [0], dict(iterations=1))


def test_bad_loss_and_fit_arguments_name_the_argument():
    x = torch.zeros(2, 3)
    with pytest.raises(TypeError, match=r"^logprobs must be a torch\.Tensor, got list$"):
        policy_loss([[0.0]], x, x)
    with pytest.raises(ValueError, match=r"^old_logprobs must have the same shape as logprobs: \(2, 4\) != \(2, 3\)$"):
        policy_loss(x, torch.zeros(2, 4), x)
    with pytest.raises(ValueError, match=r"^advantages must have the same shape as logprobs: \(3,\) != \(2, 3\)$"):
        policy_loss(x, x, torch.zeros(3))
    with pytest.raises(ValueError, match=r"^clip_range must be non-negative, got -0\.1$"):
        policy_loss(x, x, x, clip_range=-0.1)
    with pytest.raises(TypeError, match=r"^returns must be a torch\.Tensor, got list$"):
        group_advantages([0.0, 1.0], torch.tensor([0, 0]))
    with pytest.raises(ValueError, match=r"^returns must have shape \(B,\), got \(2, 2\)$"):
        group_advantages(torch.zeros(2, 2), torch.zeros(2, 2, dtype=torch.long))
    with pytest.raises(TypeError, match=r"^group must be a long tensor of the shape of returns$"):
        group_advantages(torch.zeros(2), [0, 0])
    with pytest.raises(ValueError, match=r"^group: every group needs at least two responses$"):
        group_advantages(torch.zeros(3), torch.tensor([0, 0, 1]))
    with pytest.raises(ValueError, match=r"^eps must be non-negative, got -1\.0$"):
        group_advantages(torch.zeros(2), torch.tensor([0, 0]), eps=-1.0)
    e = torch.randn(3, 5, generator=torch.Generator().manual_seed(0))
    ones = torch.ones(3, 5, dtype=torch.bool)
    with pytest.raises(TypeError, match=r"^estimate must be a torch\.Tensor, got list$"):
        advantage_fit([[0.0]], e, ones, 3)
    with pytest.raises(ValueError, match=r"^exact must have the same shape as estimate: \(3, 4\) != \(3, 5\)$"):
        advantage_fit(e, e[:, :4], ones, 3)
    with pytest.raises(ValueError, match=r"^t_max must be a positive int, got 0$"):
        advantage_fit(e, e, ones, 0)
    with pytest.raises(ValueError, match=r"^mask must select at least two tokens before t_max$"):
        advantage_fit(e, e, torch.zeros(3, 5, dtype=torch.bool), 3)
    with pytest.raises(ValueError, match=r"^exact: the exact advantages have no spread over the selected tokens$"):
        advantage_fit(e, torch.ones(3, 5), ones, 3)


def test_advantage_fit_edges():
    # exactly two tokens suffice; an exact spread of exactly 1 (sum of squared deviations) is a spread
    two = advantage_fit(torch.tensor([[1.0, 3.0]]), torch.tensor([[0.0, 1.0]]), torch.ones(1, 2, dtype=torch.bool), 2)
    assert (two.kappa, two.offset, two.noise) == pytest.approx((2.0, 1.0, 0.0), abs=1e-12)
    exact = torch.tensor([[0.0, 0.0, 1.0, 1.0]])
    fit = advantage_fit(0.5 * exact - 2.0, exact, None, 4)  # no mask: every token before t_max
    assert (fit.kappa, fit.offset) == pytest.approx((0.5, -2.0), abs=1e-12)
    # the noise is the unbiased standard deviation of the residual
    est = torch.tensor([[1.0, 0.0, 0.0, 1.0]], dtype=torch.float64)
    fit = advantage_fit(est, torch.tensor([[0.0, 0.0, 1.0, 1.0]], dtype=torch.float64), None, 4)
    resid = [1.0 - 0.5, 0.0 - 0.5, 0.0 - 0.5, 1.0 - 0.5]
    assert fit.kappa == pytest.approx(0.0, abs=1e-12) and fit.noise == pytest.approx(statistics.stdev(resid), abs=1e-12)


def test_group_advantages_with_gaps_and_pairs():
    # ids with gaps (no responses for 1 and 2) and groups of exactly two: (R - mean) / (unbiased std + eps)
    returns = torch.tensor([1.0, 3.0, 10.0, 14.0], dtype=torch.float64)
    group = torch.tensor([0, 0, 3, 3])
    s1, s2 = statistics.stdev([1.0, 3.0]), statistics.stdev([10.0, 14.0])
    want = [-1 / (s1 + 1e-6), 1 / (s1 + 1e-6), -2 / (s2 + 1e-6), 2 / (s2 + 1e-6)]
    np.testing.assert_allclose(group_advantages(returns, group).numpy(), want, rtol=0, atol=1e-12)
    np.testing.assert_allclose(group_advantages(returns, group, eps=0.0).numpy(), [-1 / s1, 1 / s1, -2 / s2, 2 / s2], atol=1e-12)
    np.testing.assert_allclose(group_advantages(returns, group, normalise=False).numpy(), [-1, 1, -2, 2], atol=1e-12)


def test_default_device_is_picked(world, monkeypatch):
    picked = []
    import valuelab.runtime

    real = valuelab.runtime.pick_device

    def spy():
        picked.append(True)
        return torch.device("cpu")

    monkeypatch.setattr(ppo_module, "pick_device", spy)
    h = train_ppo(world, Arm("gae"), [0], PPOConfig(iterations=1, samples_per_prompt=2, minibatches=1))
    assert picked and np.isfinite(h.objective).all()
    assert real() is not None


# ---------------------------------------------------------------------------
# one iteration of train_ppo against a loop written from the PPO equations
# ---------------------------------------------------------------------------
#
# The loop below uses nothing of valuelab.lab.ppo, valuelab.advantages or valuelab.losses: it takes the batch from
# valuelab.lab.policy.sample_responses (the environment: the same generators give the same responses) and writes
# the rest out: the k1 KL-shaped rewards, GAE with the arm's two λs (or the group baseline), per-run whitening,
# the κ fit, PPO's clipped surrogate and clipped value loss (each run's token mean over its minibatch rows),
# and Adam, element by element, over epochs x minibatches, each run with its own tables and minibatch order.
# tests/test_mutants_ppo.py plants slips in valuelab/lab/ppo.py and checks that this comparison catches them.

import valuelab.lab.ppo as ppo_module  # noqa: E402
from valuelab.lab.policy import sample_responses  # noqa: E402

ADAM_BETAS, ADAM_EPS = (0.9, 0.999), 1e-8  # torch.optim.Adam's defaults, which train_ppo keeps
WHITEN_EPS, GROUP_EPS = 1e-8, 1e-6


class HandAdam:
    """Adam (Kingma & Ba, 2015) written out, in float64, on a float32 tensor updated in place."""

    def __init__(self, param: torch.Tensor, lr: float):
        self.p, self.lr, self.k = param, lr, 0
        self.m = torch.zeros(param.shape, dtype=torch.float64)
        self.v = torch.zeros(param.shape, dtype=torch.float64)

    def step(self, grad: torch.Tensor) -> None:
        b1, b2 = ADAM_BETAS
        g = grad.double()
        self.k += 1
        self.m = b1 * self.m + (1 - b1) * g
        self.v = b2 * self.v + (1 - b2) * g * g
        m_hat, v_hat = self.m / (1 - b1 ** self.k), self.v / (1 - b2 ** self.k)
        with torch.no_grad():
            self.p -= (self.lr * m_hat / (v_hat.sqrt() + ADAM_EPS)).to(self.p.dtype)


def hand_rm_start(world) -> np.ndarray:
    """V_0(p, t, c, k) = f(k, t): the score of the prefix as a finished response (row 0: length 1)."""
    start = np.zeros(world.n_states)
    P, L, C, K = world.state_shape
    for p in range(P):
        for t in range(L):
            for c in range(C):
                for k in range(K):
                    start[world.state_index(p, t, c, k)] = world.score_table[t, k]
    return start


def hand_rewards(ro, beta):
    """r_t = -β (log π_old - log π_ref) on every generated token, plus the score on the last one (float64)."""
    r = -beta * (ro.logprobs.double() - ro.ref_logprobs.double())
    last = ro.lengths - 1
    r[torch.arange(len(last)), last] += ro.score.double()
    return torch.where(ro.mask, r, torch.zeros((), dtype=torch.float64))


def hand_gae(rewards, values, mask, gamma, lam):
    """δ_t = r_t + γ V(s_{t+1}) - V(s_t) (V = 0 after the last token), A_t = δ_t + γ λ A_{t+1}; returns (A, A + V)."""
    n, T = rewards.shape
    lam = torch.as_tensor(lam, dtype=torch.float64).reshape(-1).expand(n)
    adv = torch.zeros(n, T, dtype=torch.float64)
    next_v = torch.zeros(n, dtype=torch.float64)
    next_a = torch.zeros(n, dtype=torch.float64)
    for t in reversed(range(T)):
        m = mask[:, t]
        delta = rewards[:, t] + gamma * next_v - values[:, t]
        a = delta + gamma * lam * next_a
        adv[:, t] = torch.where(m, a, torch.zeros(()))
        next_v = torch.where(m, values[:, t], torch.zeros((), dtype=torch.float64))
        next_a = adv[:, t]
    return adv, torch.where(mask, adv + values, torch.zeros((), dtype=torch.float64))


def hand_returns(rewards, mask, gamma):
    """Monte-Carlo G_t = r_t + γ G_{t+1}, 0 after the last token."""
    n, T = rewards.shape
    out = torch.zeros(n, T, dtype=torch.float64)
    nxt = torch.zeros(n, dtype=torch.float64)
    for t in reversed(range(T)):
        g = rewards[:, t] + gamma * nxt
        out[:, t] = torch.where(mask[:, t], g, torch.zeros((), dtype=torch.float64))
        nxt = out[:, t]
    return out


def hand_whiten(x, mask):
    """(x - μ) / sqrt(σ² + 1e-8) over the valid tokens (unbiased σ²); padding 0."""
    vals = x[mask]
    mu = vals.mean()
    var = ((vals - mu) ** 2).sum() / (vals.numel() - 1)
    return torch.where(mask, (x - mu) / torch.sqrt(var + WHITEN_EPS), torch.zeros((), dtype=x.dtype))


def hand_group(total, prompt, normalise):
    """(R_i - mean of its prompt's returns), over (unbiased std + 1e-6) when ``normalise``."""
    out = torch.zeros_like(total)
    for p in prompt.unique().tolist():
        sel = prompt == p
        centred = total[sel] - total[sel].mean()
        out[sel] = centred / (total[sel].std() + GROUP_EPS) if normalise else centred
    return out


def hand_kappa(raw, exact, mask, early):
    """Least squares raw ≈ b + κ exact over valid tokens t < early: (κ, residual std, unbiased)."""
    sel = mask[:, :early]
    a, x = raw[:, :early][sel].double().numpy(), exact[:, :early][sel].double().numpy()
    dx = x - x.mean()
    kappa = float((dx * (a - a.mean())).sum() / (dx * dx).sum())
    resid = a - (a.mean() - kappa * x.mean()) - kappa * x
    return kappa, float(resid.std(ddof=1))


def ppo_by_hand(world, arm: dict, seeds, cfg: dict):
    """One PPO iteration (after ``warmup`` value-pretraining iterations), every run on its own. Returns a dict."""
    R, S, V, P = len(seeds), world.n_states, world.vocab_size, world.n_prompts
    G, n_per_run = cfg["samples_per_prompt"], world.n_prompts * cfg["samples_per_prompt"]
    mb = n_per_run // cfg["minibatches"]
    gens = [torch.Generator().manual_seed(s) for s in seeds]
    log_ref = torch.as_tensor(np.log(world.reference_policy()), dtype=torch.float32).reshape(S, V)
    start = hand_rm_start(world) if arm.get("critic_start") == "reward-model" else np.zeros(S)
    logits = [log_ref.clone().requires_grad_() for _ in range(R)]
    tables = [torch.as_tensor(start, dtype=torch.float32).clone().requires_grad_() for _ in range(R)]
    adam_pi = [HandAdam(x, cfg["actor_lr"]) for x in logits]
    adam_v = [HandAdam(x, cfg["critic_lr"]) for x in tables]
    group_arm = arm.get("estimator") == "group"
    zero = torch.zeros(())

    def policy():
        return torch.softmax(torch.cat([x.detach() for x in logits]), -1).reshape((R,) + world.state_shape + (V,))

    def run_part(batch, r):
        """Run r's rows of the batch, its states local to its own tables (float64 copies of what the loop needs)."""
        ro, rows = batch.rollout, slice(r * n_per_run, (r + 1) * n_per_run)
        m = ro.mask[rows]
        return dict(mask=m, states=torch.where(m, ro.states[rows] - r * S, 0), tokens=ro.tokens[rows],
                    old_logp=ro.logprobs[rows], rewards=hand_rewards(_slice(ro, rows), world.beta),
                    exact_v=ro.values_exact[rows].double(), exact_a=ro.advantages_exact[rows].double(),
                    lengths=ro.lengths[rows], prompt=batch.prompt[rows])

    def values(part, r):
        return torch.where(part["mask"], tables[r].detach()[part["states"]].double(), torch.zeros((), dtype=torch.float64))

    def rmse(part, v):
        return float(((v - part["exact_v"])[part["mask"]] ** 2).mean().sqrt())

    def epochs(parts, adv, targets, v_old, clip_value):
        """adv None: the critic alone. Returns each run's mean clip fraction and how many value clips bound."""
        fractions, value_binds = [[] for _ in range(R)], 0
        for _ in range(cfg["epochs"]):
            perms = [torch.randperm(n_per_run, generator=g) for g in gens]
            for j in range(cfg["minibatches"]):
                for r in range(R):
                    idx, part = perms[r][j * mb:(j + 1) * mb], parts[r]
                    m, s = part["mask"][idx], part["states"][idx]
                    if adv is not None:
                        logp = torch.log_softmax(logits[r][s], -1).gather(-1, part["tokens"][idx][..., None])[..., 0]
                        ratio = torch.exp(logp - part["old_logp"][idx])
                        a = adv[r][idx].float()
                        eps = cfg["clip_range"]
                        surrogate = torch.minimum(ratio * a, ratio.clamp(1 - eps, 1 + eps) * a)
                        loss = -surrogate[m].mean()
                        fractions[r].append(float(((ratio - 1).abs() > eps)[m].float().mean()))
                        loss.backward()
                        adam_pi[r].step(logits[r].grad)
                        logits[r].grad = None
                    if targets is not None:
                        v = tables[r][s]
                        g, old = targets[r][idx].float(), v_old[r][idx].float()
                        sq = (v - g) ** 2
                        if clip_value is not None:
                            clipped_sq = (old + (v - old).clamp(-clip_value, clip_value) - g) ** 2
                            value_binds += int(((clipped_sq > sq) & m).sum())
                            sq = torch.maximum(sq, clipped_sq)
                        (0.5 * sq[m].mean()).backward()
                        adam_v[r].step(tables[r].grad)
                        tables[r].grad = None
        return [float(np.mean(f)) if f else float("nan") for f in fractions], value_binds

    out = dict(warmup_rmse=np.zeros((R, arm.get("warmup", 0) + 1)))
    if arm.get("warmup", 0):
        p0 = policy()
        ev0 = evaluate_policy(world, p0.double())
        for w in range(arm["warmup"]):
            batch = sample_responses(world, p0, G, gens, evaluation=ev0)
            parts = [run_part(batch, r) for r in range(R)]
            v_old = [values(parts[r], r) for r in range(R)]
            for r in range(R):
                out["warmup_rmse"][r, w] = rmse(parts[r], v_old[r])
            targets = [hand_returns(parts[r]["rewards"], parts[r]["mask"], world.gamma) for r in range(R)]
            epochs(parts, None, targets, v_old, None)
        for r in range(R):
            out["warmup_rmse"][r, -1] = rmse(parts[r], values(parts[r], r))

    p = policy()
    ev = evaluate_policy(world, p.double())
    batch = sample_responses(world, p, G, gens, evaluation=ev)
    parts = [run_part(batch, r) for r in range(R)]
    v_old = [values(parts[r], r) for r in range(R)]
    raw, adv, targets = [], [], None if group_arm else []
    for r, part in enumerate(parts):
        m = part["mask"]
        if group_arm:
            total = part["rewards"].sum(-1)
            raw.append(torch.where(m, hand_group(total, part["prompt"], False)[:, None], torch.zeros((), dtype=torch.float64)))
            adv.append(torch.where(m, hand_group(total, part["prompt"], True)[:, None], torch.zeros((), dtype=torch.float64)))
        else:
            lam_a = arm.get("lam_actor", 0.95)
            if lam_a == "adaptive":  # λ = 1 - 1/(α l), clamped to [0, 1]
                lam_a = (1 - 1 / (arm["alpha"] * part["lengths"].double())).clamp(0, 1)
            a, _ = hand_gae(part["rewards"], v_old[r], m, world.gamma, lam_a)
            _, g = hand_gae(part["rewards"], v_old[r], m, world.gamma, arm.get("lam_critic", 0.95))
            raw.append(a)
            adv.append(a)
            targets.append(g)
    if cfg["whiten"]:
        adv = [hand_whiten(adv[r], parts[r]["mask"]) for r in range(R)]
    fits = [hand_kappa(raw[r], parts[r]["exact_a"], parts[r]["mask"], cfg["early"]) for r in range(R)]
    out["kappa"] = np.array([f[0] for f in fits])
    out["noise"] = np.array([f[1] for f in fits])
    if not group_arm:
        out["critic_rmse"] = np.array([rmse(parts[r], v_old[r]) for r in range(R)])
        out["early_bias"] = np.array([float((v_old[r] - part["exact_v"])[:, :cfg["early"]][part["mask"][:, :cfg["early"]]].mean())
                                      for r, part in enumerate(parts)])
    out["clip_fraction"], out["value_clip_binds"] = epochs(parts, adv, targets, v_old, cfg["value_clip"])
    out["ratio_clip_fraction"] = out["clip_fraction"]
    out["logits"] = torch.cat([x.detach() for x in logits])
    out["table"] = torch.cat([x.detach() for x in tables])
    out["start"] = start
    out["objective1"] = evaluate_policy(world, policy().double()).objective
    return out


def _slice(ro, rows):
    """The fields of a rollout that hand_rewards reads, for some rows."""
    class Part:
        pass
    part = Part()
    for name in ("logprobs", "ref_logprobs", "score", "lengths", "mask"):
        setattr(part, name, getattr(ro, name)[rows])
    return part


def train_and_capture(module, world, arm, seeds, config):
    """``module.train_ppo`` with the tables it trains: (history, logits (R*S, V), table (R*S,)) after training."""
    made = []
    real = torch.optim.Adam

    class Recording(real):
        def __init__(self, params, *args, **kwargs):
            params = list(params)
            made.extend(params)
            super().__init__(params, *args, **kwargs)

    torch.optim.Adam = Recording
    try:
        h = module.train_ppo(world, arm, seeds, config, device="cpu")
    finally:
        torch.optim.Adam = real
    (logits,) = [x for x in made if x.dim() == 2]
    (table,) = [x for x in made if x.dim() == 1]
    return h, logits.detach(), table.detach()


# (name, world, arm, config): the clips bind (case "rm"), λ_actor != λ_critic, γ < 1 in one world, both starts,
# warm-up, the adaptive λ, the group arm with and without whitening
HAND_WORLDS = {"w": dict(n_prompts=3, vocab_size=3, max_len=6, seed=0),
               "g": dict(n_prompts=2, vocab_size=4, max_len=5, gamma=0.9, seed=1)}
HAND_BASE = dict(iterations=1, samples_per_prompt=4, epochs=2, minibatches=2, actor_lr=0.3, critic_lr=0.1,
                 clip_range=0.2, value_clip=0.05, whiten=True, early=3)
HAND_CASES = [
    ("rm", "w", dict(lam_actor=0.7, lam_critic=0.9, critic_start="reward-model"), {}),
    ("zero", "g", dict(lam_actor=0.9, lam_critic=0.6), dict(epochs=3, minibatches=4, clip_range=0.1)),
    ("warm-adaptive", "g", dict(lam_actor="adaptive", alpha=0.5, lam_critic=0.8, warmup=2),
     dict(whiten=False, value_clip=None, early=2)),
    ("group", "w", dict(estimator="group"), {}),
    ("group-raw", "g", dict(estimator="group"), dict(whiten=False)),
]
HAND_SEEDS = [3, 11]


def check_one_iteration(module, case) -> dict:
    """Train one iteration with ``module`` (valuelab.lab.ppo or a planted copy) and compare with ppo_by_hand."""
    name, world_key, arm_kw, cfg_kw = case
    world = make_prompt_world(**HAND_WORLDS[world_key])
    cfg = {**HAND_BASE, **cfg_kw}
    h, logits, table = train_and_capture(module, world, module.Arm(name, **arm_kw), HAND_SEEDS, module.PPOConfig(**cfg))
    ref = ppo_by_hand(world, arm_kw, HAND_SEEDS, cfg)
    np.testing.assert_allclose(h.kappa[:, 0], ref["kappa"], rtol=1e-5, atol=1e-6, err_msg="kappa")
    np.testing.assert_allclose(h.noise[:, 0], ref["noise"], rtol=1e-5, atol=1e-6, err_msg="noise")
    np.testing.assert_allclose(h.warmup_rmse, ref["warmup_rmse"], rtol=1e-5, atol=1e-6, err_msg="warmup_rmse")
    if arm_kw.get("estimator") == "group":
        assert np.isnan(h.critic_rmse).all() and np.isnan(h.early_bias).all()
    else:
        np.testing.assert_allclose(h.critic_rmse[:, 0], ref["critic_rmse"], rtol=1e-5, atol=1e-6, err_msg="critic_rmse")
        np.testing.assert_allclose(h.early_bias[:, 0], ref["early_bias"], rtol=1e-5, atol=1e-6, err_msg="early_bias")
    np.testing.assert_allclose(h.clip_fraction[:, 0], ref["clip_fraction"], rtol=0, atol=1e-6, err_msg="clip_fraction")
    np.testing.assert_allclose(logits.numpy(), ref["logits"].numpy(), rtol=0, atol=5e-6, err_msg="actor logits")
    np.testing.assert_allclose(table.numpy(), ref["table"].numpy(), rtol=0, atol=5e-6, err_msg="critic table")
    np.testing.assert_allclose(h.objective[:, 1], ref["objective1"], rtol=0, atol=1e-5, err_msg="J(pi_1)")
    return ref


@pytest.mark.parametrize("case", HAND_CASES, ids=[c[0] for c in HAND_CASES])
def test_one_iteration_matches_a_loop_written_from_the_equations(case):
    ref = check_one_iteration(ppo_module, case)
    name = case[0]
    # the comparison must exercise what it checks: training moved both tables, the clips bound where they are on
    assert float((ref["logits"] - torch.log(torch.as_tensor(make_prompt_world(**HAND_WORLDS[case[1]]).reference_policy(),
                                                           dtype=torch.float32)).reshape(ref["logits"].shape[0] // 2, -1
                                                                                         ).repeat(2, 1)).abs().max()) > 0.05
    if name == "rm":
        assert min(ref["clip_fraction"]) > 0.05, ref["clip_fraction"]  # the ratio clip binds
        assert ref["value_clip_binds"] > 10, ref["value_clip_binds"]  # and so does the value clip
        assert np.abs(ref["start"]).max() > 0.1  # the reward-model start is not the zero one


def test_defaults_are_the_usual_ones():
    """PPOConfig's and Arm's defaults: the values the docstrings and chapter 12 name."""
    check_defaults(ppo_module)


def check_defaults(module):
    c = module.PPOConfig()
    assert (c.iterations, c.samples_per_prompt, c.epochs, c.minibatches) == (100, 16, 2, 4)
    assert (c.actor_lr, c.critic_lr, c.clip_range, c.value_clip, c.whiten, c.early) == (0.02, 0.02, 0.2, 0.2, True, 4)
    for lam in (0.0, 1.0):  # both ends of [0, 1] are allowed
        assert module.Arm("edge", lam_actor=lam, lam_critic=lam).lam_critic == lam
    a = module.Arm("a")
    assert (a.estimator, a.lam_actor, a.lam_critic, a.critic_start, a.warmup, a.alpha) == ("gae", 0.95, 0.95, "zero", 0, 1.0)


# ---------------------------------------------------------------------------
# train_many (the forked runs themselves are checked in tests/test_train_many.py)
# ---------------------------------------------------------------------------


def test_train_many_messages(world):
    from valuelab.lab.ppo import train_many

    cfg = PPOConfig(iterations=1, samples_per_prompt=2, minibatches=1)
    arm = Arm("g", estimator="group")
    bad_job = r"^jobs\[1\] must be a \(PromptWorld, Arm, PPOConfig\[, seeds\]\) tuple$"
    for job in [(world, arm), [world, arm, cfg], ("w", arm, cfg), (world, "a", cfg), (world, arm, {}), (world, arm, cfg, [1], 0)]:
        with pytest.raises(TypeError, match=bad_job):
            train_many([(world, arm, cfg), job], [1])
    with pytest.raises(ValueError, match=r"^jobs\[0\] has no seeds of its own and seeds is None$"):
        train_many([(world, arm, cfg)])
    with pytest.raises(ValueError, match=r"^jobs\[0\] seeds must be a non-empty list of ints$"):
        train_many([(world, arm, cfg, [])], [1])
    with pytest.raises(TypeError, match=r"^jobs\[0\] seeds\[0\] must be an int"):
        train_many([(world, arm, cfg, [1.5])])
    with pytest.raises(ValueError, match=r"^seeds must be a non-empty list of ints$"):
        train_many([(world, arm, cfg)], ())
    with pytest.raises(TypeError, match=r"^seeds\[0\] must be an int"):
        train_many([(world, arm, cfg)], [True])
    with pytest.raises(ValueError, match=r"^processes must be a positive int, got 0$"):
        train_many([(world, arm, cfg)], [1], processes=0)


def _recording(monkeypatch, threads_too: bool = True):
    """train_ppo as train_many's jobs call it, noting the process each call ran in; set_num_threads noted, not done
    (``threads_too``; not around a pool: its workers need the real one)."""
    import os

    real = ppo_module.train_ppo
    threads = []

    def train(*args, **kwargs):
        h = real(*args, **kwargs)
        h.pid = os.getpid()
        return h

    monkeypatch.setattr(ppo_module, "train_ppo", train)
    if threads_too:
        monkeypatch.setattr(torch, "set_num_threads", threads.append)
    return threads


def test_train_many_in_this_process(world, monkeypatch):
    import inspect
    import os

    from valuelab.lab.ppo import train_many

    assert inspect.signature(train_many).parameters["processes"].default == 2
    cfg = PPOConfig(iterations=1, samples_per_prompt=2, minibatches=1)
    arm = Arm("g", estimator="group")
    picked = []
    monkeypatch.setattr(ppo_module, "pick_device", lambda: picked.append(1) or "cpu")
    threads = _recording(monkeypatch)
    out = train_many([(world, arm, cfg), (world, arm, cfg, (4,))], [2, 3], processes=1)
    assert [h.pid for h in out] == [os.getpid()] * 2 and threads == [1, 1]  # here, each job with one thread
    assert picked == [1] and [h.seeds for h in out] == [[2, 3], [4]]  # the device is picked once, for every job
    alone = train_ppo(world, arm, [4], cfg, device="cpu")
    np.testing.assert_array_equal(out[1].objective, alone.objective)
    assert train_many([], [1]) == []


def test_train_many_forks_two_or_more_cpu_jobs_and_uses_the_given_device(world, monkeypatch):
    import os

    from valuelab.lab.ppo import train_many

    def refuse():
        raise AssertionError("pick_device called although a device was given")

    monkeypatch.setattr(ppo_module, "pick_device", refuse)
    cfg = PPOConfig(iterations=1, samples_per_prompt=2, minibatches=1)
    arm = Arm("g", estimator="group")
    _recording(monkeypatch, threads_too=False)
    one = train_many([(world, arm, cfg)], [2], processes=2, device="cpu")  # a single job: here
    assert one[0].pid == os.getpid()
    two = train_many([(world, arm, cfg), (world, arm, cfg, [3])], [2], processes=2, device=torch.device("cpu"))
    assert all(h.pid != os.getpid() for h in two)  # two jobs on the CPU: forked workers
    np.testing.assert_array_equal(one[0].objective, two[0].objective)
    assert [h.seeds for h in two] == [[2], [3]]


def test_policy_loss_clip_fraction_edges():
    lp = torch.tensor([[-1.0, -2.0, -0.5]], dtype=torch.float64)
    adv = torch.tensor([[1.0, -1.0, 0.5]], dtype=torch.float64)
    # a ratio of exactly 1 is inside [1 - 0, 1 + 0]: clip_range 0 clips nothing while the policy has not moved
    assert policy_loss(lp, lp, adv, clip_range=0.0).clip_fraction.item() == 0.0
    # one valid token, clipped: the fraction is 1
    moved = lp + torch.tensor([[1.0, 0.0, 0.0]], dtype=torch.float64)
    one = torch.tensor([[True, False, False]])
    assert policy_loss(moved, lp, adv, mask=one).clip_fraction.item() == 1.0
    assert policy_loss(moved, lp, adv, mask=torch.zeros(1, 3, dtype=torch.bool)).clip_fraction.item() == 0.0


def test_policy_loss_default_clip_is_02():
    g = torch.Generator().manual_seed(3)
    lp = -torch.rand(3, 5, generator=g, dtype=torch.float64)
    old = lp + 0.5 * torch.randn(3, 5, generator=g, dtype=torch.float64)
    adv = torch.randn(3, 5, generator=g, dtype=torch.float64)
    assert policy_loss(lp, old, adv).loss.item() == policy_loss(lp, old, adv, clip_range=0.2).loss.item()
    assert policy_loss(lp, old, adv).loss.item() != policy_loss(lp, old, adv, clip_range=1.2).loss.item()
