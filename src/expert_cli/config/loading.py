"""Reading a manifest file into the models: comments, `--set` overrides, error messages, paths.

Every problem comes out as a `json.path: message` line, unknown keys with the nearest valid key.
"""

from __future__ import annotations

import difflib
import json
import re
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from expert_cli.config.base import MAX_VALUE_ERRORS, strip_comments
from expert_cli.config.error_lines import format_errors, loc_text, takes_text_only
from expert_cli.config.models import DatasetSpec, LoadedManifest, Manifest
from expert_cli.config.training_config import TrainingConfig
from expert_cli.errors import UserError
from expert_cli.jsontext import json_int
from expert_cli.paths import resolved_path, shown_path

# --------------------------------------------------------------------------- loading

MAX_MANIFEST_BYTES = 16 << 20  # a manifest is a few KB; anything this big is not one
# training.config's fields written under an alias (evaluation_strategy as eval_strategy),
# and each spelling's other
ALIASES = {name: f.alias for name, f in TrainingConfig.model_fields.items() if f.alias}
OTHER_SPELLING = {**ALIASES, **{alias: name for name, alias in ALIASES.items()}}


def read_manifest_json(path: Path) -> dict[str, Any]:
    """Read the manifest file, with errors that name it and the line of a JSON mistake (and
    never its contents)."""
    shown = shown_path(path)
    try:
        if not path.exists():
            raise UserError(f"{shown}: manifest not found")
        if path.is_dir():
            raise UserError(f"{shown}: is a folder; expected a manifest.json file")
        if not path.is_file():
            raise UserError(f"{shown}: not a regular file (a device, pipe or socket)")
        if path.stat().st_size > MAX_MANIFEST_BYTES:
            raise UserError(f"{shown}: over {MAX_MANIFEST_BYTES >> 20} MB; not a manifest")
        # utf-8-sig: a BOM (Windows editors write one) is no part of the JSON
        data, repeated = parse_manifest_text(path.read_text(encoding="utf-8-sig"))
    except json.JSONDecodeError as exc:
        if not exc.doc.strip():  # an empty file read as "UTF-16": 0 NULs >= 0 characters
            raise UserError(f"{shown}: is empty; expected a JSON object") from None
        if exc.doc.count("\x00") * 4 >= len(exc.doc):  # UTF-16 without its byte-order
            # mark reads as UTF-8 with a NUL beside each ASCII character
            raise UserError(
                f"{shown}: not UTF-8 text (NUL bytes: UTF-16?); save it as UTF-8"
            ) from None
        raise UserError(f"{shown}:{exc.lineno}:{exc.colno}: invalid JSON ({exc.msg})") from None
    except RecursionError:
        raise UserError(f"{shown}: JSON nested too deeply") from None
    except UnicodeDecodeError as exc:
        raise UserError(f"{shown}: byte {exc.start}: not UTF-8 text") from None
    except (OSError, ValueError) as exc:  # too long a name, a symlink loop, a NUL byte
        reason = getattr(exc, "strerror", None) or type(exc).__name__
        raise UserError(f"{shown}: cannot be read ({reason})") from None
    if not isinstance(data, dict):
        raise UserError(f"{shown}: expected a JSON object at the top level")
    if repeated:
        raise UserError([f"{path.name}: {line}" for line in repeated])
    return data


def parse_manifest_text(text: str) -> tuple[Any, list[str]]:
    """The JSON value of a manifest's text, and a `json.path: ...` line for each key given
    twice in one object (JSON keeps the last silently: a second `learning_rate` further down
    would win unseen). Raises what `json.loads` raises."""
    data, repeated = parse_json_text(text)
    lines = [
        f"{loc_text(loc)}: given more than once; keep one (JSON would silently use the last)"
        for loc in repeated
    ]
    if len(lines) > MAX_VALUE_ERRORS:
        lines = [*lines[:MAX_VALUE_ERRORS], f"{len(lines) - MAX_VALUE_ERRORS} more keys like these"]
    return data, lines


def parse_json_text(text: str, **read: Any) -> tuple[Any, list[tuple[Any, ...]]]:
    """The JSON value of `text` (`read`: json.loads's number and constant hooks; whole
    numbers as `json_int` reads them unless given), and the place of each key given twice in
    one object. Comment keys (`_...`) may repeat: they are notes, not settings."""
    repeated: list[tuple[dict[str, Any], str]] = []
    data = json.loads(text, object_pairs_hook=_keeping(repeated), **{"parse_int": json_int, **read})
    if not repeated:
        return data, []
    where = {id(obj): loc for loc, obj in _objects(data, ())}
    return data, list(dict.fromkeys((*where.get(id(obj), ()), key) for obj, key in repeated))


