"""The benchmark command: sample GPUs and host while a command, a synthetic workload or
nothing runs; then statistics, an assessment, a JSON report and a plot.

Rendering (live view, summary, plot) lives in benchmark_output.py; the statistics and the
bottleneck rules in assessment.py.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from expert_cli.atomic import write_json_atomic
from expert_cli.errors import UserError
from expert_cli.telemetry.gpu import HostSampler, NoGpu, NvmlSource, open_nvml

SCHEMA_VERSION = 1
SIGINT_GRACE_S = 10.0  # after SIGINT, how long the command may take to save and exit
SIGTERM_GRACE_S = 5.0  # after SIGTERM, before SIGKILL


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


def validate_options(opts: BenchmarkOptions) -> None:
    """Check the arguments that need no GPU; raise UserError naming each bad option."""
    problems = []
    if not opts.duration > 0:
        problems.append(f"--duration: must be > 0 seconds, got {opts.duration}")
    if not opts.interval > 0:
        problems.append(f"--interval: must be > 0 seconds, got {opts.interval}")
    for flag, path in (("--output", opts.output), ("--plot", opts.plot)):
        if path is not None and not path.parent.resolve().is_dir():
            problems.append(f"{flag}: folder {path.parent} does not exist")
    if opts.plot is not None and importlib.util.find_spec("matplotlib") is None:
        problems.append("--plot: needs matplotlib (pip install 'expert-cli[plot]')")
    if opts.gpu != "all" and not all(p.strip().isdigit() for p in opts.gpu.split(",")):
        problems.append(
            f"--gpu: expected a GPU index (0, 1, ... or 0,1) or 'all', got {opts.gpu!r}"
        )
    if opts.workload is not None and opts.command:
        problems.append("--workload: give either a workload or a command after --, not both")
    if opts.workload is not None:
        from expert_cli.telemetry.workload import WORKLOADS

        if opts.workload not in WORKLOADS:
            problems.append(
                f"--workload: unknown workload {opts.workload!r}; choose one of "
                f"{', '.join(WORKLOADS)}"
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


def _option_value(command: list[str], names: tuple[str, ...]) -> str | None:
    """The value of the first of `names` in argv (`--name VALUE` or `--name=VALUE`)."""
    for i, arg in enumerate(command):
        if arg in names and i + 1 < len(command):
            return command[i + 1]
        key, _, value = arg.partition("=")
        if value and key in names:
            return value
    return None


def train_metrics_path(command: list[str]) -> Path | None:
    """DIR/metrics.json when `command` is `expert-cli train ... --output DIR`; without
    --output, the trainer's default `<manifest folder>/output`."""
    if not command or Path(command[0]).name != "expert-cli" or "train" not in command[1:]:
        return None
    output = _option_value(command, ("--output",))
    if output is not None:
        return Path(output) / "metrics.json"
    manifest = _option_value(command, ("--manifest", "-m"))
    return None if manifest is None else Path(manifest).parent / "output" / "metrics.json"


def read_run_metrics(path: Path) -> dict[str, Any] | None:
    """A training run's metrics.json, read tolerantly: None while missing or half-written."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    windows = [w for w in data.get("windows", []) if isinstance(w, dict)]
    summary = data.get("summary") if isinstance(data.get("summary"), dict) else None
    return {
        "path": str(path),
        "summary": summary,
        "windows": windows,
        "last_window": windows[-1] if windows else None,
    }


def data_wait_fraction(run_metrics: dict[str, Any] | None) -> float | None:
    """The run's data-wait fraction: the summary's, else the mean over its windows."""
    if not run_metrics:
        return None
    summary = run_metrics.get("summary") or {}
    if isinstance(summary.get("data_wait_fraction"), (int, float)):
        return float(summary["data_wait_fraction"])
    values = [
        w["data_wait_fraction"]
        for w in run_metrics["windows"]
        if isinstance(w.get("data_wait_fraction"), (int, float))
    ]
    return sum(values) / len(values) if values else None


def run_mfu(run_metrics: dict[str, Any] | None, workload: dict[str, Any] | None) -> float | None:
    """The run's MFU: its summary's, else the mean over its windows; else the workload's."""
    summary = (run_metrics or {}).get("summary") or {}
    if isinstance(summary.get("mfu"), (int, float)):
        return float(summary["mfu"])
    values = [
        w["mfu"]
        for w in (run_metrics or {}).get("windows", [])
        if isinstance(w.get("mfu"), (int, float))
    ]
    if values:
        return sum(values) / len(values)
    mfu = (workload or {}).get("mfu")
    return float(mfu) if isinstance(mfu, (int, float)) else None


