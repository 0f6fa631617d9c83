"""`expert-cli generate`, `report` and `package`: try a trained run, picture it, ship it."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from expert_cli.cli.evaluate import SplitName
from expert_cli.cli.options import AdapterOpt, JsonOpt, file_named

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
        typer.Option(metavar="FILE", help="A text file of prompts, one per line (- for stdin)."),
    ] = None,
    eval_n: Annotated[
        int | None,
        typer.Option(
            "--eval",
            min=1,
            max=10_000,
            metavar="N",
            help="Answer the first N validation (or --split test) examples; show references "
            "and exact match.",
        ),
    ] = None,
    split: Annotated[
        SplitName | None,
        typer.Option(
            help="The examples --eval takes: validation (default) or test "
            "(training.dataset.test_path, or each task's test).",
        ),
    ] = None,
    compare_base: Annotated[
        bool, typer.Option("--compare-base", help="Also answer with the adapter switched off.")
    ] = False,
    max_new_tokens: Annotated[
        int | None,
        typer.Option(
            min=1,
            max=32_768,
            metavar="N",
            help=(
                "Tokens to generate at most (default: the manifest's "
                "training.decoding.max_new_tokens, else 256)."
            ),
        ),
    ] = None,
    greedy: Annotated[
        bool, typer.Option("--greedy", help="Greedy decoding, whatever the manifest says.")
    ] = False,
    system: Annotated[
        str | None,
        typer.Option(
            metavar="TEXT", help="A system turn before each prompt, laid out as the data's."
        ),
    ] = None,
    tools: Annotated[
        Path | None,
        typer.Option(
            metavar="FILE",
            help="Tool definitions (a JSON list, as the data's `tools`) the chat template "
            "writes before each prompt.",
        ),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Try a trained expert: its prompt template and decoding settings, answers streamed."""
    import json

    from expert_cli.atomic import sigterm_raises
    from expert_cli.cli.generate_view import GenerateView, print_generate_end
    from expert_cli.cli.render import console
    from expert_cli.errors import Interrupted, Terminated
    from expert_cli.train.generate import GenerateOptions
    from expert_cli.train.generate import generate as run_generate

    opts = GenerateOptions(
        adapter=adapter,
        prompts=prompt or [],
        prompts_file=prompts,
        eval_n=eval_n,
        split=split.value if split else None,
        compare_base=compare_base,
        max_new_tokens=max_new_tokens,
        greedy=greedy,
        system=system,
        tools_file=tools,
    )
    try:
        with sigterm_raises():  # SIGTERM and SIGHUP as Ctrl-C: a line, and JSON under --json
            if as_json:
                result = run_generate(opts)
                typer.echo(json.dumps(result.to_dict(), indent=2, ensure_ascii=False))
                return
            out = console()
            result = run_generate(opts, GenerateView(out))
            print_generate_end(out, result)
    except (KeyboardInterrupt, Terminated) as exc:
        code = exc.code if isinstance(exc, Terminated) else 130
        raise Interrupted(
            "stopped before the answers were all given (generate writes no file)", code
        ) from None


