"""`expert-cli check`: the manifest, everything it points at, and what a run would choose."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from expert_cli.cli.options import MANIFEST_PATH, JsonOpt
from expert_cli.errors import UserError
from expert_cli.paths import shown_path

if TYPE_CHECKING:
    from expert_cli.data.checks import CheckReport

WIDE_SETTINGS = 140  # columns the settings' table needs to show each key whole


def check(
    manifest: Annotated[
        Path | None,
        typer.Option(
            "--manifest", "-m", help="Path to the expert's manifest.json.", parser=MANIFEST_PATH
        ),
    ] = None,
    as_json: JsonOpt = False,
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
    overrides: Annotated[
        list[str] | None,
        typer.Option(
            "--set", metavar="KEY=VALUE", help="Check with a field overridden, as train would."
        ),
    ] = None,
    package: Annotated[
        Path | None,
        typer.Option(
            "--package",
            metavar="FILE",
            help="Check a .expert package instead: manifest, files, checksum.",
        ),
    ] = None,
    list_settings: Annotated[
        bool,
        typer.Option(
            "--list-settings",
            help=(
                "List the training.config keys --set accepts (it takes any manifest field by "
                "its dotted path too), and exit."
            ),
        ),
    ] = False,
) -> None:
    """Validate a manifest and everything it points at, without training."""
    given = [
        flag
        for flag, on in (
            ("--manifest", manifest is not None),
            ("--package", package is not None),
            ("--list-settings", list_settings),
        )
        if on
    ]
    if len(given) > 1:
        raise UserError(f"{' and '.join(given)}: give one of them (each is a check of its own)")
    if package is not None and (overrides or quick):
        raise UserError("--package: --set and --quick apply to a manifest check, not a package")
    if list_settings:
        render_settings(as_json)
        return
    if package is not None:
        check_package(package, as_json)
        return
    if manifest is None:
        raise UserError("--manifest: required (or --package FILE, or --list-settings)")
    from expert_cli.cli.render import BuildBar
    from expert_cli.config.loading import apply_overrides, read_manifest_json
    from expert_cli.data.checks import check_manifest
    from expert_cli.train.adapter import start_problem
    from expert_cli.train.package_manifest import author_notes

    report = check_manifest(
        manifest,
        quick,
        BuildBar(),
        overrides or [],
        model_check=start_problem,
    )
    if report.config is not None:  # the manifest is valid: what `package` will ask of it,
        # with the --set values (the packaged manifest holds those train is given)
        given = apply_overrides(read_manifest_json(manifest), overrides or [])
        report.notes += author_notes(given, report.config)
    if as_json:
        typer.echo(json.dumps(report.to_dict(), indent=2, default=str))
    else:
        render_report(report, quick)
    if not report.usable:
        raise typer.Exit(code=2)


def _cached_line(hub: dict[str, Any]) -> str:
    from expert_cli.data.discovery import human_size

    return f"{hub['kind']}: {hub['repo']} ({human_size(hub['cached_bytes'])}) {hub['cache_path']}"


def check_package(path: Path, as_json: bool) -> None:
    """`check --package`: exit 2 when the package has problems."""
    from expert_cli.cli.ship import render_package
    from expert_cli.errors import UserError
    from expert_cli.paths import not_a_folder, path_is_file, shown_path
    from expert_cli.train.package_check import verify_package

    if not path_is_file(path):  # said as such, not as a package's table with no file in it
        what = not_a_folder(path, "file")
        raise UserError(f"--package {shown_path(path)}: {what}; expected a .expert file")
    report = verify_package(path)
    if as_json:
        typer.echo(json.dumps(report.to_dict(), indent=2))
    else:
        render_package(report, "checked")
        verdict = "[bold green]sound[/]" if report.ok else "[bold red]not sound[/]"
        from expert_cli.cli.render import console

        console().print(f"package is {verdict}")
    if not report.ok:
        raise typer.Exit(code=2)


def render_settings(as_json: bool) -> None:
    """The `training.config` fields: what `--set KEY=VALUE` (a bare KEY) can change."""
    from dataclasses import asdict

    from rich.table import Table
    from rich.text import Text

    from expert_cli.cli.render import console
    from expert_cli.config import TrainingConfig
    from expert_cli.config.fields import describe_fields

    docs = describe_fields(TrainingConfig)
    if as_json:
        typer.echo(json.dumps([asdict(d) for d in docs], indent=2))
        return
    out = console()
    width = max(out.width, 40)

    def wrapped(text: str, indent: str = "", later: str = "    ") -> str:
        lines = textwrap.wrap(text, width, initial_indent=indent, subsequent_indent=later,
                              break_on_hyphens=False)  # fmt: skip
        return "\n".join(lines)

    if width >= WIDE_SETTINGS:
        table = Table("key", "type", "default", "limits", "meaning", title="--set KEY=VALUE")
        for doc in docs:
            table.add_row(
                *(Text(v) for v in (doc.name, doc.type, doc.default, doc.limits, doc.meaning))
            )
        out.print(table)
    else:  # five columns cut the keys themselves short (target_modul…): one block a key
        out.print("--set KEY=VALUE", markup=False)
        for doc in docs:
            out.print(wrapped(f"{doc.name}  {doc.type}", later="      "), markup=False)
            facts = [f"default {doc.default}", *([f"limits {doc.limits}"] if doc.limits else [])]
            out.print(wrapped("; ".join(facts) + f". {doc.meaning}", "    "), markup=False)
    out.print(
        wrapped(
            "A bare KEY sets training.config.KEY (or the top-level field of that name: "
            "version, description...); a dotted path sets any field, e.g. "
            "--set base_models.0.quantization=int4. Values are JSON where they parse as JSON.",
            later="",
        ),
        markup=False,
    )


def render_report(report: CheckReport, quick: int | None = None) -> None:
    """The report as rich tables: manifest, resolved configuration, environment, decisions,
    downloads, problems, the examples read (`quick`: a count that reached it is a least),
    and the verdict."""
    from rich.table import Column, Table

    from expert_cli.cli.render import console as make_console
    from expert_cli.cli.render import one_line, plain

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
        # values fold onto more lines, never cut with "…": a log of a piped check (80
        # columns) kept the paths only in part
        value = Column("value", overflow="fold")
        table = Table("setting", value, title="resolved configuration", show_lines=False)
        for key, value in report.config.items():
            if key in ("train_sources", "validation_sources", "test_sources"):
                value = ", ".join(shown_path(s["location"]) for s in value) or "-"
            table.add_row(key, plain(shown_path(str(value), 400)))
        console.print(table)
        env = Table("environment", Column("value", overflow="fold"))
        for key, value in report.environment.items():
            if key != "packages":
                env.add_row(key, plain(value))
        console.print(env)
    cached = [_cached_line(h) for h in report.hub if h["cache_path"]]
    for title, style, items in (
        ("decisions", "cyan", report.notes),
        ("in the local cache", "green", cached),
        ("downloads", "yellow", report.downloads),
        ("problems", "bold red", report.problems),
    ):
        if items:
            console.print(f"[{style}]{title}:[/{style}]")
            for item in items:
                console.print(f"  - {one_line(item)}", markup=False)
    if report.rows_checked:  # what was read; rows, tokens and steps come with the cache
        read = ", ".join(
            f"{n:,}{'+' if quick and n >= quick else ''} in {shown_path(p)}"
            for p, n in report.rows_checked.items()
        )
        console.print(
            f"data: examples read: {read} (`expert-cli pretokenize` gives the packed rows, "
            "tokens and optimizer steps)",
            markup=False,
        )
    verdict = "[bold green]usable[/]" if report.usable else "[bold red]not usable[/]"
    console.print(f"manifest is {verdict}")