def analyse(
    samples: list[dict[str, Any]],
    indices: list[int],
    *,
    phased: bool,
    run_metrics: dict[str, Any] | None = None,
    metrics_given: bool = False,
    workload: dict[str, Any] | None = None,
    no_gpu_reason: str | None = None,
) -> dict[str, Any]:
    """The report's `phases`, `stats`, `active_stats` and `assessment`.

    With `phased` (a command or workload ran) the start-up before the GPU got work and the
    idle tail after it are split off, and the assessment is over the active phase; plain
    sampling is assessed over all samples.
    """
    from expert_cli.assessment import assess, compute_stats, split_phases

    stats = compute_stats(samples, indices)
    phases = split_phases(samples, indices) if phased and no_gpu_reason is None else None
    active = None
    if phases is not None and phases["active"]:
        active = compute_stats(samples[phases["first"] : phases["last"] + 1], indices)
    assessment = assess(
        active or stats,
        data_wait_fraction(run_metrics),
        no_gpu_reason,
        mfu=run_mfu(run_metrics, workload),
        metrics_given=metrics_given or run_metrics is not None,
        phases=phases,
    )
    return {"phases": phases, "stats": stats, "active_stats": active, "assessment": assessment}


def reassess(report: dict[str, Any]) -> dict[str, Any]:
    """A saved report with its phases, statistics and assessment computed again by the
    current rules (from its own samples, run metrics and workload)."""
    settings = report["settings"]
    return {
        **report,
        **analyse(
            report["samples"],
            settings["gpus"],
            phased=bool(report.get("command") or settings.get("workload")),
            run_metrics=report.get("run_metrics"),
            metrics_given=report.get("metrics_path") is not None,
            workload=report.get("workload"),
            no_gpu_reason=report.get("no_gpu_reason"),
        ),
    }


class Command:
    """A child command in its own process group, stopped politely when time is up."""

    def __init__(self, argv: list[str]) -> None:
        try:
            self.proc = subprocess.Popen(argv, start_new_session=True)
        except (FileNotFoundError, PermissionError) as exc:
            raise UserError(f"-- {argv[0]}: cannot start the command ({exc.strerror})") from exc
        self.argv = argv

    @property
    def pid(self) -> int:
        return self.proc.pid

    def wait(self, timeout: float) -> int | None:
        """Wait up to `timeout` seconds; the exit code if it ended, else None."""
        try:
            return self._code(self.proc.wait(timeout=max(timeout, 0.0)))
        except subprocess.TimeoutExpired:
            return None

    @staticmethod
    def _code(returncode: int) -> int:
        """A shell-style exit code: killed by signal N -> 128 + N."""
        return 128 - returncode if returncode < 0 else returncode

    def stop(self) -> int:
        """SIGINT, then SIGTERM, then SIGKILL to the whole group; the command's exit code."""
        for sig, grace in ((signal.SIGINT, SIGINT_GRACE_S), (signal.SIGTERM, SIGTERM_GRACE_S)):
            if self.proc.poll() is not None:
                break
            self._signal(sig)
            if self.wait(grace) is not None:
                break
        if self.proc.poll() is None:
            self._signal(signal.SIGKILL)
        return self._code(self.proc.wait())

    def _signal(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, sig)


