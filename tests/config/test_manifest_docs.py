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
