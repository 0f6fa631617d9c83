"""Conversations (`messages` data) as the build keeps them: one JSON text per row, every key of
every message its source gave, for the chat template to use.

An Arrow struct has one fixed set of keys. Written as one, a local file's messages kept only
role and content (a Qwen3 thinking trace in `reasoning_content`, a tool call in `tool_calls`
were left out of what was trained), and a hub dataset's (or a Parquet file's) messages each
carry every key any message has, null where the message has none (a template asking whether
`tool_calls` is there sees a null one). So null-valued keys are left out, at any depth, from
every source, except a message's role and content (an OpenAI-form tool-calling turn has
`"content": null`, which templates test with `is none`). A hub or saved dataset's
conversations are turned into this text once, in the build's own work folder.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import datasets

KEPT_WHEN_NULL = ("role", "content")
FORM = 2  # the stored form's version, in the name of a converted file a resumed build reuses
# (2: text parts joined)


NULL_DEPTH = 64  # nested objects deeper than this keep their nulls (no template looks there)


def without_fill_ins(messages: list[Any]) -> list[Any]:
    """The conversation without null-valued keys (Arrow's fill-ins, a Parquet file's, an SDK
    dump's `"tool_calls": null`), in nested objects too; a message's role and content are
    kept as given, null or not, content given as text parts is joined into one text, and
    anything that is not an object is left as it is."""
    return [
        {
            k: _joined(v) if k == "content" else v if k == "role" else _drop_nulls(v, 1)
            for k, v in m.items()
            if v is not None or k in KEPT_WHEN_NULL
        }
        if isinstance(m, dict)
        else m
        for m in messages
    ]


def _joined(content: Any) -> Any:
    """Content given as text parts (`[{"type": "text", "text": "..."}]`, OpenAI's form) as
    one text, the parts one after another, as multimodal chat templates render them; content
    with any other part is left as it is (for the template to take or refuse)."""
    if isinstance(content, list) and all(is_text_part(p) for p in content):
        return "".join(p["text"] for p in content)
    return content


def is_text_part(part: Any) -> bool:
    """Whether a content part is text: `{"type": "text", "text": "..."}` (type may be left
    out)."""
    return (
        isinstance(part, dict)
        and isinstance(part.get("text"), str)
        and part.get("type", "text") == "text"
    )


def _drop_nulls(value: Any, depth: int) -> Any:
    if depth > NULL_DEPTH:
        return value
    if isinstance(value, dict):
        return {k: _drop_nulls(v, depth + 1) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_drop_nulls(v, depth + 1) for v in value]
    return value


def conversation_text(messages: list[Any]) -> str:
    """A conversation as the build stores it (and `check` renders it): JSON text, without
    null fill-ins; a value JSON has no form for (a Parquet timestamp) as its text."""
    return json.dumps(without_fill_ins(messages), ensure_ascii=False, default=str)


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
        return {"messages": [conversation_text(row or []) for row in batch["messages"]]}

    features = ds.features.copy()
    features["messages"] = datasets.Value("string")
    work_dir.mkdir(parents=True, exist_ok=True)
    return ds.map(
        to_text,
        batched=True,
        features=features,
        cache_file_name=str(work_dir / f"messages-v{FORM}-{_fingerprint(ds)}.arrow"),
        desc=None,
    )


def _fingerprint(ds: datasets.Dataset) -> str:
    """The dataset's own fingerprint (datasets' hash of how it was made), else its files'."""
    found = getattr(ds, "_fingerprint", None)
    if isinstance(found, str) and found.isalnum():
        return found
    files = "|".join(sorted(f["filename"] for f in ds.cache_files))
    return hashlib.sha256(files.encode()).hexdigest()[:16]


def conversation_shape(messages: list[Any]) -> tuple[Any, ...]:
    """What a chat template refuses by: each message's role, keys (as a set), the kind of
    each value, the length of each list (Llama 3 refuses more than one tool call) and
    whether it calls tools with no text, in order. Two conversations of one shape differ only
    in their texts and numbers."""
    return tuple(
        (
            m.get("role"),
            tuple(
                sorted(
                    (k, type(v).__name__, len(v) if isinstance(v, list) else None)
                    for k, v in m.items()
                )
            ),
            bool(m.get("tool_calls")) and not has_text(m.get("content")),
        )
        if isinstance(m, dict)
        else (None, (), False)
        for m in messages
    )


def has_text(content: Any) -> bool:
    """Whether a message's content holds text (not null, empty or blank)."""
    return isinstance(content, str) and bool(content.strip())
