"""Build a benchmark expert: the Qwen3-0.6B architecture (random init), Qwen's real tokenizer,
and a few thousand real-world SFT examples of widely varying length, all offline.

The examples are made from the Python standard library installed on this machine: a user asks
about a function or class (its signature and docstring) and the assistant answers with its
source. Lengths range from a few hundred to tens of thousands of characters, like real SFT data.

    python scripts/make_bench_expert.py --out bench_results/tmp/qwen3-expert --examples 4000
"""

from __future__ import annotations

import argparse
import ast
import json
import random
import sys
import sysconfig
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

QWEN3_0_6B = {
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 151936,
    "hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 28,
    "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
    "max_position_embeddings": 40960, "rope_theta": 1000000.0, "rms_norm_eps": 1e-06,
    "tie_word_embeddings": True, "hidden_act": "silu", "attention_bias": False,
    "bos_token_id": 151643, "eos_token_id": 151645, "pad_token_id": 151643,
    "dtype": "bfloat16",
}
SYSTEM = "You are a senior Python developer. Answer with code from the standard library."


def _examples_from_file(path: Path) -> list[tuple[str, str]]:
    """(question, answer) pairs for the documented functions and classes of one module."""
    try:
        source = path.read_text(encoding="utf-8")
        tree = ast.parse(source)
    except (SyntaxError, UnicodeDecodeError, ValueError):
        return []
    module = path.stem
    pairs = []
    for node in tree.body:
        if not isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            continue
        doc = ast.get_docstring(node)
        code = ast.get_source_segment(source, node)
        if not doc or not code or len(code) < 200:
            continue
        kind = "class" if isinstance(node, ast.ClassDef) else "function"
        question = (f"Write the {kind} `{node.name}` of the Python module `{module}`. "
                    f"Its documentation says:\n\n{doc}")
        pairs.append((question, f"```python\n{code}\n```"))
    return pairs


def build_corpus(n_examples: int, seed: int = 0) -> list[dict[str, str]]:
    """ChatML `text` rows from the standard library, shuffled, at most `n_examples`."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    pairs: list[tuple[str, str]] = []
    for path in sorted(stdlib.glob("*.py")) + sorted(stdlib.glob("*/*.py")):
        if "test" not in path.parts and "idlelib" not in path.parts:
            pairs += _examples_from_file(path)
    random.Random(seed).shuffle(pairs)
    return [
        {"text": f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n{q}<|im_end|>\n"
                 f"<|im_start|>assistant\n{a}<|im_end|>\n"}
        for q, a in pairs[:n_examples]
    ]


def manifest(max_seq_length: int, batch_size: int) -> dict:
    return {
        "name": "expert-bench", "version": "0.1.0", "schema_version": "2.0",
        "description": "Qwen3-0.6B architecture (random init) on standard-library SFT data.",
        "base_models": [{"name": "model", "init": "random", "prompt_template": "chatml",
                         "adapters": [{"type": "lora", "r": 16, "alpha": 32,
                                       "target_modules": "all-linear"}]}],
        "training": {
            "dataset": {"path": "data/train.jsonl", "format": "jsonl",
                        "field_mapping": {"text": "text"}},
            "config": {"method": "sft", "adapter_type": "lora", "rank": 16, "alpha": 32,
                       "dropout": 0.0, "target_modules": "all-linear", "epochs": 1,
                       "learning_rate": 2e-4, "batch_size": batch_size,
                       "gradient_accumulation_steps": 1, "max_seq_length": max_seq_length,
                       "packing": True, "logging_steps": 5, "save_strategy": "no",
                       "evaluation_strategy": "no"},
        },
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("bench_results/tmp/qwen3-expert"))
    parser.add_argument("--examples", type=int, default=4000)
    parser.add_argument("--max-seq-length", type=int, default=2048)
    parser.add_argument("--batch-size", type=int, default=8)
    args = parser.parse_args()
    from qwen_tokenizer import build_qwen_tokenizer  # scripts/qwen_tokenizer.py

    out: Path = args.out
    (out / "model").mkdir(parents=True, exist_ok=True)
    (out / "data").mkdir(parents=True, exist_ok=True)
    build_qwen_tokenizer().save_pretrained(out / "model")
    (out / "model" / "config.json").write_text(json.dumps(QWEN3_0_6B, indent=2))
    rows = build_corpus(args.examples)
    with (out / "data" / "train.jsonl").open("w", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")
    (out / "manifest.json").write_text(json.dumps(manifest(args.max_seq_length,
                                                           args.batch_size), indent=2))
    lengths = sorted(len(r["text"]) for r in rows)
    print(f"{out}: {len(rows)} examples, chars min {lengths[0]} median "
          f"{lengths[len(lengths) // 2]} max {lengths[-1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
