"""Trainer callbacks of a run: throughput windows and metrics.json, AdaLoRA; and the window
in which scripts and tests count a step's operations."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from expert_cli.jsontext import number_pairs
from expert_cli.telemetry.ops import OpCounter
from expert_cli.telemetry.throughput import ThroughputMeter
from expert_cli.train.args import warmup_count
from expert_cli.train.metrics_file import MetricsFile
from expert_cli.train.outputs import read_json_file
from expert_cli.train.task_evals import task_results

# the window's numbers that also go into the Trainer's logs (so TensorBoard gets them)
LOGGED = ("tokens_per_s", "samples_per_s", "data_wait_fraction", "mfu", "peak_memory_gb")


class ThroughputCallback(TrainerCallback):
    """Closes a throughput window at each training log, records each evaluation's loss, and
    rewrites metrics.json atomically (only where `metrics_path` is given: the main process).
    `earlier` (a resumed run's windows and evaluations up to its checkpoint) stay at the head
    of the file's lists; the summary covers this run's."""

    def __init__(
        self,
        meter: ThroughputMeter,
        metrics_path: Path | None,
        on_window: Callable[[dict[str, Any]], None] | None = None,
        earlier: dict[str, list[dict[str, Any]]] | None = None,
    ) -> None:
        self.meter = meter
        self.file = MetricsFile(metrics_path) if metrics_path is not None else None
        self.on_window = on_window
        self.earlier = {key: list((earlier or {}).get(key, [])) for key in ("windows", "evals")}
        self.evals: list[dict[str, Any]] = []
        self.extra: dict[str, Any] = {}  # the summary's other entries (`stopped_early`)
        # a resumed run's tokens before it (None: its earlier windows, of an older version,
        # do not say theirs)
        self._before = next((w.get("tokens_seen") for w in reversed(self.earlier["windows"])), 0)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.meter.step_ended()
        last = state.max_steps and state.global_step >= state.max_steps
        if last or _evaluates(args, state):
            # the last steps' loss is logged, so the last window (and the run's final loss)
            # has one: where the step count is no multiple of logging_steps, the final loss
            # was the window before it, and the last window had none. So at an evaluation
            # too: early stopping ends the run there, decided after the step's log (this
            # callback runs before the Trainer's own, which sets should_evaluate)
            control.should_log = True

    def on_epoch_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if args.eval_strategy == "epoch":  # an evaluation, where early stopping may end it
            control.should_log = True

    def on_log(
        self, args: Any, state: Any, control: Any, logs: dict | None = None, **kwargs: Any
    ) -> None:
        if logs is not None and "eval_loss" in logs:
            record = {"step": state.global_step, "eval_loss": logs["eval_loss"]}
            if "eval_token_accuracy" in logs:
                record["token_accuracy"] = logs["eval_token_accuracy"]
            if tasks := task_results(logs):  # a multi_task expert's (train/task_evals.py)
                record["tasks"] = tasks
            self.evals.append(record)
            self.write(state.global_step, "running", now=True)
        if logs is None or "loss" not in logs or self.meter.steps_in_window == 0:
            return
        record = self._seen(
            self.meter.close_window(state.global_step, logs.get("loss"), logs.get("learning_rate"))
        )
        if isinstance(logs.get("grad_norm"), float | int):  # its last step's, before clipping
            record["grad_norm"] = float(logs["grad_norm"])  # to max_grad_norm
        logs.update({k: v for k, v in record.items() if k in LOGGED and v is not None})
        self.write(state.global_step, "running")
        if self.on_window is not None:
            self.on_window(record)

    def _seen(self, record: dict[str, Any]) -> dict[str, Any]:
        """`record` with `tokens_seen`, the run's tokens (every process's) up to its end, a
        resumed run's earlier ones included: losses of runs of other batch sizes compare at
        the same tokens, not the same step. Left out where a resumed run's earlier windows do
        not say theirs (recorded before it was)."""
        if self._before is not None:
            record["tokens_seen"] = int(self._before + self.meter.totals["tokens"])
        return record

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        # a checkpoint: the file holds its windows and evaluations now (a --resume after a
        # kill reads them from here), whatever its size
        self.write(state.global_step, "running", now=True)

    def write(self, steps: int, status: str, now: bool = False) -> dict[str, Any]:
        """metrics.json with `status`; a large file of a running run may wait (MetricsFile)
        unless `now` (an evaluation, a checkpoint)."""
        summary = self.meter.summary(steps, status)
        if summary["final_loss"] is None:  # a resume that trained nothing: the run's own last
            earlier = [w.get("loss") for w in self.earlier["windows"] if w.get("loss") is not None]
            summary["final_loss"] = earlier[-1] if earlier else None
        if summary["steps_this_run"] == 0:  # no window of its own: 0 tok/s said nothing true
            summary.update(over_windows(self.earlier["windows"]))
        summary.update(mfu_terms(self.meter))
        summary.update(self.extra)
        if self.file is not None:
            self.file.write(
                self.earlier["windows"] + self.meter.windows,
                {"evals": self.earlier["evals"] + self.evals, "summary": summary},
                running=status == "running" and not now,
            )
        return summary

    def finish(self, steps: int, status: str, alone: bool = False) -> dict[str, Any]:
        """Close a last partial window and write the final summary: on every process, or with
        `alone` on this one without waiting for the others (it failed, they may not have)."""
        if self.meter.steps_in_window:
            record = self._seen(
                self.meter.close_window(steps, None, None, at_last_step=True, alone=alone)
            )
            if self.on_window is not None:
                self.on_window(record)
        return self.write(steps, status)

    def record_failure(self, steps: int) -> None:
        """Mark metrics.json "failed" without waiting for other processes, best effort: on a
        full disk that write fails too, and the error that stopped the run is the one to
        report (the file keeps its last whole state, as every write replaces it atomically)."""
        with contextlib.suppress(OSError):
            self.finish(steps, "failed", alone=True)


def mfu_terms(meter: ThroughputMeter) -> dict[str, Any]:
    """What the run's MFU is worked out from (tokens/s x FLOPs a token / the peak), so that
    metrics.json's figure can be checked by hand: none where there is no MFU (a CPU, an
    unknown GPU, a run without mixed precision)."""
    flops, t = meter.flops, meter.totals
    if flops is None or not flops.peak_flops_per_device or not t["tokens"]:
        return {}
    attended, trained = t["attended"] / t["tokens"], t["trained"] / t["tokens"]
    return {
        "mfu_terms": {
            "flops_per_token": flops.per_token(attended, trained),
            "attended_length": attended,  # sum of squared example lengths / sum of lengths
            "trained_share": trained,  # of tokens whose next token is trained (the head's)
            "peak_flops": flops.peak_flops_per_device * max(1, len(meter.rank_totals)),
        }
    }


def over_windows(windows: list[Any]) -> dict[str, float]:
    """Tokens/s, samples/s, data wait and MFU over a run's recorded windows (metrics.json's,
    each weighted by its seconds; records without finite numbers left out): the figures of a
    resumed run that trained no step of its own are those of the run it resumed."""
    figures: dict[str, float] = {}
    for key in ("tokens_per_s", "samples_per_s", "data_wait_fraction", "mfu"):
        pairs = [(s, v) for s, v in number_pairs(windows, "seconds", key) if s > 0 and v >= 0]
        total = sum(s for s, _ in pairs)
        value = sum(s * v for s, v in pairs) / total if pairs else math.nan
        if math.isfinite(value):  # a hand-edited 1e308 overflows: left out, not Infinity
            figures[key] = value
    return figures


def earlier_records(path: Path, resumed_from: str | None) -> dict[str, list[dict[str, Any]]]:
    """The windows and evaluations of metrics.json up to the checkpoint a resumed run starts
    from (none for a new run, or when the file is unreadable: a killed run's)."""
    if resumed_from is None:
        return {}
    step = int(Path(resumed_from).name.rsplit("-", 1)[-1])
    data = read_json_file(path)
    return {
        key: [r for r in data.get(key) or [] if isinstance(r, dict) and r.get("step", 0) <= step]
        for key in ("windows", "evals")
    }


def _evaluates(args: Any, state: Any) -> bool:
    """Whether the Trainer evaluates at the end of this step (its DefaultFlowCallback's rule
    for an evaluation every `eval_steps`)."""
    every = getattr(state, "eval_steps", 0) or 0
    due = args.eval_strategy == "steps" and every > 0 and state.global_step % every == 0
    return due and (args.eval_delay or 0) <= state.global_step


class AdaLoraCallback(TrainerCallback):
    """AdaLoRA reallocates ranks after each optimizer step, while gradients still exist."""

    def __init__(self, peft_model: Any) -> None:
        self.peft_model = peft_model

    def on_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.peft_model.base_model.update_and_allocate(state.global_step)


class CountStepOps(TrainerCallback):
    """Counts in `counter` the operations of optimizer step `step` (1-based) whole: forward,
    loss, backward, clipping, optimizer and zero_grad (scripts/bench_step_ops.py, tests)."""

    def __init__(self, counter: OpCounter, step: int) -> None:
        self.counter, self.step = counter, step

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.global_step == self.step - 1:
            self.counter.__enter__()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.global_step == self.step:
            self.counter.__exit__(None, None, None)


class ScheduleNote(TrainerCallback):
    """Says, as training begins, when the schedule is longer than the run: a warm-up of at
    least the run's steps (the learning rate climbs for the whole run and never reaches its
    peak) or a warmup-stable-decay schedule whose decay alone outlasts it (the rate falls
    from the first steps). Both trained in silence."""

    def __init__(self, note: Callable[[str], None]) -> None:
        self.note = note

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        total = state.max_steps
        if not total or state.global_step:  # a resume: said when the run began
            return
        warmup = args.warmup_steps
        if isinstance(warmup, float) and 0 < warmup < 1:  # a ratio, counted as the run counts it
            warmup = warmup_count(warmup, total)
        if isinstance(warmup, int) and warmup >= total:
            # the scheduler gives step k (1-based) the rate lr x (k - 1) / warmup
            reached = args.learning_rate * (total - 1) / warmup
            self.note(
                f"warmup_steps: {warmup} of a {total}-step run: the learning rate climbs for "
                f"the whole run and never reaches its peak {args.learning_rate:g} (about "
                f"{reached:.3g} at the last step); give fewer warmup_steps or a warmup_ratio"
                if total > 1
                else f"warmup_steps: {warmup} of a 1-step run: a warm-up starts at a learning "
                "rate of 0, so the run's only step changes nothing and the adapter adds "
                "nothing to the base model; give warmup_steps 0, or more steps"
            )
        wsd = str(getattr(args.lr_scheduler_type, "value", args.lr_scheduler_type))
        if wsd == "warmup_stable_decay" and (said := wsd_note(args, int(warmup), total)):
            self.note(said)


def wsd_note(args: Any, warmup: int, total: int) -> str | None:
    """Where a warmup-stable-decay schedule's phases do not fill the run: a decay of at least
    the run's steps (the rate falls from the first steps), one that begins before the
    warm-up ends (the peak never reached), or a stable phase given that ends the decay before
    the run (its last steps at the final rate, 0 by default) or after it (the decay cut
    short, or never begun). Each trained in silence (transformers' own warning hidden)."""
    kwargs = args.lr_scheduler_kwargs or {}
    decay, stable = kwargs.get("num_decay_steps"), kwargs.get("num_stable_steps")
    if not isinstance(decay, int):
        return None
    if decay >= total:
        return (
            f"lr_scheduler_kwargs.num_decay_steps: {decay} of a {total}-step run: the "
            "learning rate falls from the first steps and the run has no stable phase; "
            "give fewer decay steps (or num_decay_steps below the run's length)"
        )
    if not isinstance(stable, int):
        if warmup + decay <= total:
            return None
        return (
            f"lr_scheduler_kwargs.num_decay_steps: {decay} after {warmup} warm-up steps of a "
            f"{total}-step run: the decay begins at step {total - decay + 1}, before the "
            "warm-up ends, and the rate never reaches its peak; give fewer decay or warm-up "
            "steps"
        )
    end = warmup + stable + decay
    if end == total:
        return None
    phases = f"{warmup} warm-up + {stable} stable + {decay} decay steps = {end}"
    final = args.learning_rate * float(kwargs.get("min_lr_ratio", 0.0))
    if end < total:
        what = f"its last {total - end} steps train at the final rate {final:g}"
    elif warmup + stable >= total:
        what = "the rate never decays"
    else:
        what = f"the decay is cut short at step {total} of its {end}"
    return (
        f"lr_scheduler_kwargs: {phases} of a {total}-step run: {what}; leave num_stable_steps "
        f"out (the stable phase then fills the run), or make the phases add up to {total}"
    )


class ResumedIntervals(TrainerCallback):
    """A resumed run logs, evaluates and saves at the intervals it was given now: the Trainer
    takes them from the checkpoint's state, so intervals edited before a --resume were
    recorded in manifest.resolved.json and not applied."""

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        state.compute_steps(args, state.max_steps)
