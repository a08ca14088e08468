"""The error catalogue: every bad input gets a TypeError/ValueError that names the argument."""

from __future__ import annotations

import math

import pytest
import torch

import valuelab as vl

R = torch.zeros(2, 5)
V = torch.zeros(2, 5)


def raises(exc, word, fn, *a, **kw):
    with pytest.raises(exc, match=word):
        fn(*a, **kw)


@pytest.mark.parametrize(
    "call",
    [
        lambda: vl.gae(R, torch.zeros(2, 4)),
        lambda: vl.td_errors(R, torch.zeros(5)),
        lambda: vl.td_targets(R, torch.zeros(3, 5)),
        lambda: vl.nstep_returns(R, torch.zeros(2, 6), 2),
    ],
)
def test_values_shape_mismatch(call):
    with pytest.raises(ValueError, match="values"):
        call()


def test_rewards_bad_rank():
    raises(ValueError, "rewards", vl.discounted_returns, torch.zeros(2, 3, 4))
    raises(ValueError, "rewards", vl.discounted_returns, torch.tensor(1.0))


def test_rewards_not_a_tensor():
    raises(TypeError, "rewards", vl.discounted_returns, [0.0, 1.0])


def test_non_float_dtypes():
    raises(TypeError, "rewards", vl.discounted_returns, torch.zeros(5, dtype=torch.long))
    raises(TypeError, "values", vl.gae, R, V.long())
    raises(TypeError, "values", vl.gae, R, V.double())


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_inputs(bad):
    r = R.clone()
    r[1, 2] = bad
    raises(ValueError, "rewards", vl.gae, r, V)
    raises(ValueError, "values", vl.gae, R, r)
    raises(ValueError, "bootstrap", vl.gae, R, V, bootstrap=bad)


@pytest.mark.parametrize("name", ["gamma", "lam"])
@pytest.mark.parametrize("bad", [-0.1, 1.01, math.nan, torch.tensor([[0.5], [1.5]])])
def test_gamma_lam_outside_unit_interval(name, bad):
    raises(ValueError, name, vl.gae, R, V, **{name: bad})


def test_gamma_not_broadcastable():
    raises(ValueError, "gamma", vl.gae, R, V, gamma=torch.full((3,), 0.9))
    raises(ValueError, "lam", vl.gae, R, V, lam=torch.full((2,), 0.9))  # per-sequence needs shape (B, 1)


def test_gamma_wrong_type():
    raises(TypeError, "gamma", vl.gae, R, V, gamma="0.9")
    raises(TypeError, "gamma", vl.gae, R, V, gamma=True)


@pytest.mark.parametrize("bad", [torch.tensor([[0, 2, 1, 1, 1], [1, 1, 1, 1, 1]]), torch.full((2, 5), 0.5)])
def test_mask_holding_other_values(bad):
    raises(ValueError, "mask", vl.gae, R, V, mask=bad)


def test_mask_wrong_shape_or_type():
    raises(ValueError, "mask", vl.gae, R, V, mask=torch.ones(2, 4, dtype=torch.bool))
    raises(TypeError, "mask", vl.gae, R, V, mask=[[1] * 5] * 2)


def test_bootstrap_wrong_shape():
    raises(ValueError, "bootstrap", vl.gae, R, V, bootstrap=torch.zeros(3))
    raises(ValueError, "bootstrap", vl.gae, R, V, bootstrap=torch.zeros(2, 1))
    raises(TypeError, "bootstrap", vl.gae, R, V, bootstrap="0")


@pytest.mark.parametrize("n, exc", [(0, ValueError), (-3, ValueError), (2.0, TypeError), (True, TypeError), ("2", TypeError)])
def test_n_not_positive_int(n, exc):
    raises(exc, "n", vl.nstep_returns, R, V, n)


def test_negative_clip_range():
    raises(ValueError, "clip_range", vl.value_loss, V, R, old_values=V, clip_range=-0.2)


def test_clip_range_without_old_values():
    raises(ValueError, "old_values", vl.value_loss, V, R, clip_range=0.2)


def test_unknown_aggregation():
    raises(ValueError, "aggregation", vl.value_loss, V, R, aggregation="mean")


def test_unknown_kl_estimator():
    raises(ValueError, "estimator", vl.kl_shaped_rewards, R, V, torch.zeros(2), estimator="k4")


def test_score_wrong_shape():
    raises(ValueError, "score", vl.kl_shaped_rewards, R, V, torch.zeros(5))
    raises(ValueError, "score", vl.kl_shaped_rewards, R, V, torch.zeros(2, 1))


def test_negative_or_nan_beta():
    raises(ValueError, "beta", vl.kl_shaped_rewards, R, V, torch.zeros(2), beta=-0.1)
    raises(ValueError, "beta", vl.kl_shaped_rewards, R, V, torch.zeros(2), beta=math.nan)


def test_ref_logprobs_shape_mismatch():
    raises(ValueError, "ref_logprobs", vl.kl_shaped_rewards, R, torch.zeros(2, 4), torch.zeros(2))


def test_whiten_needs_two_entries():
    raises(ValueError, "mask", vl.masked_whiten, R, torch.tensor([[1, 0, 0, 0, 0], [0] * 5]))


def test_seed_must_be_int():
    raises(TypeError, "seed", vl.seed_everything, 1.5)


@pytest.mark.parametrize("bad", [math.nan, math.inf])
@pytest.mark.parametrize("mask", [torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 0]]), torch.tensor([[1, 0, 1, 1, 0], [0, 1, 1, 0, 1]])])
@pytest.mark.parametrize("pos", [(0, 1), (0, 4), (1, 0)])
def test_non_finite_at_masked_positions_is_an_error_too(bad, mask, pos):
    """A NaN is an error wherever it sits, padding and holes included (fast and general paths alike)."""
    r = R.clone()
    r[pos] = bad
    raises(ValueError, "rewards", vl.gae, r, V, mask=mask, gamma=0.9, lam=0.9)
    raises(ValueError, "values", vl.gae, R, r, mask=mask, gamma=0.9, lam=0.9)
    raises(ValueError, "rewards", vl.discounted_returns, r, mask=mask, gamma=0.9)
    raises(ValueError, "values", vl.td_errors, R, r, mask=mask)
