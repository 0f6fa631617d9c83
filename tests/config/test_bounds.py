"""Every number the trainer acts on has bounds, is finite, and is a number; every switch is a
boolean. Each case is one a careless or hostile manifest tried (issue 10)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from expert_cli.config import load_manifest
from expert_cli.config.environment import Environment
from expert_cli.config.resolve import resolve
from expert_cli.errors import UserError

TWO_CPUS = Environment(cpu_count=2)


def _manifest(tmp_path: Path, config: dict | None = None, **extra) -> Path:
    (tmp_path / "train.jsonl").write_text('{"text": "x"}\n')
    data = {
        "name": "e",
        "schema_version": "2.0",
        "base_models": [{"name": "org/model", **extra.pop("base", {})}],
        "training": {
            "dataset": {"path": "train.jsonl", **extra.pop("dataset", {})},
            "config": config or {},
            **extra,
        },
    }
    path = tmp_path / "manifest.json"
    path.write_text(json.dumps(data))
    return path


def _error(tmp_path: Path, **kwargs) -> str:
    with pytest.raises(UserError) as err:
        resolve(load_manifest(_manifest(tmp_path, **kwargs)), TWO_CPUS)
    return "\n".join(err.value.lines)


@pytest.mark.parametrize(
    ("config", "where"),
    [
        ({"dataloader_num_workers": 100_000}, "training.config.dataloader_num_workers"),
        ({"epochs": 1e300}, "training.config.epochs"),
        ({"num_epochs": 1e300}, "training.config.num_epochs"),
        ({"batch_size": 10**12}, "training.config.batch_size"),
        ({"max_seq_length": 10**9}, "training.config.max_seq_length"),
        ({"max_steps": 10**12}, "training.config.max_steps"),
        ({"alpha": float("inf")}, "training.config.alpha"),
        ({"learning_rate": float("nan")}, "training.config.learning_rate"),
        ({"learning_rate": True}, "training.config.learning_rate"),
        ({"max_grad_norm": float("inf")}, "training.config.max_grad_norm"),
        ({"max_grad_norm": -1}, "training.config.max_grad_norm"),
        ({"warmup_ratio": 1}, "training.config.warmup_ratio"),  # check said usable, train no
        ({"adam_beta1": 1.0}, "training.config.adam_beta1"),
        ({"adam_epsilon": 0}, "training.config.adam_epsilon"),
        ({"seed": -1}, "training.config.seed"),
        ({"seed": 2**70}, "training.config.seed"),
        ({"packing": "yes"}, "training.config.packing"),
        ({"bf16": 1}, "training.config.bf16"),
        ({"rank": 16.5}, "training.config.rank"),
        ({"warmup_steps": 10**12}, "training.config.warmup_steps"),
        ({"save_total_limit": 10**9}, "training.config.save_total_limit"),
    ],
)
def test_out_of_range_or_wrong_type_names_the_field(tmp_path: Path, config, where) -> None:
    assert where in _error(tmp_path, config=config)


def test_booleans_and_weights_outside_the_config_block(tmp_path: Path) -> None:
    assert "base_models[0].trust_remote_code" in _error(tmp_path, base={"trust_remote_code": "yes"})
    tasks = {"a": {"train": "train.jsonl", "weight": 1e9}}
    message = _error(tmp_path, dataset={"type": "multi_task", "tasks": tasks, "path": None})
    assert "training.dataset.tasks.a.weight" in message


def test_workers_are_bounded_by_the_machine(tmp_path: Path) -> None:
    message = _error(tmp_path, config={"dataloader_num_workers": 100})
    assert "dataloader_num_workers: 100 is more than 4 per CPU on this machine (2 CPUs)" in message
    noted = resolve(
        load_manifest(_manifest(tmp_path, config={"dataloader_num_workers": 6})), TWO_CPUS
    )
    assert any(n.startswith("dataloader_num_workers: 6 processes on 2 CPUs") for n in noted.notes)


def test_tokens_per_micro_step_are_bounded(tmp_path: Path) -> None:
    message = _error(tmp_path, config={"batch_size": 4096, "max_seq_length": 1 << 20})
    assert "training.config.batch_size: 4096 rows of max_seq_length 1048576" in message


def test_in_range_values_still_load(tmp_path: Path) -> None:
    cfg = resolve(
        load_manifest(
            _manifest(
                tmp_path,
                config={"epochs": 3, "learning_rate": 1e-4, "seed": 2**32 - 1, "alpha": 32},
            )
        ),
        TWO_CPUS,
    )
    assert (cfg.epochs, cfg.seed, cfg.alpha) == (3.0, 2**32 - 1, 32.0)


def test_a_misspelt_training_block_is_an_error(tmp_path: Path) -> None:
    path = _manifest(tmp_path, confg={"learning_rate": 2e-3})
    with pytest.raises(UserError) as err:
        load_manifest(path)
    assert "training.confg: unknown field; did you mean config?" in err.value.lines[0]


def test_the_formats_descriptive_training_keys_are_kept(tmp_path: Path) -> None:
    extra = {
        "trained_on": "2025-11-06",
        "base_model_version": "qwen3-0.6b",
        "packaging_checkpoint": "checkpoint-1000",
        "checkpoint": "checkpoint-1000",
        "alternative_checkpoints": {"c": {"step": 1}},
        "quality_score": 8.8,
        "test_scenarios": {"s": {"total": 1}},
        "metadata": {"gpu": "x"},
    }
    loaded = load_manifest(_manifest(tmp_path, **extra))
    assert loaded.manifest.training.packaging_checkpoint == "checkpoint-1000"
