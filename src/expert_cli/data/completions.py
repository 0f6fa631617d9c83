"""A conversation whose parts are in columns beside it, joined into one conversation:
- `response` beside `messages`: the turns that answer it (TRL's conversational prompt and
  completion: `prompt` and `completion`, each a list of turns; or one answer's text). The
  response's answers are trained as a `messages` row's are, and the answers inside `messages`
  are kept as context (weight 0), as TRL trains the completion alone.
- `system` beside `messages`: its system prompt (Bespoke-Stratos' and OpenThoughts' `system`,
  Nemotron's `system_prompt`), put first as a system turn where the conversation has none of
  its own.

Local rows are joined as they are read (values.check_row), a hub or saved dataset's as its
conversations are stored (dataset_rows.as_text), and `check` reads a hub dataset's rows
joined the same way (dataset_rows.dataset_scan).
"""

from __future__ import annotations

from typing import Any

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


def joined(messages: Any, response: Any) -> list[Any]:
    """One conversation: `messages` with its answers as context, then the response's turns."""
    context = [
        {**m, "weight": 0} if isinstance(m, dict) and m.get("role") == "assistant" else m
        for m in standard_turns(messages or [])
    ]
    return context + list(answers_turns(response))


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
        messages = joined(messages, row[RESPONSE])
    out["messages"] = with_system(messages, row.get(SYSTEM))
    return out
