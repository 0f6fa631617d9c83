"""Resolved config -> TrainingArguments: every field lands where it should."""

from __future__ import annotations

import errno
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
from train_helpers import NO_TENSORS, h100_environment
from transformers import TrainingArguments

from expert_cli.config import load_manifest
from expert_cli.config.environment import Environment, cpu_environment
from expert_cli.config.resolve import resolve
from expert_cli.data.collate import COUNTS_KEY, CountingCollator
from expert_cli.data.packing import LENGTH_COLUMN
from expert_cli.errors import UserError
from expert_cli.train.args import planned_steps, training_args_kwargs
from expert_cli.train.checkpoints import (
    COMPLETE,
    complete_checkpoints,
    remove_incomplete_checkpoints,
    resume_problem,
)
from expert_cli.train.run_folder import disk_full, sweep_leftovers
from expert_cli.train.stop_signal import Interrupt, InterruptCallback

GPU = replace(h100_environment(), gpu_memory_gb=80.0, bitsandbytes="0.50")

CONFIG = {
    "epochs": 1.5,
    "max_steps": 40,
    "learning_rate": 3e-4,
    "lr_scheduler": "linear",
    "warmup_steps": 7,
    "batch_size": 3,
    "gradient_accumulation_steps": 5,
    "optim": "adamw_torch_fused",
    "weight_decay": 0.01,
    "max_grad_norm": 0.5,
    "seed": 7,
    "bf16": True,
    "use_tf32": True,
    "gradient_checkpointing": True,
    "torch_compile": True,
    "torch_compile_backend": "inductor",
    "torch_compile_mode": "max-autotune",
    "dataloader_num_workers": 3,
    "dataloader_pin_memory": True,
    "dataloader_prefetch_factor": 6,
    "dataloader_persistent_workers": True,
    "logging_steps": 4,
    "save_strategy": "steps",
    "save_steps": 20,
    "save_total_limit": 2,
    "evaluation_strategy": "steps",
    "eval_steps": 10,
    "load_best_model_at_end": True,
    "metric_for_best_model": "eval_loss",
    "greater_is_better": False,
    "memory_clear_every": 9,
}


def _resolved(tmp_path: Path, config: dict, env: Environment = GPU, **training):
    (tmp_path / "train.jsonl").write_text('{"text": "x"}\n')
    (tmp_path / "valid.jsonl").write_text('{"text": "x"}\n')
    manifest = {
        "name": "e",
        "schema_version": "2.0",
        "base_models": [{"name": "org/model"}],
        "training": {
            "dataset": {"path": "train.jsonl", "validation_path": "valid.jsonl"},
            "config": config,
            **training,
        },
    }
    path = tmp_path / "manifest.json"
    path.write_text(json.dumps(manifest))
    return resolve(load_manifest(path), env)


def test_every_field_is_mapped(tmp_path: Path) -> None:
    r = _resolved(tmp_path, CONFIG)
    kw = training_args_kwargs(r, tmp_path / "ckpt", on_gpu=True)
    expected = {
        "output_dir": str(tmp_path / "ckpt"),
        "num_train_epochs": 1.5,
        "max_steps": 40,
        "learning_rate": 3e-4,
        "lr_scheduler_type": "linear",
        "warmup_steps": 7,
        "per_device_train_batch_size": 3,
        "per_device_eval_batch_size": 3,
        "gradient_accumulation_steps": 5,
        "optim": "adamw_torch_fused",
        "weight_decay": 0.01,
        "max_grad_norm": 0.5,
        "seed": 7,
        "data_seed": 7,
        "bf16": True,
        "fp16": False,
        "tf32": True,
        "activation_checkpointing": True,
        # expert-cli compiles each decoder layer itself (regional), not the Trainer
        "torch_compile": False,
        "prediction_loss_only": True,
        "logging_nan_inf_filter": False,
        "dataloader_num_workers": 3,
        "dataloader_pin_memory": True,
        "dataloader_prefetch_factor": 6,
        "dataloader_persistent_workers": True,
        "train_sampling_strategy": "random",
        "logging_steps": 4,
        "save_strategy": "steps",
        "save_steps": 20,
        "save_total_limit": 2,
        "eval_strategy": "steps",
        "eval_steps": 10,
        "load_best_model_at_end": True,
        "metric_for_best_model": "eval_loss",
        "greater_is_better": False,
        "torch_empty_cache_steps": 9,
        "use_cache": False,
        "use_cpu": False,
        "remove_unused_columns": False,
    }
    assert {k: kw[k] for k in expected} == expected
    assert "torch_compile_backend" not in kw
    assert kw["accelerator_config"] == {"non_blocking": True}  # pinned: no sync per fetch
    assert (r.torch_compile, r.torch_compile_backend, r.torch_compile_mode) == (
        True,
        "inductor",
        "max-autotune",
    )


