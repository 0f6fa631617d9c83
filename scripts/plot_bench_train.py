"""Bar chart of the training benchmark: non-pad tokens/s per variant, from bench_train JSONs.

    python scripts/plot_bench_train.py bench_results/h100/step/bench-*.json \
        --output bench_results/h100/step/throughput.png
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def collect(paths: list[Path]) -> dict[str, dict]:
    """Every variant that ran, by name; a later file's row replaces an earlier one's."""
    rows: dict[str, dict] = {}
    for path in paths:
        report = json.loads(path.read_text())
        for name, result in report["results"].items():
            if result.get("tokens_per_s"):
                rows[name] = {**result, "source": path.name}
    return rows


SHORT = {"flash_attention_4": "fa4", "torch_varlen": "varlen", "flex_attention": "flex"}


def _kernel(result: dict) -> str:
    """The attention kernel a variant ran with, shortly (baselines a and b: sdpa)."""
    attn = (result.get("choices") or {}).get("attn_implementation") or "sdpa"
    return SHORT.get(attn, attn)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("reports", nargs="+", type=Path)
    parser.add_argument("--output", type=Path, required=True)
    parser.add_argument("--title", default="Qwen3-0.6B LoRA r16, packed rows of 2048, one H100")
    args = parser.parse_args()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = sorted(collect(args.reports).items(), key=lambda kv: kv[1]["tokens_per_s"])
    names = [f"{name} [{_kernel(r)}]" for name, r in rows]
    values = [r["tokens_per_s"] / 1000 for _, r in rows]
    colors = [
        "#c0392b" if n[0] in "abc" else "#2471a3" if n.startswith(("e_", "f_batch")) else "#7f8c8d"
        for n, _ in rows
    ]
    fig, ax = plt.subplots(figsize=(9, 0.38 * len(rows) + 1.2))
    ax.barh(names, values, color=colors)
    for y, (value, (_, r)) in enumerate(zip(values, rows, strict=True)):
        mfu = f"  MFU {100 * r['mfu']:.1f}%" if r.get("mfu") is not None else ""
        ax.text(value, y, f" {value:.1f}k{mfu}", va="center", fontsize=8)
    ax.axvline(75, color="#27ae60", linestyle="--", linewidth=1)
    ax.text(75, len(rows) - 0.4, " target 75k", color="#27ae60", fontsize=8)
    ax.set_xlabel("non-pad tokens/s (thousands)")
    ax.set_title(args.title, fontsize=10)
    ax.set_xlim(0, max(values) * 1.25)
    fig.tight_layout()
    fig.savefig(args.output, dpi=110)
    print(f"wrote {args.output} ({len(rows)} variants)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
