"""Write experts/demo/model/config.json: a small Qwen3 that trains on a CPU in seconds.

No weights are committed. The demo manifest says `"init": "random"`, so the trainer builds the
model from this config with random weights. The vocabulary is the tiny tokenizer's (already in
experts/demo/model/, from scripts/make_tiny_tokenizer.py) rounded up to a multiple of 64, as
Qwen pads its embedding matrix; there is no BOS token, so bos is `<|endoftext|>`, as in Qwen3.

`python scripts/make_demo_model_config.py [--count-params]`
"""

from __future__ import annotations

import argparse
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MODEL_DIR = REPO / "experts" / "demo" / "model"
VOCAB_MULTIPLE = 64

SIZES = {
    "hidden_size": 128,
    "intermediate_size": 384,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "max_position_embeddings": 2048,
}


def round_up(n: int, multiple: int = VOCAB_MULTIPLE) -> int:
    return -(-n // multiple) * multiple


def demo_config(model_dir: Path = MODEL_DIR):
    """The demo model's Qwen3Config, sized to the tokenizer saved in `model_dir`."""
    from transformers import AutoTokenizer, Qwen3Config

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    eos = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    return Qwen3Config(
        vocab_size=round_up(len(tokenizer)),
        **SIZES,
        rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0},
        tie_word_embeddings=True,
        dtype="float32",
        bos_token_id=eos,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )


def count_params(config) -> int:
    """Parameters of a model built from `config` (tied embeddings counted once)."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", type=Path, default=MODEL_DIR)
    parser.add_argument("--count-params", action="store_true")
    args = parser.parse_args()
    config = demo_config(args.model_dir)
    config.save_pretrained(args.model_dir)
    print(f"wrote {args.model_dir / 'config.json'} (vocab {config.vocab_size})")
    if args.count_params:
        print(f"parameters: {count_params(config):,}")


if __name__ == "__main__":
    main()
