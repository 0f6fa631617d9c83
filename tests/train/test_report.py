"""training.png and `expert-cli report`: four panels drawn from metrics.json."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from train_helpers import png_facts, run_here

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
    out = run_here("report", str(tmp_path))
    assert out.returncode == 0, out.stdout + out.stderr
    assert (
        "completed: 50 steps, 925 tok/s, final loss 1, best eval loss 1.2 at step 40" in out.stdout
    )
    width, height, texts = png_facts(tmp_path / "training.png")
    assert (width, height) == (1100, 700)
    assert texts["Description"] == "panels: " + ", ".join(PANELS) and len(PANELS) == 4


def test_report_of_a_folder_without_metrics_is_exit_2(tmp_path: Path) -> None:
    out = run_here("report", str(tmp_path))
    assert out.returncode == 2 and "no readable metrics.json" in out.stderr


def test_report_redraws_its_own_picture_but_asks_before_replacing_another_file(
    tmp_path: Path,
) -> None:
    (tmp_path / "metrics.json").write_text(json.dumps(METRICS))
    for _ in range(2):  # RUN_DIR/training.png is the run's own: redrawn without asking
        assert run_here("report", str(tmp_path)).returncode == 0
    mine = tmp_path / "mine.png"
    mine.write_bytes(b"my picture")
    out = run_here("report", str(tmp_path), "--output", str(mine))
    assert out.returncode == 2
    assert f"--output: {mine} already exists; add --force to replace it" in " ".join(
        out.stderr.split()
    )
    assert mine.read_bytes() == b"my picture"
    out = run_here("report", str(tmp_path), "--output", str(mine), "--force")
    assert out.returncode == 0, out.stderr
    assert png_facts(mine)[:2] == (1100, 700)


@pytest.mark.filterwarnings("error")  # nor a warning: a glyph the font lacks, an axis overflow
def test_a_damaged_or_hand_edited_metrics_file_is_reported_without_a_traceback(
    tmp_path: Path,
) -> None:
    """Non-finite numbers, numbers no run records (1e308), strings where numbers go and a
    status holding terminal escape sequences: what is not a plausible number is neither drawn
    nor summarised, and the escapes are shown, not sent to the terminal."""
    windows = [
        {"step": 1, "loss": 2.0, "tokens_per_s": 10.0},
        {"step": 2, "loss": float("nan"), "tokens_per_s": float("inf")},
        {"step": "3", "loss": "high", "learning_rate": [1]},
        {"step": 4, "loss": 1e308, "data_wait_fraction": -1e308},
        "not a record",
    ]
    metrics = {
        "windows": windows,
        "evals": [{"step": 2, "eval_loss": float("nan")}, {"step": 4, "eval_loss": 1.5}, None],
        "summary": {
            "status": "completed\x1b[2J\x1b]0;pwned\x07",
            "steps": "many",
            "tokens_per_s": float("inf"),
            "final_loss": float("nan"),
        },
    }
    (tmp_path / "metrics.json").write_text(json.dumps(metrics))
    out = run_here("report", str(tmp_path))
    assert out.returncode == 0, out.stderr
    assert "Traceback" not in out.stderr
    assert "\x1b" not in out.stdout and "\x07" not in out.stdout
    expected = "completed\\x1b[2J\\x1b]0;pwned\\x07: 0 steps, - tok/s, final loss -, "
    assert expected + "best eval loss 1.5 at step 4" in out.stdout
    assert png_facts(tmp_path / "training.png")[:2] == (1100, 700)


def test_control_characters_are_shown_as_escapes() -> None:
    from expert_cli.cli.render import visible

    assert visible("a\x1b[31mb\x9b\u202ec\td\ne") == "a\\x1b[31mb\\x9b\\u202ec\td\ne"
    assert visible("plain naïve 日本") == "plain naïve 日本"


def test_one_item_stays_one_line(capsys) -> None:
    """An error naming a file whose name holds a line break cannot print a forged second
    line; tabs and text stay as they are."""
    from expert_cli.cli.render import one_line, print_error
    from expert_cli.errors import UserError

    assert one_line("a\nb\r\x1bc\td") == "a\\nb\\r\\x1bc\td"
    print_error("error", UserError(["data/x\nmanifest is usable: not found"]))
    assert capsys.readouterr().err.splitlines() == [
        "error:",
        "  data/x\\nmanifest is usable: not found",
    ]