def report(
    run_dir: Annotated[Path, typer.Argument(metavar="RUN_DIR", help="A train output folder.")],
    output: Annotated[
        Path | None,
        typer.Option(
            metavar="FILE",
            parser=file_named("--output"),
            help="Where to write the picture: .png, .svg or .pdf (default RUN_DIR/training.png).",
        ),
    ] = None,
    force: Annotated[
        bool,
        typer.Option("--force", help="Replace an existing FILE (RUN_DIR/training.png always)."),
    ] = False,
) -> None:
    """Draw a run's training.png (loss, learning rate, tokens/s, data wait) and summarise it."""
    from expert_cli.cli.render import console
    from expert_cli.errors import escaped
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
    if result.best_eval_accuracy is not None:
        best += f", token accuracy {result.best_eval_accuracy:.1%}"
    if result.base_eval_loss is not None:
        best += f" (before training: {result.base_eval_loss:.4g})"
    by = f" of task {result.chosen_by}" if result.chosen_by else ""  # metric_for_best_model
    out.print(
        f"{result.status}: {result.steps} steps, {speed} tok/s, final loss {loss}, "
        f"best eval loss{by} {best}",
        markup=False,
    )
    if result.best_eval_tasks:  # a multi_task expert's best evaluation, task by task
        tasks = [
            f"{name} {loss:.4g}" + (f" ({accuracy:.1%})" if accuracy is not None else "")
            for name, (loss, accuracy) in result.best_eval_tasks.items()
        ]
        out.print(f"by task   {'  '.join(tasks)}", markup=False)
    if result.status_note:
        out.print(f"status    {result.status_note}", markup=False)
    listing = result.adapters
    if not listing.rows:
        out.print("adapters  none kept (no final adapter, no complete checkpoint)")
    for i, row in enumerate(listing.rows):
        step = "-" if row.step is None else str(row.step)
        loss = "-" if row.eval_loss is None else f"{row.eval_loss:.4g}"
        line = (
            f"{'adapters' if i == 0 else '':<9} {row.name:<18} step {step:>7}  eval loss {loss:>8}"
        )
        out.print(line + ("  " + "; ".join(row.marks) if row.marks else ""), markup=False)
    if listing.hidden:
        out.print(f"{'':<9} and {listing.hidden} more checkpoints", markup=False)
    for label, text in listing.notes:
        out.print(f"{label:<9} {text}", markup=False)
    if result.plot is not None:
        out.print(f"wrote {escaped(str(result.plot))}", markup=False)
    if result.plot_problem:
        out.print(f"picture   {result.plot_problem}", markup=False)


def package(
    adapter: AdapterOpt,
    output: Annotated[
        Path | None,
        typer.Option(
            metavar="FILE",
            parser=file_named("--output"),
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

    from expert_cli.atomic import sigterm_raises
    from expert_cli.cli.render import echo, keep_going_without_output
    from expert_cli.errors import Terminated, left_by
    from expert_cli.paths import shown_path
    from expert_cli.train.package import build_package

    keep_going_without_output()  # `| head -1`: the package is the product, not its lines
    with sigterm_raises():  # SIGTERM as Ctrl-C: a line saying what was left
        report = build_package(adapter, output, force, checkpoint)
        try:
            if as_json:
                echo(json.dumps(report.to_dict(), indent=2))
                return
            render_package(report, "wrote")
        except (KeyboardInterrupt, Terminated) as exc:
            shown = shown_path(report.path)
            raise left_by(exc, "the package", shown, f"{shown} and its .sha256 were") from None


SHOWN_FILES = 50  # a package's files listed; a real package has about ten


def render_package(report: PackageReport, verb: str) -> None:
    """A package's files, checksum and notes (and problems, for check --package)."""
    from rich.table import Table

    from expert_cli.cli.render import console, labelled, plain
    from expert_cli.data.discovery import human_size

    out = console()
    man = report.manifest
    table = Table(
        "file",
        "size",
        title=plain(
            " ".join(_cut(man.get(k)) for k in ("name", "version"))
            + f" (schema {_cut(man.get('schema_version'))})"
            if man
            else "no manifest that can be read"
        ),
    )
    for name, size in list(report.files.items())[:SHOWN_FILES]:
        table.add_row(plain(name), human_size(size))
    if len(report.files) > SHOWN_FILES:  # a package of 10,000 members printed them all
        table.add_row(f"and {len(report.files) - SHOWN_FILES:,} more files", "")
    out.print(table)
    for note in report.notes:
        out.print(labelled("note", "yellow", note, 6))
    for problem in report.problems:
        out.print(labelled("problem", "bold red", problem, 9))
    out.print(f"{verb} {report.path} (sha256 {report.sha256})", markup=False)
    if report.checksum_file is not None:
        out.print(f"checksum {report.checksum_file}", markup=False)


def _cut(text: str | None, most: int = 80) -> str:
    """A manifest's name, version or schema as a title shows it: HiveLLM's loader reads any
    string there, so a long one is cut."""
    text = str(text)
    return text if len(text) <= most else f"{text[: most - 1]}…"
