"""Which tasks of a multi_task expert its evaluation measures: those it leaves out, and a
`metric_for_best_model` naming a task's loss (`eval_<task>_loss`)."""

from __future__ import annotations

from typing import Any


def unevaluated_tasks(train: list[Any], valid: list[Any]) -> list[str]:
    """A note naming the tasks of a multi_task dataset without a `valid` file when another
    has one: none of their examples is held out then, so the eval loss leaves them out."""
    evaluated = {ref.task for ref in valid}
    left = sorted({ref.task for ref in train if ref.task and ref.task not in evaluated})
    if not valid or not left:
        return []
    shown = ", ".join(left[:5]) + (f" and {len(left) - 5} more" if len(left) > 5 else "")
    one = len(left) == 1
    named = sorted(str(t) for t in evaluated)
    rest = f" and {len(named) - 5} more" if len(named) > 5 else ""
    return [
        f"training.dataset.tasks: {shown} {'has' if one else 'have'} no valid file, and none "
        f"of {'its' if one else 'their'} examples is held out when another task has one: the "
        f"eval loss measures only {', '.join(named[:5])}{rest}"
    ]


def metric_task(metric: Any) -> str | None:
    """The task a `metric_for_best_model` of `eval_<task>_loss` names (None: the split's)."""
    if not isinstance(metric, str) or metric in ("", "eval_loss", "loss"):
        return None  # a hand-edited record's other value too
    return metric.removeprefix("eval_").removesuffix("_loss")


def task_metric_problem(metric: str | None, tasks: dict[str, Any], kind: str) -> str | None:
    """What is wrong with a metric naming a task: no such task (or no tasks at all), or one
    the evaluation measures nothing of (no valid file where another task has one)."""
    task = metric_task(metric)
    if task is None:
        return None
    names = ", ".join(list(tasks)[:5]) if kind == "multi_task" else ""
    if task not in tasks or kind != "multi_task":
        where = f"the tasks are {names}" if names else "the dataset holds no tasks"
        return f"{metric} names no task ({where}); eval_loss, or eval_<task>_loss of a task"
    valid = [name for name, spec in tasks.items() if getattr(spec, "valid", None)]
    if valid and task not in valid:
        return f"task {task} has no valid file, so the evaluation gives no loss for it"
    return None


def unmeasured_task(metric: str, task: str) -> str:
    """What a run says whose metric names a task its evaluation split holds nothing of."""
    return (
        f"training.config.metric_for_best_model: {metric}: the evaluation split holds no "
        f"example of task {task} (too few of its examples to hold one out, or every one "
        "dropped); eval_loss, or another task's"
    )
