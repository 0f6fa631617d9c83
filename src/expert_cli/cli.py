"""The `expert-cli` command line: parse, call one function, print, map errors to exit codes.

Heavy imports (torch, transformers, datasets) happen inside the commands so that
`expert-cli --help` answers at once.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from expert_cli.errors import RunError, UserError

app = typer.Typer(
    name="expert-cli",
    help="Train LoRA/DoRA/QLoRA expert adapters from HiveLLM manifests, and keep the GPU busy.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

_state = {"verbose": False}

ManifestOpt = Annotated[
    Path,
    typer.Option("--manifest", "-m", help="Path to the expert's manifest.json."),
]


@app.callback()
def _root(
    verbose: Annotated[
        bool, typer.Option("--verbose", "-v", help="Show tracebacks for failures.")
    ] = False,
) -> None:
    _state["verbose"] = verbose


@app.command()
def check(
    manifest: ManifestOpt,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Validate a manifest and everything it points at, without training."""
    from expert_cli.checks import check_manifest, render_report

    report = check_manifest(manifest)
    if as_json:
        typer.echo(json.dumps(report, indent=2, default=str))
    else:
        render_report(report)
    if report["problems"]:
        raise typer.Exit(code=2)


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def benchmark(
    duration: Annotated[
        float, typer.Option(help="Seconds to sample (a command is stopped after this).")
    ] = 60.0,
    interval: Annotated[float, typer.Option(help="Seconds between samples.")] = 1.0,
    output: Annotated[Path | None, typer.Option(help="Write the JSON report here.")] = None,
    plot: Annotated[Path | None, typer.Option(help="Write a PNG plot here.")] = None,
    gpu: Annotated[str, typer.Option(help="GPU index (or 0,1,...) or 'all'.")] = "all",
    metrics: Annotated[
        Path | None, typer.Option(help="A training run's metrics.json to read.")
    ] = None,
    workload: Annotated[
        str | None, typer.Option(help="Synthetic workload: qwen3-0.6b-lora or tiny.")
    ] = None,
    command: Annotated[
        list[str] | None, typer.Argument(help="-- CMD ARGS...: run and sample this command.")
    ] = None,
) -> None:
    """Sample GPU, CPU and RAM (optionally while a command or workload runs), and assess."""
    from rich.console import Console

    from expert_cli.benchmark import BenchmarkOptions, run_benchmark
    from expert_cli.benchmark_output import render_summary

    opts = BenchmarkOptions(
        duration=duration,
        interval=interval,
        output=output,
        plot=plot,
        gpu=gpu,
        metrics=metrics,
        workload=workload,
        command=command or [],
    )
    console = Console(highlight=False, soft_wrap=True)
    report = run_benchmark(opts, console)
    render_summary(report, console)
    for path in (output, plot):
        if path is not None:
            console.print(f"wrote {path}", markup=False)
    if report["exit_code"]:
        raise typer.Exit(code=report["exit_code"])


@app.command("find-datasets")
def find_datasets(
    cache_dir: Annotated[
        Path | None, typer.Option(help="A datasets or hub cache folder (default: HF env).")
    ] = None,
    experts: Annotated[
        Path | None, typer.Option(help="Folder with */manifest.json to match against.")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """List datasets in the Hugging Face cache, and which expert manifests use them."""
    from expert_cli.discovery import discover, render_discovery

    result = discover(cache_dir, experts)
    if as_json:
        typer.echo(json.dumps(result, indent=2))
    else:
        render_discovery(result)


@app.command()
def train(
    manifest: ManifestOpt,
    output: Annotated[
        Path | None, typer.Option(help="Output folder (default: <manifest folder>/output).")
    ] = None,
    resume: Annotated[
        bool, typer.Option("--resume", help="Continue from the latest checkpoint in OUTPUT.")
    ] = False,
    max_steps: Annotated[
        int | None, typer.Option("--max-steps", help="Stop after N optimizer steps.")
    ] = None,
    overrides: Annotated[
        list[str] | None, typer.Option("--set", help="Override a manifest field: key=value.")
    ] = None,
) -> None:
    """Train the manifest's adapter: token cache, Trainer, checkpoints, metrics.json."""
    from rich.console import Console

    from expert_cli.training import TrainOptions
    from expert_cli.training import train as run_training

    opts = TrainOptions(
        manifest=manifest,
        output=output,
        resume=resume,
        max_steps=max_steps,
        overrides=overrides or [],
    )
    result = run_training(opts, Console(highlight=False, soft_wrap=True))
    if result.exit_code:
        raise typer.Exit(code=result.exit_code)


@app.command()
def merge(
    adapter: Annotated[Path, typer.Option("--adapter", help="A trained adapter folder.")],
    output: Annotated[Path, typer.Option("--output", help="Folder for the merged model.")],
) -> None:
    """Merge an adapter into its base model and save a standalone safetensors model."""
    from rich.console import Console

    from expert_cli.merge import merge_adapter

    path = merge_adapter(adapter, output)
    Console(highlight=False, soft_wrap=True).print(f"wrote {path}", markup=False)


@app.command()
def pretokenize(
    manifest: Annotated[
        list[Path] | None,
        typer.Option("--manifest", "-m", help="A manifest.json; repeat for several."),
    ] = None,
    all_dir: Annotated[
        Path | None, typer.Option("--all", help="Every manifest.json under this folder.")
    ] = None,
    num_proc: Annotated[
        int | None,
        typer.Option(
            "--num-proc",
            min=1,
            help="Tokenizer worker processes (default 1: Rust threads on every core).",
        ),
    ] = None,
    force: Annotated[bool, typer.Option("--force", help="Rebuild even if current.")] = False,
) -> None:
    """Tokenize, mask, pack and cache each manifest's data; say whether it was built or current."""
    from rich.console import Console

    from expert_cli.data.pretokenize import run_pretokenize

    run_pretokenize(manifest or [], all_dir, num_proc, force, Console(soft_wrap=True))


def _print_error(kind: str, exc: BaseException) -> None:
    from rich.console import Console

    console = Console(stderr=True, highlight=False, soft_wrap=True)
    lines = exc.lines if isinstance(exc, UserError) else [str(exc)]
    console.print(f"[bold red]{kind}:[/bold red]")
    for line in lines:
        console.print(f"  {line}", markup=False)


# bitsandbytes' CPU backend warns on every import that it could not fetch an optional kernel
# from the hub; it falls back to its own kernel, and hub fetches cannot happen offline anyway.
QUIET_LOGGERS = ("bitsandbytes.backends.cpu.ops",)


def main() -> None:
    """Console-script entry point."""
    import logging
    import warnings

    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)
    # raised inside peft/transformers for every model; nothing a user of expert-cli can act on
    warnings.filterwarnings(
        "ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning
    )
    try:
        app(standalone_mode=True)
    except UserError as exc:
        if _state["verbose"]:
            raise
        _print_error("error", exc)
        sys.exit(2)
    except RunError as exc:
        if _state["verbose"]:
            raise
        _print_error("failed", exc)
        sys.exit(1)
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
