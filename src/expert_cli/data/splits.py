"""The examples held out for evaluation, and a task's weight: both seeded, so `check` can
find which rows a build will hold out and train before anything is tokenized."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import datasets
import numpy as np

from expert_cli.data.stats_words import drop_reasons

if TYPE_CHECKING:
    from expert_cli.config.resolve import ResolvedConfig


def held_rows(n: int, fraction: float, seed: int) -> np.ndarray:
    """The rows `hold_out` holds out of `n`, sorted (none where `n` < 2)."""
    if fraction <= 0 or n < 2:
        return np.zeros(0, dtype=np.int64)
    return np.sort(np.random.default_rng(seed).permutation(n)[: max(1, round(n * fraction))])


def hold_out(
    ds: datasets.Dataset, fraction: float, seed: int
) -> tuple[datasets.Dataset, datasets.Dataset | None]:
    """Split a seeded `fraction` of `ds` off for evaluation (at least one example)."""
    held = held_rows(len(ds), fraction, seed)
    if not len(held):
        return ds, None
    return ds.select(np.setdiff1d(np.arange(len(ds)), held)), ds.select(held)


def weighted_rows(n: int, weight: float, seed: int) -> np.ndarray:
    """The rows of `n` a task's `weight` trains: all of them int(weight) times, then a seeded
    sample of the fractional part (at least one row)."""
    whole, frac = int(weight), weight - int(weight)
    extra = np.random.default_rng(seed).choice(n, size=round(frac * n), replace=False)
    index = np.concatenate([np.tile(np.arange(n), whole), np.sort(extra)])
    return index if len(index) else np.array([0])


def apply_weight(ds: datasets.Dataset, weight: float, seed: int) -> datasets.Dataset:
    """Repeat `ds` int(weight) times and add a seeded sample of the fractional part."""
    return ds if weight == 1.0 else ds.select(weighted_rows(len(ds), weight, seed))


NO_EVAL_ROWS = (
    "training.config.evaluation_strategy: evaluation is on but the data has no validation rows "
    "(set validation_path or eval_fraction, or give each source 2 rows or more)"
)


FEW_EVAL = 16  # fewer held-out examples than this: a loss that moves with which ones they are


def few_eval_note(examples: int | None) -> str | None:
    """A note where the validation split holds under FEW_EVAL examples (but some)."""
    if examples is None or not 0 < examples < FEW_EVAL:
        return None
    held = f"{examples} example" + ("s" if examples != 1 else "")
    return (
        f"the validation split holds {held}: its loss, by which the best checkpoint and an "
        f"early stop are chosen, rests on so few; give it {FEW_EVAL} or more (in the "
        "validation_path file, or by a larger training.dataset.eval_fraction where there is none)"
    )


def split_note(stats: dict[str, Any]) -> str | None:
    """`few_eval_note` of a built cache's validation split (its examples after drops), else
    the same of each task's share where the split gives each task's loss apart."""
    split = stats.get("eval")
    if not split:
        return None
    examples = split.get("examples", split.get("examples_read"))
    if isinstance(examples, int) and (note := few_eval_note(examples - split.get("dropped", 0))):
        return note  # those left after drops
    tasks = [t for t in split.get("tasks") or [] if isinstance(t, dict)]
    few = [t for t in tasks if isinstance(t.get("examples"), int) and 0 < t["examples"] < FEW_EVAL]
    if not few:
        return None
    named = [f"{t.get('task')} ({t['examples']})" for t in few]
    named = ", ".join(named[:-1]) + " and " + named[-1] if len(named) > 1 else named[0]
    return (
        f"the validation split gives each task's loss apart, and holds few examples of "
        f"{'task' if len(few) == 1 else 'tasks'} {named}: "
        f"{'that loss rests' if len(few) == 1 else 'those losses rest'} on so few; "
        f"give each task {FEW_EVAL} or more (in its valid file, or by a larger "
        "training.dataset.eval_fraction where there is none)"
    )


def held_examples(resolved: ResolvedConfig, rows: list[int | None]) -> int | None:
    """How many examples evaluation will read, where the training sources' row counts (or
    the validation sources', when given) are known: the rows `hold_out` takes from each."""
    if resolved.evaluation_strategy == "no" or None in rows:
        return None
    if resolved.validation_sources:
        return sum(n for n in rows if n is not None)
    fraction = resolved.eval_fraction
    return sum(
        max(1, round(n * fraction)) for n in rows if n is not None and n >= 2 and fraction > 0
    )


def holds_nothing_out(resolved: ResolvedConfig, rows: list[int]) -> bool:
    """Whether evaluation is on but, with no validation source, no training source of these
    row counts has an example to spare for it (`hold_out` needs 2 rows)."""
    wants = resolved.evaluation_strategy != "no" and not resolved.validation_sources
    return wants and all(n < 2 for n in rows)


def unheld_note(tasks: list[str]) -> str | None:
    """A note naming the tasks too small (under 2 examples) to hold any out for evaluation
    beside tasks that do: their losses are not given."""
    if not tasks:
        return None
    one = len(tasks) == 1
    return (
        f"training.dataset.tasks: {', '.join(tasks[:5])}{' and more' if len(tasks) > 5 else ''} "
        f"{'holds' if one else 'hold'} too few examples to hold one out for evaluation (2 or "
        f"more are needed): the evaluation gives no loss for {'it' if one else 'them'}"
    )


def emptied_note(stats: dict[str, Any]) -> str | None:
    """A note naming a task of a built cache whose validation examples were all dropped."""
    split = stats.get("eval") or {}
    emptied = [t for t in split.get("emptied_tasks") or [] if isinstance(t, dict)]
    if not emptied:
        return None
    why = drop_reasons(emptied[0], stats.get("max_seq_length"))
    more = f" (and of {len(emptied) - 1} more tasks)" if len(emptied) > 1 else ""
    return (
        f"training.dataset.tasks: every validation example of {emptied[0].get('task')} was "
        f"dropped ({why}){more}: the evaluation gives no loss for "
        + ("it" if len(emptied) == 1 else "them")
    )
