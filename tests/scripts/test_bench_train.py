"""scripts/bench_train.py's time keeping: a list of variants stops itself inside --budget, and
a variant stopped by its limit is reported with the end of what it printed (a GPU session's
outer time limit once took Unsloth's output with it)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from train_helpers import load_script

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_train.py"


def test_a_variant_gets_what_the_budget_leaves() -> None:
    bench = load_script("bench_train")
    assert bench.variant_limit(240, None) == 240
    assert 99 <= bench.variant_limit(240, time.monotonic() + 100) <= 100
    assert bench.variant_limit(60, time.monotonic() + 100) == 60
    assert bench.variant_limit(240, time.monotonic() + bench.MIN_VARIANT_S - 1) is None


@pytest.mark.slow
def test_a_variant_past_its_limit_is_reported_with_its_output(tmp_path: Path) -> None:
    """The demo expert's 200 steps take minutes on a CPU: stopped at 20 s, its report keeps
    the lines the run printed by then (printed unbuffered: a pipe's buffer goes with a kill)."""
    bench = load_script("bench_train")
    result = bench._run_variant(
        "e_default", "cli", (bench.DEMO / "manifest.json", bench.DEMO), 200, tmp_path, 20
    )
    assert result["error"] == "timed out after 20 s"
    # the first lines a run prints (on a busy machine, 20 s may end it before the model's)
    assert "data      " in result["output_tail"] and "cache     " in result["output_tail"]


def test_no_variant_starts_without_budget_left(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    cmd = [sys.executable, str(SCRIPT), "--quick", "--variants", "e_default,b_hf"]
    proc = subprocess.run(
        [*cmd, "--budget", "5", "--output", str(out)], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    results = json.loads(out.read_text())["results"]
    assert set(results) == {"e_default", "b_hf"}
    for r in results.values():
        assert r["error"] == "not started: fewer than 30 s of --budget left"
    assert "e_default                  FAILED: not started" in proc.stdout


def test_steady_figures_weigh_each_window_by_its_training_seconds() -> None:
    """A window holding an evaluation (its `time` advanced 50 s more than its training
    `seconds`) weighed by its wall time outweighed the others; the warm-up's are left out."""
    bench = load_script("bench_train")
    windows = [
        {"step": 10, "time": 10.0, "seconds": 10.0, "tokens_per_s": 1.0},  # warm-up: out
        {"step": 15, "time": 75.0, "seconds": 15.0, "tokens_per_s": 100.0},  # + a 50 s eval
        {"step": 20, "time": 80.0, "seconds": 5.0, "tokens_per_s": 200.0},
    ]
    assert bench._steady(windows, "tokens_per_s") == pytest.approx(125.0)
    assert bench._steady(windows[:1], "tokens_per_s") is None
