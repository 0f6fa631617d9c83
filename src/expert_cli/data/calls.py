"""ShareGPT's `function_call` turns (LLaMA-Factory's, APIGen-MT's, Glaive's as LLaMA-Factory
converts it; Locutusque's `function-call`) and OpenAI's earlier function calling (an assistant
turn's `function_call` object, a `function` turn's result) read as the assistant's tool calls
and `tool` turns.

Such a turn's value is the call as JSON text, `{"name": "...", "arguments": {...}}`, or a list
of calls made at once. Trained as the answer's text, the model would learn the dataset's JSON
instead of its own call format; read as OpenAI's `tool_calls`, the chat template writes each
call as the model calls tools (Qwen3: a `<tool_call>` block). A value that is not a call is
refused, as LLaMA-Factory refuses it: trained as text, it would teach a call no parser reads.
"""

from __future__ import annotations

import json
import re
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from expert_cli.data.column_checks import first_in_chunks

CALL_ROLE = "function_call"  # ShareGPT's `from` of a turn that calls tools
CALL_FROMS = frozenset((CALL_ROLE, "function-call"))  # LLaMA-Factory's, Locutusque's
# Glaive's call: its arguments' JSON text in single quotes (not JSON), as its derivatives keep it
QUOTED_ARGUMENTS = re.compile(
    r'\s*\{\s*"name"\s*:\s*("(?:[^"\\]|\\.)*")\s*,\s*"arguments"\s*:\s*\'(.*)\'\s*\}\s*', re.S
)
CALL_SHAPE = (
    'JSON text of {"name": "...", "arguments": {...}}, or of a list of such calls '
    "(arguments may be JSON text of an object)"
)
CALL_KEYS = frozenset(("name", "arguments", "parameters", "id"))


def call_turn(value: Any, rest: dict[str, Any]) -> dict[str, Any]:
    """A `function_call` turn as the assistant's turn calling the tools its value names
    (content null, as in OpenAI's form), its other keys kept; a value that is not a call is
    kept as a `function_call` turn, which the row checks refuse (`call_problem`)."""
    calls = tool_calls(value)
    if calls is None:
        return {"role": CALL_ROLE, "content": value, **rest}
    return {"role": "assistant", "content": None, **rest, "tool_calls": calls}


def tool_calls(value: Any) -> list[dict[str, Any]] | None:
    """A `function_call` turn's value as OpenAI's `tool_calls` (each call's arguments an
    object, as chat templates write them), or None where it is not a call."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except (ValueError, RecursionError):  # not JSON, or nested past the reader's depth
            value = _quoted(value)
    given = value if isinstance(value, list) else [value]
    calls = [_call(c) for c in given]
    if not calls or any(c is None for c in calls):
        return None
    return calls  # type: ignore[return-value]


def _quoted(text: str) -> dict[str, Any] | None:
    """Glaive's call, `{"name": "f", "arguments": '{"a": 1}'}`, as the call it means."""
    found = QUOTED_ARGUMENTS.fullmatch(text)
    if found is None:
        return None
    try:
        return {"name": json.loads(found[1]), "arguments": found[2]}
    except (ValueError, RecursionError):
        return None


def legacy_turn(message: dict[str, Any]) -> dict[str, Any]:
    """A role/content message of OpenAI's earlier function calling in today's form: an
    assistant turn's `function_call` object as its `tool_calls` (one not a call kept as a
    `function_call` turn, which the row checks refuse), a `function` turn (the call's result)
    as a `tool` turn; any other message as it is."""
    role = message.get("role")
    if role == "function":
        return {**message, "role": "tool"}
    call = message.get(CALL_ROLE)
    if role != "assistant" or call is None or message.get("tool_calls"):
        return message
    rest = {k: v for k, v in message.items() if k not in (CALL_ROLE, "role")}
    calls = tool_calls(call)
    if calls is None:
        return {"role": CALL_ROLE, **rest}
    return {"role": "assistant", **rest, "tool_calls": calls}


def _call(given: Any) -> dict[str, Any] | None:
    """One call (`{"name", "arguments"}`; `parameters` for arguments, Llama's word; an `id`
    kept) in OpenAI's form, or None."""
    if not isinstance(given, dict) or not set(given) <= CALL_KEYS:
        return None
    name = given.get("name")
    if not isinstance(name, str) or not name.strip():
        return None
    if "arguments" in given and "parameters" in given:
        return None
    arguments = given.get("arguments", given.get("parameters"))
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except (ValueError, RecursionError):
            return None
    arguments = {} if arguments is None else arguments
    if not isinstance(arguments, dict):
        return None
    call = {"type": "function", "function": {"name": name, "arguments": arguments}}
    given_id = given.get("id")  # a number as its text, as OpenAI's ids are
    if isinstance(given_id, int) and not isinstance(given_id, bool):
        given_id = str(given_id)
    return {"id": given_id, **call} if isinstance(given_id, str) else call


def call_problem(message: dict[str, Any]) -> str | None:
    """What is wrong with a turn still of role `function_call` after the turns were read: its
    value is not a call (never quoted)."""
    if message.get("role") != CALL_ROLE:
        return None
    return f"is a function_call turn whose value is not a call, expected {CALL_SHAPE}"


def first_bad_call(column: pa.ChunkedArray) -> tuple[int, str] | None:
    """(row, problem) of the first row of a typed (struct) conversations column holding a
    ShareGPT `function_call` turn whose value is not a call, or None."""
    return first_in_chunks(column, _first_in_chunk)


def _first_in_chunk(chunk: pa.Array) -> tuple[int, str] | None:
    kind = chunk.type
    if not hasattr(kind, "value_type") or not pa.types.is_struct(kind.value_type):
        return None
    struct = kind.value_type
    texts = (pa.types.is_string, pa.types.is_large_string)
    fields = {  # the fields a turn's role is read from must hold text to be compared
        f.name
        for f in (struct.field(i) for i in range(struct.num_fields))
        if f.name not in ("from", "role") or any(is_text(f.type) for is_text in texts)
    }
    turns = pc.list_flatten(chunk)  # the items of valid rows only
    parents = pc.list_parent_indices(chunk)
    parents = parents.filter(chunk.is_valid().take(parents)).to_numpy(zero_copy_only=False)
    found: list[tuple[int, Any]] = []
    if {"from", "value"} <= fields:  # ShareGPT's: a function_call turn's value
        said = pc.is_in(pc.struct_field(turns, "from"), pa.array(sorted(CALL_FROMS)))
        found += _values(turns, said, "value")
    if {"role", CALL_ROLE} <= fields:  # OpenAI's earlier form: an answer's function_call
        asked = pc.and_(
            pc.equal(pc.struct_field(turns, "role"), "assistant"),
            pc.is_valid(pc.struct_field(turns, CALL_ROLE)),
        )
        found += _values(turns, asked, CALL_ROLE)
    for at, value in sorted(found, key=lambda pair: pair[0]):
        if tool_calls(value) is None:
            row = int(parents[at])
            item = at - int(np.searchsorted(parents, row))  # the turn's place in its row
            return row, f"item {item} {call_problem({'role': CALL_ROLE})}"
    return None


def _values(turns: pa.Array, mask: pa.Array, field: str) -> list[tuple[int, Any]]:
    """(index, value of `field`) of the turns `mask` marks."""
    hits = pc.indices_nonzero(pc.fill_null(mask, False))
    values = pc.take(pc.struct_field(turns, field), hits).to_pylist()
    return list(zip(hits.to_pylist(), values, strict=True))
