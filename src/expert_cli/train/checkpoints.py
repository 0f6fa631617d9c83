"""Checkpoints a run can continue from.

A checkpoint counts only once its `_COMPLETE` marker is written, after everything else in it,
so one half-written by a kill or a full disk is passed over. A marked checkpoint whose files
were damaged since (truncated by a copy, a bad disk, a hand edit) is passed over too: each file
the Trainer reads on resume is opened far enough to know it is whole (the safetensors header
against the file's size, the zip directory at the end of torch's files, trainer_state.json as
JSON), which costs milliseconds, not a load of the optimizer state. The adapter's weights are
read once, a tensor at a time, to know they are numbers: a checkpoint saved as the run diverged
is passed over as well.
"""

from __future__ import annotations

import re
import shutil
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from peft import get_peft_model_state_dict, set_peft_model_state_dict
from safetensors.torch import load_file
from transformers import TrainerCallback, TrainerState
from transformers.trainer_utils import rotate_checkpoints

from expert_cli.atomic import write_json_atomic
from expert_cli.errors import RunError, UserError
from expert_cli.paths import shown_path
from expert_cli.train import distributed
from expert_cli.train.outputs import ADAPTER_WEIGHTS, COMPLETE, read_json_file, run_of
from expert_cli.weights import (
    non_finite_line,
    non_finite_tensors,
    safetensors_problem,
    shape_text,
    shown_tensor,
    tensor_shapes,
)

# files the Trainer reads to resume that torch.save wrote (zip archives); which of them a
# checkpoint holds depends on the run (FSDP shards the optimizer state into a folder)
ZIPPED = ("optimizer.pt", "scheduler.pt", "rng_state.pth", "scaler.pt", "adapter_model.bin")
# folders DeepSpeed (global_stepN) and FSDP (optimizer_0, pytorch_model_fsdp_0) keep their
# state in: a checkpoint with one holds its weights and optimizer state there
SHARDED = ("global_step", "optimizer_0", "pytorch_model_fsdp")
# what the Trainer reads to continue a run exactly, and skips without a word when missing (the
# optimizer's moments and the schedule would start again from zero)
RESUMED = ("optimizer.pt", "scheduler.pt")
RANK_RNG = re.compile(r"rng_state_(\d+)\.pth$")  # one per process of a run of several


def checkpoint_step(path: Path) -> int | None:
    """N of a `checkpoint-N` folder (ASCII digits only), or None."""
    step = path.name.rsplit("-", 1)[-1]
    return int(step) if step.isascii() and step.isdigit() else None


def complete_checkpoints(checkpoints: Path) -> list[Path]:
    """`checkpoint-N` folders whose marker says they were written whole, by step."""
    if not checkpoints.is_dir():
        return []
    found = []
    for path in checkpoints.glob("checkpoint-*"):
        step = checkpoint_step(path)
        if path.is_dir() and step is not None and (path / COMPLETE).is_file():
            found.append((step, path))
    return [p for _, p in sorted(found)]


def refuse_incomplete(adapter: Path) -> None:
    """UserError when `adapter` is a checkpoint of a run (RUN/checkpoints/checkpoint-N)
    without its `_COMPLETE` marker: written in part when the run was stopped, as `package`
    and `--resume` judge it, so `generate` and `merge` do not load it either."""
    adapter = adapter.absolute()
    if run_of(adapter) == adapter or checkpoint_step(adapter) is None:
        return  # not a checkpoint inside a run folder
    if not adapter.is_dir() or (adapter / COMPLETE).is_file():
        return  # a folder that is not there: adapter_base names it
    kept = ", ".join(p.name for p in complete_checkpoints(adapter.parent)[-8:]) or "none"
    raise UserError(
        f"--adapter {shown_path(adapter)}: no {COMPLETE} marker: the run was stopped while "
        f"writing it, so its files may be partial; give a complete one (the run keeps: {kept})"
    )


def remove_incomplete_checkpoints(checkpoints: Path) -> list[str]:
    """Remove `checkpoint-N` folders without their marker (a resume passes them over anyway):
    after a full disk this frees the space to record how the run ended."""
    complete = set(complete_checkpoints(checkpoints))
    removed = []
    for path in checkpoints.glob("checkpoint-*") if checkpoints.is_dir() else []:
        if path.is_dir() and path not in complete:
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path.name)
    return removed


