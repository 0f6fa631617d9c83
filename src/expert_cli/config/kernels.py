"""The attention kernels a run can use for packed rows, and which one it takes.

Packed rows hold several examples; every kernel here keeps each token within its own example.
The varlen ones (`BOUNDARY_KERNELS`) read the example boundaries the collator computes; flex
and sdpa get the block-diagonal mask transformers builds from restarting position ids. The
kernels themselves are in expert_cli.train.attention.
"""

from __future__ import annotations

from expert_cli.config.environment import Environment

TORCH_VARLEN = "torch_varlen"
# Fastest first; auto takes the first usable one. On an H100 with Qwen3-0.6B LoRA, 8 packed rows
# of 2048 (docs/PERFORMANCE.md): flash_attention_4 61.4k tokens/s, torch_varlen 52.4k, flex
# 50.7k, sdpa with the block mask 48.4k. flash-attn 2 was not installed there; torch's varlen
# kernel is FA2's own code, so it sits beside it.
KERNEL_ORDER = (
    "flash_attention_4",
    "flash_attention_2",
    TORCH_VARLEN,
    "flex_attention",
    "sdpa",
    "eager",
)
# Kernels that read the batch's explicit sequence boundaries (no mask is built).
BOUNDARY_KERNELS = frozenset({"flash_attention_4", "flash_attention_2", TORCH_VARLEN})


def kernel_unusable(kernel: str, env: Environment, half: bool) -> str | None:
    """Why `kernel` cannot run on `env` (None when it can)."""
    cap = env.gpu_capability or (0, 0)
    if kernel in ("sdpa", "eager"):
        return None
    if not env.has_gpu:
        return "needs a CUDA GPU"
    older = f"needs compute capability 8.0 or newer (this GPU has {cap[0]}.{cap[1]})"
    if kernel == "flex_attention":
        # its Triton kernels ask for more shared memory than a T4 has (64 KB an SM): out of
        # resource there, as issues of torch and vLLM report; below Ampere sdpa runs
        if cap < (8, 0):
            return older
        return None if env.flex_attention else "this torch has no flex attention"
    if not half:
        return "needs bf16 or fp16"
    if cap < (8, 0):
        return older
    if kernel == "flash_attention_4":
        if env.flash_attn_4 is None:
            return "flash-attn-4 is not installed"
        return None if cap[0] in (9, 10) else "runs on Hopper and Blackwell GPUs only"
    if kernel == "flash_attention_2":
        return None if env.flash_attn is not None else "flash-attn is not installed"
    if kernel == TORCH_VARLEN:
        return None if env.torch_varlen else "this torch has no torch.nn.attention.varlen"
    return f"unknown kernel {kernel!r}"


def choose_kernel(
    requested: str,
    env: Environment,
    half: bool,
    notes: list[str],
    exclude: frozenset[str] = frozenset(),
) -> str:
    """The kernel for this run: `requested` when it can run here, else (or for "auto") the
    first usable one in KERNEL_ORDER that is not excluded; an unmet request is noted."""
    if requested != "auto":
        why = kernel_unusable(requested, env, half)
        if why is None:
            return requested
        notes.append(f"attention: {requested} {why}; choosing automatically")
    return next(
        k for k in KERNEL_ORDER if k not in exclude and kernel_unusable(k, env, half) is None
    )
