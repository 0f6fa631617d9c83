"""A local data source, row by row: which files it is, which columns hold which role, and
every row checked against that mapping, with errors that name file, line, field and shape.

`check` counts the checked rows; the build writes them to Arrow (`sources.write_arrow`). Both
read through `reader.read_rows`, so they agree on every file.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import datasets

from expert_cli.config.base import lone_surrogate_at
from expert_cli.config.refs import (
    FILE_FORMATS,
    compression,
    folder_data_files,
    is_training_field,
    of_format,
    split_files,
    suffix_format,
    windows_note,
)
from expert_cli.config.resolve import SourceRef
from expert_cli.data.conversations import form_note, is_text_part, standard_turns
from expert_cli.data.fields import OPTIONAL_ROLES, TOOLS, FieldSpec, field_spec
from expert_cli.data.file_text import repeated_keys, shown_name, shown_names
from expert_cli.data.reader import Columns, column_names, read_rows
from expert_cli.data.tools import TOOLS_SHAPE, parsed_tools
from expert_cli.data.weights import first_bad_weight, weight_problem
from expert_cli.errors import UserError
from expert_cli.paths import path_exists, shown_path

JSON_BATCH_ROWS = 1024  # rows of JSON messages decoded at a time
TWICE = "is given more than once in this row; expected once (which value to train on is unclear)"
SHOWN_PATH = re.compile(r"[\w.\[\]<>-]{1,200}", re.ASCII)  # a key path an error may show
# keys of the chat message format (OpenAI's, Qwen's), shown by name in a path; others: <key>
MESSAGE_KEYS = frozenset(
    ("tool_calls", "function", "arguments", "name", "id", "type", "reasoning_content",
     "thinking", "tool_call_id", "content", "role", "text")
)  # fmt: skip
MESSAGES_SHAPE = (
    'a list of {"role": "...", "content": "..."} objects (content may be a list of text parts, '
    "or null in a turn with tool_calls)"
)


def is_saved_dataset(path: Path) -> bool:
    """Whether `path` is a dataset folder written by `Dataset.save_to_disk`."""
    return path_exists(path / "state.json")


def missing_sources(refs: list[SourceRef]) -> list[str]:
    """The problem of each local source that is not there or cannot be listed, all at once."""
    lines = []
    for ref in refs:
        if ref.kind == "local":
            try:
                source_files(ref)
            except UserError as exc:
                lines += exc.lines
    return lines


def source_files(ref: SourceRef) -> list[Path]:
    """The local files of a source (a file, or the data files of a folder, hidden ones such as
    .cache/ or .ipynb_checkpoints/ left out, and those named for another split: see
    config.refs.split_files), sorted."""
    path = Path(ref.location)
    try:
        if not path.exists():
            raise UserError(f"{shown_path(path)}: not found ({ref.field}){windows_note(path)}")
    except OSError as exc:  # a name too long, a folder that cannot be entered
        raise UserError(f"{shown_path(path)}: cannot be read ({exc.strerror})") from None
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise UserError(f"{path}: not a regular file (a device, pipe or socket)")
    if is_saved_dataset(path):
        return sorted(p for p in path.iterdir() if p.is_file())
    if path_exists(path / "dataset_dict.json"):  # DatasetDict.save_to_disk: a folder a split
        splits = sorted(p.name for p in path.iterdir() if is_saved_dataset(p))
        raise UserError(
            f"{ref.field}: {shown_path(path)} holds several saved splits "
            f"({shown_names(splits[:8]) or 'none readable'}); name one split's folder, e.g. "
            f"{shown_path(path / ('train' if 'train' in splits or not splits else splits[0]))}"
        )
    files = folder_data_files(path)
    if not files:
        raise UserError(f"{path}: folder has no data files ({', '.join(FILE_FORMATS)})")
    if ref.format in FILE_FORMATS.values():  # a folder of several formats: the one named
        files = of_format(files, ref.format)
        if not files:
            raise UserError(f"{path}: folder has no {ref.format} files ({ref.field})")
    training = is_training_field(ref.field)
    kept, left = split_files(path, files, training)
    if not kept:  # a validation source keeps its validation (else test) files: never empty
        raise UserError(
            f"{ref.field}: {shown_path(path)}: every data file in it is named for a held-out "
            f"split (validation, test), e.g. {shown_path(left[0].relative_to(path))}; name the "
            "training files' folder or file"
        )
    return kept


def file_format(ref: SourceRef, files: list[Path]) -> str:
    """The format of a local source's files: the manifest's, else their suffix's."""
    if ref.format in ("jsonl", "json", "csv", "parquet", "arrow"):
        return ref.format
    kinds = {k for k in map(suffix_format, files) if k}
    kinds = {"json" if k == "jsonl" else k for k in kinds}  # one reader reads both layouts
    if len(kinds) > 1:  # a format set reads only its own files (source_files)
        raise UserError(
            f"{ref.location}: holds data files of several formats ({', '.join(sorted(kinds))}); "
            "keep one format in the folder, or set training.dataset.format to the one to read"
        )
    if not kinds and any(compression(f) or f.suffix.lower() == ".zst" for f in files):
        raise UserError(
            f"{ref.location}: a compressed file of no format the reader knows; jsonl, json and "
            "csv files are read compressed with gzip, bz2 or xz, named for both "
            "(data.jsonl.gz): rename it so, or decompress it"
        )
    if not kinds:
        raise UserError(
            f"{ref.location}: cannot tell the file format (no known suffix); set "
            "training.dataset.format"
        )
    return kinds.pop()


