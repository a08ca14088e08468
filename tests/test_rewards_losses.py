"""KL-shaped rewards, masked statistics and the value loss."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import valuelab as vl
from valuelab import losses as vl_losses
from valuelab.lab import reference as ref


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


# ---------------------------------------------------------------------------
# masked statistics and the value loss, entry by entry (mutation testing: tools/mutation_score.py)
# ---------------------------------------------------------------------------


def _batch(seed=0, rows=6, length=5, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    v = torch.randn(rows, length, generator=g, dtype=dtype)
    ret = v + 0.7 * torch.randn(rows, length, generator=g, dtype=dtype)
    old = v + 0.3 * torch.randn(rows, length, generator=g, dtype=dtype)
    lengths = torch.tensor([5, 3, 0, 1, 4, 2])[:rows]
    mask = torch.arange(length)[None] < lengths[:, None]
    return v, ret, old, mask


def _valid_rows(x, mask):
    return [x[i][mask[i]].tolist() for i in range(x.shape[0])]


def test_masked_mean_by_hand_and_on_a_huge_scale():
    v, _, _, m = _batch()
    vals = v[m].tolist()
    assert vl.masked_mean(v, m).item() == pytest.approx(sum(vals) / len(vals), abs=1e-12)
    rows = vl.masked_mean(v, m, dim=-1)
    for i, r in enumerate(_valid_rows(v, m)):
        assert rows[i].item() == pytest.approx(sum(r) / len(r) if r else 0.0, abs=1e-12)  # an empty row: 0, not NaN
    cols = vl.masked_mean(v, m, dim=0)
    for j in range(v.shape[1]):
        c = [v[i, j].item() for i in range(v.shape[0]) if m[i, j]]
        assert cols[j].item() == pytest.approx(sum(c) / len(c), abs=1e-12)
    big = torch.tensor([[3e38, 3e38, -1.0]], dtype=torch.float32)
    bm = torch.tensor([[True, True, False]])
    assert vl.masked_mean(big, bm).item() == pytest.approx(3e38, rel=1e-6)  # not inf: taken on the scale of 3e38
    assert vl.masked_mean(big, bm, dim=-1).tolist() == pytest.approx([3e38], rel=1e-6)
    assert vl.masked_mean(big, bm).dtype == torch.float32
    assert vl.masked_mean(torch.zeros(2, 3), torch.zeros(2, 3, dtype=torch.bool)).item() == 0.0
    assert vl.masked_mean(torch.tensor([2.0, 4.0])).item() == 3.0  # no mask: every entry
    neg = torch.tensor([[-4.0, -2.0, 7.0]])
    assert vl.masked_mean(neg, bm).item() == -3.0 and vl.masked_mean(neg, bm, dim=1).tolist() == [-3.0]


def test_masked_var_by_hand():
    v, _, _, m = _batch(1)
    vals = np.array(v[m].tolist())
    assert vl_losses.masked_var(v, m).item() == pytest.approx(vals.var(ddof=1), abs=1e-12)
    assert vl_losses.masked_var(v, m, unbiased=False).item() == pytest.approx(vals.var(ddof=0), abs=1e-12)
    assert vl_losses.masked_var(v.float(), m).dtype == torch.float32
    one = torch.tensor([[1.0, 2.0]])
    first = torch.tensor([[True, False]])
    assert vl_losses.masked_var(one, first, unbiased=False).item() == 0.0  # one entry: biased variance 0
    with pytest.raises(ValueError, match=r"^mask must select at least 2 entries for the unbiased variance$"):
        vl_losses.masked_var(one, first)
    with pytest.raises(ValueError, match=r"^mask must select at least 1 entries for the biased variance$"):
        vl_losses.masked_var(one, torch.zeros(1, 2, dtype=torch.bool), unbiased=False)
    with pytest.raises(TypeError, match=r"^unbiased must be a bool, got int$"):
        vl_losses.masked_var(one, unbiased=1)


@pytest.mark.parametrize("unbiased", [True, False])
@pytest.mark.parametrize("eps", [1e-8, 0.5])
def test_masked_whiten_by_hand(unbiased, eps):
    v, _, _, m = _batch(2)
    vals = np.array(v[m].tolist())
    mu, var = vals.mean(), vals.var(ddof=1 if unbiased else 0)
    w = vl.masked_whiten(v, m, eps=eps, unbiased=unbiased)
    np.testing.assert_allclose(w[m].numpy(), (vals - mu) / np.sqrt(var + eps), rtol=0, atol=1e-12)
    assert (w[~m] == 0).all()
    s = vl.masked_whiten(v, m, shift_mean=False, eps=eps, unbiased=unbiased)
    np.testing.assert_allclose(s[m].numpy(), (vals - mu) / np.sqrt(var + eps) + mu, rtol=0, atol=1e-12)
    assert (s[~m] == 0).all()
    assert vl.masked_whiten(v.float(), m, unbiased=unbiased).dtype == torch.float32


def test_masked_whiten_edges():
    big = torch.tensor([3e38, -3e38, 0.0], dtype=torch.float32)
    out = vl.masked_whiten(big)  # on the scale of 3e38: no overflow
    torch.testing.assert_close(out, torch.tensor([1.0, -1.0, 0.0]), rtol=1e-6, atol=1e-6)
    same = torch.tensor([2.0, 2.0, 2.0], dtype=torch.float64)
    assert vl.masked_whiten(same, eps=0.0).tolist() == [0.0, 0.0, 0.0]  # no spread, no eps: the centred values
    assert vl.masked_whiten(same, eps=0.0, unbiased=False).tolist() == [0.0, 0.0, 0.0]
    assert vl.masked_whiten(same, eps=0.0, shift_mean=False).tolist() == [2.0, 2.0, 2.0]
    assert vl.masked_whiten(same, eps=0.0, shift_mean=False, unbiased=False).tolist() == [2.0, 2.0, 2.0]
    two = torch.tensor([1.0, 3.0], dtype=torch.float64)
    assert vl.masked_whiten(two, eps=0.0).tolist() == pytest.approx([-1 / np.sqrt(2), 1 / np.sqrt(2)], abs=1e-15)
    assert vl.masked_whiten(two).tolist() == pytest.approx([-1 / np.sqrt(2 + 1e-8), 1 / np.sqrt(2 + 1e-8)], abs=1e-15)
    assert vl.masked_whiten(torch.tensor([0.0, 1e-3], dtype=torch.float64)).tolist() == pytest.approx(
        [-0.5e-3 / np.sqrt(0.5e-6 + 1e-8), 0.5e-3 / np.sqrt(0.5e-6 + 1e-8)], rel=1e-12)  # eps inside the root
    with pytest.raises(ValueError, match=r"^mask must select at least two entries to whiten \(unbiased variance\)$"):
        vl.masked_whiten(torch.tensor([1.0, 2.0]), torch.tensor([True, False]))
    with pytest.raises(ValueError, match=r"^eps must be non-negative, got -1\.0$"):
        vl.masked_whiten(two, eps=-1.0)
    with pytest.raises(TypeError, match=r"^unbiased must be a bool, got NoneType$"):
        vl.masked_whiten(two, unbiased=None)
    with pytest.raises(TypeError, match=r"^x must be a torch\.Tensor, got list$"):
        vl.masked_whiten([1.0, 2.0])
    with pytest.raises(TypeError, match=r"^x must be a torch\.Tensor, got list$"):
        vl.masked_mean([1.0, 2.0])
    with pytest.raises(TypeError, match=r"^x must be a torch\.Tensor, got list$"):
        vl_losses.masked_var([1.0, 2.0])


@pytest.mark.parametrize("aggregation", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
def test_aggregate_by_hand(aggregation):
    from valuelab.losses import aggregate

    v, _, _, m = _batch(3)
    rows = [r for r in _valid_rows(v, m) if r]
    if aggregation == "token-mean":
        want = sum(sum(r) for r in rows) / sum(len(r) for r in rows)
    elif aggregation == "seq-mean-token-mean":
        want = sum(sum(r) / len(r) for r in rows) / len(rows)
    else:
        want = sum(sum(r) for r in rows) / len(rows)
    assert aggregate(v, m.double(), aggregation).item() == pytest.approx(want, abs=1e-12)
    one = torch.tensor([1.0, 2.0, 4.0], dtype=torch.float64)  # 1-D: one sequence
    assert aggregate(one, torch.tensor([1.0, 1.0, 0.0], dtype=torch.float64), aggregation).item() == pytest.approx(
        {"token-mean": 1.5, "seq-mean-token-mean": 1.5, "seq-mean-token-sum": 3.0}[aggregation])
    assert aggregate(v, torch.zeros_like(v), aggregation).item() == 0.0  # nothing valid: 0, not NaN
    assert aggregate(v, m.double()).item() == pytest.approx(aggregate(v, m.double(), "token-mean").item())
    with pytest.raises(ValueError, match=r"^aggregation must be one of \('token-mean', 'seq-mean-token-mean', "
                                         r"'seq-mean-token-sum'\), got 'sum'$"):
        aggregate(v, m.double(), "sum")


@pytest.mark.parametrize("aggregation", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
@pytest.mark.parametrize("clip", [None, 0.2])
def test_value_loss_and_its_gradient_by_hand(aggregation, clip):
    v, ret, old, m = _batch(4)
    v = v.clone().requires_grad_()
    loss = vl.value_loss(v, ret, mask=m, old_values=old, clip_range=clip, aggregation=aggregation)
    per = (v.detach() - ret) ** 2
    if clip is not None:
        clipped = old + (v.detach() - old).clamp(-clip, clip)
        per = torch.maximum(per, (clipped - ret) ** 2)
        assert bool(((clipped - ret) ** 2 > (v.detach() - ret) ** 2)[m].any())  # the clip binds somewhere
    rows = [per[i][m[i]] for i in range(per.shape[0]) if m[i].any()]
    if aggregation == "token-mean":
        want = 0.5 * float(torch.cat(rows).mean())
    elif aggregation == "seq-mean-token-mean":
        want = 0.5 * sum(float(r.mean()) for r in rows) / len(rows)
    else:
        want = 0.5 * sum(float(r.sum()) for r in rows) / len(rows)
    assert loss.item() == pytest.approx(want, abs=1e-12)
    loss.backward()
    eps = 1e-6
    for i, j in [(0, 0), (0, 4), (1, 2), (3, 0), (4, 3), (2, 1)]:  # central differences, padding included
        vp, vm = v.detach().clone(), v.detach().clone()
        vp[i, j] += eps
        vm[i, j] -= eps
        num = (vl.value_loss(vp, ret, mask=m, old_values=old, clip_range=clip, aggregation=aggregation)
               - vl.value_loss(vm, ret, mask=m, old_values=old, clip_range=clip, aggregation=aggregation)) / (2 * eps)
        assert v.grad[i, j].item() == pytest.approx(num.item(), abs=1e-6), (i, j)


@pytest.mark.parametrize("aggregation", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
def test_global_count_is_the_denominator(aggregation):
    v, ret, old, m = _batch(5)
    per = (v - ret) ** 2
    if aggregation == "token-mean":
        num = float((per * m).sum())
    else:
        per_seq = (per * m).sum(-1)
        if aggregation == "seq-mean-token-mean":
            per_seq = per_seq / m.sum(-1).clamp(min=1)
        num = float(per_seq.sum())
    got = vl.value_loss(v, ret, mask=m, aggregation=aggregation, global_count=20.0)  # >= the 15 tokens (5 sequences) here
    assert got.item() == pytest.approx(0.5 * num / 20.0, abs=1e-12)
    local = 15 if aggregation == "token-mean" else 5
    assert vl.value_loss(v, ret, mask=m, aggregation=aggregation, global_count=local).item() == pytest.approx(0.5 * num / local, abs=1e-12)
    with pytest.raises(ValueError, match=r"^global_count must be at least this rank's count"):  # issue 25: below the local count
        vl.value_loss(v, ret, mask=m, aggregation=aggregation, global_count=local - 0.5)
    with pytest.raises(ValueError, match=r"^global_count must be positive, got 0$"):
        vl.value_loss(v, ret, mask=m, aggregation=aggregation, global_count=0)
    with pytest.raises(ValueError, match=r"^global_count must be non-negative, got -1\.0$"):
        vl.value_loss(v, ret, mask=m, aggregation=aggregation, global_count=-1)


def test_value_loss_messages():
    v = torch.zeros(2, 3)
    with pytest.raises(ValueError, match=r"^clip_range needs old_values \(the critic's values when the targets were built\)$"):
        vl.value_loss(v, v, clip_range=0.2)
    with pytest.raises(ValueError, match=r"^clip_range must be non-negative, got -0\.2$"):
        vl.value_loss(v, v, old_values=v, clip_range=-0.2)
    with pytest.raises(ValueError, match=r"^aggregation must be one of \('token-mean', 'seq-mean-token-mean', "
                                         r"'seq-mean-token-sum'\), got 'mean'$"):
        vl.value_loss(v, v, aggregation="mean")
    with pytest.raises(TypeError, match=r"^values must be a torch\.Tensor, got list$"):
        vl.value_loss([0.0], v)
    with pytest.raises(ValueError, match=r"^returns must have the same shape as values: \(3,\) != \(2, 3\)$"):
        vl.value_loss(v, torch.zeros(3))
    with pytest.raises(ValueError, match=r"^old_values must have the same shape as values: \(3,\) != \(2, 3\)$"):
        vl.value_loss(v, v, old_values=torch.zeros(3), clip_range=0.1)
    big = torch.tensor([3e38], dtype=torch.float32)
    with pytest.raises(ValueError, match=r"^values and returns are finite but differ too much for torch\.float32: the squared "
                                         r"error overflows; scale the returns \(or use float64\)$"):
        vl.value_loss(big, -big)
    assert vl.value_loss(torch.tensor([1.0, 3.0]), torch.zeros(2)).item() == pytest.approx(0.5 * (1 + 9) / 2)  # no mask


@pytest.mark.parametrize("scale", [1.0, 0.1])  # 0.1: returns of variance below 1
def test_value_loss_stats_by_hand(scale):
    from valuelab.distributed import demo_batch

    v, ret, old, m = (x * scale if x.is_floating_point() else x for x in demo_batch(6, rows=24, length=9))
    st = vl.value_loss_stats(v, ret, mask=m, old_values=old, clip_range=0.1 * scale, aggregation="seq-mean-token-sum")
    assert isinstance(st, vl_losses.ValueLossStats)
    assert st.loss.item() == pytest.approx(vl.value_loss(v, ret, mask=m, old_values=old, clip_range=0.1 * scale,
                                                         aggregation="seq-mean-token-sum").item(), abs=1e-12)
    vv, gg, oo = v[m].numpy(), ret[m].numpy(), old[m].numpy()
    clipped = oo + np.clip(vv - oo, -0.1 * scale, 0.1 * scale)
    binds = ((clipped - gg) ** 2 > (vv - gg) ** 2).mean()
    assert binds != ((clipped - gg) ** 2 > 2 * (vv - gg)).mean()  # the data tell a square from a double
    assert 0 < binds < 1 and st.clip_fraction.item() == pytest.approx(binds, abs=1e-12)
    assert st.explained_variance.item() == pytest.approx(1 - np.var(gg - vv) / np.var(gg), abs=1e-12)
    assert st.clip_fraction.dtype == torch.float64 and st.explained_variance.dtype == torch.float64
    f = vl.value_loss_stats(v.float(), ret.float(), mask=m)
    assert f.clip_fraction.item() == 0.0 and f.clip_fraction.dtype == torch.float32 and f.explained_variance.dtype == torch.float32
    assert f.explained_variance.item() == pytest.approx(1 - np.var(gg - vv) / np.var(gg), abs=1e-5)
    with pytest.raises(ValueError, match=r"^returns have no spread over the valid tokens: the explained variance is undefined$"):
        vl.value_loss_stats(v, torch.ones_like(ret), mask=m)


# ---------------------------------------------------------------------------
# the same statistics over a process group of one rank: what they are without one
# ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def solo_group(tmp_path_factory):
    dist = pytest.importorskip("torch.distributed")
    if not dist.is_available():
        pytest.skip("torch.distributed is not available")
    if dist.is_initialized():
        yield dist.group.WORLD
        return
    store = tmp_path_factory.mktemp("solo") / "store"
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    try:
        yield dist.group.WORLD
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_one_rank_group_gives_the_local_statistics(solo_group, dtype):
    v, ret, old, m = _batch(7, dtype=dtype)
    tol = dict(rtol=0, atol=1e-12 if dtype == torch.float64 else 1e-6)
    g = solo_group
    torch.testing.assert_close(vl.masked_mean(v, m, group=g), vl.masked_mean(v, m), **tol)
    assert vl.masked_mean(v, m, group=g).dtype == dtype
    torch.testing.assert_close(vl.masked_mean(v, torch.zeros_like(m), group=g), torch.zeros((), dtype=dtype))
    for unbiased in (True, False):
        torch.testing.assert_close(vl_losses.masked_var(v, m, unbiased=unbiased, group=g), vl_losses.masked_var(v, m, unbiased=unbiased), **tol)
        assert vl_losses.masked_var(v, m, unbiased=unbiased, group=g).dtype == dtype
        for shift in (True, False):
            for eps in (1e-8, 0.3):
                torch.testing.assert_close(vl.masked_whiten(v, m, shift_mean=shift, eps=eps, unbiased=unbiased, group=g),
                                           vl.masked_whiten(v, m, shift_mean=shift, eps=eps, unbiased=unbiased), **tol)
    same = torch.full((2, 3), 2.0, dtype=dtype)
    assert vl.masked_whiten(same, eps=0.0, group=g).tolist() == [[0.0] * 3] * 2
    assert vl.masked_whiten(same, eps=0.0, shift_mean=False, group=g).tolist() == [[2.0] * 3] * 2
    for agg in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum"):
        for clip in (None, 0.1):
            a = v.clone().requires_grad_()
            b = v.clone().requires_grad_()
            la = vl.value_loss(a, ret, mask=m, old_values=old, clip_range=clip, aggregation=agg, group=g)
            lb = vl.value_loss(b, ret, mask=m, old_values=old, clip_range=clip, aggregation=agg)
            torch.testing.assert_close(la, lb, **tol)
            la.backward()
            lb.backward()
            torch.testing.assert_close(a.grad, b.grad, **tol)
    sa = vl.value_loss_stats(v, ret, mask=m, old_values=old, clip_range=0.1, group=g)
    sb = vl.value_loss_stats(v, ret, mask=m, old_values=old, clip_range=0.1)
    for x, y in zip(sa, sb):
        torch.testing.assert_close(x, y, **tol)


def test_one_rank_group_refusals(solo_group):
    x = torch.ones(2, 3, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"^dim must be None with group \(the mean over the whole distributed batch\)$"):
        vl.masked_mean(x, group=solo_group, dim=0)
    one = torch.tensor([[True, False, False], [False, False, False]])
    with pytest.raises(ValueError, match=r"^mask must select at least 2 entries over the ranks for the unbiased variance$"):
        vl_losses.masked_var(x, one, group=solo_group)
    with pytest.raises(ValueError, match=r"^mask must select at least 1 entries over the ranks for the biased variance$"):
        vl_losses.masked_var(x, torch.zeros_like(one), unbiased=False, group=solo_group)
    with pytest.raises(ValueError, match=r"^mask must select at least 2 entries over the ranks for the unbiased variance$"):
        vl.masked_whiten(x, one, group=solo_group)
    assert vl_losses.masked_var(x, one, unbiased=False, group=solo_group).item() == 0.0


def test_statistics_edges():
    one = torch.tensor([[5.0, 7.0, 9.0]], dtype=torch.float64)
    first = torch.tensor([[True, False, False]])
    assert vl.masked_mean(one, first).item() == 5.0  # one valid entry: its value
    two = torch.tensor([[True, False, True]])
    assert vl_losses.masked_var(one, two).item() == pytest.approx(8.0)  # two entries suffice for the unbiased variance
    # each row on its own scale: a row of 1e-300 next to a row of 1e300 keeps its own mean
    rows = torch.tensor([[1e300, 1e300], [1e-300, 3e-300]], dtype=torch.float64)
    got = vl.masked_mean(rows, torch.ones(2, 2, dtype=torch.bool), dim=-1)
    assert got[0].item() == pytest.approx(1e300, rel=1e-12, abs=0) and got[1].item() == pytest.approx(2e-300, rel=1e-12, abs=0)
    # the biased (or distributed) whitening divides by sqrt(var + eps) even when var < eps
    tiny = torch.tensor([0.0, 1e-5], dtype=torch.float64)
    w = vl.masked_whiten(tiny, unbiased=False)
    assert w.tolist() == pytest.approx([-5e-6 / np.sqrt(2.5e-11 + 1e-8), 5e-6 / np.sqrt(2.5e-11 + 1e-8)], rel=1e-12)
    with pytest.raises(TypeError, match=r"^unbiased must be a bool, got int$"):
        vl.masked_whiten(tiny, unbiased=1)
    with pytest.raises(ValueError, match=r"^mask must select at least 1 entries for the biased variance$"):
        vl.masked_whiten(tiny, torch.zeros(2, dtype=torch.bool), unbiased=False)


def test_value_loss_stats_passes_global_count():
    v, ret, old, m = _batch(8)
    st = vl.value_loss_stats(v, ret, mask=m, old_values=old, clip_range=0.1, global_count=20.0)
    want = vl.value_loss(v, ret, mask=m, old_values=old, clip_range=0.1, global_count=20.0)
    assert st.loss.item() == pytest.approx(want.item(), abs=1e-15)
    assert st.loss.item() != pytest.approx(vl.value_loss(v, ret, mask=m, old_values=old, clip_range=0.1).item(), abs=1e-6)


def test_one_rank_group_edges(solo_group):
    g = solo_group
    one = torch.tensor([[5.0, 7.0, 9.0]], dtype=torch.float64)
    assert vl.masked_mean(one, torch.tensor([[True, False, False]]), group=g).item() == 5.0
    assert vl_losses.masked_var(one, torch.tensor([[True, False, True]]), group=g).item() == pytest.approx(8.0)
    # float32 data are summed in float64: 1e8 + 1 - 1e8 keeps its 1
    x = torch.tensor([1e8, 1.0, -1e8], dtype=torch.float32)
    assert vl.masked_mean(x, group=g).item() == pytest.approx(1 / 3, rel=1e-6)
    assert vl_losses.masked_var(torch.tensor([1e8, 1e8 + 8.0, 1e8 + 16.0], dtype=torch.float32), group=g).item() == pytest.approx(64.0)
    # and centred in float64: the mean 1e8 + 16/3 is not a float32 number
    dev = np.array([-16 / 3, 8 / 3, 8 / 3])
    want = dev / np.sqrt((dev ** 2).sum() / 2 + 1e-8)
    for unbiased in (True, False):
        w = vl.masked_whiten(torch.tensor([1e8, 1e8 + 8.0, 1e8 + 8.0], dtype=torch.float32), group=g, unbiased=unbiased)
        scale = 1.0 if unbiased else np.sqrt(3 / 2) * np.sqrt(((dev ** 2).sum() / 2 + 1e-8) / ((dev ** 2).sum() / 2 + 1.5e-8))
        assert w.tolist() == pytest.approx(list(want * scale), abs=1e-5)


def test_single_token_aggregate_and_stats_dtypes():
    from valuelab.losses import aggregate

    x = torch.tensor([[3.0, 5.0]], dtype=torch.float64)
    one = torch.tensor([[1.0, 0.0]], dtype=torch.float64)
    for agg in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum"):
        assert aggregate(x, one, agg).item() == 3.0  # one valid token: its value
    v, ret, old, m = _batch(9)
    assert vl.value_loss_stats(v, ret, mask=m).clip_fraction.dtype == torch.float64
    f = vl.value_loss_stats(v.float(), ret.float(), mask=m, old_values=old.float(), clip_range=0.1)
    assert f.clip_fraction.dtype == torch.float32 and f.explained_variance.dtype == torch.float32
