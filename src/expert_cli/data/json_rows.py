"""JSON and JSON Lines files read as examples, streamed, in any layout.

JSON values one after another (JSON Lines, pretty-printed objects, a `.json` file holding
lines), or the items of one top-level array, each with the line it starts on: memory is bounded
by the largest value (at most `MAX_ITEM_BYTES`), not by the file. A file of one object is read
as the datasets library reads it where it is not one example: an object of columns
(`{"instruction": [...], "output": [...]}`) gives a row per item, and an object that wraps its
examples in one key (`{"version": 2, "data": [{...}, ...]}`, what `field="data"` names there)
gives that key's items, where the object holds no column the run reads (and an object of
columns under one key, `field="data"` of columns, its rows). An object whose lists hold
objects otherwise (a conversation's turns) stays one example; one of several such lists
(`{"train": [...], "test": [...]}`) is exit 2, asking for a file a split.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from expert_cli.data.file_text import (
    MAX_ITEM_BYTES,
    Row,
    Text,
    marked,
    open_data,
    repeated_keys,
    repeats,
    shown_name,
)
from expert_cli.errors import UserError
from expert_cli.jsontext import json_int

CUT_MARGIN = 16  # characters: a \uXXXX escape, a number or `false` cut by the buffer
# json's messages end in " at", the place said after them (the line is said here instead)
JSON_WORDS = {
    "Invalid control character at": "a control character (a tab, a line break) inside a "
    "string, where JSON wants it written as an escape such as \\t or \\n",
    "Unterminated string starting at": "a string that is never closed",
}
_WHITESPACE = " \t\r\n"


def json_rows(path: Path, example_keys: frozenset[str] | None) -> Iterator[Row]:
    """Every example of a JSON or JSON Lines file, with where it is (`line N`, `row N`). A
    lone object holding one of `example_keys` (the columns a run reads) is an example; with
    None (JSON Lines: a line is an example) every one is."""
    values = _values(path)
    first = next(values, None)
    if first is None:
        return
    second = next(values, None)
    lone = second is None and not first[2] and isinstance(first[1], dict)
    if lone and example_keys is not None:
        yield from _lone(path, first[0], first[1], example_keys)
        return
    yield first[:2]
    if second is not None:
        yield second[:2]
        yield from (value[:2] for value in values)


def _lone(
    path: Path, where: str, value: dict[str, Any], example_keys: frozenset[str]
) -> Iterator[Row]:
    """The examples of a file that holds one object: its columns' rows, the items of the one
    key that wraps them, or itself."""
    lists = {k: v for k, v in value.items() if isinstance(v, list)}
    inner = [k for k, v in value.items() if isinstance(v, dict)]
    if not lists and len(inner) == 1 and example_keys.isdisjoint(value):  # field= of columns
        yield from _lone(path, where, value[inner[0]], example_keys)
        return
    splits = sorted(k for k, v in lists.items() if v and all(isinstance(x, dict) for x in v))
    if len(splits) > 1 and example_keys.isdisjoint(value):
        raise UserError(
            f"{path}: an object whose {', '.join(map(shown_name, splits))} each hold a list "
            "of examples (one a split?); expected one list: give each its own file, the "
            "training one as training.dataset.path and another as validation_path"
        )
    if len(lists) == 1 and example_keys.isdisjoint(value):
        (key, items), twice = next(iter(lists.items())), repeated_keys(value)
        if not items or isinstance(items[0], dict):  # the examples, wrapped
            if key in twice:  # the last list read: the others' examples would be lost
                raise UserError(
                    f"{path}: the key {shown_name(key)} holding the examples is given more "
                    "than once; expected once (all but the last list would be left out)"
                )
            for i, item in enumerate(items):
                yield f"row {i + 1} of {shown_name(key)}", item
            return
    held = any(isinstance(x, dict) for v in lists.values() for x in v)  # turns, not cells
    if value and len(lists) == len(value) and not held:
        by_length = sorted(lists, key=lambda k: len(lists[k]))
        short, long = by_length[0], by_length[-1]
        if len(lists[short]) != len(lists[long]):
            raise UserError(
                f"{path}: an object of columns whose lengths differ ({shown_name(long)} has "
                f"{len(lists[long]):,} items, {shown_name(short)} {len(lists[short]):,}); "
                "expected columns of one length, or one object an example (JSON Lines)"
            )
        twice = repeated_keys(value)
        for i in range(len(lists[short])):
            yield f"row {i + 1}", marked({k: v[i] for k, v in value.items()}, twice)
        return
    columns = [k for k in example_keys & set(value) if isinstance(value[k], list)]
    if columns and not held and (odd := [k for k in value if k not in lists]):
        raise UserError(
            f"{path}: an object of columns ({shown_name(min(columns))} is a list) whose "
            f"{shown_name(min(odd))} is not a list; expected a list a column, all of one "
            "length, or one object an example (JSON Lines)"
        )
    yield where, value


def _values(path: Path) -> Iterator[tuple[str, Any, bool]]:
    """JSON values one after another (JSON Lines, concatenated objects), or the items of one
    top-level array; each with the line it starts on, and whether it is an array's item."""
    decoder = json.JSONDecoder(parse_int=json_int, object_pairs_hook=_object)
    with open_data(path) as fh:
        text = Text(path, fh)
        buf, pos, line, items = "", 0, 1, 0
        in_array = None  # unknown until the first non-blank character
        while True:
            pos, line = _skip_blank(buf, pos, line)
            if pos >= len(buf) - 1 and not text.eof:  # keep one look-ahead character
                buf, pos = buf[pos:] + text.read(), 0
                continue
            if pos >= len(buf):
                if in_array:
                    raise UserError(f"{path}:{line}: the JSON array is not closed with ]")
                return
            if in_array is None:
                in_array = buf[pos] == "["
                if in_array:
                    pos += 1
                    continue
            if in_array and buf[pos] in ",]":
                if buf[pos] == "]":
                    pos, line = _skip_blank(buf, pos + 1, line)
                    if pos < len(buf) or not text.eof and text.read().strip():
                        raise UserError(f"{path}:{line}: text after the closing ] of the array")
                    return
                pos += 1
                continue
            value, end, buf, pos = _decode_one(decoder, text, buf, pos, line)
            items += bool(in_array)  # an array's item by its number too: one line may hold all
            yield (
                (f"row {items}, line {line}" if in_array else f"line {line}"),
                value,
                bool(in_array),
            )
            line += buf.count("\n", pos, end)
            pos = end