def _sharded(path: Path) -> bool:
    """Whether the checkpoint keeps its state in DeepSpeed's or FSDP's folders."""
    return any(child.name.startswith(SHARDED) for child in path.iterdir())


def checkpoint_problem(path: Path) -> str | None:
    """What in a marked checkpoint is missing or damaged (the first file found), or None."""
    if path.is_symlink():
        return "is a link to another folder, not a checkpoint this run wrote"
    state = read_json_file(path / "trainer_state.json")
    if not isinstance(state.get("global_step"), int):
        return "trainer_state.json is missing or not the Trainer's state"
    step = checkpoint_step(path)
    if step is not None and state["global_step"] != step:  # renamed, or another run's copy
        return "trainer_state.json is of another step than the folder's name"
    adapter = path / "adapter_model.safetensors"
    weights = adapter.is_file() or (path / "adapter_model.bin").is_file()
    if not weights and not _sharded(path):
        return "adapter_model.safetensors is missing (the adapter's weights)"
    if adapter.is_file() and (problem := safetensors_problem(adapter)):
        return problem
    if adapter.is_file() and (bad := non_finite_tensors(adapter)):
        return f"adapter_model.safetensors: {non_finite_line(bad)} (saved as the run diverged)"
    for name in ZIPPED:
        file = path / name
        if not file.is_file():
            continue
        try:
            with zipfile.ZipFile(file):
                pass
        except (zipfile.BadZipFile, OSError):
            return f"{name} is damaged (cut short)"
    return None


@dataclass(frozen=True)
class ResumePoint:
    """The checkpoint a resumed run continues from, and the newer ones it passed over."""

    checkpoint: Path
    passed_over: tuple[str, ...] = ()


def sound_checkpoints(checkpoints: Path) -> list[Path]:
    """The complete checkpoints with nothing missing or damaged (checkpoint_problem), by step."""
    return [p for p in complete_checkpoints(checkpoints) if checkpoint_problem(p) is None]


def resume_problem(path: Path) -> str | None:
    """What a sound checkpoint lacks to continue its run exactly (the optimizer's and the
    schedule's state, the random generators'), which the Trainer would pass over in silence;
    None for DeepSpeed's and FSDP's checkpoints, which keep theirs in their own folders. A
    checkpoint without them still ships (package, merge)."""
    if _sharded(path):
        return None
    for name in RESUMED:
        if not (path / name).is_file():
            return f"{name} is missing (the run would go on with its state started again)"
    if not any(path.glob("rng_state*.pth")):
        return "rng_state.pth is missing (the run would not draw what it would have drawn)"
    ranks = sorted(int(m[1]) for p in path.glob("rng_state_*.pth") if (m := RANK_RNG.match(p.name)))
    if ranks and ranks != list(range(ranks[-1] + 1)):
        missing = sorted(set(range(ranks[-1] + 1)) - set(ranks))
        return (
            f"rng_state_{missing[0]}.pth is missing (that process would not draw what it "
            "would have drawn)"
        )
    batch = read_json_file(path / "trainer_state.json").get("train_batch_size")
    if not isinstance(batch, int) or isinstance(batch, bool) or batch < 1:
        return "trainer_state.json holds no train_batch_size (not the Trainer's whole state)"
    for file in [*(path / n for n in (*RESUMED, "scaler.pt")), *path.glob("rng_state*.pth")]:
        if file.is_file() and (damage := _unsound_archive(file)):
            return f"{file.name} is damaged ({damage}): the run cannot go on from its state"
    return None


def _unsound_archive(file: Path) -> str | None:
    """Why a torch archive's bytes are not what was saved (each member's checksum read
    through: damage inside, not only a file cut short), or None."""
    try:
        with zipfile.ZipFile(file) as archive:
            return None if archive.testzip() is None else "its bytes fail their checksum"
    except (zipfile.BadZipFile, OSError, EOFError, ValueError, NotImplementedError):
        return "cut short or not a torch archive"


