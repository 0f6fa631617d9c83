"""Early stopping on the evaluation loss (`early_stopping_patience`): transformers'
EarlyStoppingCallback, which says where it stopped the run (a note, and metrics.json's
`stopped_early`), goes on counting in a resumed run, and keeps the lowest loss's step itself
(the Trainer keeps its best step only where it saves checkpoints)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from transformers import EarlyStoppingCallback

from expert_cli.train.callbacks import ThroughputCallback


class EarlyStop(EarlyStoppingCallback):
    """transformers' early stopping on the evaluation loss (`early_stopping_patience`), which
    says where it stopped the run: a note, and metrics.json's `stopped_early`."""

    def __init__(
        self, patience: int, threshold: float, throughput: ThroughputCallback, say: Any = None
    ) -> None:
        super().__init__(patience, threshold)
        self.throughput, self.say = throughput, say
        self.lowest: tuple[float, int] | None = None  # (eval_loss, step) lowest so far
        self.said: str | None = None  # the stop, said when training ends

    def on_train_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        """A resumed run goes on counting from its checkpoint's count (the Trainer's own
        restoring would rebuild every stateful callback, and cannot rebuild this one), and
        from its lowest loss; a checkpoint of a run that had no early stopping gets an entry
        for it (the Trainer's save looks it up). The parent's checks are the resolution's
        (an evaluation, the loss as its metric); its warning without load_best_model_at_end
        is the resolution's note."""
        name = type(self).__name__
        saved = (state.stateful_callbacks or {}).get(name)
        saved = saved[0] if isinstance(saved, list) and saved else saved
        if isinstance(saved, dict):
            counted = (saved.get("attributes") or {}).get("early_stopping_patience_counter", 0)
            self.early_stopping_patience_counter = int(counted or 0)
        elif isinstance(state.stateful_callbacks, dict):
            state.stateful_callbacks[name] = self.state()
        self.lowest = _lowest(state.best_metric, state.best_global_step)

    def on_evaluate(self, args: Any, state: Any, control: Any, metrics: Any, **kw: Any) -> None:
        if state.global_step == 0:  # eval_on_start's, before training: what it improves on
            return
        super().on_evaluate(args, state, control, metrics, **kw)
        key = _metric_key(args)  # the split's eval_loss, or a task's (eval_<task>_loss)
        now = (metrics or {}).get(key)
        if (
            isinstance(now, float)
            and math.isfinite(now)
            and (self.lowest is None or now < self.lowest[0])
        ):  # tracked here: the Trainer keeps its best step only where it saves checkpoints
            self.lowest = (now, state.global_step)
        if (
            self.early_stopping_patience_counter < self.early_stopping_patience
            or state.global_step >= state.max_steps  # its last evaluation: not stopped early
        ):
            return
        best, at = self.lowest if self.lowest is not None else (None, None)
        stopped = {"step": state.global_step, "of": state.max_steps}
        self.throughput.extra["stopped_early"] = {
            **stopped,
            "best_eval_loss": best,
            "best_step": at,
        }
        if self.say is not None:
            count, by = self.early_stopping_patience, self.early_stopping_threshold
            lowest = f"the lowest {key} {best:.4g}, at step {at}" if at else f"no {key} a number"
            self.said = (  # said at the end: the stop's own step may still be saved as the best
                f"stopped early at step {state.global_step} of {state.max_steps}: {count} "
                f"evaluation{'' if count == 1 else 's'} in a row without the loss improving"
                f"{f' by more than {by:g}' if by else ''} (early_stopping_patience); {lowest}"
            )

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.said is None or self.say is None:
            return
        kept = getattr(state, "best_model_checkpoint", None)
        best = args.load_best_model_at_end and kept
        self.say(self.said + (f"; the final adapter is {Path(kept).name}'s" if best else ""))


def _lowest(loss: Any, step: Any) -> tuple[float, int] | None:
    """(loss, step) of a checkpoint's best evaluation, where it says both as numbers."""
    if isinstance(loss, float) and math.isfinite(loss) and isinstance(step, int):
        return loss, step
    return None


def _metric_key(args: Any) -> str:
    """The evaluation's figure the stop goes by, named as the Trainer's metrics name it."""
    metric = str(getattr(args, "metric_for_best_model", None) or "eval_loss")
    return metric if metric.startswith("eval_") else f"eval_{metric}"
