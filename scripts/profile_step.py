"""Where one training step of an expert spends its GPU time (torch.profiler, top kernels).

Builds the model the way `expert-cli train` does (automatic choices, or `--set` overrides),
takes real packed batches from the expert's token cache, runs warm-up steps, then profiles a
few forward + backward + AdamW steps under bf16 autocast. Writes the top kernels by GPU time,
the step time, and how much of the profiled span the GPU ran no kernel (the gaps between
kernels, where it waited for the host to launch the next: a launch-bound step has many) as
JSON. The profiler slows the host's launches, so the gaps read larger than in training; the
step without the profiler is timed too.

    python scripts/profile_step.py --expert bench_results/tmp/qwen3-expert --output prof.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def gaps(intervals: list[tuple[float, float]], top: int = 5) -> dict[str, float | list[float]]:
    """Of kernels' (start, end) times on the device: the span from the first start to the
    last end, the time some kernel ran (overlaps merged), the idle rest and its share, the
    number of gaps and the longest ones (same unit as the times)."""
    if not intervals:
        return {"span": 0.0, "busy": 0.0, "idle": 0.0, "idle_share": 0.0, "gaps": 0, "longest": []}
    ordered = sorted(intervals)
    busy, holes = 0.0, []
    start, end = ordered[0]
    for s, e in ordered[1:]:
        if s > end:
            busy += end - start
            holes.append(s - end)
            start, end = s, e
        else:
            end = max(end, e)
    busy += end - start
    span = end - ordered[0][0]
    return {
        "span": span,
        "busy": busy,
        "idle": span - busy,
        "idle_share": (span - busy) / span if span > 0 else 0.0,
        "gaps": len(holes),
        "longest": sorted(holes, reverse=True)[:top],
    }


# kernel-name patterns (lower case) of each kind of GPU work, first match wins: cuBLAS's and
# CUTLASS's GEMMs, flash-attention and torch's attention kernels, Liger's and torch's layer
# kernels, the optimizer's multi-tensor kernels, 4-bit dequantization, dropout masks, copies
# and casts, and the element-wise rest (scale, add, mul, reductions)
KINDS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("dequantize", ("dequant",)),
    ("cross_entropy", ("cross_entropy", "crossentropy", "log_softmax", "nll_loss")),
    ("attention", ("flash", "fmha", "attention", "attn")),
    ("norm", ("rms_norm", "rmsnorm", "layer_norm", "layernorm")),
    ("swiglu_rope", ("swiglu", "silu", "rope", "rotary")),
    ("optimizer", ("adam", "multi_tensor", "foreach")),
    ("dropout", ("bernoulli", "dropout", "philox")),
    ("matmul", ("gemm", "cutlass", "xmma", "nvjet", "cublas", "matmul", "splitk")),
    ("copy_cast", ("copy", "cast", "convert")),
    ("elementwise", ("elementwise", "vectorized", "unrolled", "reduce", "index")),
)


def kinds(kernels: list[tuple[str, float, float]]) -> dict[str, dict[str, float]]:
    """(name, GPU time, calls) of each kernel summed by kind (KINDS; `other` for the rest),
    with each kind's share of the total time, largest first."""
    total = sum(t for _, t, _ in kernels) or 1.0
    out: dict[str, dict[str, float]] = {}
    for name, t, calls in kernels:
        low = name.lower()
        kind = next((k for k, words in KINDS if any(w in low for w in words)), "other")
        row = out.setdefault(kind, {"time": 0.0, "calls": 0.0})
        row["time"] += t
        row["calls"] += calls
    for row in out.values():
        row["share"] = row["time"] / total
    return dict(sorted(out.items(), key=lambda kv: -kv[1]["time"]))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--expert", type=Path, required=True)
    p.add_argument("--set", dest="overrides", action="append", default=[])
    p.add_argument("--steps", type=int, default=2, help="profiled steps")
    p.add_argument("--top", type=int, default=30)
    p.add_argument("--output", type=Path, default=None)
    a = p.parse_args()
    import torch
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    from expert_cli.config import load_manifest
    from expert_cli.config.environment import probe_environment
    from expert_cli.config.resolve import resolve
    from expert_cli.data import prepare_data
    from expert_cli.data.collate import PackedCollator
    from expert_cli.data.tokenizer import load_tokenizer
    from expert_cli.train.attention import BOUNDARY_KERNELS
    from expert_cli.train.loss import takes_loss_positions
    from expert_cli.train.model import attach_adapter, load_base_model

    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    resolved = resolve(load_manifest(a.expert / "manifest.json", a.overrides), probe_environment())
    tokenizer = load_tokenizer(resolved)
    data = prepare_data(resolved, tokenizer)
    model, choices = load_base_model(resolved, "cuda:0")
    model = attach_adapter(model, resolved, total_steps=100).train()
    collate = PackedCollator(  # the batches `train` makes: the head on trained tokens alone
        tokenizer.pad_token_id,
        boundaries=choices.attn_implementation in BOUNDARY_KERNELS,
        loss_positions=takes_loss_positions(model),
    )
    params = [q for q in model.parameters() if q.requires_grad]
    optim = torch.optim.AdamW(params, lr=1e-4, fused=True)
    n = resolved.batch_size

    def batch(i: int) -> dict:
        rows = [data.train[(i * n + j) % len(data.train)] for j in range(n)]
        return {
            k: (v.cuda(non_blocking=True) if torch.is_tensor(v) else v)
            for k, v in collate(rows).items()
        }

    def step(i: int) -> None:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(**batch(i), use_cache=False).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optim.step()
        optim.zero_grad(set_to_none=True)

    start = time.perf_counter()
    for i in range(3):
        step(i)
    torch.cuda.synchronize()
    print(f"warm-up: 3 steps in {time.perf_counter() - start:.1f} s", flush=True)
    start = time.perf_counter()
    for i in range(a.steps):
        step(3 + i)
    torch.cuda.synchronize()
    unprofiled = (time.perf_counter() - start) / a.steps
    print(f"step {unprofiled * 1000:.0f} ms unprofiled; profiling", flush=True)
    start = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for i in range(a.steps):
            step(3 + i)
        torch.cuda.synchronize()
    wall = (time.perf_counter() - start) / a.steps
    # kernels only: a CPU op's device time repeats its kernels' time (counting both doubles it)
    events = [
        e
        for e in prof.key_averages()
        if e.device_type == DeviceType.CUDA and e.self_device_time_total > 0
    ]
    gpu_total = sum(e.self_device_time_total for e in events)
    kernels = [
        (e.time_range.start, e.time_range.end)
        for e in prof.events()
        if e.device_type == DeviceType.CUDA and e.time_range.end > e.time_range.start
    ]
    timeline = gaps(kernels)  # microseconds
    top = sorted(events, key=lambda e: e.self_device_time_total, reverse=True)[: a.top]
    rows = [
        {
            "kernel": e.key[:120],
            "calls_per_step": e.count / a.steps,
            "ms_per_step": e.self_device_time_total / 1000 / a.steps,
            "share": e.self_device_time_total / max(gpu_total, 1),
        }
        for e in top
    ]
    report = {
        "gpu": torch.cuda.get_device_name(),
        "choices": choices.__dict__,
        "overrides": a.overrides,
        "batch_rows": n,
        "seq": resolved.max_seq_length,
        "step_wall_ms": wall * 1000,
        "step_wall_ms_unprofiled": unprofiled * 1000,
        "gpu_busy_ms_per_step": gpu_total / 1000 / a.steps,
        "timeline": {
            "kernels_per_step": len(kernels) / a.steps,
            "busy_ms_per_step": timeline["busy"] / 1000 / a.steps,
            "idle_ms_per_step": timeline["idle"] / 1000 / a.steps,
            "idle_share": timeline["idle_share"],
            "gaps_per_step": timeline["gaps"] / a.steps,
            "longest_gaps_ms": [g / 1000 for g in timeline["longest"]],
        },
        "kinds": {
            k: {
                "ms_per_step": v["time"] / 1000 / a.steps,
                "calls_per_step": v["calls"] / a.steps,
                "share": v["share"],
            }
            for k, v in kinds([(e.key, e.self_device_time_total, e.count) for e in events]).items()
        },
        "top_kernels": rows,
    }
    print(
        f"step {wall * 1000:.0f} ms wall ({unprofiled * 1000:.0f} ms unprofiled), "
        f"{gpu_total / 1000 / a.steps:.0f} ms GPU kernels "
        f"({choices.attn_implementation}, loss {choices.fused_loss})"
    )
    t = report["timeline"]
    print(
        f"timeline: {t['kernels_per_step']:.0f} kernels/step, GPU idle between them "
        f"{t['idle_ms_per_step']:.1f} ms/step ({100 * t['idle_share']:.1f}% of the span), "
        f"longest gaps {', '.join(f'{g:.2f}' for g in t['longest_gaps_ms'])} ms"
    )
    print(
        "by kind: "
        + ", ".join(
            f"{k} {v['ms_per_step']:.1f} ms ({100 * v['share']:.0f}%, x{v['calls_per_step']:.0f})"
            for k, v in report["kinds"].items()
        )
    )
    for r in rows:
        print(
            f"{r['ms_per_step']:8.2f} ms {100 * r['share']:5.1f}% x{r['calls_per_step']:6.0f} "
            f" {r['kernel']}"
        )
    if a.output:
        a.output.write_text(json.dumps(report, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