def _value_problem(role: str, value: Any) -> str | None:
    """What is wrong with a mapped field's value (None when it is right)."""
    if role in OPTIONAL_ROLES and value is None:
        return None
    if role != "messages":
        if isinstance(value, list) and value and all(isinstance(m, dict) for m in value):
            return (  # TRL's conversational prompt and completion
                f"is {_kind(value)} of objects (turns of a conversation?), expected a string; "
                "write each row's turns as one `messages` list (prompt + completion), then map it"
            )
        if not isinstance(value, str):
            return f"is {_kind(value)}, expected a string"
        return _text_problem(value)
    if not isinstance(value, list):
        return f"is {_kind(value)}, expected {MESSAGES_SHAPE}"
    for i, message in enumerate(value):
        if not isinstance(message, dict):
            return f"item {i} is {_kind(message)}, expected an object with role and content"
        if twice := repeated_keys(message):  # every key of a turn reaches the template
            key = min(twice)
            return f"item {i}: {key if key in MESSAGE_KEYS else shown_name(key)} {TWICE}"
        for key in ("role", "content"):
            text = message.get(key)
            if key == "content" and text is None and _calls_tools(message):
                continue  # a turn that only calls tools (OpenAI's format): content null
            if key == "content" and isinstance(text, list):  # OpenAI's content parts
                if problem := _parts_problem(text):
                    return f"item {i}: content {problem}"
                continue
            if not isinstance(text, str):
                return f"item {i}: {key} is {_kind(text)}, expected a string"
            if problem := _text_problem(text):
                return f"item {i}: {key} {problem}"
        if problem := weight_problem(message):
            return f"item {i}: {problem}"
        others = {k: v for k, v in message.items() if k not in ("role", "content")}
        if others and (found := _surrogate_inside(others)):  # every key reaches the template
            where, text = found
            shown = where if where == "a key" or SHOWN_PATH.fullmatch(where) else "a value"
            return f"item {i}: {shown} {_text_problem(text)}"
    return None


