"""What the steps of a `train` run share: its options and result, the `Reporter` a person
sees it through, and `Run`, the state the recipe in expert_cli.train.run passes from step to
step (with what the run did to its folder, so a run that stops before training can undo it).
"""

from __future__ import annotations

import os
import shutil
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from transformers import TrainerCallback, TrainingArguments

from expert_cli.config.resolve import ResolvedConfig
from expert_cli.data import BuildProgress, PreparedData
from expert_cli.errors import RunError, UserError
from expert_cli.train import distributed
from expert_cli.train.checkpoints import complete_checkpoints, remove_incomplete_checkpoints
from expert_cli.train.folder_guard import FolderLost
from expert_cli.train.memory import Stopped, oom_error, out_of_memory
from expert_cli.train.model import ModelChoices, training_device
from expert_cli.train.run_folder import Previous, disk_full, drop_aside, restore_aside


@dataclass
class TrainOptions:
    """The `train` command's arguments."""

    manifest: Path
    output: Path | None = None
    resume: bool = False
    max_steps: int | None = None
    overrides: list[str] = field(default_factory=list)
    overwrite: bool = False


@dataclass
class TrainResult:
    """How the run ended (completed, interrupted, or complete already: a `--resume` of a
    finished run): `exit_code` 0, or 130/143 after SIGINT/SIGTERM."""

    output_dir: Path
    status: str
    exit_code: int
    summary: dict[str, Any]
    resumed_from: Path | None = None
    is_main: bool = True  # the process that reports and writes (rank 0)


class Reporter(Protocol):
    """What a person sees of a run (the main process calls it; the CLI draws it)."""

    def data(self, data: PreparedData) -> None: ...

    def decisions(
        self, resolved: ResolvedConfig, choices: ModelChoices, params: tuple[int, int]
    ) -> None: ...

    def note(self, text: str) -> None: ...

    def window(self, record: dict[str, Any]) -> None: ...

    def callbacks(self) -> list[TrainerCallback]: ...

    def build_progress(self) -> BuildProgress | None: ...


class Silent:
    """A Reporter that shows nothing (scripts, tests); `callbacks` join the run's own."""

    def __init__(self, callbacks: list[TrainerCallback] | None = None) -> None:
        self._callbacks = list(callbacks or [])

    def data(self, data: PreparedData) -> None:
        return None

    def decisions(
        self, resolved: ResolvedConfig, choices: ModelChoices, params: tuple[int, int]
    ) -> None:
        return None

    def note(self, text: str) -> None:
        return None

    def window(self, record: dict[str, Any]) -> None:
        return None

    def callbacks(self) -> list[TrainerCallback]:
        return self._callbacks

    def build_progress(self) -> BuildProgress | None:
        return None


