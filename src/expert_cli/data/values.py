"""A row's mapped values checked against their roles: text that can be written as UTF-8, a
conversation's turns (role, content, text parts, tool calls, weights), tools; errors name the
field and the shape expected, never the value. `rows.scan_local` checks a local file's rows
with `check_row`; `sources` checks a hub or saved dataset's conversations with
`messages_problem`.
"""

from __future__ import annotations

import json
import re
from typing import Any

import datasets

from expert_cli.config.base import lone_surrogate_at
from expert_cli.data.calls import call_problem, first_bad_call
from expert_cli.data.completions import answers_turns, joined_row
from expert_cli.data.conversations import form_note, is_text_part, json_turns, standard_turns
from expert_cli.data.fields import OPTIONAL_ROLES, TOOLS, FieldSpec
from expert_cli.data.file_text import repeated_keys, shown_name, shown_names
from expert_cli.data.tools import TOOLS_SHAPE, parsed_tools
from expert_cli.data.weights import first_bad_weight, weight_problem
from expert_cli.errors import UserError

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


def _value_problem(role: str, value: Any) -> str | None:
    """What is wrong with a mapped field's value (None when it is right)."""
    if role in OPTIONAL_ROLES and value is None:
        return None
    if role != "messages":
        if isinstance(value, list) and value and all(isinstance(m, dict) for m in value):
            how = (  # TRL's conversational prompt and completion, mapped as a pair
                'map such a pair as {"messages": <prompt>, "response": <completion>}'
                if role in ("instruction", "response")
                else "map the column as `messages`"
            )
            turns = "of objects (turns of a conversation?)"
            return f"is {kind_of(value)} {turns}, expected a string; {how}"
        if not isinstance(value, str):
            return f"is {kind_of(value)}, expected a string"
        return _text_problem(value)
    if isinstance(value, str):  # JSON text of a list of turns is read as one
        return f"is text that is not JSON of a list of turns, expected {MESSAGES_SHAPE}"
    if not isinstance(value, list):
        return f"is {kind_of(value)}, expected {MESSAGES_SHAPE}"
    for i, message in enumerate(value):
        if not isinstance(message, dict):
            return f"item {i} is {kind_of(message)}, expected an object with role and content"
        if problem := call_problem(message):
            return f"item {i} {problem}"
        calls = message.get("tool_calls")
        if calls is not None and not isinstance(calls, list):  # said as its content, before
            return f"item {i}: tool_calls is {kind_of(calls)}, expected a list of calls"
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
                return f"item {i}: {key} is {kind_of(text)}, expected a string"
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
                return f"part {j}: its text is {kind_of(part.get('text'))}, expected a string"
            what = f"of type {shown_name(kind)}" if isinstance(kind, str) else kind_of(part)
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
    "bytes": "binary data (bytes, not text)",
}


# a datasets Value's dtype by its start, as `column_kind` names it
VALUE_KINDS = (
    ("string", "text"),
    ("large_string", "text"),
    ("binary", "binary data (bytes, not text)"),
    ("large_binary", "binary data (bytes, not text)"),
    ("bool", "booleans"),
    ("int", "numbers"),
    ("uint", "numbers"),
    ("float", "numbers"),
    ("decimal", "numbers"),
    ("timestamp", "dates or times"),
    ("date", "dates or times"),
    ("time", "dates or times"),
    ("null", "nothing (every value null)"),
)

OTHER_KINDS = {
    "ClassLabel": "class labels (numbers)",
    "Json": "JSON values",
    "Image": "images",
    "Audio": "audio",
    "Video": "videos",
    "Translation": "translations",
}


def kind_of(value: Any) -> str:
    """A value's kind as an error names it (never the value)."""
    if value is None:
        return "missing (null)"
    return KINDS.get(type(value).__name__, f"a {type(value).__name__}")


