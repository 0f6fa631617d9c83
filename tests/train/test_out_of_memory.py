"""A run that runs out of memory ends in one message (exit 1, no traceback) that says where it
stopped, what to change, and which checkpoint --resume continues from; resuming with the
smaller micro-batch it suggests finishes the same run."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import transformers
from train_helpers import read_metrics, run_here, write_expert

from expert_cli.config import load_manifest
from expert_cli.config.environment import cpu_environment
from expert_cli.config.resolve import resolve
from expert_cli.train.memory import Stopped, oom_error, out_of_memory, remedies

CUDA_OOM = "CUDA out of memory. Tried to allocate 9.27 GiB"


def resolved_for(tmp_path: Path, model_dir: Path, **config):
    manifest = write_expert(tmp_path / "r", model_dir, rows=4, config=config)
    return resolve(load_manifest(manifest), cpu_environment())


def test_allocation_failures_are_recognised_through_their_chain() -> None:
    assert out_of_memory(torch.OutOfMemoryError(CUDA_OOM))
    cpu = RuntimeError(
        "[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory: "
        "you tried to allocate 10 bytes"
    )
    assert out_of_memory(cpu)
    try:
        try:
            raise torch.OutOfMemoryError(CUDA_OOM)
        except RuntimeError as inner:
            raise ValueError("wrapped by a library") from inner
    except ValueError as outer:
        assert out_of_memory(outer)
    assert not out_of_memory(RuntimeError("mat1 and mat2 shapes cannot be multiplied"))
    assert not out_of_memory(ValueError("out of range"))


def test_remedies_follow_what_the_run_does_not_use_yet(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    plain = resolved_for(tmp_path, tiny_model_dir, batch_size=8)
    step = Stopped("step", 4, 8, 2, "cuda:0")
    said = "; ".join(remedies(plain, step))
    assert 'batch_size "auto"' in said
    # the next smaller divisor of 16 rows per optimizer step below 8
    assert "batch_size 4 with gradient_accumulation_steps 4 (the same 16 rows" in said
    assert "gradient_checkpointing true" in said and 'fused_loss "chunked"' in said
    assert 'quantization "int4"' in said

    lean = resolved_for(
        tmp_path / "b",
        tiny_model_dir,
        batch_size=1,
        gradient_checkpointing=True,
        fused_loss="chunked",
    )
    said = "; ".join(remedies(lean, Stopped("step", 0, 1, 1, "cpu")))
    assert "batch_size" not in said and "gradient_checkpointing" not in said
    assert "fused_loss" not in said and "max_seq_length" in said

    # HiveLLM's 8 x 4 with its micro-batch as given: the probe is offered for the same step
    given = resolved_for(
        tmp_path / "c", tiny_model_dir, batch_size=8, gradient_accumulation_steps=4
    )
    said = "; ".join(remedies(given, Stopped("step", 4, 8, 4, "cuda:0")))
    assert 'micro_batch "auto" (the largest micro-batch that fits, same rows per step)' in said
    assert 'batch_size "auto"' not in said

    load = "; ".join(remedies(plain, Stopped("load", device="cuda:0")))
    assert "int4" in load and "FSDP" in load and "batch_size" not in load


def test_the_message_names_the_stage_and_the_micro_batch(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    resolved = resolved_for(tmp_path, tiny_model_dir)
    text = str(oom_error(resolved, Stopped("step", 6, 2, 1, "cpu"), tmp_path / "none"))
    assert text.startswith("out of memory at step 7 (a micro-batch of 2 rows of up to 128")
    assert "no checkpoint was saved before it" in text
    probe = str(oom_error(resolved, Stopped("probe", 0, 1, 1, "cpu"), None))
    assert "measuring a micro-step for batch_size auto (a micro-batch of 1 row of" in probe
    assert "--resume" not in probe


def test_a_step_out_of_memory_is_one_message_and_resume_finishes_the_run(
    tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    manifest = write_expert(
        tmp_path / "e", tiny_model_dir, rows=24, config={"save_steps": 2, "batch_size": 2}
    )
    output = manifest.parent / "output"
    step = transformers.Trainer.training_step

    def runs_out_at_step_4(self, *args, **kwargs):
        if self.state.global_step == 3:
            raise torch.OutOfMemoryError(CUDA_OOM)
        return step(self, *args, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(transformers.Trainer, "training_step", runs_out_at_step_4)
        proc = run_here("train", "--manifest", str(manifest), "--max-steps", "6")
    text = proc.stdout + proc.stderr
    assert proc.returncode == 1, text
    assert "Traceback" not in text and "Tried to allocate" not in text
    assert "out of memory at step 4 (a micro-batch of 2 rows of up to 128 tokens)" in text
    assert "batch_size 1 with gradient_accumulation_steps 2 (the same 2 rows" in text
    assert "checkpoint-2 (step 2) is complete: train again with --resume" in text
    assert read_metrics(output)["summary"]["status"] == "failed"

    proc = run_here(
        "train",
        "--manifest",
        str(manifest),
        "--max-steps",
        "6",
        "--resume",
        "--set",
        "batch_size=1",
        "--set",
        "gradient_accumulation_steps=2",
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = read_metrics(output)["summary"]
    assert (summary["status"], summary["steps"]) == ("completed", 6)
    assert (output / "adapter_model.safetensors").is_file()


def test_out_of_memory_while_loading_names_the_stage(
    tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The base model's weights do not fit: exit 1 naming loading (no micro-batch, no
    --resume: nothing ran), with int4 and a smaller model as the ways out."""
    manifest = write_expert(tmp_path / "e", tiny_model_dir, rows=8)

    def no_memory(*args, **kwargs):
        raise torch.OutOfMemoryError(CUDA_OOM)

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", no_memory)
    proc = run_here("train", "--manifest", str(manifest))
    text = " ".join((proc.stdout + proc.stderr).split())
    assert proc.returncode == 1, text
    assert "out of memory while loading the base model: it needs more than" in text
    assert 'quantization "int4" (QLoRA)' in text and "--resume" not in text
    assert "Traceback" not in text and "Tried to allocate" not in text
    assert not (manifest.parent / "output").exists()