def resume_point(checkpoints: Path) -> ResumePoint:
    """The newest complete, undamaged checkpoint with what a resume reads; UserError when
    there is none."""
    complete = complete_checkpoints(checkpoints)
    passed_over = []
    for path in reversed(complete):
        problem = checkpoint_problem(path) or resume_problem(path)
        if problem is None:
            return ResumePoint(path, tuple(passed_over))
        passed_over.append(f"{path.name}: {problem}")
    partial = (
        sorted(p.name for p in checkpoints.glob("checkpoint-*") if p.is_dir() and p not in complete)
        if checkpoints.is_dir()
        else []
    )
    detail = [f"{name} not written whole" for name in partial] + passed_over
    shown = f" ({'; '.join(detail)})" if detail else ""
    unmarked = (  # whole, a run of the first day's versions: they wrote no marker
        f"; a checkpoint without {COMPLETE} was cut short while written, or written by an "
        f"expert-cli of before 2026-11-23, which marked none: where so, an empty {COMPLETE} "
        "file put in it lets --resume check the rest"
        if partial
        else ""
    )
    raise UserError(
        f"--resume: no checkpoint to resume from under {checkpoints}{shown}; checkpoint-N "
        f"folders are written every save_steps and on Ctrl-C{unmarked}; without one, start "
        "again with --overwrite"
    )


def resumable(checkpoints: Path) -> bool:
    """Whether --resume finds a checkpoint to go on from under `checkpoints` (resume_point)."""
    try:
        resume_point(checkpoints)
    except UserError:
        return False
    return True


def refuse_pruned(checkpoint: Path, adapter_type: str) -> None:
    """An AdaLoRA checkpoint written after its ranks were first pruned (its adapter_config.json
    holds a `rank_pattern`) cannot be resumed: the run builds the adapter at its initial rank,
    which the pruned weights do not fit (a size-mismatch traceback), and the rank allocator's
    importance scores are not in the checkpoint."""
    if adapter_type != "adalora":
        return
    if read_json_file(checkpoint / "adapter_config.json").get("rank_pattern"):
        raise UserError(
            f"--resume: {checkpoint.name} holds an AdaLoRA adapter whose ranks were pruned, "
            "which training cannot continue from (its rank allocator's state is not saved); "
            f"ship or try it as it is (package --checkpoint {checkpoint.name}), or train again"
        )


def recorded_feedforward(checkpoint: Path | None, resolved: Any) -> list[str] | None:
    """IA3's feed-forward layers as `checkpoint` recorded training them, for a resume whose
    manifest names none (None: a new run's choice stands). A run that began before IA3 took
    down_proj on model types peft names none for scaled no layer at its input; a resume that
    took down_proj then could not load its weights."""
    if checkpoint is None or resolved.adapter_type != "ia3" or resolved.feedforward_modules:
        return None
    names = read_json_file(checkpoint / "adapter_config.json").get("feedforward_modules")
    if isinstance(names, list) and all(isinstance(n, str) for n in names):
        return names
    return None


def unfit_problem(peft_model: Any, checkpoint: Path | None) -> str | None:
    """Whether the adapter in `checkpoint` fits the one this run built: every tensor both
    hold of one shape (another IA3 feed-forward choice, a base replaced under its name: the
    Trainer's load was a size-mismatch traceback). None where it fits or is not read here."""
    # a damaged checkpoint is passed over by resume_point
    if checkpoint is None or not (shapes := tensor_shapes(checkpoint / ADAPTER_WEIGHTS[0])):
        return None
    built = get_peft_model_state_dict(peft_model)
    for name, shape in shapes.items():
        if name in built and (own := tuple(built[name].shape)) != shape:
            return (
                f"--resume: {checkpoint.name} does not fit the adapter this run builds "
                f"({shown_tensor(name)} is {shape_text(shape)} there, {shape_text(own)} here); "
                "resume with the settings and base model it was trained with, or start again "
                "with --overwrite"
            )
    return None


