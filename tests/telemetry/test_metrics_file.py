"""metrics.json put together from each window's text, made once: the same bytes as dumping the
whole, at a cost that does not grow with the windows already written."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from expert_cli.atomic import json_numbers
from expert_cli.train import metrics_file
from expert_cli.train.metrics_file import MetricsFile


def _window(step: int) -> dict:
    return {
        "step": step,
        "tokens_per_s": 1234.5 + step,
        "loss": math.nan if step == 3 else 2.0 / step,  # a diverged loss is written null
        "ranks": [{"rank": 0, "tokens": 10}, {"rank": 1, "tokens": 12}],
        "time": "2026-12-05T22:00:00",
        "empty": {},
    }


def _whole(windows: list, rest: dict) -> str:
    data = {"windows": windows, **rest}
    return json.dumps(json_numbers(data), indent=2, default=str, allow_nan=False) + "\n"


def test_the_file_is_the_whole_dump_window_after_window(tmp_path: Path) -> None:
    path = tmp_path / "metrics.json"
    file = MetricsFile(path)
    rest = {"evals": [], "summary": {"status": "running", "steps": 0}}
    assert file.write([], rest, running=True)
    assert path.read_text() == _whole([], rest)
    windows: list = []
    for step in range(1, 6):
        windows.append(_window(step))
        rest = {"evals": [{"step": step, "eval_loss": 1.5}], "summary": {"steps": step}}
        assert file.write(windows, rest, running=True)
        assert path.read_text() == _whole(windows, rest)
    assert json.loads(path.read_text())["windows"][2]["loss"] is None


def test_a_large_file_is_rewritten_at_most_every_interval_while_running(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past MAX_EAGER_BYTES a running write waits LARGE_INTERVAL_S after the last one; the
    end of the run (or any status but running) is written at once."""
    monkeypatch.setattr(metrics_file, "MAX_EAGER_BYTES", 1000)
    path = tmp_path / "metrics.json"
    file = MetricsFile(path)
    windows = [_window(s) for s in range(1, 20)]
    rest = {"evals": [], "summary": {"steps": 19}}
    assert file.write(windows, rest, running=True)
    windows.append(_window(20))
    assert not file.write(windows, {"evals": [], "summary": {"steps": 20}}, running=True)
    assert len(json.loads(path.read_text())["windows"]) == 19
    end = {"evals": [], "summary": {"steps": 20, "status": "completed"}}
    assert file.write(windows, end, running=False)
    assert path.read_text() == _whole(windows, end)
    monkeypatch.setattr(metrics_file, "LARGE_INTERVAL_S", 0.0)
    assert file.write(windows, end, running=True)


def test_each_window_is_serialised_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """100 writes, a window more each time: 100 windows serialised, not 5,050 (the whole file
    was serialised again at every window: 160 ms a write at 10,000 windows)."""
    serialised: list[object] = []
    dumps = metrics_file._dumps

    def counted(data: object) -> str:
        serialised.append(data)
        return dumps(data)

    monkeypatch.setattr(metrics_file, "_dumps", counted)
    file = MetricsFile(tmp_path / "metrics.json")
    windows: list = []
    for step in range(1, 101):
        windows.append(_window(step))
        file.write(windows, {"evals": [], "summary": {"steps": step}}, running=True)
    assert sum(1 for d in serialised if isinstance(d, dict) and "step" in d) == 100
    assert len(serialised) == 200  # and each write's evaluations and summary


def test_a_checkpoint_or_an_evaluation_writes_a_large_file_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A large file waits between window writes, but not at a checkpoint: a --resume after
    a kill reads the windows and evaluations up to its checkpoint from the file (a skipped
    write had left a hole in the resumed run's windows and lost the checkpoint's eval loss)."""
    from types import SimpleNamespace

    from expert_cli.telemetry.throughput import ThroughputMeter
    from expert_cli.train.callbacks import ThroughputCallback, earlier_records

    monkeypatch.setattr(metrics_file, "MAX_EAGER_BYTES", 10)  # every file is large
    path = tmp_path / "metrics.json"
    meter = ThroughputMeter(None)
    callback = ThroughputCallback(meter, path)
    meter.windows.append(_window(10))
    callback.write(10, "running")  # the first write
    meter.windows.append(_window(20))
    callback.write(20, "running")  # waits
    assert [w["step"] for w in json.loads(path.read_text())["windows"]] == [10]
    state = SimpleNamespace(global_step=20)
    callback.on_log(None, state, None, logs={"eval_loss": 1.25})
    assert json.loads(path.read_text())["evals"] == [{"step": 20, "eval_loss": 1.25}]
    meter.windows.append(_window(30))
    callback.on_save(None, SimpleNamespace(global_step=30), None)
    resumed = earlier_records(path, "checkpoint-30")
    assert [w["step"] for w in resumed["windows"]] == [10, 20, 30]
    assert resumed["evals"] == [{"step": 20, "eval_loss": 1.25}]
