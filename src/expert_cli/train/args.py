"""The resolved configuration as Hugging Face `TrainingArguments`, and the steps a run takes."""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import os
import signal
import threading
from pathlib import Path
from typing import Any

import torch
from transformers import TrainingArguments

from expert_cli.atomic import HANGUP, heard
from expert_cli.config.batching import optimizer_steps
from expert_cli.config.choices import EPOCHS_UNAPPLIED
from expert_cli.config.resolve import ResolvedConfig
from expert_cli.data.packing import LENGTH_COLUMN
from expert_cli.errors import UserError


def training_args_kwargs(
    resolved: ResolvedConfig,
    checkpoints_dir: Path,
    *,
    max_steps: int | None = None,
    on_gpu: bool = False,
) -> dict[str, Any]:
    """Every resolved training field as a `TrainingArguments` keyword (pure; unit-tested)."""
    dist = resolved.distributed or {}
    strategy = dist.get("strategy", "ddp")
    kwargs: dict[str, Any] = dict(
        output_dir=str(checkpoints_dir),
        num_train_epochs=resolved.epochs,
        max_steps=max_steps if max_steps is not None else resolved.max_steps,
        learning_rate=resolved.learning_rate,
        lr_scheduler_type=resolved.lr_scheduler,
        lr_scheduler_kwargs=dict(resolved.lr_scheduler_kwargs),
        # transformers 5: a float below 1 is a ratio of all steps
        warmup_steps=resolved.warmup_ratio if resolved.warmup_ratio else resolved.warmup_steps,
        per_device_train_batch_size=resolved.batch_size,
        per_device_eval_batch_size=resolved.batch_size,
        gradient_accumulation_steps=resolved.gradient_accumulation_steps,
        optim=resolved.optim,
        weight_decay=resolved.weight_decay,
        max_grad_norm=resolved.max_grad_norm,
        adam_beta1=resolved.adam_beta1,
        adam_beta2=resolved.adam_beta2,
        adam_epsilon=resolved.adam_epsilon,
        seed=resolved.seed,
        data_seed=resolved.seed,
        bf16=resolved.bf16,
        fp16=resolved.fp16,
        tf32=resolved.use_tf32 if on_gpu else None,
        **_checkpointing(resolved.gradient_checkpointing, resolved.gradient_checkpointing_kwargs),
        torch_compile=False,  # expert-cli compiles each decoder layer itself (train/speed.py)
        dataloader_num_workers=resolved.dataloader_num_workers,
        dataloader_pin_memory=resolved.dataloader_pin_memory,
        dataloader_prefetch_factor=resolved.dataloader_prefetch_factor,
        dataloader_persistent_workers=resolved.dataloader_persistent_workers,
        # pinned batches are copied to the GPU asynchronously; a blocking copy would make the
        # host wait for the previous step at every batch fetch (a sync per step)
        accelerator_config={"non_blocking": bool(resolved.dataloader_pin_memory and on_gpu)},
        train_sampling_strategy="group_by_length" if resolved.group_by_length else "random",
        length_column_name=LENGTH_COLUMN,  # else group_by_length reads every row at start
        logging_strategy="steps",
        # the default checks every step's loss for NaN on the host: a GPU sync per step
        logging_nan_inf_filter=False,
        logging_steps=resolved.logging_steps,
        save_strategy=resolved.save_strategy,
        save_steps=resolved.save_steps,
        save_total_limit=resolved.save_total_limit,
        eval_strategy=resolved.evaluation_strategy,
        eval_steps=resolved.eval_steps,
        load_best_model_at_end=resolved.load_best_model_at_end,
        eval_on_start=resolved.eval_on_start,
        metric_for_best_model=resolved.metric_for_best_model,
        greater_is_better=resolved.greater_is_better,
        torch_empty_cache_steps=resolved.memory_clear_every or None,
        use_cache=False,
        prediction_loss_only=True,  # evaluation needs the loss, never all logits kept
        remove_unused_columns=False,  # the collator builds exactly the model's inputs
        label_names=["labels"],
        # TensorBoard is attached by expert-cli, into OUTPUT/runs; other trackers as asked
        report_to=list(resolved.report_to) or "none",
        disable_tqdm=True,  # the console shows a rich progress bar instead
        run_name=resolved.expert,
        ddp_find_unused_parameters=dist.get("ddp_find_unused_parameters", False),
        use_cpu=not on_gpu,  # also what makes torchrun on CPU run DDP over gloo
    )
    if strategy == "fsdp":
        kwargs.update(fsdp=True, fsdp_config=fsdp_config(dist))
    elif strategy == "deepspeed":
        if problem := deepspeed_problem(resolved):
            raise UserError(problem)
        kwargs["deepspeed"] = dist["deepspeed"]
    return kwargs


