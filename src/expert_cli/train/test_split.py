"""The test split `evaluate` scores, and the split a command asked for.

The test data, `training.dataset.test_path` or each task's `test` of a multi_task expert, is
read from the manifest file as it is now (a test file is often named after training), else from
the run's copy of it. Each source is tokenized, masked and packed with the run's settings into a
token cache of its own in the cache root's `evaluate/` folder (data.TEST_CACHES), each task's
apart so each is scored alone, where it is never taken for one of the expert's training caches
(their `latest` pointer; `pretokenize --prune` removes them all). Every local test file is
looked for before any is built: a missing one refuses the call before any cache is made.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from expert_cli.config.loading import load_dataset_block
from expert_cli.config.resolve import ResolvedConfig
from expert_cli.config.sources import SourceRef, resolve_test_sources
from expert_cli.data import TEST_CACHES, BuildProgress, load_recorded, prepare_data
from expert_cli.data.cache import cache_root_problem
from expert_cli.data.hub import require_hub, source_refs
from expert_cli.data.overlap import example_keys, shared_with
from expert_cli.errors import UserError
from expert_cli.paths import shown_path
from expert_cli.train.eval_split import (
    NO_VALIDATION,
    NoValidation,
    Part,
    Split,
    SplitChoice,
    count,
    example_count,
    formatting_notes,
    part_of,
    validation_split,
)
from expert_cli.train.outputs import SOURCE_MANIFEST, run_of


@dataclass
class NamedTests:
    """The test sources a run's manifest names, a note on where they were read where it was
    not the manifest file, and why there are none (where there are none)."""

    refs: list[SourceRef]
    where: str | None
    none: str


def split_rows(
    adapter: Path, resolved: ResolvedConfig, tokenizer: Any, record: Any, choice: SplitChoice
) -> Split:
    """The rows of the split `choice` names, laid out as the run's training data."""
    found = NamedTests([], None, "")
    if choice.name != "validation":  # the manifest file is read for its test data alone
        found = test_data(run_of(adapter), resolved)
        if found.refs:
            split = test_split(found.refs, resolved, tokenizer, record, choice.progress)
            split.notes[:0] = [found.where] if found.where else []
            return split
        if choice.name == "test":
            raise UserError(f"{choice.option} test: {found.none}")
    try:
        split = validation_split(
            resolved, tokenizer, record, choice.progress, choice.validation_label
        )
    except NoValidation:
        if choice.name is not None:
            raise
        raise UserError(f"evaluate: nothing to score: {found.none}, and {NO_VALIDATION}") from None
    if choice.name is None:
        split.notes.insert(
            0,
            f"{found.none}: the validation split is scored, the examples training evaluated "
            "on (and chose a best checkpoint by, where it did)",
        )
    return split


def test_data(run_dir: Path, resolved: ResolvedConfig) -> NamedTests:
    """The test sources the manifest file names as it is now, else (the file gone) its copy
    in the run folder; paths are the manifest folder's."""
    manifest = Path(resolved.manifest_path)
    if manifest.is_file():
        _, block = load_dataset_block(manifest)
        none = (
            "the manifest names no test data (training.dataset.test_path, or a multi_task "
            "expert's tasks.<name>.test)"
        )
        return NamedTests(resolve_test_sources(block, manifest.parent), None, none)
    gone = f"the manifest the run was trained from ({shown_path(manifest)}) is gone"
    if not (run_dir / SOURCE_MANIFEST).is_file():
        return NamedTests([], None, f"{gone} and the run kept no copy ({SOURCE_MANIFEST})")
    _, block = load_dataset_block(run_dir / SOURCE_MANIFEST)
    where = f"{gone}: the test data its copy in the run folder ({SOURCE_MANIFEST}) names is read"
    none = f"{gone}, and its copy in the run folder ({SOURCE_MANIFEST}) names no test data"
    return NamedTests(resolve_test_sources(block, manifest.parent), where, none)


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
    parts, said, stats = [], [], []
    root = Path(resolved.pretokenized_cache) / TEST_CACHES
    unwritable, scratch = cache_root_problem(root), None
    for ref in refs:
        try:
            part, built = _test_part(resolved, tokenizer, ref, (root, progress))
        except UserError as exc:  # not built yet where the expert's folder takes no file
            if unwritable is None or exc.lines != [unwritable]:
                raise
            if scratch is None:
                scratch = tempfile.TemporaryDirectory(prefix="expert-cli-test-cache-")
                notes.append(
                    f"{shown_path(root)} cannot be written: the test split was tokenized in a "
                    "temporary folder for this call alone (its token cache is not kept)"
                )
            part, built = _test_part(resolved, tokenizer, ref, (Path(scratch.name), progress))
        parts.append(part)
        stats.append(built)
        said += formatting_notes(ref.field, built, resolved.max_seq_length)
    notes += _trained_on(parts, record, [count(s, "split") for s in stats])
    split = Split("test", parts, notes, formatting=said).counted(stats)
    split.scratch = scratch  # removed once the split is done with (its rows are read from it)
    return split


