"""A conversation whose parts are in columns beside it, joined into one conversation:
- `response` beside `messages`: the turns that answer it (TRL's conversational prompt and
  completion: `prompt` and `completion`, each a list of turns; or one answer's text). The
  response's answers are trained as a `messages` row's are, and the answers inside `messages`
  are kept as context (weight 0), as TRL trains the completion alone.
- Salesforce xlam's `query`, `answers` and `tools`: a prompt's text is the user's turn, and an
  answer of calls (JSON text of `[{"name", "arguments"}]` naming tools the row defines) is the
  assistant's `tool_calls`; `[]`, no call, is an empty answer (xlam-irrelevance's: dropped as
  having nothing to train, as the data gives no answer to train).
- `system` beside `messages`: its system prompt (Bespoke-Stratos' and OpenThoughts' `system`,
  Nemotron's `system_prompt`), put first as a system turn where the conversation has none of
  its own.

Local rows are joined as they are read (values.check_row), a hub or saved dataset's as its
conversations are stored (dataset_rows.as_text), and `check` reads a hub dataset's rows
joined the same way (dataset_rows.dataset_scan).
"""

from __future__ import annotations

from typing import Any

from expert_cli.data.calls import tool_calls
from expert_cli.data.conversations import standard_turns

RESPONSE = "response"
SYSTEM = "system"
JOINED = (RESPONSE, SYSTEM)  # the roles beside `messages` joined into it


def answers_turns(value: Any) -> Any:
    """The turns of a `response` beside `messages`: its text as one assistant turn, a list of
    turns as `messages` are read (ShareGPT's and Capybara's forms too); anything else (a list
    of texts too) as it is, for the row's check to refuse."""
    if isinstance(value, str):
        return [{"role": "assistant", "content": value}]
    if isinstance(value, list) and all(isinstance(m, str) or m is None for m in value):
        return value  # texts, not turns (LIMA's are a whole conversation's): refused
    return standard_turns(value)


def joined(messages: Any, response: Any, tools: list[Any] | None = None) -> list[Any]:
    """One conversation: `messages` with its answers as context (a prompt's text as the user's
    turn), then the response's turns (calls of the row's `tools` as tool_calls)."""
    turns = standard_turns(messages or [])
    if isinstance(turns, str):
        turns = [{"role": "user", "content": turns}]
    context = [
        {**m, "weight": 0} if isinstance(m, dict) and m.get("role") == "assistant" else m
        for m in turns
    ]
    return context + list(_calls_answer(response, tools) or answers_turns(response))


def _calls_answer(response: Any, tools: list[Any] | None) -> list[Any] | None:
    """An answer's text that is JSON of calls of the row's tools (xlam's `answers`) as the
    assistant's turn calling them; `[]` beside tools as an empty answer; else None."""
    if not tools or not isinstance(response, str):
        return None
    if response.strip() == "[]":
        return [{"role": "assistant", "content": ""}]
    calls = tool_calls(response)
    defined = {name for t in tools if isinstance(name := _tool_name(t), str)}
    if calls is None or any(c["function"]["name"] not in defined for c in calls):
        return None
    return [{"role": "assistant", "content": None, "tool_calls": calls}]


def _tool_name(tool: Any) -> Any:
    """A tool definition's name: OpenAI's `{"type": "function", "function": {...}}` or bare."""
    if not isinstance(tool, dict):
        return None
    inner = tool.get("function")
    return inner.get("name") if isinstance(inner, dict) else tool.get("name")


def with_system(messages: Any, system: Any) -> Any:
    """The conversation with `system` (text) as its first turn, where it has text and the
    conversation has no system (or developer) turn of its own (that one is kept)."""
    if not isinstance(system, str) or not system.strip() or not isinstance(messages, list):
        return messages
    if any(isinstance(m, dict) and m.get("role") in (SYSTEM, "developer") for m in messages):
        return messages  # its own (OpenAI's newer models call it the developer's)
    return [{"role": SYSTEM, "content": system}, *messages]


def joined_row(row: dict[str, Any]) -> dict[str, Any]:
    """A row of roles with its `response` and `system` joined into `messages` (a row without
    them as it is)."""
    if "messages" not in row or not any(role in row for role in JOINED):
        return row
    out = {k: v for k, v in row.items() if k not in JOINED}
    messages = standard_turns(row["messages"])  # ShareGPT's system turn is one of its own
    if RESPONSE in row:
        messages = joined(messages, row[RESPONSE], row.get("tools"))
    out["messages"] = with_system(messages, row.get(SYSTEM))
    return out