def warmup_count(ratio: float, total_steps: int) -> int:
    """Warmup steps of a ratio of the run's optimizer steps: the product rounded up, after
    the float error of the product is rounded away (0.07 x 100 is 7 steps, not 8), and at
    most the steps before the last: a linear warm-up gives its first step a rate of 0, so
    the default 3% of a 1-step run (rounded up to 1) trained nothing at all."""
    return min(math.ceil(round(ratio * total_steps, 9)), max(total_steps - 1, 0))


def schedule_at_loaded_step(scheduler: Any) -> None:
    """Each group's rate from this run's schedule at the step a checkpoint was loaded at. The
    optimizer's saved rate is the one its own schedule set: a resume to a larger --max-steps
    ran its first step at the old schedule's end (lr 0), not at the new schedule's rate."""
    if not isinstance(scheduler, torch.optim.lr_scheduler.LambdaLR):
        return
    step = scheduler.last_epoch
    rates = [
        base * rule(step)
        for base, rule in zip(scheduler.base_lrs, scheduler.lr_lambdas, strict=True)
    ]
    for group, rate in zip(scheduler.optimizer.param_groups, rates, strict=True):
        group["lr"] = rate
    scheduler._last_lr = rates


def deepspeed_problem(resolved: ResolvedConfig) -> str | None:
    """Why strategy deepspeed cannot run (no config, or DeepSpeed not installed), as `check`
    and `train` both say it (check called such a manifest usable)."""
    dist = resolved.distributed or {}
    if dist.get("strategy") != "deepspeed":
        return None
    if not dist.get("deepspeed"):
        return (
            "training.distributed.deepspeed: strategy deepspeed needs a config (file path or "
            "object)"
        )
    if importlib.util.find_spec("deepspeed") is None:
        return (
            "training.distributed.strategy: deepspeed is not installed; install it with "
            "pip install 'expert-cli[deepspeed]', or use strategy ddp or fsdp"
        )
    return None


FSDP_WORDS = {"full_shard", "shard_grad_op", "offload", "auto_wrap"}


def fsdp_config(dist: dict[str, Any]) -> dict[str, Any]:
    """The Trainer's `fsdp_config` for `training.distributed`: FSDP2, one unit per decoder
    layer (the model's `_no_split_modules`), sharded checkpoints (each rank writes its part;
    resume reads them back), the manifest's `fsdp` words ("full_shard", "shard_grad_op",
    "offload", "auto_wrap") translated, and its `fsdp_config` on top."""
    words = (dist.get("fsdp") or "full_shard auto_wrap").split()
    unknown = [w for w in words if w not in FSDP_WORDS]
    if unknown:
        raise UserError(
            f"training.distributed.fsdp: word {words.index(unknown[0]) + 1} is not an FSDP "
            f"option; expected some of {', '.join(sorted(FSDP_WORDS))}"
        )
    config: dict[str, Any] = {
        "version": 2,
        "auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
        "reshard_after_forward": "shard_grad_op" not in words,
        "state_dict_type": "SHARDED_STATE_DICT",
    }
    if "offload" in words:
        config["cpu_offload"] = True
    user = {k.removeprefix("fsdp_"): v for k, v in (dist.get("fsdp_config") or {}).items()}
    if str(user.get("version", 2)).strip() != "2":
        raise UserError(
            "training.distributed.fsdp_config.version: expert-cli runs FSDP2 (version 2); "
            "FSDP1 is deprecated in transformers"
        )
    return {**config, **user, "version": 2}


def _checkpointing(enabled: bool, options: dict[str, Any]) -> dict[str, Any]:
    """Gradient checkpointing under the installed transformers' name (renamed in 5.2x)."""
    names = {f.name for f in dataclasses.fields(TrainingArguments)}
    key = (
        "activation_checkpointing"
        if "activation_checkpointing" in names
        else "gradient_checkpointing"
    )
    return {key: enabled, f"{key}_kwargs": dict(options)}


