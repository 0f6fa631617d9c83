"""The benchmark: sample GPUs and host while a command, a synthetic workload or nothing runs;
then statistics, an assessment, a JSON report and a plot.

What a person sees while it runs (notes, a live view) and how a workload's step is built are
plugged in by the caller (`Hooks`); the statistics and bottleneck rules are in assessment.py.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import platform
import re
import socket
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import psutil

from expert_cli.atomic import sigterm_raises, write_json_atomic
from expert_cli.benchmark.assessment import RunFacts, assess
from expert_cli.benchmark.command import Command
from expert_cli.benchmark.metrics import (
    RunMetricsFile,
    allocator_flushes,
    data_wait_fraction,
    metrics_file_problem,
    run_metrics_file,
    run_mfu,
)
from expert_cli.benchmark.plot import write_plot
from expert_cli.benchmark.stats import compute_stats, split_phases
from expert_cli.errors import Terminated, UserError
from expert_cli.paths import (
    output_file_problem,
    picture_problem,
    place_problem,
    run_file_problem,
)
from expert_cli.telemetry.flops import peak_bf16_flops
from expert_cli.telemetry.gpu import GpuUnreadable, HostSampler, NoGpu, NvmlSource, open_nvml
from expert_cli.telemetry.workload import WORKLOADS, WorkloadRunner, WorkloadSpec, get_workload

SCHEMA_VERSION = 1
MAX_DURATION_S = 7 * 24 * 3600.0
GPU_INDEX = re.compile(r"[0-9]{1,4}")  # ASCII digits only: str.isdigit() takes '²'
MIN_INTERVAL_S = 0.05  # NVML's own sampling period is about this
MAX_INTERVAL_S = 3600.0
# a workload's step and what it chose, built by the caller (the CLI: the training fast path)
StepBuilder = Callable[[WorkloadSpec], tuple[Callable[[], Any], dict[str, Any]]]


def _no_view(runner: WorkloadRunner | None, metrics: RunMetricsFile | None) -> Any:
    return contextlib.nullcontext(lambda sample: None)


@dataclass
class Hooks:
    """What the caller plugs in: notes for a person, a live view while sampling (a context
    manager giving the per-sample callback), and the workload's step builder."""

    note: Callable[[str], None] = lambda text: None
    view: Callable[[WorkloadRunner | None, RunMetricsFile | None], AbstractContextManager[Any]] = (
        _no_view
    )
    build_step: StepBuilder | None = None


@dataclass
class BenchmarkOptions:
    """The benchmark command's arguments, as given."""

    duration: float = 60.0
    interval: float = 1.0
    output: Path | None = None
    plot: Path | None = None
    gpu: str = "all"
    metrics: Path | None = None
    workload: str | None = None
    command: list[str] = field(default_factory=list)
    stop_at_end: bool = False  # stop the command when the window closes (else it runs on)
    force: bool = False  # replace an existing --output / --plot file


