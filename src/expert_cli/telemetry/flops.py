"""FLOPs accounting for LoRA training and the GPUs' peak bf16 throughput, for MFU.

Shared by the benchmark's synthetic workload and the training throughput callback.
"""

from __future__ import annotations

import re

TFLOPS = 1e12

# Dense (no sparsity) bf16 tensor-core peak per GPU, from the vendors' data sheets (fp16 for
# the GPUs without bf16, where a run's mixed precision is fp16; the two are equal on the rest).
# Matched against the NVML/torch device name's words, case-insensitively, first match wins,
# so the more specific names come first.
PEAK_BF16_TFLOPS: list[tuple[tuple[str, ...], float]] = [
    (("h100", "pcie"), 756.0),
    (("h100", "nvl"), 835.0),
    (("h100",), 989.0),  # SXM5 ("NVIDIA H100 80GB HBM3")
    (("h200", "nvl"), 835.0),
    (("h200",), 989.0),
    (("gh200",), 989.0),
    (("a100",), 312.0),
    (("l40s",), 362.0),
    (("l40",), 181.0),
    (("l4",), 121.0),
    (("rtx 4090",), 165.0),
    (("a10g",), 125.0),
    (("a10",), 125.0),
    # GPUs without bf16, where runs are fp16: their dense fp16 tensor-core peak
    (("v100s",), 130.0),
    (("v100", "pcie"), 112.0),
    (("v100",), 125.0),  # SXM2
    (("t4",), 65.0),
]


def peak_bf16_flops(gpu_name: str) -> float | None:
    """Dense bf16 peak FLOP/s of the named GPU, or None when it is not in the table or is a
    MIG slice (a part of the card's peak). Names match as whole words: "RTX A1000" took the
    A100's 312 TFLOP/s by substring."""
    words = set(re.findall(r"[a-z0-9]+", gpu_name.lower()))
    if "mig" in words:
        return None
    for needles, tflops in PEAK_BF16_TFLOPS:
        if all(word in words for needle in needles for word in needle.split()):
            return tflops * TFLOPS
    return None


def lora_train_flops_per_token(
    n_total_params: int,
    n_trainable_params: int,
    n_layers: int,
    hidden: int,
    seq_len: int,
    *,
    attn_dim: int | None = None,
) -> float:
    """Model FLOPs per trained token of one LoRA (frozen base + adapters) training step.

    - forward: 2 * N over all weights (base and adapters);
    - backward, activation gradients: 2 * N (they flow through every frozen layer too);
    - backward, weight gradients: 2 * N_trainable only (the base weights get none);
    - attention scores and values: 4 * layers * attn_dim * seq_len forward, 3x for a step.

    `seq_len` is how many tokens each token attends over: for packed rows whose position ids
    restart per example, the example length, not the row length (the masked-out blocks are
    not useful work). `attn_dim` is heads * head_dim, which is not always `hidden` (Qwen3:
    16 * 128 = 2048 against hidden 1024); it defaults to `hidden`.

    The attention term counts each example's whole score matrix, as PaLM's MFU formula does:
    no halving for the causal mask, though a causal kernel computes about half of it. For
    Qwen3-0.6B with 2,048-token examples the term is 37% of the count, so an MFU that
    halves it reads 18% lower than this one.
    """
    width = hidden if attn_dim is None else attn_dim
    dense = 2.0 * n_total_params + 2.0 * n_total_params + 2.0 * n_trainable_params
    attention = 3.0 * 4.0 * n_layers * width * seq_len
    return dense + attention


def mfu(tokens_per_s: float, flops_per_token: float, peak_flops: float | None) -> float | None:
    """Model FLOPs utilization: achieved model FLOP/s over the peak, or None if unknown."""
    if not peak_flops:
        return None
    return tokens_per_s * flops_per_token / peak_flops