def planned_steps(
    resolved: ResolvedConfig, n_rows: int, world_size: int, max_steps: int | None = None
) -> int:
    """Optimizer steps the run will take (as the Trainer computes it)."""
    steps = max_steps if max_steps is not None else resolved.max_steps
    if steps and steps > 0:
        return steps
    return optimizer_steps(
        n_rows,
        resolved.batch_size,
        resolved.gradient_accumulation_steps,
        resolved.epochs,
        world_size,
    )


FEW_STEPS = 50  # optimizer steps under which a run is said to learn little


def length_notes(notes: list[str], max_steps: int | None) -> list[str]:
    """The resolution's notes with the run's --max-steps (given, or kept by a resume) named as
    its length where the manifest's max_steps was (it said max_steps 2, and trained 3)."""
    if max_steps is None:
        return notes
    said = f"{EPOCHS_UNAPPLIED}--max-steps {max_steps} sets the run's length"
    own = f"{EPOCHS_UNAPPLIED}max_steps {max_steps} sets the run's length"  # the manifest's
    return [said if n.startswith(EPOCHS_UNAPPLIED) and n != own else n for n in notes]


def few_steps_note(
    resolved: ResolvedConfig, steps: int, n_rows: int, world_size: int
) -> str | None:
    """A note where the run takes few optimizer steps, its steps not asked for (`max_steps`):
    an adapter learns little from a handful of updates, and nothing said so (300
    conversations, packed into 10 rows, trained one step at `batch_size: auto` and said
    `completed`)."""
    if steps >= FEW_STEPS or (resolved.max_steps or 0) > 0:
        return None
    rows = resolved.batch_size * resolved.gradient_accumulation_steps * world_size
    how = "packed rows" if resolved.packing else "examples"
    smaller = (  # under auto the rows a step come from the tokens a step
        "lower `tokens_per_step` (or give `batch_size`)"
        if resolved.batch_auto
        else "lower `batch_size` or `gradient_accumulation_steps`"
    )
    return (
        f"only {steps} optimizer step{'' if steps == 1 else 's'} ({n_rows:,} {how} at {rows} "
        f"a step, {resolved.epochs:g} epoch{'' if resolved.epochs == 1 else 's'}): an adapter "
        f"learns little from so few updates; raise `epochs`, or {smaller} (or set `max_steps` "
        "to say how many)"
    )


def joined(kwargs: dict[str, Any]) -> TrainingArguments:
    """`TrainingArguments(**kwargs)`, which, for several processes, waits there for all of
    them to join (the rendezvous). While it waits, Ctrl-C, SIGTERM and SIGHUP end the
    process at once (a Python handler runs only when the wait is over: the process was deaf
    to them, for ever where the others were never started); a launch without MASTER_ADDR is
    named, where accelerate's ValueError was a traceback."""
    world = os.environ.get("WORLD_SIZE", "")
    several = world.isdigit() and int(world) > 1
    held: dict[int, Any] = {}
    if several and threading.current_thread() is threading.main_thread():
        for sig in heard((signal.SIGINT, signal.SIGTERM, *HANGUP)):
            held[sig] = signal.signal(sig, signal.SIG_DFL)
    try:
        return TrainingArguments(**kwargs)
    except ValueError as exc:
        if not several or "MASTER_ADDR" not in str(exc):
            raise
        raise UserError(
            f"WORLD_SIZE is {world} in the environment, but MASTER_ADDR is not: start the run "
            "with torchrun (or accelerate launch), or, to train in one process, unset "
            "WORLD_SIZE RANK LOCAL_RANK"
        ) from None
    finally:
        for sig, handler in held.items():
            signal.signal(sig, handler)


def one_gpu(args: TrainingArguments) -> str | None:
    """Keep a one-process run on one GPU, and say so, where several are visible: transformers
    would wrap the model in nn.DataParallel, splitting each batch over them (the packed rows'
    boundaries and the fused paths are one process's, and MFU would be one GPU's); None when
    one is visible, or the run is distributed (n_gpu is then 1)."""
    visible = args.n_gpu
    if visible <= 1:
        return None
    args._n_gpu = 1  # as the Trainer itself does for a model spread over GPUs
    return (
        f"{visible} GPUs are visible and the run is one process: it trains on cuda:0. To train "
        f"on all of them: torchrun --nproc_per_node {visible} -m expert_cli.cli train ... "
        "(docs/distributed.md)"
    )
