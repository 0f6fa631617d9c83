"""Which adapter of a run `package`, `export-gguf` and `export-hub` ship: the run's final
adapter, or one of its complete checkpoints with sound weights, with a UserError naming who
chose it (the `--checkpoint` option, the manifest's `training.packaging_checkpoint`) where it
cannot be."""

from __future__ import annotations

from pathlib import Path

from expert_cli.errors import UserError
from expert_cli.paths import shown_path
from expert_cli.train.checkpoints import complete_checkpoints, sound_checkpoints
from expert_cli.train.choice import chosen_by_best, lower_loss_note
from expert_cli.train.outputs import (
    adapter_base,
    held_by_another,
    run_of,
    unfinished,
    writing_now,
)


def checkpoint_folder(run_dir: Path, name: str, chosen_by: str) -> Path:
    """The folder of a complete `checkpoint-N` of the run with sound adapter weights;
    UserError naming who chose it and listing the ones the run holds."""
    complete = complete_checkpoints(run_dir / "checkpoints")
    folder = run_dir / "checkpoints" / name
    kept = ", ".join(p.name for p in complete[-8:]) or "none"
    if folder not in complete:
        raise UserError(
            f"{chosen_by}: {name}: {shown_path(run_dir / 'checkpoints')} holds no complete "
            f"{name} (it holds: {kept}); name one of those, or final"
        )
    try:
        adapter_base(folder, base_needed=False)  # a checkpoint holding NaN is refused
    except UserError as exc:
        sound = [p for p in sound_checkpoints(run_dir / "checkpoints") if p != folder]
        if sound:
            hint = f"choose another of: {', '.join(p.name for p in sound[-8:])}"
        else:  # final only where the run wrote it
            final = (run_dir / "adapter_config.json").is_file()
            hint = "the run holds no other sound one" + ("; name final" if final else "")
        raise UserError([*exc.lines[:-1], f"{exc.lines[-1]} ({chosen_by}: {hint})"]) from None
    return folder


def final_problem(run_dir: Path) -> UserError | None:
    """Why the run folder's own adapter cannot ship (None: it can): a run that diverged may
    still ship one of its checkpoints. UserError for a checkpoint given as the run, or a
    folder that is not there."""
    if (run := run_of(run_dir)) != run_dir:
        raise UserError(
            f"--adapter {shown_path(run_dir)}: a checkpoint of a run; give the run and the "
            f"checkpoint: --adapter {shown_path(run)} --checkpoint {run_dir.name}"
        )
    try:
        adapter_base(run_dir, base_needed=False)  # UserError when the folder has no adapter
    except UserError as exc:
        if not run_dir.is_dir():
            raise
        if (
            complete_checkpoints(run_dir / "checkpoints")
            and not (run_dir / "adapter_config.json").exists()
        ):
            if held_by_another(run_dir):  # a live train's: its adapter comes at its end
                return UserError(writing_now(run_dir))
            return UserError(  # train's folder: a run stopped before its end (generate's words)
                f"--adapter {shown_path(run_dir)}: {unfinished(run_dir)}; finish it with "
                "`expert-cli train` with the same --output and --resume"
            )
        return exc
    return None


def shipped(
    run_dir: Path, chosen: tuple[str, str], final_problem: UserError | None
) -> tuple[Path, list[str]]:
    """The folder of the adapter chosen (`chosen`: its name and who chose it), and notes."""
    name, chosen_by = chosen
    notes = [note] if (note := lower_loss_note(run_dir, name)) else []
    if name == "final" and final_problem:
        held = [p.name for p in complete_checkpoints(run_dir / "checkpoints")[-8:]]
        ship = f"; ship a checkpoint: --checkpoint NAME ({', '.join(held)})" if held else ""
        raise UserError([*final_problem.lines[:-1], final_problem.lines[-1] + ship])
    if name != "final":
        notes.append(f"shipped {name} ({chosen_by}), not the run's final adapter")
        return checkpoint_folder(run_dir, name, chosen_by), notes
    if chosen_by_best(chosen_by):
        notes.append(f"shipped the run's final adapter ({chosen_by})")
    if held_by_another(run_dir):  # `train --resume` of a finished run: a new final comes later
        notes.append(
            "a train is writing this run now (--resume): its final adapter here is the one "
            "from before it, and is replaced when that train ends; ship again then for the new"
        )
    return run_dir, notes


def inside_run_folders(path: Path, run_dir: Path) -> str | None:
    """Why `path`, an --output, cannot be under the run's checkpoints/, base_model/ or runs/
    (None: it is not): train writes them and `--overwrite` sets them aside whole, with what a
    user put there; a folder in checkpoints/ named like one is taken for a checkpoint too,
    and a resumed run's rotation would remove a real one in its place."""
    for name in ("checkpoints", "base_model", "runs"):
        try:
            inside = path.resolve().is_relative_to((run_dir / name).resolve())
        except (OSError, RuntimeError, ValueError):
            continue
        if inside:
            return (
                f"--output {shown_path(path)}: is inside the run's {name}/, which the run keeps "
                "to itself (train writes it, --overwrite sets it aside whole); write it beside "
                "the run"
            )
    return None


def as_exported(line: str) -> str:
    """A line of `shipped`'s (or of the choice's notes), as said of an export."""
    line = line.replace("shipped", "exported", 1).replace(" ships it", " exports it")
    line = line.replace("; ship a checkpoint:", "; export a checkpoint:")
    return line.replace("ship again then for the new", "export again then for the new")
