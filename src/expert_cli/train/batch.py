"""`batch_size: auto`: as many packed rows per micro-batch as the GPU's memory holds, with the
optimizer step's size kept.

A run asks for a number of rows per optimizer step (`tokens_per_step` / `max_seq_length`, or
`batch_size` x `gradient_accumulation_steps`). The micro-batch is the largest divisor of that
number that fits: a short probe runs a forward and backward pass of one row and of two rows,
reads the peak memory of each, and takes the difference as the cost of a row. Accumulation
makes up the rest, so the optimization is the same whatever the GPU.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any

import torch

from expert_cli.config.kernels import BOUNDARY_KERNELS
from expert_cli.data.collate import PackedCollator
from expert_cli.train import distributed
from expert_cli.train.grouped_lora import clear_groups
from expert_cli.train.memory import out_of_memory
from expert_cli.train.model import autocast_dtype, enable_checkpointing

if TYPE_CHECKING:
    from expert_cli.data import PreparedData
    from expert_cli.train.model import ModelChoices
    from expert_cli.train.session import Run

# Share of the GPU's memory a planned micro-batch may use (fragmentation, the optimizer's
# first allocation and the allocator's caches take the rest).
MEMORY_HEADROOM = 0.85
GIB = 2**30


@dataclass(frozen=True)
class BatchPlan:
    """The micro-batch chosen for one run, and the measurements behind it."""

    micro_batch: int
    accumulation: int
    rows_per_step: int
    fixed_gb: float | None = None
    per_row_gb: float | None = None
    budget_gb: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def describe(self, given: tuple[int, int] | None = None) -> str:
        """The plan in words, after what it was made from: "auto:" where the rows per step
        came from tokens_per_step, "8 x 4 run as" where a batch_size x accumulation gave
        them (`given`, the numbers before the probe)."""
        if given is not None:
            what = "auto:" if given[0] == self.rows_per_step else f"{given[0]} x {given[1]} run as"
            return f"{what} {self.describe()}"
        if self.per_row_gb is None:
            return (
                f"{self.micro_batch} rows x {self.accumulation} accumulation "
                f"= {self.rows_per_step} rows per optimizer step"
            )
        return (
            f"{self.micro_batch} rows x {self.accumulation} accumulation = "
            f"{self.rows_per_step} rows per optimizer step (probe: {self.per_row_gb:.2f} GB "
            f"a row + {self.fixed_gb:.1f} GB fixed, budget {self.budget_gb:.0f} GB)"
        )


def largest_fitting_divisor(
    rows_per_step: int, fixed_gb: float, per_row_gb: float, budget_gb: float
) -> int:
    """The largest divisor d of `rows_per_step` with fixed + d x per_row <= budget (>= 1)."""
    for d in range(rows_per_step, 0, -1):
        if rows_per_step % d == 0 and fixed_gb + d * max(per_row_gb, 0.0) <= budget_gb:
            return d
    return 1


def _peak_of_step(
    model: torch.nn.Module, batch: dict[str, Any], dtype: torch.dtype | None
) -> float:
    """Peak GPU memory (GiB) of one forward + backward pass of `batch`."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    with torch.autocast("cuda", dtype=dtype or torch.float32, enabled=dtype is not None):
        loss = model(**batch, use_cache=False).loss
    loss.backward()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() / GIB
    model.zero_grad(set_to_none=True)
    # the run's first window reads its peak from the last reset: not from the probe's step
    # (of 2 rows, where training may then take 1)
    torch.cuda.reset_peak_memory_stats()
    return peak


def probe_memory(
    model: torch.nn.Module,
    rows: list[dict[str, Any]],
    collate: Any,
    device: str,
    dtype: torch.dtype | None,
) -> tuple[float, float]:
    """(fixed GiB, GiB per row) of a training micro-step, from passes of one and two rows."""
    peaks = []
    for n in (1, 2):
        batch = {
            k: (v.to(device) if torch.is_tensor(v) else v) for k, v in collate(rows[:n]).items()
        }
        peaks.append(_peak_of_step(model, batch, dtype))
    per_row = max(peaks[1] - peaks[0], 1e-3)
    torch.cuda.empty_cache()
    return peaks[0] - per_row, per_row


