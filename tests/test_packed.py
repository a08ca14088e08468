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


# ---------------------------------------------------------------------------
# the exact messages and defaults (each argument is named in its own error)
# ---------------------------------------------------------------------------


def test_each_bad_argument_is_named_in_its_message():
    cu = torch.tensor([0, 2, 3])
    with pytest.raises(TypeError, match=r"^rewards must be a torch\.Tensor, got list$"):
        gae_packed([0.0, 0.0, 0.0], torch.zeros(3), cu)
    with pytest.raises(TypeError, match=r"^values must be a torch\.Tensor, got list$"):
        gae_packed(torch.zeros(3), [0.0, 0.0, 0.0], cu)
    with pytest.raises(TypeError, match=r"^rewards must be a torch\.Tensor, got list$"):
        discounted_returns_packed([0.0, 0.0, 0.0], cu)
    with pytest.raises(ValueError, match=r"^rewards and values must be 1-D packed tensors of one length, got \(3,\) and \(2,\)$"):
        gae_packed(torch.zeros(3), torch.zeros(2), cu)
    with pytest.raises(ValueError, match=r"^rewards must be a 1-D packed tensor, got \(1, 3\)$"):
        discounted_returns_packed(torch.zeros(1, 3), cu)
    with pytest.raises(TypeError, match=r"^cu_seqlens must be a torch\.Tensor, got list$"):
        packing([0, 3], 3)
    with pytest.raises(ValueError, match=r"^cu_seqlens must have shape \(S \+ 1,\) with S >= 1, got \(1, 2\)$"):
        packing(torch.tensor([[0, 3]]), 3)
    with pytest.raises(ValueError, match=r"^cu_seqlens must have shape \(S \+ 1,\) with S >= 1, got \(1,\)$"):
        packing(torch.tensor([0]), 3)


def test_a_decreasing_cu_seqlens_that_ends_right_is_refused():
    with pytest.raises(ValueError, match=r"never decrease .* got \[0, 3, 2, 3\]$"):
        packing(torch.tensor([0, 3, 2, 3]), 3)


def test_the_message_lists_a_short_cu_seqlens_only():
    twelve = torch.tensor([1] + list(range(1, 12)))  # 12 entries, starts at 1
    with pytest.raises(ValueError, match=r"got \[1, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11\]$"):
        packing(twelve, 11)
    thirteen = torch.tensor([1] + list(range(1, 13)))
    with pytest.raises(ValueError, match=r"got a tensor that does not$"):
        packing(thirteen, 12)


def test_default_gamma_is_one():
    r, v, cu, truncated, boot = make(5)
    torch.testing.assert_close(discounted_returns_packed(r, cu), discounted_returns_packed(r, cu, gamma=1.0))
    torch.testing.assert_close(gae_packed(r, v, cu).advantages, gae_packed(r, v, cu, gamma=1.0, lam=0.95).advantages)
    for s in range(len(cu) - 1):
        a, b = int(cu[s]), int(cu[s + 1])
        torch.testing.assert_close(discounted_returns_packed(r, cu)[a:b], r[a:b].flip(0).cumsum(0).flip(0))


def test_packing_indexes_the_padded_layout():
    p = packing(torch.tensor([0, 2, 2, 5], dtype=torch.int32), 5)
    assert p.rows.tolist() == [0, 0, 2, 2, 2] and p.cols.tolist() == [0, 1, 0, 1, 2]
    assert (p.n_seqs, p.width) == (3, 3)
    assert packing(torch.tensor([0, 0]), 0).width == 0


def test_truncated_and_bootstrap_messages():
    r, v, cu = torch.zeros(3), torch.zeros(3), torch.tensor([0, 2, 3])
    cut = torch.tensor([True, False])
    with pytest.raises(ValueError, match=r"^bootstrap is given but truncated is not: say which sequences were cut \(truncated=\.\.\.\)$"):
        gae_packed(r, v, cu, bootstrap=torch.zeros(2))
    with pytest.raises(TypeError, match=r"^truncated must be a bool tensor, one flag per sequence$"):
        gae_packed(r, v, cu, truncated=torch.ones(2))
    with pytest.raises(TypeError, match=r"^truncated must be a bool tensor, one flag per sequence$"):
        gae_packed(r, v, cu, truncated=[True, False])
    with pytest.raises(ValueError, match=r"^truncated must have shape \(2,\), one flag per sequence, got \(3,\)$"):
        gae_packed(r, v, cu, truncated=torch.ones(3, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"^truncated marks sequences as cut: give bootstrap, the value of the state after "
                                         r"each one's last token$"):
        discounted_returns_packed(r, cu, truncated=cut)
    with pytest.raises(TypeError, match=r"^bootstrap must be a torch\.Tensor, got list$"):
        gae_packed(r, v, cu, truncated=cut, bootstrap=[1.0, 2.0])
    with pytest.raises(ValueError, match=r"^bootstrap must have shape \(2,\), got \(3,\)$"):
        gae_packed(r, v, cu, truncated=cut, bootstrap=torch.zeros(3))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_bootstrap_takes_the_dtype_of_the_rewards(dtype):
    r, v, cu, truncated, boot = make(6, empty=False)
    r, v = r.to(dtype), v.to(dtype)
    other = torch.float64 if dtype == torch.float32 else torch.float32
    for b in (boot.to(dtype), boot.to(other)):
        out = gae_packed(r, v, cu, lam=0.9, truncated=truncated, bootstrap=b)
        assert out.advantages.dtype == dtype and out.returns.dtype == dtype
        g = discounted_returns_packed(r, cu, truncated=truncated, bootstrap=b)
        assert g.dtype == dtype
        for s in range(len(cu) - 1):
            last = int(cu[s + 1]) - 1
            want = float(r[last]) + (float(b[s]) if truncated[s] else 0.0)
            assert float(g[last]) == pytest.approx(want, rel=1e-6)