def _skip_blank(buf: str, pos: int, line: int) -> tuple[int, int]:
    while pos < len(buf) and buf[pos] in _WHITESPACE:
        line += buf[pos] == "\n"
        pos += 1
    return pos, line


def _decode_one(
    decoder: json.JSONDecoder, text: Text, buf: str, pos: int, line: int
) -> tuple[Any, int, str, int]:
    """The JSON value at `pos`, reading more of the file while it is cut off by the buffer."""
    while True:
        try:
            value, end = decoder.raw_decode(buf, pos)
        except json.JSONDecodeError as exc:
            # near the end of what was read, the value may only be cut off: read on
            cut = exc.pos >= len(buf) - CUT_MARGIN or exc.msg.startswith("Unterminated")
            if cut and not text.eof:
                buf, pos = _more(text, buf, pos, line)
                continue
            at = exc.pos  # the line of the last token before the error, not of what follows
            while at > pos and buf[at - 1] in _WHITESPACE:
                at -= 1
            where = line + buf.count("\n", pos, at)
            if buf[exc.pos : exc.pos + 1] == "\ufeff":  # files joined with `cat`: the second's
                raise UserError(
                    f"{text.path}:{where}: a byte order mark (U+FEFF) inside the file, where a "
                    "file saved with one was joined to another (cat a.jsonl b.jsonl); remove it"
                ) from None
            said = JSON_WORDS.get(exc.msg, exc.msg.removesuffix(" at"))
            raise UserError(f"{text.path}:{where}: invalid JSON ({said})") from None
        except RecursionError:
            raise UserError(f"{text.path}:{line}: JSON nested too deeply") from None
        if end >= len(buf) and not text.eof:  # a number may go on in the next chunk
            buf, pos = _more(text, buf, pos, line)
            continue
        return value, end, buf, pos


def _more(text: Text, buf: str, pos: int, line: int) -> tuple[str, int]:
    if len(buf) - pos > MAX_ITEM_BYTES:
        raise UserError(
            f"{text.path}:{line}: one JSON value is larger than {MAX_ITEM_BYTES >> 20} MB "
            "(one example per value is expected; an object of columns, or wrapping its "
            "examples, is one value: write such data as JSON Lines)"
        )
    # as much again as is held: a value read 1 MB at a time was decoded again after each read
    more, need = [text.read()], len(buf) - pos
    while sum(map(len, more)) < need and not text.eof:
        more.append(text.read())
    return buf[pos:] + "".join(more), 0


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object as a dict (`object_pairs_hook`: the pairs as written, repeats included)."""
    row = dict(pairs)
    return row if len(row) == len(pairs) else marked(row, repeats([k for k, _ in pairs]))
