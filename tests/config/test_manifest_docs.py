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


def test_settings_left_unset_say_what_they_resolve_to() -> None:
    """`check --list-settings` said "unset" for the learning rate, epochs and rank, where the
    resolution chooses 2e-4, 1 and the adapter's r else 16: the list says it, each value the
    resolution's own constant; other blocks' fields (an adapter entry's alpha) keep "unset"."""
    from expert_cli.config.adapters import DEFAULT_RANK
    from expert_cli.config.choices import DEFAULT_LR
    from expert_cli.config.fields import describe_fields
    from expert_cli.config.models import AdapterSpec
    from expert_cli.config.training_config import TrainingConfig

    shown = {f.name: f.default for f in describe_fields(TrainingConfig)}
    assert shown["learning_rate"] == f"unset: {DEFAULT_LR:g}" == "unset: 0.0002"
    assert shown["rank"] == f"unset: the adapter's r, else {DEFAULT_RANK}"
    assert shown["epochs"] == "unset: 1" and shown["eval_steps"] == "unset: save_steps"
    assert shown["fused_loss"] == "unset"  # a choice of the machine: said by check
    assert {f.name: f.default for f in describe_fields(AdapterSpec)}["alpha"] == "unset"
