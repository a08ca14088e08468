"""Run a function on several CPU processes joined by gloo, and the statistics chapter 14 compares across ranks (chapter 14 (:doc:`/chapters/14_trainers`)).

:func:`run_on_ranks` starts ``world_size`` processes (``spawn``), joins them
in a ``torch.distributed`` gloo group through a file in a private temporary
folder, calls ``fn(rank, world_size, *args)`` in each and returns what each
returned (anything ``torch.save`` writes: tensors, and also named tuples,
dataclasses, numpy arrays). :func:`shard_statistics` is such a function:
it takes its rows of a seeded batch and computes valuelab's masked
statistics and value loss with ``group=`` the whole group, so that the
result can be compared with :func:`batch_statistics` on the whole batch in
one process.
"""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any, Callable, Dict, List, Sequence

import torch

from ._engine.checks import check_int, check_like, check_mask, check_memory, check_nonnegative_scalar, check_positive_int, check_seed, check_sequence_tensor, renamed, shown
from .losses import AGGREGATIONS, masked_mean, masked_var, masked_whiten, value_loss_stats

__all__ = ["run_on_ranks", "demo_batch", "batch_statistics", "shard_statistics"]


def _entry(rank: int, fn: Callable, world: int, init_file: str, out_dir: str, args: tuple) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        torch.save(fn(rank, world, *args), os.path.join(out_dir, f"rank{rank}.pt"))
    except (TypeError, ValueError) as e:  # an argument refused: handed back to the caller as the same kind of error
        kind = "TypeError" if isinstance(e, TypeError) else "ValueError"
        with open(os.path.join(out_dir, f"rank{rank}.err"), "w", encoding="utf-8") as f:
            json.dump({"kind": kind, "message": str(e)}, f)
        raise
    finally:
        dist.destroy_process_group()


MAX_RANKS = max(4, os.cpu_count() or 1)
"""The most ranks :func:`run_on_ranks` starts: one process per CPU core of this machine, at least 4 (chapter 14
runs 2, 3 and 4 ranks). More would only share the cores; the bound keeps a large ``world_size`` from forking
the machine to a halt."""


def run_on_ranks(fn: Callable, world_size: int, *args: Any) -> List[Any]:
    """``[fn(0, world_size, *args), ..., fn(world_size - 1, ...)]``, each in its own process of one gloo group.

    ``fn`` must be importable by name (a module-level function), as
    ``spawn`` requires. Its result is anything ``torch.save`` writes; it is
    read back in full (``weights_only=False``: PyTorch's default since 2.6
    refuses a named tuple or a dataclass), which is safe here because the
    file was written by this call's own child process into a private
    folder.

    A TypeError or ValueError raised by ``fn`` on a rank (an argument it
    refused) comes back as the same kind of error, naming the rank, instead
    of PyTorch's ``ProcessRaisedException``; other errors come back as that.
    """
    import torch.multiprocessing as mp

    world_size = check_positive_int(world_size, "world_size")
    if world_size > MAX_RANKS:
        raise ValueError(f"world_size must be at most {MAX_RANKS} (processes on this one machine), got {str(world_size)[:40]}")
    if not callable(fn) or getattr(fn, "__module__", "__main__") == "__main__" or "<" in getattr(fn, "__qualname__", "<"):
        raise TypeError("fn must be a module-level function of an importable module (spawn pickles it by name)")
    with tempfile.TemporaryDirectory() as tmp:  # private (0700): nothing is read from a folder others can write
        try:
            mp.spawn(_entry, args=(fn, world_size, os.path.join(tmp, "init"), tmp, args), nprocs=world_size, join=True)
        except mp.ProcessRaisedException:
            for r in range(world_size):  # the first rank that refused an argument, by rank
                path = os.path.join(tmp, f"rank{r}.err")
                if os.path.exists(path):
                    with open(path, encoding="utf-8") as f:
                        err = json.load(f)
                    raise (TypeError if err["kind"] == "TypeError" else ValueError)(
                        f"fn raised on rank {r} of {world_size}: {err['message']}") from None
            raise
        return [torch.load(os.path.join(tmp, f"rank{r}.pt"), weights_only=False) for r in range(world_size)]


