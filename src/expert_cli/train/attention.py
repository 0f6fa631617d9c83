"""Attention kernels for packed rows, and torch's own varlen kernel as a transformers backend.

A packed row holds several examples; each token must attend only within its own example.
Kernels that take explicit sequence boundaries (`cu_seq_lens_q`, built by the collator on the
CPU) need no mask at all: flash-attention 4 and 2 (through transformers) and torch's varlen
kernel (`torch.nn.attention.varlen`, registered here as `torch_varlen`). Flex attention and
SDPA get a block-diagonal mask that transformers builds from the restarting position ids;
SDPA with that dense mask is the portable fallback.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from functools import lru_cache
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from expert_cli.environment import Environment

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
    if kernel == "flex_attention":
        return None if env.flex_attention else "this torch has no flex attention"
    if not half:
        return "needs bf16 or fp16"
    if cap < (8, 0):
        return f"needs compute capability 8.0 or newer (this GPU has {cap[0]}.{cap[1]})"
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


def fallback_order(kernel: str) -> list[str]:
    """Kernels to try, in order, if a model rejects `kernel`."""
    return list(KERNEL_ORDER[KERNEL_ORDER.index(kernel) :])


@lru_cache(maxsize=1)
def _varlen_fn() -> Callable[..., Any]:
    """torch's varlen attention with the keyword names of the installed torch (the causal
    flag and GQA switch were renamed between releases)."""
    from torch.nn.attention.varlen import varlen_attn

    params = inspect.signature(varlen_attn).parameters
    causal = {"window_size": (-1, 0)} if "window_size" in params else {"is_causal": True}
    gqa = "enable_gqa" in params

    def call(
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        cu: torch.Tensor,
        max_len: int,
        scale: float | None,
    ) -> torch.Tensor:
        extra = {"enable_gqa": True} if gqa and k.shape[1] != q.shape[1] else {}
        return varlen_attn(q, k, v, cu, cu, max_len, max_len, scale=scale, **causal, **extra)

    return call


def torch_varlen_attention(
    module: Any,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: Any,
    dropout: float = 0.0,
    scaling: float | None = None,
    sliding_window: int | None = None,
    cu_seq_lens_q: torch.Tensor | None = None,
    max_length_q: int | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """A transformers attention function: causal attention within each packed example.

    `query` is [batch, heads, length, dim]; the rows are laid end to end and `cu_seq_lens_q`
    (int32, cumulative example starts over all rows) says where each example begins.
    """
    import torch

    if cu_seq_lens_q is None or max_length_q is None:
        raise RuntimeError(
            "torch_varlen attention needs the batch's sequence boundaries "
            "(cu_seq_lens_q, max_length_q); the packed collator adds them"
        )
    if attention_mask is not None or sliding_window is not None or dropout:
        raise RuntimeError(
            "torch_varlen attention supports neither masks, sliding windows nor attention dropout"
        )
    batch, heads, length, dim = query.shape
    dtype = query.dtype
    if query.is_cuda and dtype not in (torch.bfloat16, torch.float16):  # the kernel is half-only
        dtype = (
            torch.get_autocast_dtype("cuda")
            if torch.is_autocast_enabled("cuda")
            else torch.bfloat16
        )

    def flat(t: torch.Tensor) -> torch.Tensor:
        return t.transpose(1, 2).reshape(batch * length, t.shape[1], dim).to(dtype)

    out = _varlen_fn()(
        flat(query), flat(key), flat(value), cu_seq_lens_q, int(max_length_q), scaling
    )
    return out.view(batch, length, heads, dim).to(query.dtype), None


def register_torch_varlen() -> None:
    """Make `attn_implementation="torch_varlen"` known to transformers (idempotent)."""
    from transformers import AttentionInterface

    AttentionInterface.register(TORCH_VARLEN, torch_varlen_attention)


def check_model_config(kernel: str, config: Any) -> None:
    """Refuse a boundary kernel for a model that needs what it lacks (ValueError naming the
    attention, so the loader falls back to the next kernel)."""
    if kernel != TORCH_VARLEN:
        return
    if getattr(config, "use_sliding_window", False) and getattr(config, "sliding_window", None):
        raise ValueError("attention torch_varlen: this model uses sliding-window attention")
    if getattr(config, "attention_dropout", 0.0):
        raise ValueError("attention torch_varlen: this model trains with attention dropout")
