"""The step's other levers: adapters in the compute dtype, Liger's fused layer kernels, and
torch.compile of each decoder layer.

Each function changes a model in place and returns a short note of what it did (or why it
did nothing), for the console and `manifest.resolved.json`.
"""

from __future__ import annotations

from typing import Any

import torch
import torch._dynamo
import torch._inductor
from peft.tuners.tuners_utils import BaseTunerLayer

from expert_cli.config.resolve import ResolvedConfig

SHOWN_BACKENDS = ("inductor", "aot_eager", "eager", "cudagraphs")


def compile_problem(resolved: ResolvedConfig) -> str | None:
    """A torch.compile backend or mode this torch does not have, named before any data is
    tokenized (it was dynamo's traceback at the first step); None when they are known."""
    if not resolved.torch_compile:
        return None
    backend, mode = resolved.torch_compile_backend, resolved.torch_compile_mode
    if backend is not None and backend not in torch._dynamo.list_backends(exclude_tags=()):
        return (
            f"training.config.torch_compile_backend: not a torch.compile backend of torch "
            f"{torch.__version__}; expected one such as {', '.join(SHOWN_BACKENDS)}"
        )
    modes = list(torch._inductor.list_mode_options())
    if mode is not None and mode not in modes:
        return f"training.config.torch_compile_mode: expected one of {', '.join(modes)}"
    return None


def adapters_in_compute_dtype(model: torch.nn.Module) -> int:
    """Stop peft from casting each adapter's input to the adapter weights' dtype (fp32).

    Under bf16/fp16 autocast the adapter matmuls then run in the compute dtype on the
    activations as they are, while the adapter weights, their gradients and the optimizer
    state stay fp32. Returns how many adapted layers were switched.
    """
    switched = 0
    for module in model.modules():
        if isinstance(module, BaseTunerLayer):
            module.cast_input_dtype_enabled = False
            switched += 1
    return switched


def apply_liger_kernels(model: torch.nn.Module) -> str | None:
    """Liger's fused RMSNorm, SwiGLU and RoPE for the model's type (not its loss: the fused
    loss is installed separately). Returns None when applied, else why not."""
    try:
        from liger_kernel.transformers import _apply_liger_kernel_to_instance
        from liger_kernel.transformers.monkey_patch import MODEL_TYPE_TO_APPLY_LIGER_FN
    except ImportError:
        return "liger-kernel is not installed"
    model_type = getattr(model.config, "model_type", None)
    if model_type not in MODEL_TYPE_TO_APPLY_LIGER_FN:
        return f"Liger has no kernels for model type {model_type!r}"
    _apply_liger_kernel_to_instance(
        model,
        rope=True,
        rms_norm=True,
        swiglu=True,
        cross_entropy=False,
        fused_linear_cross_entropy=False,
    )
    return None


def decoder_layers(model: torch.nn.Module) -> torch.nn.ModuleList | None:
    """The repeated decoder layers of a transformers causal LM (peft-wrapped or not)."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    body = getattr(inner, "model", None)
    layers = getattr(body, "layers", None)
    return layers if isinstance(layers, torch.nn.ModuleList) and len(layers) else None


def compile_layers(
    model: torch.nn.Module, backend: str | None = None, mode: str | None = None
) -> int:
    """torch.compile each decoder layer in place (regional compilation: one layer's code is
    compiled once and reused by all). Returns the number of layers compiled."""
    layers = decoder_layers(model)
    if layers is None:
        return 0
    for layer in layers:
        layer.compile(backend=backend or "inductor", mode=mode)
    return len(layers)


def compile_decision(requested: bool, on_gpu: bool) -> tuple[bool, str]:
    """Whether to compile the decoder layers, and why. Off unless the manifest asks: on an H100
    the compiled layers ran 15% slower than Liger's kernels and took 40 s to compile
    (docs/PERFORMANCE.md), so no run length repays it there."""
    if requested:
        return True, "on as the manifest asks"
    if not on_gpu:
        return False, "off"
    return False, "off (measured slower than Liger's fused kernels on an H100; opt in with true)"


def describe(model: Any) -> dict[str, Any]:
    """Dtypes of the trainable parameters, for tests and `manifest.resolved.json`."""
    dtypes = sorted(
        {str(p.dtype).removeprefix("torch.") for p in model.parameters() if p.requires_grad}
    )
    return {"trainable_dtypes": dtypes}
