"""The learning-rate schedules a manifest may name, and the arguments each takes in
`lr_scheduler_kwargs` (transformers' names), with their bounds."""

from __future__ import annotations

from typing import Any, Literal

from expert_cli.config.base import NAME_LIKE

MAX_STEPS = 100_000_000
Scheduler = Literal[
    "linear",
    "cosine",
    "cosine_with_restarts",
    "polynomial",
    "constant",
    "constant_with_warmup",
    "inverse_sqrt",
    "cosine_with_min_lr",
    "warmup_stable_decay",
]

# what each schedule takes in `lr_scheduler_kwargs` (transformers' names; a test holds these to
# the installed transformers' scheduler functions): name -> (kind, low, high, what it is), kind
# "int", "float" or a tuple of the texts allowed; low and high are inclusive
SCHEDULER_ARGUMENTS: dict[str, dict[str, tuple[Any, float, float, str]]] = {
    "linear": {},
    "constant": {},
    "constant_with_warmup": {},
    "cosine": {"num_cycles": ("float", 0.0, 1000.0, "cosine waves; 0.5 falls once to 0")},
    "cosine_with_restarts": {"num_cycles": ("int", 1, 1000, "hard restarts")},
    "polynomial": {
        "lr_end": ("float", 0.0, 1.0, "the final learning rate (below the peak)"),
        "power": ("float", 1e-6, 100.0, "the polynomial's power"),
    },
    "inverse_sqrt": {"timescale": ("int", 1, MAX_STEPS, "steps per decay unit")},
    "cosine_with_min_lr": {
        "num_cycles": ("float", 0.0, 1000.0, "cosine waves"),
        "min_lr": ("float", 0.0, 1.0, "the final learning rate"),
        "min_lr_rate": ("float", 0.0, 1.0, "the final learning rate as a share of the peak"),
    },
    "warmup_stable_decay": {
        "num_decay_steps": ("int", 0, MAX_STEPS, "steps of the final decay"),
        "num_stable_steps": ("int", 0, MAX_STEPS, "steps at the peak"),
        "warmup_type": (("linear", "cosine", "1-sqrt"), 0, 0, "shape of the warmup"),
        "decay_type": (("linear", "cosine", "1-sqrt"), 0, 0, "shape of the decay"),
        "min_lr_ratio": ("float", 0.0, 1.0, "the final learning rate as a share of the peak"),
        "num_cycles": ("float", 0.0, 1000.0, "cosine waves of the decay"),
    },
}
# schedules that cannot run without one of these arguments, and an example
SCHEDULER_NEEDS: dict[str, tuple[tuple[str, ...], str]] = {
    "cosine_with_min_lr": (("min_lr", "min_lr_rate"), '{"min_lr_rate": 0.1}'),
    "warmup_stable_decay": (("num_decay_steps",), '{"num_decay_steps": 100}'),
}


def scheduler_argument(schedule: str, key: str, value: Any) -> str | None:
    """What is wrong with `key: value` in the kwargs of `schedule`; None when it is usable."""
    takes = SCHEDULER_ARGUMENTS.get(schedule, {})
    shown = key if NAME_LIKE.fullmatch(key) else "a key"
    if key not in takes:
        names = ", ".join(takes) if takes else "none"
        return f"{shown}: not an argument of the {schedule} schedule (it takes: {names})"
    kind, low, high, what = takes[key]
    if isinstance(kind, tuple):
        if value not in kind:
            return f"{key}: expected one of {', '.join(kind)} ({what})"
        return None
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not number or (kind == "int" and not isinstance(value, int)):
        whole = "a whole number" if kind == "int" else "a number"
        return f"{key}: expected {whole} from {low:g} to {high:g} ({what})"
    if not low <= value <= high:
        return f"{key}: {value:g} is out of range; expected {low:g} to {high:g} ({what})"
    return None


def schedule_arguments_problem(schedule: str, given: dict[str, Any] | None) -> str | None:
    """What is wrong with `lr_scheduler_kwargs` for `schedule`: an argument it does not take
    or out of its range, one it cannot run without missing (transformers would stop the run
    when it builds the schedule, after the model has loaded); None when usable."""
    given = given or {}
    problems = [
        problem
        for key, item in given.items()
        if (problem := scheduler_argument(schedule, key, item)) is not None
    ]
    if problems:
        return "; ".join(problems[:4]) + (
            " (they must match lr_scheduler: change both, or set lr_scheduler_kwargs to null)"
        )
    needs, example = SCHEDULER_NEEDS.get(schedule, ((), ""))
    found = [key for key in needs if key in given]
    if needs and not found:
        return f"lr_scheduler {schedule} needs {' or '.join(needs)} here, e.g. {example}"
    if len(found) > 1:
        return f"give one of {' or '.join(found)}, not both"
    return None
