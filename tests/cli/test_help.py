"""Help that reads well: an example under every command, value names instead of Python types,
`--version`, the keys `--set` accepts, and `--set` mistakes blamed on the option."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from train_helpers import run_cli

from expert_cli import __version__
from expert_cli.cli.app import app

ROOT = Path(__file__).resolve().parents[2]
DEMO = str(ROOT / "experts" / "demo" / "manifest.json")
COMMANDS = sorted(c.name or c.callback.__name__ for c in app.registered_commands)


def test_version() -> None:
    out = run_cli("--version")
    assert out.returncode == 0 and out.stdout.strip() == f"expert-cli {__version__}"
    # `python -m expert_cli` too (it was "No module named expert_cli.__main__")
    out = subprocess.run(
        [sys.executable, "-m", "expert_cli", "--version"], capture_output=True, text=True
    )
    assert out.returncode == 0 and out.stdout.strip() == f"expert-cli {__version__}", out.stderr


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_has_examples_and_readable_value_names(command: str) -> None:
    out = run_cli(command, "--help")
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert "Examples:" in text and f"expert-cli {command}" in text.split("Examples:")[1]
    assert not re.search(r"<(bool|int|float|str|path|list\[\w+\]|int range|float range)>", text)


def test_the_settings_set_accepts(cli) -> None:
    out = cli("check", "--list-settings", "--json")
    assert out.returncode == 0, out.stderr
    rows = {row["name"]: row for row in json.loads(out.stdout)}
    assert rows["learning_rate"]["limits"] == "> 0, <= 1"
    assert {"rank", "batch_size", "max_seq_length", "pretokenized_cache"} <= set(rows)
    table = cli("check", "--list-settings")
    assert table.returncode == 0 and "learning_rate" in table.stdout


@pytest.mark.parametrize("columns", [80, 200])
def test_the_settings_show_each_key_whole_at_any_width(columns) -> None:
    """At 80 columns the five-column table cut keys short (`target_modul…`) and wrapped each
    meaning a word a line: narrower than 140 columns each key is a block, no line too wide."""
    from train_helpers import run_here

    from expert_cli.config import TrainingConfig
    from expert_cli.config.fields import describe_fields

    out = run_here("check", "--list-settings", env={"COLUMNS": str(columns)})
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert max(map(len, lines)) <= columns
    assert "…" not in out.stdout
    for doc in describe_fields(TrainingConfig):
        if columns < 140:
            assert any(line.startswith(f"{doc.name}  ") for line in lines), doc.name
        else:
            assert any(line.startswith(f"│ {doc.name} ") for line in lines), doc.name
    assert ("default unset: 0.0002; limits > 0, <= 1. Peak" in out.stdout) == (columns < 140)


def test_a_field_of_another_block_given_as_a_bare_key_is_placed(cli) -> None:
    """`--set chat_template=chatml` (a base model's field) was only "unknown field"."""
    out = cli("check", "-m", DEMO, "--set", "chat_template=chatml", "--set", "response_template=x")
    text = " ".join(out.stdout.split())
    assert out.returncode == 2
    assert (
        "training.config.chat_template: unknown field; it is a field of base_models[0] (with "
        "--set: base_models.0.chat_template=...)"
    ) in text
    assert "it is a field of training.dataset (with --set: training.dataset.response_template" in (
        text
    )


def test_set_mistakes_are_blamed_on_the_option_with_a_suggestion(cli) -> None:
    out = cli("check", "-m", DEMO, "--set", "lr=1e-3", "--set", "rank=0", "--set", "seq_len=9")
    assert out.returncode == 2
    text = " ".join(out.stdout.split())
    assert "--set lr=1e-3: training.config.lr: unknown field; did you mean learning_rate?" in text
    assert (
        "--set seq_len=9: training.config.seq_len: unknown field; did you mean max_seq_length?"
        in text
    )
    assert "--set rank=0: training.config.rank:" in text
    assert "manifest.json: training.config.lr" not in text


def test_set_values_reach_the_resolved_configuration(cli) -> None:
    out = cli("check", "-m", DEMO, "--json", "--set", "learning_rate=0.0005")
    assert out.returncode == 0, out.stdout + out.stderr
    assert json.loads(out.stdout)["config"]["learning_rate"] == 0.0005


def test_check_without_a_manifest_says_what_it_needs(cli) -> None:
    out = cli("check")
    assert out.returncode == 2 and "--manifest: required" in out.stderr


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (("check", "-m", ""), "--manifest: is empty; expected the path of an expert's manifest"),
        (("pretokenize", "-m", " "), "--manifest: is empty; expected the path of an expert's"),
        (("generate", "--adapter", "", "-p", "hi"), "--adapter: is empty; expected a trained"),
    ],
)
def test_an_empty_path_is_refused_not_read_as_the_current_folder(args, said: str) -> None:
    """`-m ''` was read as the current folder ("/home/you: is a folder")."""
    from train_helpers import run_here

    done = run_here(*args)
    assert done.returncode == 2 and said in " ".join(done.stderr.split()), done.stderr
