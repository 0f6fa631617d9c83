"""`check`'s look at conversations through the chat template, as the build renders them:
why the template refuses a conversation, which answers it leaves as context (earlier ones a
template writes otherwise than a last one: Qwen3 leaves their reasoning out), and whether a
conversation has nothing to train on. Each conversation shape is rendered once."""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any

from expert_cli.config.resolve import ResolvedConfig
from expert_cli.data.conversations import (
    RENDERS_NOTHING,
    conversation,
    conversation_shape,
    conversation_text,
    has_text,
    render_conversation,
    without_fill_ins,
)
from expert_cli.data.fields import TOOLS
from expert_cli.data.formatting import check_chat_template, unanswered
from expert_cli.data.spans import has_content
from expert_cli.data.stats_words import LAST_TURNS_WHY, MANY_TURNS_WHY
from expert_cli.data.tools import parsed_tools, tools_shape, with_tools
from expert_cli.data.turns import MAX_ASKED, conversation_spans, turn_layout, weighed_out
from expert_cli.errors import UserError

if TYPE_CHECKING:
    from collections.abc import Callable

    from transformers import PreTrainedTokenizerFast

MAX_SHAPES = 4096  # conversation shapes whose template verdict is remembered
# the masking rules that leave some of a conversation's answers as context, and why
CONTEXT_WHY = {
    "last_turns": ("have earlier answers left as context", LAST_TURNS_WHY),
    "many_turns": (f"have over {MAX_ASKED} answers", MANY_TURNS_WHY),
}


class TemplateVerdict:
    """Why the chat template refuses one conversation (None when it renders it), where the
    template itself works; the build drops what it refuses. It also counts the conversations
    whose answers it leaves in part as context (`context`, by the build's masking rule:
    `last_turns`, `many_turns`), which the build counts too.

    Templates refuse by a conversation's shape (roles that do not alternate, a system turn
    where none may be, a role or key they do not know, more tool calls than one), so each
    shape (`conversations.conversation_shape`) is rendered once: `check` stays about as fast
    as reading the rows (a render costs 30-60 us, a million rows were a minute more). A
    template that refuses by a message's text is found by the build, which counts every row
    it drops; once a row renders as no text (which only the text can make it), every row of
    its shape is rendered."""

    def __init__(self, cfg: ResolvedConfig, tokenizer: PreTrainedTokenizerFast) -> None:
        self.cfg, self.tokenizer, self.layout = cfg, tokenizer, turn_layout(tokenizer)
        self.seen: dict[tuple[Any, ...], tuple[str | None, str]] = {}
        self.by_text: set[tuple[Any, ...]] = set()  # shapes a row of renders as no text
        self.context: Counter[str] = Counter()  # rows by the rule leaving answers as context

    def __call__(self, row: dict[str, Any], counted: bool = True) -> str | None:
        # as the template will see it, whether an answer is left out ("weight": 0), its tools
        messages, tools = row["messages"], parsed_tools(row.get(TOOLS))[0]
        weighed = any(map(weighed_out, messages))
        shape = conversation_shape(without_fill_ins(messages)), weighed, tools_shape(tools)
        found = self.seen.get(shape) or self._render(messages, tools)
        if (found[0] or "").startswith(RENDERS_NOTHING):  # by what the rows say: each asked
            self.by_text.add(shape)
            self.seen.pop(shape, None)
        elif len(self.seen) < MAX_SHAPES and shape not in self.by_text:
            self.seen[shape] = found
        why, style = found
        if counted and why is None and style in CONTEXT_WHY:
            self.context[style] += 1
        return why

    def _render(self, messages: list[Any], tools: list[Any] | None) -> tuple[str | None, str]:
        stored = conversation(conversation_text(messages))  # as the build keeps it
        tok = with_tools(self.tokenizer, tools)
        text, why = render_conversation(tok, stored)
        if why is not None:
            return why, "refused"
        # rendered: with an answer to train? (the build drops it if not)
        style = conversation_spans(tok, stored, text, self.cfg.response_template, self.layout)[1]
        why = unanswered(style, messages)
        return ("no response_template in the rendered text" if style == "missing" else why), style

    def notes(self, total: int, quick: bool) -> list[str]:
        """check's words for the conversations whose answers are left in part as context, of
        the training sources' `total` (those held out for evaluation too)."""
        read = (
            "training conversations read (--quick)" if quick else "training sources' conversations"
        )
        return [
            f"{n:,} of the {total:,} {read} {CONTEXT_WHY[k][0]}: {CONTEXT_WHY[k][1]}"
            for k, n in sorted(self.context.items())
        ]


def template_verdict(
    cfg: ResolvedConfig, tokenizer: PreTrainedTokenizerFast | None
) -> TemplateVerdict | None:
    """The chat template's verdict on conversations, where the template itself works."""
    return TemplateVerdict(cfg, tokenizer) if _works(cfg, tokenizer) else None


def _works(cfg: ResolvedConfig, tokenizer: PreTrainedTokenizerFast | None) -> bool:
    """Whether there is a chat template to ask (where not, checks.py says why)."""
    if tokenizer is None:
        return False
    try:
        check_chat_template(tokenizer, cfg.response_template)
    except UserError:  # said by _format_problems
        return False
    return True


def blank_conversation(
    cfg: ResolvedConfig, tokenizer: PreTrainedTokenizerFast | None
) -> Callable[[dict[str, Any]], bool] | None:
    """Whether a conversation has nothing to train on, as the build finds it (its rendered
    assistant turns hold only whitespace and end-of-turn markers); None where the template
    does not work. Only a conversation with no assistant turn whose content holds text is
    rendered (its reasoning or tool calls may be all it trains): the others have something
    to train on, and check stays about as fast as reading the rows."""
    if tokenizer is None or not _works(cfg, tokenizer):
        return None
    layout = turn_layout(tokenizer)

    def blank(row: dict[str, Any]) -> bool:
        messages = row["messages"]
        if not isinstance(messages, list) or any(map(_says_something, without_fill_ins(messages))):
            return False
        stored = conversation(conversation_text(messages))
        tok = with_tools(tokenizer, parsed_tools(row.get(TOOLS))[0])
        text, why = render_conversation(tok, stored)
        if why is not None:
            return False  # refused: counted as such
        spans, style = conversation_spans(tok, stored, text, cfg.response_template, layout)
        if not spans and style == "turns":  # every answer of "weight": 0, as the build finds it
            return True
        return style != "missing" and not has_content(text, spans, tokenizer.eos_token, layout.ends)

    return blank


def _says_something(message: Any) -> bool:
    """Whether a message is an assistant turn with text in its content."""
    return (
        isinstance(message, dict)
        and message.get("role") == "assistant"
        and has_text(message.get("content"))
        and not weighed_out(message)
    )
