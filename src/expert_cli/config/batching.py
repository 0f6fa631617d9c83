"""The step's rows: micro-batch, accumulation and rows per optimizer step, as resolved before
the run (train/batch.py probes the GPU's memory at start where `batch_auto` says so).

`batch_size` auto (the GPU's default): rows per step = `tokens_per_step` / `max_seq_length`, the
micro-batch probed. A number with `gradient_accumulation_steps` above 1 on a GPU: the step is
batch_size x accumulation rows, the micro-batch probed too unless `micro_batch` is fixed (a
larger micro-batch keeps the GPU busier; each step takes the same rows and loss). On a CPU the
numbers are kept, and auto splits the step into micro-batches of at most 2 rows.
"""

from __future__ import annotations

import math
from typing import Any

from expert_cli.config.choices import first
from expert_cli.config.environment import Environment
from expert_cli.config.training_config import TrainingConfig
from expert_cli.errors import UserError

DEFAULT_MAX_SEQ = 2048
DEFAULT_TOKENS_PER_STEP = 32_768  # batch_size auto: rows per optimizer step = this / seq
DEFAULT_CPU_BATCH = 2
DEFAULT_SHARDED_MICRO = 4  # batch_size auto under FSDP/DeepSpeed: rows a micro-step, at most
MAX_TOKENS_PER_MICRO_STEP = 1 << 24  # batch_size x max_seq_length


def batch_plan(
    cfg: TrainingConfig, env: Environment, notes: list[str], sharded: bool = False
) -> dict[str, Any]:
    """Micro-batch, accumulation and rows per optimizer step (see train/batch.py). `sharded`
    (FSDP, DeepSpeed): a numeric batch is kept and auto takes a fixed split, since the probe
    runs the model whole on one GPU before it is sharded, and DeepSpeed takes its sizes from
    the arguments before that."""
    seq = first(cfg.max_seq_length, DEFAULT_MAX_SEQ)
    auto = cfg.batch_size == "auto" or (cfg.batch_size is None and env.has_gpu)
    if not auto:
        batch = cfg.batch_size if isinstance(cfg.batch_size, int) else DEFAULT_CPU_BATCH
        accumulation = first(cfg.gradient_accumulation_steps, 1)
        if batch * seq > MAX_TOKENS_PER_MICRO_STEP:
            raise UserError(
                f"training.config.batch_size: {batch} rows of max_seq_length {seq} are "
                f"{batch * seq:,} tokens per micro-step, more than any GPU holds "
                f"(at most {MAX_TOKENS_PER_MICRO_STEP:,}); lower batch_size or set it to auto"
            )
        if cfg.tokens_per_step:
            notes.append(
                "tokens_per_step: not applicable; batch_size x "
                "gradient_accumulation_steps set the step"
            )
        # the step is batch x accumulation rows; on a GPU the rows a micro-step takes at once
        # are probed from its memory (the same rows per step, the same data in each step)
        probe = env.has_gpu and accumulation > 1 and cfg.micro_batch != "fixed" and not sharded
        if probe:
            notes.append(
                f"batch_size: {batch} x gradient_accumulation_steps {accumulation} = "
                f"{batch * accumulation} rows per optimizer step; the rows each micro-step "
                "takes are probed from the GPU's memory at start (micro_batch fixed keeps "
                f"{batch} x {accumulation})"
            )
        if cfg.micro_batch == "auto" and not probe:
            notes.append(
                "micro_batch: auto applies to a batch_size with gradient_accumulation_steps "
                "above 1, on one GPU or under DDP; kept as given here"
            )
        return dict(
            batch_size=batch,
            gradient_accumulation_steps=accumulation,
            batch_auto=probe,
            rows_per_step=batch * accumulation,
            micro_batch="auto" if probe else "fixed",
        )
    rows = max(1, first(cfg.tokens_per_step, DEFAULT_TOKENS_PER_STEP) // seq)
    if cfg.micro_batch:
        how = "probes the micro-batch" if env.has_gpu and not sharded else "takes a fixed split"
        notes.append(f"micro_batch: not applicable; batch_size auto {how}")
    if cfg.gradient_accumulation_steps:
        notes.append(
            "gradient_accumulation_steps: follows from batch_size auto "
            f"({rows} rows per optimizer step)"
        )
    if not env.has_gpu or sharded:
        # no probe: on a CPU, and under FSDP or DeepSpeed (the probe would run the model whole
        # on one GPU before it is sharded; DeepSpeed reads its sizes before that)
        most = DEFAULT_CPU_BATCH if not env.has_gpu else DEFAULT_SHARDED_MICRO
        micro = max(d for d in range(1, min(rows, most) + 1) if rows % d == 0)
        where = "on a CPU" if not env.has_gpu else "under FSDP or DeepSpeed (no memory probe)"
        notes.append(
            f"batch_size: auto {where}: {micro} rows x {rows // micro} accumulation"
            + ("; give batch_size to choose" if env.has_gpu else "")
        )
        return dict(
            batch_size=micro,
            gradient_accumulation_steps=rows // micro,
            batch_auto=False,
            rows_per_step=rows,
            micro_batch="fixed",
        )
    return dict(
        batch_size=rows,
        gradient_accumulation_steps=1,
        batch_auto=True,
        rows_per_step=rows,
        micro_batch="auto",
    )


def optimizer_steps(rows: int, batch: int, accumulation: int, epochs: float, world: int = 1) -> int:
    """Optimizer steps `epochs` of `rows` packed rows take at `batch` rows a micro-step and
    `accumulation` micro-steps a step, on `world` devices (as the Trainer counts them)."""
    batches = math.ceil(rows / (batch * world))
    return math.ceil(max(1, math.ceil(batches / accumulation)) * epochs)


def steps_before_training(cfg: TrainingConfig, rows: int, on_cpu: dict[str, Any]) -> str:
    """The optimizer steps a run of `rows` packed rows takes on one device, said before it
    starts (pretokenize): the rows a step on a GPU (batch_size auto unless given) and, where
    they differ, on a CPU (`on_cpu`: batch_plan's for one)."""
    if cfg.max_steps:
        return f"max_steps {cfg.max_steps:,}"
    epochs = first(cfg.epochs, cfg.num_epochs, 1)
    seq = first(cfg.max_seq_length, DEFAULT_MAX_SEQ)
    if cfg.batch_size is None or cfg.batch_size == "auto":
        gpu = (max(1, first(cfg.tokens_per_step, DEFAULT_TOKENS_PER_STEP) // seq), 1)
    else:
        gpu = (cfg.batch_size, first(cfg.gradient_accumulation_steps, 1))
    cpu = (on_cpu["batch_size"], on_cpu["gradient_accumulation_steps"])
    span = f"for {epochs:g} epoch{'' if epochs == 1 else 's'} on one device"
    gpu_said = f"{_steps(optimizer_steps(rows, *gpu, epochs))}"
    if gpu[0] * gpu[1] == cpu[0] * cpu[1]:
        return f"{gpu_said} ({gpu[0] * gpu[1]} rows a step) {span}"
    cpu_said = _steps(optimizer_steps(rows, *cpu, epochs))
    return (
        f"{gpu_said} on a GPU ({gpu[0] * gpu[1]} rows a step), {cpu_said} on a CPU "
        f"({cpu[0] * cpu[1]} rows a step) {span}"
    )


def _steps(n: int) -> str:
    return f"{n:,} optimizer step{'' if n == 1 else 's'}"
