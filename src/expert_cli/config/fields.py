"""The manifest's fields described from the Pydantic models: name, type, default, limits and
meaning. docs/manifest.md and `expert-cli check --list-settings` are both made from this, so
neither can drift from what the loader accepts."""

from __future__ import annotations

import types
import typing
from dataclasses import dataclass

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined


@dataclass(frozen=True)
class FieldDoc:
    """One field as a reader sees it (`type` uses ` | ` between alternatives)."""

    name: str
    alias: str | None
    type: str
    default: str
    limits: str
    meaning: str


def describe_fields(model: type[BaseModel]) -> list[FieldDoc]:
    """Every field of `model`, in declaration order."""
    hints = typing.get_type_hints(model, include_extras=True)
    return [
        FieldDoc(
            name=name,
            alias=info.alias,
            type=type_name(hints[name]),
            default=_default(info),
            limits=_bounds(info, hints[name]),
            meaning=info.description or "",
        )
        for name, info in model.model_fields.items()
    ]


def type_name(annotation: object) -> str:
    """A short readable type: `int`, `list[str]`, `"lora" | "dora"`."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if annotation is type(None):
        return "null"
    if origin is typing.Annotated:
        return type_name(args[0])
    if origin is typing.Literal:
        return " | ".join(f'"{a}"' for a in args)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(type_name(a) for a in args)
    if origin is not None:
        inner = ", ".join(type_name(a) for a in args)
        return f"{getattr(origin, '__name__', str(origin))}[{inner}]"
    if annotation is typing.Any:
        return "any"
    return getattr(annotation, "__name__", str(annotation))


def _annotated_bounds(annotation: object) -> list[object]:
    """Constraints hidden inside Annotated aliases such as `Probability`."""
    found: list[object] = []
    if typing.get_origin(annotation) is typing.Annotated:
        for meta in typing.get_args(annotation)[1:]:
            found += getattr(meta, "metadata", [meta])
    for arg in typing.get_args(annotation):
        if typing.get_origin(annotation) is not typing.Annotated:
            found += _annotated_bounds(arg)
    return found


def _default(info: FieldInfo) -> str:
    if info.default_factory is not None:
        value = info.default_factory()  # type: ignore[call-arg]
        return "{}" if isinstance(value, BaseModel) else repr(value)
    if info.default is PydanticUndefined:
        return "required"
    return repr(info.default) if info.default is not None else "unset"


def _bounds(info: FieldInfo, annotation: object) -> str:
    parts = []
    for item in [*info.metadata, *_annotated_bounds(annotation)]:
        for key, sign in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<")):
            value = getattr(item, key, None)
            if value is not None:
                parts.append(f"{sign} {value}")
    return ", ".join(parts)
