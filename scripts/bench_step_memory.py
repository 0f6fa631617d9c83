"""What one training forward of Qwen3-0.6B with LoRA keeps for its backward, counted on the CPU.

The activations a step holds for its backward decide how many rows fit on the GPU
(`batch_size: auto` sizes the micro-batch from them). They do not depend on the device, so
they can be counted here: the Qwen3-0.6B architecture at full width (random init, bf16
weights, bf16 autocast, adapters fp32 computing in bf16 as on the GPU path), LoRA r=16 on all
seven projections of its 28 layers, one row of `--tokens` tokens through the decoder (the
loss head is left out: the fused loss keeps no logits), counted with
`expert_cli.telemetry.ops.SavedForBackward` (each storage autograd keeps, once; the weights
left out). Each variant runs in its own process.

A CPU run differs from a GPU's in two places, both said in the JSON: attention is sdpa's
math kernel here (flash-attention keeps its own output and log-sum-exp), and peft's dropout
on a CPU keeps its mask as a tensor of the input's dtype where a GPU keeps one byte an
element; `peft_dropout_gpu_mask` runs peft's layers with torch's own dropout kernel, as a GPU
does, so its mask is one byte, as the fused LoRA linear's is on both.

    python scripts/bench_step_memory.py              # JSON to bench_results/step_memory.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch
import transformers

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

from bench_step_ops import provenance, write_report  # noqa: E402

VARIANTS: dict[str, tuple[str, float]] = {
    "peft": ("peft", 0.0),
    "fused": ("fused", 0.0),
    "peft_dropout": ("peft", 0.05),
    "peft_dropout_gpu_mask": ("peft_gpu_mask", 0.05),
    "fused_dropout": ("fused", 0.05),
    "grouped": ("grouped", 0.0),
    "grouped_dropout": ("grouped", 0.05),
    # DoRA (every HiveLLM expert here): peft's layers and the fused ones
    "dora_peft": ("peft_dora", 0.0),
    "dora_fused": ("fused_dora", 0.0),
    "dora_peft_dropout_gpu_mask": ("peft_gpu_mask_dora", 0.05),
    "dora_fused_dropout": ("fused_dora", 0.05),
}


class NativeDropout(torch.nn.Module):
    """nn.Dropout as it runs on a GPU: torch's own dropout kernel, whose backward keeps a
    one-byte mask (on a CPU nn.Dropout keeps its mask in the input's dtype)."""

    def __init__(self, p: float) -> None:
        super().__init__()
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.native_dropout(x, self.p, self.training)[0]


def _gpu_masks(model: torch.nn.Module) -> None:
    for module in model.modules():
        for name, dropout in getattr(module, "lora_dropout", {}).items():
            if isinstance(dropout, torch.nn.Dropout):
                module.lora_dropout[name] = NativeDropout(dropout.p)


def child(kernel: str, dropout: float, tokens: int) -> dict[str, Any]:
    """Bytes kept for the backward by one forward of the decoder, per token."""
    from peft import LoraConfig, get_peft_model

    from expert_cli.telemetry.ops import SavedForBackward
    from expert_cli.telemetry.workload import LORA_TARGETS, QWEN3_0_6B
    from expert_cli.train.fused_dora import fuse_adapter_linears
    from expert_cli.train.grouped_lora import clear_groups, group_lora_linears
    from expert_cli.train.speed import adapters_in_compute_dtype

    dora = kernel.endswith("_dora")
    kernel = kernel.removesuffix("_dora")
    torch.manual_seed(0)
    config = transformers.Qwen3Config(**QWEN3_0_6B, attn_implementation="sdpa")
    base = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    base.requires_grad_(False)
    lora = LoraConfig(
        r=16, lora_alpha=32, lora_dropout=dropout, target_modules=LORA_TARGETS, use_dora=dora
    )
    model = get_peft_model(base, lora, autocast_adapter_dtype=True)
    adapters_in_compute_dtype(model)
    if kernel in ("fused", "grouped"):
        fuse_adapter_linears(model)
    if kernel == "grouped":
        group_lora_linears(model)
    if kernel == "peft_gpu_mask":
        _gpu_masks(model)
    model.train()
    ids = torch.randint(
        0, config.vocab_size, (1, tokens), generator=torch.Generator().manual_seed(1)
    )
    if kernel == "grouped":  # a first forward shows the groups their order; it takes effect
        with torch.no_grad():  # where the model's next forward begins (the decoder's here)
            model(input_ids=ids[:, :8])
        clear_groups(model)
    decoder = model.base_model.model.model
    with (
        torch.autocast("cpu", dtype=torch.bfloat16),
        SavedForBackward(model.parameters()) as saved,
    ):
        hidden = decoder(input_ids=ids).last_hidden_state
    layers = sum(1 for m in model.modules() if hasattr(m, "lora_A"))
    kept = saved.storages  # while the graph that holds them is alive
    del hidden
    nbytes = sum(kept.values())
    return {
        "bytes": nbytes,
        "bytes_per_token": round(nbytes / tokens),
        "storages": len(kept),
        "adapted_layers": layers,
        "groups_in_use": sum(g.order is not None for g in model.__dict__.get("_lora_groups", [])),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--output", type=Path, default=ROOT / "bench_results" / "step_memory.json")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(*VARIANTS[args.child], args.tokens)))
        return
    names = [n.strip() for n in args.variants.split(",") if n.strip()]
    if unknown := [n for n in names if n not in VARIANTS]:
        parser.error(f"--variants: unknown {unknown}; choose from {sorted(VARIANTS)}")
    results: dict[str, Any] = {}
    for name in names:
        kernel, dropout = VARIANTS[name]
        cmd = [sys.executable, __file__, "--child", name, "--tokens", str(args.tokens)]
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise SystemExit(f"{name} failed:\n{done.stderr[-3000:]}")
        result = json.loads(done.stdout.strip().splitlines()[-1])
        results[name] = {"adapter_kernel": kernel, "lora_dropout": dropout, **result}
        print(f"{name:22s} {result['bytes_per_token']:8d} bytes a token kept for the backward")
    commit = subprocess.run(
        ["git", "describe", "--always", "--dirty"], capture_output=True, text=True, cwd=ROOT
    ).stdout.strip()
    report = {
        "what": "bytes one training forward of the decoder keeps for its backward (weights "
        "left out), per token",
        "model": "Qwen3-0.6B architecture, random init, bf16 weights and autocast, LoRA r16 "
        "alpha 32 on all seven projections (fp32 adapters computing in bf16)",
        "tokens": args.tokens,
        "cpu_differences": "attention: sdpa's math kernel; peft's dropout keeps a mask in "
        "the input's dtype (a GPU keeps one byte an element, as peft_dropout_gpu_mask does)",
        **provenance(),
        "commit": commit,
        "variants": results,
    }
    write_report(args.output, report)


if __name__ == "__main__":
    main()
