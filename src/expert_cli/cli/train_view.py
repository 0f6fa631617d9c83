"""What `expert-cli train` prints: the data and decisions at start, a rich progress bar, one
line per logging window, evaluations, and the end of the run (the main process only)."""

from __future__ import annotations

import os
import shlex
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from transformers import TrainerCallback

from expert_cli.cli.data import earlier_text
from expert_cli.cli.render import BuildBar, labelled
from expert_cli.config.resolve import ResolvedConfig
from expert_cli.data import PreparedData
from expert_cli.data.earlier import Earlier
from expert_cli.data.splits import emptied_note, split_note
from expert_cli.data.stats_words import count_lines
from expert_cli.errors import escaped
from expert_cli.telemetry.throughput import flush_note
from expert_cli.train import loss as fused_loss
from expert_cli.train.causality import ISOLATED, MASK_PROXY
from expert_cli.train.choice import lower_loss_note
from expert_cli.train.model import ModelChoices
from expert_cli.train.run import TrainOptions, TrainResult
from expert_cli.train.task_evals import task_results

WIDTH = 10  # the label column: "model     ", "note      "
STAT_KEYS = ("examples", "rows", "tokens", "packing_efficiency", "truncated", "split", "dropped")


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def print_data(
    console: Console,
    stats: dict[str, Any],
    status: str,
    reason: str,
    cache_dir: Any,
    earlier: Earlier | None = None,
) -> None:
    """Data: rows, tokens, packing efficiency, and whether the cache was built, resumed or
    reused."""
    shown = {k: stats[k] for k in STAT_KEYS if k in stats}
    for name in ("train", "eval"):
        if isinstance(stats.get(name), dict):
            shown.update(
                {
                    f"{name}.{k}": v
                    for k, v in stats[name].items()
                    if k in STAT_KEYS and (v or k != "split")
                }
            )
    if (stats.get("inputs") or {}).get("packing") is False:  # padded per batch, not to rows
        shown = {k: v for k, v in shown.items() if not k.endswith("packing_efficiency")}
        shown["packing"] = "off"
    text = "  ".join(f"{k} {_fmt(v)}" for k, v in shown.items())
    state = "reused" if status == "current" else status
    console.print(labelled("data", "bold", text, WIDTH))
    for label, said in count_lines(stats):
        console.print(f"[bold]{label}[/bold]{' ' * (10 - len(label))}", end="")
        console.print(said, highlight=False, markup=False)
    said = [note for note in (split_note(stats), emptied_note(stats)) if note]
    for note in [*(stats.get("notes") or []), *said]:  # the build's: task weights, shared ...
        console.print("[bold]note[/bold]      ", end="")
        console.print(str(note), highlight=False, markup=False)
    console.print("[bold]cache[/bold]     ", end="")
    console.print(f"{state} ({reason}) {escaped(str(cache_dir))}", highlight=False, markup=False)
    if earlier is not None and earlier.caches:
        console.print("[bold]note[/bold]      ", end="")
        console.print(
            f"{earlier_text(earlier)} kept beside it; `expert-cli pretokenize --manifest "
            "MANIFEST --prune` removes them",
            highlight=False,
            markup=False,
        )


def _fused(choices: Any) -> str:
    layers = getattr(choices, "fused_lora_layers", 0)
    grouped = getattr(choices, "grouped_lora_layers", 0)
    if not layers:
        return ""
    return f", {layers} layers fused" + (f", {grouped} grouped by input" if grouped else "")


def _loss_name(fused: str) -> str:
    if fused == "off":
        return "standard (full logits)"
    where = ", the LM head on trained tokens only" if fused_loss.TRAINED_ROWS_ONLY else ""
    return f"fused linear cross-entropy ({fused}{where})"


def _isolation(verdict: str, packing: bool, kernel: str) -> str:
    if verdict != ISOLATED:
        return f" ({verdict})"
    # flex compiles for each shape: the probe ran sdpa, whose mask comes from the same positions
    how = f" with {MASK_PROXY[kernel]}'s mask" if kernel in MASK_PROXY else ""
    return f" (causal{', packed examples apart' if packing else ''}: checked{how})"


