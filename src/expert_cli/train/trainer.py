"""The Hugging Face Trainer as expert-cli runs it: packed batches that count their real
tokens, batch-fetch timing for the throughput meter, and `build_trainer`, the one place that
wires them together (the train command and the benchmark scripts both use it)."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from accelerate.utils import DistributedType
from torch.utils.data import SequentialSampler
from transformers import PreTrainedTokenizerBase, Trainer, TrainingArguments, get_scheduler
from transformers.trainer_pt_utils import LengthGroupedSampler

from expert_cli.atomic import usual_mode
from expert_cli.config.kernels import BOUNDARY_KERNELS
from expert_cli.data import PreparedData, collate
from expert_cli.errors import UserError
from expert_cli.telemetry.throughput import ThroughputMeter
from expert_cli.train.adalora import LanguageLoss, regularised
from expert_cli.train.args import schedule_at_loaded_step, warmup_count
from expert_cli.train.attention import mask_free_mapping, skip_mask_building
from expert_cli.train.callbacks import ThroughputCallback
from expert_cli.train.checkpoints import COMPLETE, CheckpointMarker
from expert_cli.train.folder_guard import FolderGuard
from expert_cli.train.fsdp_save import save_fsdp_adapter
from expert_cli.train.loraplus import split_b_groups
from expert_cli.train.loss import takes_loss_positions
from expert_cli.train.model_flops import flops_model
from expert_cli.train.step_walks import StepWalks
from expert_cli.train.task_evals import TaskTally, by_task, eval_task_names, split_loss
from expert_cli.train.token_accuracy import UNCOUNTED, AccuracyTally, batch_hits

# DoRA's per-row magnitudes start at the frozen weight's norms: decay would shrink the base
# layer's output, not pull the adapter toward it (as it does LoRA's A and B)
NO_DECAY = "lora_magnitude_vector"


class ExpertTrainer(Trainer):
    """The Trainer with throughput telemetry around the batch fetch, and (for the boundary
    kernels) the attention masks given as "none" so transformers does not look for them."""

    meter: ThroughputMeter | None = None
    mask_mapping: dict[str, None] | None = None
    walks: StepWalks | None = None  # the loop's model's modules, listed at its first step
    loraplus_ratio: float | None = None  # LoRA+: B's learning rate over A's
    task_names: list[str] | None = None  # a multi_task expert's evaluation tasks, in order

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.regulariser_weights: dict[str, float] = {}  # AdaLoRA's, as configured
        self.language_loss: LanguageLoss | None = None  # AdaLoRA's loss without it, logged
        # (loss, trained tokens) of each evaluation batch while an evaluation runs
        self._eval_tally: list[tuple[torch.Tensor, torch.Tensor]] | None = None
        self._eval_hits: AccuracyTally | None = None  # and its tokens predicted
        self._tasks: TaskTally | None = None  # and each task's (train/task_evals.py)
        self._batch_task: int | None = None

    def get_batch_samples(
        self, epoch_iterator: Any, num_batches: int, device: Any
    ) -> tuple[list, Any]:
        """The Trainer's: a step's batches and their trained tokens over every process; the
        fetch alone is data wait (the count's gather across processes blocked on gloo)."""
        if self.meter is not None:
            self.meter.fetch_started()
        batches = []
        for _ in range(num_batches):
            try:
                batches.append(next(epoch_iterator))
            except StopIteration:
                break
        counts = [b.pop(collate.COUNTS_KEY, (0, 0, 0, 0)) for b in batches]
        if self.meter is not None:
            self.meter.fetch_ended(*(sum(c[i] for c in counts) for i in range(4)))
        if self.regulariser_weights and batches:
            self._share_regulariser(len(batches))
        return batches, self._get_num_items_in_batch(batches, device)

    def _get_train_sampler(self, train_dataset: Any = None) -> Any:
        """group_by_length's megabatches of the global batch: of each process's, 2 processes x
        2 rows grouped other rows together than 1 x 4 (the loss curve differed from step 1)."""
        sampler = super()._get_train_sampler(train_dataset)
        if isinstance(sampler, LengthGroupedSampler):
            sampler.batch_size *= self.args.world_size
        return sampler

    def _get_eval_sampler(self, eval_dataset: Any) -> Any:
        """Each task's rows in their order (train/task_evals.py): group_by_length's evaluation
        sampler mixed the tasks' rows in batches, and their figures went unsaid."""
        if not self.task_names:
            return super()._get_eval_sampler(eval_dataset)
        return SequentialSampler(eval_dataset) if self.args.world_size <= 1 else None

    def get_decay_parameter_names(self, model: Any) -> list[str]:
        return [n for n in super().get_decay_parameter_names(model) if NO_DECAY not in n]

    def _load_optimizer_and_scheduler(self, checkpoint: str | None) -> None:
        try:
            super()._load_optimizer_and_scheduler(checkpoint)
        except ValueError as exc:  # torch: "... parameter group that doesn't match the size"
            if "parameter group" not in str(exc):
                raise
            raise UserError(
                f"--resume: {Path(str(checkpoint)).name} holds an optimizer whose parameter "
                "groups are not this run's (an earlier expert-cli decayed DoRA's magnitude "
                "vectors); train again, or resume with the version that wrote it"
            ) from None
        if checkpoint is not None:
            schedule_at_loaded_step(self.lr_scheduler)

    def _load_scaler(self, checkpoint: str | None) -> None:
        """The checkpoint's fp16 loss scale where this run is fp16 too; a run of another
        precision (an fp16 run on a T4 resumed on an A100, which takes bf16) has no scaler,
        and the Trainer's own load was an AttributeError there."""
        if self.accelerator.scaler is not None:
            super()._load_scaler(checkpoint)

    def create_scheduler(self, num_training_steps: int, optimizer: Any = None) -> Any:
        """The Trainer's schedule, with a warmup ratio's steps counted exactly (it rounds
        0.07 x 100 = 7.000000000000001 up to 8)."""
        ratio = self.args.warmup_steps
        if self.lr_scheduler is None and 0 < ratio < 1:
            self.lr_scheduler = get_scheduler(
                self.args.lr_scheduler_type,
                optimizer=optimizer if optimizer is not None else self.optimizer,
                num_warmup_steps=warmup_count(ratio, num_training_steps),
                num_training_steps=num_training_steps,
                scheduler_specific_kwargs=self.args.lr_scheduler_kwargs,
            )
            self._created_lr_scheduler = True
        return super().create_scheduler(num_training_steps, optimizer)

    def _prepare_inputs(self, inputs: dict[str, Any]) -> dict[str, Any]:
        inputs.pop(collate.COUNTS_KEY, None)
        self._batch_task = inputs.pop(collate.TASK_KEY, None)
        return super()._prepare_inputs(skip_mask_building(inputs, self.mask_mapping))

    def evaluation_loop(
        self,
        dataloader: Any,
        description: str,
        prediction_loss_only: bool | None = None,
        ignore_keys: list[str] | None = None,
        metric_key_prefix: str = "eval",
    ) -> Any:
        """The eval loss is the language-model loss alone, per trained token.

        peft adds AdaLoRA's orthogonal regulariser to every loss given labels, eval's too,
        which made eval losses read ~20% higher than another adapter type's on the same data;
        it is off here. The Trainer averages each batch's loss with every batch weighted the
        same, so a batch of short answers counted as much as one of long ones; the loss here
        is summed over the split's trained tokens and divided by their number. Its token
        accuracy is the share of them the model's argmax predicts."""
        off = dict.fromkeys(regularised(self.model, self.accelerator), 0.0)
        self._eval_tally, self._eval_hits = [], AccuracyTally()
        spread = self.args.world_size > 1  # each task's counts as the split's (split_loss)
        counted = not spread or self.args.average_tokens_across_devices
        self._tasks = TaskTally(self.task_names) if self.task_names and counted else None
        try:
            with self._regulariser_weights(off):
                output = super().evaluation_loop(
                    dataloader, description, prediction_loss_only, ignore_keys, metric_key_prefix
                )
            per_token = split_loss(self._eval_tally, self.accelerator, self.args)
            accuracy = self._eval_hits.accuracy(self.accelerator, spread)
            if self._tasks is not None:
                output.metrics.update(
                    self._tasks.metrics(self.accelerator, spread, metric_key_prefix)
                )
        finally:
            self._eval_tally = self._eval_hits = self._tasks = None
        if per_token is not None and f"{metric_key_prefix}_loss" in output.metrics:
            output.metrics[f"{metric_key_prefix}_loss"] = per_token
        loss = output.metrics.get(f"{metric_key_prefix}_loss")
        if accuracy is not None and not (isinstance(loss, float) and math.isnan(loss)):
            output.metrics[f"{metric_key_prefix}_token_accuracy"] = accuracy  # not NaN's argmax
        return output

    def compute_loss(
        self,
        model: Any,
        inputs: dict[str, Any],
        return_outputs: bool = False,
        num_items_in_batch: Any = None,
    ) -> Any:
        result = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        if self._eval_tally is not None and torch.is_tensor(num_items_in_batch):
            loss = result[0] if return_outputs else result
            self._eval_tally.append((loss.detach().float(), num_items_in_batch.float()))
        found: Any = UNCOUNTED  # counted once, for the split and for its task
        if self._eval_hits is not None and return_outputs:
            found = batch_hits(result[1], inputs.get("labels"))
            self._eval_hits.add(found)
        if self._tasks is not None:
            counted = self._eval_tally[-1] if torch.is_tensor(num_items_in_batch) else None
            self._tasks.add(self._batch_task, counted, found)
        return result

    def train(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().train(*args, **kwargs)
        finally:
            self._release_walks()

    def _release_walks(self) -> None:
        if self.walks is not None:
            self.walks.release()
            self.walks = None

    def training_step(
        self, model: Any, inputs: dict[str, Any], num_items_in_batch: Any = None
    ) -> Any:
        """The step as the Trainer takes it; the loss it returns for logging is AdaLoRA's
        language-model loss alone (the gradients keep the regulariser). The loop's walks over
        every module are answered from lists made at the first step (train/step_walks.py)."""
        if self.walks is None or self.walks.model is not model:
            self._release_walks()
            self.walks = StepWalks(model)
        loss = super().training_step(model, inputs, num_items_in_batch)
        return self.language_loss.logged(loss) if self.language_loss is not None else loss

    def floating_point_ops(self, inputs: dict[str, Any]) -> int:
        """The Trainer's estimate (6 x tokens x parameters but the embeddings), with the
        parameters counted once, not at every micro-batch."""
        main = getattr(self.model, "main_input_name", "input_ids")
        if self.walks is None or main not in inputs or not hasattr(self.model, "num_parameters"):
            return super().floating_point_ops(inputs)
        return 6 * inputs[main].numel() * self.walks.flop_parameters(self.model)

    def _clip_grad_norm(self, model: Any) -> Any:
        """The Trainer's clipping, given the listed parameters where accelerate clips what it
        is given (not under FSDP, DeepSpeed or XLA, which find the model's own)."""
        walks = self.walks
        mixed = getattr(self, "_has_mixed_mesh_grads", lambda _: True)
        if (
            walks is None
            or walks.model is not model
            or self.accelerator.distributed_type
            in (DistributedType.FSDP, DistributedType.DEEPSPEED, DistributedType.XLA)
            or mixed(model)
        ):
            return super()._clip_grad_norm(model)
        return self.accelerator.clip_grad_norm_(walks.parameters, self.args.max_grad_norm)

    def share_regulariser(self) -> None:
        """AdaLoRA's regulariser once per optimizer step, as its weight says: with the loss
        normalised by the step's token count, the Trainer neither divides a micro-batch's
        loss by the accumulation steps nor keeps it per process (it multiplies it by the
        process count), so the term peft adds to each micro-batch counted accumulation steps
        x processes times (3x its weight at 4 micro-batches, gradients 3x off). Each window
        shares it by the micro-batches it holds (`get_batch_samples`): an epoch's last window
        may hold fewer. The loss logged is the language-model loss alone (`LanguageLoss`)."""
        configs = regularised(self.model, self.accelerator)
        if configs and self.args.n_gpu <= 1:  # one model per process (not DataParallel)
            self.language_loss = LanguageLoss(self.accelerator.unwrap_model(self.model).base_model)
        if not self.model_accepts_loss_kwargs:
            return  # each micro-batch's loss is divided by the accumulation steps already
        for name, config in configs.items():
            self.regulariser_weights[name] = config.orth_reg_weight
        self._share_regulariser(self.args.gradient_accumulation_steps)

    def _share_regulariser(self, micro_batches: int) -> None:
        share = max(1, micro_batches)
        if self.args.average_tokens_across_devices:
            share *= self.accelerator.num_processes
        configs = regularised(self.model, self.accelerator)
        for name, weight in self.regulariser_weights.items():
            configs[name].orth_reg_weight = weight / share

    @contextlib.contextmanager
    def _regulariser_weights(self, weights: dict[str, float]) -> Iterator[None]:
        """AdaLoRA's regulariser at `weights` (by adapter name) for the block, then as it was."""
        configs = regularised(self.model, self.accelerator)
        before = {name: configs[name].orth_reg_weight for name in weights}
        for name, weight in weights.items():
            configs[name].orth_reg_weight = weight
        try:
            yield
        finally:
            for name, weight in before.items():
                configs[name].orth_reg_weight = weight

    def evaluate(self, *args: Any, **kwargs: Any) -> dict[str, float]:
        with self._left_out("eval"):
            return super().evaluate(*args, **kwargs)

    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        """The Trainer's, the older checkpoints left for CheckpointMarker to remove once this
        one is marked whole (the Trainer removed them before: a kill in between left none)."""
        for guard in (c for c in self.callback_handler.callbacks if isinstance(c, FolderGuard)):
            guard.check()  # the folder still this run's: nothing written into another's
        marked = any(isinstance(c, CheckpointMarker) for c in self.callback_handler.callbacks)
        folder = Path(self.args.output_dir) / f"checkpoint-{self.state.global_step}"
        if self.args.should_save:  # one passed over by a resume, saved again: whole only anew
            (folder / COMPLETE).unlink(missing_ok=True)
        limit = self.args.save_total_limit
        self.args.save_total_limit = None if marked else limit
        try:
            with self._left_out("save"):
                super()._save_checkpoint(model, trial)
        finally:
            self.args.save_total_limit = limit

    def _left_out(self, kind: str) -> Any:
        """Evaluations and checkpoint saves, timed apart from the throughput windows."""
        return self.meter.leaving_out(kind) if self.meter is not None else contextlib.nullcontext()

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        # the weight as the manifest set it: peft writes the live configuration to the file
        with self._regulariser_weights(self.regulariser_weights):
            self._save_adapter(output_dir, _internal_call)
        usual_mode(Path(output_dir or self.args.output_dir))  # safetensors writes 0600

    def _save_adapter(self, output_dir: str | None, _internal_call: bool) -> None:
        """Under FSDP every rank gathers the adapter (train/fsdp_save.py); otherwise the
        Trainer's save."""
        if self.is_fsdp_enabled:
            save_fsdp_adapter(self, output_dir or self.args.output_dir)
        else:
            super().save_model(output_dir, _internal_call)

    def create_optimizer(self, model: Any = None) -> Any:
        """The Trainer's optimizer; under LoRA+ each B in a group of its own at the ratio's
        learning rate (train/loraplus.py), split once, as the optimizer is made."""
        made = self.optimizer is None
        optimizer = super().create_optimizer(model)
        if made and self.loraplus_ratio:
            split_b_groups(
                optimizer, model if model is not None else self.model, self.loraplus_ratio
            )
        return optimizer


@dataclass
class Telemetry:
    """Where a run's throughput goes: metrics.json (main process only), a per-window hook,
    the windows and evaluations of the run it resumes, and how many processes to sum over."""

    metrics_path: Path | None = None
    on_window: Callable[[dict[str, Any]], None] | None = None
    earlier: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    world_size: int = 1
    gather: Callable[[list[float]], list[list[float]]] | None = None


def build_trainer(
    model: Any,
    args: TrainingArguments,
    data: PreparedData,
    tokenizer: PreTrainedTokenizerBase,
    kernel: str,
    telemetry: Telemetry | None = None,
) -> tuple[ExpertTrainer, ThroughputCallback]:
    """The Trainer on the cache's packed rows (with the sequence boundaries `kernel` reads),
    its throughput meter and the callback that closes windows; evaluation when `args` asks."""
    telemetry = telemetry or Telemetry()
    collator = collate.CountingCollator(
        collate.PackedCollator(
            tokenizer.pad_token_id,
            boundaries=kernel in BOUNDARY_KERNELS,
            loss_positions=takes_loss_positions(model),  # the LM head on trained tokens alone
        )
    )
    mixed = bool(args.bf16 or args.fp16)
    meter = ThroughputMeter(
        flops_model(model, mixed), telemetry.world_size, gather=telemetry.gather
    )
    # no process's last evaluation batch filled with rows counted twice; a task's rows, whole
    # batches on every process (train/task_evals.py)
    fill = args.world_size * args.eval_batch_size if args.world_size > 1 else 1
    evaluated = names = None
    if args.eval_strategy != "no" and data.eval is not None:
        names = eval_task_names(data.stats, len(data.eval))
        whole = args.world_size * args.eval_batch_size
        evaluated = (
            by_task(data.eval, data.stats, whole) if names else collate.filled_to(data.eval, fill)
        )
    throughput = ThroughputCallback(
        meter, telemetry.metrics_path, telemetry.on_window, telemetry.earlier
    )
    trainer = ExpertTrainer(
        model=model,
        args=args,
        train_dataset=data.train,
        eval_dataset=evaluated,
        data_collator=collator,
        processing_class=tokenizer,
    )
    trainer.meter = meter
    trainer.task_names = names or None
    trainer.mask_mapping = mask_free_mapping(model, kernel)
    trainer.share_regulariser()
    trainer.callback_handler.callbacks.insert(0, throughput)  # first: its logs reach TB
    return trainer, throughput
