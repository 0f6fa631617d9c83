"""Notes on a conversation's answers that train otherwise than the data says: reasoning the
chat template does not write (trained without it), and an empty answer beside answers with
text (trained as the model ending its turn at once). Said by `check` and by the build."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pyarrow.compute as pc

from expert_cli.data.conversations import PROBE, conversation, has_text, joined_content

if TYPE_CHECKING:
    import datasets
    from transformers import PreTrainedTokenizerFast

# the keys an answer's reasoning is given in (Qwen3's and DeepSeek's, gpt-oss', others')
REASONING_KEYS = ("reasoning_content", "thinking", "reasoning")
REASONING_BATCH = 4096  # stored conversations searched at a time


def reasoning_in(messages: list[Any]) -> set[str]:
    """The reasoning keys holding text in a conversation's assistant turns."""
    return {
        key
        for m in messages
        if isinstance(m, dict) and m.get("role") == "assistant"
        for key in REASONING_KEYS
        if has_text(m.get(key))
    }


def unwritten_reasoning(tokenizer: PreTrainedTokenizerFast, keys: set[str]) -> list[str]:
    """The reasoning keys the chat template does not write, even in a last answer (where
    Qwen3's writes `reasoning_content` in its <think> block): found by rendering a probe."""
    unwritten = []
    for key in sorted(keys):
        probe = [
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": "a", key: PROBE},
        ]
        try:
            text = str(tokenizer.apply_chat_template(probe, tokenize=False))
        except Exception:  # noqa: BLE001 - a template that refuses the key does not write it
            text = ""
        if PROBE not in text:
            unwritten.append(key)
    return unwritten


def reasoning_note(keys: list[str], rows: int, total: int) -> str:
    """A note for `rows` of `total` conversations whose answers' reasoning, in `keys`, the
    chat template does not write: trained without it, without a word."""
    named = " and ".join(f"`{k}`" for k in keys)
    return (
        f"{rows:,} of {total:,} conversations give an answer's reasoning in {named}, which the "
        "chat template does not write: the reasoning is not trained; put it in the content "
        "(<think>...</think> before the answer), or use a base model whose template writes it "
        "(Qwen3's writes reasoning_content)"
    )


# stored text where an answer may be empty: its content null, or blank (JSON escapes too)
EMPTY_CONTENT = r'"content": (null|"(?:\s|\\[nrt])*")'


def empty_answer(messages: list[Any]) -> bool:
    """Whether a conversation holds an empty answer beside answers with text: an assistant
    turn of no text, reasoning or tool call, not left out by a weight of 0. It is trained as
    the model ending its turn at once (a conversation of empty answers alone is dropped)."""
    answers = [
        m
        for m in messages
        if isinstance(m, dict) and m.get("role") == "assistant" and m.get("weight") != 0
    ]
    said = [
        has_text(joined_content(m.get("content")))
        or bool(m.get("tool_calls"))
        or any(has_text(m.get(k)) for k in REASONING_KEYS)
        for m in answers
    ]
    return any(said) and not all(said)


def empty_answer_note(rows: int, total: int) -> str:
    return (
        f"{rows:,} of {total:,} conversations hold an empty answer beside answers with text (no "
        "text, reasoning or tool call): it is trained, as the model ending its turn at once; "
        'remove such turns, or give them "weight": 0'
    )


def conversation_notes(ds: datasets.Dataset, tokenizer: PreTrainedTokenizerFast) -> list[str]:
    """The build's notes on a training split's conversations (stored JSON text; the split's
    own rows, after the hold-out and task weights): reasoning the chat template does not
    write, and empty answers beside others. One pass; only rows whose text names such a key
    or holds an empty content are parsed."""
    if "messages" not in ds.column_names:
        return []
    keys = set(unwritten_reasoning(tokenizer, set(REASONING_KEYS)))
    pattern = "|".join([*(f'"{k}": "' for k in sorted(keys)), EMPTY_CONTENT])
    found: set[str] = set()
    reasoned = empty = 0
    for batch in ds.select_columns(["messages"]).with_format("arrow").iter(REASONING_BATCH):
        column = batch.column("messages")
        named = pc.fill_null(pc.match_substring_regex(column, pattern), False)
        for i in pc.indices_nonzero(named).to_pylist():
            messages = conversation(column[i].as_py())
            if given := reasoning_in(messages) & keys:
                found |= given
                reasoned += 1
            empty += empty_answer(messages)
    notes = [reasoning_note(sorted(found), reasoned, len(ds))] if reasoned else []
    return notes + ([empty_answer_note(empty, len(ds))] if empty else [])
