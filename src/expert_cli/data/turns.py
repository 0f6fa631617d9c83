"""The assistant turns of a conversation as its chat template writes them, for `messages` data.

The marker rules of data/spans.py know ChatML and `<|assistant|>` turns. Other templates (Llama 3,
Gemma, Mistral) write other markers, and a `response_template` trains from its first occurrence
to the end of the text: the user turns of a multi-turn conversation after the first answer were
trained. And a template may write an earlier assistant turn otherwise than the last one: Qwen3's
leaves the reasoning block out of every answer before the last user turn, so an earlier answer
was trained without the `<think>` block the model writes at inference, and the same prompt had
two targets.

`template_turns` asks the template itself. Assistant turn i is what rendering the conversation's
first i+1 messages adds to the generation prompt of its first i (trailing whitespace aside). Where
that is also how the whole conversation's text holds the turn, the turn is trained; where it is
not (Qwen3's earlier answers), the turn is context, trained in no form, and the row is
`last_turns`. Where a turn rendered last is not its generation prompt and then the answer
(Mistral v0.3 writes the system text into the last user turn only), an answer that is the
conversation's last message is the text after its generation prompt, and the others are
context. A template that does not write answers after its generation prompt at all
(`TurnLayout.follows`) leaves the rows to the marker rules.

Rendering costs 30-60 us a time (about 0.25 ms for Qwen3's template), twice per assistant turn.
A template that writes every turn alike (`turn_layout`, asked once with a two-exchange
conversation) and whose text the marker rules read gives the same spans, so `needs_turns` asks
the template only where the answer can differ: no marker it knows, a `response_template`, or an
answer before the last message under a template that writes turns otherwise (unless it writes
answers of role and content alike, and the conversation's earlier answers are such).

An answer with OpenAI's `"weight": 0` is context (`weighted`): the template is asked for the
other answers alone. Where the template cannot be asked (it writes no answer after its
generation prompt, or refuses a part of the conversation) such a row is `unweighed`, refused
rather than trained on the answer its author left out.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from expert_cli.data.spans import Span, assistant_spans
from expert_cli.deadline import TEMPLATE_SECONDS, TimedOut, deadline, within
from expert_cli.errors import UserError

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

# an answer of these keys alone, under a template that writes answers of them alike (`plain`),
# is not asked again
PLAIN_KEYS = {"role", "content"}
# Qwen3 writes an empty reasoning block into an answer after the last user turn only when it
# is the conversation's last message (a tool call before the tool's reply is written without)
LEADING_EMPTY_THINK = re.compile(r"^<think>\s*</think>\s*")
# a generation prompt that ends by opening the answer's reasoning block, which the template
# writes into no answer of a conversation (DeepSeek-R1 distills, QwQ): an answer is read after
# the prompt without it
THINK_OPENING = re.compile(r"<think>\s*$")
# answers of one conversation asked of the template: two renders each, each as long as the
# conversation up to it, so the cost grows with the square of its turns (1,000 exchanges under
# Qwen3's template took 54 s); the others are context, the row counted as `many_turns`
MAX_ASKED = 64
PROBE = [
    {"role": "user", "content": "Which is larger, 3 or 5?"},
    # reasoning: a template that leaves it out of earlier answers (Qwen3's) writes them otherwise
    {"role": "assistant", "content": "5", "reasoning_content": "3 < 5"},
    {"role": "user", "content": "And 7 or 2?"},
    {"role": "assistant", "content": "7"},
]


def weighed_out(message: Any) -> bool:
    """An assistant message its author left out of training: OpenAI's `"weight": 0` (a
    number; any other weight, or none, trains it)."""
    if not isinstance(message, dict) or message.get("role") != "assistant":
        return False
    weight = message.get("weight")
    return isinstance(weight, int | float) and not isinstance(weight, bool) and weight == 0


def _render(tokenizer: PreTrainedTokenizerFast, messages: list[Any], prompt: bool) -> str:
    with within(TEMPLATE_SECONDS):  # TimedOut is no Exception: no row's verdict
        return str(
            tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=prompt)
        )


def template_turns(
    tokenizer: PreTrainedTokenizerFast, messages: list[Any], text: str, limit: int | None = None
) -> tuple[list[Span], int] | None:
    """(character spans of the assistant turns `text` holds as the template writes a last
    turn, how many it holds otherwise); None when the template refuses a part of the
    conversation. Only for a
    template whose `TurnLayout` says its answers follow its generation prompt. Turns whose
    prompt starts past `limit` characters are not asked (the text is tokenized to there).

    A turn rendered last may end with what the template writes after a whole conversation
    (Phi-3's EOS), and may begin with an empty reasoning block that the template writes only
    into a last turn (Qwen3's): the text holding the turn without either is the same turn."""
    spans: list[Span] = []
    otherwise = 0
    eos = getattr(tokenizer, "eos_token", None) or ""
    for i in _asked(messages):
        if weighed_out(messages[i]):
            continue  # context, as the template writes it
        try:
            prompt = _render(tokenizer, messages[:i], True)
            if limit is not None and len(prompt) > limit:
                break
            last = i == len(messages) - 1
            whole = text if last else _render(tokenizer, messages[: i + 1], False)
        except MemoryError:
            raise
        except Exception:  # noqa: BLE001 - a template that needs the whole conversation
            return None
        prompt = _without_opening(prompt, whole)
        if not whole.startswith(prompt):  # the template writes the turns before it otherwise
            # (Mistral v0.3 puts the system text into the last user turn): an answer that is
            # the last message is still the text after its generation prompt
            if last and text.startswith(prompt):
                spans.append((len(prompt), len(text.rstrip())))
            else:
                otherwise += 1
            continue
        turn = whole[len(prompt) :].rstrip()
        # as written last; without an EOS written after a whole conversation (Phi-3's, where
        # the text goes on: Qwen3's EOS is its <|im_end|>, which the text holds); without an
        # empty reasoning block written into a last answer only
        held = [turn]
        if not last and eos and turn.endswith(eos):
            held.append(turn[: -len(eos)].rstrip())
        held += [LEADING_EMPTY_THINK.sub("", t, count=1) for t in held]
        at = len(prompt)
        match = next((t for t in held if text.startswith(t, at)), None)
        if match is None or not text.startswith(prompt):
            otherwise += 1
        else:
            spans.append((at, at + len(match)))
    return spans, otherwise


def _answers(messages: list[Any]) -> list[int]:
    """The indices of a conversation's assistant turns."""
    return [
        i for i, m in enumerate(messages) if isinstance(m, dict) and m.get("role") == "assistant"
    ]


def _asked(messages: list[Any]) -> list[int]:
    """The indices of the answers asked of the template: every one, or past MAX_ASKED the first
    MAX_ASKED - 1 and the last (the one a template like Qwen3's writes whole)."""
    answers = _answers(messages)
    return answers if len(answers) <= MAX_ASKED else answers[: MAX_ASKED - 1] + answers[-1:]


def _without_opening(prompt: str, whole: str) -> str:
    """The generation prompt less a reasoning block's opening that `whole` (the conversation
    rendered with the answer) does not hold after it."""
    opening = THINK_OPENING.search(prompt)
    if opening and not whole.startswith(prompt) and whole.startswith(prompt[: opening.start()]):
        return prompt[: opening.start()]
    return prompt


@dataclass(frozen=True)
class TurnLayout:
    """How a chat template writes answers, asked once with PROBE: `follows`, an answer is its
    generation prompt and then the answer's own text (the template writes a generation
    prompt, the turn's header, or the answer begins right after the prompt: Mistral's
    `[/INST]` ends the user turn; a template that writes `assistant: ` inside the turn and no
    generation prompt would have that header trained); `consistent`, it writes an earlier
    answer as it writes the last one; `end`, what it writes after an answer (Gemma's
    `<end_of_turn>`), which is no content of it."""

    follows: bool = False
    consistent: bool = False
    end: str = ""
    plain: bool = False  # consistent for answers of role and content alone (Qwen3's are)
    opening: str = ""  # the generation prompt's reasoning opening no answer is written after
    drops_reasoning: bool = False  # a last answer's reasoning (up to </think>) is not written

    @property
    def ends(self) -> tuple[str, ...]:
        """`end` as the end-of-turn markers `spans.has_content` takes (none when empty)."""
        return (self.end,) if self.end else ()


def turn_layout(tokenizer: PreTrainedTokenizerFast) -> TurnLayout:
    """The template's TurnLayout (neither, for a template that refuses the probe); UserError
    for one that runs past TEMPLATE_SECONDS on it (a loop for conversations of more turns
    than the tokenizer's load renders)."""
    try:
        with deadline(TEMPLATE_SECONDS):
            text = _render(tokenizer, PROBE, False)
            found = template_turns(tokenizer, PROBE, text)
            header = _render(tokenizer, PROBE[:1], True) != _render(tokenizer, PROBE[:1], False)
    except TimedOut:
        raise UserError(
            f"base_models[0]: the chat template took over {TEMPLATE_SECONDS} s to render a "
            "conversation of two exchanges (a loop without end?); fix the template"
        ) from None
    except MemoryError:
        raise
    except Exception:  # noqa: BLE001 - a template that cannot render the probe
        return TurnLayout()
    if not found or not found[0]:
        return TurnLayout()
    spans, otherwise = found
    last = text[spans[-1][0] : spans[-1][1]]  # the probe's last answer, "7", as written
    answer = LEADING_EMPTY_THINK.sub("", last.lstrip(), count=1)
    begins = answer.startswith(PROBE[-1]["content"])
    end = answer[len(PROBE[-1]["content"]) :].strip() if begins else ""
    eos = getattr(tokenizer, "eos_token", None) or ""
    end = end.removesuffix(eos).rstrip() if eos and end != eos else end  # Phi-3's, after it all
    consistent = otherwise == 0 and len(spans) == 2
    plain = consistent
    if not consistent:  # the reasoning made the difference, or every answer differs
        bare = [{"role": m["role"], "content": m["content"]} for m in PROBE]
        alike = template_turns(tokenizer, bare, _render(tokenizer, bare, False))
        plain = alike is not None and alike[1] == 0 and len(alike[0]) == 2
    return TurnLayout(header or begins, consistent, end, plain, *_reasoning(tokenizer))


def _reasoning(tokenizer: PreTrainedTokenizerFast) -> tuple[str, bool]:
    """(the generation prompt's reasoning opening that no answer is written after, whether a
    last answer's reasoning written into its content is left out)."""
    reasoned = [PROBE[0], {"role": "assistant", "content": "<think>\n3 < 5\n</think>\n\n5"}]
    try:
        prompt = _render(tokenizer, PROBE[:1], True)
        opening = prompt[len(_without_opening(prompt, _render(tokenizer, PROBE[:2], False))) :]
        return opening, "3 < 5" not in _render(tokenizer, reasoned, False)
    except MemoryError:
        raise
    except Exception:  # noqa: BLE001 - a template refusing reasoning in a content: kept as is
        return "", False


def template_notes(layout: TurnLayout) -> list[str]:
    """What a chat template does to answers that a user may not expect."""
    notes = []
    if layout.opening:
        notes.append(
            f"the chat template's generation prompt ends with {layout.opening.strip()}, which "
            "it writes before no answer of a conversation (DeepSeek-R1 distills, QwQ): answers "
            "are trained right after the turn's header, and `generate` prompts end there too; "
            f"a runtime using the template's generation prompt gives {layout.opening.strip()} "
            "first"
        )
    if layout.drops_reasoning:
        notes.append(
            "the chat template leaves an answer's reasoning (its text up to </think>) out of "
            "the conversation: reasoning in the data is not trained"
        )
    return notes


def needs_turns(style: str, messages: list[Any], layout: TurnLayout, template: str | None) -> bool:
    """Whether the template must be asked for a conversation's turns (see the module doc)."""
    if not layout.follows:
        return False
    if template or style in ("none", "missing"):
        return True
    if layout.consistent:
        return False
    # answers that are not the last message: written otherwise than a last one?
    earlier = [messages[i] for i in _answers(messages[:-1])]
    return bool(earlier) and not (layout.plain and all(map(_plain, earlier)))


def _plain(message: dict[str, Any]) -> bool:
    """An answer of role and text alone, with no reasoning written into its text."""
    content = message.get("content")
    return message.keys() <= PLAIN_KEYS and isinstance(content, str) and "</think>" not in content


def conversation_spans(
    tokenizer: PreTrainedTokenizerFast,
    messages: list[Any],
    text: str,
    response_template: str | None,
    layout: TurnLayout,
    limit: int | None = None,
) -> tuple[list[Span], str]:
    """The trained spans of a rendered conversation and their rule: `turns` (every answer as
    the template writes it), `last_turns` (some answers written otherwise, left as context),
    `many_turns` (the answers past MAX_ASKED left as context),
    `weighted` (answers of `"weight": 0` left as context), `unweighed` (such answers the
    template cannot be asked to leave out: no spans, the row is refused),
    else the marker rules of data/spans.py. `limit`: see `template_turns`."""
    weighted = any(map(weighed_out, messages))  # an answer of weight 0
    if weighted and not layout.follows:
        return [], "unweighed"
    spans, style = assistant_spans(text, response_template)
    if not weighted and not needs_turns(style, messages, layout, response_template):
        return spans, style
    found = template_turns(tokenizer, messages, text, limit)
    if found == ([], 0) and (weighted or (limit is not None and len(text) > limit)):
        return [], "turns"  # its answers lie past what is tokenized, or are all weighed out
    if found is None:
        return ([], "unweighed") if weighted else (spans, style)
    if not (found[0] or found[1]):
        return spans, style
    if len(_answers(messages)) > MAX_ASKED:
        return found[0], "many_turns"  # the answers past MAX_ASKED: context
    return found[0], "last_turns" if found[1] else "weighted" if weighted else "turns"