def _surrogate_inside(value: Any) -> tuple[str, str] | None:
    """(the path, such as `tool_calls[0].function.arguments`, and the text) of the first
    string or key inside `value` holding a lone surrogate, or None. One JSON encoding tells
    the common case (none) at C speed; only then is the value walked, without recursion (a
    file may nest as deep as the JSON reader goes). A key that is not one of the message
    format's own is shown as `<key>`: keys inside `arguments` are the user's data."""
    try:
        if lone_surrogate_at(json.dumps(value, ensure_ascii=False)) is None:
            return None
    except (RecursionError, ValueError, TypeError):
        pass
    stack: list[tuple[str, Any]] = [("", value)]
    while stack:
        path, item = stack.pop()
        if isinstance(item, str):
            if lone_surrogate_at(item) is not None:
                return path or "a value", item
        elif isinstance(item, dict):
            entries = list(item.items())
            for key, _ in entries:
                if lone_surrogate_at(str(key)) is not None:
                    return "a key", str(key)
            for key, sub in reversed(entries):
                name = str(key) if str(key) in MESSAGE_KEYS else "<key>"
                stack.append((f"{path}.{name}" if path else name, sub))
        elif isinstance(item, list):
            stack.extend((f"{path}[{n}]", sub) for n, sub in reversed(list(enumerate(item))))
    return None


def _parts_problem(parts: list[Any]) -> str | None:
    """What is wrong with content given as parts (`[{"type": "text", "text": "..."}]`):
    expert-cli trains on text, so every part must be a text part."""
    for j, part in enumerate(parts):
        if not is_text_part(part):
            kind = part.get("type") if isinstance(part, dict) else None
            if kind == "text":  # a text part whose text is not a string (null, a number)
                return f"part {j}: its text is {_kind(part.get('text'))}, expected a string"
            what = f"of type {shown_name(kind)}" if isinstance(kind, str) else _kind(part)
            return (
                f"part {j} is {what}, expected a text part "
                '({"type": "text", "text": "..."}): expert-cli trains on text'
            )
        if "text" in repeated_keys(part):
            return f"part {j}: text {TWICE}"
        if problem := _text_problem(part["text"]):
            return f"part {j} {problem}"
    return None


def _calls_tools(message: dict[str, Any]) -> bool:
    """Whether a message calls tools: a non-empty `tool_calls` list."""
    calls = message.get("tool_calls")
    return isinstance(calls, list) and len(calls) > 0


def _text_problem(text: str) -> str | None:
    """A string that cannot be written as UTF-8: JSON's `\\ud800` escape without its pair
    decodes to a lone surrogate, which Arrow (and the tokenizer) cannot take."""
    at = lone_surrogate_at(text)
    if at is None:
        return None
    return (
        f"contains a lone surrogate at character {at} (a \\ud800-\\udfff escape without its "
        "pair); expected valid Unicode text"
    )


KINDS = {
    "dict": "an object",
    "list": "a list",
    "int": "a number",
    "float": "a number",
    "bool": "a boolean",
    "str": "a string",
}


def _kind(value: Any) -> str:
    if value is None:
        return "missing (null)"
    return KINDS.get(type(value).__name__, f"a {type(value).__name__}")


def check_row(row: Any, fields: FieldSpec, where: str) -> dict[str, Any]:
    """The row's mapped values by role, or a UserError naming the place and the field."""
    if not isinstance(row, dict):
        raise UserError(f"{where}: expected an object with named fields, found {_kind(row)}")
    out = {}
    repeated = repeated_keys(row)
    for role, column in fields.mapping.items():
        if column in repeated:
            raise UserError(f"{where}: field {shown_name(column)} (field_mapping.{role}) {TWICE}")
        value = row.get(column)
        if value is None and role not in OPTIONAL_ROLES:
            present = "" if column in row else f"; this row has {shown_names(list(row))}"
            wanted = "a list of messages" if role == "messages" else "text"
            how = f"is empty (null), where {wanted} is expected" if column in row else "missing"
            raise UserError(
                f"{where}: field {shown_name(column)} {how} (field_mapping.{role}){present}"
            )
        turns = standard_turns(value) if role == "messages" else value
        if role == TOOLS:  # a list of objects, or its JSON text: kept as the list
            turns, problem = parsed_tools(value)
            found = _surrogate_inside(turns) if turns and not problem else None
            problem = problem or (found and f"{found[0]} {_text_problem(found[1])}")
        else:
            problem = _value_problem(role, turns)
        if problem:
            problem += form_note(value) if role == "messages" else ""
            named = (  # a detected input or system: the user wrote no mapping to blame
                f"read as {role}: set training.dataset.field_mapping to leave it out"
                if role in fields.maybe
                else f"field_mapping.{role}"
            )
            raise UserError(f"{where}: field {shown_name(column)} ({named}) {problem}")
        out[role] = turns
    return out


