"""`expert-cli report RUN_DIR`: a run in short, the adapters it keeps (which is lowest, which
`package` ships), and its picture: `training.png` from its metrics.json, four panels: training
and evaluation loss by step, learning rate by step, tokens/s by window, data wait by window.

`train` writes the picture at the end of a run (and of an interrupted one); `report` writes it
again at any time, for example while a run is going on.
"""

from __future__ import annotations

import errno
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from expert_cli.config.sources import TASK_NAME_CHARS
from expert_cli.errors import UserError
from expert_cli.jsontext import finite_number
from expert_cli.paths import (
    output_file_problem,
    picture_problem,
    place_problem,
    shown_path,
)
from expert_cli.train.checkpoints import complete_checkpoints
from expert_cli.train.choice import (
    FINAL,
    KeptAdapter,
    chosen_by,
    default_choice,
    final_adapter_problem,
    kept_adapters,
    lower_loss_note,
    lowest,
    scored,
)
from expert_cli.train.outputs import (
    ADAPTER_WEIGHTS,
    held_by_another,
    read_json_file,
    run_of,
    set_aside_line,
)
from expert_cli.train.run_plot import PLOTTED_MAX, plotted_points, write_training_plot

PLOT_NAME = "training.png"
SHOWN_ADAPTERS = 8  # the last checkpoints listed, besides the lowest and the shipped one


@dataclass(frozen=True)
class AdapterRow:
    """One adapter in the list: its name, step and eval loss, and what is said of it
    ("lowest", "package ships it (who chose it)")."""

    name: str
    step: int | None
    eval_loss: float | None
    marks: tuple[str, ...]


@dataclass(frozen=True)
class AdapterList:
    """The adapters a run keeps (the last SHOWN_ADAPTERS, the lowest and the shipped one),
    how many more it keeps, and (label, text) notes: what `package` ships and how to ship the
    lowest (the last steps of HiveLLM's way: compare the checkpoints, then name one)."""

    rows: tuple[AdapterRow, ...]
    hidden: int
    notes: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class RunReport:
    """What a run's metrics.json says, in short, and where its picture went."""

    run_dir: Path
    status: str
    steps: int
    tokens_per_s: float | None
    final_loss: float | None
    best_eval_loss: float | None
    best_eval_step: int | None
    plot: Path | None
    adapters: AdapterList
    plot_problem: str | None = None  # why RUN_DIR/training.png could not be written
    status_note: str | None = None  # a "running" run whose process is gone, or "completed"
    # one that never saved its final adapter
    base_eval_loss: float | None = None  # eval_on_start's: before the first step
    best_eval_accuracy: float | None = None  # the token accuracy of the best evaluation
    # a multi_task expert's best evaluation, task by task: (loss, token accuracy or None)
    best_eval_tasks: dict[str, tuple[float, float | None]] = field(default_factory=dict)
    chosen_by: str | None = None  # the task whose loss the run's best is chosen by


STOPPED_NOTE = (
    "its metrics say running, but no train on this machine holds the folder: the process "
    "ended without a word (killed, or the machine stopped); "
)
STOPPED_WAYS = (  # with a complete checkpoint, and without one
    "train with the same --output and --resume continues it from its last checkpoint",
    "it wrote no checkpoint to go on from: train again with --overwrite",
)


UNSAVED_NOTE = (
    "its metrics say completed, but the folder holds no final adapter: the process ended "
    "after its last step, before the adapter was saved (or the file was removed)"
)
SAVING_NOTE = "a train on this machine holds the folder and is saving the final adapter"


def read_metrics(run_dir: Path) -> dict[str, Any]:
    """A run folder's metrics.json; UserError for a folder without one."""
    path = run_dir / "metrics.json"
    data = read_json_file(path)
    if not isinstance(data.get("windows"), list):
        run = run_of(run_dir)
        raise UserError(
            set_aside_line(run_dir)
            or (
                f"{run_dir}: a checkpoint of a run; give the run: {run}"
                if run != run_dir.absolute()
                else ""
            )
            or (f"{run_dir}: not there" if not os.path.lexists(run_dir) else "")
            or f"{run_dir}: no readable metrics.json (expected a train output folder)"
        )
    return data


