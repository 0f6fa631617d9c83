"""A conversation's tool definitions (the `tools` column of TRL's and OpenAI's chat data): read
from a row as a list of JSON objects or its JSON text, stored as JSON text beside the
conversation, and given to the chat template, which writes them into the prompt (Qwen's,
Llama's and Mistral's templates put the function schemas in the system turn). Without them a
model learns to call functions whose definitions it never saw."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import datasets

from expert_cli.data.file_text import drop_nulls

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

TOOLS_SHAPE = "a list of tool definitions (JSON objects), or its JSON text"
ONE_TOOL = "an object (a tool's definition) or its JSON text"
TOOLS_BATCH_ROWS = 1024  # rows of a dataset's tools read at a time
SHAPE_DEPTH = 16  # nesting of a tool's definition looked at for its shape


def parsed_tools(value: Any, typed: bool = False) -> tuple[list[Any] | None, str | None]:
    """(the tools, None), or (None, what is wrong) for a row's `tools` value: a list of
    objects, or JSON text of one. Null, an empty list and blank text are no tools. Where
    `typed` (read from an Arrow struct column: a hub or saved dataset's, a Parquet or Arrow
    file's), the objects' null-valued keys are left out: Arrow gives each tool every key any
    tool has, null where it has none. JSON text and a JSON file's objects are kept as written:
    a parameter's `"default": null` is its author's."""
    if isinstance(value, str):
        if not value.strip():
            return None, None
        try:
            value = json.loads(value)
        except (json.JSONDecodeError, RecursionError):
            return None, f"is text that is not JSON; expected {TOOLS_SHAPE}"
        if value is None:
            return None, None
        typed = False  # JSON text holds no fill-ins
    if value is None:
        return None, None
    if not isinstance(value, list):
        return None, f"is {_kind(value)}, expected {TOOLS_SHAPE}"
    tools = []
    for i, tool in enumerate(value):
        if isinstance(tool, str):  # each tool's own JSON text (When2Call's): no fill-ins
            try:
                tool = json.loads(tool)
            except (json.JSONDecodeError, RecursionError):
                return None, f"item {i} is text that is not JSON, expected {ONE_TOOL}"
        elif typed:
            tool = drop_nulls(tool, 1)
        if not isinstance(tool, dict):
            return None, f"item {i} is {_kind(tool)}, expected {ONE_TOOL}"
        tools.append(tool)
    return tools or None, None


def tools_text(tools: list[Any] | None) -> str | None:
    """The tools as the build stores them: JSON text, or None for none."""
    return json.dumps(tools, ensure_ascii=False, default=str) if tools else None


def _kind(value: Any) -> str:
    names = {"dict": "an object", "list": "a list", "str": "text", "bool": "a boolean"}
    names |= {"int": "a number", "float": "a number"}  # "a int" before
    return names.get(type(value).__name__, f"a {type(value).__name__}")


class ToolsGiven:
    """A tokenizer whose chat template is given a conversation's tools; all else is the
    tokenizer's own. Every render of the conversation (the whole, and each answer's prefix
    that finds the trained turns) then sees the same tools."""

    def __init__(self, tokenizer: PreTrainedTokenizerFast, tools: list[Any]) -> None:
        self.plain, self.tools = tokenizer, tools

    def apply_chat_template(self, conversation: Any, **kwargs: Any) -> Any:
        return self.plain.apply_chat_template(conversation, tools=self.tools, **kwargs)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:  # looked up on the class, not here
        return self.plain(*args, **kwargs)

    def __len__(self) -> int:
        return len(self.plain)

    def __getattr__(self, name: str) -> Any:
        if name == "plain":  # not set yet (a copy or an unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.plain, name)


def with_tools(tokenizer: PreTrainedTokenizerFast, tools: list[Any] | None) -> Any:
    """The tokenizer, its chat template given `tools` where there are any."""
    return ToolsGiven(tokenizer, tools) if tools else tokenizer


def tools_problem(ds: datasets.Dataset, column: str) -> tuple[int, str] | None:
    """(row index, problem) of the first row of a hub or saved dataset's tools column that is
    not tools, or None. A typed column of objects is tools by its type."""
    feature = ds.features[column]
    if typed_objects(feature):
        return None
    batches = ds.select_columns([column]).iter(batch_size=TOOLS_BATCH_ROWS)
    for i, value in enumerate(value for batch in batches for value in batch[column]):
        if (problem := parsed_tools(value)[1]) is not None:
            return i, problem
    return None


def typed_objects(feature: Any) -> bool:
    """Whether a dataset column is typed as lists of objects (structs, or JSON objects)."""
    inner = getattr(feature, "feature", None)
    return isinstance(feature, (datasets.List, datasets.LargeList)) and isinstance(inner, dict)


def tools_shape(tools: list[Any] | None, depth: int = 0) -> Any:
    """What a chat template refuses tools by, or writes differently: each one's keys and the
    kinds of their values, nested (a template reading `tool.function.name` refuses a bare
    `{"name", "parameters"}` tool); texts and numbers left out, so `check` renders each
    shape once."""
    if depth > SHAPE_DEPTH:
        return "deep"
    if isinstance(tools, dict):
        return tuple(sorted((str(k), tools_shape(v, depth + 1)) for k, v in tools.items()))
    if isinstance(tools, list):
        return tuple(tools_shape(v, depth + 1) for v in tools)
    return type(tools).__name__
