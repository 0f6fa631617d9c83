"""A training run's own numbers, read while it runs: where its metrics.json is, and its
data-wait fraction and MFU (read tolerantly: the file is rewritten as the run goes)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# a window is under 1 KB: a run of a million steps logged every 10 writes under 100 MB
MAX_METRICS_BYTES = 256 << 20


def fraction(value: Any) -> float | None:
    """`value` when it is a finite number from 0 to 1 (a share of time or of the peak), else
    None: a hand-edited or foreign file's numbers are not reported as the run's."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) and 0 <= value <= 1 else None


def metrics_file_problem(path: Path) -> str | None:
    """Why `--metrics FILE` is no training run's metrics.json (None: it is one, or it is not
    written yet: the run may start after the benchmark)."""
    if path.is_dir():
        return f"--metrics {path}: is a folder; give the run's metrics.json (OUTPUT/metrics.json)"
    if not path.exists():
        return None
    if not path.is_file():  # opening a pipe waits for a writer; a device never ends
        return (
            f"--metrics {path}: is not a regular file (a device, pipe or socket); give the "
            "run's metrics.json (OUTPUT/metrics.json)"
        )
    if path.stat().st_size > MAX_METRICS_BYTES:
        return (
            f"--metrics {path}: over {MAX_METRICS_BYTES >> 20} MB, larger than any run's "
            "metrics.json; give OUTPUT/metrics.json of `expert-cli train`"
        )
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError):
        return None  # being rewritten, most likely: read again as the run goes
    if not isinstance(data, dict) or not isinstance(data.get("windows"), list):
        return (
            f"--metrics {path}: not a training run's metrics.json (it has no list of windows); "
            "give OUTPUT/metrics.json of `expert-cli train`"
        )
    summary = data.get("summary") if isinstance(data.get("summary"), dict) else {}
    for key in ("data_wait_fraction", "mfu"):
        if summary.get(key) is not None and fraction(summary[key]) is None:
            return (
                f"--metrics {path}: its summary's {key} is no fraction from 0 to 1, which "
                "no run writes; give OUTPUT/metrics.json of `expert-cli train` as it wrote it"
            )
    return None


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


def file_mark(path: Path) -> tuple[int, int, int] | None:
    """What tells a file's writes apart (inode, size, mtime), or None where there is none."""
    try:
        stat = path.stat()
    except OSError:
        return None
    return (stat.st_ino, stat.st_size, stat.st_mtime_ns)


def read_run_metrics(path: Path) -> dict[str, Any] | None:
    """A training run's metrics.json, read tolerantly: None while missing or half-written."""
    try:
        if not path.is_file() or path.stat().st_size > MAX_METRICS_BYTES:
            return None  # said once by metrics_file_problem
        data = json.loads(path.read_text())
    except (OSError, ValueError, RecursionError):  # nested past the parser's depth
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


@dataclass(frozen=True)
class RunMetricsFile:
    """A run's metrics.json as the benchmark reads it, with its state as sampling began."""

    path: Path
    before: tuple[int, int, int] | None

    @classmethod
    def as_now(cls, path: Path) -> RunMetricsFile:
        return cls(path, file_mark(path))

    def read(self) -> dict[str, Any] | None:
        """`read_run_metrics`, and None where the file is still the one it was `before` the
        sampling began: no run wrote it meanwhile (a finished run's, a command that failed at
        once), so its figures are not this window's."""
        if self.before is not None and file_mark(self.path) == self.before:
            return None
        return read_run_metrics(self.path)


def run_metrics_file(given: Path | None, command: list[str]) -> RunMetricsFile | None:
    """The metrics.json to read: `--metrics`, read as it is; else that of the `expert-cli
    train` command sampled, read only where the command writes it (one that failed at once
    left a finished run's there, whose figures are not this window's)."""
    if given is not None:
        return RunMetricsFile(given, None)
    path = train_metrics_path(command)
    return RunMetricsFile.as_now(path) if path is not None else None


def _steady_first(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """The summary's figures after its first window (start-up aside), then its whole-run ones."""
    steady = summary.get("steady")
    return [steady, summary] if isinstance(steady, dict) else [summary]


def data_wait_fraction(run_metrics: dict[str, Any] | None) -> float | None:
    """The run's data-wait fraction: the summary's (after its first window where it says),
    else the mean over its windows."""
    if not run_metrics:
        return None
    summary = run_metrics.get("summary") or {}
    for figures in _steady_first(summary):
        if (found := fraction(figures.get("data_wait_fraction"))) is not None:
            return found
    windows = run_metrics["windows"]
    values = [v for w in windows if (v := fraction(w.get("data_wait_fraction"))) is not None]
    return sum(values) / len(values) if values else None


def allocator_flushes(run_metrics: dict[str, Any] | None) -> int | None:
    """The CUDA allocator's cache flushes in the run: its summary's, else its windows' sum
    (None where the metrics have no count: no CUDA, or a run from before it was counted)."""
    summary = (run_metrics or {}).get("summary") or {}
    counts = [summary.get("allocator_flushes")]
    if counts[0] is None:
        counts = [w.get("allocator_flushes") for w in (run_metrics or {}).get("windows", [])]
    whole = [c for c in counts if isinstance(c, int) and not isinstance(c, bool) and c >= 0]
    return sum(whole) if whole else None


def run_mfu(run_metrics: dict[str, Any] | None, workload: dict[str, Any] | None) -> float | None:
    """The run's MFU: its summary's (after its first window where it says), else the mean over
    its windows; else the workload's."""
    summary = (run_metrics or {}).get("summary") or {}
    for figures in _steady_first(summary):
        if (found := fraction(figures.get("mfu"))) is not None:
            return found
    windows = (run_metrics or {}).get("windows", [])
    values = [v for w in windows if (v := fraction(w.get("mfu"))) is not None]
    if values:
        return sum(values) / len(values)
    return fraction((workload or {}).get("mfu"))
