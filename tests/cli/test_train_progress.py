"""The train command's progress display: a bar over the steps, and one over the batches of an
evaluation while it runs (an evaluation over a large validation set runs for minutes with
nothing else on the screen). Driven through transformers' own callback dispatch, which hands
the callback the evaluation's data loader."""

from __future__ import annotations

import io

from rich.console import Console
from transformers import TrainerControl, TrainerState, TrainingArguments
from transformers.trainer_callback import CallbackHandler

from expert_cli.cli.train_view import ProgressCallback


def _tasks(callback: ProgressCallback) -> dict[str, tuple[float, float | None]]:
    assert callback.progress is not None
    return {t.description: (t.completed, t.total) for t in callback.progress.tasks}


def test_an_evaluation_shows_its_batches_and_goes_when_done(tmp_path) -> None:
    console = Console(file=io.StringIO(), force_terminal=True, width=100)
    callback = ProgressCallback(console)
    handler = CallbackHandler([callback], None, None, None, None)
    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to="none")
    state = TrainerState(max_steps=4, global_step=0)
    control = TrainerControl()
    handler.on_train_begin(args, state, control)
    try:
        state.global_step = 2
        handler.on_step_end(args, state, control)
        handler.eval_dataloader = [object()] * 5  # what the Trainer sets while it evaluates
        for _ in range(3):
            handler.on_prediction_step(args, state, control)
        assert _tasks(callback) == {"training": (2, 4), "evaluating": (3, 5)}
        handler.on_evaluate(args, state, control, metrics={"eval_loss": 1.0})
        assert _tasks(callback) == {"training": (2, 4)}
        handler.eval_dataloader = iter([1, 2])  # no length: a bar that counts without a total
        handler.on_prediction_step(args, state, control)
        assert _tasks(callback)["evaluating"] == (1, None)
        handler.on_evaluate(args, state, control, metrics={})
    finally:
        handler.on_train_end(args, state, control)
    assert callback.progress is None and callback.eval_task is None
    # an evaluation outside training (no bar running) shows nothing and keeps no task
    handler.on_prediction_step(args, state, control)
    assert callback.eval_task is None
