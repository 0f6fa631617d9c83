"""training.png: a run's metrics in four panels (training and evaluation loss by step, learning
rate by step, tokens/s by window, data wait by window), as PNG, SVG or PDF by the file's suffix.
`train` writes it at the end of a run; `report` writes it again at any time."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from expert_cli.atomic import atomic_file
from expert_cli.errors import escaped
from expert_cli.jsontext import number_pairs
from expert_cli.paths import PICTURE_FORMATS

PANELS = ("loss", "learning rate", "tokens/s", "data wait")
# No value a run records comes near this (loss, learning rate, tokens/s, a fraction); past it a
# hand-edited number (1e308) would overflow the axis arithmetic, so it is not drawn.
PLOTTED_MAX = 1e12


def plotted_points(records: list[Any], key: str) -> tuple[list[float], list[float]]:
    """The steps and values of `key` in `records`, numbers alone and none past PLOTTED_MAX."""
    pairs = [
        (step, value)
        for step, value in number_pairs(records, "step", key)
        if abs(step) <= PLOTTED_MAX and abs(value) <= PLOTTED_MAX
    ]
    return [p[0] for p in pairs], [p[1] for p in pairs]


def _records(data: dict[str, Any], key: str) -> list[Any]:
    value = data.get(key)
    return value if isinstance(value, list) else []


def _from_zero(ax: Any, values: list[float]) -> None:
    """The axis from 0 to a tenth above the highest value: a steady speed's line drawn on the
    panel's top edge was hidden by it."""
    top = max(values, default=0.0)
    ax.set_ylim(bottom=0, top=top * 1.1 if top > 0 else None)


def write_training_plot(data: dict[str, Any], path: Path) -> Path:
    """The four-panel picture of a run's metrics (PNG, SVG or PDF by `path`'s suffix),
    written whole or not at all."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    windows, evals = _records(data, "windows"), _records(data, "evals")
    fig, axes = plt.subplots(2, 2, figsize=(11, 7), sharex=True)
    loss, lr, speed, wait = axes.flat
    steps, values = plotted_points(windows, "loss")
    loss.plot(steps, values, marker="." if len(steps) < 60 else None, label="training")
    steps, values = plotted_points(evals, "eval_loss")
    if steps:
        loss.plot(steps, values, marker="o", label="evaluation")
    loss.set_ylabel("loss")
    loss.legend(loc="upper right")
    steps, values = plotted_points(windows, "learning_rate")
    lr.plot(steps, values, color="tab:purple")
    lr.set_ylabel("learning rate")
    steps, values = plotted_points(windows, "tokens_per_s")
    speed.plot(steps, values, color="tab:green", drawstyle="steps-pre")
    speed.set_ylabel("tokens/s (non-padding)")
    _from_zero(speed, values)
    steps, values = plotted_points(windows, "data_wait_fraction")
    wait.plot(steps, [100 * v for v in values], color="tab:red", drawstyle="steps-pre")
    wait.set_ylabel("data wait (% of wall time)")
    _from_zero(wait, [100 * v for v in values])
    for ax, name in zip(axes.flat, PANELS, strict=True):
        ax.set_title(name)
        ax.grid(alpha=0.3)
    for ax in axes[1]:
        ax.set_xlabel("optimizer step")
    summary = data.get("summary") if isinstance(data.get("summary"), dict) else {}
    status = escaped(str(summary.get("status", ""))[:40])
    fig.suptitle(f"training run ({status})" if status else "training run")
    # fixed margins: tight_layout drew the figure once more to measure it (a third of the time)
    fig.subplots_adjust(left=0.07, right=0.98, bottom=0.08, top=0.9, wspace=0.22, hspace=0.25)
    kind = PICTURE_FORMATS.get(path.suffix.lower(), "png")
    about = {"Description": "panels: " + ", ".join(PANELS)} if kind == "png" else None
    with atomic_file(path) as tmp:
        fig.savefig(tmp, format=kind, dpi=100, metadata=about)
    plt.close(fig)
    return path