def messages_problem(ds: datasets.Dataset, column: str) -> tuple[int, str] | None:
    """(row index, problem) of the first row of a hub or saved dataset's `messages` column the
    row checks refuse, or None. A column of JSON messages (the datasets library's type where
    the turns' keys differ: a weight or tool_calls on some) is read row by row, as a file's
    rows are; a struct column's weights are checked in Arrow (its shape is typed)."""
    if not isinstance(getattr(ds.features[column], "feature", None), datasets.Json):
        return first_bad_weight(ds.data.column(column))
    batches = ds.select_columns([column]).iter(batch_size=JSON_BATCH_ROWS)
    for i, value in enumerate(value for batch in batches for value in batch[column]):
        if value is not None and (problem := _value_problem("messages", standard_turns(value))):
            return i, problem + form_note(value)
    return None


def expected_shape(role: str) -> str:
    return {"messages": MESSAGES_SHAPE, TOOLS: TOOLS_SHAPE}.get(role, "a string")


@dataclass
class Scan:
    """The checked rows of one local source, by role, and the field mapping they follow; `at`
    names the place (file:line) of the row last yielded."""

    fields: FieldSpec
    rows: Iterator[dict[str, Any]]
    at: str = ""


def _file_rows(files: list[Path], fmt: str, columns: Columns | None) -> Iterator[tuple[str, Any]]:
    for path in files:
        for where, row in read_rows(path, fmt, columns):
            yield (f"{path}:{where[5:]}" if where.startswith("line ") else f"{path}: {where}"), row


def _columns(fields: FieldSpec | None, mapping: dict[str, str] | None) -> Columns | None:
    """The columns the mapping reads (None when it is detected from the first row)."""
    roles = fields.mapping if fields else mapping
    if not roles:
        return None
    required = {c for r, c in roles.items() if r not in OPTIONAL_ROLES}
    return Columns(frozenset(roles.values()), frozenset(required))


def scan_local(ref: SourceRef, fields: FieldSpec | None, mapping: dict[str, str] | None) -> Scan:
    """Every row of a local source, checked against the field mapping (detected from the
    first row when the manifest has none), streamed."""
    files = source_files(ref)
    fmt = file_format(ref, files)
    if fields is None and mapping is None and (names := column_names(files[0], fmt)):
        fields = field_spec(None, names, f"{files[0]}: row 1")  # from the schema: as a row
    rows = _file_rows(files, fmt, _columns(fields, mapping))
    first = next(rows, None)
    if first is None:
        why = (
            "the file has no rows"
            if len(files) == 1
            else f"none of its {len(files)} files has rows"
        )
        raise UserError(f"{ref.location}: no examples ({why})")
    where, row = first
    if fields is None:
        if not isinstance(row, dict):
            raise UserError(f"{where}: expected an object with named fields, found {_kind(row)}")
        fields = field_spec(mapping, list(row), where)
    scan = Scan(fields, iter(()), where)
    # a given input/system column no row holds (a misspelt name): its text was left out
    unseen = {r: c for r, c in fields.mapping.items() if r in OPTIONAL_ROLES - fields.maybe}

    def checked() -> Iterator[dict[str, Any]]:
        yield check_row(row, scan.fields, where)
        _strike(unseen, row)
        for at, value in rows:
            scan.at = at
            yield check_row(value, scan.fields, at)
            if unseen:
                _strike(unseen, value)
        if unseen:
            role, column = sorted(unseen.items())[0]
            raise UserError(
                f"{ref.location}: field '{column}' (field_mapping.{role}) is in no row; "
                "check the column's name, or remove it from field_mapping"
            )

    scan.rows = checked()
    return scan


def _strike(unseen: dict[str, str], row: Any) -> None:
    """Strike from `unseen` (role -> column) the columns `row` holds."""
    if isinstance(row, dict):
        for role in [r for r, c in unseen.items() if c in row]:
            del unseen[role]
