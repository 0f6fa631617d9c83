"""`expert-cli check`: the manifest, everything it points at, and what a run would choose."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Annotated

import typer

from expert_cli.cli.options import ManifestOpt
from expert_cli.paths import shown_path

if TYPE_CHECKING:
    from expert_cli.data.checks import CheckReport


def check(
    manifest: ManifestOpt,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
    quick: Annotated[
        int | None,
        typer.Option(
            "--quick",
            min=1,
            max=1_000_000_000,
            metavar="ROWS",
            help="Check only the first ROWS rows of each data file (default: every row).",
        ),
    ] = None,
) -> None:
    """Validate a manifest and everything it points at, without training."""
    from expert_cli.cli.render import BuildBar
    from expert_cli.data.checks import check_manifest

    report = check_manifest(manifest, quick, BuildBar())
    if as_json:
        typer.echo(json.dumps(report.to_dict(), indent=2, default=str))
    else:
        render_report(report)
    if not report.usable:
        raise typer.Exit(code=2)


def render_report(report: CheckReport) -> None:
    """The report as rich tables: manifest, resolved configuration, environment, decisions,
    downloads, problems, and the verdict."""
    from rich.table import Table
    from rich.text import Text

    from expert_cli.cli.render import console as make_console

    console = make_console()
    man = report.manifest
    if "name" in man:
        console.print(
            f"{man['name']} {man['version']} (schema {man['schema_version']}) "
            f"from {shown_path(man['path'])}",
            markup=False,
            style="bold",
        )
    else:  # the manifest did not load: the problems below say why
        console.print(shown_path(man["path"]), markup=False, style="bold")
    if report.config:
        table = Table("setting", "value", title="resolved configuration", show_lines=False)
        for key, value in report.config.items():
            if key in ("train_sources", "validation_sources"):
                value = ", ".join(shown_path(s["location"]) for s in value) or "-"
            table.add_row(key, Text(shown_path(str(value), 400)))
        console.print(table)
        env = Table("environment", "value")
        for key, value in report.environment.items():
            if key != "packages":
                env.add_row(key, str(value))
        console.print(env)
    for title, style, items in (
        ("decisions", "cyan", report.notes),
        ("downloads", "yellow", report.downloads),
        ("problems", "bold red", report.problems),
    ):
        if items:
            console.print(f"[{style}]{title}:[/{style}]")
            for item in items:
                console.print(f"  - {item}", markup=False)
    verdict = "[bold green]usable[/]" if report.usable else "[bold red]not usable[/]"
    console.print(f"manifest is {verdict}")
