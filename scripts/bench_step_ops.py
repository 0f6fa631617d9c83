"""Operations per training step, counted on the CPU: the launch count a GPU step pays for.

On an H100 a Qwen3-0.6B LoRA step at 8 rows is partly bound by launching thousands of small
kernels (docs/PERFORMANCE.md). The number of those launches does not depend on the device or
on the model's width, so it can be counted here: every variant trains the demo expert with its
model deepened to the Qwen3-0.6B's 28 decoder layers (width kept tiny), in bf16 autocast, and
one optimizer step (forward, loss, backward, clipping, AdamW, zero_grad) runs under a
TorchDispatchMode that counts each aten operation that does work (views and empty
allocations left out: they launch nothing). Operations that make the host wait for the device
(`.item()`, `nonzero`, ...) are counted apart, with the code that called them.

Each variant runs in its own process, via `expert-cli train` in-process (`--set` overrides as a
user would give them); the counts are exact and repeatable, so one run of each suffices.

    python scripts/bench_step_ops.py                      # all variants, JSON to bench_results/
    python scripts/bench_step_ops.py --variants peft,fused
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch
import transformers

from expert_cli.telemetry.ops import OpCounter
from expert_cli.train.callbacks import CountStepOps
from expert_cli.train.run import Silent, TrainOptions, train

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "experts" / "demo"
LAYERS = 28  # Qwen3-0.6B
STEP = 3  # the optimizer step counted (1-based); earlier ones warm caches up
C = "training.config."
# the GPU fast path's choices that run on a CPU too (Liger's kernels and flash-attention do not)
FAST = [
    "base_models.0.quantization=bf16",  # bf16 frozen weights, as on a GPU
    f"{C}bf16=true",
    f"{C}adapter_precision=compute",
    f"{C}fused_loss=chunked",
    f"{C}optim=adamw_torch_fused",
]

# fewer and shorter rows than the demo's and no evaluation or saving: the count per step is
# the same, the CPU's bf16 is slow
QUICK = [
    f"{C}max_seq_length=128",
    f"{C}logging_steps=100",
    f"{C}save_strategy=no",
    f"{C}evaluation_strategy=no",
]

DROPOUT = f"{C}dropout=0.05"  # HiveLLM's experts' lora dropout
DORA = f"{C}adapter_type=dora"


def _kernel(kernel: str, *more: str) -> list[str]:
    """The fast path's choices with adapter_kernel `kernel` and `more` overrides."""
    return [*FAST, f"{C}adapter_kernel={kernel}", *more]


VARIANTS: dict[str, tuple[list[str], str]] = {
    "peft": (_kernel("peft"), "peft's LoRA layers (the default)"),
    "fused": (_kernel("fused"), "fused LoRA linear layers"),
    "grouped": (_kernel("grouped"), "fused LoRA layers, those that read one input as one function"),
    "peft_dropout": (_kernel("peft", DROPOUT), "peft's LoRA layers, lora dropout 0.05"),
    "fused_dropout": (_kernel("fused", DROPOUT), "fused LoRA linear layers, lora dropout 0.05"),
    "grouped_dropout": (
        _kernel("grouped", DROPOUT),
        "fused LoRA layers grouped by input, lora dropout 0.05",
    ),
    "dora_peft": (_kernel("peft", DORA), "peft's DoRA layers"),
    "dora": (_kernel("fused", DORA), "fused DoRA linear layers"),
    "dora_peft_dropout": (
        _kernel("peft", DORA, DROPOUT),
        "peft's DoRA layers, lora dropout 0.05 (HiveLLM's experts)",
    ),
    "dora_dropout": (
        _kernel("fused", DORA, DROPOUT),
        "fused DoRA linear layers, lora dropout 0.05",
    ),
    "peft_int4": (
        [*(o for o in FAST if "quantization" not in o)]
        + ["base_models.0.quantization=int4", f"{C}adapter_kernel=peft"],
        "QLoRA (NF4 base) through peft's 4-bit LoRA layers",
    ),
    "fused_int4": (
        [*(o for o in FAST if "quantization" not in o)]
        + ["base_models.0.quantization=int4", f"{C}adapter_kernel=fused"],
        "QLoRA (NF4 base) through the fused LoRA linear",
    ),
    "fp32_adapters": (
        FAST + [f"{C}adapter_precision=fp32"],
        "peft's fp32 copies of each adapter input",
    ),
    "standard_loss": (
        [*(o for o in FAST if "fused_loss" not in o), f"{C}fused_loss=off"],
        "full-vocabulary logits and loss",
    ),
}


def child(overrides: list[str], work: Path) -> dict[str, Any]:
    """Train the deepened demo for STEP steps in this process; count the STEP-th step."""
    counter = OpCounter()
    torch.manual_seed(0)
    opts = TrainOptions(
        manifest=work / "manifest.json",
        output=work / "run",
        max_steps=STEP,
        overrides=[*overrides, *QUICK],
        overwrite=True,
    )
    train(opts, Silent([CountStepOps(counter, STEP)]))
    return {
        "ops": counter.total,
        "by_op": dict(counter.ops.most_common()),
        "syncs": dict(counter.syncs),
    }


def _cpu() -> str:
    """The processor as /proc/cpuinfo names it, and the cores this process may use."""
    name = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{name}, {len(os.sched_getaffinity(0))} cores"


def provenance() -> dict[str, Any]:
    """What a result JSON says of where it was measured: machine, versions, command."""
    return {
        "machine": _cpu(),
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
    }


def write_report(path: Path, report: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {path}")


def deepened_demo(work: Path) -> None:
    """The demo expert with its model at LAYERS decoder layers."""
    import shutil

    shutil.copytree(DEMO, work, dirs_exist_ok=True)
    config_path = work / "model" / "config.json"
    config = json.loads(config_path.read_text())
    config["num_hidden_layers"] = LAYERS
    config["layer_types"] = ["full_attention"] * LAYERS
    config_path.write_text(json.dumps(config, indent=2))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--output", type=Path, default=ROOT / "bench_results" / "step_ops.json")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--work", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(VARIANTS[args.child][0], args.work)))
        return
    names = [n.strip() for n in args.variants.split(",") if n.strip()]
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        parser.error(f"--variants: unknown {unknown}; choose from {sorted(VARIANTS)}")
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp) / "expert"
        deepened_demo(work)
        env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
        for name in names:
            cmd = [sys.executable, __file__, "--child", name, "--work", str(work)]
            done = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
            if done.returncode != 0:
                raise SystemExit(f"{name} failed:\n{done.stderr[-3000:]}")
            result = json.loads(done.stdout.strip().splitlines()[-1])
            result["what"] = VARIANTS[name][1]
            result["overrides"] = VARIANTS[name][0]
            results[name] = result
            print(f"{name:16s} {result['ops']:6d} ops/step  syncs {sum(result['syncs'].values())}")
    base = results.get("peft", {}).get("ops")
    for result in results.values():
        result["vs_peft"] = round(result["ops"] / base, 3) if base else None
    report = {
        "what": "aten operations per optimizer step (views and empty allocations left out)",
        "model": f"demo expert's Qwen3 with {LAYERS} decoder layers, LoRA r16 all-linear, bf16",
        "step": STEP,
        **provenance(),
        "variants": results,
    }
    write_report(args.output, report)


if __name__ == "__main__":
    main()
