"""What a run does with the memory probe's answer (train/batch.py `plan_run_batch`). The probe
itself needs a CUDA GPU (`scripts/check_fast_path_gpu.py`, `bench_train.py`); here its answer
is given, so the choices made from it run on the CPU."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from train_helpers import h100_environment

from expert_cli.config import load_manifest
from expert_cli.config.resolve import resolve
from expert_cli.train import batch as batching
from expert_cli.train.batch import BatchPlan, plan_run_batch

GPU = h100_environment()


def _run(tmp_path: Path, **config) -> SimpleNamespace:
    (tmp_path / "train.jsonl").write_text('{"text": "x"}\n')
    manifest = {
        "name": "e",
        "schema_version": "2.0",
        "base_models": [{"name": "org/model"}],
        "training": {"dataset": {"path": "train.jsonl"}, "config": config},
    }
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    resolved = resolve(load_manifest(tmp_path / "manifest.json"), GPU)
    args = SimpleNamespace(
        per_device_train_batch_size=resolved.batch_size,
        per_device_eval_batch_size=resolved.batch_size,
        gradient_accumulation_steps=resolved.gradient_accumulation_steps,
    )
    return SimpleNamespace(resolved=resolved, args=args, runtime={})


def _plan(run: SimpleNamespace) -> list[str]:
    choices = SimpleNamespace(attn_implementation="sdpa", device="cuda:0", notes=[])
    data = SimpleNamespace(train=[{"input_ids": [1, 2, 3], "labels": [1, 2, 3]}] * 2)
    plan_run_batch(run, torch.nn.Linear(2, 2), SimpleNamespace(pad_token_id=0), data, choices)
    return choices.notes


def test_a_given_batch_is_never_made_smaller_and_an_auto_one_follows_the_probe(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """HiveLLM's 8 x 4 held before the probe existed: a probe that answers 4 rows (its 85%
    headroom) keeps 8; one that answers 16 runs 16 x 2. batch_size auto takes the answer."""
    answers = iter([4, 16, 4])

    def probe(model, rows, collate, device, rows_per_step, dtype):
        micro = next(answers)
        return BatchPlan(micro, rows_per_step // micro, rows_per_step, 1.2, 2.44, 67.3)

    monkeypatch.setattr(batching, "plan_batch", probe)
    run = _run(tmp_path, batch_size=8, gradient_accumulation_steps=4)
    notes = _plan(run)
    assert (run.args.per_device_train_batch_size, run.args.gradient_accumulation_steps) == (8, 4)
    assert notes[0].startswith("batch_size: 8 x 4 run as 8 rows x 4 accumulation = 32 rows")
    run = _run(tmp_path, batch_size=8, gradient_accumulation_steps=4)
    assert _plan(run)[0].startswith("batch_size: 8 x 4 run as 16 rows x 2 accumulation")
    assert (run.resolved.batch_size, run.resolved.gradient_accumulation_steps) == (16, 2)
    assert run.runtime["batch"]["micro_batch"] == 16
    auto = _run(tmp_path)  # 32768 tokens of 2048: 16 rows a step
    assert _plan(auto)[0].startswith("batch_size: auto: 4 rows x 4 accumulation = 16 rows")


def test_a_probe_that_runs_out_of_memory_keeps_a_given_batch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """1 x 16 on a full GPU trained before; the probe's two-row step ran out of memory and
    failed the run. It keeps the numbers as given; under batch_size auto it stays an error."""

    def probe(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(batching, "plan_batch", probe)
    run = _run(tmp_path, batch_size=1, gradient_accumulation_steps=16)
    assert _plan(run) == [
        "batch_size: 1 x 16 kept as given (the memory probe's two-row step did not fit)"
    ]
    assert (run.args.per_device_train_batch_size, run.args.gradient_accumulation_steps) == (1, 16)
    assert run.runtime == {}
    with pytest.raises(torch.OutOfMemoryError):
        _plan(_run(tmp_path))


def test_every_process_keeps_the_given_batch_when_one_probe_did_not_fit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process whose probe ran out of memory kept its numbers and left the others waiting in
    the collective that takes the smallest micro-batch: the ranks' next collectives no longer
    matched and the run hung at start-up. Every process now asks whether any probe failed
    (here the other process's answer is the stand-in) and keeps the given numbers if so."""

    def probe(model, rows, collate, device, rows_per_step, dtype):  # it fits here
        return BatchPlan(16, rows_per_step // 16, rows_per_step, 1.2, 2.44, 67.3)

    monkeypatch.setattr(batching, "plan_batch", probe)
    monkeypatch.setattr(batching.distributed, "any_rank", lambda flag: True)
    run = _run(tmp_path, batch_size=8, gradient_accumulation_steps=4)
    assert _plan(run) == [
        "batch_size: 8 x 4 kept as given (the memory probe's two-row step did not fit on "
        "another process)"
    ]
    assert (run.args.per_device_train_batch_size, run.args.gradient_accumulation_steps) == (8, 4)
