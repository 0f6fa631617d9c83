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
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import lru_cache
from typing import Any

import torch
from torch.nn.attention import varlen
from transformers import AttentionInterface

from expert_cli.config.kernels import BOUNDARY_KERNELS, TORCH_VARLEN

__all__ = [
    "BOUNDARY_KERNELS",
    "TORCH_VARLEN",
    "mask_free_mapping",
    "register_torch_varlen",
    "torch_varlen_attention",
    "skip_mask_building",
]


@lru_cache(maxsize=1)
def _varlen_fn() -> Callable[..., Any]:
    """torch's varlen attention with the keyword names of the installed torch (the causal
    flag and GQA switch were renamed between releases)."""
    varlen_attn = varlen.varlen_attn
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
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """A transformers attention function: causal attention within each packed example.

    `query` is [batch, heads, length, dim]; the rows are laid end to end and `cu_seq_lens_q`
    (int32, cumulative example starts over all rows, a keyword the collator's batch carries
    through the model) says where each example begins. transformers also passes `scaling`,
    and `dropout` and `sliding_window`, which this kernel does not support.
    """
    cu_seq_lens_q = kwargs.get("cu_seq_lens_q")
    max_length_q = kwargs.get("max_length_q")
    scaling = kwargs.get("scaling")
    sliding_window, dropout = kwargs.get("sliding_window"), kwargs.get("dropout", 0.0)
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
    AttentionInterface.register(TORCH_VARLEN, torch_varlen_attention)


def check_model_config(kernel: str, config: Any) -> None:
    """Refuse a boundary kernel for a model that needs what it lacks (ValueError naming the
    attention, so the loader falls back to the next kernel)."""
    if kernel != TORCH_VARLEN:
        return
    config = text_config(config)  # Gemma 3's own sits under its multimodal config
    if uses_sliding_window(config):
        raise ValueError("attention torch_varlen: this model uses sliding-window attention")
    if getattr(config, "attn_logit_softcapping", None):  # Gemma 2: its kernel caps no logits
        raise ValueError("attention torch_varlen: this model soft-caps its attention logits")
    if getattr(config, "attention_dropout", 0.0):
        raise ValueError("attention torch_varlen: this model trains with attention dropout")


def uses_sliding_window(config: Any) -> bool:
    """Whether some layer of the model attends within a sliding window: a layer type says so
    (Gemma 2 and 3), or the window is set and, where the config has the switch (Qwen2/3),
    switched on; Mistral's configs have no switch and use a window whenever one is set."""
    config = text_config(config)
    if layer_types := getattr(config, "layer_types", None):  # each layer's, where it says
        return "sliding_attention" in layer_types
    if not getattr(config, "sliding_window", None):
        return False
    return bool(getattr(config, "use_sliding_window", True))


def text_config(config: Any) -> Any:
    """The language model's own configuration (a multimodal one holds it: Gemma 3's)."""
    getter = getattr(config, "get_text_config", None)
    return getter() if callable(getter) else config


def _decoder(model: Any) -> Any:
    """The decoder stack under a peft wrapper and a causal-LM head, or None."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    getter = getattr(inner, "get_decoder", None)
    return getter() if callable(getter) else None


def mask_free_mapping(model: Any, kernel: str) -> dict[str, None] | None:
    """The attention-mask mapping that tells the decoder "no mask" for a boundary kernel, or
    None where it cannot be given.

    Before each forward transformers builds a mask from the positions, and for packed rows it
    first asks whether the positions restart at all (`find_packed_sequence_indices`, a host
    sync: the step waits for the GPU there). The boundary kernels need no mask (for them the
    built mask is None anyway: they read the collator's boundaries), so a precomputed mapping
    of each layer type to None skips the question. Only decoders that take such a mapping
    (the transformers 5 ones: `causal_mask_mapping`) get it; any other keeps the default.
    """
    if kernel not in BOUNDARY_KERNELS:
        return None
    decoder = _decoder(model)
    if decoder is None or not _takes_mask_mapping(type(decoder)):
        return None
    config = decoder.config
    types = getattr(config, "layer_types", None) or ["full_attention"]
    if uses_sliding_window(config):
        return None  # a sliding window is a mask the kernels read from it: keep the default
    return dict.fromkeys(sorted(set(types)))


@lru_cache(maxsize=32)
def _takes_mask_mapping(cls: type) -> bool:
    try:
        source = inspect.getsource(cls.forward)
    except (OSError, TypeError):
        return False
    return "causal_mask_mapping" in source and "isinstance(" in source


def skip_mask_building(inputs: dict[str, Any], mapping: dict[str, None] | None) -> dict[str, Any]:
    """`inputs` with the mask-free mapping as its attention mask, when the batch carries the
    sequence boundaries and no mask of its own (else unchanged)."""
    if mapping is not None and "cu_seq_lens_q" in inputs and inputs.get("attention_mask") is None:
        inputs["attention_mask"] = dict(mapping)
    return inputs


@contextmanager
def probing(model: Any, kernel: str | None, probed: str | None) -> Iterator[None]:
    """`model` in eval mode with attention `probed` where it differs from the run's `kernel`
    (a varlen kernel needs the collator's boundaries, flex compiles for every shape), for a
    probe's forward outside the trainer; every module's training mode and the kernel are put
    back after."""
    modes = {module: module.training for module in model.modules()}
    model.eval()
    switched = probed is not None and probed != kernel
    try:
        if switched:
            model.set_attn_implementation(probed)
        yield
    finally:
        for module, mode in modes.items():
            module.training = mode
        if switched:
            model.set_attn_implementation(kernel)
