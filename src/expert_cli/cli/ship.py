"""`expert-cli generate`, `report` and `package`: try a trained run, picture it, ship it."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from expert_cli.cli.options import AdapterOpt, JsonOpt

SHOWN_ADAPTERS = 8  # report lists the last checkpoints, the lowest and the shipped one

if TYPE_CHECKING:
    from expert_cli.train.package_check import PackageReport


def generate(
    adapter: AdapterOpt,
    prompt: Annotated[
        list[str] | None,
        typer.Option("--prompt", "-p", metavar="TEXT", help="A prompt; repeat for several."),
    ] = None,
    prompts: Annotated[
        Path | None,
        typer.Option(metavar="FILE", help="A text file of prompts, one per line."),
    ] = None,
    eval_n: Annotated[
        int | None,
        typer.Option(
            "--eval",
            min=1,
            max=10_000,
            metavar="N",
            help="Answer the first N validation examples; show references and exact match.",
        ),
    ] = None,
    compare_base: Annotated[
        bool, typer.Option("--compare-base", help="Also answer with the adapter switched off.")
    ] = False,
    max_new_tokens: Annotated[
        int | None,
        typer.Option(
            min=1, max=32_768, metavar="N", help="Tokens to generate at most (default 256)."
        ),
    ] = None,
    greedy: Annotated[
        bool, typer.Option("--greedy", help="Greedy decoding, whatever the manifest says.")
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Try a trained expert: its prompt template and decoding settings, answers streamed."""
    import json

    from expert_cli.cli.render import console
    from expert_cli.cli.train_view import GenerateView, print_generate_end
    from expert_cli.train.generate import GenerateOptions
    from expert_cli.train.generate import generate as run_generate

    opts = GenerateOptions(
        adapter=adapter,
        prompts=prompt or [],
        prompts_file=prompts,
        eval_n=eval_n,
        compare_base=compare_base,
        max_new_tokens=max_new_tokens,
        greedy=greedy,
    )
    if as_json:
        typer.echo(json.dumps(run_generate(opts).to_dict(), indent=2, ensure_ascii=False))
        return
    out = console()
    result = run_generate(opts, GenerateView(out))
    print_generate_end(out, result)


def report(
    run_dir: Annotated[Path, typer.Argument(metavar="RUN_DIR", help="A train output folder.")],
    output: Annotated[
        Path | None,
        typer.Option(metavar="FILE", help="Where to write the PNG (default RUN_DIR/training.png)."),
    ] = None,
    force: Annotated[
        bool,
        typer.Option("--force", help="Replace an existing FILE (RUN_DIR/training.png always)."),
    ] = False,
) -> None:
    """Draw a run's training.png (loss, learning rate, tokens/s, data wait) and summarise it."""
    from expert_cli.cli.render import console
    from expert_cli.train.report import PLOT_NAME, summarize

    result = summarize(run_dir, output or run_dir / PLOT_NAME, force)
    out = console()
    speed = "-" if result.tokens_per_s is None else f"{result.tokens_per_s:,.0f}"
    loss = "-" if result.final_loss is None else f"{result.final_loss:.4g}"
    best = (
        "-"
        if result.best_eval_loss is None
        else f"{result.best_eval_loss:.4g} at step {result.best_eval_step}"
    )
    out.print(
        f"{result.status}: {result.steps} steps, {speed} tok/s, final loss {loss}, "
        f"best eval loss {best}",
        markup=False,
    )
    for line in _adapter_lines(run_dir, result.best_eval_step, result.best_eval_loss):
        out.print(line, markup=False)
    out.print(f"wrote {result.plot}", markup=False)