def validate_options(opts: BenchmarkOptions) -> None:
    """Check the arguments that need no GPU; raise UserError naming each bad option."""
    problems = []
    if not 0 < opts.duration <= MAX_DURATION_S:
        problems.append(
            f"--duration: must be > 0 and at most {MAX_DURATION_S:.0f} seconds (a week), "
            f"got {opts.duration}"
        )
    if not MIN_INTERVAL_S <= opts.interval <= MAX_INTERVAL_S:
        problems.append(
            f"--interval: must be from {MIN_INTERVAL_S} to {MAX_INTERVAL_S:.0f} seconds, "
            f"got {opts.interval}"
        )
    for flag, path in (("--output", opts.output), ("--plot", opts.plot)):
        if path is None:
            continue
        problem = run_file_problem(path, flag) or output_file_problem(path, flag, opts.force)
        if problem := problem or place_problem(path, flag):  # a read-only disk: said before
            problems.append(problem)  # sampling, not in a traceback after it
    if opts.output and opts.plot and os.path.realpath(opts.output) == os.path.realpath(opts.plot):
        problems.append("--plot: the same file as --output (the picture would replace the report)")
    if opts.plot is not None and (problem := picture_problem(opts.plot, "--plot")):
        problems.append(problem)
    if opts.plot is not None and importlib.util.find_spec("matplotlib") is None:
        problems.append("--plot: needs matplotlib (pip install 'expert-cli[plot]')")
    if opts.gpu != "all" and not all(GPU_INDEX.fullmatch(p.strip()) for p in opts.gpu.split(",")):
        problems.append(
            f"--gpu: expected a GPU index (0, 1, ... or 0,1) or 'all', got {opts.gpu!r}"
        )
    if opts.metrics is not None and (problem := metrics_file_problem(opts.metrics)):
        problems.append(problem)
    if opts.workload is not None and opts.command:
        problems.append("--workload: give either a workload or a command after --, not both")
    if opts.workload is not None and opts.workload not in WORKLOADS:
        problems.append(
            f"--workload: unknown workload {opts.workload!r}; choose one of {', '.join(WORKLOADS)}"
        )
    if problems:
        raise UserError(problems)


def select_gpus(spec: str, count: int, no_gpu_reason: str | None) -> list[int]:
    """GPU indices to sample from `--gpu` ('all' or comma-separated indices)."""
    if spec == "all":
        return list(range(count))
    wanted = [int(p) for p in spec.split(",")]
    if no_gpu_reason is not None:
        raise UserError(f"--gpu: GPU {spec} requested but no NVIDIA GPU found ({no_gpu_reason})")
    bad = [i for i in wanted if i >= count]
    if bad:
        raise UserError(
            f"--gpu: index {bad[0]} out of range; this machine has {count} GPU(s), "
            f"indices 0..{count - 1}"
        )
    return sorted(set(wanted))


@dataclass(frozen=True)
class Context:
    """What the samples were taken around: a command or workload (`phased`), the run's own
    metrics, the workload's report, and why there is no GPU (if there is none)."""

    phased: bool
    run_metrics: dict[str, Any] | None = None
    metrics_given: bool = False
    workload: dict[str, Any] | None = None
    no_gpu_reason: str | None = None


def analyse(samples: list[dict[str, Any]], indices: list[int], ctx: Context) -> dict[str, Any]:
    """The report's `phases`, `stats`, `active_stats` and `assessment`.

    With `ctx.phased` (a command or workload ran) the start-up before the GPU got work and the
    idle tail after it are split off, and the assessment is over the active phase; plain
    sampling is assessed over all samples.
    """
    stats = compute_stats(samples, indices)
    phased = ctx.phased and ctx.no_gpu_reason is None
    phases = split_phases(samples, indices) if phased else None
    active = None
    if phases is not None and phases["active"]:
        active = compute_stats(samples[phases["first"] : phases["last"] + 1], indices)
    facts = RunFacts.of(
        data_wait_fraction(ctx.run_metrics),
        run_mfu(ctx.run_metrics, ctx.workload),
        ctx.metrics_given or ctx.run_metrics is not None,
        allocator_flushes(ctx.run_metrics),
    )
    assessment = assess(active or stats, facts, ctx.no_gpu_reason, phases=phases)
    return {"phases": phases, "stats": stats, "active_stats": active, "assessment": assessment}


def open_source(factory: Callable[[], NvmlSource]) -> tuple[NvmlSource | None, str | None]:
    """The NVML source, or None and the reason there is no NVIDIA GPU."""
    try:
        return factory(), None
    except NoGpu as exc:
        return None, str(exc)


