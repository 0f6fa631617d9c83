"""Whose work is in an output folder, and what `train` may do with it.

A folder that holds a run's outputs is never written over silently: `train` into it refuses
unless `--resume` (the same configuration, continued from its last complete checkpoint) or
`--overwrite` (the old run's outputs replaced, nothing else in the folder touched). The old
outputs are only set aside (`.overwritten-<pid>`) until the new run has its data, model and
adapter and begins training; a run that fails or is stopped before that puts them back. Which
checkpoint a resumed run continues from is decided in expert_cli.train.checkpoints.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from expert_cli.atomic import signals_held
from expert_cli.config.choices import DEFAULT_WARMUP_RATIO
from expert_cli.config.resolve import ResolvedConfig
from expert_cli.config.training_config import MAX_STEPS
from expert_cli.errors import UserError
from expert_cli.paths import RUN_OUTPUTS
from expert_cli.train.checkpoints import (
    checkpoint_step,
    refuse_pruned,
    resumable,
    resume_point,
    sound_checkpoints,
)
from expert_cli.train.choice import final_adapter_whole, final_step
from expert_cli.train.distributed import refuse_world_change
from expert_cli.train.outputs import (
    ASIDE_PREFIX,
    PID,
    process_running,
    read_json_file,
)
from expert_cli.train.same_run import changed_fields, recorded_set_keys

DISK_FULL_BYTES = 64 << 20  # less free space than this after a failed write: the disk is full
# what a run writes into its folder (--overwrite removes these and only these)
# what says a folder holds a run (holds_run) goes back last when a set-aside run is restored
RUN_MARKERS = ("manifest.resolved.json", "metrics.json", "checkpoints")
CHECKPOINT_NAME = re.compile(r"checkpoint-[0-9]{1,12}")
RUN_RECORDS = ("manifest.resolved.json", "metrics.json")  # train writes them before the rest


def holds_run(output: Path) -> bool:
    """Whether `output` holds a run's outputs: its records, or a `checkpoints/checkpoint-N`
    folder. A `checkpoints/` folder of anything else, or an adapter_config.json alone (a
    folder of a user's own, a peft adapter), is not one: `--overwrite` would replace what
    a run never wrote (a README was replaced by peft's model card)."""
    if not output.is_dir():
        return False
    if any((output / name).exists() for name in RUN_RECORDS):
        return True
    checkpoints = output / "checkpoints"
    try:
        return checkpoints.is_dir() and any(
            p.is_dir() and CHECKPOINT_NAME.fullmatch(p.name) for p in checkpoints.iterdir()
        )
    except OSError:  # cannot be listed: taken as a run's, so nothing in it is replaced unasked
        return True


@dataclass(frozen=True)
class Previous:
    """The run an output folder already holds."""

    status: str  # completed | interrupted | diverged | failed | running (killed) | unknown
    steps: int
    config: dict[str, Any]
    planned: int | None = None  # the steps an early-stopped run was given (it stopped before)


KNOWN_STATUSES = ("completed", "interrupted", "diverged", "failed", "running")


def previous_run(output: Path) -> Previous | None:
    """What the folder holds, or None when it holds no run's outputs."""
    if not holds_run(output):
        return None
    metrics = read_json_file(output / "metrics.json").get("summary")
    metrics = metrics if isinstance(metrics, dict) else {}  # a hand-edited file may hold anything
    status = metrics.get("status")
    status = status if isinstance(status, str) and status in KNOWN_STATUSES else "unknown"
    if status == "completed" and not final_adapter_whole(output):  # missing, or damaged
        status = "unknown"
    config = read_json_file(output / "manifest.resolved.json")
    steps = metrics.get("steps")
    plausible = isinstance(steps, int) and not isinstance(steps, bool) and 0 <= steps <= MAX_STEPS
    stopped = metrics.get("stopped_early")
    planned = stopped.get("of") if isinstance(stopped, dict) else None
    planned = planned if _steps(planned) else None
    return Previous(status=status, steps=steps if plausible else 0, config=config, planned=planned)


MAX_STEPS_KEY = "max_steps"  # runtime: the steps a run began with (None: its epochs)


def resumed_max_steps(
    output: Path, resume: bool, asked: int | None, resolved: ResolvedConfig
) -> tuple[int | None, str]:
    """The optimizer steps a run trains to (None: its epochs), and a note: `--max-steps`
    (`asked`), else the manifest's max_steps. A --resume without either keeps the length the
    run began with (the learning-rate schedule is built for the run's length; without it a
    40-step run resumed as a 118-step one, its rate jumping back up); another one is said to
    rebuild the schedule."""
    named = "--max-steps" if asked is not None else "max_steps"
    record = read_json_file(output / "manifest.resolved.json") if resume else {}
    if asked is None and resolved.max_steps > 0 and resolved.max_steps != record.get("max_steps"):
        asked = resolved.max_steps  # the manifest's (a --set's), changed since the run began
    runtime = record.get("runtime")
    if not isinstance(runtime, dict) or MAX_STEPS_KEY not in runtime:
        return asked, ""
    # the steps it began with; a run recorded before the manifest's max_steps counted: those
    began = next((n for n in (runtime[MAX_STEPS_KEY], record.get("max_steps")) if _steps(n)), None)
    if asked is None:
        kept = f"--resume: {began} steps, the length the run was last given (its schedule"
        return began, f"{kept} stays)" if began else ""
    if (done := final_step(output)) is not None and asked <= done:
        return asked, ""  # a finished run with nothing left to train: nothing to rebuild
    if asked != (began or _epochs_length(output)):  # epochs that came to `asked`: the same
        was = f"{began} steps" if began else "the manifest's epochs"
        return asked, (
            f"{named} {asked}: the run began with {was}; the learning-rate schedule is "
            "built again for the new length"
        )
    return asked, ""


def _epochs_length(output: Path) -> int | None:
    """The optimizer steps a run's epochs came to, as its newest sound checkpoint's state
    records them (the length its schedule was built for); None where none says."""
    held = sound_checkpoints(output / "checkpoints")
    steps = read_json_file(held[-1] / "trainer_state.json").get("max_steps") if held else None
    return steps if _steps(steps) else None


def refuse_occupied(output: Path, previous: Previous) -> None:
    """`train` without --resume or --overwrite into a folder that holds a run."""
    state = {
        "completed": "a finished run",
        "interrupted": "an interrupted run",
        "diverged": "a run that diverged",
    }.get(previous.status, "another run's outputs")
    if previous.status == "diverged":  # --resume would keep the learning rate that diverged
        raise UserError(
            f"--output {output}: holds {state} ({previous.steps} steps); start again there "
            "with --overwrite (with the change its error named), or choose another folder"
        )
    if previous.status == "interrupted" and not resumable(output / "checkpoints"):
        raise UserError(
            f"--output {output}: holds {state} ({previous.steps} steps) with no checkpoint "
            "written whole to resume from; start again there with --overwrite, or choose "
            "another folder"
        )
    raise UserError(
        f"--output {output}: holds {state} ({previous.steps} steps); continue it with "
        "--resume, replace it with --overwrite, or choose another folder"
    )


def refuse_foreign(output: Path) -> None:
    """A folder that holds no run but files a run would write (a repository, a model's
    folder, a user's notes): training there would replace them, so it is refused, with or
    without --overwrite (which replaces only an earlier run's outputs)."""
    existing = next((p for p in (output, *output.parents) if p.exists()), None)
    if existing is not None and not existing.is_dir():
        raise UserError(
            f"--output {output}: {existing} is a file, not a folder; give a new or empty folder"
        )
    if not output.is_dir():
        return
    clash = sorted(name for name in RUN_OUTPUTS if (output / name).exists())
    if clash:
        shown = ", ".join(clash[:4]) + (f" and {len(clash) - 4} more" if len(clash) > 4 else "")
        raise UserError(
            f"--output {output}: holds {shown}, which a run would write, and no earlier run; "
            "choose a new or empty folder"
        )


def _steps(value: Any) -> bool:
    """Whether a recorded value is a run's length in steps."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 < value <= MAX_STEPS


def check_resumable(
    output: Path, previous: Previous | None, resolved: ResolvedConfig, by_steps: bool = False
) -> None:
    """A resumed run continues the same configuration (`by_steps`: its length is a number of
    steps, which its epochs do not change)."""
    if previous is None:
        if not (output / "checkpoints").is_dir():  # a mistyped --output: nothing to go on with
            what = "holds no run" if output.exists() else "is not there"
            raise UserError(
                f"--resume: {output} {what}; give the --output of the run to go on with, or "
                "leave out --resume to begin one there"
            )
        return
    if not previous.config:
        raise UserError(
            f"--resume: {output / 'manifest.resolved.json'} is missing or unreadable, so the "
            "configuration this run would continue cannot be compared with the manifest's; "
            "put the file back, or start again with --overwrite"
        )
    changed = changed_fields(previous.config, resolved, by_steps)
    if changed:
        sets = recorded_set_keys(previous.config)
        began = (
            f" and the --set values it began with (on {', '.join(sets[:6])}: see runtime."
            "overrides in its manifest.resolved.json)"
            if sets
            else ""
        )
        earlier = (  # an earlier version read a written 0 as unset: the default 3% warmup
            "; an expert-cli before 2026-12-07 read warmup_ratio 0 as unset and warmed up for "
            "3%: --set warmup_ratio=0.03 continues the run as it began"
            if previous.config.get("warmup_ratio") == DEFAULT_WARMUP_RATIO
            and resolved.warmup_ratio == resolved.warmup_steps == 0
            else ""
        )
        raise UserError(
            f"--resume: {output} was trained with another configuration (changed: "
            f"{'; '.join(changed)}); resume with the same manifest{began}, or use --overwrite"
            + earlier
        )


def clear_run(output: Path) -> list[str]:
    """Remove the previous run's outputs (only those); the names removed."""
    removed = []
    for name in RUN_OUTPUTS:
        path = output / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.exists() or path.is_symlink():
            path.unlink()
        else:
            continue
        removed.append(name)
    for staging in output.glob(".final-*"):
        shutil.rmtree(staging, ignore_errors=True)
    return removed


def set_aside(output: Path) -> tuple[Path, list[str]]:
    """Move the previous run's outputs into `output/.overwritten-<pid>` (a rename on the same
    disk: instant, and nothing is lost if the new run fails); the folder and the names."""
    aside = output / f"{ASIDE_PREFIX}{os.getpid()}"
    aside.mkdir()
    moved = []
    for name in RUN_OUTPUTS:
        path = output / name
        if path.exists() or path.is_symlink():
            path.rename(aside / name)
            moved.append(name)
    for staging in output.glob(".final-*"):
        shutil.rmtree(staging, ignore_errors=True)
    return aside, moved


def restore_aside(output: Path, aside: Path) -> list[str]:
    """Undo `set_aside`: remove what the new run wrote, put the previous run's outputs back;
    the names restored."""
    clear_run(output)
    restored = []
    # the files that say a folder holds a run go back last: a restore cut short by a kill is
    # still seen as one to finish (`sweep_leftovers`), never as a newer run
    paths = sorted(aside.iterdir(), key=lambda p: (p.name in RUN_MARKERS, p.name))
    with signals_held():
        for path in paths:
            path.rename(output / path.name)
            restored.append(path.name)
        aside.rmdir()
    return restored


def drop_aside(aside: Path) -> None:
    """The new run is under way: the previous run's outputs go for good."""
    shutil.rmtree(aside, ignore_errors=True)


def disk_full(exc: BaseException, where: Path) -> bool:
    """Whether `exc` is a write that failed for want of space (raised as OSError 28 by Python,
    as a bare Exception by the tokenizers library, as "unexpected pos" by torch's writer)."""
    message = str(exc)
    if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
        return True
    if "No space left on device" in message or "os error 28" in message:
        return True
    if isinstance(exc, RuntimeError) and "unexpected pos" in message:
        try:
            return shutil.disk_usage(where).free < DISK_FULL_BYTES
        except OSError:
            return False
    return False


def sweep_leftovers(output: Path) -> list[str]:
    """Remove what killed runs left in `output`: staging folders (`.final-<pid>`) and
    temporary files (`.tmp-<name>-<pid>`) of processes that no longer run. An earlier run set
    aside by an `--overwrite` that was killed before training began is put back when the
    folder holds no newer run (a later `--overwrite` then sets it aside again), else removed."""
    removed = []
    for path in output.glob(".*-*") if output.is_dir() else []:
        pid = path.name.rsplit("-", 1)[-1]
        ours = path.name.startswith((".final-", ".tmp-", ASIDE_PREFIX))
        if not ours or not PID.fullmatch(pid) or process_running(int(pid)):
            continue
        if path.name.startswith(ASIDE_PREFIX) and path.is_dir() and not path.is_symlink():
            newer = holds_run(output)
            if not newer:
                restore_aside(output, path)
                removed.append(f"{path.name} (an earlier run, put back)")
                continue
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
        removed.append(path.name)
    return removed


@dataclass(frozen=True)
class Decision:
    """What `train` does with its output folder."""

    resume: Path | None = None  # the checkpoint to continue from
    passed_over: tuple[str, ...] = ()  # newer checkpoints found damaged, with what is wrong
    complete: Previous | None = None  # the folder's run is finished: nothing to train
    clear: bool = False  # remove the previous run's outputs first (--overwrite)


def decide(
    output: Path, resolved: ResolvedConfig, resume: bool, overwrite: bool, max_steps: int | None,
    world: int = 1,
) -> Decision:  # fmt: skip
    """Refuse, resume (on the processes it began with), finish at once, or start anew."""
    if resume and overwrite:
        raise UserError("--resume and --overwrite: choose one")
    previous = previous_run(output)
    if not resume:
        if previous is None:
            refuse_foreign(output)
        elif not overwrite:
            refuse_occupied(output, previous)
        return Decision(clear=previous is not None)
    check_resumable(output, previous, resolved, by_steps=max_steps is not None)
    # an early-stopped run is finished at the length it was given (a re-queued --resume
    # trained on past its stop and replaced its adapter, evaluation after evaluation)
    done = max(previous.steps, previous.planned or 0) if previous else 0
    if previous and previous.status == "completed" and (max_steps or 0) <= done:
        return Decision(complete=previous)
    refuse_world_change(previous.config if previous else {}, world, resolved.rows_per_step)
    point = resume_point(output / "checkpoints")
    refuse_pruned(point.checkpoint, resolved.adapter_type)
    reached = checkpoint_step(point.checkpoint) or 0
    if max_steps is not None and reached > max_steps:  # the schedule would end before it
        name = point.checkpoint.name
        raise UserError(
            f"a length of {max_steps} steps (--max-steps, or training.config.max_steps): "
            f"{output} is at step {reached} already ({name}); give more steps to train on, or "
            f"ship it as it is: package --checkpoint {name}"
        )
    return Decision(resume=point.checkpoint, passed_over=point.passed_over)
