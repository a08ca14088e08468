"""Statistics across data-parallel ranks: 2-4 CPU processes on gloo give what one process gives on the whole batch."""

from __future__ import annotations

import os
import tempfile

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import valuelab as vl
from valuelab.losses import AGGREGATIONS, masked_var

SIZES = {2: [9, 7], 3: [2, 8, 6], 4: [3, 1, 5, 7]}  # rows per rank: unequal shards


def whole_batch(seed=0, rows=16, length=12):
    g = torch.Generator().manual_seed(seed)
    values = torch.randn(rows, length, generator=g, dtype=torch.float64)
    returns = values + 0.7 * torch.randn(rows, length, generator=g, dtype=torch.float64)
    old = values + 0.3 * torch.randn(rows, length, generator=g, dtype=torch.float64)
    lengths = torch.randint(0, length + 1, (rows,), generator=g)
    lengths[0] = length
    mask = torch.arange(length)[None] < lengths[:, None]
    return values, returns, old, mask


def statistics(values, returns, old, mask, group):
    """Everything the test compares, computed on one shard (group set) or on the whole batch (group None)."""
    out = {
        "mean": vl.masked_mean(returns, mask, group=group),
        "var_unbiased": masked_var(returns, mask, group=group),
        "var_biased": masked_var(returns, mask, unbiased=False, group=group),
        "whiten": vl.masked_whiten(returns, mask, group=group),
        "whiten_biased": vl.masked_whiten(returns, mask, group=group, unbiased=False),
    }
    for agg in AGGREGATIONS:
        v = values.clone().requires_grad_(True)
        st = vl.value_loss_stats(v, returns, mask=mask, old_values=old, clip_range=0.2, aggregation=agg, group=group)
        st.loss.backward()
        out[f"loss_{agg}"] = st.loss.detach()
        out[f"grad_{agg}"] = v.grad
        out["clip_fraction"], out["explained_variance"] = st.clip_fraction, st.explained_variance
    return out


def _worker(rank, world, init_file, result_dir):
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        values, returns, old, mask = whole_batch()
        start = sum(SIZES[world][:rank])
        rows = slice(start, start + SIZES[world][rank])
        out = statistics(values[rows], returns[rows], old[rows], mask[rows], dist.group.WORLD)
        torch.save(out, os.path.join(result_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("world", sorted(SIZES))
def test_ranks_reproduce_the_whole_batch(world):
    values, returns, old, mask = whole_batch()
    assert sum(SIZES[world]) == values.shape[0]
    ref = statistics(values, returns, old, mask, None)
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_worker, args=(world, os.path.join(tmp, "init"), tmp), nprocs=world, join=True)
        outs = [torch.load(os.path.join(tmp, f"rank{r}.pt")) for r in range(world)]
    for key in ("mean", "var_unbiased", "var_biased", "clip_fraction", "explained_variance"):
        for o in outs:  # every rank holds the global statistic
            torch.testing.assert_close(o[key], ref[key], rtol=1e-12, atol=1e-12)
    for key in ("whiten", "whiten_biased"):  # each rank whitens its rows with the global statistics
        torch.testing.assert_close(torch.cat([o[key] for o in outs]), ref[key], rtol=1e-12, atol=1e-12)
    for agg in AGGREGATIONS:  # the ranks' terms add up to the loss, their gradients to its gradient
        torch.testing.assert_close(sum(o[f"loss_{agg}"] for o in outs), ref[f"loss_{agg}"], rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(torch.cat([o[f"grad_{agg}"] for o in outs]), ref[f"grad_{agg}"], rtol=1e-12, atol=1e-12)
    assert not torch.allclose(ref["var_unbiased"], ref["var_biased"])


def test_global_count_divides_the_local_sum():
    values, returns, old, mask = whole_batch(1)
    whole = vl.value_loss(values, returns, mask=mask)
    half = values.shape[0] // 2
    n = float(mask.sum())
    parts = [vl.value_loss(values[s], returns[s], mask=mask[s], global_count=n) for s in (slice(0, half), slice(half, None))]
    torch.testing.assert_close(sum(parts), whole)  # micro-batches add up to the mini-batch's loss
    with pytest.raises(ValueError, match="global_count"):
        vl.value_loss(values, returns, mask=mask, global_count=0)


def test_value_loss_stats_without_a_group():
    values, returns, old, mask = whole_batch(2)
    st = vl.value_loss_stats(values, returns, mask=mask, old_values=old, clip_range=0.2)
    torch.testing.assert_close(st.loss, vl.value_loss(values, returns, mask=mask, old_values=old, clip_range=0.2))
    v, g, o = values[mask], returns[mask], old[mask]
    binds = ((o + (v - o).clamp(-0.2, 0.2) - g) ** 2 > (v - g) ** 2).double().mean()
    torch.testing.assert_close(st.clip_fraction, binds)
    torch.testing.assert_close(st.explained_variance, 1 - (g - v).var(unbiased=False) / g.var(unbiased=False))
    assert float(vl.value_loss_stats(values, returns, mask=mask).clip_fraction) == 0.0
    with pytest.raises(ValueError, match="spread"):
        vl.value_loss_stats(values, torch.ones_like(returns), mask=mask)


def test_group_without_an_initialised_process_group_raises():
    x = torch.ones(2, 3)
    with pytest.raises(ValueError, match="group"):
        vl.masked_mean(x, group=object())
    with pytest.raises(ValueError, match="group"):
        vl.value_loss(x, x, group=object())
