"""The Hugging Face Trainer as expert-cli runs it: arguments from the resolved config, a
collator that counts real tokens, batch-fetch timing, Ctrl-C handling, AdaLoRA's schedule.

transformers and torch are imported inside the functions.
"""

from __future__ import annotations

import math
import signal
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from expert_cli.data.formatting import IGNORE
from expert_cli.data.packing import LENGTH_COLUMN
from expert_cli.errors import UserError

if TYPE_CHECKING:
    from expert_cli.resolve import ResolvedConfig
    from expert_cli.telemetry.throughput import ThroughputMeter

# Key the counting collator adds to each batch; removed before the model sees the batch.
COUNTS_KEY = "expert_cli_counts"


def training_args_kwargs(
    resolved: ResolvedConfig,
    checkpoints_dir: Path,
    *,
    max_steps: int | None = None,
    on_gpu: bool = False,
    has_eval: bool = True,
) -> dict[str, Any]:
    """Every resolved training field as a `TrainingArguments` keyword (pure; unit-tested)."""
    if resolved.warmup_ratio >= 1:
        raise UserError(
            f"warmup_ratio: {resolved.warmup_ratio} would warm up for the whole run; "
            "use a fraction below 1"
        )
    if resolved.evaluation_strategy != "no" and not has_eval:
        raise UserError(
            "training.config.evaluation_strategy: evaluation is on but the data "
            "has no validation rows (set validation_path or eval_fraction)"
        )
    dist = resolved.distributed or {}
    strategy = dist.get("strategy", "ddp")
    kwargs: dict[str, Any] = dict(
        output_dir=str(checkpoints_dir),
        num_train_epochs=resolved.epochs,
        max_steps=max_steps if max_steps is not None else resolved.max_steps,
        learning_rate=resolved.learning_rate,
        lr_scheduler_type=resolved.lr_scheduler,
        # transformers 5: a float below 1 is a ratio of all steps
        warmup_steps=resolved.warmup_ratio if resolved.warmup_ratio else resolved.warmup_steps,
        per_device_train_batch_size=resolved.batch_size,
        per_device_eval_batch_size=resolved.batch_size,
        gradient_accumulation_steps=resolved.gradient_accumulation_steps,
        optim=resolved.optim,
        weight_decay=resolved.weight_decay,
        max_grad_norm=resolved.max_grad_norm,
        seed=resolved.seed,
        data_seed=resolved.seed,
        bf16=resolved.bf16,
        fp16=resolved.fp16,
        tf32=resolved.use_tf32 if on_gpu else None,
        **_checkpointing(resolved.gradient_checkpointing),
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
        metric_for_best_model=resolved.metric_for_best_model,
        greater_is_better=resolved.greater_is_better,
        torch_empty_cache_steps=resolved.memory_clear_every or None,
        use_cache=False,
        prediction_loss_only=True,  # evaluation needs the loss, never all logits kept
        remove_unused_columns=False,  # the collator builds exactly the model's inputs
        label_names=["labels"],
        report_to="none",  # TensorBoard is attached by expert-cli, into OUTPUT/runs
        disable_tqdm=True,  # the console shows a rich progress bar instead
        run_name=resolved.expert,
        ddp_find_unused_parameters=dist.get("ddp_find_unused_parameters", False),
        use_cpu=not on_gpu,  # also what makes torchrun on CPU run DDP over gloo
    )
    if strategy == "fsdp":
        kwargs.update(
            fsdp=dist.get("fsdp") or "full_shard auto_wrap", fsdp_config=dist.get("fsdp_config")
        )
    elif strategy == "deepspeed":
        if not dist.get("deepspeed"):
            raise UserError(
                "training.distributed.deepspeed: strategy deepspeed needs a config "
                "(file path or object)"
            )
        kwargs["deepspeed"] = dist["deepspeed"]
    return kwargs


def _checkpointing(enabled: bool) -> dict[str, Any]:
    """Gradient checkpointing under the installed transformers' name (renamed in 5.2x)."""
    import dataclasses

    from transformers import TrainingArguments

    names = {f.name for f in dataclasses.fields(TrainingArguments)}
    key = (
        "activation_checkpointing"
        if "activation_checkpointing" in names
        else "gradient_checkpointing"
    )
    return {key: enabled, f"{key}_kwargs": {"use_reentrant": False}}


def planned_steps(
    resolved: ResolvedConfig, n_rows: int, world_size: int, max_steps: int | None = None
) -> int:
    """Optimizer steps the run will take (as the Trainer computes it)."""
    steps = max_steps if max_steps is not None else resolved.max_steps
    if steps and steps > 0:
        return steps
    batches = math.ceil(n_rows / (resolved.batch_size * world_size))
    per_epoch = max(1, math.ceil(batches / resolved.gradient_accumulation_steps))
    return math.ceil(per_epoch * resolved.epochs)


