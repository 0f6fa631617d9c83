"""How `--help` reads: flags without a type, values named for what they hold (PATH, N, SECONDS,
KEY=VALUE) instead of `<list[Path]>`, and examples under every command."""

from __future__ import annotations

import typing
from pathlib import Path
from typing import Any

from typer.core import TyperCommand, TyperGroup

# an option's value by its Python type, where the option does not name it itself
METAVARS = {Path: "PATH", int: "N", float: "NUMBER", str: "TEXT"}


def _readable(params: list[Any]) -> list[Any]:
    for param in params:
        if param.param_type_name == "argument":
            if param.metavar is not None:  # its name says it all: no `<path>` type beside it
                param.display_type_rich = lambda ctx: None
            continue
        if getattr(param, "metavar", None) is not None:
            continue
        if getattr(param, "is_flag", False):
            param.metavar = ""  # a flag takes no value: nothing to show
            continue
        annotation = getattr(getattr(param, "type_descriptor", None), "annotation", None)
        if typing.get_origin(annotation) is list:
            annotation = typing.get_args(annotation)[0]
        name = METAVARS.get(annotation)
        if name is not None:
            param.metavar = name
    return params


class Command(TyperCommand):
    """A command whose help shows readable value names."""

    def get_params(self, ctx: Any) -> list[Any]:
        return _readable(super().get_params(ctx))


class Group(TyperGroup):
    """The application: readable value names for its own options too."""

    def get_params(self, ctx: Any) -> list[Any]:
        return _readable(super().get_params(ctx))


def examples(*lines: str) -> str:
    """An epilog of example command lines (each shown on its own line)."""
    return "Examples:\n\n" + "\n\n".join(f"  {line}" for line in lines)
