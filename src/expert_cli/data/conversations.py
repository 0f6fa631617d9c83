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

import json
from typing import TYPE_CHECKING, Any

import pyarrow.compute as pc

from expert_cli.data.calls import CALL_ROLE, call_turn
from expert_cli.data.file_text import drop_nulls, shown_name
from expert_cli.data.tools import ToolsGiven

if TYPE_CHECKING:
    import datasets
    from transformers import PreTrainedTokenizerFast

KEPT_WHEN_NULL = ("role", "content")
EMPTY = "an empty conversation (no messages)"  # a refusal no template is to blame for
FORM = 6  # the stored form's version, in the name of a converted file a resumed build reuses
# (2: text parts joined; 3: ShareGPT's turns as role/content; 4: Capybara's input/output too;
# 6: ShareGPT's function_call turns as tool_calls)


# ShareGPT's turns (`{"from": "human", "value": "..."}`, as Axolotl, LLaMA-Factory and Unsloth
# read them): the roles a chat template knows; another `from` is kept as its role
SHAREGPT_ROLES = {
    "human": "user",
    "gpt": "assistant",
    "chatgpt": "assistant",
    "bing": "assistant",
    "bard": "assistant",
    "observation": "tool",
    CALL_ROLE: "assistant",  # its value read as the turn's tool_calls (data/calls.py)
}
# Capybara's turns (`{"input": question, "output": answer}`): one exchange an item
CAPYBARA = {"input", "output"}
# the keys of a turn in each form standard_turns reads: OpenAI's, ShareGPT's, Capybara's
TURN_FORMS = ({"role", "content"}, {"from", "value"}, CAPYBARA)


def standard_turns(messages: Any) -> Any:
    """A conversation whose turns are ShareGPT's (`from` and `value`, no `role` or `content`)
    or Capybara's (`input` and `output`: a question and its answer in one item) as
    role/content messages, their other keys kept; LIMA's list of texts as a user's and the
    assistant's turns in turn; any other value as it is."""
    if not isinstance(messages, list):
        return messages
    if _texts(messages):
        return [
            {"role": ("user", "assistant")[i % 2], "content": t} for i, t in enumerate(messages)
        ]
    return [turn for m in messages for turn in _turns(m)]


def _texts(messages: list[Any]) -> bool:
    """Whether a conversation is a list of texts (LIMA's: question, answer, question, ...);
    a null among them is a turn of no content (which the row's check names)."""
    return any(isinstance(m, str) for m in messages) and all(
        isinstance(m, str) or m is None for m in messages
    )


def form_note(given: Any) -> str:
    """Words after a problem found in `standard_turns(given)`, where it changed the turns: the
    item numbers and keys a problem names are those of the turns read, not the file's."""
    if isinstance(given, list) and _texts(given):
        return " (read as messages: a list of texts as a user's and the assistant's turns in turn)"
    if not isinstance(given, list) or not any(_turns(m) != [m] for m in given):
        return ""
    shared = any(isinstance(m, dict) and m.get("from") is not None for m in given)
    paired = any(len(_turns(m)) == 2 for m in given)
    calls = any(isinstance(m, dict) and m.get("from") == CALL_ROLE for m in given)
    parts = ["ShareGPT's `from` as role, `value` as content"] if shared else []
    parts += ["a function_call's value as the assistant's tool_calls"] if calls else []
    parts += ["Capybara's items as two turns each, its `input` a user's, its `output` the "
              "assistant's"] if paired else []  # fmt: skip
    counted = "; turns count from 0, as read" if paired else ""
    return f" (read as messages: {'; '.join(parts)}{counted})"


def _turns(message: Any) -> list[Any]:
    if not isinstance(message, dict) or message.get("role") is not None:
        return [message]
    if message.get("content") is not None:
        return [message]  # a role/content message (with a `from` of its own: a name)
    if message.get("from") is None:
        said = [message.get(k) for k in sorted(CAPYBARA)]
        if said != [None, None]:  # one of them given (a struct fills both in, null)
            skip = ("input", "output", "role", "content", "from")
            rest = {k: v for k, v in message.items() if k not in skip}
            question = {"role": "user", "content": message.get("input")}
            return [question, {"role": "assistant", "content": message.get("output"), **rest}]
        return [message]
    said = message["from"]
    role = SHAREGPT_ROLES.get(said, said) if isinstance(said, str) else said
    rest = {k: v for k, v in message.items() if k not in ("from", "value", "role", "content")}
    if said == CALL_ROLE:
        return [call_turn(message.get("value"), rest)]
    return [{"role": role, "content": message.get("value"), **rest}]


