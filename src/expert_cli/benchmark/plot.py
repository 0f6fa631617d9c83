"""The benchmark's PNG: GPU utilization, memory and temperature over time (CPU and RAM without
a GPU), with the start-up and idle tail greyed out. matplotlib is optional ([plot] extra)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from expert_cli.atomic import atomic_file
from expert_cli.paths import PICTURE_FORMATS

PLOT_MARKERS_BELOW = 60  # draw a dot per sample when there are this few


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
    """A PNG, SVG or PDF (by `path`'s suffix) of GPU utilization, memory and temperature over
    time (CPU and RAM without a GPU), written to a temporary file and renamed into place."""
    import matplotlib  # optional dependency (expert-cli[plot])

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
    with atomic_file(path) as tmp:
        fig.savefig(tmp, format=PICTURE_FORMATS[path.suffix.lower()], dpi=100)
    plt.close(fig)