def print_decisions(
    console: Console, resolved: ResolvedConfig, choices: ModelChoices, trainable: int, total: int
) -> None:
    """Model, kernels, precision, adapter and every note of the resolution."""
    mixed = "bf16" if resolved.bf16 else "fp16" if resolved.fp16 else "fp32"
    init = " (random init)" if resolved.init == "random" else ""
    console.print(
        labelled("model", "bold", f"{resolved.base_model}{init} on {choices.device}", WIDTH)
    )
    console.print(
        f"[bold]kernels[/bold]   attention {choices.attn_implementation}"
        f"{_isolation(choices.attention_isolation, resolved.packing, choices.attn_implementation)}"
        ", weights "
        f"{choices.dtype}, mixed precision {mixed}, TF32 {'on' if choices.tf32 else 'off'}, "
        f"quantization {choices.quantization}",
        highlight=False,
    )
    compiled = f"{choices.compiled_layers} layers" if choices.compiled_layers else "off"
    console.print(
        f"[bold]step[/bold]      loss {_loss_name(choices.fused_loss)}, adapters compute in "
        f"{choices.adapter_precision} (fp32 weights{_fused(choices)}), Liger layers "
        f"{'on' if choices.liger_kernels else 'off'}, torch.compile {compiled}",
        highlight=False,
    )
    kind = "dora" if resolved.use_dora else resolved.adapter_type
    console.print("[bold]adapter[/bold]   ", end="")
    shape = (  # IA3 scales activations: no rank, alpha or dropout
        ""
        if kind == "ia3"
        else f" r={resolved.rank} alpha={resolved.alpha:g} dropout={resolved.dropout:g}"
        + (" rslora (alpha / sqrt(r))" if resolved.use_rslora else "")
    )
    console.print(
        f"{kind}{shape} targets={resolved.target_modules}: "
        f"{trainable:,} trainable of {total:,} ({100 * trainable / max(total, 1):.3f}%)",
        highlight=False,
        markup=False,
    )
    console.print(
        f"[bold]schedule[/bold]  batch {resolved.batch_size} x accumulation "
        f"{resolved.gradient_accumulation_steps}, lr {resolved.learning_rate:g} "
        f"{resolved.lr_scheduler}, optim {resolved.optim}, seq {resolved.max_seq_length}, "
        f"packing {'on' if resolved.packing else 'off'}"
        + (f", NEFTune alpha {alpha:g}" if (alpha := resolved.neftune_noise_alpha) else "")
        + (f", label smoothing {f:g}" if (f := resolved.label_smoothing_factor) else ""),
        highlight=False,
    )
    for note in [*resolved.notes, *choices.notes]:
        console.print(labelled("note", "yellow", note, WIDTH))


def window_line(record: dict[str, Any], max_steps: int | None, on_cpu: bool = False) -> str:
    """One logging window as a console line (`on_cpu`: its peak memory is the process's
    resident set, `rss`, not a GPU's allocated memory, `mem`)."""
    parts = [f"step {record['step']}" + (f"/{max_steps}" if max_steps else "")]
    if record.get("loss") is not None:
        parts.append(f"loss {record['loss']:.4g}")
    if record.get("learning_rate") is not None:
        parts.append(f"lr {record['learning_rate']:.3g}")
    if record.get("grad_norm") is not None:
        parts.append(f"grad-norm {record['grad_norm']:.3g}")
    parts.append(f"{record['tokens_per_s']:,.0f} tok/s")
    parts.append(f"{record['samples_per_s']:,.1f} samples/s")
    parts.append(f"data-wait {100 * record['data_wait_fraction']:.1f}%")
    if record.get("peak_memory_gb") is not None:
        parts.append(f"{'rss' if on_cpu else 'mem'} {record['peak_memory_gb']:.2f} GB")
    if record.get("mfu") is not None:
        parts.append(f"MFU {100 * record['mfu']:.1f}%")
    if record.get("allocator_flushes"):
        parts.append(f"allocator flushes {record['allocator_flushes']}")
    return "  ".join(parts + _excluded(record))