def demo_batch(seed: int = 0, rows: int = 16, length: int = 12):
    """A seeded batch of critic values, targets, frozen values and a right-padded mask (float64).

    ``seed`` in ``[0, 2**63 - 1]``, as every seed of valuelab; ``rows`` and ``length`` positive ints.
    """
    seed = check_seed(seed)
    rows = check_positive_int(rows, "rows")
    length = check_positive_int(length, "length")
    check_memory(rows * length * (4 * 8 + 2 * 1) + rows * 16, "rows" if rows >= length else "length")
    g = torch.Generator().manual_seed(seed)
    values = torch.randn(rows, length, generator=g, dtype=torch.float64)
    returns = values + 0.7 * torch.randn(rows, length, generator=g, dtype=torch.float64)
    old = values + 0.3 * torch.randn(rows, length, generator=g, dtype=torch.float64)
    lengths = torch.randint(0, length + 1, (rows,), generator=g)
    lengths[0] = length
    mask = torch.arange(length)[None] < lengths[:, None]
    return values, returns, old, mask


def batch_statistics(values, returns, old, mask, group=None, clip_range: float = 0.2) -> Dict[str, torch.Tensor]:
    """Masked mean, variances, whitening, the value loss of every aggregation with its gradient, clip fraction and explained variance.

    ``values``, ``returns`` and ``old``: float tensors of one shape; ``mask``
    of that shape. The gradients are taken on a detached copy of
    ``values``: the caller's tensor (and its ``.grad``) is left alone.
    """
    values = check_sequence_tensor(values, "values")
    returns = check_like(returns, "returns", values, "values")
    old = check_like(old, "old", values, "values")
    check_mask(mask, values)
    clip_range = check_nonnegative_scalar(clip_range, "clip_range")  # a number: None (no clip) is value_loss's, not this
    out = renamed(lambda: {  # the statistics' argument x is this function's returns
        "mean": masked_mean(returns, mask, group=group),
        "var_unbiased": masked_var(returns, mask, group=group),
        "var_biased": masked_var(returns, mask, unbiased=False, group=group),
        "whiten": masked_whiten(returns, mask, group=group),
        "whiten_biased": masked_whiten(returns, mask, group=group, unbiased=False),
    }, "x", "returns")
    for agg in AGGREGATIONS:
        v = values.detach().clone().requires_grad_(True)
        st = renamed(lambda: value_loss_stats(v, returns, mask=mask, old_values=old, clip_range=clip_range, aggregation=agg,
                                              group=group), "old_values", "old")
        st.loss.backward()
        out[f"loss_{agg}"] = st.loss.detach()
        out[f"grad_{agg}"] = v.grad
        out["clip_fraction"], out["explained_variance"] = st.clip_fraction, st.explained_variance
    return out


def shard_statistics(rank: int, world_size: int, sizes: Sequence[int], seed: int = 0) -> Dict[str, torch.Tensor]:
    """:func:`batch_statistics` of this rank's rows of :func:`demo_batch` (rank r holds ``sizes[r]`` rows), over the whole group.

    ``sizes``: one non-negative int per rank (``world_size`` of them), not all 0;
    the batch has ``sum(sizes)`` rows, so no rank's share exceeds the whole.
    It runs inside an initialised process group of ``world_size`` ranks in
    which this process is ``rank`` (:func:`run_on_ranks`); elsewhere it is a
    ValueError, never this rank's statistics passed off as the group's.
    """
    import torch.distributed as dist

    world_size = check_positive_int(world_size, "world_size")
    rank = check_int(rank, "rank")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must lie in [0, {world_size - 1}], got {rank}")
    if not isinstance(sizes, (list, tuple)):
        raise TypeError(f"sizes must be a list of {world_size} row counts, one per rank, got {shown(sizes)}")
    if len(sizes) != world_size:
        raise ValueError(f"sizes must be a list of {world_size} row counts, one per rank, got {len(sizes)} of them")
    sizes = [check_int(k, f"sizes[{i}]") for i, k in enumerate(sizes)]
    if min(sizes) < 0 or sum(sizes) == 0:
        raise ValueError(f"sizes must be non-negative row counts, not all 0, got {sizes!r:.80}")
    if not (dist.is_available() and dist.is_initialized()):  # else every statistic would silently be this rank's own
        raise ValueError("world_size: shard_statistics runs on the ranks of an initialised torch.distributed group "
                         "(run_on_ranks starts one); none is initialised in this process")
    if dist.get_world_size() != world_size or dist.get_rank() != rank:
        raise ValueError(f"world_size and rank must be the group's ({dist.get_world_size()}) and this process's "
                         f"({dist.get_rank()}), got {world_size} and {rank}")
    values, returns, old, mask = demo_batch(seed, rows=sum(sizes))
    start = sum(sizes[:rank])
    rows = slice(start, start + sizes[rank])
    return batch_statistics(values[rows], returns[rows], old[rows], mask[rows], dist.group.WORLD)
