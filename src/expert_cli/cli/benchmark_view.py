"""What the benchmark shows: the live view while sampling, then the summary tables and the
assessment."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rich.live import Live
from rich.table import Table

from expert_cli.benchmark.metrics import fraction
from expert_cli.cli.render import labelled

STAT_KEYS = ("mean", "min", "max", "p50", "p95")
HOST_ROWS = (
    ("cpu_percent", "CPU, mean of cores (%)"),
    ("cpu_busiest_core_percent", "CPU, busiest core (%)"),
    ("ram_percent", "RAM used (%)"),
    ("ram_used_gb", "RAM used (GB)"),
    ("process_cpu_percent", "command's process tree CPU (%)"),
)
GPU_ROWS = (
    ("gpu_util", "utilization (%)"),
    ("mem_util", "memory bandwidth util (%)"),
    ("mem_used_percent", "memory used (%)"),
    ("mem_used_mb", "memory used (MiB)"),
    ("temperature_c", "temperature (C)"),
    ("power_w", "power (W)"),
    ("sm_clock_mhz", "SM clock (MHz)"),
)


def _num(value: Any, digits: int = 0) -> str:
    """A figure, or "-" for none (or for what is no finite number of plausible size)."""
    plain = isinstance(value, int | float) and not isinstance(value, bool)
    return f"{value:.{digits}f}" if plain and abs(value) < 1e15 else "-"


class LiveView:
    """A rich Live table refreshed on every sample (only when the console is a terminal)."""

    def __init__(self, console: Any, duration: float, runner: Any, metrics: Any):
        self.console, self.duration = console, duration
        self.runner, self.metrics = runner, metrics  # a RunMetricsFile, or None
        self._live: Any = None

    def __enter__(self) -> Callable[[dict[str, Any]], None]:
        if self.console.is_terminal:
            self._live = Live(console=self.console, transient=True, auto_refresh=False)
            self._live.__enter__()
        return self.update

    def __exit__(self, *exc: object) -> None:
        if self._live is not None:
            self._live.__exit__(*exc)

    def update(self, sample: dict[str, Any]) -> None:
        """Redraw with the newest sample."""
        if self._live is not None:
            self._live.update(self._render(sample), refresh=True)

    def _render(self, sample: dict[str, Any]) -> Any:
        table = Table(title=f"sampling {sample['t']:.0f} / {self.duration:.0f} s")
        for col in ("GPU", "util %", "mem %", "temp C", "power W", "SM MHz", "throttle"):
            table.add_column(col)
        for g in sample["gpus"]:
            table.add_row(
                str(g["index"]),
                _num(g["gpu_util"]),
                _num(g["mem_used_percent"]),
                _num(g["temperature_c"]),
                _num(g["power_w"]),
                _num(g["sm_clock_mhz"]),
                ",".join(g["throttle_reasons"]) or "-",
            )
        h = sample["host"]
        cores = h["cpu_percent"]
        caption = (
            f"CPU {_num(sum(cores) / len(cores) if cores else None)}% "
            f"(busiest core {_num(max(cores, default=None))}%), RAM {h['ram_percent']:.0f}%"
        )
        if h.get("process_cpu_percent") is not None:
            caption += f", command CPU {h['process_cpu_percent']:.0f}%"
        if self.runner is not None:
            caption += f"\nworkload tokens/s {_num(self.runner.tokens_per_s())}"
        run = self.metrics.read() if self.metrics is not None else None
        if run and run["last_window"]:
            w = run["last_window"]
            caption += (
                f"\nrun step {w.get('step')}: tokens/s {_num(w.get('tokens_per_s'))}, "
                f"data wait {_num(w.get('data_wait_fraction'), 2)}"
            )
        table.caption = caption
        return table


def _stats_table(title: str, rows: tuple[tuple[str, str], ...], stats: dict[str, Any]) -> Any:
    table = Table(title=title, title_justify="left")
    table.add_column("metric")
    for key in STAT_KEYS:
        table.add_column(key, justify="right")
    for metric, label in rows:
        entry = stats.get(metric)
        if entry is not None:
            table.add_row(label, *(_num(entry[k], 1) for k in STAT_KEYS))
    return table


def _extras_lines(report: dict[str, Any]) -> list[str]:
    """Workload, run-metrics and command lines for the summary."""
    lines = []
    wl = report.get("workload")
    if wl:
        mfu = "-" if wl.get("mfu") is None else f"{wl['mfu']:.1%}"
        lines.append(
            f"workload {wl['workload']} on {wl.get('device')} ({wl.get('dtype')}): "
            f"{wl['steps']} steps, tokens/s {_num(wl['tokens_per_s'])}, MFU {mfu}"
        )
        if "attention" in wl:  # the path it ran, as `train` would choose it here
            lines.append(
                f"  attention {wl['attention']}, loss {wl.get('fused_loss')}, Liger layers "
                f"{'on' if wl.get('liger_kernels') else 'off'}, adapters "
                f"{wl.get('adapter_kernel', 'peft')} in {wl.get('adapter_precision')}"
            )
    if report.get("metrics_path"):
        summary = (report.get("run_metrics") or {}).get("summary")
        if summary:  # a figure counts only as a fraction from 0 to 1 (7 read "7.00")
            mfu, wait = fraction(summary.get("mfu")), fraction(summary.get("data_wait_fraction"))
            lines.append(
                f"run metrics: tokens/s {_num(summary.get('tokens_per_s'))}, data wait "
                f"{_num(wait, 2)}, MFU {'-' if mfu is None else f'{mfu:.1%}'}"
            )
        else:
            lines.append(
                f"run metrics: {report['metrics_path']} not readable, or not written by a run "
                "while sampling (an earlier run's figures are not this window's)"
            )
    if report.get("command"):
        lines.append(_command_line(report))
    return lines


def _command_line(report: dict[str, Any]) -> str:
    """How the command ended, in words, and what the samples cover."""
    code, window = report["exit_code"], f"{report['elapsed_s']:.0f} s"
    ended = report.get("command_ended_by") or report["stopped_by"]
    if ended == "command_exit" and report.get("command_elapsed_s") is not None:
        return (
            f"command exited with code {code} after {report['command_elapsed_s']:.0f} s; "
            f"the samples cover its first {window}"
        )
    if ended == "command_exit":
        return f"command exited with code {code}; sampled for {window}"
    if ended == "gpu_error":
        return f"sampling ended: {report.get('gpu_error')}; command stopped (exit code {code})"
    if ended == "interrupt":
        by = {143: "SIGTERM", 129: "SIGHUP"}.get(report.get("signal_exit") or 0, "Ctrl-C")
        return f"command stopped by {by} (exit code {code}); sampled for {window}"
    return f"command stopped when the {window} window closed (--stop-at-end), exit code {code}"


def render_summary(report: dict[str, Any], console: Any) -> None:
    """Statistics per metric, extra results, and the assessment with evidence and advice."""
    stats = report["stats"]
    console.print(_stats_table("host", HOST_ROWS, stats["host"]))
    names = {g["index"]: g["name"] for g in report["machine"]["gpus"]}
    for index, g in stats["gpus"].items():
        title = f"GPU {index} {names.get(int(index), '')}, whole run"
        console.print(_stats_table(title, GPU_ROWS, g))
        if g["throttle_fraction"]:
            reasons = ", ".join(f"{k} {v:.0%}" for k, v in g["throttle_fraction"].items())
            console.print(f"  clock event reasons (share of samples): {reasons}", markup=False)
    phases, active = report.get("phases"), report.get("active_stats")
    for index, g in (active or {}).get("gpus", {}).items():
        title = (
            f"GPU {index} {names.get(int(index), '')}, active phase "
            f"{phases['start_t']:.0f}-{phases['end_t']:.0f} s"
        )
        console.print(_stats_table(title, GPU_ROWS, g))
    for line in _extras_lines(report):
        console.print(line, markup=False)
    a = report["assessment"]
    console.print()
    console.print(labelled("assessment:", "bold", a["summary"]))
    for line in a["evidence"]:
        console.print(f"  - {line}", markup=False)
    console.print("[bold]what to change:[/bold]")
    for line in a["advice"]:
        console.print(f"  - {line}", markup=False)