def _excluded(figures: dict[str, Any]) -> list[str]:
    """The evaluation and checkpoint-save seconds a window (or the run) left out of its rates."""
    took = {k: figures.get(k) for k in ("eval_s", "save_s")}
    return [
        f"{name} {f'{took[key]:.1f}' if took[key] >= 0.05 else '<0.1'} s excluded"
        for key, name in (("eval_s", "evaluation"), ("save_s", "saves"))
        if isinstance(took[key], float | int) and took[key] > 0
    ]


class ProgressCallback(TrainerCallback):
    """Progress bar over optimizer steps, and one over the batches of each evaluation while it
    runs (an evaluation of a large validation set takes minutes); results are printed above."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.progress: Progress | None = None
        self.task: Any = None
        self.eval_task: Any = None
        self.max_steps: int | None = None

    def on_train_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        self.max_steps = state.max_steps
        self.progress = Progress(
            TextColumn("{task.description:<10}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=self.console,
            transient=True,
        )
        self.progress.start()
        self.task = self.progress.add_task(
            "training", total=state.max_steps, completed=state.global_step
        )

    def on_prediction_step(
        self, args: Any, state: Any, control: Any, eval_dataloader: Any = None, **kw: Any
    ) -> None:
        if self.progress is None:
            return
        if self.eval_task is None:
            try:
                total = len(eval_dataloader) if eval_dataloader is not None else None
            except TypeError:  # an iterable without a length
                total = None
            self.eval_task = self.progress.add_task("evaluating", total=total)
        self.progress.advance(self.eval_task)

    def on_evaluate(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        if self.progress is not None and self.eval_task is not None:
            self.progress.remove_task(self.eval_task)
        self.eval_task = None

    def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        if self.progress is not None:
            self.progress.update(self.task, completed=state.global_step)

    def on_log(
        self, args: Any, state: Any, control: Any, logs: dict | None = None, **kw: Any
    ) -> None:
        if logs and "eval_loss" in logs:
            self.console.print(
                f"eval      step {state.global_step}  eval_loss {logs['eval_loss']:.4g}"
                + (
                    f"  token accuracy {logs['eval_token_accuracy']:.1%}"
                    if "eval_token_accuracy" in logs
                    else ""
                )
                + ("  (before training)" if state.global_step == 0 else ""),
                highlight=False,
            )
            if tasks := task_results(logs):  # a multi_task expert's, task by task
                self.console.print(
                    f"          by task: {task_line(tasks)}", highlight=False, markup=False
                )

    def on_train_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        if self.progress is not None:
            self.progress.stop()
            self.progress = None
        self.eval_task = None


class RichReporter:
    """The train.run.Reporter of the command line."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.progress = ProgressCallback(console)
        self.on_cpu = False  # where the model runs, known once it is loaded

    def data(self, data: PreparedData) -> None:
        print_data(self.console, data.stats, data.status, data.reason, data.cache_dir, data.earlier)

    def decisions(
        self, resolved: ResolvedConfig, choices: ModelChoices, params: tuple[int, int]
    ) -> None:
        print_decisions(self.console, resolved, choices, *params)
        self.on_cpu = choices.device == "cpu"

    def note(self, text: str) -> None:
        self.console.print(labelled("note", "yellow", text, WIDTH))

    def window(self, record: dict[str, Any]) -> None:
        line = window_line(record, self.progress.max_steps, self.on_cpu)
        self.console.print(line, highlight=False)

    def callbacks(self) -> list[TrainerCallback]:
        return [self.progress]

    def build_progress(self) -> BuildBar:
        return BuildBar()


def _quoted(text: str) -> str:
    """A value of a command to copy: quoted for the shell, control characters escaped."""
    return escaped(shlex.quote(text))