def column_kind(feature: Any, depth: int = 0) -> str:
    """What a hub or saved dataset's column holds, in words (its schema, never its values):
    "lists of objects with 'from' (lists of text), 'value' (text)"."""
    if isinstance(feature, datasets.Value):
        dtype = str(feature.dtype)
        for start, words in VALUE_KINDS:
            if dtype.startswith(start):
                return words
        return f"values of type {dtype}"
    inner = getattr(feature, "feature", None)
    if inner is not None and depth < 3:
        return f"lists of {column_kind(inner, depth + 1)}"
    if isinstance(feature, dict) and depth < 3:
        fields = [f"{shown_name(k)} ({column_kind(v, depth + 1)})" for k, v in feature.items()]
        more = f" and {len(fields) - 6} more" if len(fields) > 6 else ""
        return f"objects with {', '.join(fields[:6])}{more}"
    if isinstance(feature, dict) or depth >= 3:
        return "nested values"
    return OTHER_KINDS.get(type(feature).__name__, type(feature).__name__)


def check_row(row: Any, fields: FieldSpec, where: str, typed: bool = False) -> dict[str, Any]:
    """The row's mapped values by role, or a UserError naming the place and the field
    (`typed`: read from a Parquet or Arrow file, whose structs Arrow fills in)."""
    if not isinstance(row, dict):
        raise UserError(f"{where}: expected an object with named fields, found {kind_of(row)}")
    out = {}
    repeated = repeated_keys(row)
    for role, column in fields.mapping.items():
        if column in repeated:
            raise UserError(f"{where}: field {shown_name(column)} (field_mapping.{role}) {TWICE}")
        value = row.get(column)
        if value is None and role not in OPTIONAL_ROLES:
            present = "" if column in row else f"; this row has {shown_names(list(row))}"
            wanted = (
                "a prompt's text or a list of messages"  # beside a response (xlam's query)
                if role == "messages" and fields.shape(role, True) != role
                else "a list of messages"
                if role == "messages"
                else "an answer's text or turns"  # a response beside messages
                if fields.shape(role, False) == "messages"
                else "text"
            )
            how = f"is empty (null), where {wanted} is expected" if column in row else "missing"
            raise UserError(
                f"{where}: field {shown_name(column)} {how} (field_mapping.{role}){present}"
            )
        if role == "messages" and isinstance(value, str):  # JSON text of turns: read as them
            value = json_turns(value)
        shape = fields.shape(role, isinstance(value, str))
        if role == "response" and shape == "messages":  # a response's turns, beside messages
            turns = answers_turns(value)
        else:
            turns = standard_turns(value) if shape == "messages" else value
        if role == TOOLS:  # a list of objects, or its JSON text: kept as the list
            turns, problem = parsed_tools(value, typed)
            found = _surrogate_inside(turns) if turns and not problem else None
            problem = problem or (found and f"{found[0]} {_text_problem(found[1])}")
        else:
            problem = _value_problem(shape, turns)
        if problem:
            problem += form_note(value) if shape == "messages" and turns is not value else ""
            raise UserError(f"{where}: field {shown_name(column)} ({fields.named(role)}) {problem}")
        out[role] = turns
    return joined_row(out)


def messages_problem(
    ds: datasets.Dataset, column: str, prompts: bool = False
) -> tuple[int, str] | None:
    """(row index, problem) of the first row of a hub or saved dataset's `messages` column the
    row checks refuse, or None. A column of JSON messages (the datasets library's type where
    the turns' keys differ: a weight or tool_calls on some) is read row by row, as a file's
    rows are, and so is one of texts (LIMA's: a null among them is named); a struct column's
    weights are checked in Arrow (its shape is typed)."""
    feature = ds.features[column]  # text (JSON of the turns) is read row by row too
    if not isinstance(feature, datasets.Value) and not isinstance(
        getattr(feature, "feature", None), (datasets.Json, datasets.Value)
    ):
        return first_bad_weight(ds.data.column(column)) or first_bad_call(ds.data.column(column))
    batches = ds.select_columns([column]).iter(batch_size=JSON_BATCH_ROWS)
    for i, value in enumerate(value for batch in batches for value in batch[column]):
        turns = standard_turns(value)
        if isinstance(turns, str) and prompts:  # a prompt's text beside a response
            continue
        if value is not None and (problem := _value_problem("messages", turns)):
            return i, problem + form_note(value)
    return None


def expected_shape(role: str) -> str:
    return {"messages": MESSAGES_SHAPE, TOOLS: TOOLS_SHAPE}.get(role, "a string")
