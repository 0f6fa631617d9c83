"""What the training processes agree on under torchrun / accelerate launch (DDP, FSDP,
DeepSpeed): sums, any-of, the minimum, a barrier. Alone, each is a no-op."""

from __future__ import annotations

import torch
import torch.distributed as dist


def initialized() -> bool:
    """Whether this process is one of several (a process group is up)."""
    return dist.is_available() and dist.is_initialized()


def _device() -> str:
    return "cuda" if dist.get_backend() == "nccl" else "cpu"


def sum_over_ranks(values: list[float]) -> list[float]:
    """`values` summed element-wise over every process."""
    if not initialized():
        return values
    t = torch.tensor(values, dtype=torch.float64, device=_device())
    dist.all_reduce(t)
    return t.tolist()


def any_rank(flag: bool) -> bool:
    """True when `flag` is true on any process."""
    return sum_over_ranks([1.0 if flag else 0.0])[0] > 0


def min_over_ranks(value: int) -> int:
    """The smallest `value` of any process."""
    if not initialized():
        return value
    t = torch.tensor([value], dtype=torch.int64, device=_device())
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return int(t.item())


def barrier() -> None:
    """Wait for every process."""
    if initialized():
        dist.barrier()
