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
