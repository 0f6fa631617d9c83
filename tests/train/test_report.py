"""training.png and `expert-cli report`: four panels drawn from metrics.json."""

from __future__ import annotations

import json
from pathlib import Path

from train_helpers import png_facts, run_cli

from expert_cli.train.report import PANELS

METRICS = {
    "windows": [
        {
            "step": s,
            "loss": 3.0 - 0.1 * s,
            "learning_rate": 1e-3,
            "tokens_per_s": 900.0 + s,
            "data_wait_fraction": 0.01,
            "seconds": 1.0,
        }
        for s in range(5, 55, 5)
    ],
    "evals": [
        {"step": 20, "eval_loss": 1.9},
        {"step": 40, "eval_loss": 1.2},
        {"step": 50, "eval_loss": 1.3},
    ],
    "summary": {"status": "completed", "steps": 50, "tokens_per_s": 925.0, "final_loss": 1.0},
}


def test_report_draws_four_panels_and_summarises(tmp_path: Path) -> None:
    (tmp_path / "metrics.json").write_text(json.dumps(METRICS))
    out = run_cli("report", str(tmp_path))
    assert out.returncode == 0, out.stdout + out.stderr
    assert (
        "completed: 50 steps, 925 tok/s, final loss 1, best eval loss 1.2 at step 40" in out.stdout
    )
    width, height, texts = png_facts(tmp_path / "training.png")
    assert (width, height) == (1100, 700)
    assert texts["Description"] == "panels: " + ", ".join(PANELS) and len(PANELS) == 4


def test_report_of_a_folder_without_metrics_is_exit_2(tmp_path: Path) -> None:
    out = run_cli("report", str(tmp_path))
    assert out.returncode == 2 and "no readable metrics.json" in out.stderr


def test_report_redraws_its_own_picture_but_asks_before_replacing_another_file(
    tmp_path: Path,
) -> None:
    (tmp_path / "metrics.json").write_text(json.dumps(METRICS))
    for _ in range(2):  # RUN_DIR/training.png is the run's own: redrawn without asking
        assert run_cli("report", str(tmp_path)).returncode == 0
    mine = tmp_path / "mine.png"
    mine.write_bytes(b"my picture")
    out = run_cli("report", str(tmp_path), "--output", str(mine))
    assert out.returncode == 2
    assert f"--output: {mine} already exists; add --force to replace it" in " ".join(
        out.stderr.split()
    )
    assert mine.read_bytes() == b"my picture"
    out = run_cli("report", str(tmp_path), "--output", str(mine), "--force")
    assert out.returncode == 0, out.stderr
    assert png_facts(mine)[:2] == (1100, 700)