def _adapter_lines(run_dir: Path, best_step: int | None, best_loss: float | None) -> list[str]:
    """The adapters the run keeps with their eval losses, which one is lowest, which one
    `package` ships and how to ship another (the last steps of HiveLLM's way: compare the
    checkpoints, then name one)."""
    from expert_cli.errors import UserError
    from expert_cli.paths import shown_path
    from expert_cli.train.choice import kept_adapters, lowest
    from expert_cli.train.package import default_choice, lower_loss_note

    adapters = kept_adapters(run_dir)
    if not adapters:
        return ["adapters  none kept (no final adapter, no complete checkpoint)"]
    try:
        ships, chosen_by = default_choice(run_dir)
    except UserError as exc:
        ships, chosen_by = None, ""
        lines = [f"package   cannot tell which adapter it ships: {exc.lines[-1]}"]
    else:
        lines = []
    low, who = lowest(adapters), f" ({chosen_by})" if chosen_by else ""
    shown = {a.name for a in adapters[-SHOWN_ADAPTERS:]} | {ships, low.name if low else None}
    hidden = sum(a.name not in shown for a in adapters)
    first = True
    for a in adapters:
        if a.name not in shown:
            continue
        marks = ["lowest"] if low and a.name == low.name else []
        if a.name == ships:
            marks.append(f"package ships it{who}")
        step = "-" if a.step is None else str(a.step)
        loss = "-" if a.eval_loss is None else f"{a.eval_loss:.4g}"
        label, first = ("adapters" if first else ""), False
        row = f"{label:<9} {a.name:<18} step {step:>7}  eval loss {loss:>8}"
        lines.append(row + ("  " + "; ".join(marks) if marks else ""))
    if hidden:
        lines.append(f"{'':<9} and {hidden} more checkpoints")
    if ships == "final" and ships not in {a.name for a in adapters}:
        lines.append(
            f"package   ships the final adapter{who}, which the run did not write (it stopped "
            "before its end): --checkpoint NAME ships one it keeps"
        )
    elif ships is not None and ships not in {a.name for a in adapters}:
        lines.append(
            f"package   ships {ships}{who}, which the run does not keep: name one "
            "it keeps, or final"
        )
    elif ships is not None:
        ship = f"expert-cli package --adapter {shown_path(run_dir)} --checkpoint best"
        if note := lower_loss_note(run_dir, ships, ship):
            lines.append(f"note      {note}")
    kept_low = low.eval_loss if low and low.eval_loss is not None else math.inf
    if best_loss is not None and best_loss < kept_low:
        lines.append(
            f"note      the lowest eval loss, {best_loss:.4g} at step {best_step}, has no "
            "checkpoint: save_steps equal to eval_steps keeps one at each evaluation"
        )
    return lines


def package(
    adapter: AdapterOpt,
    output: Annotated[
        Path | None,
        typer.Option(
            metavar="FILE",
            help="The package to write (default: {name}-{base}.v{version}.expert beside RUN_DIR).",
        ),
    ] = None,
    force: Annotated[
        bool, typer.Option("--force", help="Replace a package (and .sha256) of that name.")
    ] = False,
    checkpoint: Annotated[
        str | None,
        typer.Option(
            metavar="NAME",
            help="Ship checkpoint-N of the run, final, or best (the lowest eval loss; "
            "default: the manifest's training.packaging_checkpoint, else final).",
        ),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Build the HiveLLM .expert package of a run, with its .sha256, and verify it."""
    import json

    from expert_cli.train.package import build_package

    report = build_package(adapter, output, force, checkpoint)
    if as_json:
        typer.echo(json.dumps(report.to_dict(), indent=2))
        return
    render_package(report, "wrote")


def render_package(report: PackageReport, verb: str) -> None:
    """A package's files, checksum and notes (and problems, for check --package)."""
    from rich.table import Table

    from expert_cli.cli.render import console, plain, quoted
    from expert_cli.data.discovery import human_size

    out = console()
    man = report.manifest
    table = Table(
        "file",
        "size",
        title=plain(
            f"{man.get('name')} {man.get('version')} (schema {man.get('schema_version')})"
            if man
            else "no manifest that can be read"
        ),
    )
    for name, size in report.files.items():
        table.add_row(plain(name), human_size(size))
    out.print(table)
    for note in report.notes:
        out.print(f"[yellow]note[/yellow]  {quoted(note)}", highlight=False)
    for problem in report.problems:
        out.print(f"[bold red]problem[/bold red]  {quoted(problem)}", highlight=False)
    out.print(f"{verb} {report.path} (sha256 {report.sha256})", markup=False)
    if report.checksum_file is not None:
        out.print(f"checksum {report.checksum_file}", markup=False)
