"""What the training processes agree on under torchrun / accelerate launch (DDP, FSDP,
DeepSpeed): sums, every rank's figures, any-of, the minimum, a barrier (alone, each is a
no-op); and what the Trainer really runs (engine, processes, nodes)."""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.distributed as dist

from expert_cli.config.environment import LOCAL_SIZE_VARIABLES
from expert_cli.errors import UserError


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


def gather_over_ranks(values: list[float]) -> list[list[float]]:
    """Every process's `values`, in rank order (all_gather)."""
    if not initialized():
        return [values]
    t = torch.tensor(values, dtype=torch.float64, device=_device())
    out = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(out, t)
    return [row.tolist() for row in out]


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


def engine(trainer: Any) -> str | None:
    """What the Trainer really runs: "fsdp", "deepspeed", "ddp", or None (one process)."""
    if getattr(trainer, "is_fsdp_enabled", False):
        return "fsdp"
    if getattr(trainer, "is_deepspeed_enabled", False):
        return "deepspeed"
    return "ddp" if trainer.args.world_size > 1 else None


def topology(trainer: Any) -> dict[str, Any]:
    """The run's engine, processes, nodes and backend, for manifest.resolved.json."""
    world = trainer.args.world_size
    per_node = next(
        (int(os.environ[k]) for k in LOCAL_SIZE_VARIABLES if os.environ.get(k, "").isdigit()),
        None if world > 1 else 1,
    )
    return {
        "engine": engine(trainer),
        "world_size": world,
        "nodes": max(1, world // per_node) if per_node else None,  # None: the launcher hid it
        "backend": dist.get_backend() if initialized() else None,
    }


def describe(topology: dict[str, Any], asked: str) -> str:
    """What a multi-process run is, and whether it is the engine the manifest `asked` for (why
    not is the resolution's note: FSDP and DeepSpeed on a machine without GPUs)."""
    engine, world, nodes = topology["engine"], topology["world_size"], topology["nodes"]
    where = f" on {nodes} node{'s' * (nodes > 1)}" if nodes else ""
    text = (
        f"distributed: {engine} over {world} processes{where} "
        f"({topology['backend']}); tokens/s are summed over ranks, data-wait is the slowest "
        "rank's, metrics.json has each rank's"
    )
    if asked != engine:
        text += f"; training.distributed.strategy {asked} was asked, this run is {engine}"
    return text


def refuse_world_change(previous: dict[str, Any], world: int, rows: int) -> None:
    """UserError for a `--resume` on `world` processes of `rows` rows a step each when the run
    began on another number (`previous`: its manifest.resolved.json): every optimizer step
    would take another count of rows, and the loss curve part from the uninterrupted run's.
    Nothing when the number is the same, or was not recorded."""
    runtime = previous.get("runtime") if isinstance(previous.get("runtime"), dict) else {}
    began = runtime.get("world_size")
    if type(began) is not int or began < 1 or began == world:
        return
    topology = runtime.get("distributed") if isinstance(runtime.get("distributed"), dict) else {}
    nodes = topology.get("nodes") if type(topology.get("nodes")) is int else 1
    per_node = f"--nnodes {nodes} --nproc_per_node {began // nodes}" if nodes > 1 else ""
    launch = f"torchrun {per_node or f'--nproc_per_node {began}'} -m expert_cli.cli"
    launch = launch if began > 1 else "expert-cli"
    raise UserError(
        f"--resume: the run trained on {began} process{'es' * (began > 1)} ({began * rows} rows "
        f"a step), this one has {world} ({world * rows} rows a step); continue it as it began: "
        f"{launch} train ... --resume"
    )


# what a collective says when another process of the run went away (killed, out of memory)
PEER_GONE = ("Connection reset by peer", "Connection closed by peer", "Broken pipe")


def peer_lost(exc: BaseException) -> bool:
    """Whether `exc` is a collective failing because another process of the run stopped."""
    if not initialized() or not isinstance(exc, RuntimeError):
        return False
    gone = (getattr(dist, "DistNetworkError", ()), getattr(dist, "DistStoreError", ()))
    return isinstance(exc, gone) or any(text in str(exc) for text in PEER_GONE)


def refuse_differing_data(data: Any) -> None:
    """UserError on every process when the processes' token caches differ (node-local copies
    of the data that are not the same files): they trained on other examples without a word,
    or one ran out of rows first and the others waited for it for ever. Compared by what the
    data holds (rows and tokens of each split), not the fingerprint, which also takes in
    where the files are and, for large ones, when they were written."""
    if not initialized():
        return
    split = data.stats.get("train") if isinstance(data.stats.get("train"), dict) else {}
    counts = [len(data.train), len(data.eval) if data.eval is not None else 0]
    counts += [split.get("tokens") or 0, split.get("trained_tokens") or 0]
    ranks = gather_over_ranks([float(n) for n in counts])
    differ = [i for i, row in enumerate(ranks) if row != ranks[0]]
    if differ:
        first, other, base = differ[0], ranks[differ[0]], ranks[0]
        raise UserError(
            f"the processes do not read the same data: rank {first}'s token cache holds "
            f"{int(other[0])} training rows of {int(other[2])} tokens, rank 0's {int(base[0])} "
            f"of {int(base[2])} (evaluation rows: {int(other[1])} and {int(base[1])}); give "
            "every node the same data files (and the same manifest)"
        )
