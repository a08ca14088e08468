"""Statistics across data-parallel ranks: 2-4 CPU processes on gloo give what one process gives on the whole batch."""

from __future__ import annotations

import pytest
import torch

import valuelab as vl
from valuelab.distributed import batch_statistics, demo_batch, run_on_ranks, shard_statistics
from valuelab.losses import AGGREGATIONS

SIZES = {2: [9, 7], 3: [2, 8, 6], 4: [3, 1, 5, 7]}  # rows per rank: unequal shards of 16 rows


@pytest.mark.parametrize("world", sorted(SIZES))
def test_ranks_reproduce_the_whole_batch(world):
    values, returns, old, mask = demo_batch(0, rows=sum(SIZES[world]))
    ref = batch_statistics(values, returns, old, mask)
    outs = run_on_ranks(shard_statistics, world, SIZES[world], 0)
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
    values, returns, old, mask = demo_batch(1)
    whole = vl.value_loss(values, returns, mask=mask)
    half = values.shape[0] // 2
    n = float(mask.sum())
    parts = [vl.value_loss(values[s], returns[s], mask=mask[s], global_count=n) for s in (slice(0, half), slice(half, None))]
    torch.testing.assert_close(sum(parts), whole)  # micro-batches add up to the mini-batch's loss
    with pytest.raises(ValueError, match="global_count"):
        vl.value_loss(values, returns, mask=mask, global_count=0)


def test_value_loss_stats_without_a_group():
    values, returns, old, mask = demo_batch(2)
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


def test_run_on_ranks_refuses_what_spawn_cannot_pickle():
    with pytest.raises(TypeError):
        run_on_ranks(lambda rank, world: rank, 2)
    with pytest.raises(ValueError):
        run_on_ranks(shard_statistics, 0)
