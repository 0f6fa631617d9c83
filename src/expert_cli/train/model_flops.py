"""What MFU needs to know of the adapted model: parameters in matmuls, trainable ones, the
attention's shape, and the peak to measure against."""

from __future__ import annotations

import torch
from peft import PeftModel

from expert_cli.telemetry.flops import peak_bf16_flops
from expert_cli.telemetry.throughput import FlopsModel


def _size(weight: torch.Tensor) -> int:
    """A weight's whole size: DeepSpeed ZeRO-3 leaves each process a 0-element stand-in of a
    partitioned parameter, its size in `ds_numel` (as peft's own count reads it)."""
    return int(getattr(weight, "ds_numel", weight.numel()))


def parameter_counts(model: PeftModel) -> tuple[int, int]:
    """(trainable, total) parameters; 4-bit weights counted at their unpacked size."""
    trainable, total = model.get_nb_trainable_parameters()
    return int(trainable), int(total)


def matmul_parameters(model: PeftModel, total: int) -> int:
    """Parameters that take part in matmuls: all but an untied input embedding (a lookup)."""
    base = model.get_base_model()
    embed = base.get_input_embeddings()
    tied = bool(getattr(base.config, "tie_word_embeddings", False))
    return total if tied else total - _size(embed.weight)


def flops_model(peft_model: PeftModel, mixed: bool = True) -> FlopsModel:
    """What MFU needs to know of the model, and this GPU's bf16/fp16 peak: None on a CPU, an
    unknown GPU, or for a run without mixed precision (`mixed` false: fp32 or TF32 matmuls
    run at a fraction of that peak, so MFU against it would read several times too low)."""
    cfg = peft_model.get_base_model().config
    trainable, total = parameter_counts(peft_model)
    heads = cfg.num_attention_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    on_gpu = mixed and torch.cuda.is_available()
    peak = peak_bf16_flops(torch.cuda.get_device_name()) if on_gpu else None
    return FlopsModel(
        matmul_params=matmul_parameters(peft_model, total),
        trainable_params=trainable,
        n_layers=cfg.num_hidden_layers,
        hidden=cfg.hidden_size,
        attn_dim=heads * head_dim,
        peak_flops_per_device=peak,
        head_params=head_parameters(peft_model),
    )


def head_parameters(model: PeftModel) -> int:
    """The LM head's weights (the output embedding, tied or not): MFU counts their FLOPs for
    the trained tokens alone, the only ones whose logits the loss needs."""
    head = model.get_base_model().get_output_embeddings()
    weight = getattr(head, "weight", None)
    return _size(weight) if isinstance(weight, torch.Tensor) else 0