@dataclass
class Run:
    """What the steps of one run share."""

    resolved: ResolvedConfig
    args: TrainingArguments
    output: Path
    reporter: Reporter
    runtime: dict[str, Any] = field(default_factory=dict)
    complete: Previous | None = None  # --resume of a run that has finished
    source: dict[str, Any] = field(default_factory=dict)  # the manifest as its file holds it
    aside: Path | None = None  # the earlier run's outputs, set aside by --overwrite
    created: Path | None = None  # the outermost folder of --output this run made (if any)
    hold: Any = None  # the lock on the output folder while this process trains in it
    resuming: bool = False  # --resume from a checkpoint of the folder's (known once chosen)

    def on_failure(self, throughput: Any, steps: int, exc: BaseException) -> None:
        """Record "failed" in metrics.json; out of memory is a RunError saying what to change,
        a full disk (after removing the checkpoint it cut short, to make room for that record)
        one naming the folder: exit 1."""
        if isinstance(exc, FolderLost):  # the folder may be another run's now
            raise exc
        full = disk_full(exc, self.output)
        if full and self.is_main:
            remove_incomplete_checkpoints(self.output / "checkpoints")
        throughput.record_failure(steps)
        if out_of_memory(exc):
            args = self.args
            micro, accumulation = args.per_device_train_batch_size, args.gradient_accumulation_steps
            at = Stopped("step", steps, micro, accumulation, self.device)
            raise oom_error(self.resolved, at, self.output) from exc
        if full:
            raise RunError(
                f"no space left on {self.output} (checkpoints and the adapter are written "
                f"there); {self._way_on('free space, then')}"
            ) from exc
        if distributed.peer_lost(exc):  # its own error is the one to read, in its output
            raise RunError(
                f"another process of the run stopped ({type(exc).__name__} in a collective), "
                f"so this one did at step {steps}; "
                f"{self._way_on('continue with the same launcher and')}"
            ) from exc

    def _way_on(self, first: str) -> str:
        """What the folder offers after a failure: its last complete checkpoint to resume
        from, or (none written yet) a new start; "the last complete checkpoint is intact"
        was said of a folder holding none, and --resume then refused."""
        if not self.output.is_dir():  # removed under the run (the main process says so)
            return f"its folder {self.output} is not there now (removed, or on another machine)"
        kept = complete_checkpoints(self.output / "checkpoints")
        if kept:
            return f"its last complete checkpoint, {kept[-1].name}, is intact: {first} --resume"
        return f"no checkpoint was written yet: {first} train again with --overwrite"

    def release(self) -> None:
        """Let another `train` into the folder (this one is done with it)."""
        if self.hold is not None:
            self.hold.release()
            self.hold = None

    def stopped_before_training(self, exc: BaseException) -> None:
        """Undo what the run did to its folder (an earlier run set aside goes back, a folder
        it created goes), and name a full disk (RunError, exit 1)."""
        self.restore_earlier()
        full = disk_full(exc, self.output)
        if self.created is not None and self.is_main:
            shutil.rmtree(self.created, ignore_errors=True)
        if full:
            fresh = self.resolved.init == "random" and not self.resuming  # a resume keeps it
            base = "a random-init base model, " if fresh else ""
            way = (
                "free space, then train again with --resume (the checkpoint is as it was)"
                if self.resuming
                else "free space or choose another --output, then train again"
            )
            raise RunError(
                f"no space left on {self.output} ({base}the run's records and TensorBoard's "
                f"events are written there before training); {way}"
            ) from exc

    def tracker_failed(self, exc: BaseException) -> UserError | None:
        """A tracker of `report_to` that failed as the run started (the failure passed
        through transformers' integrations: an API key not set, no server, a broken install):
        the folder is undone as before training, and the error names the field (it was a
        traceback, and the folder it left refused the next run); None for other failures."""
        frames = traceback.extract_tb(exc.__traceback__)
        inside = f"{os.sep}transformers{os.sep}integrations{os.sep}"
        if not self.resolved.report_to or not any(inside in f.filename for f in frames):
            return None
        self.stopped_before_training(exc)
        said = next(iter(str(exc).splitlines()), "")[:200]  # the tracker's own words, one line
        return UserError(
            f"training.config.report_to: {', '.join(self.resolved.report_to)} failed to start "
            f"({type(exc).__name__}{': ' + said if said else ''}); set it up (an API key, a "
            "server, its environment variables), or remove it from the list"
        )

    def restore_earlier(self) -> None:
        """The run stopped before training: the earlier run's outputs go back."""
        if self.aside is not None and self.is_main:
            restore_aside(self.output, self.aside)
            self.reporter.note("--overwrite: stopped before training; the earlier run is back")
        self.aside = None

    def discard_earlier(self) -> None:
        """Training begins: the earlier run's outputs go for good."""
        if self.aside is not None and self.is_main:
            drop_aside(self.aside)
        self.aside = None

    @property
    def is_main(self) -> bool:
        return self.args.process_index == 0

    @property
    def device(self) -> str:
        return training_device(self.args.local_process_index)
