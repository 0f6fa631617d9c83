"""A manifest's data sources resolved: each local file or folder, or hub dataset, of the
training and validation data (a multi_task expert's tasks), checked for where it lies."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

from expert_cli.config.models import DatasetSpec, LoadedManifest
from expert_cli.config.refs import (
    is_local,
    local_path,
    split_hub_spec,
    suffix_format,
)
from expert_cli.config.split_names import card_problem
from expert_cli.errors import UserError
from expert_cli.paths import path_exists, path_is_file, shown_path


class SourceRef(BaseModel):
    """One data source: a local file/folder or a hub dataset."""

    kind: Literal["local", "hub"]
    location: str = Field(description="Absolute local path, or the hub dataset id.")
    split: str | None = None
    config: str | None = None
    revision: str | None = None
    format: str | None = None
    weight: float = 1.0
    task: str | None = None
    field: str = Field("training.dataset", description="The manifest field naming it.")


def _source(
    folder: Path,
    spec: str,
    fmt: str | None,
    revision: str | None,
    label: str,
    fmt_field: str = "training.dataset.format",
) -> SourceRef:
    """A local path when it exists (or looks like one), else a hub id. `label` is the
    manifest field that names it, `fmt_field` the one that gave `fmt`."""
    name, split, config = split_hub_spec(spec)
    if not name.strip():
        raise UserError(
            f"{label}: names no dataset before its '::'; expected a local file or folder, or "
            "a hub id, e.g. data/train.jsonl or org/name::train"
        )
    path = local_path(folder, name, label)
    if problem := _format_problem(path, (fmt, fmt_field), label):
        raise UserError(problem)
    if fmt != "huggingface" and is_local(folder, name):
        _refuse_manifest_folder(path, folder, label)
        if problem := card_problem(path, label, split):
            raise UserError(problem)
        if config:  # it was dropped without a word: every file of the folder read
            raise UserError(
                f"{label}: '::{split or ''}::{config}' picks a configuration of a hub dataset, "
                f"and {shown_path(path)} is local: name the files to read (a configuration's "
                "file or folder)"
            )
        return SourceRef(
            kind="local",
            location=str(path),
            split=split,
            config=config,
            format=fmt or suffix_format(path),
            field=label,
        )
    return SourceRef(
        kind="hub",
        location=name,
        split=split,
        config=config,
        revision=revision,
        format="huggingface",
        field=label,
    )


def _format_problem(path: Path, given: tuple[str | None, str], label: str) -> str | None:
    """Why the manifest's `format` cannot be read for the file at `path`: a hub dataset's
    where a local file or folder of that name is there (it was looked for on the hub, and
    the error said no file of that name existed), or another file format than its name's
    (a .parquet file read as JSON lines was called "not UTF-8 text")."""
    fmt, field = given  # the format, and the field that gave it
    if fmt == "huggingface" and path_exists(path):
        return (
            f"{field}: huggingface reads {label} as a hub dataset's id, and {shown_path(path)} "
            "is a local file or folder: remove format (the file's name says how to read it), "
            "or name a hub dataset"
        )
    if fmt == "csv" and path.suffix.lower() == ".tsv" and path_is_file(path):
        return (
            f"{field}: csv reads commas, and {shown_path(path)} holds tab-separated values by "
            "its name; convert it to CSV or JSON Lines"
        )
    named = suffix_format(path) if fmt and fmt != "huggingface" and path_is_file(path) else None
    family = {"jsonl": "json"}  # one reader reads both layouts
    if named and family.get(named, named) != family.get(fmt, fmt):
        return (
            f"{field}: {fmt}, and {shown_path(path)} is a {named} file by its name: remove "
            f"format (the file's name says how to read it), or set it to {named}"
        )
    return None


def _refuse_manifest_folder(path: Path, folder: Path, label: str) -> None:
    """A data folder that holds the manifest (`"path": "."`) would read the manifest, the
    token cache and the run's outputs as data: refused."""
    try:
        holds = path.is_dir() and folder.resolve().is_relative_to(path.resolve())
    except (OSError, RuntimeError):
        return  # the data check names what cannot be read
    if holds:
        same = os.path.realpath(path) == os.path.realpath(folder)
        raise UserError(
            f"{label}: {shown_path(path)} "
            + ("is the folder that holds the manifest" if same else "holds the manifest's folder")
            + "; put the data in a folder of its own (e.g. data/) or name the file"
        )