class CheckpointMarker(TrainerCallback):
    """Writes `_COMPLETE` into each checkpoint once the Trainer has finished writing it; on a
    resume, finds the best checkpoint of a run folder moved since (`best_checkpoint`: the
    Trainer forgets a best it cannot find at its old path, then ships the last weights and
    may rotate the best away). It removes the checkpoints over `save_total_limit` once the
    new one is marked (ExpertTrainer keeps the Trainer from removing them before), by the
    limit the run began with (an interrupt's save lifts the Trainer's limit for the end of
    training, not for this save)."""

    def __init__(self) -> None:
        self.limit: int | None = None
        self.began = False

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.limit, self.began = args.save_total_limit, True
        if not (
            args.load_best_model_at_end and state.global_step and not state.best_model_checkpoint
        ):
            return
        resume = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        try:
            saved = TrainerState.load_from_json(str(resume / "trainer_state.json"))
        except (OSError, ValueError, TypeError):
            return
        if (found := best_checkpoint(saved, resume)) is not None:
            state.best_model_checkpoint = str(found)

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        # every process has written its part (its random generators' rng_state_N.pth) before
        # the checkpoint is marked whole: without the wait a resume could read a checkpoint
        # marked complete that lacked another rank's file, and went on drawing other numbers
        distributed.barrier()
        if not state.is_world_process_zero:
            return
        folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        if folder.is_dir():
            write_json_atomic(folder / COMPLETE, {"step": state.global_step})
            # the older checkpoints go once this one is whole (the Trainer removed them
            # first: a kill in between left no checkpoint to resume from)
            limit = self.limit if self.began else args.save_total_limit
            # by step, not by the folders' times (a checkpoint copied with its time from a
            # machine whose clock ran ahead was kept as the newest, and each new one removed)
            rotate_checkpoints(args.output_dir, limit, state.best_model_checkpoint)


def finished_from(trainer: Any, resume: Path | None) -> bool:
    """Whether `resume` already holds the run's last step (a run killed between its last
    checkpoint and its final save): then its adapter (with load_best_model_at_end, the best
    checkpoint's) is put into the trainer's model and its state taken, so the run is saved
    as it ended. Resumed, the Trainer trained one step more (at a learning rate of 0, with
    an evaluation and a checkpoint of its own). Under DDP each process reads the whole
    adapter (`run` trains unless every process found the run finished); the sharded
    checkpoints of FSDP and DeepSpeed are left to the Trainer."""
    sharded = getattr(trainer, "is_fsdp_enabled", False) or getattr(
        trainer, "is_deepspeed_enabled", False
    )
    if resume is None or sharded:
        return False
    if getattr(trainer.model, "peft_type", None) == "ADALORA":
        return False  # its pruned ranks need the model rebuilt: left to the Trainer
    try:
        state = TrainerState.load_from_json(str(resume / "trainer_state.json"))
    except (OSError, ValueError, TypeError):
        return False
    last = trainer.args.max_steps if trainer.args.max_steps > 0 else state.max_steps
    if not last or state.global_step < last:
        return False
    best = best_checkpoint(state, resume) if trainer.args.load_best_model_at_end else None
    folder = best or resume
    if not (folder / ADAPTER_WEIGHTS[0]).is_file():
        return False
    loaded = set_peft_model_state_dict(trainer.model, load_file(str(folder / ADAPTER_WEIGHTS[0])))
    if getattr(loaded, "unexpected_keys", None):
        raise RunError(f"{shown_path(folder)}: its adapter does not fit the run's model")
    trainer.state = state
    if trainer.args.should_save:  # a kill between its marker and the rotation left others
        rotate_checkpoints(
            trainer.args.output_dir, trainer.args.save_total_limit, str(best) if best else None
        )
    return True


def best_checkpoint(state: Any, resume: Path) -> Path | None:
    """The best checkpoint `state` names, found beside `resume` (the state holds the path the
    run had when it was saved: a run folder moved since names a folder that is gone, and the
    last checkpoint was shipped as the best); None, and the state's name cleared so that the
    step recorded is the one saved, when it is not there."""
    named = getattr(state, "best_model_checkpoint", None)
    if not named:
        return None
    here = resume.parent / Path(named).name
    if here.is_dir():
        state.best_model_checkpoint = str(here)
        return here
    state.best_model_checkpoint = None
    return None
