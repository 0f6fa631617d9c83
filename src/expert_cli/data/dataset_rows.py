"""A hub or saved dataset's rows as the build stores them and `check` reads them.

Its typed conversations (Arrow structs) and tool definitions are written once as JSON text
(`as_text`), in the build's own work folder, as a local file's rows are written
(data/conversations.py has the stored form); a `response` beside `messages` (TRL's
conversational prompt and completion) is joined into the conversation there
(data/completions.py). `check` reads the same rows with `dataset_scan`, as a local source's
scan gives them.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import datasets

from expert_cli.data.completions import JOINED, joined_row
from expert_cli.data.conversations import FORM, conversation_text, standard_turns
from expert_cli.data.fields import TOOLS, FieldSpec
from expert_cli.data.rows import Scan
from expert_cli.data.tools import parsed_tools, tools_text, typed_objects

DATASET_BATCH_ROWS = 1024  # rows of a hub or saved dataset read at a time (check)


def as_text(ds: datasets.Dataset, work_dir: Path) -> datasets.Dataset:
    """A hub or saved dataset with its `messages` column (an Arrow struct) as JSON text, a
    `response` and a `system` beside it joined in, and its `tools` where they are objects,
    written under `work_dir` (never beside the user's files or into a shared cache)."""
    typed = [  # a conversation's JSON text too: its turns read (ShareGPT's, OpenAI's earlier)
        role
        for role in ("messages", "tools")
        if role in ds.features
        and (role == "messages" or not isinstance(ds.features[role], datasets.Value))
    ]
    joins = [role for role in JOINED if role in ds.features] if "messages" in typed else []
    named = "tools" in ds.features  # a response's calls are of the row's tools (xlam's)
    structs = named and typed_objects(ds.features["tools"])  # Arrow's fill-ins
    if not typed:
        return ds

    def to_text(batch: dict[str, list[Any]]) -> dict[str, list[Any]]:
        out = {}
        tools = [parsed_tools(t, structs)[0] for t in batch["tools"]] if named else None
        if "messages" in typed:
            rows = batch["messages"]
            if joins:  # a response's turns, a system prompt: one conversation, read as turns
                parts = [
                    {**{role: batch[role][i] for role in joins}, TOOLS: tools and tools[i]}
                    for i in range(len(rows))
                ]
                rows = [
                    joined_row({"messages": m, **p})["messages"] or []
                    for m, p in zip(rows, parts, strict=True)
                ]
            else:
                rows = [standard_turns(row or []) for row in rows]
            out["messages"] = [conversation_text(row) for row in rows]
        if "tools" in typed:
            out["tools"] = [tools_text(t) for t in tools or []]
        return out

    features = ds.features.copy()
    for role in typed:
        features[role] = datasets.Value("string")
    for role in joins:
        del features[role]
    work_dir.mkdir(parents=True, exist_ok=True)
    return ds.map(
        to_text,
        batched=True,
        remove_columns=joins or None,
        features=features,
        cache_file_name=str(work_dir / f"messages-v{FORM}-{dataset_fingerprint(ds)}.arrow"),
        desc=None,
    )


def dataset_fingerprint(ds: datasets.Dataset) -> str:
    """The dataset's own fingerprint (datasets' hash of how it was made), else its files'."""
    found = getattr(ds, "_fingerprint", None)
    if isinstance(found, str) and found.isalnum():
        return found
    files = "|".join(sorted(f["filename"] for f in ds.cache_files))
    return hashlib.sha256(files.encode()).hexdigest()[:16]


def dataset_scan(ds: Any, fields: FieldSpec, location: str) -> Scan:
    """The rows of a hub or saved dataset (its columns checked and renamed to their roles by
    `checked_columns`), as a local source's scan gives them: a conversation's turns as the
    build reads them."""
    scan = Scan(fields, iter(()), f"{location}: row 1")
    roles = [role for role in fields.mapping if role in ds.column_names]  # renamed to them
    structs = TOOLS in roles and typed_objects(ds.features[TOOLS])  # Arrow's fill-ins

    def rows() -> Iterator[dict[str, Any]]:
        number = 0
        for batch in ds.select_columns(roles).iter(batch_size=DATASET_BATCH_ROWS):
            for i in range(len(batch[roles[0]])):
                number += 1
                scan.at = f"{location}: row {number}"
                row = {role: batch[role][i] for role in roles}
                if "messages" in row:
                    row["messages"] = standard_turns(row["messages"] or [])
                if TOOLS in row:  # as a file's checked rows hold them: a list, or None
                    row[TOOLS] = parsed_tools(row[TOOLS], structs)[0]
                yield joined_row(row)

    scan.rows = rows()
    return scan