def summarize(run_dir: Path, plot: Path | None = None, replace: bool = False) -> RunReport:
    """The run's status, speed, final and best evaluation loss, and its picture (written when
    `plot` is given; an existing file there is replaced only with `replace`, or when it is the
    run's own training.png, which a report redraws)."""
    data = read_metrics(run_dir)  # first: a RUN_DIR that is no run is named as such
    own = (  # realpath: links followed, and no RuntimeError on a link loop
        plot is not None
        and os.path.realpath(plot.parent) == os.path.realpath(run_dir)
        and plot.name == PLOT_NAME
    )
    problem = None
    label = "the run's picture" if own else "--output"  # the default when none was given
    if plot is not None:  # a suffix check first: --force wrote a PNG over the run's metrics.json
        problem = picture_problem(plot, label)
        problem = problem or output_file_problem(plot, label, replace or own)
        problem = problem or (None if own else place_problem(plot, label))
    if problem:
        raise UserError(problem)
    summary = data.get("summary") if isinstance(data.get("summary"), dict) else {}
    task = chosen_by(run_dir)  # a task's loss the run chooses by, where it does
    records = [scored(r, task) for r in data.get("evals") or []]
    eval_steps, eval_losses = plotted_points(records, "eval_loss")
    evals = list(zip(eval_losses, eval_steps, strict=True))
    trained = [(loss, step) for loss, step in evals if step > 0]  # step 0: before training
    best = min(trained) if trained else None
    base = next((loss for loss, step in evals if step == 0), None)
    accuracy = dict(zip(*plotted_points(records, "token_accuracy"), strict=True))
    best_accuracy = accuracy.get(best[1]) if best else None
    unwritten = None
    if plot is not None:
        try:
            write_training_plot(data, plot)
        except OSError as exc:  # the run's own folder read-only: the summary still stands
            if not own or exc.errno not in (errno.EROFS, errno.EACCES, errno.EPERM):
                raise  # a full disk is exit 1 saying so; an --output was checked before
            unwritten = f"{shown_path(plot)} not written ({exc.strerror or type(exc).__name__})"
            plot = None
    steps = _plausible(summary.get("steps"))
    status, status_note = _status(run_dir, str(summary.get("status", "unknown"))[:40])
    return RunReport(
        run_dir=run_dir,
        status=status,
        steps=int(steps) if steps is not None and steps >= 0 else 0,
        tokens_per_s=_rate(summary.get("tokens_per_s")),
        final_loss=_plausible(summary.get("final_loss")),
        best_eval_loss=best[0] if best else None,
        best_eval_step=int(best[1]) if best else None,
        plot=plot,
        adapters=adapter_list(run_dir, best, base),
        base_eval_loss=base,
        best_eval_accuracy=(
            best_accuracy + 0.0  # a recorded -0.0 shown as 0.0
            if best_accuracy is not None and 0 <= best_accuracy <= 1
            else None
        ),
        plot_problem=unwritten,
        status_note=status_note,
        best_eval_tasks=_tasks_at(records, best[1]) if best else {},
        chosen_by=task,
    )


def _tasks_at(records: list[Any], step: int) -> dict[str, tuple[float, float | None]]:
    """Each task's loss and token accuracy at the evaluation of `step`, as recorded (a name
    of printable characters, numbers a run records)."""
    found = next((r for r in records if isinstance(r, dict) and r.get("step") == step), {})
    tasks = found.get("tasks") if isinstance(found.get("tasks"), dict) else {}
    out: dict[str, tuple[float, float | None]] = {}
    for name, figures in tasks.items():
        loss = _plausible(figures.get("eval_loss")) if isinstance(figures, dict) else None
        if loss is None or not name.isprintable() or not 0 < len(name) <= TASK_NAME_CHARS:
            continue
        accuracy = _plausible(figures.get("token_accuracy"))
        out[name] = (loss, accuracy + 0.0 if accuracy is not None and 0 <= accuracy <= 1 else None)
    return out


def _rate(value: Any) -> float | None:
    """A speed as drawn: plausible and not below zero (a hand edit's -5 tok/s)."""
    number = _plausible(value)
    return number if number is not None and number >= 0 else None


def _plausible(value: Any) -> float | None:
    """A summary number as drawn: finite and of a size a run records (a hand-edited 1e308 was
    printed as a 309-digit tok/s)."""
    number = finite_number(value)
    return number if number is not None and abs(number) <= PLOTTED_MAX else None


def _status(run_dir: Path, written: str) -> tuple[str, str | None]:
    """The run's status and a note, where what metrics.json says is not the whole story: a
    run killed leaves "running" behind, and one killed between the end of training and the
    final save leaves "completed" without the adapter."""
    if written == "running" and not held_by_another(run_dir):  # killed: no word written
        kept = bool(complete_checkpoints(run_dir / "checkpoints"))
        return "stopped", STOPPED_NOTE + STOPPED_WAYS[0 if kept else 1]
    problem = final_adapter_problem(run_dir) if written == "completed" else None
    if problem is None:
        return written, None
    if held_by_another(run_dir):
        return "saving", SAVING_NOTE
    weights = run_dir / ADAPTER_WEIGHTS[0]
    lost = problem if weights.is_file() else UNSAVED_NOTE
    if complete_checkpoints(run_dir / "checkpoints"):
        return "stopped", f"{lost}; train with the same --output and --resume saves it"
    return "stopped", f"{lost}; it keeps no checkpoint to save it from: train again"


