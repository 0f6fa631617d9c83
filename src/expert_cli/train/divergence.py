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

import torch
from transformers import TrainerCallback

from expert_cli.errors import RunError
from expert_cli.train.checkpoints import checkpoint_step, complete_checkpoints
from expert_cli.weights import non_finite_tensors

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
    that is not finite."""

    def __init__(self) -> None:
        self.diverged: Diverged | None = None
        self._last_finite = 0

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        self._last_finite = state.global_step  # a resumed run starts at its checkpoint's step
        return control

    def on_log(
        self, args: Any, state: Any, control: Any, logs: dict | None = None, **kwargs: Any
    ) -> Any:
        logs = logs or {}
        # a window's loss, or the whole run's in the Trainer's closing log (the only loss a run
        # sees when logging_steps is above its steps)
        loss = logs.get("loss", logs.get("train_loss"))
        if not isinstance(loss, (int, float)) or self.diverged is not None:
            return control
        if math.isfinite(loss):
            self._last_finite = state.global_step
            return control
        self.diverged = Diverged(state.global_step, self._last_finite, float(loss))
        control.should_training_stop = True
        control.should_save = False  # the weights after this window are not worth keeping
        control.should_evaluate = False
        return control

    def check_weights(self, model: Any, step: int, any_rank: Any) -> None:
        """After the last step: the adapter's weights must be numbers before they are saved
        (a NaN update in the last step, or in a window no log showed). Every process looks
        at its own (sharded) weights; `any_rank` makes it one verdict."""
        if self.diverged is not None:
            return
        if any_rank(bool(non_finite_weights(model, trainable_only=True))):
            self.diverged = Diverged(step, self._last_finite, math.nan, weights_only=True)


SCAN_ELEMENTS = 1 << 24  # elements per isfinite pass: a bounded temporary, whatever the tensor


def non_finite_weights(model: Any, trainable_only: bool = False) -> list[str]:
    """Names of the floating-point parameters (only those that train, with `trainable_only`)
    holding a NaN or an infinity; a quantized weight's packed integers and tensors without
    local storage are not read. One synchronisation per tensor, at load and after the last
    step only: a finite sum proves every element finite (NaN and infinity propagate), at the
    speed of a read (0.1 s per 600M fp32 weights on 2 CPU cores, 20x `isfinite`); only a sum
    that overflows is looked at element by element, a piece at a time."""
    bad = []
    for name, param in model.named_parameters():
        data = param.data
        if trainable_only and not param.requires_grad:
            continue
        if not data.is_floating_point() or data.is_meta or type(data) is not torch.Tensor:
            continue
        if bool(data.sum().isfinite()):
            continue
        flat = data.reshape(-1)
        if not all(
            bool(flat[i : i + SCAN_ELEMENTS].isfinite().all())
            for i in range(0, flat.numel(), SCAN_ELEMENTS)
        ):
            bad.append(name)
    return bad


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
    if resolved.fp16:
        out.append(f"{CONFIG}bf16 true on a GPU with bf16 (fp16 overflows above 65504)")
    if resolved.warmup_steps == 0 and not resolved.warmup_ratio:
        out.append(f"{CONFIG}warmup_steps above 0 (the full rate from the first step now)")
    return out


def diverged_error(resolved: ResolvedConfig, at: Diverged, output: Path) -> RunError:
    """The RunError of a run stopped by `DivergenceWatch` (its adapter was not written)."""
    steps = (
        f"the window of steps {at.last_finite + 1}-{at.step}"
        if at.step > at.last_finite + 1
        else f"step {at.step}"
    )
    since = "from the start" if at.last_finite == 0 else f"finite up to step {at.last_finite}"
    what = f"the loss is {at.loss} in {steps} ({since})"
    if at.weights_only:
        what = f"the adapter's weights hold NaN or infinity after step {at.step}"
    kept = finite_checkpoint(output)
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
