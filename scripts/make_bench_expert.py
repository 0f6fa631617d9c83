"""Build a benchmark expert: the Qwen3-0.6B architecture (random init), Qwen's real tokenizer,
and a few thousand real-world SFT examples of widely varying length, all offline.

The examples are the data benchmark's corpus (scripts/bench_data.py `build_corpus`): the Python
standard library on this machine, a docstring as the prompt and the source as the answer, from a
few hundred to tens of thousands of characters, like real SFT data. `--task explain` turns
them round (the code as the prompt, its documentation as the answer): most of each example is
an untrained prompt, as in HiveLLM's SQL, JSON and Cypher experts (a schema or a document,
then a short answer).

    python scripts/make_bench_expert.py --out bench_results/tmp/qwen3-expert --examples 4000
    python scripts/make_bench_expert.py --out bench_results/tmp/qwen3-explain --task explain
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

TOKEN_IDS = {"bos_token_id": 151643, "eos_token_id": 151645, "pad_token_id": 151643}
TASKS = {
    "write": "the documentation as the prompt, the code as the answer",
    "explain": "the code as the prompt, its documentation as the answer",
}


def manifest(max_seq_length: int, batch_size: int, task: str = "write") -> dict:
    return {
        "name": "expert-bench" if task == "write" else f"expert-bench-{task}",
        "version": "0.1.0",
        "schema_version": "2.0",
        "description": f"Qwen3-0.6B architecture (random init) on standard-library SFT data "
        f"({TASKS[task]}).",
        "base_models": [
            {
                "name": "model",
                "init": "random",
                "prompt_template": "chatml",
                "adapters": [
                    {"type": "lora", "r": 16, "alpha": 32, "target_modules": "all-linear"}
                ],
            }
        ],
        "training": {
            "dataset": {
                "path": "data/train.jsonl",
                "format": "jsonl",
                "field_mapping": {"text": "text"},
            },
            "config": {
                "method": "sft",
                "adapter_type": "lora",
                "rank": 16,
                "alpha": 32,
                "dropout": 0.0,
                "target_modules": "all-linear",
                "epochs": 1,
                "learning_rate": 2e-4,
                "batch_size": batch_size,
                "gradient_accumulation_steps": 1,
                "max_seq_length": max_seq_length,
                "packing": True,
                "logging_steps": 5,
                "save_strategy": "no",
                "evaluation_strategy": "no",
            },
        },
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("bench_results/tmp/qwen3-expert"))
    parser.add_argument("--examples", type=int, default=4000)
    parser.add_argument("--max-seq-length", type=int, default=2048)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--task", choices=sorted(TASKS), default="write")
    args = parser.parse_args()
    from bench_data import build_corpus  # scripts/bench_data.py
    from qwen_tokenizer import build_qwen_tokenizer  # scripts/qwen_tokenizer.py

    out: Path = args.out
    (out / "model").mkdir(parents=True, exist_ok=True)
    (out / "data").mkdir(parents=True, exist_ok=True)
    build_qwen_tokenizer().save_pretrained(out / "model")
    from expert_cli.telemetry.workload import QWEN3_0_6B

    config = {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        **QWEN3_0_6B,
        "hidden_act": "silu",
        "attention_bias": False,
        **TOKEN_IDS,
        "dtype": "bfloat16",
    }
    (out / "model" / "config.json").write_text(json.dumps(config, indent=2))
    texts = build_corpus(args.examples, seed=0, explain=args.task == "explain")
    rows = [{"text": text} for text in texts]
    with (out / "data" / "train.jsonl").open("w", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")
    (out / "manifest.json").write_text(
        json.dumps(manifest(args.max_seq_length, args.batch_size, args.task), indent=2)
    )
    lengths = sorted(len(r["text"]) for r in rows)
    print(
        f"{out}: {len(rows)} examples, chars min {lengths[0]} median "
        f"{lengths[len(lengths) // 2]} max {lengths[-1]}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
