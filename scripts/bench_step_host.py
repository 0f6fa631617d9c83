"""Host time per training step spent walking the model's module tree, measured on the CPU.

At 8 rows of 2,048 tokens an H100 step of Qwen3-0.6B LoRA is partly launch-bound
(docs/PERFORMANCE.md): the host's work per step is then on the step's critical path. Each
optimizer step the Trainer's loop walks every module of the model four times: `model.train()`
at each micro-batch, its FLOP estimate's `num_parameters(exclude_embeddings=True)`, the
clipping's `model.parameters()` and `model.zero_grad()`. The cost of a walk depends on the
number of modules (2,389 for Qwen3-0.6B with LoRA r16 on all linear layers: 28 decoder
layers, 196 adapted projections), not on the width, so the model here has Qwen3-0.6B's
structure at a tiny width, and what is timed is the same Python work a GPU host does.

Each call is timed both ways in this one process, in turns (this machine is shared: the best
of `--repeat` rounds of `--number` calls each is kept, as `timeit` advises):
  trainer  the Trainer's own calls, as it makes them at every step
  listed   the answers of train/step_walks.py from lists made once per run

A whole step's wall time on this CPU (about 250 ms for such a model at one row of 128
tokens) varies by 20-40 ms from process to process here, more than the difference, so the
calls are timed on their own.

    python scripts/bench_step_host.py                 # JSON to bench_results/step_host.json
"""

from __future__ import annotations

import argparse
import json
import sys
import timeit
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

from bench_step_ops import LAYERS, _cpu  # noqa: E402


def qwen3_structure() -> Any:
    """Qwen3-0.6B's module tree (28 layers, its head counts) at a tiny width, LoRA r16 on all
    linear layers, gradients present as after a backward pass."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, Qwen3Config

    config = Qwen3Config(
        vocab_size=512,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=LAYERS,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=4,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    model = get_peft_model(
        AutoModelForCausalLM.from_config(config),
        LoraConfig(r=16, lora_alpha=32, target_modules="all-linear"),
    )
    model.train()
    ids = torch.randint(0, 512, (1, 16))
    model(input_ids=ids, labels=ids).loss.backward()
    return model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--number", type=int, default=20, help="calls per timing")
    parser.add_argument("--repeat", type=int, default=7, help="timings; the best is kept")
    parser.add_argument("--output", type=Path, default=ROOT / "bench_results" / "step_host.json")
    args = parser.parse_args()
    if not 1 <= args.number <= 10_000 or not 1 <= args.repeat <= 100:
        parser.error("--number is 1 to 10000, --repeat 1 to 100")

    import torch
    import transformers

    from expert_cli.train.step_walks import StepWalks

    model = qwen3_structure()
    grads = {p: p.grad for p in model.parameters() if p.grad is not None}

    def regrad() -> None:  # zero_grad has something to clear at every call
        for p, g in grads.items():
            p.grad = g

    def own_zero_grad() -> None:
        regrad()
        torch.nn.Module.zero_grad(model)

    walks = StepWalks(model)

    def listed_zero_grad() -> None:
        regrad()
        walks.zero_grad()

    calls = {
        "model.train()": (lambda: torch.nn.Module.train(model), walks.train),
        "FLOP estimate's parameter count": (
            lambda: model.num_parameters(exclude_embeddings=True),
            lambda: walks.flop_parameters(model),
        ),
        "clipping's model.parameters()": (
            lambda: list(model.parameters()),
            lambda: list(walks.parameters),
        ),
        "model.zero_grad()": (own_zero_grad, listed_zero_grad),
        "(restoring the gradients, in both zero_grad rows)": (regrad, regrad),
    }
    best: dict[str, dict[str, float]] = {}
    for name, (trainer, listed) in calls.items():
        rounds = {"trainer": [], "listed": []}
        for _ in range(args.repeat):  # in turns
            for way, fn in (("trainer", trainer), ("listed", listed)):
                rounds[way].append(timeit.timeit(fn, number=args.number) / args.number)
        best[name] = {way: 1000 * min(ts) for way, ts in rounds.items()}
        print(
            f"{name:48s} trainer {best[name]['trainer']:7.3f} ms  listed "
            f"{best[name]['listed']:7.3f} ms"
        )
    walks.release()
    restore = "(restoring the gradients, in both zero_grad rows)"
    per_step = {
        way: sum(v[way] for n, v in best.items() if n != restore) - best[restore][way]
        for way in ("trainer", "listed")
    }
    report = {
        "what": "host ms per optimizer step walking the module tree (best of rounds), CPU",
        "model": f"Qwen3-0.6B's structure ({LAYERS} layers) at hidden 64, LoRA r16 all-linear",
        "modules": sum(1 for _ in model.modules()),
        "parameters": sum(1 for _ in model.parameters()),
        "machine": _cpu(),
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "number": args.number,
        "repeat": args.repeat,
        "calls_ms": {n: {k: round(v, 4) for k, v in b.items()} for n, b in best.items()},
        "per_step_ms": {k: round(v, 3) for k, v in per_step.items()},
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2) + "\n")
    print(
        f"per step: trainer {per_step['trainer']:.2f} ms, listed {per_step['listed']:.2f} ms "
        f"({report['modules']} modules, {report['parameters']} parameters)"
    )
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