def test_arguments_are_accepted_by_transformers(tmp_path: Path) -> None:
    from transformers import TrainingArguments

    r = _resolved(
        tmp_path,
        {**CONFIG, "bf16": None, "use_tf32": None, "torch_compile": None, "optim": None},
        env=cpu_environment(),
    )
    args = TrainingArguments(**training_args_kwargs(r, tmp_path / "ckpt", on_gpu=False))
    assert args.max_steps == 40 and args.gradient_accumulation_steps == 5
    assert args.get_warmup_steps(100) == 7


def test_warmup_ratio_and_fractional_epochs(tmp_path: Path) -> None:
    r = _resolved(
        tmp_path, {"warmup_ratio": 0.1, "epochs": 0.5, "max_steps": 0}, env=cpu_environment()
    )
    kw = training_args_kwargs(r, tmp_path, on_gpu=False)
    assert kw["warmup_steps"] == 0.1 and kw["num_train_epochs"] == 0.5 and kw["max_steps"] == -1
    assert training_args_kwargs(r, tmp_path, max_steps=3)["max_steps"] == 3


def test_group_by_length_without_packing(tmp_path: Path) -> None:
    r = _resolved(tmp_path, {"packing": False, "group_by_length": True}, env=cpu_environment())
    kw = training_args_kwargs(r, tmp_path, on_gpu=False)
    assert kw["train_sampling_strategy"] == "group_by_length"
    # the sampler takes row lengths from the cache's column instead of reading every row
    assert kw["length_column_name"] == LENGTH_COLUMN


def test_length_column_is_what_the_cache_writes() -> None:
    import pyarrow as pa

    from expert_cli.data.packing import pack_table

    table = pa.table(
        {
            "input_ids": pa.array([[1, 2, 3]], pa.list_(pa.int32())),
            "labels": pa.array([[1, 2, 3]], pa.list_(pa.int32())),
        }
    )
    packed, _ = pack_table(table, 8, True, seed=0)
    assert packed.column(LENGTH_COLUMN).to_pylist() == [3]