def without_fill_ins(messages: list[Any]) -> list[Any]:
    """The conversation without null-valued keys (Arrow's fill-ins, a Parquet file's, an SDK
    dump's `"tool_calls": null`), in nested objects too; a message's role and content are
    kept as given, null or not, content given as text parts is joined into one text, and
    anything that is not an object is left as it is."""
    return [
        {
            k: _joined(v) if k == "content" else v if k == "role" else drop_nulls(v, 1)
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


def conversation_text(messages: list[Any]) -> str:
    """A conversation as the build stores it (and `check` renders it): JSON text, without
    null fill-ins; a value JSON has no form for (a Parquet timestamp) as its text."""
    return json.dumps(without_fill_ins(messages), ensure_ascii=False, default=str)


def conversation(value: list[Any] | str) -> list[Any]:
    """The conversation of a stored row (JSON text), or the row itself (parsed already)."""
    return json.loads(value) if isinstance(value, str) else value


def conversation_shape(messages: list[Any]) -> tuple[Any, ...]:
    """What a chat template refuses by: each message's role, keys (as a set), the kind of
    each value, the length of each list (Llama 3 refuses more than one tool call) and
    whether it calls tools with no text, and whether its content holds reasoning (`</think>`,
    which Qwen3's template cuts from earlier answers), in order. Two conversations of one
    shape differ only in their texts and numbers."""
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
            isinstance(m.get("content"), str) and "</think>" in m["content"],  # Qwen3 cuts it
        )
        if isinstance(m, dict)
        else (None, (), False, False)
        for m in messages
    )


def has_text(content: Any) -> bool:
    """Whether a message's content holds text (not null, empty or blank)."""
    return isinstance(content, str) and bool(content.strip())


SHOWN_ROLES = 8  # roles of a refused conversation named in its note


def render_conversation(
    tokenizer: PreTrainedTokenizerFast, messages: list[dict[str, Any]] | str
) -> tuple[str, str | None]:
    """One conversation through the chat template: (text, None), or ("", why) when the template
    refuses it. `why` is the error's kind and the conversation's roles, never the error's text
    (a template's own message may quote the template or the conversation).

    A stored row is JSON text (data/conversations.py): the template sees every key as the
    source gave it. A message that calls tools must have them rendered: a template that
    leaves `tool_calls` out would train an empty reply, so such a conversation is refused;
    so is one whose tool definitions (`tokenizer` from `tools.with_tools`) it leaves out."""
    messages = conversation(messages)
    if not messages:  # nothing for the template to refuse: said as what it is
        return "", EMPTY
    try:
        text = str(tokenizer.apply_chat_template(messages, tokenize=False))
    except MemoryError:
        raise
    except Exception as exc:  # noqa: BLE001 - the template's verdict on the user's row
        return "", f"{type(exc).__name__}, roles {_roles(messages)}"
    if not _calls_rendered(tokenizer, messages, text):
        return "", f"its tool_calls are not rendered, roles {_roles(messages)}"
    if isinstance(tokenizer, ToolsGiven) and not _tools_rendered(tokenizer, messages, text):
        return "", f"its tools are not rendered, roles {_roles(messages)}"
    return text, None


def _tools_rendered(tokenizer: ToolsGiven, messages: list[Any], text: str) -> bool:
    """Whether the template writes the conversation's tools (it may ignore the argument):
    trained without their definitions, a model learns calls to functions it never saw."""
    try:
        return str(tokenizer.plain.apply_chat_template(messages, tokenize=False)) != text
    except Exception:  # noqa: BLE001 - refused without tools: they are part of its prompt
        return True


def roles_of(stored: list[Any] | str) -> str:
    """The roles of a stored conversation (JSON text or parsed), bounded, as a refusal names
    them."""
    return _roles(conversation(stored))


def _roles(messages: list[Any]) -> str:
    """The roles of a conversation, bounded, as a refusal names them."""
    roles = [str(m.get("role")) if isinstance(m, dict) else "?" for m in messages]
    more = len(roles) - SHOWN_ROLES
    shown = ", ".join(shown_name(r).strip("'") for r in roles[:SHOWN_ROLES])
    return (shown or "none") + (f" and {more} more" if more > 0 else "")


def _calls_rendered(tokenizer: PreTrainedTokenizerFast, messages: list[Any], text: str) -> bool:
    """Whether the template renders the tool calls of the turns that have nothing else (no
    text): rendered again without those calls, the conversation must change (a template
    that ignores `tool_calls` renders such a turn as an empty reply)."""
    silent = [
        i
        for i, m in enumerate(messages)
        if isinstance(m, dict) and m.get("tool_calls") and not has_text(m.get("content"))
    ]
    if not silent:
        return True
    without = [
        {k: v for k, v in m.items() if k != "tool_calls"} if i in silent else m
        for i, m in enumerate(messages)
    ]
    try:
        return str(tokenizer.apply_chat_template(without, tokenize=False)) != text
    except Exception:  # noqa: BLE001 - a template that needs the calls to render uses them
        return True


# the keys an answer's reasoning is given in (Qwen3's and DeepSeek's, gpt-oss', others')
REASONING_KEYS = ("reasoning_content", "thinking", "reasoning")
PROBE = "expert-cli-probe-7f3a"  # a text no template writes of its own
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
        has_text(_joined(m.get("content")))
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
