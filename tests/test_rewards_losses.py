"""KL-shaped rewards, masked statistics and the value loss."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import valuelab as vl
from valuelab import reference as ref


@given(st.integers(0, 2**31 - 1), st.sampled_from(["k1", "k2", "k3"]), st.floats(0.0, 1.0))
def test_kl_shaped_rewards_match_reference(seed, estimator, beta):
    rng = np.random.default_rng(seed)
    B, T = 3, 6
    lp, rlp = rng.normal(size=(B, T)) - 2, rng.normal(size=(B, T)) - 2
    score = rng.normal(size=B)
    mask = np.arange(T)[None] < rng.integers(0, T + 1, size=(B, 1))
    got = vl.kl_shaped_rewards(torch.tensor(lp), torch.tensor(rlp), torch.tensor(score), mask=torch.tensor(mask),
                               beta=beta, estimator=estimator).numpy()
    for b in range(B):
        m = mask[b]
        np.testing.assert_allclose(got[b, m], ref.kl_shaped_rewards(lp[b, m], rlp[b, m], score[b], beta, estimator), rtol=1e-12, atol=1e-12)
        assert (got[b, ~m] == 0).all()


def test_score_goes_on_last_valid_token_not_first_pad():
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 0, 1, 1, 0]])
    r = vl.kl_shaped_rewards(torch.zeros(2, 5), torch.zeros(2, 5), torch.tensor([1.0, 2.0]), mask=mask)
    assert r.tolist() == [[0, 0, 1, 0, 0], [0, 0, 0, 2, 0]]


def test_sum_of_k1_terms_is_minus_beta_sequence_log_ratio():
    g = torch.Generator().manual_seed(0)
    lp, rlp = torch.randn(4, 7, generator=g, dtype=torch.float64), torch.randn(4, 7, generator=g, dtype=torch.float64)
    r = vl.kl_shaped_rewards(lp, rlp, torch.zeros(4), beta=0.3)
    assert torch.allclose(r.sum(-1), -0.3 * (lp - rlp).sum(-1))


def test_k3_is_nonnegative_and_k2_is_half_square():
    rho = torch.linspace(-3, 3, 61, dtype=torch.float64)
    zero = torch.zeros_like(rho)
    assert bool((vl.kl_penalty(rho, zero, "k3") >= 0).all())
    assert torch.allclose(vl.kl_penalty(rho, zero, "k2"), rho**2 / 2)


def test_last_token_onehot():
    m = torch.tensor([[1, 1, 0], [0, 0, 0], [0, 1, 1]], dtype=torch.bool)
    assert vl.last_token_onehot(m).tolist() == [[False, True, False], [False, False, False], [False, False, True]]
    assert vl.last_token_onehot(torch.ones(4, dtype=torch.bool)).tolist() == [False, False, False, True]


def test_masked_mean_and_whiten_ignore_padding():
    x = torch.tensor([[1.0, 2.0, 3.0, 100.0], [4.0, 5.0, 100.0, 100.0]])
    m = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    assert vl.masked_mean(x, m).item() == pytest.approx(3.0)
    assert vl.masked_mean(x, m, dim=-1).tolist() == pytest.approx([2.0, 4.5])
    w = vl.masked_whiten(x, m)
    valid = torch.tensor([1.0, 2, 3, 4, 5])
    expected = (valid - valid.mean()) / torch.sqrt(valid.var(unbiased=True) + 1e-8)
    assert torch.allclose(w[m.bool()], expected)
    assert bool((w[~m.bool()] == 0).all())
    w2 = vl.masked_whiten(x, m, shift_mean=False)
    assert torch.allclose(w2[m.bool()], expected + 3.0)


def test_value_loss_plain_and_clipped():
    v = torch.tensor([[1.0, 2.0, 9.0]], requires_grad=True)
    g = torch.tensor([[0.0, 0.0, 0.0]])
    m = torch.tensor([[1, 1, 0]])
    loss = vl.value_loss(v, g, mask=m)
    assert loss.item() == pytest.approx(0.5 * (1 + 4) / 2)
    loss.backward()
    assert v.grad[0].tolist() == pytest.approx([0.5, 1.0, 0.0])  # d/dV of 1/2 mean (V-G)^2 over 2 tokens
    # clipped: old=1.5, c=0.1 -> clip(1.0)=1.4, clip(2.0)=1.6 -> max((V-G)^2, (clip-G)^2)
    v2 = torch.tensor([[1.0, 2.0, 9.0]], requires_grad=True)
    old = torch.tensor([[1.5, 1.5, 1.5]])
    lc = vl.value_loss(v2, g, mask=m, old_values=old, clip_range=0.1)
    assert lc.item() == pytest.approx(0.5 * (max(1.0, 1.4**2) + max(4.0, 1.6**2)) / 2)
    lc.backward()
    # token 0: the clipped term wins and is flat in V -> zero gradient; token 1: the unclipped term wins
    assert v2.grad[0].tolist() == pytest.approx([0.0, 1.0, 0.0])


def test_value_loss_aggregations():
    v = torch.tensor([[1.0, 1.0, 1.0, 1.0], [3.0, 0.0, 0.0, 0.0]])
    g = torch.zeros(2, 4)
    m = torch.tensor([[1, 1, 1, 1], [1, 0, 0, 0]])
    assert vl.value_loss(v, g, mask=m).item() == pytest.approx(0.5 * (4 + 9) / 5)
    assert vl.value_loss(v, g, mask=m, aggregation="seq-mean-token-mean").item() == pytest.approx(0.5 * (1 + 9) / 2)
    assert vl.value_loss(v, g, mask=m, aggregation="seq-mean-token-sum").item() == pytest.approx(0.5 * (4 + 9) / 2)


def test_value_loss_targets_are_constants():
    v = torch.tensor([1.0, 2.0], requires_grad=True)
    g = (v * 3).detach().requires_grad_(True)
    vl.value_loss(v, g).backward()
    assert g.grad is None


def test_pick_device_and_seed():
    assert vl.pick_device().type in {"cpu", "cuda"}
    a = vl.seed_everything(3)
    x = torch.rand(3)
    vl.seed_everything(3)
    assert torch.equal(x, torch.rand(3)) and isinstance(a, torch.Generator)


def test_decoupled_gae_reuses_gae_with_two_lambdas():
    g = torch.Generator().manual_seed(5)
    r, v = torch.randn(3, 9, generator=g, dtype=torch.float64), torch.randn(3, 9, generator=g, dtype=torch.float64)
    m = torch.rand(3, 9, generator=g) < 0.8
    out = vl.decoupled_gae(r, v, mask=m, gamma=0.99, lam_actor=0.9, lam_critic=1.0)
    assert torch.equal(out.advantages, vl.gae(r, v, mask=m, gamma=0.99, lam=0.9).advantages)
    assert torch.equal(out.returns, vl.gae(r, v, mask=m, gamma=0.99, lam=1.0).returns)
    # lam_critic = 1: the critic's target is the Monte-Carlo return, whatever the critic says
    assert torch.allclose(out.returns, vl.discounted_returns(r, mask=m, gamma=0.99))


def test_length_adaptive_lam():
    lengths = torch.tensor([0, 10, 20, 100, 1000])
    lam = vl.length_adaptive_lam(lengths, alpha=0.05)
    assert lam.shape == (5, 1)
    expected = [0.0, 0.0, 0.0, 1 - 1 / 5, 1 - 1 / 50]  # 1 - 1/(0.05 l), clamped to [0, 1]
    assert lam.squeeze(-1).tolist() == pytest.approx(expected)
    # lambda^l -> exp(-1/alpha): the relative decay over a whole response is fixed, not removed
    long = vl.length_adaptive_lam(torch.tensor([10**6], dtype=torch.float64)).item()
    assert long ** 10**6 == pytest.approx(np.exp(-20), rel=1e-3)
    with pytest.raises(ValueError, match="alpha"):
        vl.length_adaptive_lam(lengths, alpha=0.0)
    with pytest.raises(ValueError, match="lengths"):
        vl.length_adaptive_lam(torch.tensor([[3]]))
    with pytest.raises(TypeError, match="lengths"):
        vl.length_adaptive_lam([3, 4])