def test_fsdp_and_deepspeed_blocks(tmp_path: Path, monkeypatch) -> None:
    fsdp = _resolved(
        tmp_path,
        {},
        distributed={
            "strategy": "fsdp",
            "fsdp": "full_shard",
            "fsdp_config": {"min_num_params": 1},
        },
    )
    kw = training_args_kwargs(fsdp, tmp_path, on_gpu=True)
    assert kw["fsdp"] is True
    assert kw["fsdp_config"] == {
        "version": 2,
        "auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
        "reshard_after_forward": True,
        "state_dict_type": "SHARDED_STATE_DICT",
        "min_num_params": 1,
    }
    # transformers takes it as it is (no deprecated string form)
    TrainingArguments(**training_args_kwargs(fsdp, tmp_path))
    for words, field in (("shard_grad_op offload", "reshard_after_forward"), ("zero3", "fsdp")):
        other = _resolved(tmp_path, {}, distributed={"strategy": "fsdp", "fsdp": words})
        if field == "fsdp":
            with pytest.raises(
                UserError, match=r"training.distributed.fsdp: word 1 is not an FSDP option"
            ):
                training_args_kwargs(other, tmp_path, on_gpu=True)
        else:
            config = training_args_kwargs(other, tmp_path, on_gpu=True)["fsdp_config"]
            assert config["reshard_after_forward"] is False and config["cpu_offload"] is True
    fsdp1 = _resolved(
        tmp_path, {}, distributed={"strategy": "fsdp", "fsdp_config": {"fsdp_version": 1}}
    )
    with pytest.raises(UserError, match="fsdp_config.version: expert-cli runs FSDP2"):
        training_args_kwargs(fsdp1, tmp_path, on_gpu=True)
    assert not [n for n in fsdp.notes if "distributed" in n]  # a GPU machine: FSDP runs
    on_cpu = _resolved(tmp_path, {}, cpu_environment(), distributed={"strategy": "fsdp"})
    assert (
        "training.distributed.strategy: fsdp runs on GPUs only (accelerate); several processes "
        "on this machine would run DDP" in on_cpu.notes
    )
    as_text = _resolved(
        tmp_path, {}, distributed={"strategy": "fsdp", "fsdp_config": {"version": "2"}}
    )
    assert training_args_kwargs(as_text, tmp_path, on_gpu=True)["fsdp_config"]["version"] == 2
    ds = _resolved(
        tmp_path,
        {},
        distributed={"strategy": "deepspeed", "deepspeed": {"zero_optimization": {"stage": 2}}},
    )
    if importlib.util.find_spec("deepspeed") is None:
        with pytest.raises(UserError, match=r"deepspeed is not installed.*expert-cli\[deepspeed\]"):
            training_args_kwargs(ds, tmp_path, on_gpu=True)
        real = importlib.util.find_spec  # pretend it is installed to check the mapping
        monkeypatch.setattr(
            importlib.util, "find_spec", lambda n, *a: object() if n == "deepspeed" else real(n, *a)
        )
    assert training_args_kwargs(ds, tmp_path, on_gpu=True)["deepspeed"] == {
        "zero_optimization": {"stage": 2}
    }
    broken = _resolved(tmp_path, {}, distributed={"strategy": "deepspeed"})
    with pytest.raises(UserError, match="deepspeed"):
        training_args_kwargs(broken, tmp_path, on_gpu=True)


def test_planned_steps(tmp_path: Path) -> None:
    r = _resolved(
        tmp_path,
        {"batch_size": 2, "gradient_accumulation_steps": 3, "epochs": 2, "max_steps": 0},
        env=cpu_environment(),
    )
    assert planned_steps(r, n_rows=25, world_size=1) == 10  # ceil(13 / 3) * 2
    assert planned_steps(r, n_rows=25, world_size=2) == 6
    assert planned_steps(r, n_rows=25, world_size=1, max_steps=4) == 4


def test_counting_collator_counts_real_tokens_and_examples() -> None:
    rows = [
        {
            "input_ids": [1, 2, 3, 4, 5],
            "labels": [-100, -100, 3, 4, 5],
            "position_ids": [0, 1, 2, 0, 1],
        },
        {"input_ids": [6, 7], "labels": [-100, 7], "position_ids": [0, 1]},
    ]
    batch = CountingCollator(lambda feats: {"n": len(feats)})(rows)
    # attended: examples of 3, 2 and 2 tokens -> 9 + 4 + 4
    assert batch[COUNTS_KEY] == (7, 3, 4, 17) and batch["n"] == 2


def test_only_complete_checkpoints_count(tmp_path: Path) -> None:
    assert complete_checkpoints(tmp_path / "none") == []
    for n in (5, 40, 100, 9):
        (tmp_path / f"checkpoint-{n}").mkdir()
        if n != 100:  # checkpoint-100 was cut off before its marker
            (tmp_path / f"checkpoint-{n}" / COMPLETE).write_text("{}")
    assert [p.name for p in complete_checkpoints(tmp_path)] == [
        "checkpoint-5",
        "checkpoint-9",
        "checkpoint-40",
    ]


