"""A conversation and the turns that answer it, in two columns: `messages` (the conversation so
far) and `response` beside it (TRL's conversational prompt and completion: `prompt` and
`completion`, each a list of turns; or one answer's text). A row is trained as one
conversation: the response's answers are trained as a `messages` row's are, and the answers
inside `messages` are kept as context (weight 0), as TRL trains the completion alone.

Local rows are joined as they are read (values.check_row), a hub or saved dataset's as its
conversations are stored (conversations.as_text), and `check` reads a hub dataset's rows
joined the same way (sources.dataset_scan).
"""

from __future__ import annotations

from typing import Any

from expert_cli.data.conversations import standard_turns

RESPONSE = "response"


def answers_turns(value: Any) -> Any:
    """The turns of a `response` beside `messages`: its text as one assistant turn, a list of
    turns as `messages` are read (ShareGPT's and Capybara's forms too); anything else as it
    is, for the row's check to refuse."""
    if isinstance(value, str):
        return [{"role": "assistant", "content": value}]
    return standard_turns(value)


def joined(messages: Any, response: Any) -> list[Any]:
    """One conversation: `messages` with its answers as context, then the response's turns."""
    context = [
        {**m, "weight": 0} if isinstance(m, dict) and m.get("role") == "assistant" else m
        for m in standard_turns(messages or [])
    ]
    return context + list(answers_turns(response))


def joined_row(row: dict[str, Any]) -> dict[str, Any]:
    """A row of roles with its `response` joined into `messages` (a row without one as it is)."""
    if RESPONSE not in row or "messages" not in row:
        return row
    out = {k: v for k, v in row.items() if k != RESPONSE}
    out["messages"] = joined(row["messages"], row[RESPONSE])
    return out
