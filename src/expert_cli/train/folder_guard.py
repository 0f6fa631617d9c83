"""A `train`'s hold on its run folder: the lock that refuses a second `train` there, and the
guard that stops the run where the folder was removed under it (`rm -rf` of a live run's
folder): its lock file went with it, so a second `train` could take a new lock there and both
would write the one folder, each saying its run was written."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout
from transformers import TrainerCallback

from expert_cli.errors import RunError, UserError
from expert_cli.train.outputs import LOCK_NAME


class Hold:
    """A `train`'s lock on its run folder, and the lock file it holds: a folder removed while
    the run trains (its lock file with it) lets a second `train` take a new lock there, so the
    holder looks for its own file before it writes (train/folder_guard.py)."""

    def __init__(self, lock: FileLock, path: Path) -> None:
        self.lock, self.path = lock, path
        found = os.stat(path)
        self.file = (found.st_dev, found.st_ino)

    def release(self) -> None:
        self.lock.release()

    def lost(self) -> bool:
        """Whether the lock file held is gone from the folder (removed, or another's now)."""
        try:
            found = os.stat(self.path)
        except OSError:
            return True
        return (found.st_dev, found.st_ino) != self.file


def claim(output: Path) -> Hold:
    """This process's hold on its run folder (created when new) while it trains. A second
    `train` into the same folder (from a second terminal, or an --overwrite of a run still
    going) is refused, instead of writing its checkpoints beside the first one's or setting
    that run's outputs aside under it. The hold ends with the process, however it ends."""
    try:
        output.mkdir(parents=True, exist_ok=True)
        lock = FileLock(str(output / LOCK_NAME))
        lock.acquire(timeout=0)
        return Hold(lock, output / LOCK_NAME)
    except Timeout:
        raise busy(output) from None
    except OSError as exc:
        raise UserError(f"--output {output}: cannot be written ({exc.strerror})") from None


def busy(output: Path) -> UserError:
    return UserError(
        f"--output {output}: another `expert-cli train` is writing to this folder; wait for it "
        "to end, or choose another --output"
    )


class FolderLost(RunError):
    """The run's folder went while it trained: nothing more is written there (no "failed"
    record either: the folder may be another run's now)."""


class FolderGuard(TrainerCallback):
    """Stops the run (FolderLost, exit 1) once its folder's lock file went, looked for before
    each thing the run writes there: before training, before each log (the first callback:
    metrics.json and TensorBoard write after it), before each checkpoint (ExpertTrainer asks)
    and at the end, before the final save. Not at every step: the training loop writes
    nothing between them, and a file system call a step is no cost to add there."""

    def __init__(self, hold: Hold, output: Path) -> None:
        self.hold, self.output = hold, output

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.check()

    def on_log(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.check()  # an evaluation's figures too, which may have taken minutes

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.check()

    def check(self) -> None:
        if self.hold.lost():
            raise FolderLost(folder_lost(self.output))


def folder_lost(output: Path) -> str:
    """What a run says whose folder was removed (or its lock file) while it trained."""
    return (
        f"--output {output}: the run folder, or its {LOCK_NAME}, was removed while this run "
        "trained in it (by another program, or by hand); stopped, with nothing more written "
        "there, since another `expert-cli train` may now be writing to it"
    )
