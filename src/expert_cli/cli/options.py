"""Options that several commands share."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer

from expert_cli.errors import UserError, escaped


def path_named(option: str, what: str) -> Callable[[str], Path]:
    """A parser for an option that names something to read: an empty value refused (pathlib
    reads it as the current folder, which was then refused as no manifest, or read)."""

    def parse(value: str) -> Path:
        if not value.strip():
            raise UserError(f"{option}: is empty; expected {what}")
        return Path(value)

    return parse


MANIFEST_PATH = path_named("--manifest", "the path of an expert's manifest.json")

ManifestOpt = Annotated[
    Path,
    typer.Option(
        "--manifest", "-m", help="Path to the expert's manifest.json.", parser=MANIFEST_PATH
    ),
]

AdapterOpt = Annotated[
    Path,
    typer.Option(
        "--adapter",
        metavar="RUN_DIR",
        help="A trained run folder (train's output).",
        parser=path_named("--adapter", "a trained run's folder"),
    ),
]

# whether this command line asked for --json: an error then prints a JSON object on stdout too
# (`{"error": {...}}`), so that a script reading stdout gets JSON whatever happens
JSON_ASKED = {"on": False}


def _json_asked(value: bool) -> bool:
    if value:
        JSON_ASKED["on"] = True
    return value


JsonOpt = Annotated[
    bool,
    typer.Option(
        "--json",
        help="Print one JSON object (where the command cannot run, as for a refused "
        'argument: {"error": {kind, exit_code, lines}}).',
        callback=_json_asked,
    ),
]


def file_named(option: str) -> Callable[[str], Path]:
    """A parser for an option that names a file to write: its value as a path, and a value
    that ends in a slash refused (pathlib drops the slash, and the file was written under the
    name the user gave as a folder's)."""

    def parse(value: str) -> Path:
        if value.endswith(("/", os.sep)) and value.strip("/"):
            raise UserError(
                f"{option} {escaped(value)}: ends in a slash, which names a folder; give the "
                "file's name"
            )
        return Path(value)

    return parse


def folder_named(option: str) -> Callable[[str], Path]:
    """A parser for an option that names a folder to read (an empty value was the current
    folder, searched in its place)."""
    return path_named(option, "a folder's path")
