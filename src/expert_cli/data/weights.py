"""OpenAI's per-message `"weight"` in chat data: 0 leaves an answer as context, 1 trains it
(data/turns.py reads it). Any other value, or a 1 on a turn that is never trained (a user's,
a system's, a tool's), asks for what no run does, so the row is refused where it is read:
`weight_problem` for a file's rows (rows.py), `first_bad_weight` for a hub or saved
dataset's Arrow column (sources.py). A null weight is none: Arrow gives every message of a
struct column the field, null where the file had no key.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from expert_cli.data.column_checks import first_in_chunks
from expert_cli.data.conversations import SHAREGPT_ROLES

WEIGHTS = "0 (an answer left as context) or 1 (trained), as in OpenAI's fine-tuning format"
NOT_ANSWER = (
    'a "weight" of 1 on a turn that is never trained (only assistant answers are); remove it, '
    "or give 0"
)


def _number(weight: Any) -> bool:
    return isinstance(weight, int | float) and not isinstance(weight, bool)


def weight_problem(message: dict[str, Any]) -> str | None:
    """What is wrong with one message's weight (None when right or absent): the words follow
    `item N: ` in the row's error. The value is named by kind, never shown."""
    weight = message.get("weight")
    if weight is None:
        return None
    if not _number(weight):
        kind = (
            "a boolean" if isinstance(weight, bool) else f"not a number ({type(weight).__name__})"
        )
        return f'"weight" is {kind}, expected {WEIGHTS}'
    if weight not in (0, 1):  # NaN and the infinities are not either
        return f'"weight" is a number other than 0 and 1, expected {WEIGHTS}'
    if weight == 1 and message.get("role") != "assistant":
        return NOT_ANSWER
    return None


def first_bad_weight(values: pa.ChunkedArray) -> tuple[int, str] | None:
    """(row index, problem) of the first row of a `messages` column (a list of structs) whose
    messages' weights `weight_problem` would refuse, or None (no weight field, or all right)."""
    return first_in_chunks(values, _first_in_chunk)


# the list types a `messages` column may be (datasets' List of a fixed length is Arrow's
# fixed-size list)
LISTS = (
    pa.types.is_list,
    pa.types.is_large_list,
    pa.types.is_fixed_size_list,
    pa.types.is_list_view,
    pa.types.is_large_list_view,
)
NUMBERS = (pa.types.is_integer, pa.types.is_floating, pa.types.is_decimal)
ROLE_KEYS = ("role", "from")  # a turn's role, as OpenAI's and ShareGPT's forms name it
# an answer's role in either form (ShareGPT's speakers read as the assistant)
ANSWER_ROLES = [
    "assistant",
    *(said for said, role in SHAREGPT_ROLES.items() if role == "assistant"),
]


def _first_in_chunk(chunk: pa.Array) -> tuple[int, str] | None:
    if not any(is_list(chunk.type) for is_list in LISTS):
        return None
    inner = chunk.type.value_type
    if not pa.types.is_struct(inner) or inner.get_field_index("weight") < 0:
        return None
    messages = pc.list_flatten(chunk)
    weights = pc.struct_field(messages, "weight")
    given = pc.is_valid(weights)
    kind = weights.type
    if pa.types.is_null(kind):  # no message gives one
        return None
    if not any(is_number(kind) for is_number in NUMBERS):
        bad, why = given, f'"weight" is not a number ({kind}), expected {WEIGHTS}'
        return _first(bad, chunk, why)
    weights = pc.cast(weights, pa.float64(), safe=False)  # a half float has no comparisons
    other = pc.and_(given, pc.invert(pc.fill_null(pc.is_in(weights, pa.array([0.0, 1.0])), False)))
    found = _first(other, chunk, f'"weight" is a number other than 0 and 1, expected {WEIGHTS}')
    named = [pc.struct_field(messages, key) for key in ROLE_KEYS if inner.get_field_index(key) >= 0]
    if found is not None or not named:
        return found
    roles = pc.coalesce(*named) if len(named) > 1 else named[0]  # ShareGPT's turns: from
    answer = pc.fill_null(pc.is_in(roles, pa.array(ANSWER_ROLES)), False)
    return _first(
        pc.and_(pc.fill_null(pc.equal(weights, 1.0), False), pc.invert(answer)), chunk, NOT_ANSWER
    )


def _first(mask: pa.Array, chunk: pa.Array, why: str) -> tuple[int, str] | None:
    """The row of the first message `mask` marks, and `why` after its place in the row."""
    hits = pc.indices_nonzero(pc.fill_null(mask, False))
    if len(hits) == 0:
        return None
    at = hits[0].as_py()
    parents = pc.list_parent_indices(chunk)
    row = parents[at].as_py()
    item = at - pc.index(parents, row).as_py()  # the row's messages are flattened in order
    return row, f"item {item}: {why}"
