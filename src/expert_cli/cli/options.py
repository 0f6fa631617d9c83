"""Options that several commands share."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

ManifestOpt = Annotated[
    Path,
    typer.Option("--manifest", "-m", help="Path to the expert's manifest.json."),
]

AdapterOpt = Annotated[
    Path,
    typer.Option("--adapter", metavar="RUN_DIR", help="A trained run folder (train's output)."),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON object.")]
