"""Sources of two layouts in one run (a multi_task expert's tasks, each detected from its own
columns): instruction data beside conversations is trained as conversations of the tokenizer's
chat template, the layout `prompt_template: chat_template` gives instruction data alone, so the
expert learns one prompt layout; text, laid out already, shares a run with text only."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import datasets

from expert_cli.data.conversations import FORM, conversation_text
from expert_cli.data.dataset_rows import dataset_fingerprint
from expert_cli.data.fields import KIND_WORDS, FieldSpec, held_words
from expert_cli.data.instruction import CHAT_TEMPLATE, as_turns
from expert_cli.errors import UserError

INSTRUCTION_ROLES = ("instruction", "input", "system", "response")


def run_kind(specs: list[FieldSpec], prompt_template: str) -> str:
    """The layout the run's rows are formatted in, from each source's fields in the order
    read; UserError naming two sources of layouts a run cannot join: a text source and the
    first of another layout (wherever the text one stands), else the first two that differ
    where the prompt template is not the chat template."""
    text = next((s for s in specs if s.kind == "text"), None)  # beside any other: refused
    first = text or specs[0]
    other = next((s for s in specs if s.kind != first.kind), None)
    if other is None:
        return first.kind
    both = (
        f"{other.at}: its columns read as {KIND_WORDS[other.kind]} ({held_words(other)}), and "
        f"those of {first.at} as {KIND_WORDS[first.kind]} ({held_words(first)})"
    )
    if "text" in (first.kind, other.kind):
        raise UserError(
            f"{both}; text is trained as written, in its own layout, so it shares a run with "
            "text only: write every source (each task's file) in one layout"
        )
    if prompt_template != CHAT_TEMPLATE:
        raise UserError(
            f"{both}; instruction data beside conversations is trained as conversations of the "
            "tokenizer's chat template, one prompt layout for the expert: set "
            f'base_models[0].prompt_template to "{CHAT_TEMPLATE}" (it is {prompt_template!r}), '
            "or write every source (each task's file) in one layout"
        )
    return "messages"


def as_conversations(ds: datasets.Dataset, work_dir: Path) -> datasets.Dataset:
    """Instruction rows (columns renamed to their roles) as the conversations the chat
    template renders, a conversation's JSON text in `messages` as a conversation source holds
    it; written under `work_dir`."""

    def to_turns(batch: dict[str, list[Any]]) -> dict[str, list[str]]:
        n = len(batch["instruction"])
        return {"messages": [conversation_text(turns) for turns in as_turns(batch, n)]}

    work_dir.mkdir(parents=True, exist_ok=True)
    name = f"turns-v{FORM}-{dataset_fingerprint(ds)}.arrow"
    return ds.map(
        to_turns,
        batched=True,
        remove_columns=[r for r in INSTRUCTION_ROLES if r in ds.column_names],
        features=datasets.Features({"messages": datasets.Value("string")}),
        cache_file_name=str(work_dir / name),
        desc=None,
    )


def conversation_row(row: dict[str, Any]) -> dict[str, Any]:
    """One instruction row (as check keeps it) as the conversation the build trains."""
    batch = {role: [row.get(role)] for role in INSTRUCTION_ROLES}
    return {"messages": as_turns(batch, 1)[0]}