def _look_for(refs: list[SourceRef], resolved: ResolvedConfig) -> None:
    """A UserError for a local test source that is not there, before any is built; for a hub
    one neither cached nor downloadable (a RunError where the hub cannot be reached); and for
    a cache root whose expert folder is gone (it would be made again to hold the caches)."""
    for ref in refs:
        if ref.kind == "local" and not Path(ref.location).exists():
            raise UserError(
                f"{ref.field}: {shown_path(ref.location)} is not there; expected the test "
                "data's file or folder (relative to the manifest's folder)"
            )
    require_hub(source_refs(refs))  # in seconds, not after the hub client's retries
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
        notes.append(f"{_tasks(missing)}: no test data named (tasks.<name>.test): not scored")
    if extra := [t for t in tested if t not in trained]:
        were = f" (it trained {', '.join(trained)})" if trained else ""
        notes.append(f"{_tasks(extra)}: not a task the run trained{were}; scored as named")
    named: dict[tuple, list[SourceRef]] = {}
    for ref in refs:  # the same data: a file by its real path, a hub split and configuration
        place = os.path.realpath(ref.location) if ref.kind == "local" else ref.location
        named.setdefault((place, ref.split, ref.config), []).append(ref)
    for same in (group for group in named.values() if len(group) > 1):
        notes.append(
            f"{', '.join(r.field for r in same)}: the same test data: its examples count "
            f"{len(same)} times in the whole"
        )
    return notes


def _tasks(names: list[str]) -> str:
    return f"task{'s' if len(names) > 1 else ''} {', '.join(names)}"


def _test_part(
    resolved: ResolvedConfig,
    tokenizer: Any,
    ref: SourceRef,
    into: tuple[Path, BuildProgress | None],
) -> tuple[Part, dict[str, Any]]:
    """One test source tokenized and packed as the run's training data was, cached under
    `into`'s folder (who hears of the build beside it); with the build's stats of it."""
    root, progress = into
    derived = resolved.model_copy(
        update={
            "pretokenized_cache": str(root),
            "train_sources": [ref.model_copy(update={"weight": 1.0})],
            "validation_sources": [],
            "eval_fraction": 0.0,
            "evaluation_strategy": "no",
        }
    )
    data = prepare_data(derived, tokenizer, progress=progress)  # its errors name ref.field
    stats = data.stats.get("train") or {}
    return part_of(data.train, ref.task, ref.field, stats), stats


def _trained_on(parts: list[Part], record: Any, split: list[int]) -> list[str]:
    """Notes on test examples that are training examples too, token for token (counted in
    each part's `shared`), found in the run's token cache. Where a source's examples were
    split into pieces (`split`: how many, each source's), its pieces are compared, and said
    so."""
    data = load_recorded(record)
    if data is None:
        return [
            "the test examples were not compared with the training examples: the token cache "
            "the run trained with is gone"
        ]
    notes = []
    trained = example_keys(data.train)  # once for every part
    for part, pieces in zip(parts, split, strict=True):
        part.shared = shared_with(trained, part.rows)
        if not part.shared:
            continue
        if pieces:  # an example cut into pieces is compared a piece at a time
            of = f"{part.shared:,} of its {example_count(part.rows):,} pieces (examples split "
            of += "at max_seq_length) are pieces of training examples too"
        else:
            of = f"{part.shared:,} of its {part.examples:,} examples are training examples too"
        notes.append(
            f"{part.source}: {of} (the same tokens): their scores measure what the adapter "
            "memorized"
        )
    return notes