def _count(values: Any, value: int) -> int:
    if isinstance(values, list):
        return values.count(value)
    import numpy as np

    return int((np.asarray(values) == value).sum())


def _example_lengths(row: dict[str, Any]) -> Any:
    """Lengths of the examples packed in a row (position_ids restart at 0 at each one)."""
    import numpy as np

    if "position_ids" not in row:
        return np.array([len(row["input_ids"])], dtype=np.int64)
    starts = np.flatnonzero(np.asarray(row["position_ids"]) == 0)
    return np.diff(starts, append=len(row["input_ids"])).astype(np.int64)


class CountingCollator:
    """Wraps the packed collator; adds (real tokens, examples, trained tokens, attended) to
    the batch.

    Counted on the unpadded rows: tokens = row lengths, examples = position_ids restarts,
    trained tokens = labels that are not -100, attended = the sum over examples of length**2
    (each token attends within its own example; the FLOPs count needs it).
    """

    def __init__(self, inner: Callable[[list[dict[str, Any]]], dict[str, Any]]) -> None:
        self.inner = inner

    def __call__(self, rows: list[dict[str, Any]]) -> dict[str, Any]:
        tokens = samples = trained = attended = 0
        for r in rows:
            lengths = _example_lengths(r)
            tokens += len(r["input_ids"])
            samples += len(lengths)
            attended += int((lengths * lengths).sum())
            trained += len(r["labels"]) - _count(r["labels"], IGNORE)
        batch = dict(self.inner(rows))
        batch[COUNTS_KEY] = (tokens, samples, trained, attended)
        return batch


def expert_trainer_class() -> type:
    """The Trainer subclass that times batch fetches and strips the counts."""
    from transformers import Trainer

    class ExpertTrainer(Trainer):
        """Trainer with throughput telemetry around the batch fetch."""

        meter: ThroughputMeter | None = None

        def get_batch_samples(
            self, epoch_iterator: Any, num_batches: int, device: Any
        ) -> tuple[list, Any]:
            if self.meter is not None:
                self.meter.fetch_started()
            batches, n_items = super().get_batch_samples(epoch_iterator, num_batches, device)
            counts = [b.pop(COUNTS_KEY, (0, 0, 0, 0)) for b in batches]
            if self.meter is not None:
                self.meter.fetch_ended(*(sum(c[i] for c in counts) for i in range(4)))
            return batches, n_items

        def _prepare_inputs(self, inputs: dict[str, Any]) -> dict[str, Any]:
            inputs.pop(COUNTS_KEY, None)
            return super()._prepare_inputs(inputs)

    return ExpertTrainer


class Interrupt:
    """SIGINT/SIGTERM set a flag; training stops with a checkpoint at the next step end.

    A second signal restores the default behaviour (so a second Ctrl-C aborts at once).
    """

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self) -> None:
        self.signum: int | None = None
        self._previous: dict[int, Any] = {}

    def _handle(self, signum: int, frame: Any) -> None:
        self.signum = signum
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def __enter__(self) -> Interrupt:
        for sig in self.SIGNALS:
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    @property
    def exit_code(self) -> int:
        """130 for SIGINT, 143 for SIGTERM (128 + signal number)."""
        return 128 + (self.signum or signal.SIGINT)


def make_interrupt_callback(interrupt: Interrupt, any_rank: Callable[[bool], bool]) -> Any:
    """A callback that saves and stops on the step after a signal (on every rank at once:
    `any_rank` ORs the flag over processes)."""
    from transformers import TrainerCallback

    class InterruptCallback(TrainerCallback):
        """Turns a signal into save + stop at the next optimizer step's end."""

        stopped = False

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
            if any_rank(interrupt.signum is not None):
                self.stopped = True
                control.should_save = True
                control.should_training_stop = True
            return control

    return InterruptCallback()


def make_adalora_callback(peft_model: Any) -> Any:
    """AdaLoRA reallocates ranks after each optimizer step, while gradients still exist."""
    from transformers import TrainerCallback

    class AdaLoraCallback(TrainerCallback):
        """Calls `update_and_allocate` after every optimizer step."""

        def on_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            peft_model.base_model.update_and_allocate(state.global_step)

    return AdaLoraCallback()


def latest_checkpoint(checkpoints_dir: Path) -> Path | None:
    """The `checkpoint-N` folder with the largest N, or None."""
    if not checkpoints_dir.is_dir():
        return None
    found = [
        (int(p.name.split("-")[-1]), p)
        for p in checkpoints_dir.glob("checkpoint-*")
        if p.is_dir() and p.name.split("-")[-1].isdigit()
    ]
    return max(found)[1] if found else None
