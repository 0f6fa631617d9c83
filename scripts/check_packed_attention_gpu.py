"""Packed rows vs each example alone, on a GPU: max |logit difference| per kernel and dtype.

Packed rows carry restarting position_ids and no attention mask; sdpa (and eager) then build
the block-diagonal mask, flash-attention 2 uses the restarts as varlen boundaries. Each
example's logits inside the packed row must equal its logits when run alone.

    python scripts/check_packed_attention_gpu.py [--json] [--examples 6] [--layers 2]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys

TOLERANCE = {"float32": 1e-4, "bfloat16": 0.05}


def _model(attn: str, dtype, layers: int):
    import torch
    from transformers import AutoModelForCausalLM, Qwen3Config

    config = Qwen3Config(vocab_size=4096, hidden_size=256, intermediate_size=512,
                         num_hidden_layers=layers, num_attention_heads=8,
                         num_key_value_heads=4, head_dim=32, max_position_embeddings=4096)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation=attn)
    return model.cuda().eval()


def max_diff(attn: str, dtype_name: str, examples: int, layers: int) -> float:
    """Largest |packed - alone| over every token of every example."""
    import torch

    dtype = getattr(torch, dtype_name)
    model = _model(attn, dtype, layers)
    gen = torch.Generator().manual_seed(1)
    lengths = torch.randint(16, 300, (examples,), generator=gen).tolist()
    seqs = [torch.randint(0, 4096, (n,), generator=gen) for n in lengths]
    ids = torch.cat(seqs).unsqueeze(0).cuda()
    pos = torch.cat([torch.arange(n) for n in lengths]).unsqueeze(0).cuda()
    worst = 0.0
    with torch.no_grad():
        packed = model(input_ids=ids, position_ids=pos, use_cache=False).logits[0].float()
        start = 0
        for seq in seqs:
            alone = model(input_ids=seq.unsqueeze(0).cuda(), use_cache=False).logits[0].float()
            part = packed[start:start + len(seq)]
            worst = max(worst, (part - alone).abs().max().item())
            start += len(seq)
    return worst


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--examples", type=int, default=6)
    parser.add_argument("--layers", type=int, default=2)
    args = parser.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("no CUDA GPU: nothing to check", file=sys.stderr)
        return 2
    cases = [("sdpa", "float32"), ("sdpa", "bfloat16")]
    if importlib.util.find_spec("flash_attn") is not None:
        cases.append(("flash_attention_2", "bfloat16"))  # flash-attn runs in half precision
    else:
        print("flash-attn is not installed: flash_attention_2 not checked", file=sys.stderr)
    results = []
    for attn, dtype in cases:
        diff = max_diff(attn, dtype, args.examples, args.layers)
        results.append({"attn": attn, "dtype": dtype, "max_abs_diff": diff,
                        "tolerance": TOLERANCE[dtype], "ok": diff <= TOLERANCE[dtype]})
    if args.json:
        print(json.dumps({"gpu": torch.cuda.get_device_name(), "results": results}))
    else:
        for r in results:
            print(f"{r['attn']:18s} {r['dtype']:9s} max |packed - alone| = "
                  f"{r['max_abs_diff']:.3g} (tolerance {r['tolerance']:g}) "
                  f"{'ok' if r['ok'] else 'FAIL'}")
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
