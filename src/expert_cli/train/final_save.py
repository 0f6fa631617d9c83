"""The end of a run, once its steps are trained: the weights checked, metrics.json's summary,
training.png, and the final adapter saved, with SIGINT/SIGTERM held.

A signal as the run ends used to stop it at once, with the handlers from before: no word said,
the final adapter not saved, and metrics.json already saying `completed`. Now the first signal
is held until the adapter is saved (the run is complete then); a second one still stops at
once, with metrics.json saying `interrupted` and a message saying how to continue.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from expert_cli.errors import Interrupted, RunError, Terminated
from expert_cli.train import distributed
from expert_cli.train.callbacks import ThroughputCallback
from expert_cli.train.checkpoints import COMPLETE, resumable
from expert_cli.train.choice import FINAL_STEP, final_adapter_step
from expert_cli.train.divergence import DivergenceWatch, diverged_error
from expert_cli.train.lora_init import INIT_WEIGHTS, to_standard_form
from expert_cli.train.outputs import move_final_files, write_resolved
from expert_cli.train.report import write_run_plot
from expert_cli.train.run_folder import disk_full
from expert_cli.train.session import Run
from expert_cli.train.stop_signal import Interrupt, InterruptCallback

AT_ONCE = (
    "stopped at once (a second signal): the steps since the run's latest checkpoint are not "
    "saved; train again with the same options and --resume to continue from it"
)
KEPT = (
    "stopped at once as the run ended: the checkpoint of its last step is kept; train again "
    "with the same options and --resume to continue from it"
)
NOTHING_KEPT = (
    "stopped at once (a second signal) before a checkpoint was written whole: there is "
    "nothing to resume from; train again with the same options and --overwrite to start over"
)
STOPPED = (
    "stopped at once as the run ended: its final adapter is not saved; train again with the "
    "same options and --resume to continue from its latest checkpoint"
)


def end_run(
    run: Run,
    model: Any,
    trainer: Any,
    watchers: tuple[ThroughputCallback, InterruptCallback, DivergenceWatch],
    interrupt: Interrupt,
) -> tuple[str, dict[str, Any]]:
    """(status, summary) of a run whose training has returned: its weights checked, the
    summary and plot written, the adapter saved where it completed; run inside `interrupt`."""
    throughput, stop, watch = watchers
    steps = trainer.state.global_step
    interrupt.ending = True  # a first signal now waits for the save
    try:
        if not stop.stopped:  # an adapter about to be saved: its numbers must be numbers
            watch.check_weights(model, steps, distributed.sum_over_ranks)
        status = "diverged" if watch.diverged else "interrupted" if stop.stopped else "completed"
        summary = throughput.finish(steps, status)
        if run.is_main:
            write_run_plot(run.output)  # training.png, where matplotlib is installed
        if watch.diverged is not None:
            distributed.barrier()  # every process stopped at the same window
            raise diverged_error(run.resolved, watch.diverged, run.output if run.is_main else None)
        if status == "completed":
            _save_final(run, trainer, throughput)
    except (KeyboardInterrupt, Terminated) as exc:  # a second signal: stopped at once
        throughput.finish(steps, "interrupted", alone=True)
        said = KEPT if stop.stopped else STOPPED  # a run the first one stopped saves none
        raise Interrupted(said, exc.code if isinstance(exc, Terminated) else 130) from None
    return status, summary


def _save_final(run: Run, trainer: Any, throughput: ThroughputCallback) -> None:
    """The final adapter saved; metrics.json says `failed` where it could not be."""
    try:
        save(run, trainer)
    except Exception as exc:
        throughput.record_failure(trainer.state.global_step)
        if disk_full(exc, run.output):
            raise RunError(
                f"no space left on {run.output} to save the adapter: free space, then "
                "train again with --resume"
            ) from exc
        raise


def save(run: Run, trainer: Any) -> None:
    """Adapter, adapter_config.json and tokenizer into OUTPUT (all ranks call, main writes)."""
    staging = run.output / f".final-{os.getpid()}"
    try:
        trainer.save_model(str(staging))
        if run.is_main:
            # a decomposed base's adapter (PiSSA) leaves the run as a LoRA of the base itself
            to_standard_form(staging, run.output / INIT_WEIGHTS)
            move_final_files(staging, run.output)
            step = final_adapter_step(trainer.args.load_best_model_at_end, trainer.state)
            run.runtime[FINAL_STEP] = step
            write_resolved(run.output, run.resolved, run.runtime)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def stopped_at_once(output: Path, step: int, is_main: bool) -> str:
    """What a second signal during training left: AT_ONCE where a checkpoint to resume from
    is kept; else NOTHING_KEPT, the checkpoint of `step` it cut short removed (the signal
    came while the run's first one was written)."""
    cut = output / "checkpoints" / f"checkpoint-{step}"
    if is_main and cut.is_dir() and not (cut / COMPLETE).is_file():
        shutil.rmtree(cut, ignore_errors=True)
    return AT_ONCE if resumable(output / "checkpoints") else NOTHING_KEPT
