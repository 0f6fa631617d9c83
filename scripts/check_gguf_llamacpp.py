"""Cross-check `expert-cli export-gguf` against llama.cpp itself: the logits llama.cpp gives
with the exported adapter must be peft's, as its logits without it are transformers'.

For each architecture (Qwen3, and Llama, whose q and k rows llama.cpp reorders), the script
builds a small random base with Qwen's real tokenizer (scripts/qwen_tokenizer.py; llama.cpp's
converter recognises it), converts it to GGUF with llama.cpp's own `convert_hf_to_gguf.py`,
trains an expert on it with `expert-cli train`, exports the adapter in each stored type, and
evaluates one text with llama-cpp-python, with and without `--lora`, beside transformers and
peft. The adapter must move the logits far more than the two engines differ.

Needs llama-cpp-python (built from its sdist, which vendors llama.cpp) and a llama.cpp
source tree for the converter (the sdist's vendor/llama.cpp will do):

    python scripts/check_gguf_llamacpp.py --llama-cpp /path/to/llama.cpp \
        --out bench_results/gguf_llamacpp.json

Writes JSON: versions, and per architecture and type the largest logit differences.
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

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from qwen_tokenizer import build_qwen_tokenizer  # noqa: E402

TEXT = (
    "The adapter is exported as a GGUF file, and llama.cpp applies it to the base model "
    "at any quantization: the logits must agree with peft's."
)
SIZES = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 512,
    "rms_norm_eps": 1e-6,
}
VOCAB = 151_936  # Qwen3's embedding rows
OUT_TYPES = ("f32", "f16", "bf16")


def build_base(kind: str, folder: Path) -> Path:
    """A random-init base of `kind` (qwen3 or llama) with Qwen's tokenizer, saved in fp32."""
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen3Config

    tokenizer = build_qwen_tokenizer()
    ids = {"bos_token_id": 151643, "eos_token_id": 151645, "pad_token_id": 151643}
    if kind == "qwen3":
        config = Qwen3Config(vocab_size=VOCAB, tie_word_embeddings=True, **SIZES, **ids)
    else:
        config = LlamaConfig(vocab_size=VOCAB, tie_word_embeddings=False, **SIZES, **ids)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).to(torch.float32)
    with torch.no_grad():  # weights large enough that the layers matter to the logits
        for name, param in model.named_parameters():
            if param.dim() == 2 and "embed" not in name and "lm_head" not in name:
                param.normal_(0, 0.2)
    base = folder / f"{kind}-base"
    model.save_pretrained(base, safe_serialization=True)
    tokenizer.save_pretrained(base)
    return base


def convert_base(base: Path, llama_cpp: Path) -> Path:
    out = base.with_suffix(".gguf")
    command = [
        sys.executable,
        str(llama_cpp / "convert_hf_to_gguf.py"),
        str(base),
        "--outfile",
        str(out),
        "--outtype",
        "f32",
    ]
    subprocess.run(command, check=True, capture_output=True, text=True)
    return out


def train_expert(base: Path, folder: Path) -> Path:
    """A LoRA expert trained on `base` for 30 steps at a high rate: an adapter that moves
    the logits well past the engines' rounding."""
    data = folder / "data.jsonl"
    rows = [
        {"text": f"{TEXT} Example {i}: {' '.join(['token'] * (i % 7 + 3))}."} for i in range(64)
    ]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    manifest = {
        "name": "gguf-check",
        "version": "0.0.1",
        "schema_version": "2.0",
        "description": "llama.cpp cross-check",
        "author": "expert-cli",
        "base_models": [
            {"name": str(base), "prompt_template": "chatml", "adapters": [{"type": "lora"}]}
        ],
        "training": {
            "dataset": {"path": str(data), "format": "jsonl", "field_mapping": {"text": "text"}},
            "config": {
                "rank": 8,
                "alpha": 16,
                "dropout": 0.0,
                "learning_rate": 1e-2,
                "batch_size": 4,
                "max_seq_length": 64,
                "warmup_steps": 0,
                "lr_scheduler": "constant",
                "evaluation_strategy": "no",
            },
        },
    }
    path = folder / f"{base.name}-manifest.json"
    path.write_text(json.dumps(manifest))
    out = folder / f"{base.name}-run"
    command = [sys.executable, "-m", "expert_cli.cli", "train", "-m", str(path)]
    subprocess.run([*command, "--output", str(out), "--max-steps", "30"], check=True)
    return out


