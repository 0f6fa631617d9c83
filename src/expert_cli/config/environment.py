"""What this machine can do: torch, CUDA, the GPU, bf16/TF32, attention kernels, fused-kernel
library (Liger), bitsandbytes.

`probe_environment` imports torch, so call it from inside a command, never at import time.
Resolution takes an `Environment` value, so tests can describe a GPU machine on a CPU one.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import platform
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field

import torch


@dataclass(frozen=True)
class Environment:
    """A snapshot of the machine's training capabilities."""

    python: str = platform.python_version()
    torch: str | None = None
    cuda: str | None = None
    gpu_count: int = 0
    gpu_name: str | None = None
    gpu_capability: tuple[int, int] | None = None
    gpu_memory_gb: float | None = None
    bf16: bool = False
    tf32: bool = False
    flash_attn: str | None = None
    flash_attn_4: str | None = None
    torch_varlen: bool = False
    flex_attention: bool = False
    liger_kernel: str | None = None
    bitsandbytes: str | None = None
    cpu_count: int = 1
    # training processes on this machine (torchrun's and accelerate's LOCAL_WORLD_SIZE), who
    # share its CPUs
    local_processes: int = 1
    packages: dict[str, str | None] = field(default_factory=dict)

    @property
    def has_gpu(self) -> bool:
        return self.gpu_count > 0

    def to_dict(self) -> dict[str, object]:
        data = asdict(self)
        data["gpu_capability"] = (
            ".".join(map(str, self.gpu_capability)) if self.gpu_capability else None
        )
        return data


def package_version(name: str) -> str | None:
    """Installed version of a distribution, or None."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def usable_cpus() -> int:
    """CPUs this process may use (affinity-aware)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _has_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False


# processes per node, as torchrun / accelerate, MPI and Slurm launchers say it
LOCAL_SIZE_VARIABLES = ("LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "SLURM_NTASKS_PER_NODE")


def local_processes(env: Mapping[str, str]) -> int:
    """Training processes a launcher started on this machine (the first of
    LOCAL_SIZE_VARIABLES set to a number; 1 when none is, at most 1024)."""
    for name in LOCAL_SIZE_VARIABLES:
        value = env.get(name, "")
        if value.isdigit() and int(value) > 0:
            return min(int(value), 1024)
    return 1


def crowded_gpus(env: Environment) -> str | None:
    """Why this machine cannot give each of its training processes a GPU of its own: more
    processes than the several GPUs they see (`--nproc_per_node 8` on a 4-GPU machine put two
    processes on a card, and NCCL stopped them with a traceback). None when each can have one;
    processes that see one GPU each (a launcher that sets CUDA_VISIBLE_DEVICES) are not told
    apart from ones that share it, and are let through."""
    if 1 < env.gpu_count < env.local_processes:
        return (
            f"{env.local_processes} training processes on this machine, and {env.gpu_count} GPUs: "
            f"start at most {env.gpu_count} (torchrun --nproc_per_node {env.gpu_count}, "
            f"accelerate launch --num_processes {env.gpu_count}); each process takes a GPU"
        )
    return None


def cpu_environment() -> Environment:
    """A machine with no GPU, for tests and for resolving without importing torch."""
    return Environment(cpu_count=usable_cpus())


def hardware_bf16(capability: tuple[int, int] | None = None) -> bool:
    """Whether the GPU (`capability`, else the current one's) has bf16 in hardware: Ampere
    and newer, or AMD's. torch's own `is_bf16_supported()` also says yes where it only emulates
    bf16 (a T4, a V100), at a fraction of fp16's speed."""
    if torch.version.hip is not None:
        return True
    if capability is None:
        if not torch.cuda.is_available():
            return False
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        capability = (props.major, props.minor)
    return capability >= (8, 0)


def probe_environment() -> Environment:
    """Inspect this machine (imports torch)."""

    packages = {
        name: package_version(name)
        for name in ("transformers", "peft", "datasets", "accelerate", "bitsandbytes")
    }
    has_flash = importlib.util.find_spec("flash_attn") is not None
    common = dict(
        torch=torch.__version__,
        cuda=torch.version.cuda,
        # flash-attn 2 and flash-attn-4 both install the `flash_attn` module
        flash_attn=package_version("flash-attn") if has_flash else None,
        flash_attn_4=package_version("flash-attn-4") if has_flash else None,
        torch_varlen=_has_module("torch.nn.attention.varlen"),
        flex_attention=_has_module("torch.nn.attention.flex_attention"),
        liger_kernel=package_version("liger-kernel"),
        bitsandbytes=packages["bitsandbytes"],
        cpu_count=usable_cpus(),
        local_processes=local_processes(os.environ),
        packages=packages,
    )
    if not torch.cuda.is_available():
        return Environment(**common)
    props = torch.cuda.get_device_properties(0)
    capability = (props.major, props.minor)
    return Environment(
        gpu_count=torch.cuda.device_count(),
        gpu_name=props.name,
        gpu_capability=capability,
        gpu_memory_gb=round(props.total_memory / 2**30, 1),
        bf16=hardware_bf16(capability),
        tf32=capability >= (8, 0),
        **common,
    )


# what each launcher of several processes sets in every process it starts: torchrun (and
# accelerate launch, which uses it), DeepSpeed's launcher, Slurm's srun, MPI's mpirun, a Ray
# worker (Ray Train sets WORLD_SIZE there itself), SageMaker's training toolkit
LAUNCHER_VARIABLES = (
    "TORCHELASTIC_RUN_ID",
    "CROSS_RANK",
    "SLURM_PROCID",
    "OMPI_COMM_WORLD_RANK",
    "PMI_RANK",
    "PMIX_RANK",
    "RAY_RAYLET_PID",
    "SM_CURRENT_HOST",
)
# Kubeflow's PyTorchJob starts one process per pod and sets only torch's own variables: a pod
# (Kubernetes' service variables) with the whole set is taken as launched
POD_VARIABLES = ("KUBERNETES_SERVICE_HOST", "KUBERNETES_PORT")
RENDEZVOUS_VARIABLES = ("MASTER_ADDR", "MASTER_PORT", "RANK")


def launched(env: Mapping[str, str]) -> bool:
    """Whether a launcher of several processes started this one."""
    if any(v in env for v in LAUNCHER_VARIABLES):
        return True
    return any(v in env for v in POD_VARIABLES) and all(v in env for v in RENDEZVOUS_VARIABLES)


def unlaunched_world(env: Mapping[str, str]) -> str | None:
    """A note when WORLD_SIZE asks for several processes in an environment no launcher made
    (left over in the shell from an earlier job): a run waits for the others to join, for
    as long as it is left. None for one process, or under a launcher."""
    world = env.get("WORLD_SIZE", "")
    if not world.isdigit() or int(world) < 2 or launched(env):
        return None
    rank = env.get("RANK", "unset")
    rank = rank if rank.isdigit() else "not a number"
    return (
        f"WORLD_SIZE is {world} (RANK {rank}) in the environment, but no launcher (torchrun, "
        f"accelerate launch, srun, mpirun, deepspeed) started this process: a run waits for "
        f"the other {int(world) - 1} to join. To train in one process: unset WORLD_SIZE RANK "
        "LOCAL_RANK MASTER_ADDR MASTER_PORT"
    )
