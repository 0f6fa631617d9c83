"""Options that several commands share."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

ManifestOpt = Annotated[
    Path,
    typer.Option("--manifest", "-m", help="Path to the expert's manifest.json."),
]


def output_file(path: Path | None, option: str) -> Path | None:
    """A file option's path checked before any work: its folder exists, and the path is not a
    folder, a device or another special file (the write renames a new file over it, which
    would replace such a node)."""
    from expert_cli.errors import UserError

    if path is None:
        return None
    if path.exists() and not path.is_file():
        raise UserError(f"{option}: {path} is not a regular file; give a file path")
    if not path.parent.is_dir():
        raise UserError(f"{option}: folder {path.parent} does not exist")
    return path
