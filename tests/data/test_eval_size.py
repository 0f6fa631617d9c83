"""A validation split of a few examples: the default eval_fraction (0.02) of a small data set
held out one to a handful, whose loss then chose the best checkpoint and the early stop
without a word."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from conftest import DEMO_EXPERT_DIR
from train_helpers import run_here

from expert_cli.data.checks import check_manifest
from expert_cli.data.splits import FEW_EVAL, few_eval_note

SAID = "the validation split holds {}: its loss, by which the best checkpoint"


def _demo(tmp_path: Path, dataset: dict) -> Path:
    expert = tmp_path / "demo"
    shutil.copytree(DEMO_EXPERT_DIR, expert, ignore=shutil.ignore_patterns(".cache", "output"))
    manifest = json.loads((expert / "manifest.json").read_text())
    manifest["training"]["dataset"].pop("validation_path")
    manifest["training"]["dataset"].update(dataset)
    (expert / "manifest.json").write_text(json.dumps(manifest))
    return expert / "manifest.json"


def test_a_few_held_out_examples_are_said(tmp_path: Path) -> None:
    few = _demo(tmp_path / "few", {"eval_fraction": 0.02})  # 400 rows: 8 held out
    assert SAID.format("8 examples") in " ".join(check_manifest(few).notes)
    built = run_here("pretokenize", "-m", str(few))
    assert built.returncode == 0, built.stdout + built.stderr
    assert SAID.format("8 examples") in " ".join(built.stdout.split())
    trained = run_here("train", "-m", str(few), "--max-steps", "1")
    assert trained.returncode == 0, trained.stdout + trained.stderr
    assert SAID.format("8 examples") in " ".join(trained.stdout.split())
    enough = _demo(tmp_path / "enough", {"eval_fraction": 0.1})  # 40 held out
    assert not any("validation split holds" in n for n in check_manifest(enough).notes)
    off = _demo(tmp_path / "off", {"eval_fraction": 0.02})
    data = json.loads(off.read_text())
    data["training"]["config"]["evaluation_strategy"] = "no"
    off.write_text(json.dumps(data))
    assert not any("validation split holds" in n for n in check_manifest(off).notes)


def test_the_bound() -> None:
    assert SAID.format("1 example") in (few_eval_note(1) or "")
    assert few_eval_note(FEW_EVAL - 1) is not None
    assert few_eval_note(FEW_EVAL) is None and few_eval_note(0) is None
    assert few_eval_note(None) is None
