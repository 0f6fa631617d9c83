"""A run that runs out of memory: said in one message, with what to change and how to go on.

A step that needs more GPU memory than there is stops the run with torch's OutOfMemoryError
(on a CPU, the allocator's RuntimeError); it used to reach the user as a traceback. The
message says where the run stopped (loading, the batch probe, step N), the micro-batch that
did not fit, the settings that lower a step's memory that this run does not use yet (each a
manifest field), and which complete checkpoint `--resume` continues from: a smaller
micro-batch with a larger accumulation keeps the rows per optimizer step, so the resumed run
is the same run.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from expert_cli.errors import RunError, exception_chain
from expert_cli.train.checkpoints import checkpoint_step, complete_checkpoints

if TYPE_CHECKING:
    from expert_cli.config.resolve import ResolvedConfig

# allocation failures torch reports as a plain RuntimeError: the CPU allocator's, and CUDA's own
# when it is not the caching allocator that runs out (a cuBLAS workspace, a kernel's launch)
ALLOCATION_FAILED = (
    "DefaultCPUAllocator: can't allocate memory",
    "CUDA error: out of memory",
    "CUBLAS_STATUS_ALLOC_FAILED",
)
CONFIG = "training.config."


def out_of_memory(exc: BaseException) -> bool:
    """Whether `exc` (or an exception it was raised from) is an allocation that failed."""
    return any(
        isinstance(e, (torch.OutOfMemoryError, MemoryError))
        or (isinstance(e, RuntimeError) and any(m in str(e) for m in ALLOCATION_FAILED))
        for e in exception_chain(exc)
    )


@dataclass(frozen=True)
class Stopped:
    """Where a run ran out of memory: `stage` (loading the base model, the batch probe, a
    step), the step reached, the micro-batch and the device."""

    stage: str
    step: int = 0
    micro_batch: int = 0
    accumulation: int = 1
    device: str = "cpu"


def _device_memory(device: str) -> str:
    if not device.startswith("cuda") or not torch.cuda.is_available():
        return "this machine's memory"
    props = torch.cuda.get_device_properties(torch.device(device))
    return f"the GPU's {props.total_memory / 2**30:.1f} GiB ({props.name}, {device})"


def _smaller_batch(at: Stopped) -> str | None:
    """A micro-batch below the one that did not fit, with the accumulation that keeps the
    rows per optimizer step (so --resume continues the same run)."""
    rows = at.micro_batch * at.accumulation
    smaller = next((d for d in range(at.micro_batch - 1, 0, -1) if rows % d == 0), None)
    if smaller is None:
        return None
    return (
        f"{CONFIG}batch_size {smaller} with gradient_accumulation_steps {rows // smaller} "
        f"(the same {rows} rows per optimizer step)"
    )


def remedies(resolved: ResolvedConfig, at: Stopped) -> list[str]:
    """The settings that lower the memory of what ran out that this run does not use yet."""
    unquantized = resolved.quantization not in ("int4", "int8")
    if at.stage == "load":
        out = ['the base model\'s quantization "int4" (QLoRA)'] if unquantized else []
        return [*out, "a smaller base model, or FSDP over several GPUs (docs/distributed.md)"]
    out = []
    if at.device.startswith("cuda") and not resolved.batch_auto and at.micro_batch > 1:
        key = "micro_batch" if resolved.gradient_accumulation_steps > 1 else "batch_size"
        out.append(f'{CONFIG}{key} "auto" (the largest micro-batch that fits, same rows per step)')
    if at.micro_batch > 1 and (smaller := _smaller_batch(at)):
        out.append(smaller)
    if not resolved.gradient_checkpointing:
        out.append(f"{CONFIG}gradient_checkpointing true (recomputes activations)")
    if resolved.fused_loss == "off":
        out.append(f'{CONFIG}fused_loss "chunked" (no full-vocabulary logits)')
    if unquantized:
        out.append('the base model\'s quantization "int4" (QLoRA; a new run)')
    out.append(f"a smaller {CONFIG}max_seq_length (a new run)")
    return out


def _resume_from(output: Path) -> str:
    found = complete_checkpoints(output / "checkpoints")
    if not found:
        return "no checkpoint was saved before it: train again (with --overwrite)"
    last = found[-1]
    return (
        f"{last.name} (step {checkpoint_step(last)}) is complete: train again with --resume "
        "to continue from it"
    )


@contextmanager
def stage_out_of_memory(
    resolved: ResolvedConfig, at: Stopped, output: Path | None = None
) -> Iterator[None]:
    """Inside it, an allocation that fails is `oom_error` for `at`; any other error passes."""
    try:
        yield
    except Exception as exc:
        if out_of_memory(exc):
            raise oom_error(resolved, at, output) from exc
        raise


def oom_error(resolved: ResolvedConfig, at: Stopped, output: Path | None) -> RunError:
    """The RunError for a run that ran out of memory at `at`."""
    where = {
        "load": "while loading the base model",
        "probe": "while measuring a micro-step for batch_size auto",
    }.get(at.stage, f"at step {at.step + 1}")
    batch = (
        f" (a micro-batch of {at.micro_batch} row{'s' if at.micro_batch > 1 else ''} of up to "
        f"{resolved.max_seq_length} tokens)"
        if at.micro_batch
        else ""
    )
    text = (
        f"out of memory {where}{batch}: it needs more than {_device_memory(at.device)}. "
        f"Lower what it needs with one of: {'; '.join(remedies(resolved, at))}."
    )
    if at.stage == "step" and output is not None:
        text += f" {_resume_from(output)}"
    return RunError(text)
