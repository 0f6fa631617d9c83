"""Conversations (`messages` data) as the build keeps them: one JSON text per row, every key of
every message as its source gave it, for the chat template to use.

An Arrow struct has one fixed set of keys. Written as one, a local file's messages kept only
role and content (a Qwen3 thinking trace in `reasoning_content`, a tool call in `tool_calls`
were left out of what was trained), and a hub dataset's messages each carry every key any
message has, null where the message has none (a template asking whether `tool_calls` is
defined sees a null one). As JSON text a local row is exactly what its file wrote; a hub or
saved dataset's conversations are turned into the same text once, in the build's own work
folder, with those null fill-ins left out (role and content are kept, null or not: an
OpenAI-form tool-calling turn has `"content": null`, which templates test with `is none`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import datasets

KEPT_WHEN_NULL = ("role", "content")


def conversation_text(messages: list[Any]) -> str:
    """One local row's conversation as the build stores it."""
    return json.dumps(messages, ensure_ascii=False, default=str)


def conversation(value: list[Any] | str) -> list[Any]:
    """The conversation of a stored row (JSON text), or the row itself (parsed already)."""
    return json.loads(value) if isinstance(value, str) else value


def as_text(ds: datasets.Dataset, work_dir: Path) -> datasets.Dataset:
    """A hub or saved dataset with its `messages` column (an Arrow struct) as JSON text,
    written under `work_dir` (never beside the user's files or into a shared cache)."""
    feature = ds.features.get("messages")
    if feature is None or isinstance(feature, datasets.Value):
        return ds

    def to_text(batch: dict[str, list[Any]]) -> dict[str, list[Any]]:
        rows = [
            [
                {k: v for k, v in m.items() if v is not None or k in KEPT_WHEN_NULL}
                for m in (row or [])
            ]
            for row in batch["messages"]
        ]
        return {"messages": [conversation_text(row) for row in rows]}

    features = ds.features.copy()
    features["messages"] = datasets.Value("string")
    work_dir.mkdir(parents=True, exist_ok=True)
    return ds.map(
        to_text,
        batched=True,
        features=features,
        cache_file_name=str(work_dir / f"messages-{ds._fingerprint}.arrow"),
        desc=None,
    )


def conversation_shape(messages: list[Any]) -> tuple[Any, ...]:
    """What a chat template refuses by: each message's role, keys (as a set), the kind of
    each value, and the length of each list (Llama 3 refuses more than one tool call), in
    order. Two conversations of one shape differ only in their texts and numbers."""
    return tuple(
        (
            m.get("role"),
            tuple(
                sorted(
                    (k, type(v).__name__, len(v) if isinstance(v, list) else None)
                    for k, v in m.items()
                )
            ),
        )
        if isinstance(m, dict)
        else (None, ())
        for m in messages
    )