def machine_info(source: NvmlSource | None, indices: list[int]) -> dict[str, Any]:
    """Host name, CPUs, RAM, GPUs and driver, and library versions (without importing torch)."""
    versions = {}
    for package in ("torch", "transformers", "nvidia-ml-py"):
        try:
            versions[package] = version(package)
        except PackageNotFoundError:
            versions[package] = None
    gpus = []
    for i in indices if source is not None else []:
        name = source.name(i)
        peak = peak_bf16_flops(name)
        gpus.append({"index": i, "name": name, "peak_bf16_tflops": peak and peak / 1e12})
    return {
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu_count": psutil.cpu_count(logical=True),
        "cpu_count_physical": psutil.cpu_count(logical=False),
        "ram_total_gb": psutil.virtual_memory().total / 1024**3,
        "driver_version": source.driver_version() if source is not None else None,
        "gpus": gpus,
        "versions": versions,
    }


@dataclass
class Sampling:
    """What one sampling run produced."""

    samples: list[dict[str, Any]] = field(default_factory=list)
    stopped_by: str = "duration"
    exit_code: int | None = None
    elapsed_s: float = 0.0
    workload: dict[str, Any] | None = None
    running: Command | None = None  # the command, still running after the window closed
    signal_exit: int | None = None  # SIGTERM/SIGHUP stopped it: the exit code they call for
    gpu_error: str | None = None  # NVML stopped answering: why the sampling ended


def take_sample(
    t: float, source: NvmlSource | None, indices: list[int], host: HostSampler
) -> dict[str, Any]:
    """One reading of the host and every selected GPU, `t` seconds into the run."""
    gpus = [source.sample(i).to_dict() for i in indices] if source is not None else []
    return {"t": round(t, 3), "host": host.sample().to_dict(), "gpus": gpus}


def sample_loop(
    opts: BenchmarkOptions,
    source: NvmlSource | None,
    indices: list[int],
    command: Command | None,
    on_sample: Callable[[dict[str, Any]], None],
) -> Sampling:
    """Sample every `interval` until `duration`, the command's end, or Ctrl-C."""
    host = HostSampler(command.pid if command is not None else None)
    out = Sampling()
    start = time.monotonic()
    end = start + opts.duration
    try:
        while True:
            tick = min(start + (len(out.samples) + 1) * opts.interval, end)
            if command is not None:
                out.exit_code = command.wait(tick - time.monotonic())
            else:
                time.sleep(max(tick - time.monotonic(), 0.0))
            out.samples.append(take_sample(time.monotonic() - start, source, indices, host))
            on_sample(out.samples[-1])
            if out.exit_code is not None:
                out.stopped_by = "command_exit"
                break
            if time.monotonic() >= end:
                break
    except KeyboardInterrupt:
        out.stopped_by = "interrupt"
    except Terminated as stop:  # SIGTERM or SIGHUP (a scheduler, a closed terminal)
        out.stopped_by, out.signal_exit = "interrupt", stop.code
    except GpuUnreadable as lost:  # the samples so far are reported, the command stopped
        out.stopped_by, out.gpu_error = "gpu_error", str(lost)
    if command is not None and out.exit_code is None:
        if opts.stop_at_end or out.stopped_by in ("interrupt", "gpu_error"):
            out.exit_code = command.stop()
        else:
            out.running = command
    out.elapsed_s = time.monotonic() - start
    return out


def wait_for_command(command: Command) -> tuple[int, str, int | None]:
    """Wait for a command that outlived the sampling window: its exit code, how it ended
    (Ctrl-C, SIGTERM or SIGHUP stop it politely, as a command stopped at the window's end
    would be), and the exit code a SIGTERM or SIGHUP calls for."""
    try:
        with sigterm_raises():
            return command.wait(None), "command_exit", None
    except KeyboardInterrupt:
        return command.stop(), "interrupt", None
    except Terminated as stop:
        return command.stop(), "interrupt", stop.code


