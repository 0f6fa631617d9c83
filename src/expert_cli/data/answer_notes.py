"""Notes on a conversation's answers that train otherwise than the data says: reasoning the
chat template does not write (trained without it), an empty answer beside answers with text
(trained as the model ending its turn at once), and a call written as `<tool_call>` text that
is not JSON (trained as written, a call no JSON parser reads). Said by `check` and the build."""

from __future__ import annotations

import json
import re
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


# a call written into an answer's text, in Hermes' and Qwen's tags
TEXT_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)


def text_calls_not_json(messages: list[Any]) -> bool:
    """Whether an answer writes a call as `<tool_call>` text whose body is not JSON (Hermes'
    function-calling data writes Python's quotes): a model trained on it writes calls that a
    serving stack's parser (json.loads of the block) cannot read."""
    for m in messages:
        content = m.get("content") if isinstance(m, dict) and m.get("role") == "assistant" else ""
        for body in TEXT_CALL.findall(content) if isinstance(content, str) else []:
            try:
                json.loads(body)
            except (ValueError, RecursionError):
                return True
    return False


def text_calls_note(rows: int, total: int) -> str:
    return (
        f"{rows:,} of {total:,} conversations hold an answer whose <tool_call> text is not JSON "
        "(Python's quotes, as Hermes' data writes them): it is trained as written, and a model "
        "that writes such calls is not understood by a JSON parser; write them as JSON, or as "
        "the turn's tool_calls"
    )


# the tag a tool's result opens with, as a dataset wrote it (Hermes' `<tool_response>`)
RESULT_TAG = re.compile(r"\s*(<[A-Za-z_][\w-]{0,30}>)")


def result_tags(messages: list[Any]) -> set[str]:
    """The tags the tool results of a conversation open with (`<tool_response>`)."""
    return {
        found[1]
        for m in messages
        if isinstance(m, dict) and m.get("role") == "tool" and isinstance(m.get("content"), str)
        if (found := RESULT_TAG.match(m["content"]))
    }


def result_wrapper(tokenizer: PreTrainedTokenizerFast) -> str | None:
    """The tag the chat template writes right before a tool's result (Qwen3's
    `<tool_response>`), found by rendering a probe; None where it writes none."""
    probe = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "a"},
        {"role": "tool", "content": PROBE},
    ]
    try:
        text = str(tokenizer.apply_chat_template(probe, tokenize=False))
    except Exception:  # noqa: BLE001 - a template that refuses tool turns wraps nothing
        return None
    before = text[: max(text.find(PROBE), 0)].rstrip().rsplit("\n", 1)[-1].strip()
    found = RESULT_TAG.fullmatch(before)
    return found[1] if found and PROBE in text else None


def wrapped_results_note(tag: str, rows: int, total: int) -> str:
    return (
        f"{rows:,} of {total:,} conversations give tool results that open with {tag}, which the "
        "chat template writes around each result itself: the tag is written twice, in prompts "
        "unlike those the model will be given; give the results without it"
    )


def conversation_notes(ds: datasets.Dataset, tokenizer: PreTrainedTokenizerFast) -> list[str]:
    """The build's notes on a training split's conversations (stored JSON text; the split's
    own rows, after the hold-out and task weights): reasoning the chat template does not
    write, empty answers beside others, calls in answers' text that are not JSON. One pass;
    only rows whose text names such a key, holds an empty content or a call are parsed."""
    if "messages" not in ds.column_names:
        return []
    keys = set(unwritten_reasoning(tokenizer, set(REASONING_KEYS)))
    tag = result_wrapper(tokenizer)
    pattern = "|".join(
        [
            *(f'"{k}": "' for k in sorted(keys)),
            EMPTY_CONTENT,
            "<tool_call>",
            *([re.escape(tag)] if tag else []),  # a tag's letters: escaped all the same
        ]
    )
    found: set[str] = set()
    reasoned = empty = text_calls = wrapped = 0
    for batch in ds.select_columns(["messages"]).with_format("arrow").iter(REASONING_BATCH):
        column = batch.column("messages")
        named = pc.fill_null(pc.match_substring_regex(column, pattern), False)
        for i in pc.indices_nonzero(named).to_pylist():
            messages = conversation(column[i].as_py())
            if given := reasoning_in(messages) & keys:
                found |= given
                reasoned += 1
            empty += empty_answer(messages)
            text_calls += text_calls_not_json(messages)
            wrapped += tag in result_tags(messages)
    notes = [reasoning_note(sorted(found), reasoned, len(ds))] if reasoned else []
    notes += [empty_answer_note(empty, len(ds))] if empty else []
    notes += [text_calls_note(text_calls, len(ds))] if text_calls else []
    return notes + ([wrapped_results_note(str(tag), wrapped, len(ds))] if wrapped else [])