def _status_line(result: TrainResult) -> str:
    """The run's first closing line (rich markup): how it ended, its steps, speed and loss."""
    summary, status = result.summary, result.status
    loss = "-" if summary["final_loss"] is None else f"{summary['final_loss']:.4g}"
    ran, total = summary.get("steps_this_run", summary["steps"]), summary["steps"]
    if ran == 0 and status == "completed" and result.resumed_from is not None:
        saved = escaped(result.resumed_from.name)  # killed before its final save
        return (
            f"[bold]{status}[/bold]  step {total} of {total} was in {saved}: its adapter saved "
            f"as the final one, no step trained; final loss {loss}"
        )
    steps = f"{ran} step{'s' * (ran != 1)}"
    steps += "" if ran == total else f" this run (step {total} reached)"
    steady = summary.get("steady") or {}
    rate = steady.get("tokens_per_s")
    after = (  # the first window's start-up (compilation, autotuning) aside, where it shows
        f" ({rate:,.0f} after step {steady.get('after_step')})"
        if isinstance(rate, float) and abs(rate - summary["tokens_per_s"]) > 0.05 * rate
        else ""
    )
    apart = f" ({', '.join(_excluded(summary))})" if _excluded(summary) else ""
    return (
        f"[bold]{status}[/bold]  {steps} in {summary['train_runtime_s']:.1f} s{apart}, "
        f"{summary['tokens_per_s']:,.0f} tok/s{after}, "
        f"data-wait {100 * summary['data_wait_fraction']:.1f}%, final loss {loss}"
    )


def print_end(console: Console, result: TrainResult, opts: TrainOptions) -> None:
    """The run's last lines: status, speed, loss, and where to look (or how to resume)."""
    summary, status = result.summary, result.status
    if status == "complete":
        done = f"{escaped(str(result.output_dir))} holds a finished run of {summary['steps']} steps"
        if of := summary.get("stopped_early_of"):
            done += f" (stopped early, of {of}: early_stopping_patience)"
        bigger = f"than {of} " if of else ""
        console.print(
            labelled(
                "complete",
                "bold",
                f"{done}; nothing to resume (give a larger --max-steps {bigger}to train on)",
                WIDTH,
            )
        )
        return
    console.print(_status_line(result), highlight=False)
    if status == "interrupted":
        sets = "".join(f" --set {_quoted(item)}" for item in opts.overrides)
        console.print(
            f"checkpoint saved under {escaped(str(result.output_dir / 'checkpoints'))}; "
            f"continue with:\n  {_launcher()} train --manifest {_quoted(str(opts.manifest))} "
            f"--output {_quoted(str(result.output_dir))}{sets} --resume",
            highlight=False,
            markup=False,
        )
    else:
        console.print(f"wrote {escaped(str(result.output_dir))}", highlight=False, markup=False)
    ship = f"expert-cli package --adapter {_quoted(str(result.output_dir))} --checkpoint best"
    if status == "completed" and (note := lower_loss_note(result.output_dir, "final", ship)):
        console.print(f"note      {note}", highlight=False, markup=False)
    if note := flush_note(summary):
        console.print(labelled("note", "yellow", note, WIDTH))
    picture = result.output_dir / "training.png"
    if picture.is_file():
        console.print(
            f"picture   {escaped(str(picture))} (loss, learning rate, tokens/s, data wait)",
            highlight=False,
            markup=False,
        )


def _launcher() -> str:
    """How to start the run again: on as many processes as this one (a resume on another
    number is refused: every step would take another count of rows)."""
    world = os.environ.get("WORLD_SIZE", "1")
    if not world.isdigit() or int(world) <= 1:
        return "expert-cli"
    per_node = os.environ.get("LOCAL_WORLD_SIZE", world)
    return f"torchrun --nproc_per_node {per_node} -m expert_cli.cli"


def task_line(tasks: dict[str, dict[str, float]]) -> str:
    """A multi_task expert's evaluation, task by task: its loss and token accuracy."""
    return "  ".join(
        f"{escaped(name)} {r['eval_loss']:.4g}"
        + (f" ({r['token_accuracy']:.1%})" if "token_accuracy" in r else "")
        for name, r in tasks.items()
    )
