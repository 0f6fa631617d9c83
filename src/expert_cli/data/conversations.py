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

from expert_cli.data.calls import CALL_FROMS, CALL_ROLE, call_turn, legacy_turn
from expert_cli.data.file_text import drop_nulls, shown_name
from expert_cli.data.tools import ToolsGiven
from expert_cli.deadline import TEMPLATE_SECONDS, within

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

KEPT_WHEN_NULL = ("role", "content")
EMPTY = "an empty conversation (no messages)"  # a refusal no template is to blame for
FORM = 6  # the stored form's version, in the name of a converted file a resumed build reuses
# (2: text parts joined; 3: ShareGPT's turns as role/content; 4: Capybara's input/output too;
# 6: calls as tool_calls: ShareGPT's function_call turns, OpenAI's earlier function_call;
# a conversation's JSON text read as its turns)


# ShareGPT's turns (`{"from": "human", "value": "..."}`, as Axolotl, LLaMA-Factory and Unsloth
# read them): the roles a chat template knows; another `from` is kept as its role
SHAREGPT_ROLES = {
    "human": "user",
    "gpt": "assistant",
    "chatgpt": "assistant",
    "bing": "assistant",
    "bard": "assistant",
    "observation": "tool",
    "function-response": "tool",  # Locutusque's
    **dict.fromkeys(CALL_FROMS, "assistant"),  # its value read as tool_calls (data/calls.py)
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
    if isinstance(messages, str):  # a conversation kept as JSON text (Toucan's)
        messages = json_turns(messages)
    if not isinstance(messages, list):
        return messages
    if _texts(messages):
        return [
            {"role": ("user", "assistant")[i % 2], "content": t} for i, t in enumerate(messages)
        ]
    return [turn for m in messages for turn in _turns(m)]


def json_turns(text: str) -> Any:
    """JSON text of a conversation's turns (a list of objects) as the list; any other text
    (a prompt that happens to be JSON of a list of words) as it is."""
    if not text.lstrip().startswith("["):
        return text
    try:
        parsed = json.loads(text)
    except (ValueError, RecursionError):
        return text
    turns = isinstance(parsed, list) and parsed and all(isinstance(m, dict) for m in parsed)
    return parsed if turns else text


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
    calls = any(isinstance(m, dict) and m.get("from") in tuple(CALL_FROMS) for m in given)
    legacy = any(isinstance(m, dict) and m.get("role") is not None and _turns(m) != [m]
                 for m in given)  # fmt: skip
    parts = ["ShareGPT's `from` as role, `value` as content"] if shared else []
    parts += ["a function_call's value as the assistant's tool_calls"] if calls else []
    parts += (
        ["OpenAI's function_call and function turns as tool_calls and tool turns"] if legacy else []
    )
    parts += ["Capybara's items as two turns each, its `input` a user's, its `output` the "
              "assistant's"] if paired else []  # fmt: skip
    counted = "; turns count from 0, as read" if paired else ""
    return f" (read as messages: {'; '.join(parts)}{counted})"


def _turns(message: Any) -> list[Any]:
    if not isinstance(message, dict):
        return [message]
    if message.get("role") is not None:  # OpenAI's earlier function calling read as today's
        return [legacy_turn(message)]
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
    if isinstance(said, str) and said in CALL_FROMS:
        return [call_turn(message.get("value"), rest)]
    return [{"role": role, "content": message.get("value"), **rest}]


def without_fill_ins(messages: list[Any]) -> list[Any]:
    """The conversation without null-valued keys (Arrow's fill-ins, a Parquet file's, an SDK
    dump's `"tool_calls": null`), in nested objects too; a message's role and content are
    kept as given, null or not, content given as text parts is joined into one text, and
    anything that is not an object is left as it is."""
    return [
        {
            k: joined_content(v) if k == "content" else v if k == "role" else drop_nulls(v, 1)
            for k, v in m.items()
            if v is not None or k in KEPT_WHEN_NULL
        }
        if isinstance(m, dict)
        else m
        for m in messages
    ]


def joined_content(content: Any) -> Any:
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
RENDERS_NOTHING = "it renders no text"  # a verdict on the conversation's text, not its shape


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
        with within(TEMPLATE_SECONDS):  # TimedOut is no Exception: no row's verdict
            text = str(tokenizer.apply_chat_template(messages, tokenize=False))
    except MemoryError:
        raise
    except Exception as exc:  # noqa: BLE001 - the template's verdict on the user's row
        return "", f"{type(exc).__name__}, roles {_roles(messages)}"
    if not text.strip():  # it writes nothing for this one (it did for the probe at the load)
        return "", f"{RENDERS_NOTHING}, roles {_roles(messages)}"
    if any(isinstance(m, dict) and m.get("role") == CALL_ROLE for m in messages):
        return "", f"its function_call turn is not a call, roles {_roles(messages)}"
    if not _calls_rendered(tokenizer, messages, text):
        return "", f"its tool_calls are not rendered, roles {_roles(messages)}"
    if unwritten := _unwritten_roles(tokenizer, messages):
        return "", f"its {unwritten} turns are not rendered, roles {_roles(messages)}"
    if isinstance(tokenizer, ToolsGiven) and not _tools_rendered(tokenizer, messages, text):
        return "", f"its tools are not rendered, roles {_roles(messages)}"
    return text, None


PROBE = "expert-cli-probe-7f3a"  # a text no template writes of its own
COMMON_ROLES = ("user", "assistant", "system", "tool")  # roles every tool-aware template writes


def _unwritten_roles(tokenizer: PreTrainedTokenizerFast, messages: list[Any]) -> str | None:
    """The roles of turns the template leaves out, or None: a turn of another role than the
    common ones (ShareGPT's `from` kept as its role) is given a probe text, which the render
    must hold (Qwen3's template skips a role it does not know, so a tool's result or a call
    left in its own role vanished and the answer after it trained without it)."""
    odd = [
        i
        for i, m in enumerate(messages)
        if isinstance(m, dict) and m.get("role") not in COMMON_ROLES and has_text(m.get("content"))
    ]
    if not odd:
        return None
    probed = [{**m, "content": f"{PROBE}-{i}-"} if i in odd else m for i, m in enumerate(messages)]
    try:
        text = str(tokenizer.apply_chat_template(probed, tokenize=False))
    except Exception:  # noqa: BLE001 - it rendered the texts: they are written
        return None
    lost = dict.fromkeys(str(messages[i]["role"]) for i in odd if f"{PROBE}-{i}-" not in text)
    return ", ".join(shown_name(r).strip("'") for r in lost) or None


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