def adapter_list(
    run_dir: Path, best_eval: tuple[float, float] | None, base: float | None = None
) -> AdapterList:
    """The adapters `run_dir` keeps and what to say of them; `best_eval`: the lowest eval
    loss of the run after its first step and its step (it may have no checkpoint); `base`:
    the eval loss before it (eval_on_start), which an adapter that helps is below."""
    adapters = kept_adapters(run_dir)
    if not adapters:
        return AdapterList((), 0, ())
    notes: list[tuple[str, str]] = []
    if base is not None and best_eval is not None and best_eval[0] >= base:
        notes.append(
            (
                "note",
                f"no evaluation after the first step is below the eval loss before training "
                f"({base:.4g}, the base's, or init_adapter's): training has not improved on "
                "it on this data",
            )
        )
    try:
        ships, chosen_by = default_choice(run_dir)
    except UserError as exc:
        ships, chosen_by = None, ""
        notes.append(("package", f"cannot tell which adapter it ships: {exc.lines[-1]}"))
    low, who = lowest(adapters), f" ({chosen_by})" if chosen_by else ""
    shown = {a.name for a in adapters[-SHOWN_ADAPTERS:]} | {ships, low.name if low else None}
    rows = tuple(_row(a, low, ships, who) for a in adapters if a.name in shown)
    notes += _ship_notes(run_dir, adapters, ships, who)
    kept_low = low.eval_loss if low and low.eval_loss is not None else math.inf
    if best_eval is not None and best_eval[0] < kept_low:
        step = int(best_eval[1])
        notes.append(
            (
                "note",
                f"the lowest eval loss, {best_eval[0]:.4g} at step {step}, has no checkpoint: "
                + _why_unkept(run_dir, step),
            )
        )
    return AdapterList(rows, len(adapters) - len(rows), tuple(notes))


def _why_unkept(run_dir: Path, step: int) -> str:
    """Why an evaluated step has no complete checkpoint: stopped while saving it, removed by
    save_total_limit, or no save at that step."""
    if (run_dir / "checkpoints" / f"checkpoint-{step}").is_dir():
        return "the run was stopped while saving it (it is not whole)"
    record = read_json_file(run_dir / "manifest.resolved.json")
    every, limit = record.get("save_steps"), record.get("save_total_limit")
    if isinstance(every, int) and every > 0 and step % every == 0 and isinstance(limit, int):
        return (
            f"save_total_limit {limit} removed it since (load_best_model_at_end keeps the best "
            "checkpoint)"
        )
    return "save_steps equal to eval_steps keeps one at each evaluation"


def _row(a: KeptAdapter, low: KeptAdapter | None, ships: str | None, who: str) -> AdapterRow:
    marks = ["lowest"] if low and a.name == low.name else []
    if a.name == ships:
        marks.append(f"package ships it{who}")
    return AdapterRow(a.name, a.step, a.eval_loss, tuple(marks))


def _ship_notes(
    run_dir: Path, adapters: list[KeptAdapter], ships: str | None, who: str
) -> list[tuple[str, str]]:
    """What `package` would ship when the run does not keep it; else how to ship a lower one."""
    if ships is None:
        return []
    if ships not in {a.name for a in adapters}:
        if ships == FINAL:
            why = (
                "which is damaged"
                if (run_dir / ADAPTER_WEIGHTS[0]).is_file()
                else "which the run writes at its end (it is training now)"
                if held_by_another(run_dir)
                else "which the run did not write (it stopped before its end)"
            )
            return [
                (
                    "package",
                    f"ships the final adapter{who}, {why}: --checkpoint NAME ships one it keeps",
                )
            ]
        return [
            (
                "package",
                f"ships {ships}{who}, which the run does not keep: name one it keeps, or final",
            )
        ]
    ship = f"expert-cli package --adapter {shown_path(run_dir)} --checkpoint best"
    note = lower_loss_note(run_dir, ships, ship)
    return [("note", note)] if note else []


def write_run_plot(run_dir: Path) -> Path | None:
    """RUN_DIR/training.png, or None where matplotlib is not installed."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return None
    return write_training_plot(read_metrics(run_dir), run_dir / PLOT_NAME)