def data_folder_holding(path: Path, sources: list[SourceRef]) -> str | None:
    """The local data folder among `sources` that `path` is (or lies in, not under a hidden
    folder, which the reader passes over), if any: what is written there (a token cache, a
    run's outputs) would be read back as data."""
    for ref in sources:
        if ref.kind != "local":
            continue
        try:
            folder, target = Path(ref.location).resolve(), path.resolve()
            if not (folder.is_dir() and target.is_relative_to(folder)):
                continue
            if not any(part.startswith(".") for part in target.relative_to(folder).parts):
                return ref.location
        except (OSError, RuntimeError):
            continue  # the data check names what cannot be read
    return None


TASK_NAME_CHARS = 80  # a task's name, as its evaluation's figures are shown


def resolve_sources(lm: LoadedManifest) -> tuple[list[SourceRef], list[SourceRef]]:
    """Training and validation sources of the manifest's dataset block."""
    ds = lm.manifest.training.dataset
    folder = lm.folder
    if ds.type == "multi_task":
        train, valid = [], []
        for number, (name, task) in enumerate((ds.tasks or {}).items(), 1):
            if not (name.strip() and len(name) <= TASK_NAME_CHARS and name.isprintable()):
                raise UserError(  # the console, metrics.json and `report` name each task's loss
                    f"training.dataset.tasks: task {number}'s name: expected 1 to "
                    f"{TASK_NAME_CHARS} printable characters (each task's evaluation is named "
                    "by it)"
                )
            fmt = task.format or ds.format
            at = f"training.dataset.tasks.{name}"
            given = f"{at}.format" if task.format else "training.dataset.format"
            ref = _source(folder, task.train, fmt, ds.revision, f"{at}.train", given)
            train.append(ref.model_copy(update={"weight": task.weight, "task": name}))
            if task.valid:
                ref = _source(folder, task.valid, fmt, ds.revision, f"{at}.valid", given)
                valid.append(ref.model_copy(update={"task": name}))
        return train, valid
    train = [_source(folder, ds.path or "", ds.format, ds.revision, "training.dataset.path")]
    valid = (
        [
            _source(
                folder,
                ds.validation_path,
                ds.format,
                ds.revision,
                label="training.dataset.validation_path",
            )
        ]
        if ds.validation_path
        else []
    )
    return train, valid


def resolve_test_sources(ds: DatasetSpec, folder: Path) -> list[SourceRef]:
    """The test sources of a dataset block (`test_path`, or each task's `test` of a
    multi_task one, named by its task), paths against the manifest's `folder`: what
    `evaluate --split test` reads. A hub dataset named without `::split` is read at its
    `test` split (the reader's default is train)."""
    found = []
    if ds.type == "multi_task":
        for name, task in (ds.tasks or {}).items():
            if task.test:
                at = f"training.dataset.tasks.{name}"
                given = f"{at}.format" if task.format else "training.dataset.format"
                fmt = task.format or ds.format
                ref = _source(folder, task.test, fmt, ds.revision, f"{at}.test", given)
                found.append(ref.model_copy(update={"task": name}))
    elif ds.test_path:
        label = "training.dataset.test_path"
        found.append(_source(folder, ds.test_path, ds.format, ds.revision, label))
    return [
        ref.model_copy(update={"split": "test"}) if ref.kind == "hub" and not ref.split else ref
        for ref in found
    ]