def export(run: Path, outtype: str) -> Path:
    path = run.parent / f"{run.name}-{outtype}.gguf"
    command = [sys.executable, "-m", "expert_cli.cli", "export-gguf", "--adapter", str(run)]
    subprocess.run([*command, "--output", str(path), "--outtype", outtype], check=True)
    return path


def hf_logits(base: Path, run: Path, ids: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """transformers' logits of the base, and peft's with the run's adapter on it."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    adapted = PeftModel.from_pretrained(model, str(run)).eval()
    batch = torch.tensor([ids])
    with torch.no_grad():
        with adapted.disable_adapter():
            plain = adapted(input_ids=batch).logits[0].numpy()
        lora = adapted(input_ids=batch).logits[0].numpy()
    return plain, lora


def llama_logits(model: Path, ids: list[int], lora: Path | None) -> np.ndarray:
    from llama_cpp import Llama

    options = {"lora_path": str(lora)} if lora else {}
    llm = Llama(
        model_path=str(model), n_ctx=256, logits_all=True, verbose=False, n_threads=2, **options
    )
    llm.eval(ids)
    return np.array(llm.scores[: len(ids)], dtype=np.float32)


def check(kind: str, llama_cpp: Path, folder: Path) -> dict:
    base = build_base(kind, folder)
    base_gguf = convert_base(base, llama_cpp)
    run = train_expert(base, folder)
    ids = build_qwen_tokenizer()(TEXT)["input_ids"]
    plain, lora = hf_logits(base, run, ids)
    effect = float(np.abs(lora - plain).max())
    result = {
        "tokens": len(ids),
        "adapter_effect_max_abs": effect,
        "base_max_abs_diff": float(np.abs(llama_logits(base_gguf, ids, None) - plain).max()),
    }
    for outtype in OUT_TYPES:
        got = llama_logits(base_gguf, ids, export(run, outtype))
        diff = float(np.abs(got - lora).max())
        result[outtype] = {
            "lora_max_abs_diff": diff,
            "diff_over_effect": diff / effect,
            "same_argmax": float((got.argmax(-1) == lora.argmax(-1)).mean()),
        }
    if kind == "llama":  # the control: without llama.cpp's row order, q and k are wrong
        result["control_rows_not_reordered"] = _unreordered(run, base_gguf, ids, lora, effect)
    return result


def _unreordered(
    run: Path, base_gguf: Path, ids: list[int], lora: np.ndarray, effect: float
) -> dict:
    """The Llama adapter exported without reordering q and k rows: it must not match, or
    the check could not tell the order apart."""
    from expert_cli.train import gguf_export

    kept = set(gguf_export.ROTARY_REORDERED)
    gguf_export.ROTARY_REORDERED.clear()
    try:
        path = run.parent / "unreordered.gguf"
        gguf_export.export_gguf(run, path, outtype="f32")
    finally:
        gguf_export.ROTARY_REORDERED.update(kept)
    diff = float(np.abs(llama_logits(base_gguf, ids, path) - lora).max())
    return {"lora_max_abs_diff": diff, "diff_over_effect": diff / effect}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--llama-cpp", type=Path, required=True, help="llama.cpp source tree")
    parser.add_argument("--out", type=Path, default=Path("bench_results/gguf_llamacpp.json"))
    args = parser.parse_args()
    from importlib.metadata import version

    import llama_cpp
    import peft
    import transformers

    report = {
        "what": "expert-cli export-gguf adapters evaluated by llama.cpp beside peft",
        "command": " ".join(sys.argv),
        "machine": f"{platform.machine()} CPU, {os.cpu_count()} cores (no GPU)",
        "versions": {
            "llama_cpp_python": llama_cpp.__version__,
            "gguf": version("gguf"),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "peft": peft.__version__,
            "python": platform.python_version(),
        },
        "architectures": {},
    }
    with tempfile.TemporaryDirectory() as tmp:
        for kind in ("qwen3", "llama"):
            report["architectures"][kind] = check(kind, args.llama_cpp, Path(tmp))
            print(kind, json.dumps(report["architectures"][kind], indent=1), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    worst = max(
        r[t]["diff_over_effect"] for r in report["architectures"].values() for t in OUT_TYPES
    )
    control = report["architectures"]["llama"]["control_rows_not_reordered"]["diff_over_effect"]
    print(
        f"wrote {args.out}; the largest difference is {worst:.2%} of the adapter's effect "
        f"({control:.0%} with Llama's q and k rows left in transformers' order)"
    )
    return 0 if worst < 0.05 < control else 1


if __name__ == "__main__":
    raise SystemExit(main())
