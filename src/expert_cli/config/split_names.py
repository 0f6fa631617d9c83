"""Which split a local data file belongs to: the split its README.md's card gives it (a
folder downloaded with `hf download --local-dir`), else the one its path names, as the
datasets library reads a hub folder (data/train-00000-of-00001.parquet, data/test-*.parquet,
validation/part-0.jsonl). A training source leaves out the held-out splits' files; a
validation source reads the validation split's, else the test split's; a folder whose card
lists several splits one read would join is refused (`card_problem`).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from expert_cli.config.dataset_card import card_split_of, card_splits, configs_problem, shown_name
from expert_cli.paths import shown_path

SPLIT_WORDS = {
    "train": "train",
    "training": "train",
    "validation": "validation",
    "valid": "validation",
    "val": "validation",
    "dev": "validation",
    "test": "test",
    "testing": "test",
    "eval": "test",  # as the datasets library splits a Hub folder
    "evaluation": "test",
}
HELD_OUT_SPLITS = ("validation", "test")
UNLISTED = "unlisted"  # a file a card that lists splits gives to none: never read


def split_word(text: str) -> str | None:
    """The split a name's words name (train, validation, test), the last deciding."""
    found = [SPLIT_WORDS[w] for w in re.split(r"[^a-z]+", text.lower()) if w in SPLIT_WORDS]
    return found[-1] if found else None


def split_named(relative: Path) -> str | None:
    """The split a data file's path names, the word nearest its name deciding
    (data/test/train-0.jsonl is train); None when no word names one."""
    return split_word(str(relative.with_suffix("")))


def field_role(field: str) -> str:
    """The split a source's manifest field names: "validation" (validation_path, a task's
    valid), "test" (test_path, a task's test: `evaluate`'s), else "train"."""
    if field.endswith((".valid", ".validation_path")):
        return "validation"
    return "test" if field.endswith((".test", ".test_path")) else "train"


def file_splits(path: Path, files: list[Path]) -> dict[Path, str | None]:
    """Each file's split kind: by the split its folder's card gives it (by that split's
    name), UNLISTED where the card gives it none; by its path's words where there is no card."""
    card = card_splits(path)
    if not card:
        return {f: split_named(f.relative_to(path)) for f in files}
    found = {f: card_split_of(card, f.relative_to(path)) for f in files}
    return {f: UNLISTED if split is None else split_word(split) for f, split in found.items()}


def split_files(path: Path, files: list[Path], role: str) -> tuple[list[Path], list[Path]]:
    """(files read, files left out) of a data folder whose files belong to splits
    (`file_splits`) by a source of `role` (`field_role`): a training source leaves out the
    validation and test files (an `hf download` folder holds data/test-*.parquet beside
    data/train-*.parquet, and the test rows were trained on); a validation source reads the
    validation files, else the test ones; a test source the test ones. A folder of no
    held-out split's files is read whole."""
    named = file_splits(path, files)
    if not any(s in (*HELD_OUT_SPLITS, UNLISTED) for s in named.values()):
        return files, []
    keep = _read(named, role)
    return keep, [f for f in files if f not in keep]


def _read(named: dict[Any, str | None], role: str) -> list[Any]:
    """Of things (files, split names) by split kind, those a source of `role` reads: a
    training one all but the held-out (and unlisted) ones, a validation one the validation
    ones, else the test ones; a test one the test ones."""
    if role == "train":
        return [k for k, kind in named.items() if kind not in (*HELD_OUT_SPLITS, UNLISTED)]
    wanted = "validation" if role == "validation" and "validation" in named.values() else "test"
    return [k for k, kind in named.items() if kind == wanted]


def card_problem(path: Path, label: str, split: str | None) -> str | None:
    """A local folder whose README.md lists several configurations (dataset_card), or
    several splits that one read would join (UltraChat's train_sft and train_gen) with no
    `::split` naming one; or a `::split` the card does not list."""
    if problem := configs_problem(path, label):
        return problem
    try:
        splits = card_splits(path) if path.is_dir() else {}
    except OSError:
        return None
    names = ", ".join(shown_name(name) for name in list(splits)[:8])
    if split is not None:
        if split in splits:
            return None
        listed = f"a local folder whose README.md lists {names}" if splits else "local"
        return (
            f"{label}: ::{shown_name(split)} picks a split of a hub dataset, and "
            f"{shown_path(path)} is {listed}: name the files to read (a split's file or folder)"
        )
    # the splits a read of the folder joins, as split_files reads their files
    joined = _read({name: split_word(name) for name in splits}, field_role(label))
    if len(joined) < 2:
        return None
    shown = ", ".join(shown_name(name) for name in joined[:8])
    return (
        f"{label}: {shown_path(path)} holds a hub dataset's splits {shown} (as its README.md "
        f"lists them), whose files would all be read together; name one, e.g. "
        f"{shown_path(path)}::{shown_name(joined[0]).strip(chr(39))}"
    )
