"""A hub dataset read from its cached snapshot (offline, or the hub not reachable:
`hub.dataset_snapshot`), judged as the datasets library will read it: the configuration and
split the reference names (`name::split::config`) must be among the snapshot's, and data
files of a format the library leaves out are named. `check` says this before a run, and the
build before it loads the dataset, each naming the manifest field: it failed in the build
with the library's words, naming no field.

Only names are shown (configurations, splits, formats), never a file's contents; the
library's message, where it is the one said, is cut to its first line.
"""

from __future__ import annotations

import os
import re
from collections import Counter
from pathlib import Path
from typing import Any

import datasets
from datasets.load import dataset_module_factory

from expert_cli.config.refs import is_data_file, suffix_format
from expert_cli.config.resolve import SourceRef
from expert_cli.data.discovery import files_under
from expert_cli.data.file_text import shown_name, shown_names
from expert_cli.data.hub import dataset_snapshot
from expert_cli.paths import shown_path

MESSAGE_CHARS = 300  # the library's message, where said, cut to this
# the formats of our reader as the datasets library's packaged builders name them
BUILDER_FORMAT = {
    "jsonl": "json",
    "json": "json",
    "csv": "csv",
    "parquet": "parquet",
    "arrow": "arrow",
}
# what the library's split argument may add to a split's name: a slice (with its rounding,
# `train[:33%](pct1_dropremainder)`); splits are summed with +
SLICE = re.compile(r"\[[^\]]*\](\([^)]*\))?$")


def snapshot_lines(ref: SourceRef) -> tuple[list[str], list[str]]:
    """(problems, notes) of reading hub dataset `ref` from its cached snapshot; nothing
    where it is not read so (a local source, the hub reachable, no snapshot)."""
    if ref.kind != "hub":
        return [], []
    local = dataset_snapshot(ref.location, ref.revision)
    if local is None:
        return [], []
    where = (
        f"{ref.field}: hub dataset {ref.location} (read from its cached snapshot, "
        f"{shown_path(local)})"
    )
    if missing := _links_to_nothing(local):  # the library read the rest, in silence
        return [
            f"{where} lacks {len(missing)} of its data files ({shown_names(missing)}: links to "
            "blobs never downloaded in full); download it again: hf download "
            f"{ref.location} --repo-type dataset"
        ], []
    try:
        problem = _config_problem(ref, dataset_module_factory(str(local)))
        if problem:
            return [f"{where} {problem}"], []
        builder = datasets.load_dataset_builder(str(local), ref.config)
    except Exception as exc:  # noqa: BLE001 - the library's any refusal: the user's to fix
        said = str(exc).strip().splitlines()
        detail = f": {said[0][:MESSAGE_CHARS]}" if said else ""
        return [f"{where} cannot be read as a dataset ({type(exc).__name__}{detail})"], []
    splits = [str(s) for s in builder.config.data_files or {}]
    asked = [SLICE.sub("", part.strip()) for part in (ref.split or "train").split("+")]
    missing = [s for s in asked if splits and s not in splits]
    if missing:
        return [
            f"{where} has no split {shown_name(missing[0])} (its splits: "
            f"{shown_names(splits)}); name one: {ref.location}::SPLIT"
        ], []
    return [], _other_formats(where, ref.location, local, builder.name)


def _links_to_nothing(local: Path) -> list[str]:
    """The snapshot's data files (by name) whose links lead to no blob, by their paths in it."""
    found = []
    for parent, _, names in os.walk(local):
        for name in names:
            path = Path(parent, name)
            if is_data_file(path) and os.path.islink(path) and not os.path.exists(path):
                found.append(path.relative_to(local).as_posix())
    return sorted(found)


def _config_problem(ref: SourceRef, module: Any) -> str | None:
    """What is wrong with the configuration `ref` names (or leaves out) among the module's."""
    params = module.builder_configs_parameters
    configs = [c.name for c in params.builder_configs or []]
    if ref.config and configs and ref.config not in configs:
        return (
            f"has no configuration {shown_name(ref.config)} (it has: {shown_names(configs)}); "
            f"name one: {ref.location}::{ref.split or 'train'}::CONFIG"
        )
    if not ref.config and len(configs) > 1 and params.default_config_name is None:
        return (
            f"has several configurations and none is the default ({shown_names(configs)}); "
            f"name one: {ref.location}::{ref.split or 'train'}::CONFIG"
        )
    return None


def _other_formats(where: str, repo: str, local: Path, read: str) -> list[str]:
    """A note where the snapshot holds data files of formats other than the one the library
    reads (it reads one format: the commonest, or the one its splits' files share)."""
    formats = Counter(
        BUILDER_FORMAT[fmt]
        for f in files_under(local)
        if is_data_file(f) and (fmt := suffix_format(f)) in BUILDER_FORMAT
    )
    left = sorted(fmt for fmt in formats if fmt != read)
    if not left or read not in formats:
        return []
    count = sum(formats[f] for f in left)
    return [
        f"{where}: holds {count} {' and '.join(left)} file(s) the datasets library leaves out: it "
        f"reads the {read} ones; download the repository (hf download {repo} --repo-type "
        "dataset --local-dir DIR) and name the files to train on"
    ]
