"""The rows `evaluate` (and `generate --eval`) score, laid out as training laid out its data.

The validation split is the run's own token cache's (tokenized again from the data files where
that cache is gone, and then said). The test split, `training.dataset.test_path` or each task's
`test` of a multi_task expert, is train/test_split.py's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import datasets
import pyarrow.compute as pc

from expert_cli.config.resolve import ResolvedConfig
from expert_cli.data import BuildProgress, load_recorded, prepare_data
from expert_cli.data.stats_words import drop_reasons, masking_words
from expert_cli.errors import UserError
from expert_cli.train.task_evals import eval_task_names

NO_VALIDATION = (
    "the run has no validation split (set training.dataset.validation_path or "
    "training.dataset.eval_fraction and train again)"
)


class NoValidation(UserError):
    """The run has no validation split (where a command needs one)."""


@dataclass
class Part:
    """Rows scored together: one task's, or the split's as one (`task` None)."""

    task: str | None
    rows: datasets.Dataset
    source: str  # the manifest field the examples come from
    examples: int  # whole examples in the rows (an example split into pieces counts once)
    # examples read and left out by the formatting (overlong, no answer), and those cut at
    # max_seq_length (scored as cut): None where the build kept no count of this part's
    dropped: int | None = 0
    truncated: int | None = 0
    shared: int | None = None  # test examples that are training examples too (None: unchecked)


@dataclass
class Split:
    name: str  # "test" or "validation"
    parts: list[Part]
    notes: list[str] = field(default_factory=list)
    pieces: int = 0  # examples split into pieces at max_seq_length (overlong: split)
    # what the formatting did to the split's examples (evaluate says it; generate --eval has
    # its own words for the examples it leaves out)
    formatting: list[str] = field(default_factory=list)
    dropped: int = 0  # the split's examples left out by the formatting
    truncated: int = 0  # and cut at max_seq_length
    scratch: Any = None  # the temporary folder its rows are read from, where one was made

    def counted(self, stats: list[dict[str, Any]]) -> Split:
        """The split with the totals of the builds' `stats` of it (one per source)."""
        self.dropped = sum(count(s, "dropped") for s in stats)
        self.truncated = sum(count(s, "truncated") for s in stats)
        self.pieces = sum(count(s, "split") for s in stats)
        return self


@dataclass
class SplitChoice:
    """The split to read (None: test where the manifest names test data, else validation,
    said in a note), the option an error names, and who hears of a test cache's build."""

    name: str | None = None
    option: str = "--split"
    progress: BuildProgress | None = None

    @property
    def validation_label(self) -> str:
        return f"{self.option} validation" if self.option == "--split" else self.option


def example_count(rows: datasets.Dataset) -> int:
    """Examples packed in `rows`: their positions restart at 0 with each (one pass over the
    memory-mapped column)."""
    found = 0
    for batch in rows.with_format("arrow").iter(batch_size=10_000):  # a selection's rows alone
        found += pc.sum(pc.equal(pc.list_flatten(batch.column("position_ids")), 0)).as_py() or 0
    return int(found)


def part_of(rows: datasets.Dataset, task: str | None, source: str, stats: dict) -> Part:
    """The part of `rows` with its counts from the build's `stats` of them: its examples less
    those dropped (a task's entry of the evaluation split counts them so, and keeps no counts
    of drops and cuts), else the rows' own count."""
    if "examples" not in stats:
        return Part(task, rows, source, example_count(rows), None, None)
    examples = count(stats, "examples") - count(stats, "dropped")
    if "dropped" not in stats:  # a task's entry
        return Part(task, rows, source, examples, None, None)
    return Part(task, rows, source, examples, count(stats, "dropped"), count(stats, "truncated"))


def formatting_notes(source: str, stats: dict[str, Any], limit: int) -> list[str]:
    """What the formatting did to the examples of `source` (the build's `stats` of them):
    those left out and why, those cut at max_seq_length, those scored on their whole text."""
    notes = []
    read, dropped, cut = (count(stats, k) for k in ("examples", "dropped", "truncated"))
    if dropped:
        why = drop_reasons(stats, limit)
        notes.append(f"{source}: {dropped:,} of its {read:,} examples left out ({why})")
    if cut:
        notes.append(
            f"{source}: {cut:,} example{'s' if cut > 1 else ''} cut at max_seq_length "
            f"{limit:,} (as in training): scored on the tokens before the cut"
        )
    if (words := masking_words(stats)) and stats.get("styles", {}).get("none"):
        notes.append(f"{source}: scored on {words}")
    return notes


def count(stats: dict[str, Any], key: str) -> int:
    value = stats.get(key)
    return value if isinstance(value, int) and value >= 0 else 0


def validation_split(
    resolved: ResolvedConfig,
    tokenizer: Any,
    record: Any,
    progress: BuildProgress | None = None,
    label: str = "--split validation",
) -> Split:
    """The run's validation split, each task's rows apart where the cache recorded them (the
    cache built again, `progress` hearing of it, where the run's is gone); a UserError naming
    `label` where the run has none."""
    notes = []
    data = load_recorded(record)
    if data is None:
        data = prepare_data(resolved, tokenizer, progress=progress)
        if record is not None:
            notes.append(
                "the token cache the run trained with is gone or damaged; the data files were "
                "tokenized again, as they are now"
            )
    rows = data.eval
    if rows is None or not len(rows):
        raise NoValidation(f"{label}: {NO_VALIDATION}")
    stats = data.stats.get("eval") or {}
    fields = {r.task: r.field for r in resolved.validation_sources}
    held = "held out by training.dataset.eval_fraction"
    source = ", ".join(dict.fromkeys(fields.values())) or held
    said = formatting_notes(source, stats, resolved.max_seq_length)
    names = eval_task_names(data.stats, len(rows))
    if not names:
        parts = [part_of(rows, None, source, stats)]
    else:
        parts, start = [], 0
        for entry in stats["tasks"]:
            chosen = rows.select(range(start, start + entry["rows"]))
            parts.append(part_of(chosen, entry["task"], fields.get(entry["task"], held), entry))
            start += entry["rows"]
    return Split("validation", parts, notes, formatting=said).counted([stats])
