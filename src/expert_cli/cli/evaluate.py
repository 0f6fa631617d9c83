"""`expert-cli evaluate`: a trained adapter's loss, perplexity and token accuracy on held-out
examples (the test split, else validation), and the base's beside them."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from expert_cli.cli.options import JsonOpt

if TYPE_CHECKING:
    from rich.console import Console

    from expert_cli.train.evaluate import EvaluateResult, Scored, Scores


STOPPED = (
    "stopped before the scores: nothing was written (a test cache's finished shards are kept "
    "and the next call goes on from them)"
)


class SplitName(str, Enum):
    test = "test"
    validation = "validation"


def evaluate(
    adapter: Annotated[
        Path,
        typer.Option(
            "--adapter",
            metavar="RUN_DIR",
            help="A trained run folder (train's output), or one of its "
            "checkpoints/checkpoint-N folders.",
        ),
    ],
    split: Annotated[
        SplitName | None,
        typer.Option(
            help="The examples to score: test (training.dataset.test_path, or each task's "
            "test) or validation (default: test where the manifest names it, else validation).",
        ),
    ] = None,
    compare_base: Annotated[
        bool, typer.Option("--compare-base", help="Score the base model too (adapter off).")
    ] = False,
    batch_rows: Annotated[
        int | None,
        typer.Option(
            min=1,
            max=1024,
            metavar="N",
            help="Packed rows per forward pass (default: 16,384 tokens' worth).",
        ),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Score a trained adapter on held-out examples: loss, perplexity, token accuracy."""
    import json

    from expert_cli.atomic import sigterm_raises
    from expert_cli.cli.render import BuildBar, console
    from expert_cli.errors import Interrupted, Terminated
    from expert_cli.train.evaluate import EvaluateOptions
    from expert_cli.train.evaluate import evaluate as run_evaluate

    opts = EvaluateOptions(
        adapter=adapter,
        split=split.value if split else None,
        compare_base=compare_base,
        batch_rows=batch_rows,
    )
    bar = BuildBar()  # the test cache's build, then the scoring: one bar each, on stderr
    try:
        with sigterm_raises():  # SIGTERM as Ctrl-C: a line saying what was left
            result = run_evaluate(opts, bar, bar)
    except (KeyboardInterrupt, Terminated) as exc:
        code = exc.code if isinstance(exc, Terminated) else 130
        raise Interrupted(STOPPED, code) from None
    finally:
        bar.stop()
    if as_json:
        typer.echo(json.dumps(result.to_dict(), indent=2, ensure_ascii=False))
        return
    print_evaluation(console(), result)


def print_evaluation(out: Console, result: EvaluateResult) -> None:
    """The split, a table of the expert's (and the base's) figures, each task's, and notes."""
    from rich.table import Table

    from expert_cli.cli.render import labelled

    total = result.total
    out.print(
        f"[bold]{result.split} split[/bold]: {total.examples:,} examples, "
        f"{total.trained_tokens:,} trained tokens ({total.source})",
        highlight=False,
    )
    table = Table(box=None, pad_edge=False, show_edge=False)
    for name in ("", "model", "loss", "perplexity", "token accuracy"):
        table.add_column(name, justify="left" if name in ("", "model") else "right")
    shown = result.by_task
    for part in [*shown, total]:
        label = part.task if part.task is not None else ("all" if shown else "")
        for row in _rows(part):
            table.add_row(label, *row)
            label = ""
    out.print(table)
    for note in result.notes:
        out.print(labelled("note", "yellow", note, 10))


def _rows(part: Scored) -> list[list[str]]:
    rows = [["expert", *_figures(part.expert)]]
    if part.base is not None:
        rows.append(["base", *_figures(part.base)])
        expert, base = part.expert, part.base
        if expert.loss is not None and base.loss is not None:
            accuracy = (expert.token_accuracy or 0) - (base.token_accuracy or 0)
            change = f"{expert.loss - base.loss:+.4f}"
            rows.append(["change", change, "", f"{accuracy * 100:+.1f} pts"])
    return rows


def _figures(scores: Scores) -> list[str]:
    """Loss, perplexity, token accuracy as shown; `-` for what there is none of (no trained
    token; a perplexity beyond a float)."""
    if scores.loss is None or scores.token_accuracy is None:
        return ["-", "-", "-"]
    ppl = scores.perplexity
    shown = "-" if ppl is None else f"{ppl:,.2f}" if ppl < 1e6 else f"{ppl:.3g}"
    return [f"{scores.loss:.4f}", shown, f"{scores.token_accuracy * 100:.1f}%"]