@contextmanager
def training_mode(model: torch.nn.Module) -> Iterator[None]:
    """`model` in training mode inside, each module's own mode back after: the probe must
    see the step as the Trainer runs it (transformers checkpoints activations only in
    training mode, and the loaded model is in evaluation mode)."""
    modes = [(m, m.training) for m in model.modules()]
    model.train()
    try:
        yield
    finally:
        for module, mode in modes:
            module.training = mode


def plan_batch(
    model: torch.nn.Module,
    rows: list[dict[str, Any]],
    collate: Any,
    device: str,
    rows_per_step: int,
    dtype: torch.dtype | None,
) -> BatchPlan:
    """Measure, then choose the micro-batch for `rows_per_step` on `device` (a CUDA device)."""
    with training_mode(model):
        fixed, per_row = probe_memory(model, rows, collate, device, dtype)
    total = torch.cuda.get_device_properties(torch.device(device)).total_memory / GIB
    budget = MEMORY_HEADROOM * total
    micro = largest_fitting_divisor(rows_per_step, fixed, per_row, budget)
    return BatchPlan(
        micro_batch=micro,
        accumulation=rows_per_step // micro,
        rows_per_step=rows_per_step,
        fixed_gb=round(fixed, 3),
        per_row_gb=round(per_row, 3),
        budget_gb=round(budget, 1),
    )


def plan_run_batch(
    run: Run, peft_model: Any, tokenizer: Any, data: PreparedData, choices: ModelChoices
) -> None:
    """Probe the memory of a micro-step, choose the micro-batch (the same on every rank: the
    smallest any rank can hold) and keep the rows per optimizer step. For a manifest's
    numeric batch_size x accumulation the micro-batch is never below batch_size (it held
    before the probe existed), and a probe that itself runs out of memory keeps the numbers
    as given (a 1 x 16 run on a full GPU would have failed in the probe's two-row step)."""
    resolved = run.resolved
    given = (resolved.batch_size, resolved.gradient_accumulation_steps)  # auto: (rows, 1)
    numeric = given[0] < resolved.rows_per_step
    collate = PackedCollator(
        tokenizer.pad_token_id,
        boundaries=choices.attn_implementation in BOUNDARY_KERNELS,
        pad_to_multiple_of=resolved.max_seq_length,
    )
    rows = [data.train[i] for i in range(min(2, len(data.train)))] * 2
    if resolved.gradient_checkpointing:  # the Trainer turns it on too; the probe must see it
        enable_checkpointing(peft_model, resolved.gradient_checkpointing_kwargs)
    plan = None
    try:
        plan = plan_batch(
            peft_model,
            rows,
            collate,
            choices.device,
            resolved.rows_per_step,
            autocast_dtype(resolved),
        )
    except Exception as exc:
        if not (numeric and out_of_memory(exc)):
            raise
        peft_model.zero_grad(set_to_none=True)
        clear_groups(peft_model)  # outputs the stopped forward left on grouped layers
        torch.cuda.empty_cache()
    # every rank keeps the numbers where one rank's probe did not fit (that rank had left
    # the others waiting in the collective below)
    if distributed.any_rank(plan is None) or plan is None:
        where = "" if plan is None else " on another process"
        choices.notes.append(
            f"batch_size: {given[0]} x {given[1]} kept as given (the memory probe's two-row "
            f"step did not fit{where})"
        )
        return
    micro = distributed.min_over_ranks(max(plan.micro_batch, given[0] if numeric else 1))
    accumulation = resolved.rows_per_step // micro
    run.args.per_device_train_batch_size = run.args.per_device_eval_batch_size = micro
    run.args.gradient_accumulation_steps = accumulation
    run.resolved = resolved.model_copy(
        update={"batch_size": micro, "gradient_accumulation_steps": accumulation}
    )
    chosen = replace(plan, micro_batch=micro, accumulation=accumulation)
    run.runtime["batch"] = chosen.to_dict()
    choices.notes.append(f"batch_size: {chosen.describe(given)}")
