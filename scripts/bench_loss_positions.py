"""The fused loss with the LM head run on the trained tokens alone, against every token.

An SFT example's prompt is untrained (its labels are -100), yet the loss used to multiply
every token's hidden state by the whole vocabulary: for Qwen3-0.6B the head (151,936 x 1,024)
is about a fifth of a training step's FLOPs at 2,048-token examples. The collator now passes
the positions whose next token is trained, and the loss runs the head on those alone
(`expert_cli.train.loss`, `loss_positions`).

Timed here: the fused loss's forward and backward (`causal_lm_loss` with the `chunked`
backend: the head's two GEMMs a slice and the cross-entropy) for one row of `--tokens`
tokens at Qwen3-0.6B's hidden size and vocabulary, fp32 on this CPU, with a trained share of
100%, 50% and 20% (the answer after the prompt), each with the loss positions and without.
Rounds interleave the cases; the best of `--repeat` is kept (the machine is shared). Also
written: the head's share of a Qwen3-0.6B LoRA step's FLOPs as `telemetry.flops` counts them
(arithmetic, not a measurement), so the whole step's saving can be read for a trained share.
A GPU step is timed by `bench_train.py`'s `f_loss_every_token` against `e_default`.

    python scripts/bench_loss_positions.py        # JSON to bench_results/loss_positions.json
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

from bench_step_ops import provenance, write_report  # noqa: E402

VOCAB, HIDDEN = 151_936, 1_024  # Qwen3-0.6B
SHARES = (1.0, 0.5, 0.2)
EXAMPLE_LENGTHS = (512, 2048)  # tokens a token attends over, for the step's FLOPs


def _case(tokens: int, share: float) -> tuple[Any, Any, Any]:
    """(hidden, labels, positions): one row whose last `share` of tokens is trained."""
    import torch

    from expert_cli.data.collate import trained_positions

    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(1, tokens, HIDDEN, generator=gen) * 0.05
    labels = torch.randint(0, VOCAB, (1, tokens), generator=gen)
    labels[0, : tokens - round(share * tokens)] = -100
    return hidden, labels, torch.from_numpy(trained_positions(labels.numpy()))


def _time(case: tuple[Any, Any, Any], weight: Any, only: bool) -> tuple[float, float]:
    """Seconds of one forward and backward of the loss, and the loss."""
    from expert_cli.train.loss import causal_lm_loss

    hidden, labels, positions = case
    h = hidden.clone().requires_grad_(True)
    start = time.perf_counter()
    loss = causal_lm_loss("chunked", h, weight, labels, None, positions if only else None)
    loss.backward()
    return time.perf_counter() - start, float(loss.detach())


def head_share(trained: float, attended: int) -> float:
    """The FLOPs a Qwen3-0.6B LoRA step saves with the head on the trained tokens alone, as a
    share of the step's FLOPs with the head on every token (telemetry.flops' count)."""
    from expert_cli.telemetry.throughput import FlopsModel

    qwen3 = FlopsModel(606_000_000, 10_100_000, 28, 1024, 2048, None, head_params=VOCAB * HIDDEN)
    every = qwen3.per_token(attended)
    return 1.0 - qwen3.per_token(attended, trained) / every


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=1024)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--output", type=Path, default=ROOT / "bench_results/loss_positions.json")
    args = parser.parse_args()
    if not 64 <= args.tokens <= 16_384 or not 1 <= args.repeat <= 20:
        parser.error("--tokens must be 64..16384 and --repeat 1..20")
    import torch

    weight = torch.randn(VOCAB, HIDDEN, generator=torch.Generator().manual_seed(1)) * 0.02
    cases = {share: _case(args.tokens, share) for share in SHARES}
    best: dict[tuple[float, bool], float] = {}
    losses: dict[tuple[float, bool], float] = {}
    for _ in range(args.repeat):
        for share, case in cases.items():
            for only in (False, True):
                seconds, losses[share, only] = _time(case, weight, only)
                best[share, only] = min(best.get((share, only), seconds), seconds)
    rows = []
    for share in SHARES:
        every, only = best[share, False], best[share, True]
        rows.append(
            {
                "trained_share": share,
                "every_token_s": round(every, 4),
                "trained_only_s": round(only, 4),
                "speedup": round(every / only, 3),
                "loss_every_token": losses[share, False],
                "loss_trained_only": losses[share, True],
                "step_flops_saved": {n: round(head_share(share, n), 4) for n in EXAMPLE_LENGTHS},
            }
        )
        saved = ", ".join(f"{head_share(share, n):.1%} at {n}" for n in EXAMPLE_LENGTHS)
        print(
            f"trained {share:4.0%}: every token {every:.3f} s, trained only {only:.3f} s "
            f"({every / only:.2f}x); a Qwen3-0.6B step's FLOPs fewer by {saved}-token examples"
        )
    report = {
        "what": "fused loss (chunked, fp32) forward + backward, one row, Qwen3-0.6B head",
        "tokens": args.tokens,
        "repeat": args.repeat,
        "rows": rows,
        **provenance(),
    }
    write_report(args.output, report)


if __name__ == "__main__":
    main()
