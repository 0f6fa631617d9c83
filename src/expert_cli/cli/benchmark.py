"""`expert-cli benchmark`: sample the GPUs while a command or workload runs, and assess."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from expert_cli.cli.options import file_named

if TYPE_CHECKING:
    from expert_cli.telemetry.workload import WorkloadSpec


def benchmark(
    duration: Annotated[
        float,
        typer.Option(
            metavar="SECONDS",
            help="The sampling window: the report covers it; a command runs on to its end.",
        ),
    ] = 60.0,
    interval: Annotated[
        float, typer.Option(metavar="SECONDS", help="Seconds between samples.")
    ] = 1.0,
    output: Annotated[
        Path | None,
        typer.Option(help="Write the JSON report here.", parser=file_named("--output")),
    ] = None,
    plot: Annotated[
        Path | None,
        typer.Option(help="Write a plot here (.png, .svg or .pdf).", parser=file_named("--plot")),
    ] = None,
    gpu: Annotated[
        str,
        typer.Option(
            metavar="INDEX", help="GPU index as nvidia-smi numbers them (or 0,1,...), or 'all'."
        ),
    ] = "all",
    metrics: Annotated[
        Path | None, typer.Option(help="A training run's metrics.json to read.")
    ] = None,
    workload: Annotated[
        str | None,
        typer.Option(metavar="NAME", help="Synthetic workload: qwen3-0.6b-lora or tiny."),
    ] = None,
    stop_at_end: Annotated[
        bool,
        typer.Option("--stop-at-end", help="Stop the command when the window closes."),
    ] = False,
    force: Annotated[
        bool, typer.Option("--force", help="Replace existing --output / --plot files.")
    ] = False,
    command: Annotated[
        list[str] | None,
        typer.Argument(metavar="-- CMD ...", hidden=True, help="The command to run and sample."),
    ] = None,
) -> None:
    """Sample GPU, CPU and RAM (optionally while a command or workload runs), and assess.

    After `--`, a command to run and sample: it runs to its end (its exit code is the
    benchmark's); the report covers the first --duration seconds.
    """
    from expert_cli.benchmark.run import BenchmarkOptions, Hooks, run_benchmark
    from expert_cli.cli.benchmark_view import LiveView, render_summary
    from expert_cli.cli.render import console, keep_going_without_output
    from expert_cli.errors import escaped

    opts = BenchmarkOptions(
        duration=duration,
        interval=interval,
        output=output,
        plot=plot,
        gpu=gpu,
        metrics=metrics,
        workload=workload,
        command=command or [],
        stop_at_end=stop_at_end,
        force=force,
    )
    keep_going_without_output()  # `| head -1`: the command runs on, the report is written
    out = console()
    hooks = Hooks(
        note=lambda text: out.print(text, markup=False),
        view=lambda runner, metrics: LiveView(out, duration, runner, metrics),
        build_step=_fast_step if workload else None,
    )
    report = run_benchmark(opts, hooks)
    render_summary(report, out)
    for path in (output, plot):
        if path is not None:
            out.print(f"wrote {escaped(str(path))}", markup=False)
    # a command --stop-at-end stopped with the window ended as asked: its 130 is no failure
    asked = stop_at_end and report["stopped_by"] == "duration"
    if report.get("signal_exit"):  # SIGTERM / SIGHUP: the command stopped, the report written
        raise typer.Exit(code=report["signal_exit"])
    if report["exit_code"] and not asked:
        raise typer.Exit(code=report["exit_code"])


def _fast_step(spec: WorkloadSpec) -> tuple[Callable[[], Any], dict[str, Any]]:
    """The workload's step on the training fast path (imports torch, so only when asked)."""
    from expert_cli.train.workload import build_fast_step

    return build_fast_step(spec)
