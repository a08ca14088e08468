"""Sums across data-parallel ranks for the masked statistics and the value loss (chapter 6 (:doc:`/chapters/06_value_loss`)).

A statistic over "the batch" is over the *global* batch when each rank holds
a shard: the sums and counts are all-reduced, never the per-rank means (a
mean of means weighs a rank with few valid tokens like one with many). The
all-reduced sum carries the gradient of the local entries only, which is the
gradient each rank needs for its own shard.
"""

from __future__ import annotations

from typing import Any, Optional

import torch

__all__ = ["check_group", "all_sum", "global_sums"]


def check_group(group: Any) -> Optional[Any]:
    """``None`` (local) or a process group of an initialised ``torch.distributed``; else ``ValueError``/``TypeError`` naming ``group``."""
    if group is None:
        return None
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        raise ValueError("group is given but torch.distributed is not initialised (init_process_group first)")
    if not isinstance(group, dist.ProcessGroup):
        raise TypeError(f"group must be a torch.distributed ProcessGroup or None, got {type(group).__name__}")
    return group


def all_sum(t: torch.Tensor, group: Any) -> torch.Tensor:
    """A copy of ``t`` summed over the ranks of ``group`` (float64 for the exchange; no gradient)."""
    import torch.distributed as dist

    out = t.detach().to(torch.float64).clone()
    if out.device.type == "cpu" or dist.get_backend(group) != "gloo":
        dist.all_reduce(out, op=dist.ReduceOp.SUM, group=group)
    else:  # gloo reduces CPU tensors only
        cpu = out.cpu()
        dist.all_reduce(cpu, op=dist.ReduceOp.SUM, group=group)
        out = cpu.to(t.device)
    return out


def global_sums(group: Any, *local: torch.Tensor) -> torch.Tensor:
    """Several scalar sums over the ranks in one all-reduce (float64); each keeps its own local gradient.

    With ``group`` None the sums are the local ones, in float64.
    """
    stacked = torch.stack([x.to(torch.float64).reshape(()) for x in local])
    if group is None:
        return stacked
    return all_sum(stacked, group) + (stacked - stacked.detach())
