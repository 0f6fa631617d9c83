"""How `generate` lays out a prompt: as the run's data laid out the prompts it trained on.

- instruction data: the manifest's `prompt_template` around the prompt;
- `messages` data: the run's chat template, one user turn and the generation prompt;
- `text` data: the layout most of its kept examples had (the build counts the masking rule
  each example was trained by: `styles` in the cache's stats): ChatML turns,
  `<|user|>`/`<|assistant|>` turns (ended by `<|end|>`, or by `</s>` where the data's were),
  the text then `response_template`, or the text continued as written where whole texts were
  trained. A prompt that already holds the layout's markers
  is used as written, so a user can give the whole layout.

An answer stops at its layout's turn end and at the next turn's opening, as text where the
tokenizer has no token for them (`<|end|>` data trained on a tokenizer without that token).

A manifest without `field_mapping` has its data's kind detected from the columns; the build
records what it detected (`fields` in the stats). A run built before that (or the layouts)
was recorded gets a stated guess.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from expert_cli.config.resolve import ResolvedConfig
from expert_cli.data.fields import mapping_kind
from expert_cli.data.formatting import unwritten_header
from expert_cli.data.instruction import CHAT_TEMPLATE, render_instruction
from expert_cli.data.spans import (
    CHATML_ASSISTANT,
    CHATML_END,
    EOS_TURN_END,
    MARKER_ASSISTANT,
    MARKER_END,
)
from expert_cli.data.tools import ToolsGiven, with_tools
from expert_cli.data.turns import turn_layout
from expert_cli.deadline import TEMPLATE_SECONDS, within
from expert_cli.errors import UserError

MARKER_HOLDS = (MARKER_ASSISTANT, "<|user|>", "<|system|>")  # a prompt holding one: as written
# the layouts a text without response_template has
TEXT_STYLES = ("chatml", "marker", "marker_eos", "none")
# each text layout's turn end and the next turn's opening, where an answer stops
LAYOUT_STOPS = {
    "chatml": (CHATML_END, "<|im_start|>"),
    "marker": (MARKER_END, "<|user|>"),
    "marker_eos": (EOS_TURN_END, "<|user|>"),
}
DESCRIBED = {
    "messages": "the run's chat template (one user turn)",
    "chatml": "a ChatML user turn, as the text data's",
    "marker": "a <|user|> turn then <|assistant|>, as the text data's",
    "marker_eos": "a <|user|> turn ended by </s> then <|assistant|>, as the text data's",
    "template": "the prompt then training.dataset.response_template",
    "none": "as written (the text data was trained whole)",
}


@dataclass(frozen=True)
class PromptFormat:
    """One run's prompt layout: `style` is "instruction", "messages" or a text layout."""

    style: str
    template: str | None = None  # the prompt_template, or the response_template
    opening: str = ""  # a chat template's reasoning opening that training prompts did not end with
    # what a prompt ends with where the chat template writes no generation prompt (the text the
    # answers trained after: formatting.unwritten_header), worked out once per run
    closing: str = ""

    @property
    def described(self) -> str:
        if self.style == "instruction":
            return f"the base model's prompt_template {self.template}"
        return DESCRIBED[self.style]

    @property
    def stops(self) -> tuple[str, ...]:
        """The markers an answer ends at, as the data wrote them (a chat template's end is
        its tokenizer's EOS or end-of-turn token)."""
        if self.style == "instruction":
            return LAYOUT_STOPS["chatml"] if self.template == "chatml" else ()
        return LAYOUT_STOPS.get(self.style, ())

    def render(
        self, tokenizer: Any, text: str, system: str | None = None, tools: list[Any] | None = None
    ) -> list[int]:
        """The prompt's token ids, ready for the answer's first token; `system` is the
        system turn before it, where the layout has one; `tools`, definitions its chat
        template writes."""
        if self.style == "messages":
            return _chat(with_tools(tokenizer, tools), text, system, self.opening, self.closing)
        if tools:
            raise UserError(
                "--tools: the run trained on prompts laid out without a chat template "
                f"({self.described}); tool definitions are given to a chat template"
            )
        if self.style == "instruction":
            prompt = render_instruction(self.template or "chatml", text, None, system)[0]
        elif self.style == "chatml" and "<|im_start|>" not in text:
            head = f"<|im_start|>system\n{system}{CHATML_END}\n" if system else ""
            prompt = f"{head}<|im_start|>user\n{text}{CHATML_END}\n{CHATML_ASSISTANT}\n"
        elif self.style.startswith("marker") and not any(m in text for m in MARKER_HOLDS):
            end = EOS_TURN_END if self.style == "marker_eos" else MARKER_END
            head = f"<|system|>\n{system}{end}\n" if system else ""
            prompt = f"{head}<|user|>\n{text}{end}\n{MARKER_ASSISTANT}\n"
        elif system:
            raise UserError(
                "--system: the prompt is used as written (it holds the layout's markers, or "
                "the run's text data has no system turn); put the system text in the prompt"
            )
        elif self.style == "template" and self.template and self.template not in text:
            # a space ending the template went into the answer's first token in training; a
            # newline stayed with the template (BPE keeps ":\n" one token, on the prompt's side)
            prompt = text + self.template.rstrip(" \t")
        else:
            prompt = text
        return _encoded(tokenizer, prompt)