def _keeping(repeated: list[tuple[dict[str, Any], str]]) -> Any:
    """A JSON object hook that notes each key given twice in one object, but comment keys."""

    def build(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        obj: dict[str, Any] = {}
        for key, value in pairs:
            if key in obj and not key.startswith("_"):
                repeated.append((obj, key))
            obj[key] = value
        return obj

    return build


def _objects(value: Any, loc: tuple[Any, ...]) -> Any:
    """(location, object) for every JSON object in `value`, depth first, without recursion
    (a manifest may nest deeply)."""
    stack = [(loc, value)]
    while stack:
        loc, value = stack.pop()
        if isinstance(value, dict):
            yield loc, value
            stack.extend(((*loc, k), v) for k, v in value.items())
        elif isinstance(value, list):
            stack.extend(((*loc, i), v) for i, v in enumerate(value))


SHOWN_SET_CHARS = 80
# a whole number in exponent form on the command line (--set max_steps=1e3) is that number
WHOLE_IN_EXPONENT = re.compile(r"-?[0-9]+[eE]\+?[0-9]+")


def _shown_set(item: str) -> str:
    """A `--set` as an error names it: a long value cut, with its length (a 5,000-digit
    number filled the terminal)."""
    if len(item) <= SHOWN_SET_CHARS:
        return item
    return f"{item[: SHOWN_SET_CHARS - 20]}... ({len(item):,} characters)"


def parse_override(item: str) -> tuple[list[str], Any]:
    """Parse one `--set key=value`. A bare key means `training.config.<key>`, but for the
    manifest's own top-level fields (`version`, `description`), which it names."""
    key, sep, text = item.partition("=")
    if not sep or not key.strip():
        raise UserError(
            f"--set {_shown_set(item)}: expected key=value, e.g. --set learning_rate=1e-4"
        )
    try:
        value = json.loads(text, parse_int=json_int)
    except json.JSONDecodeError:
        value = text
    if isinstance(value, float) and WHOLE_IN_EXPONENT.fullmatch(text.strip()):
        value = int(value) if value.is_integer() else value  # 1e3 (not 1e400: infinity)
    parts = key.strip().split(".")
    if not all(part.strip() for part in parts):
        raise UserError(
            f"--set {_shown_set(item)}: the key has an empty name between its dots; expected "
            "a field's path, e.g. --set training.config.rank=8 (or rank=8)"
        )
    if len(parts) == 1 and parts[0] not in Manifest.model_fields:  # `version` is top-level
        parts = ["training", "config", *parts]
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if number and takes_text_only(_as_loc(parts)):  # version=1.0 is the text 1.0
        value = text.strip()
    return parts, value


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Return a copy of `data` with each `--set` applied (lists indexed by number)."""
    data = json.loads(json.dumps(data))
    for item in overrides:
        parts, value = parse_override(item)
        _refuse_unknown_top(item, parts[0], data)
        node: Any = data
        for part in parts[:-1]:
            if isinstance(node, list) and part.isdigit() and int(part) < len(node):
                node = node[int(part)]
            elif isinstance(node, dict):
                node = node.setdefault(part, {})
            else:
                raise UserError(
                    f"--set {_shown_set(item)}: {part} is not an object in the manifest"
                )
        last = parts[-1]
        if isinstance(node, list) and last.isdigit() and int(last) < len(node):
            node[int(last)] = value
        elif isinstance(node, dict):
            node[last] = value
            _given_warmup_wins(node, last, overrides)
            if parts[:-1] == ["training", "config"] and last in OTHER_SPELLING:
                node.pop(OTHER_SPELLING[last], None)  # either spelling replaces the other
        elif isinstance(node, list) and last.isdigit():
            raise UserError(
                f"--set {_shown_set(item)}: item {last} is past the end of the list (it holds "
                f"{len(node):,}); a --set changes an item the list has, or sets the whole list"
            )
        else:
            raise UserError(f"--set {_shown_set(item)}: cannot set {last} there")
    return data


def _given_warmup_wins(config: dict[str, Any], key: str, overrides: list[str]) -> None:
    """A `--set warmup_steps` takes the place of the manifest's warmup_ratio (which wins over
    warmup_steps written beside it: the override was noted and not applied), unless a `--set`
    gives the ratio too."""
    if key != "warmup_steps" or "warmup_ratio" not in config:
        return
    if not any(parse_override(item)[0][-1] == "warmup_ratio" for item in overrides):
        del config["warmup_ratio"]


def _refuse_unknown_top(item: str, top: str, data: dict[str, Any]) -> None:
    """A `--set` that would add a top-level block the manifest format does not know (the
    manifest keeps unknown top-level keys, so `trainng.config.rank=4` was kept and did
    nothing): refused, with the nearest known name."""
    if top in data or top in Manifest.model_fields:
        return
    close = difflib.get_close_matches(top, list(Manifest.model_fields), n=1, cutoff=0.6)
    hint = f"; did you mean {close[0]}?" if close else ""
    raise UserError(
        f"--set {_shown_set(item)}: {top} is not a block of the manifest{hint} (a bare key such as "
        "rank=4 sets training.config.rank)"
    )


def load_dataset_block(path: Path) -> tuple[str | None, DatasetSpec]:
    """The expert's name and its validated `training.dataset` block alone (for listing what a
    manifest reads even when the rest of it would not validate)."""
    data = strip_comments(read_manifest_json(path))
    training = data.get("training")
    block = training.get("dataset") if isinstance(training, dict) else None
    if not isinstance(block, dict):
        raise UserError(f"{path.name}: training.dataset: required object is missing")
    try:
        spec = DatasetSpec.model_validate(block)
    except ValidationError as exc:
        raise UserError(
            [f"{path.name}: training.dataset." + line for line in format_errors(exc)]
        ) from None
    name = data.get("name")
    return (name if isinstance(name, str) else None), spec


def load_manifest(path: str | Path, overrides: list[str] | None = None) -> LoadedManifest:
    """Read, de-comment, override and validate a manifest; UserError lists every problem."""
    path = resolved_path(path, "--manifest")
    raw = read_manifest_json(path)
    data = apply_overrides(raw, overrides or [])  # comments too: the model checks them
    _one_spelling(data, path.name)
    try:
        manifest = Manifest.model_validate(data)
    except ValidationError as exc:
        raise UserError(_attributed(format_errors(exc), path.name, overrides or [])) from None
    missing = missing_files(manifest, path.parent)
    if missing:
        raise UserError(_attributed(missing, path.name, overrides or []))
    return LoadedManifest(manifest=manifest, path=path, raw=raw)


def _one_spelling(data: dict[str, Any], file_name: str) -> None:
    """A field given under both its name and its alias: one value, said as such (pydantic
    took the alias and called the name an unknown field)."""
    training = data.get("training")
    config = training.get("config") if isinstance(training, dict) else None
    if not isinstance(config, dict):
        return
    both = [
        f"{file_name}: training.config: {name} and {alias} are one field (one is the "
        "other's alias); give one of them"
        for name, alias in ALIASES.items()
        if name in config and alias in config
    ]
    if both:
        raise UserError(both)


def missing_files(manifest: Manifest, folder: Path) -> list[str]:
    """`json.path: message` for each file the manifest names beside it that is not there (the
    grammar file, which `package` carries): found now, not after training."""
    decoding = manifest.training.decoding
    if decoding is None or decoding.grammar_file is None:
        return []
    path = folder / decoding.grammar_file
    try:
        found = path.is_file()
    except (OSError, ValueError):  # a name too long
        found = False
    if found:
        return []
    return [
        f"training.decoding.grammar_file: {shown_path(path)} is not a file; expected a "
        "grammar file, relative to the manifest's folder"
    ]


def _attributed(lines: list[str], file_name: str, overrides: list[str]) -> list[str]:
    """Each `json.path: message` line prefixed by where the value came from: the `--set` that
    set that path, a path inside it, a value inside the object the line is about, or a key
    beside it that the message names (`lr_scheduler` for its kwargs; the last such), else the
    manifest file."""
    sources = [(loc_text(_as_loc(parse_override(item)[0])), item) for item in overrides]
    out = []
    for line in lines:
        where, _, message = line.partition(": ")
        by = [
            item
            for loc, item in sources
            if where == loc
            or where.startswith((loc + ".", loc + "["))
            or loc.startswith((where + ".", where + "["))
            or _names_sibling(where, loc, message)
        ]
        out.append(
            f"--set {_shown_set(by[-1])}: {line}{_quote_hint(by[-1], message)}"
            if by
            else f"{file_name}: {line}"
        )
    return out


def _quote_hint(item: str, message: str) -> str:
    """How to give a string where a `--set` value read as JSON was a number, a boolean or
    null (`version=1.0` is the number 1.0)."""
    key, _, text = item.partition("=")
    if "valid string" not in message or isinstance(parse_override(item)[1], str):
        return ""
    quoted = _shown_set(f'{key.strip()}="{text}"')
    return f"; a --set value is read as JSON where it parses: quote it, --set '{quoted}'"


def _as_loc(parts: list[str]) -> tuple[str | int, ...]:
    """A `--set` key's parts as an error names its place: `tags.0` is `tags[0]`."""
    return tuple(int(part) if part.isdigit() else part for part in parts)


def _names_sibling(where: str, loc: str, message: str) -> bool:
    """Whether `loc` is a key beside `where` (same object) that `message` names as a word."""
    parent, _, key = loc.rpartition(".")
    named = re.search(rf"(?<![\w]){re.escape(key)}(?![\w])", message) is not None
    if where == loc_text(()):  # a line about the manifest as a whole: its own keys
        return not parent and named
    return bool(parent and parent == where.rpartition(".")[0] and named)
