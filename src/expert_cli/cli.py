"""The `expert-cli` command line: parse, call one function, print, map errors to exit codes.

Heavy imports (torch, transformers, datasets) happen inside the commands so that
`expert-cli --help` answers at once.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from expert_cli.errors import RunError, UserError

app = typer.Typer(
    name="expert-cli",
    help="Train LoRA/DoRA/QLoRA expert adapters from HiveLLM manifests, and keep the GPU busy.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

_state = {"verbose": False}

ManifestOpt = Annotated[
    Path,
    typer.Option("--manifest", "-m", help="Path to the expert's manifest.json."),
]


@app.callback()
def _root(
    verbose: Annotated[
        bool, typer.Option("--verbose", "-v", help="Show tracebacks for failures.")
    ] = False,
) -> None:
    _state["verbose"] = verbose


@app.command()
def check(
    manifest: ManifestOpt,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Validate a manifest and everything it points at, without training."""
    from expert_cli.checks import check_manifest, render_report

    report = check_manifest(manifest)
    if as_json:
        typer.echo(json.dumps(report, indent=2, default=str))
    else:
        render_report(report)
    if report["problems"]:
        raise typer.Exit(code=2)


def _print_error(kind: str, exc: BaseException) -> None:
    from rich.console import Console

    console = Console(stderr=True, highlight=False, soft_wrap=True)
    lines = exc.lines if isinstance(exc, UserError) else [str(exc)]
    console.print(f"[bold red]{kind}:[/bold red]")
    for line in lines:
        console.print(f"  {line}", markup=False)


def main() -> None:
    """Console-script entry point."""
    try:
        app(standalone_mode=True)
    except UserError as exc:
        if _state["verbose"]:
            raise
        _print_error("error", exc)
        sys.exit(2)
    except RunError as exc:
        if _state["verbose"]:
            raise
        _print_error("failed", exc)
        sys.exit(1)
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