def prompt_format(
    resolved: ResolvedConfig, tokenizer: Any, record: Any
) -> tuple[PromptFormat, list[str]]:
    """The run's prompt layout, and notes where it is a guess or may surprise."""
    stats = record.get("stats") if isinstance(record, Mapping) else None
    stats = stats if isinstance(stats, Mapping) else {}
    kind = _data_kind(resolved.field_mapping, stats)
    if kind is None:
        guess = "messages" if getattr(tokenizer, "chat_template", None) else "instruction"
        layout = PromptFormat(guess, resolved.prompt_template)
        return layout, [
            "the run does not record its data's kind (field_mapping unset, trained before "
            f"expert-cli recorded it): prompts are laid out with {layout.described}"
        ]
    if kind == "instruction" and resolved.prompt_template == CHAT_TEMPLATE:
        kind = "messages"  # trained as conversations of the tokenizer's chat template
    closing = unwritten_header(tokenizer, resolved.response_template) if kind == "messages" else ""
    if kind == "messages" and (opening := turn_layout(tokenizer).opening):
        return PromptFormat(kind, opening=opening, closing=closing), [
            f"prompts end before the chat template's {opening.strip()}, as the training "
            "conversations' answers followed the turn's header (the template writes it before "
            "no answer)"
        ]
    if kind == "messages":
        return PromptFormat(kind, closing=closing), []
    if kind != "text":
        return PromptFormat(kind, resolved.prompt_template), []
    if resolved.response_template:
        return PromptFormat("template", resolved.response_template), [
            "prompts are followed by training.dataset.response_template as written; give "
            "the whole layout of the data's prompts where it holds more"
        ]
    counts = _style_counts(stats)
    if not counts:
        return PromptFormat("chatml"), [
            "the run does not record how its text data was laid out (trained before expert-cli "
            "recorded it): prompts are wrapped as a ChatML user turn (give the whole layout in "
            "the prompt to choose)"
        ]
    style = max(TEXT_STYLES, key=lambda s: counts.get(s, 0))
    notes = []
    if style == "none":
        notes.append(
            "the run trained whole texts (its text data has no assistant marker): each prompt "
            "is continued as written"
        )
    return PromptFormat(style), notes


def _data_kind(mapping: dict[str, str] | None, stats: Mapping[str, Any]) -> str | None:
    """The kind the manifest's field_mapping says (as the build read it), else the one the
    build recorded detecting."""
    if mapping is not None:
        return mapping_kind(mapping)
    fields = stats.get("fields")
    kind = fields.get("kind") if isinstance(fields, Mapping) else None
    return kind if kind in ("text", "messages", "instruction") else None


def _style_counts(stats: Mapping[str, Any]) -> dict[str, int]:
    train = stats.get("train")
    styles = train.get("styles") if isinstance(train, Mapping) else None
    if not isinstance(styles, Mapping):
        return {}
    return {s: n for s, n in styles.items() if s in TEXT_STYLES and isinstance(n, int) and n > 0}


def _chat(tokenizer: Any, text: str, system: str | None, opening: str, closing: str) -> list[int]:
    """The chat template's prompt of one user turn; where the template writes no generation
    prompt, ended with `closing`, what the answers were trained after."""
    turns = [{"role": "system", "content": system}] if system else []
    turns.append({"role": "user", "content": text})
    if not getattr(tokenizer, "chat_template", None):  # its file gone from the run folder
        raise UserError(
            "the run's tokenizer files beside the adapter hold no chat template (its "
            "chat_template.jinja is missing?); copy it back from the run's base, or train again"
        )
    try:
        with within(TEMPLATE_SECONDS):  # TimedOut, no Exception: the CLI says a template loops
            rendered = tokenizer.apply_chat_template(
                turns, add_generation_prompt=True, tokenize=False
            )
    except Exception as exc:  # noqa: BLE001 - the run folder's template; its text unquoted
        which = "a system turn and a user turn" if system else "one user turn"
        raise UserError(
            "the run's chat template (its tokenizer files beside the adapter) refuses a "
            f"conversation of {which} with a generation prompt ({type(exc).__name__})"
            "; fix chat_template.jinja (or the chat_template of tokenizer_config.json) there"
        ) from None
    if isinstance(tokenizer, ToolsGiven):
        with within(TEMPLATE_SECONDS):
            plain = tokenizer.plain.apply_chat_template(
                turns, add_generation_prompt=True, tokenize=False
            )
        if rendered == plain:
            raise UserError(
                "--tools: the run's chat template does not write tool definitions (it renders "
                "the prompt the same without them); put them in --system as text"
            )
    if opening and rendered.endswith(opening):
        rendered = rendered[: -len(opening)]
    if not (rendered + closing).strip():  # generate would run on no tokens at all
        raise UserError(
            "the run's chat template (its tokenizer files beside the adapter) renders nothing "
            "for a conversation of one user turn with a generation prompt; fix "
            "chat_template.jinja (or the chat_template of tokenizer_config.json) there"
        )
    return tokenizer(rendered + closing, add_special_tokens=False, verbose=False)["input_ids"]


def _encoded(tokenizer: Any, prompt: str) -> list[int]:
    """The ids as the build tokenized examples (with the tokenizer's special tokens), less
    any the tokenizer puts after the text: an EOS there would end the prompt's turn."""
    ids = tokenizer(prompt, verbose=False)["input_ids"]
    plain = tokenizer(prompt, add_special_tokens=False, verbose=False)["input_ids"]
    for start in range(len(ids) - len(plain) + 1):
        if ids[start : start + len(plain)] == plain:
            return ids[: start + len(plain)]
    return ids
