"""A run whose loss stops being a number: stopped at the window that shows it, no adapter
written, and one message saying what to change.

A learning rate too high for the model, no gradient clipping, fp16's narrow range or a
non-finite value in the data turn the loss into NaN or infinity, and from the next optimizer
step the adapter's weights are NaN too. The run used to go on to the end, say "completed", and
write that adapter (and a metrics.json with `NaN` in it, which is not JSON). The loss the
Trainer logs is already on the host at each logging window (it gathers and averages it over
every process), so watching it costs no synchronisation and every process stops at the same
step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch.distributed as dist
from bitsandbytes.functional import dequantize_4bit
from transformers import TrainerCallback

from expert_cli.errors import RunError
from expert_cli.train.checkpoints import checkpoint_step, complete_checkpoints
from expert_cli.weights import non_finite_tensors, tensor_is_finite

if TYPE_CHECKING:
    from expert_cli.config.resolve import ResolvedConfig

CONFIG = "training.config."
ADAPTER_FILE = "adapter_model.safetensors"


@dataclass(frozen=True)
class Diverged:
    """The logging window whose loss was not finite: it ended at `step`, and the window before
    it (finite) ended at `last_finite`. A finite `loss` means every logged loss was finite but
    the adapter's weights are not (the last step's update, or a window never logged):
    `weights_only`."""

    step: int
    last_finite: int
    loss: float
    weights_only: bool = False


class DivergenceWatch(TrainerCallback):
    """Stops training, with no checkpoint or evaluation of the step, at the first logged loss
    that is not finite. A window's loss is gathered over every process, so all of them stop
    at the same window; the Trainer's closing log holds each process's own loss since the
    last window, so it is only noted here and judged in `check_weights` with one collective."""

    def __init__(self) -> None:
        self.diverged: Diverged | None = None
        self._last_finite = 0
        self._closing_nonfinite = False  # this process's closing loss, not yet agreed

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        self._last_finite = state.global_step  # a resumed run starts at its checkpoint's step
        return control

    def on_log(
        self, args: Any, state: Any, control: Any, logs: dict | None = None, **kwargs: Any
    ) -> Any:
        logs = logs or {}
        closing = logs.get("train_loss")  # the Trainer's last log: the run's mean loss
        if isinstance(closing, (int, float)) and not math.isfinite(closing):
            self._closing_nonfinite = True
        loss = logs.get("loss")
        if not isinstance(loss, (int, float)) or self.diverged is not None:
            return self._hold(control)
        if math.isfinite(loss):
            self._last_finite = state.global_step
            return control
        self.diverged = Diverged(state.global_step, self._last_finite, float(loss))
        control.should_training_stop = True
        return self._hold(control)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        return self._hold(control)

    def on_epoch_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        # after the loop stops, the Trainer asks once more at the epoch's end: an epoch
        # save_strategy or eval_strategy would save and evaluate the NaN weights
        return self._hold(control)

    def _hold(self, control: Any) -> Any:
        """Once diverged: nothing more is saved, evaluated or logged."""
        if self.diverged is not None:
            control.should_save = control.should_evaluate = control.should_log = False
        return control

    def check_weights(self, model: Any, step: int, sum_over_ranks: Any) -> None:
        """After the last step, before the adapter is saved: a closing loss that is not finite
        on any process, or adapter weights that are not (a NaN update in the last step, or a
        window no log showed). Every process looks at its own (sharded) weights and calls
        `sum_over_ranks` once, unless a window already stopped them all alike."""
        if self.diverged is not None:
            return
        flags = [
            1.0 if self._closing_nonfinite else 0.0,
            1.0 if non_finite_weights(model, trainable_only=True) else 0.0,
        ]
        closing, weights = sum_over_ranks(flags)
        if closing:
            self.diverged = Diverged(step, self._last_finite, math.nan)
        elif weights:
            self.diverged = Diverged(step, self._last_finite, math.nan, weights_only=True)


def local_data(param: Any) -> Any:
    """The part of a parameter this process holds: a DTensor's local shard (FSDP2), the real
    elements of DeepSpeed ZeRO-3's partition (`ds_tensor`, whose `data` is an empty
    placeholder; the partition is padded to an equal size with memory never written, which
    may read as NaN), else the tensor."""
    shard = getattr(param, "ds_tensor", None)
    if shard is not None:
        part = int(getattr(shard, "ds_numel", shard.numel()))
        group = getattr(param, "ds_process_group", None)
        rank = dist.get_rank(group=group) if dist.is_available() and dist.is_initialized() else 0
        real = max(0, min(part, int(getattr(param, "ds_numel", part)) - rank * part))
        return shard.reshape(-1).narrow(0, 0, real)
    data = param.data
    return data.to_local() if hasattr(data, "to_local") else data


def non_finite_weights(model: Any, trainable_only: bool = False) -> list[str]:
    """Names of the floating-point parameters (only those that train, with `trainable_only`)
    holding a NaN or an infinity, each process judging the shard it holds; a 4-bit weight is
    judged dequantized and an 8-bit one by its row scales (their packed integers hold no NaN,
    and a NaN in the weights they were made from went into the scales: one NaN made a whole
    4-bit layer NaN, and the run "diverged" at its first step). Tensors without storage are
    not read. One synchronisation per tensor, at load and after the last step only (see
    `weights.tensor_is_finite`)."""
    bad = []
    for name, param in model.named_parameters():
        if trainable_only and not param.requires_grad:
            continue
        data = _numbers(param)
        if not data.is_meta and not tensor_is_finite(data):
            bad.append(name)
    return bad


def _numbers(param: Any) -> Any:
    """The numbers a parameter stands for: a 4-bit weight dequantized, an 8-bit weight's row
    scales, else its own (local) data."""
    if (state := getattr(param, "quant_state", None)) is not None:
        return dequantize_4bit(param.data, state)
    if (scales := getattr(param, "SCB", None)) is not None:
        return scales
    return local_data(param)


def finite_checkpoint(output: Path) -> Path | None:
    """The newest complete checkpoint whose adapter weights are all finite numbers."""
    for path in reversed(complete_checkpoints(output / "checkpoints")):
        file = path / ADAPTER_FILE
        if file.is_file() and non_finite_tensors(file) == []:
            return path
    return None


def remedies(resolved: ResolvedConfig) -> list[str]:
    """Changes that keep the loss finite, for the settings this run used."""
    out = [f"a lower {CONFIG}learning_rate (now {resolved.learning_rate:g})"]
    if resolved.max_grad_norm > 1.0:
        out.append(f"a lower {CONFIG}max_grad_norm, e.g. 1.0 (now {resolved.max_grad_norm:g})")
    elif resolved.max_grad_norm == 0:
        out.append(f"clipping: {CONFIG}max_grad_norm 1.0 (now 0, no clipping)")
    if resolved.fp16:
        out.append(f"{CONFIG}bf16 true on a GPU with bf16 (fp16 overflows above 65504)")
    if resolved.warmup_steps == 0 and not resolved.warmup_ratio:
        out.append(f"{CONFIG}warmup_steps above 0 (the full rate from the first step now)")
    return out


def diverged_error(resolved: ResolvedConfig, at: Diverged, output: Path | None) -> RunError:
    """The RunError of a run stopped by `DivergenceWatch` (its adapter was not written); the
    last finite checkpoint in `output` is looked for where it is given (the main process)."""
    steps = (
        f"the window of steps {at.last_finite + 1}-{at.step}"
        if at.step > at.last_finite + 1
        else f"step {at.step}"
    )
    since = "from the start" if at.last_finite == 0 else f"finite up to step {at.last_finite}"
    what = f"the loss is {at.loss} in {steps} ({since})"
    if at.weights_only:
        what = f"the adapter's weights hold NaN or infinity after step {at.step}"
    if at.step == 1 and at.last_finite == 0 and not at.weights_only:  # before any update
        precision = f"; {CONFIG}bf16 true on a GPU with bf16" if resolved.fp16 else ""
        return RunError(
            f"training stopped: {what}, a loss computed before any update, so neither the "
            "learning rate nor clipping is the cause: the base model's forward is not finite "
            "on this data (weights out of its dtype's range, or fp16 overflowing); check the "
            f"base model{precision}. No adapter was written."
        )
    kept = finite_checkpoint(output) if output is not None else None
    salvage = (
        f" {kept.name} (step {checkpoint_step(kept)}) holds the last finite adapter weights."
        if kept is not None
        else ""
    )
    return RunError(
        f"training diverged: {what}, so the run stopped and wrote no adapter.{salvage} "
        "Train again with --overwrite and one of: "
        f"{'; '.join(remedies(resolved))}."
    )
