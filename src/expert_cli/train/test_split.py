"""The test split `evaluate` scores, and the split a command asked for.

The test data, `training.dataset.test_path` or each task's `test` of a multi_task expert, is
read from the manifest file as it is now (a test file is often named after training), else from
the run's copy of it. Each source is tokenized, masked and packed with the run's settings into a
token cache of its own in the cache root's `evaluate/` folder (data.TEST_CACHES), each task's
apart so each is scored alone, where it is never taken for one of the expert's training caches
(their `latest` pointer; `pretokenize --prune` removes them all). Every local test file is
looked for before any is built, so that a refused call leaves no cache.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from expert_cli.config.loading import load_dataset_block
from expert_cli.config.resolve import ResolvedConfig
from expert_cli.config.sources import SourceRef, resolve_test_sources
from expert_cli.data import TEST_CACHES, BuildProgress, load_recorded, prepare_data
from expert_cli.data.overlap import examples_shared
from expert_cli.errors import UserError
from expert_cli.paths import shown_path
from expert_cli.train.eval_split import (
    NO_VALIDATION,
    NoValidation,
    Part,
    Split,
    SplitChoice,
    count,
    formatting_notes,
    part_of,
    validation_split,
)
from expert_cli.train.outputs import SOURCE_MANIFEST, run_of


def split_rows(
    adapter: Path, resolved: ResolvedConfig, tokenizer: Any, record: Any, choice: SplitChoice
) -> Split:
    """The rows of the split `choice` names, laid out as the run's training data."""
    said: list[str] = []
    if choice.name != "validation":  # the manifest file is read for its test data alone
        refs, said = test_refs(run_of(adapter), resolved)
        if refs:
            return test_split(refs, resolved, tokenizer, record, choice.progress)
        if choice.name == "test":
            raise UserError(
                f"{choice.option} test: the manifest names no test data (training.dataset."
                "test_path, or a multi_task expert's tasks.<name>.test); add it, or choose "
                "--split validation"
            )
    try:
        split = validation_split(
            resolved, tokenizer, record, choice.progress, choice.validation_label
        )
    except NoValidation:
        if choice.name is not None:
            raise
        raise UserError(
            "evaluate: nothing to score: the manifest names no test data (training.dataset."
            "test_path, or each task's test), and " + NO_VALIDATION
        ) from None
    if choice.name is None:
        split.notes[:0] = said or [
            "the manifest names no test data (training.dataset.test_path): the validation "
            "split is scored, the examples training evaluated on (and chose a best checkpoint "
            "by, where it did)"
        ]
    return split


def test_refs(run_dir: Path, resolved: ResolvedConfig) -> tuple[list[SourceRef], list[str]]:
    """The test sources the manifest file names as it is now, else (the file gone) its copy
    in the run folder, paths the manifest folder's; and notes on where they were read (or
    why none could be)."""
    manifest = Path(resolved.manifest_path)
    if manifest.is_file():
        _, block = load_dataset_block(manifest)
        return resolve_test_sources(block, manifest.parent), []
    if not (run_dir / SOURCE_MANIFEST).is_file():
        return [], [
            f"the manifest the run was trained from ({shown_path(manifest)}) is gone and the "
            f"run kept no copy ({SOURCE_MANIFEST}): no test data can be read; the validation "
            "split is scored"
        ]
    _, block = load_dataset_block(run_dir / SOURCE_MANIFEST)
    found = resolve_test_sources(block, manifest.parent)
    where = "the test data its copy in the run folder (manifest.source.json) names is read"
    return found, [
        f"the manifest the run was trained from ({shown_path(manifest)}) is gone: {where}"
    ]


def test_split(
    refs: list[SourceRef],
    resolved: ResolvedConfig,
    tokenizer: Any,
    record: Any,
    progress: BuildProgress | None,
) -> Split:
    """Every test source looked for, then each built (or read from its cache) and scored
    apart; notes on tasks the run did not train, tasks with no test data, a file named twice,
    what the formatting did, and test examples that are training examples too."""
    _look_for(refs, resolved)
    notes = _task_notes(refs, resolved)
    parts, pieces = [], 0
    for ref in refs:
        part, stats = _test_part(resolved, tokenizer, ref, progress)
        parts.append(part)
        pieces += count(stats, "split")
        notes += formatting_notes(ref.field, stats, resolved.max_seq_length)
    return Split("test", parts, notes + _trained_on(parts, record), pieces)


def _look_for(refs: list[SourceRef], resolved: ResolvedConfig) -> None:
    """A UserError for a local test source that is not there, before any is built; and for a
    cache root whose expert folder is gone (it would be made again to hold the caches)."""
    for ref in refs:
        if ref.kind == "local" and not Path(ref.location).exists():
            raise UserError(
                f"{ref.field}: {shown_path(ref.location)} is not there; expected the test "
                "data's file or folder (relative to the manifest's folder)"
            )
    root, folder = Path(resolved.pretokenized_cache), Path(resolved.manifest_path).parent
    if not root.is_dir() and not folder.is_dir():
        raise UserError(
            f"{refs[0].field}: the expert's folder {shown_path(folder)} is gone, where the test "
            "split's token cache is kept beside the training one; put the folder back"
        )


def _task_notes(refs: list[SourceRef], resolved: ResolvedConfig) -> list[str]:
    """Tasks the run trained with no test data (not scored), test data of a task the run did
    not train, and a file two sources name (scored twice in the whole)."""
    trained = [r.task for r in resolved.train_sources if r.task]
    tested = [r.task for r in refs if r.task]
    notes = []
    if missing := [t for t in trained if t not in tested]:
        notes.append(
            f"tasks {', '.join(missing)}: no test data named (tasks.<name>.test): not scored"
        )
    if extra := [t for t in tested if t not in trained]:
        were = f" (it trained {', '.join(trained)})" if trained else ""
        notes.append(f"tasks {', '.join(extra)}: not a task the run trained{were}; scored as named")
    places = [(r.location, r.split) for r in refs]
    for ref, place in zip(refs, places, strict=True):
        if places.count(place) > 1 and places.index(place) == refs.index(ref):
            notes.append(
                f"{ref.field}: {shown_path(ref.location)} is named by {places.count(place)} "
                "tasks: its examples count that many times in the whole"
            )
    return notes


def _test_part(
    resolved: ResolvedConfig, tokenizer: Any, ref: SourceRef, progress: BuildProgress | None
) -> tuple[Part, dict[str, Any]]:
    """One test source tokenized and packed as the run's training data was, cached; with the
    build's stats of it."""
    derived = resolved.model_copy(
        update={
            "pretokenized_cache": str(Path(resolved.pretokenized_cache) / TEST_CACHES),
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
    return part_of(data.train, ref.task, ref.field, stats), stats


def _as_test(line: str, at: str) -> str:
    """A build's line about its training split, said of the test source `at`."""
    for before in ("training.dataset: no training example", "training.dataset:"):
        if line.startswith(before):
            after = before.replace("training.dataset", at)
            return after.replace("training example", "test example") + line[len(before) :]
    return line


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
