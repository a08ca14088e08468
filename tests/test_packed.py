"""valuelab.packed: a packed batch with cu_seqlens gives, sequence by sequence, what a loop over tokens gives."""

from __future__ import annotations

import pytest
import torch

from valuelab.packed import discounted_returns_packed, gae_packed, packing


def loop_gae(r, v, gamma, lam, boot):
    """The recursion of one sequence, written out (chapter 5)."""
    adv, a, nxt = [0.0] * len(r), 0.0, boot
    for t in reversed(range(len(r))):
        delta = r[t] + gamma * nxt - v[t]
        a = delta + gamma * lam * a
        adv[t], nxt = a, v[t]
    return adv


def make(seed, n_seqs=7, max_len=9, empty=True):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0 if empty else 1, max_len + 1, (n_seqs,), generator=g)
    cu = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)])
    n = int(cu[-1])
    r = torch.randn(n, generator=g, dtype=torch.float64)
    v = torch.randn(n, generator=g, dtype=torch.float64)
    truncated = torch.rand(n_seqs, generator=g) < 0.5
    boot = torch.randn(n_seqs, generator=g, dtype=torch.float64)
    return r, v, cu, truncated, boot


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("gamma, lam", [(1.0, 0.95), (0.9, 0.8), (1.0, 1.0), (0.99, 0.0)])
def test_gae_packed_matches_a_loop_per_sequence(seed, gamma, lam):
    r, v, cu, truncated, boot = make(seed)
    out = gae_packed(r, v, cu, gamma=gamma, lam=lam, truncated=truncated, bootstrap=boot)
    for s in range(len(cu) - 1):
        a, b = int(cu[s]), int(cu[s + 1])
        want = loop_gae(r[a:b].tolist(), v[a:b].tolist(), gamma, lam, float(boot[s]) if truncated[s] else 0.0)
        torch.testing.assert_close(out.advantages[a:b], torch.tensor(want, dtype=torch.float64))
        torch.testing.assert_close(out.returns[a:b], out.advantages[a:b] + v[a:b])


@pytest.mark.parametrize("seed", range(4))
def test_returns_packed_match_a_loop_and_gae_with_lambda_one(seed):
    r, v, cu, truncated, boot = make(seed)
    g = discounted_returns_packed(r, cu, gamma=0.9, truncated=truncated, bootstrap=boot)
    for s in range(len(cu) - 1):
        a, b = int(cu[s]), int(cu[s + 1])
        acc, want = (float(boot[s]) if truncated[s] else 0.0), []
        for x in reversed(r[a:b].tolist()):
            acc = x + 0.9 * acc
            want.append(acc)
        torch.testing.assert_close(g[a:b], torch.tensor(want[::-1], dtype=torch.float64))
    lam1 = gae_packed(r, v, cu, gamma=0.9, lam=1.0, truncated=truncated, bootstrap=boot).returns
    torch.testing.assert_close(lam1, g)


def test_a_boundary_stops_the_recursion():
    """Two sequences packed together give what each gives alone: no credit crosses cu_seqlens."""
    r, v, cu, truncated, boot = make(0, empty=False)
    whole = gae_packed(r, v, cu, lam=0.9).advantages
    for s in range(len(cu) - 1):
        a, b = int(cu[s]), int(cu[s + 1])
        alone = gae_packed(r[a:b], v[a:b], torch.tensor([0, b - a]), lam=0.9).advantages
        torch.testing.assert_close(whole[a:b], alone)


def test_truncated_without_bootstrap_is_refused_and_ended_sequences_ignore_it():
    r, v, cu, truncated, boot = make(1)
    with pytest.raises(ValueError, match="bootstrap"):
        gae_packed(r, v, cu, truncated=torch.ones(len(cu) - 1, dtype=torch.bool))
    none_cut = torch.zeros(len(cu) - 1, dtype=torch.bool)
    torch.testing.assert_close(gae_packed(r, v, cu, truncated=none_cut, bootstrap=boot).advantages,
                               gae_packed(r, v, cu).advantages)


def test_gradients_flow_to_rewards_and_values():
    r, v, cu, truncated, boot = make(2)
    r.requires_grad_(True)
    v.requires_grad_(True)
    out = gae_packed(r, v, cu, lam=0.9, truncated=truncated, bootstrap=boot)
    (out.advantages.square().sum() + out.returns.sum()).backward()
    assert torch.isfinite(r.grad).all() and torch.isfinite(v.grad).all() and r.grad.abs().sum() > 0


@pytest.mark.parametrize(
    "cu, error",
    [
        (torch.tensor([1, 3]), ValueError),
        (torch.tensor([0, 3, 2]), ValueError),
        (torch.tensor([0, 2]), ValueError),
        (torch.tensor([0.0, 3.0]), TypeError),
        (torch.tensor([0]), ValueError),
        ([0, 3], TypeError),
    ],
)
def test_bad_cu_seqlens_raise(cu, error):
    with pytest.raises(error, match="cu_seqlens"):
        gae_packed(torch.zeros(3), torch.zeros(3), cu)


def test_other_bad_arguments_raise():
    cu = torch.tensor([0, 2, 3])
    with pytest.raises(ValueError):
        gae_packed(torch.zeros(3), torch.zeros(2), cu)
    with pytest.raises(ValueError):
        gae_packed(torch.zeros(1, 3), torch.zeros(1, 3), cu)
    with pytest.raises(TypeError):
        gae_packed(torch.zeros(3), torch.zeros(3), cu, truncated=torch.ones(2))
    with pytest.raises(ValueError):
        gae_packed(torch.zeros(3), torch.zeros(3), cu, truncated=torch.ones(3, dtype=torch.bool), bootstrap=torch.zeros(3))
    with pytest.raises(ValueError):
        gae_packed(torch.zeros(3), torch.zeros(3), cu, bootstrap=torch.zeros(2))
    assert packing(torch.tensor([0, 0, 3], dtype=torch.int32), 3).width == 3