def test_interrupt_sets_flag_and_exit_code() -> None:
    with Interrupt() as interrupt:
        signal.raise_signal(signal.SIGTERM)
        assert interrupt.signum == signal.SIGTERM
    assert interrupt.exit_code == 143
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


def test_sigterm_raises_before_training_and_a_second_one_stops_training() -> None:
    """Under `train`, SIGTERM raises Terminated (so the folder is tidied), the first one in
    training only sets the flag, and a second stops at once (as a second Ctrl-C does)."""
    from expert_cli.atomic import sigterm_raises
    from expert_cli.errors import Terminated

    heard: list[str] = []
    with sigterm_raises():
        with pytest.raises(Terminated):
            signal.raise_signal(signal.SIGTERM)
        with Interrupt(heard.append) as interrupt:
            signal.raise_signal(signal.SIGTERM)
            assert interrupt.signum == signal.SIGTERM
            assert heard == [  # said at once: the step may be minutes from its end
                "SIGTERM: stopping at the end of this optimizer step, with a checkpoint; the "
                "same signal again stops at once, without one"
            ]
            with pytest.raises(Terminated):
                signal.raise_signal(signal.SIGTERM)
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


def test_under_a_launcher_its_copy_of_the_signal_is_not_a_second_one(monkeypatch) -> None:
    """A terminal's Ctrl-C reaches every process of its group: torchrun (or accelerate launch)
    and each worker. torchrun sends it on to each worker a moment later, and that copy was a
    second signal: every worker stopped at once, without its checkpoint (the steps since the
    last one lost). Under a launcher a repeat within LAUNCHER_ECHO seconds is that copy; a
    later one still stops at once. Without a launcher a quick second Ctrl-C stops at once."""
    now = [100.0]
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "run")
    with Interrupt(clock=lambda: now[0]) as interrupt:
        signal.raise_signal(signal.SIGINT)
        now[0] += 0.05
        signal.raise_signal(signal.SIGINT)  # the launcher's copy: ignored
        assert interrupt.signum == signal.SIGINT
        now[0] += Interrupt.LAUNCHER_ECHO
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)
    with Interrupt(clock=lambda: now[0]) as interrupt:  # another signal is no copy
        signal.raise_signal(signal.SIGTERM)
        with pytest.raises(KeyboardInterrupt):  # a second signal of another kind: at once
            signal.raise_signal(signal.SIGINT)
        assert interrupt.signum == signal.SIGTERM
    monkeypatch.delenv("TORCHELASTIC_RUN_ID")
    with Interrupt(clock=lambda: now[0]) as interrupt:
        signal.raise_signal(signal.SIGINT)
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_checkpoint_lacking_one_process_random_state_is_not_resumed(tmp_path: Path) -> None:
    """Each process of a run of several writes its own rng_state_N.pth; one missing went
    unnoticed (any one file passed) and the resumed process drew other numbers (a dropout
    run's losses differed from the uninterrupted one's). The marker now waits for every
    process, and a gap in the ranks' files is named."""
    import torch

    (tmp_path / "trainer_state.json").write_text(json.dumps({"train_batch_size": 4}))
    for name in ("optimizer.pt", "scheduler.pt", "rng_state_0.pth", "rng_state_2.pth"):
        torch.save({"state": 1}, tmp_path / name)
    assert resume_problem(tmp_path) == (
        "rng_state_1.pth is missing (that process would not draw what it would have drawn)"
    )
    torch.save({"state": 1}, tmp_path / "rng_state_1.pth")
    assert resume_problem(tmp_path) is None
    for name in ("rng_state_0.pth", "rng_state_1.pth", "rng_state_2.pth"):
        (tmp_path / name).unlink()
    torch.save({"state": 1}, tmp_path / "rng_state.pth")  # one process's
    assert resume_problem(tmp_path) is None