def _run_sampling(
    opts: BenchmarkOptions,
    source: NvmlSource | None,
    indices: list[int],
    metrics: RunMetricsFile | None,
    hooks: Hooks,
) -> Sampling:
    """Start the workload or command (if any), sample with the live view, stop them."""
    runner = None
    if opts.workload is not None:
        if hooks.build_step is None:
            raise UserError("--workload: this caller cannot build a workload's step")
        runner = WorkloadRunner(get_workload(opts.workload), hooks.build_step)
        hooks.note(f"building workload {opts.workload} and running its warm-up steps ...")
        runner.start()
        runner.wait_ready()
    command = Command(opts.command) if opts.command else None
    with hooks.view(runner, metrics) as on_sample:
        sampling = sample_loop(opts, source, indices, command, on_sample)
    if runner is not None:
        sampling.workload = runner.stop()
    return sampling


def run_benchmark(
    opts: BenchmarkOptions,
    hooks: Hooks | None = None,
    source_factory: Callable[[], NvmlSource] = open_nvml,
) -> dict[str, Any]:
    """Validate, sample, assess, and write the report and plot; return the report."""
    hooks = hooks or Hooks()
    validate_options(opts)
    started = time.monotonic()
    source, reason = open_source(source_factory)
    try:
        indices = select_gpus(opts.gpu, source.device_count() if source else 0, reason)
        if reason is not None:
            hooks.note(f"no NVIDIA GPU found ({reason}); sampling CPU and RAM only")
        machine = machine_info(source, indices)
        metrics = run_metrics_file(opts.metrics, opts.command)
        with sigterm_raises():  # stops the command and writes the report, as Ctrl-C does
            sampling = _run_sampling(opts, source, indices, metrics, hooks)
    finally:
        if source is not None:
            source.close()
    run_metrics = metrics.read() if metrics is not None else None
    metrics_path = metrics.path if metrics is not None else None
    ctx = Context(
        phased=bool(opts.command or opts.workload),
        run_metrics=run_metrics,
        metrics_given=metrics_path is not None,
        workload=sampling.workload,
        no_gpu_reason=reason,
    )
    analysis = analyse(sampling.samples, indices, ctx)
    report = {
        "schema_version": SCHEMA_VERSION,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": machine,
        "settings": {
            "duration_s": opts.duration,
            "interval_s": opts.interval,
            "gpus": indices,
            "workload": opts.workload,
            "stop_at_end": opts.stop_at_end,
        },
        "gpu_available": source is not None,
        "no_gpu_reason": reason,
        "command": opts.command or None,
        "exit_code": sampling.exit_code,
        "stopped_by": sampling.stopped_by,
        **({"signal_exit": sampling.signal_exit} if sampling.signal_exit else {}),
        **({"gpu_error": sampling.gpu_error} if sampling.gpu_error else {}),
        "elapsed_s": sampling.elapsed_s,
        "metrics_path": None if metrics_path is None else str(metrics_path),
        "run_metrics": run_metrics,
        "workload": sampling.workload,
        "phases": analysis["phases"],
        "samples": sampling.samples,
        "stats": analysis["stats"],
        "active_stats": analysis["active_stats"],
        "assessment": analysis["assessment"],
    }
    _write(report, opts)
    if sampling.running is not None:
        hooks.note(
            f"sampling window closed after {sampling.elapsed_s:.0f} s"
            + (" (report written)" if opts.output or opts.plot else "")
            + "; the command runs on to its end (--stop-at-end stops it with the window)"
        )
        code, how, signal_exit = wait_for_command(sampling.running)
        report["exit_code"], report["command_ended_by"] = code, how
        if signal_exit:
            report["signal_exit"] = signal_exit
        report["command_elapsed_s"] = time.monotonic() - started
        if opts.output is not None:
            write_json_atomic(opts.output, report)
    return report


def _write(report: dict[str, Any], opts: BenchmarkOptions) -> None:
    if opts.output is not None:
        write_json_atomic(opts.output, report)
    if opts.plot is not None:
        write_plot(report, opts.plot)
