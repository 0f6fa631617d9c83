"""Ctrl-C, SIGTERM and SIGHUP during training: the first signal stops the run at an
optimizer step's end with a checkpoint to resume from (on every process at once), a second
stops it at once."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from typing import Any

from transformers import TrainerCallback
from transformers.trainer_utils import SaveStrategy

from expert_cli.atomic import HANGUP, heard
from expert_cli.config.environment import launched


class Interrupt:
    """SIGINT/SIGTERM set a flag; training stops with a checkpoint at the next step end.

    A second signal stops at once: the handlers from before take it (KeyboardInterrupt for
    SIGINT; for SIGTERM Terminated under `sigterm_raises`, else the default, which ends the
    process). Under a launcher a second signal within LAUNCHER_ECHO seconds of the first is
    the launcher passing on what the process had already had: a terminal's Ctrl-C (or
    Slurm's scancel) reaches every process of the group, torchrun and accelerate launch
    included, which send it on to each worker, and that copy had stopped every worker at once,
    without its checkpoint.
    """

    # SIGHUP: the terminal closed (an ssh session dropped), the usual end of a run started
    # by hand; it ended the process at once, losing the steps since the last checkpoint
    SIGNALS = (signal.SIGINT, signal.SIGTERM, *HANGUP)
    LAUNCHER_ECHO = 5.0

    def __init__(
        self,
        heard: Callable[[str], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.signum: int | None = None
        self._previous: dict[int, Any] = {}
        self.heard = heard  # told at once: a step of many micro-batches can take minutes
        self.ending = False  # the steps trained: a signal waits for the final adapter's save
        self.clock, self._first = clock, 0.0
        self.echo = self.LAUNCHER_ECHO if launched(os.environ) else 0.0

    def _handle(self, signum: int, frame: Any) -> None:
        if self.signum is None:
            self.signum, self._first = signum, self.clock()
            name = signal.Signals(signum).name
            if self.heard is not None and self.ending:
                self.heard(
                    f"{name}: the run has trained its steps and stops once its final adapter "
                    "is saved; the same signal again stops at once, without it"
                )
            elif self.heard is not None:
                self.heard(
                    f"{name}: stopping at the end of this optimizer step, with a checkpoint; "
                    "the same signal again stops at once, without one"
                )
            return
        if signum == self.signum and self.clock() - self._first < self.echo:
            return  # the launcher passing the same signal on
        self.restore()
        signal.raise_signal(signum)  # to the handler from before: stop at once

    def __enter__(self) -> Interrupt:
        for sig in heard(self.SIGNALS):
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        self.restore()

    def restore(self) -> None:
        """The handlers from before, back."""
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    @property
    def exit_code(self) -> int:
        """130 for SIGINT, 143 for SIGTERM (128 + signal number)."""
        return 128 + (self.signum or signal.SIGINT)


class InterruptCallback(TrainerCallback):
    """Turns a signal into save + stop at the optimizer step's end, on every process at once
    (`any_rank` ORs the flag over processes): at the end of the step it came in, or of the
    step whose evaluation it came in (where that step's window of losses is logged; else at
    the next step's end, which logs it)."""

    def __init__(self, interrupt: Interrupt, any_rank: Callable[[bool], bool]) -> None:
        self.interrupt = interrupt
        self.any_rank = any_rank
        self.stopped = False

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        if self.any_rank(self.interrupt.signum is not None):
            self._stop(args, control)
            control.should_log = True  # the steps since the last window: the final loss
        return control

    def on_evaluate(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        # the same on every process (the Trainer logs and evaluates on each): any_rank's turn
        if self.stopped or state.global_step == 0 or not _window_logged(state):
            return control
        if self.any_rank(self.interrupt.signum is not None):
            self._stop(args, control)  # a long evaluation heard it: not one step more
        return control

    def _stop(self, args: Any, control: Any) -> None:
        self.stopped = True
        control.should_save = True
        control.should_training_stop = True
        if args.save_strategy == SaveStrategy.BEST:
            # the evaluation of this step decides a best-only save after the callbacks:
            # one not the best saved nothing, and --resume lost the steps since the best
            args.save_strategy = SaveStrategy.STEPS

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.stopped:
            # with save_total_limit 1 and a best checkpoint, the Trainer's end of training
            # deletes every checkpoint but the best: the one just saved to resume from too
            # (the steps since the best evaluation were lost). CheckpointMarker applies the
            # limit the run began with to this save; none is left for the end.
            args.save_total_limit = None


def _window_logged(state: Any) -> bool:
    """Whether the Trainer logged the training loss at this step (before its evaluation)."""
    last = next((entry for entry in reversed(state.log_history) if "loss" in entry), None)
    return last is not None and last.get("step") == state.global_step
