"""A training run's own numbers, read while it runs: where its metrics.json is, and its
data-wait fraction and MFU (read tolerantly: the file is rewritten as the run goes)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


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
