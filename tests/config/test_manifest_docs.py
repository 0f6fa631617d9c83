"""docs/manifest.md is generated from the models: it must list every field and be current."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from expert_cli import config

ROOT = Path(__file__).resolve().parents[2]


def test_manifest_reference_is_current() -> None:
    out = subprocess.run(
        [sys.executable, "scripts/gen_manifest_docs.py", "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stdout


def test_every_training_config_field_is_documented() -> None:
    text = (ROOT / "docs" / "manifest.md").read_text()
    for model in (
        config.TrainingConfig,
        config.DatasetSpec,
        config.BaseModelSpec,
        config.AdapterSpec,
    ):
        for name in model.model_fields:
            assert f"| `{name}`" in text, name


def test_every_schedule_argument_is_documented() -> None:
    """docs/training.md's table of schedules names each argument the manifest accepts, on
    the schedule's own row."""
    from expert_cli.config.schedules import SCHEDULER_ARGUMENTS

    rows = {
        line.split("|")[1].strip(): line
        for line in (ROOT / "docs" / "training.md").read_text().splitlines()
        if line.startswith("| ") and line.count("|") == 3
    }
    for schedule, arguments in SCHEDULER_ARGUMENTS.items():
        row = next(
            (
                line
                for names, line in rows.items()
                if schedule in names.split(", ") or names.startswith(schedule + " ")
            ),
            None,
        )
        assert row is not None, schedule
        for name in arguments:
            assert f"`{name}`" in row, (schedule, name)
