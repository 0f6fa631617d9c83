"""The rows `evaluate` scores, laid out as training laid out its data.

The validation split is the run's own token cache's (tokenized again from the data files where
that cache is gone, and then said). The test split, `training.dataset.test_path` or each task's
`test` of a multi_task expert, is read from the manifest file as it is now (a test file is
often named after training), else from the run's copy of it, and tokenized, masked and packed
with the run's settings into a token cache of its own beside the training one: each task's
apart, so each is scored alone, under the name `<expert>.test`, so that it is never taken for
one of the expert's training caches (their `latest` pointer and `pretokenize --prune`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import datasets
import pyarrow.compute as pc

from expert_cli.config.loading import load_dataset_block
from expert_cli.config.resolve import ResolvedConfig
from expert_cli.config.sources import SourceRef, resolve_test_sources
from expert_cli.data import BuildProgress, load_recorded, prepare_data
from expert_cli.data.overlap import examples_shared
from expert_cli.errors import UserError
from expert_cli.paths import shown_path
from expert_cli.train.outputs import SOURCE_MANIFEST, run_of
from expert_cli.train.task_evals import eval_task_names

SPLITS = ("test", "validation")
TEST_CACHE_SUFFIX = ".test"  # the test caches' expert name: `<expert>.test`
NO_VALIDATION = (
    "the run has no validation split (set training.dataset.validation_path or "
    "training.dataset.eval_fraction and train again)"
)


@dataclass
class Part:
    """Rows scored together: one task's, or the split's as one (`task` None)."""

    task: str | None
    rows: datasets.Dataset
    source: str  # the manifest field the examples come from
    dropped: int = 0  # examples read and left out by the formatting (overlong, no answer)
    truncated: int = 0  # examples cut at max_seq_length: scored as cut
    shared: int | None = None  # test examples that are training examples too (None: unchecked)

    @property
    def examples(self) -> int:
        """Whole examples (and pieces of split ones) in the rows: each begins at position 0."""
        return example_count(self.rows)


@dataclass
class Split:
    name: str  # "test" or "validation"
    parts: list[Part]
    notes: list[str] = field(default_factory=list)
    pieces: int = 0  # examples split into pieces at max_seq_length (overlong: split)


def example_count(rows: datasets.Dataset) -> int:
    """Examples packed in `rows`: their positions restart at 0 with each (one pass over the
    memory-mapped column)."""
    if not len(rows):
        return 0
    flat = pc.list_flatten(rows.data.column("position_ids"))
    return int(pc.sum(pc.equal(flat, 0)).as_py() or 0)


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


def split_rows(
    adapter: Path, resolved: ResolvedConfig, tokenizer: Any, record: Any, choice: SplitChoice
) -> Split:
    """The rows of the split `choice` names, laid out as the run's training data."""
    wanted, progress = choice.name, choice.progress
    # the manifest file is read for its test data alone (validation is the run's own cache)
    refs, notes = test_refs(run_of(adapter), resolved) if wanted != "validation" else ([], [])
    if wanted == "test" and not refs:
        raise UserError(
            f"{choice.option} test: the manifest names no test data (training.dataset."
            "test_path, or a multi_task expert's tasks.<name>.test); add it, or choose "
            "--split validation"
        )
    if wanted == "validation" or not refs:
        split = validation_split(resolved, tokenizer, record, progress, choice.validation_label)
        if wanted is None:
            split.notes.insert(
                0,
                "the manifest names no test data (training.dataset.test_path): the validation "
                "split is scored, the examples training evaluated on (and chose a best "
                "checkpoint by, where it did)",
            )
        return split
    built = [_test_part(resolved, tokenizer, ref, progress) for ref in refs]
    parts = [part for part, _ in built]
    return Split("test", parts, notes + _trained_on(parts, record), sum(n for _, n in built))


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
        raise UserError(f"{label}: {NO_VALIDATION}")
    stats = data.stats.get("eval") or {}
    fields = ", ".join(dict.fromkeys(r.field for r in resolved.validation_sources))
    source = fields or "training.dataset.eval_fraction (the held-out examples)"
    names = eval_task_names(data.stats, len(rows))
    pieces = _count(stats, "split")
    if not names:
        part = Part(None, rows, source, _count(stats, "dropped"), _count(stats, "truncated"))
        return Split("validation", [part], notes, pieces)
    parts, start = [], 0
    for entry in stats["tasks"]:
        chosen = rows.select(range(start, start + entry["rows"]))
        parts.append(Part(entry["task"], chosen, source))
        start += entry["rows"]
    notes += _cut_note(_count(stats, "dropped"), _count(stats, "truncated"), resolved)
    return Split("validation", parts, notes, pieces)


