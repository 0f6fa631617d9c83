"""MFU's peak: the GPU's bf16/fp16 tensor-core peak for a mixed-precision run, none for fp32."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from train_helpers import lora_model

from expert_cli.train.model_flops import flops_model


def test_peak_only_for_mixed_precision(
    monkeypatch: pytest.MonkeyPatch, tiny_model_dir: Path
) -> None:
    """An fp32 run (an explicit `bf16: false`, a GPU without bf16 or fp16 asked off) was
    measured against the bf16 peak: its MFU read several times too low, and `benchmark` then
    called the run compute-bound."""
    model = lora_model(tiny_model_dir)
    assert flops_model(model).peak_flops_per_device is None  # no GPU
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA H100 80GB HBM3")
    assert flops_model(model, mixed=True).peak_flops_per_device == 989e12
    fp32 = flops_model(model, mixed=False)
    assert fp32.peak_flops_per_device is None
    assert fp32.n_layers == 2 and fp32.trainable_params > 0


def test_the_head_is_counted_apart_for_the_trained_tokens(tiny_model_dir: Path) -> None:
    model = lora_model(tiny_model_dir)
    head = model.get_base_model().lm_head.weight.numel()
    fm = flops_model(model)
    assert fm.head_params == head > 0
    assert fm.per_token(100, 0.25) == fm.per_token(100) - 4 * head * 0.75


def test_zero3_partitioned_weights_count_at_their_whole_size(tiny_model_dir: Path) -> None:
    """DeepSpeed ZeRO-3 leaves each process a 0-element stand-in of a partitioned weight,
    its size in `ds_numel`: the head was counted as 0 weights (its FLOPs credited for every
    token, MFU overstated) and an untied input embedding as a matmul."""
    model = lora_model(tiny_model_dir)
    base = model.get_base_model()
    head, embed = base.lm_head.weight.numel(), base.get_input_embeddings().weight.numel()
    whole = flops_model(model)
    for module in (base.lm_head, base.get_input_embeddings()):
        stand_in = torch.nn.Parameter(torch.empty(0), requires_grad=False)
        stand_in.ds_numel = module.weight.numel()  # as DeepSpeed's partitioning leaves it
        module.weight = stand_in
    base.config.tie_word_embeddings = False
    fm = flops_model(model)
    assert fm.head_params == head > 0
    assert fm.matmul_params == whole.matmul_params + head - embed  # untied now: two weights


def test_matmul_weights_and_attention_width_follow_the_config(tiny_model_dir: Path) -> None:
    """An untied input embedding is a lookup, not a matmul; the attention's width is heads x
    head_dim where the config gives head_dim (Qwen3: 16 x 128, not hidden 1024 / 16)."""
    from expert_cli.train.model_flops import parameter_counts

    model = lora_model(tiny_model_dir)
    base = model.get_base_model()
    total = parameter_counts(model)[1]
    embed = base.get_input_embeddings().weight.numel()
    base.config.tie_word_embeddings = False
    assert flops_model(model).matmul_params == total - embed
    base.config.tie_word_embeddings = True
    assert flops_model(model).matmul_params == total
    base.config.head_dim = 32
    assert flops_model(model).attn_dim == base.config.num_attention_heads * 32
