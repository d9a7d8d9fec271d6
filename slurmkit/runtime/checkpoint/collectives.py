"""The torch.distributed helpers, usable without torch: this process's rank, and the
collectives that make all ranks agree on a step or take rank 0's value (no-ops without an
initialized process group).
"""

from __future__ import annotations

import os
import sys


def rank() -> int:
    """This process's rank: torch.distributed's once initialized, else ``RANK``, else 0."""
    if distributed():
        return int(sys.modules["torch.distributed"].get_rank())
    return int(os.environ.get("RANK") or 0)


def agree_step(step: int | None) -> int | None:
    """The step every rank can resume from: the minimum of ``step`` over all ranks.

    ``None`` (no checkpoint) on any rank gives ``None``. Without an initialized
    ``torch.distributed`` this returns ``step`` itself.
    """
    if not distributed():
        return step
    agreed = collective(-1 if step is None else step, "min")
    return None if agreed < 0 else agreed


def distributed() -> bool:
    """Whether torch.distributed is loaded and its process group initialized."""
    dist = sys.modules.get("torch.distributed")
    return dist is not None and dist.is_available() and dist.is_initialized()


def collective(value: int, op: str) -> int:
    """``value`` reduced over all ranks (``"min"``), or rank 0's (``"broadcast"``)."""
    import torch
    import torch.distributed as dist

    device = (
        torch.device("cuda", torch.cuda.current_device())
        if dist.get_backend() == "nccl"
        else torch.device("cpu")
    )
    tensor = torch.tensor([value], dtype=torch.int64, device=device)
    if op == "min":
        dist.all_reduce(tensor, op=dist.ReduceOp.MIN)
    else:
        dist.broadcast(tensor, src=0)
    return int(tensor.item())