def test_refs(run_dir: Path, resolved: ResolvedConfig) -> tuple[list[SourceRef], list[str]]:
    """The test sources the manifest file names as it is now, else (the file gone) its copy
    in the run folder; paths are the manifest folder's."""
    manifest = Path(resolved.manifest_path)
    notes = []
    if manifest.is_file():
        _, block = load_dataset_block(manifest)
    elif (run_dir / SOURCE_MANIFEST).is_file():
        _, block = load_dataset_block(run_dir / SOURCE_MANIFEST)
        notes.append(
            f"the manifest the run was trained from ({shown_path(manifest)}) is gone: the test "
            f"data its copy in the run folder ({SOURCE_MANIFEST}) names is read"
        )
    else:
        return [], []
    return resolve_test_sources(block, manifest.parent), notes


def _trained_on(parts: list[Part], record: Any) -> list[str]:
    """Notes on test examples that are training examples too, token for token (counted in
    each part's `shared`), found in the run's token cache."""
    data = load_recorded(record)
    if data is None:
        return [
            "the test examples were not compared with the training examples: the token cache "
            "the run trained with is gone"
        ]
    notes = []
    for part in parts:
        part.shared = examples_shared(data.train, part.rows)
        if part.shared:
            notes.append(
                f"{part.source}: {part.shared:,} of its {part.examples:,} examples are "
                "training examples too (the same tokens): their scores measure what the "
                "adapter memorized"
            )
    return notes


def _test_part(
    resolved: ResolvedConfig, tokenizer: Any, ref: SourceRef, progress: BuildProgress | None
) -> tuple[Part, int]:
    """One test source tokenized and packed as the run's training data was, cached; and how
    many of its examples were split into pieces."""
    derived = resolved.model_copy(
        update={
            "expert": resolved.expert + TEST_CACHE_SUFFIX,
            "train_sources": [ref.model_copy(update={"weight": 1.0})],
            "validation_sources": [],
            "eval_fraction": 0.0,
            "evaluation_strategy": "no",
        }
    )
    try:
        data = prepare_data(derived, tokenizer, progress=progress)
    except UserError as exc:  # the build names the split it builds as training's
        raise UserError([_as_test(line, ref.field) for line in exc.lines]) from None
    stats = data.stats.get("train") or {}
    part = Part(
        ref.task, data.train, ref.field, _count(stats, "dropped"), _count(stats, "truncated")
    )
    return part, _count(stats, "split")


def _as_test(line: str, at: str) -> str:
    """A build's line about its training split, said of the test source `at`."""
    for before in ("training.dataset: no training example", "training.dataset:"):
        if line.startswith(before):
            after = before.replace("training.dataset", at).replace(
                "training example", "test example"
            )
            return after + line[len(before) :]
    return line


def _count(stats: dict[str, Any], key: str) -> int:
    value = stats.get(key)
    return value if isinstance(value, int) and value >= 0 else 0


def _cut_note(dropped: int, truncated: int, resolved: ResolvedConfig) -> list[str]:
    """A note on examples the formatting left out or cut, over the split's tasks."""
    said = []
    if dropped:
        said.append(f"{dropped:,} left out by the formatting")
    if truncated:
        said.append(f"{truncated:,} cut at max_seq_length {resolved.max_seq_length:,}")
    return [f"examples of the split: {'; '.join(said)}"] if said else []
