"""Where a Qwen3-0.6B LoRA training step spends its time on a GPU (a diagnostic, not a test).

One [batch, seq] batch of random tokens, bf16 weights, SDPA, TF32 on; mean of 5 timed steps
after 3 warm-up steps. Variants:
  body:  the transformer body only (no LM head / cross-entropy), for: frozen base without an
         adapter, LoRA r=16 all-linear with fp32 adapter weights (peft's default) and with bf16
         adapter weights, and a full fine-tune;
  mask:  the whole model with loss, position ids counting 0..seq-1 (plain causal) vs restarting
         at packed example boundaries (the block-diagonal mask packing needs).

    python scripts/diag_step_time.py --batch 4 --seq 2048
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch

from expert_cli.telemetry.workload import QWEN3_0_6B

SEGMENTS = [300, 500, 248, 700, 300]  # a packed row of five examples (2048 tokens)


def timed(step: Callable[[], None], warmup: int = 3, steps: int = 5) -> float:
    """Seconds per step."""
    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / steps


def fresh_model():
    from transformers import AutoModelForCausalLM, Qwen3Config

    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(
        Qwen3Config(**QWEN3_0_6B), attn_implementation="sdpa", dtype=torch.bfloat16
    ).cuda()


def lora(model, adapter_fp32: bool):
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(r=16, lora_alpha=32, target_modules="all-linear")
    return get_peft_model(model, config, autocast_adapter_dtype=adapter_fp32)


def body_step(body, ids: torch.Tensor, pos: torch.Tensor) -> Callable[[], None]:
    def step() -> None:
        out = body(input_ids=ids, position_ids=pos, use_cache=False).last_hidden_state
        out.float().pow(2).mean().backward()

    return step


def report(name: str, seconds: float, tokens: int) -> None:
    print(f"{name:38s} {seconds * 1000:6.0f} ms/step  {tokens / seconds:10,.0f} tok/s", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=2048)
    args = parser.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = True
    b, s = args.batch, args.seq
    ids = torch.randint(0, 150_000, (b, s), device="cuda")
    causal = torch.arange(s, device="cuda").expand(b, s)
    packed = torch.cat([torch.arange(n, device="cuda") for n in SEGMENTS])[:s].expand(b, s)

    frozen = fresh_model().requires_grad_(False)
    frozen.get_input_embeddings().weight.requires_grad_(True)  # so there is a backward pass
    report("body: frozen base, no adapter", timed(body_step(frozen.model, ids, causal)), b * s)
    for fp32 in (True, False):
        body = lora(fresh_model(), fp32).base_model.model.model
        name = f"body: LoRA, {'fp32' if fp32 else 'bf16'} adapter weights"
        report(name, timed(body_step(body, ids, causal)), b * s)
    full = fresh_model()
    report("body: full fine-tune", timed(body_step(full.model, ids, causal)), b * s)

    model = lora(fresh_model(), True)
    for name, pos in (("mask: causal positions", causal), ("mask: packed positions", packed)):

        def step(pos: torch.Tensor = pos) -> None:
            model(input_ids=ids, labels=ids, position_ids=pos, use_cache=False).loss.backward()

        report(name, timed(step), b * s)


if __name__ == "__main__":
    main()
