"""TensorBoard's callback, and the `report_to` trackers' callbacks guarded: a tracker that
fails once training has begun (a tracking server that stops answering) stops logging, not the
run."""

from __future__ import annotations

import importlib.util
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any


class GuardedTracker:
    """A tracker's callback (transformers' integration for a `report_to` name) whose failure
    once training has begun stops that tracker, not the run: a tracking server that stopped
    answering was a traceback that lost the steps since the last checkpoint, or, at the end, a
    finished run marked failed with no adapter saved. metrics.json and TensorBoard keep every
    window. A failure as the run starts still stops it (Run.tracker_failed names the field)."""

    def __init__(self, inner: Any, say: Callable[[str], None] | None) -> None:
        self.inner, self.say, self.failed = inner, say, False

    def __getattr__(self, event: str) -> Any:
        method = getattr(self.inner, event)
        if not event.startswith("on_") or not callable(method):
            return method

        def call(args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
            if self.failed:
                return None
            try:
                return method(args, state, control, **kwargs)
            except Exception as exc:
                if not state.global_step:
                    raise
                self.failed = True
                if self.say is not None:
                    name = type(self.inner).__name__.removesuffix("Callback")
                    self.say(
                        f"report_to: {name} failed at step {state.global_step} "
                        f"({type(exc).__name__}); it logs nothing more, the run goes on "
                        "(metrics.json and TensorBoard keep every window)"
                    )
                return None

        self.__dict__[event] = call  # made once: the Trainer calls events at every step
        return call


def guard_trackers(trainer: Any, say: Callable[[str], None] | None) -> None:
    """Each tracker callback the Trainer made for `report_to`, guarded (GuardedTracker);
    expert-cli's own TensorBoard events are not a `report_to` tracker."""
    handler = trainer.callback_handler
    handler.callbacks = [
        GuardedTracker(cb, say)
        if type(cb).__module__.startswith(TRACKER_MODULES)
        and type(cb).__name__ != "TensorBoardCallback"
        else cb
        for cb in handler.callbacks
    ]


TRACKER_MODULES = "transformers.integrations"


def tensorboard(output: Path, say: Callable[[str], None] | None) -> Any:
    """TensorBoard events under OUTPUT/runs where tensorboard is installed, on the main
    process (`say`: its notes; None on the others)."""
    if say is None:
        return None
    if importlib.util.find_spec("tensorboard") is None:
        say(
            "tensorboard is not installed; no TensorBoard events (metrics.json has the same "
            "numbers)"
        )
        return None
    from torch.utils.tensorboard import SummaryWriter
    from transformers.integrations import TensorBoardCallback

    runs = output / "runs"
    held = set(runs.iterdir()) if runs.is_dir() else None
    try:
        writer = SummaryWriter(log_dir=str(runs))
    except OSError:  # a full disk: the events file it began is not left behind, empty
        for path in set(runs.iterdir()) - (held or set()) if runs.is_dir() else ():
            path.unlink(missing_ok=True)
        if held is None:
            shutil.rmtree(runs, ignore_errors=True)
        raise
    return TensorBoardCallback(tb_writer=writer)