def open_source(factory: Callable[[], NvmlSource]) -> tuple[NvmlSource | None, str | None]:
    """The NVML source, or None and the reason there is no NVIDIA GPU."""
    try:
        return factory(), None
    except NoGpu as exc:
        return None, str(exc)


def machine_info(source: NvmlSource | None, indices: list[int]) -> dict[str, Any]:
    """Host name, CPUs, RAM, GPUs and driver, and library versions (without importing torch)."""
    import platform
    import socket
    from importlib.metadata import PackageNotFoundError, version

    import psutil

    from expert_cli.telemetry.flops import peak_bf16_flops

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


def write_report(report: dict[str, Any], path: Path) -> None:
    """Write the JSON report atomically: a temporary file in the same folder, then rename."""
    write_json_atomic(path, report)


@dataclass
class Sampling:
    """What one sampling run produced."""

    samples: list[dict[str, Any]] = field(default_factory=list)
    stopped_by: str = "duration"
    exit_code: int | None = None
    elapsed_s: float = 0.0
    workload: dict[str, Any] | None = None


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
    if command is not None and out.exit_code is None:
        out.exit_code = command.stop()
    out.elapsed_s = time.monotonic() - start
    return out


def _run_sampling(
    opts: BenchmarkOptions,
    source: NvmlSource | None,
    indices: list[int],
    metrics_path: Path | None,
    console: Any,
) -> Sampling:
    """Start the workload or command (if any), sample with a live view, stop them."""
    from expert_cli.benchmark_output import LiveView

    runner = None
    if opts.workload is not None:
        from expert_cli.telemetry.workload import WorkloadRunner, get_workload
        from expert_cli.train.workload import build_fast_step

        runner = WorkloadRunner(get_workload(opts.workload), build_fast_step)
        console.print(f"building workload {opts.workload} and running its warm-up steps ...")
        runner.start()
        runner.wait_ready()
    command = Command(opts.command) if opts.command else None
    with LiveView(console, opts.duration, runner, metrics_path) as view:
        sampling = sample_loop(opts, source, indices, command, view.update)
    if runner is not None:
        sampling.workload = runner.stop()
    return sampling


def run_benchmark(
    opts: BenchmarkOptions,
    console: Any,
    source_factory: Callable[[], NvmlSource] = open_nvml,
) -> dict[str, Any]:
    """Validate, sample, assess, and write the report and plot; return the report."""
    validate_options(opts)
    source, reason = open_source(source_factory)
    try:
        indices = select_gpus(opts.gpu, source.device_count() if source else 0, reason)
        if reason is not None:
            console.print(f"no NVIDIA GPU found ({reason}); sampling CPU and RAM only")
        machine = machine_info(source, indices)
        metrics_path = opts.metrics or train_metrics_path(opts.command)
        sampling = _run_sampling(opts, source, indices, metrics_path, console)
    finally:
        if source is not None:
            source.close()
    run_metrics = read_run_metrics(metrics_path) if metrics_path is not None else None
    analysis = analyse(
        sampling.samples,
        indices,
        phased=bool(opts.command or opts.workload),
        run_metrics=run_metrics,
        metrics_given=metrics_path is not None,
        workload=sampling.workload,
        no_gpu_reason=reason,
    )
    report = {
        "schema_version": SCHEMA_VERSION,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": machine,
        "settings": {
            "duration_s": opts.duration,
            "interval_s": opts.interval,
            "gpus": indices,
            "workload": opts.workload,
        },
        "gpu_available": source is not None,
        "no_gpu_reason": reason,
        "command": opts.command or None,
        "exit_code": sampling.exit_code,
        "stopped_by": sampling.stopped_by,
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
    _write_outputs(report, opts)
    return report


def _write_outputs(report: dict[str, Any], opts: BenchmarkOptions) -> None:
    from expert_cli.benchmark_output import write_plot

    if opts.output is not None:
        write_report(report, opts.output)
    if opts.plot is not None:
        write_plot(report, opts.plot)
