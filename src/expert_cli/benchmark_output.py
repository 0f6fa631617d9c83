"""What the benchmark shows and draws: the live view while sampling, the summary tables and
assessment afterwards, and the PNG plot (matplotlib, Agg backend, imported only here)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

PLOT_MARKERS_BELOW = 60  # draw a dot per sample when there are this few
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


def _num(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


class LiveView:
    """A rich Live table refreshed on every sample (only when the console is a terminal)."""

    def __init__(self, console: Any, duration: float, runner: Any, metrics_path: Path | None):
        self.console, self.duration = console, duration
        self.runner, self.metrics_path = runner, metrics_path
        self._live: Any = None

    def __enter__(self) -> LiveView:
        if self.console.is_terminal:
            from rich.live import Live

            self._live = Live(console=self.console, transient=True, auto_refresh=False)
            self._live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._live is not None:
            self._live.__exit__(*exc)

    def update(self, sample: dict[str, Any]) -> None:
        """Redraw with the newest sample."""
        if self._live is not None:
            self._live.update(self._render(sample), refresh=True)

    def _render(self, sample: dict[str, Any]) -> Any:
        from rich.table import Table

        from expert_cli.benchmark import read_run_metrics

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
        run = read_run_metrics(self.metrics_path) if self.metrics_path else None
        if run and run["last_window"]:
            w = run["last_window"]
            caption += (
                f"\nrun step {w.get('step')}: tokens/s {_num(w.get('tokens_per_s'))}, "
                f"data wait {_num(w.get('data_wait_fraction'), 2)}"
            )
        table.caption = caption
        return table


def _stats_table(title: str, rows: tuple[tuple[str, str], ...], stats: dict[str, Any]) -> Any:
    from rich.table import Table

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
    if report.get("metrics_path"):
        summary = (report.get("run_metrics") or {}).get("summary")
        if summary:
            mfu = summary.get("mfu")
            lines.append(
                f"run metrics: tokens/s {_num(summary.get('tokens_per_s'))}, data wait "
                f"{_num(summary.get('data_wait_fraction'), 2)}, MFU "
                f"{'-' if mfu is None else f'{mfu:.1%}'}"
            )
        else:
            lines.append(f"run metrics: {report['metrics_path']} not (yet) readable")
    if report.get("command"):
        lines.append(f"command exit code {report['exit_code']} (stopped by {report['stopped_by']})")
    return lines


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
    console.print(f"\n[bold]assessment:[/bold] {a['summary']}")
    for line in a["evidence"]:
        console.print(f"  - {line}", markup=False)
    console.print("[bold]what to change:[/bold]")
    for line in a["advice"]:
        console.print(f"  - {line}", markup=False)


def _series(report: dict[str, Any], index: int, metric: str) -> list[float | None]:
    return [
        next((g.get(metric) for g in s["gpus"] if g["index"] == index), None)
        for s in report["samples"]
    ]


def _shade_phases(ax: Any, phases: dict[str, Any] | None, t: list[float]) -> None:
    """Grey out the start-up before the GPU got work and the idle tail after it."""
    if not phases or not phases["active"] or not t:
        return
    if phases["startup_s"]:
        ax.axvspan(0, phases["startup_s"], color="grey", alpha=0.15, label="start-up")
    if phases["tail_s"]:
        ax.axvspan(phases["end_t"], t[-1], color="grey", alpha=0.15, label="tail")


def write_plot(report: dict[str, Any], path: Path) -> None:
    """PNG of GPU utilization, memory and temperature over time (CPU and RAM without a GPU),
    written to a temporary file and renamed into place."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = [s["t"] for s in report["samples"]]
    indices = [int(i) for i in report["stats"]["gpus"]]
    if indices:
        panels = [
            ("gpu_util", "GPU utilization (%)"),
            ("mem_used_percent", "memory used (%)"),
            ("temperature_c", "temperature (C)"),
        ]
        series = {
            label: {f"GPU {i}": _series(report, i, m) for i in indices} for m, label in panels
        }
    else:
        cores = [s["host"]["cpu_percent"] for s in report["samples"]]
        series = {
            "CPU (%)": {
                "mean of cores": [sum(c) / len(c) if c else None for c in cores],
                "busiest core": [max(c, default=None) for c in cores],
            },
            "RAM used (%)": {"RAM": [s["host"]["ram_percent"] for s in report["samples"]]},
        }
    fig, axes = plt.subplots(
        len(series), 1, figsize=(9, 2.6 * len(series)), sharex=True, squeeze=False
    )
    for ax, (label, lines) in zip(axes[:, 0], series.items(), strict=True):
        for name, values in lines.items():
            ax.plot(
                t,
                [float("nan") if v is None else v for v in values],
                label=name,
                marker="." if len(t) < PLOT_MARKERS_BELOW else None,
            )
        _shade_phases(ax, report.get("phases"), t)
        ax.set_ylabel(label)
        if "%" in label:
            ax.set_ylim(0, 105)
        ax.grid(alpha=0.3)
        ax.legend(loc="upper right", fontsize="small")
    axes[-1, 0].set_xlabel("seconds")
    title = report["machine"]["hostname"] + ("" if indices else " (no NVIDIA GPU: CPU and RAM)")
    fig.suptitle(title)
    fig.tight_layout()
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fig.savefig(tmp, format="png", dpi=100)
    plt.close(fig)
    os.replace(tmp, path)