def test_incomplete_checkpoints_are_removed_and_complete_ones_kept(tmp_path: Path) -> None:
    for n in (3, 6):
        (tmp_path / f"checkpoint-{n}").mkdir()
    (tmp_path / "checkpoint-3" / COMPLETE).write_text("{}")
    (tmp_path / "checkpoint-6" / "optimizer.pt").write_bytes(b"cut")
    assert remove_incomplete_checkpoints(tmp_path) == ["checkpoint-6"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-3"]
    assert remove_incomplete_checkpoints(tmp_path / "missing") == []


def test_leftovers_of_dead_processes_are_swept_and_live_ones_kept(tmp_path: Path) -> None:
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    live = str(os.getpid())
    for name in (f".final-{dead}", f".tmp-base_model-{dead}"):
        (tmp_path / name).mkdir()
    (tmp_path / f".tmp-metrics.json-{dead}").write_text("{")
    (tmp_path / f".final-{live}").mkdir()  # this process's own staging: in use
    (tmp_path / ".hidden-notes").write_text("mine")  # not ours: left alone
    (tmp_path / "adapter_model.safetensors").write_bytes(NO_TENSORS)
    removed = sweep_leftovers(tmp_path)
    assert sorted(removed) == sorted(
        [f".final-{dead}", f".tmp-base_model-{dead}", f".tmp-metrics.json-{dead}"]
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [f".final-{live}", ".hidden-notes", "adapter_model.safetensors"]
    )


def test_what_counts_as_a_full_disk(tmp_path: Path) -> None:
    assert disk_full(OSError(errno.ENOSPC, "No space left on device"), tmp_path)
    assert disk_full(Exception("No space left on device (os error 28)"), tmp_path)
    assert not disk_full(OSError(errno.EACCES, "Permission denied"), tmp_path)
    assert not disk_full(ValueError("bad value"), tmp_path)
    # torch's zip writer: a full disk only if the folder really has (almost) no space left
    assert not disk_full(
        RuntimeError("[enforce fail at inline_container.cc] unexpected pos"), tmp_path
    )


def test_a_one_process_run_on_several_gpus_keeps_to_one(tmp_path: Path) -> None:
    """Several GPUs and no launcher: transformers wrapped the model in nn.DataParallel, which
    splits each packed batch (and its boundaries) over them, and MFU read one GPU's peak."""
    from transformers import TrainingArguments

    from expert_cli.train.args import one_gpu

    args = TrainingArguments(output_dir=str(tmp_path), report_to=[])
    assert one_gpu(args) is None  # none visible here
    args._n_gpu = 4  # what transformers sets on a node of 4 GPUs without torchrun
    note = one_gpu(args)
    assert args.n_gpu == 1 and note is not None
    assert "torchrun --nproc_per_node 4 -m expert_cli.cli train" in note


def test_a_run_of_few_optimizer_steps_says_so(tmp_path: Path, tiny_model_dir: Path) -> None:
    """300 conversations packed into 10 rows trained one step at `batch_size: auto` and said
    `completed`: a run whose steps were not asked for says how few they are, and how to get
    more; one given `--max-steps` does not."""
    from train_helpers import run_here, write_expert

    manifest = write_expert(tmp_path / "e", tiny_model_dir, rows=8, config={"batch_size": 4})
    output = tmp_path / "e" / "output"
    proc = run_here("train", "--manifest", str(manifest), "--output", str(output))
    said = " ".join((proc.stdout + proc.stderr).split())
    assert proc.returncode == 0, said
    resolved = json.loads((output / "manifest.resolved.json").read_text())
    rows = resolved["runtime"]["data"]["stats"]["train"]["rows"]
    steps = -(-rows // 4)
    note = (
        f"only {steps} optimizer step{'' if steps == 1 else 's'} ({rows:,} packed rows at 4 a "
        "step, 1 epoch): an adapter learns little from so few updates; raise `epochs`, or "
        "lower `batch_size` or `gradient_accumulation_steps`"
    )
    assert note in said
    assert any(note in n for n in resolved["runtime"]["model"]["notes"])
    asked = run_here(
        "train", "--manifest", str(manifest), "--output", str(tmp_path / "o2"), "--max-steps", "2"
    )
    assert asked.returncode == 0 and "optimizer step" not in asked.stdout + asked.stderr


def _hand_made_checkpoint(folder: Path, step: int, saved_step: int | None = None) -> Path:
    """A checkpoint folder as the Trainer writes one, without a run: state, finite adapter
    weights, optimizer, schedule and random states (torch.save's zip archives)."""
    import torch
    from safetensors.torch import save_file

    path = folder / f"checkpoint-{step}"
    path.mkdir(parents=True)
    state = {"global_step": step if saved_step is None else saved_step, "train_batch_size": 4}
    (path / "trainer_state.json").write_text(json.dumps(state))
    save_file({"lora_A": torch.ones(2, 2)}, str(path / "adapter_model.safetensors"))
    for name in ("optimizer.pt", "scheduler.pt", "rng_state.pth"):
        torch.save({"step": step}, path / name)
    (path / COMPLETE).write_text("")
    return path


def test_a_resume_starts_from_the_newest_sound_checkpoint(tmp_path: Path) -> None:
    """Fast guards of what only slow end-to-end tests held: the newest of several sound
    checkpoints is resumed (not the oldest); one renamed from another step, or whose adapter
    holds NaN (saved as the run diverged), is passed over and named."""
    import torch
    from safetensors.torch import save_file

    from expert_cli.train.checkpoints import checkpoint_problem, resume_point

    for step in (1, 2, 3):
        _hand_made_checkpoint(tmp_path, step)
    assert resume_point(tmp_path).checkpoint.name == "checkpoint-3"
    assert resume_point(tmp_path).passed_over == ()
    nan = tmp_path / "checkpoint-3" / "adapter_model.safetensors"
    save_file({"lora_A": torch.full((2, 2), float("nan"))}, str(nan))
    point = resume_point(tmp_path)
    assert point.checkpoint.name == "checkpoint-2"
    assert len(point.passed_over) == 1 and point.passed_over[0].startswith("checkpoint-3: ")
    assert "(saved as the run diverged)" in point.passed_over[0]
    renamed = _hand_made_checkpoint(tmp_path / "other", 5, saved_step=4)
    assert (
        checkpoint_problem(renamed)
        == "trainer_state.json is of another step than the folder's name"
    )


def test_report_to_passes_installed_trackers_on_and_names_a_missing_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An installed tracker reaches the Trainer's report_to (TensorBoard stays expert-cli's
    own events); one not installed is a UserError naming the field and what to install; a
    name transformers has no integration for is refused by the manifest's schema."""
    (tmp_path / "fake").mkdir()
    (tmp_path / "fake" / "dvclive.py").write_text("")  # installed, as far as a probe can tell
    monkeypatch.syspath_prepend(str(tmp_path / "fake"))
    r = _resolved(tmp_path, {"report_to": ["dvclive", "tensorboard", "dvclive"]})
    assert r.report_to == ["dvclive"]
    assert training_args_kwargs(r, tmp_path / "ckpt", on_gpu=True)["report_to"] == ["dvclive"]
    alone = _resolved(tmp_path, {"report_to": ["tensorboard"]})
    assert training_args_kwargs(alone, tmp_path / "ckpt", on_gpu=True)["report_to"] == "none"
    with pytest.raises(UserError, match=r"report_to: wandb is not installed here \(pip install"):
        _resolved(tmp_path, {"report_to": ["wandb"]})
    with pytest.raises(UserError, match=r"report_to"):
        _resolved(tmp_path, {"report_to": ["tensorbored"]})
    assert _resolved(tmp_path, {"report_to": "none"}).report_to == []  # the Trainer's word
    assert _resolved(tmp_path, {"report_to": "dvclive, tensorboard"}).report_to == ["dvclive"]
    import typing

    from expert_cli.config.trackers import TRACKERS, Tracker

    assert typing.get_args(Tracker) == tuple(TRACKERS)  # the schema's names, each's module


def test_few_steps_under_batch_size_auto_name_the_tokens_a_step(tmp_path: Path) -> None:
    """Under `batch_size: auto` the rows a step come from `tokens_per_step`, which the note
    names (it said to lower batch_size, which the manifest never gave)."""
    from expert_cli.train.args import few_steps_note

    auto = _resolved(tmp_path, {"batch_size": "auto"}, env=h100_environment())
    assert auto.batch_auto
    note = few_steps_note(auto, 1, 10, 1)
    assert note is not None and "lower `tokens_per_step` (or give `batch_size`)" in note
    given = _resolved(tmp_path, {"batch_size": 4})
    assert "lower `batch_size` or `gradient_accumulation_steps`" in few_steps_note(given, 3, 10, 1)
    assert few_steps_note(given, 50, 10, 1) is None


def test_a_tracker_that_fails_to_start_is_named_and_leaves_no_folder(
    tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by a review: an installed tracker that fails as the run starts (W&B without an
    API key) was a traceback, exit 1, and the folder it left refused the next run."""
    from train_helpers import run_here, write_expert

    stub = tmp_path / "stub" / "dvclive"
    stub.mkdir(parents=True)
    (stub / "__init__.py").write_text(
        "class Live:\n    def __init__(self, *a, **k):\n        raise RuntimeError('no DVC repo')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path / "stub"))
    monkeypatch.delitem(sys.modules, "dvclive", raising=False)  # another test's stub
    manifest = write_expert(tmp_path / "e", tiny_model_dir, rows=8, config={"report_to": "dvclive"})
    output = tmp_path / "out"
    proc = run_here("train", "--manifest", str(manifest), "--output", str(output))
    said = " ".join((proc.stdout + proc.stderr).split())
    assert proc.returncode == 2, said
    assert (
        "training.config.report_to: dvclive failed to start (RuntimeError: no DVC repo); set it up"
    ) in said
    assert "Traceback" not in said and not output.exists()


DVCLIVE_STUB = """
import os
class Live:
    def __init__(self, *a, **k):
        self.steps = 0
    def log_params(self, params):
        pass
    def log_metric(self, name, value):
        if self.steps >= int(os.environ.get("STUB_FAIL_AT", "1000000")):
            raise ConnectionError("tracking server unreachable")
    def next_step(self):
        self.steps += 1
    def end(self):
        if os.environ.get("STUB_FAIL_AT_END"):
            raise ConnectionError("tracking server unreachable")
"""


@pytest.mark.parametrize("failing", [{"STUB_FAIL_AT": "2"}, {"STUB_FAIL_AT_END": "1"}])
def test_a_tracker_that_fails_mid_run_stops_logging_not_the_run(
    tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, failing: dict
) -> None:
    """A tracking server that stops answering: mid-run, a traceback lost the steps since the
    last checkpoint; at the end, a finished run was marked failed and saved no adapter. The
    tracker is dropped with a note and the run goes on."""
    from train_helpers import run_here, write_expert

    stub = tmp_path / "stub" / "dvclive"
    stub.mkdir(parents=True)
    (stub / "__init__.py").write_text(DVCLIVE_STUB)
    (stub / "plots.py").write_text("class Metric:\n    could_log = staticmethod(lambda v: True)\n")
    (stub / "utils.py").write_text("def standardize_metric_name(key, _):\n    return key\n")
    monkeypatch.syspath_prepend(str(tmp_path / "stub"))
    for name in ("dvclive", "dvclive.plots", "dvclive.utils"):  # another test's stub: not this
        monkeypatch.delitem(sys.modules, name, raising=False)
    for key, value in failing.items():
        monkeypatch.setenv(key, value)
    manifest = write_expert(tmp_path / "e", tiny_model_dir, rows=8, config={"report_to": "dvclive"})
    output = tmp_path / "out"
    proc = run_here("train", "--manifest", str(manifest), "--output", str(output),
                    "--max-steps", "4")  # fmt: skip
    said = " ".join((proc.stdout + proc.stderr).split())
    assert proc.returncode == 0, said
    step = 3 if "STUB_FAIL_AT" in failing else 4
    assert (
        f"report_to: DVCLive failed at step {step} (ConnectionError); it logs nothing more" in said
    )
    assert "Traceback" not in said and (output / "adapter_model.safetensors").is_file()
    assert json.loads((output / "metrics.json").read_text())["summary"]["status"] == "completed"


def test_the_length_said_is_the_one_trained() -> None:
    """With max_steps 2 in the manifest and --max-steps 3 given, the note said max_steps 2
    set the run's length, and the run trained 3 steps."""
    from expert_cli.train.args import length_notes

    notes = ["epochs: not applied; max_steps 2 sets the run's length", "other"]
    assert length_notes(notes, 3) == [
        "epochs: not applied; --max-steps 3 sets the run's length",
        "other",
    ]
    assert length_notes(notes, None) == notes


def test_older_checkpoints_go_only_once_the_new_one_is_whole(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    """save_total_limit 1: the Trainer removed the older checkpoint before the new one was
    marked complete, and a kill in between (every try of a hostile user's) left no checkpoint
    to resume from. The older one stays until the new one's _COMPLETE is written."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from expert_cli.train.checkpoints import CheckpointMarker
    from expert_cli.train.trainer import ExpertTrainer

    model = get_peft_model(
        AutoModelForCausalLM.from_pretrained(tiny_model_dir),
        LoraConfig(r=2, target_modules=["q_proj"]),
    )
    args = TrainingArguments(
        output_dir=str(tmp_path), save_total_limit=1, use_cpu=True, report_to="none"
    )
    trainer = ExpertTrainer(model=model, args=args, callbacks=[CheckpointMarker()])
    trainer.create_optimizer_and_scheduler(num_training_steps=10)
    for step in (2, 4):
        trainer.state.global_step = step
        if step == 4:  # a passed-over checkpoint-4 is there, marked; checkpoint-2 copied
            # from a machine whose clock ran ahead: rotation by the folders' times removed
            # each new checkpoint as the older one
            (tmp_path / "checkpoint-4").mkdir()
            (tmp_path / "checkpoint-4" / COMPLETE).write_text("{}")
            ahead = time.time() + 7200
            os.utime(tmp_path / "checkpoint-2", (ahead, ahead))
        trainer._save_checkpoint(model, None)
        if step == 4:  # a kill here leaves the older checkpoint whole, the new one unmarked
            assert (tmp_path / "checkpoint-2" / COMPLETE).is_file()
            assert not (tmp_path / "checkpoint-4" / COMPLETE).exists()
        trainer.callback_handler.on_save(args, trainer.state, trainer.control)
    assert [p.name for p in tmp_path.glob("checkpoint-*")] == ["checkpoint-4"]
    assert (tmp_path / "checkpoint-4" / COMPLETE).is_file() and args.save_total_limit == 1
    # an interrupt's save: the stop lifts the Trainer's limit for the end of training (before
    # the marker's turn), and the limit the run began with still applies to this save
    stop = InterruptCallback(Interrupt(), lambda flag: flag)
    stop.stopped = True
    trainer = ExpertTrainer(model=model, args=args, callbacks=[stop, CheckpointMarker()])
    trainer.callback_handler.on_train_begin(args, trainer.state, trainer.control)
    trainer.create_optimizer_and_scheduler(num_training_steps=10)
    trainer.state.global_step = 5
    trainer._save_checkpoint(model, None)
    trainer.callback_handler.on_save(args, trainer.state, trainer.control)
    assert [p.name for p in tmp_path.glob("checkpoint-*")] == ["checkpoint-5"]
