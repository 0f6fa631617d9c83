"""From examples to `input_ids` + `labels`, with the loss on completions only.

Each example is rendered to one string plus the character spans that are trained on, tokenized
once with the fast tokenizer, and the spans are mapped to token indices through the tokenizer's
offsets (`Encoding.char_to_token` / `token_to_chars`), so masking is exact and costs no second
tokenization. Rules (docs/data.md has examples):

- `text` with ChatML: every assistant turn is trained from after `<|im_start|>assistant\\n`
  through its `<|im_end|>`; system and user turns are masked.
- `text` with `<|assistant|>` markers: trained from after `<|assistant|>` (and one newline)
  through the turn's `<|end|>` (or up to the next `<|user|>`/`<|system|>`, or the end); a
  text whose user turn ends with `</s>` before `<|assistant|>` and that holds no `<|end|>`
  (Zephyr's layout) is `marker_eos`.
- `response_template` set: trained from after its first occurrence to the end of the text; an
  example without it is dropped and counted (`dropped_no_marker`).
- `text` with no marker and no `response_template`: the whole text is trained, counted as
  `no_marker` in the stats.
- instruction/input/response: rendered with `prompt_template`; the response is trained.
- `messages`: rendered with the tokenizer's chat template; each assistant turn as the
  template writes it (data/turns.py), else the `text` rules apply. A
  conversation the template refuses (its `raise_exception`, e.g. roles that do not alternate or
  a role it does not know) is dropped and counted (`dropped_template`), with the error's kind
  and the roles of the first one refused: never the template's message, which may quote it.

Every example ends with EOS: the tokenizer's EOS token is appended unless the text already
ends with it, trailing whitespace aside (Qwen instruct tokenizers use `<|im_end|>` as EOS, which
ChatML turns already end with), and trained when the last trained span reaches the text's end
(so an EOS a tokenizer's post-processor adds is trained too; a BOS or EOS it adds to a text that
already holds one is dropped). A `messages` conversation that renders no assistant turn is
dropped with the template's refusals (`dropped_template`). An example over `max_seq_length`
is cut to its first `max_seq_length` tokens (then it has no EOS: the text did not end there),
dropped, or kept whole to be cut into pieces before packing (data/pieces.py), as `overlong`
says; one whose trained tokens were all cut away is dropped too.

Each row's rule (`chatml`, `marker`, `marker_eos`, `template`, `none`; `empty`, `missing`,
`refused` for dropped ones) is kept in its `style` column, and the build counts the kept rows' rules
(`styles` in the stats): `generate` presents a prompt the way most of the data was laid out.

An example's first token is never trained (label -100): the model shifts labels by one, so
nothing inside the example predicts it, and in a packed row it would otherwise be predicted
from the previous example's last token.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from expert_cli.data.conversations import conversation, render_conversation, roles_of
from expert_cli.data.instruction import (
    CHAT_TEMPLATE,
    COMPLETION_PREFIX,
    as_turns,
    chatml_note,
    check_prompt_template,
    render_instruction,
)
from expert_cli.data.pieces import Joined, special_ends, tokenize_blocks
from expert_cli.data.spans import (
    CHATML_ASSISTANT,
    MARKER_ASSISTANT,
    Span,
    assistant_spans,
    has_content,
    runs_to_end,
    span_mask,
)
from expert_cli.data.tools import parsed_tools, with_tools
from expert_cli.data.turns import TurnLayout, conversation_spans, template_notes, turn_layout
from expert_cli.errors import UserError

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

IGNORE = -100
# status codes of the `status` column
(
    KEPT,
    TRUNCATED,
    DROPPED_OVERLONG,
    DROPPED_NO_COMPLETION,
    DROPPED_NO_MARKER,
    DROPPED_TEMPLATE,
    DROPPED_ANSWER_CUT,  # truncated to nothing trained: the answer lay past max_seq_length
    SPLIT,  # over max_seq_length with `overlong: split`: kept whole, cut into pieces later
) = range(8)

KEPT_CODES = (KEPT, TRUNCATED, SPLIT)  # trained, whole or in part


def unanswered(style: str, stored: list[Any] | str) -> str | None:
    """Why a rendered conversation is not trained: its chat template rendered no assistant
    turn (a ShareGPT "gpt" role, Gemma's "model", only system and user turns), so no part
    of it is an answer (the whole text, prompts too, was trained); None when it has one."""
    if style == "unweighed":
        return 'an answer of "weight": 0 that its chat template cannot leave untrained'
    return f"no assistant turn, roles {roles_of(stored)}" if style == "none" else None


def unwritten_header(tokenizer: PreTrainedTokenizerFast, response_template: str | None) -> str:
    """What a prompt must end with where the chat template writes no generation prompt (its
    add_generation_prompt renders nothing): the response_template, else the assistant marker
    the build found the answers after (ChatML's, `<|assistant|>`); "" where it writes one."""
    turn = [{"role": "user", "content": "q"}]
    try:
        asked = tokenizer.apply_chat_template(turn, tokenize=False, add_generation_prompt=True)
        bare = tokenizer.apply_chat_template(turn, tokenize=False)
    except Exception:  # noqa: BLE001 - a template that cannot render: said where it is used
        return ""
    if asked != bare:
        return ""
    if response_template:
        return response_template
    if "<|im_start|>" in str(bare):
        return CHATML_ASSISTANT + "\n"
    return MARKER_ASSISTANT + "\n" if "<|user|>" in str(bare) else ""


def instruction_checked(
    tokenizer: PreTrainedTokenizerFast, template: str, response_template: str | None
) -> list[str]:
    """Fail early where instruction data's `prompt_template` cannot lay it out (chat_template:
    the tokenizer's chat template, checked as a conversation's is, `response_template`
    finding its answers where the template's own turns do not); notes on the layout."""
    if template == CHAT_TEMPLATE:
        return check_chat_template(tokenizer, response_template, "base_models[0].prompt_template")
    check_prompt_template(template)
    unread = TEMPLATE_UNREAD if response_template else None
    return [n for n in (chatml_note(tokenizer, template), unread) if n]


def check_chat_template(
    tokenizer: PreTrainedTokenizerFast,
    response_template: str | None,
    field: str = "training.dataset.field_mapping.messages",
) -> list[str]:
    """Fail early when `messages` data cannot be masked with this tokenizer's chat template;
    notes on what it does to answers (data/turns.py's `template_notes`)."""
    if not tokenizer.chat_template:
        raise UserError(
            f"{field}: the tokenizer has no chat template; set base_models[0].chat_template "
            '("chatml", or a Jinja file), or use `text` data'
        )
    sample = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    try:
        text = tokenizer.apply_chat_template(sample, tokenize=False)
    except Exception as exc:  # noqa: BLE001 - a template that does not parse or run is the user's
        # its error may quote the template (raise_exception's text): only its kind is said
        raise UserError(
            f"{field}: the tokenizer's chat template cannot "
            f"render a conversation ({type(exc).__name__}); fix the template it was given: "
            "the file of base_models[0].chat_template where the manifest names one, else the "
            "model's chat_template.jinja or the chat_template in tokenizer_config.json"
        ) from None
    style, layout = assistant_spans(text, response_template)[1], turn_layout(tokenizer)
    if style != "missing" and layout.follows:  # the template's own turns
        return layout_notes(tokenizer, layout, response_template)
    if style == "missing":
        raise UserError(
            "training.dataset.response_template: the chat template does not write it (a "
            "user/assistant exchange rendered holds no such text), so every conversation "
            "would be dropped; set it to the text the template writes before replies"
        )
    if style == "none":
        raise UserError(
            "training.dataset.response_template: the chat template renders no "
            "assistant marker expert-cli knows (<|im_start|>assistant, "
            "<|assistant|>); set response_template to the text before replies"
        )
    return layout_notes(tokenizer, layout, response_template)


def layout_notes(
    tokenizer: PreTrainedTokenizerFast, layout: TurnLayout, response_template: str | None
) -> list[str]:
    """template_notes, and one where the template writes no generation prompt."""
    notes = template_notes(layout)
    if header := unwritten_header(tokenizer, response_template):
        notes.append(
            "the chat template writes no generation prompt (add_generation_prompt adds "
            f"nothing): generate ends each prompt with {header.strip()!r}, which the answers "
            "were trained after; a runtime that prompts by the template (vLLM, Ollama) asks "
            "without it"
        )
    return notes


# A text longer than this many characters per token of max_seq_length is tokenized from its
# start (no tokenizer here averages a quarter of it), kept when that start runs CUT_MARGIN tokens
# past the limit, so the cut changes no token an example keeps.
CUT_CHARS_PER_TOKEN = 32
CUT_MARGIN = 64
# instruction data: the response field is what is trained, prompt_template lays out the rest
TEMPLATE_UNREAD = (
    "training.dataset.response_template: not read with instruction data (each row's response "
    "field is what is trained; prompt_template lays out the prompt)"
)


@dataclass
class Formatter:
    """A picklable batched function: rows of roles (a dict of columns) -> token columns."""

    tokenizer: PreTrainedTokenizerFast
    kind: str  # "text" | "messages" | "instruction"
    max_seq_length: int
    overlong: str  # "truncate" | "drop" | "split"
    prompt_template: str = "chatml"
    response_template: str | None = None
    layout: TurnLayout | None = None  # how the chat template writes answers, asked once

    @property
    def renders(self) -> str:
        """The kind the rows are rendered as: instruction data as conversations where its
        prompt_template is the tokenizer's chat template."""
        chat = self.kind == "instruction" and self.prompt_template == CHAT_TEMPLATE
        return "messages" if chat else self.kind

    def __call__(self, batch: dict[str, list[Any]]) -> pa.Table:
        texts, spans, styles, refused = self.render(batch)
        encodings, spans = self.tokenize(texts, spans)
        table = self.encode(texts, encodings, spans, styles)
        return table.append_column("refused", pa.array(refused, pa.string()))

    def tokenize(
        self, texts: list[str], spans: list[list[Span]]
    ) -> tuple[list[Any], list[list[Span]]]:
        """The encodings, and the spans clipped to what was tokenized. A text of more than
        CUT_CHARS_PER_TOKEN characters per token of `max_seq_length` is tokenized from its
        start only (a 40 MB example took 10 GB and two minutes to keep 512 tokens): when that
        start gives CUT_MARGIN tokens past the limit, the example's fate (truncated or
        dropped) and its first tokens are those of the whole text; otherwise the whole text
        is tokenized. With `overlong: split` every token is kept: such a text is tokenized in
        blocks instead (pieces.tokenize_blocks), its spans marked there."""
        backend = self.tokenizer.backend_tokenizer
        special = self.renders != "messages"  # a chat template writes its own
        cut = self.max_seq_length * CUT_CHARS_PER_TOKEN
        if self.overlong == "split":  # every token is kept: long texts in blocks (pieces.py)
            ends = special_ends(backend) if special else ([], [])
            encodings = backend.encode_batch(
                [t if len(t) <= cut else "" for t in texts], add_special_tokens=special
            )
            for i, text in enumerate(texts):
                if len(text) > cut:
                    encodings[i] = tokenize_blocks(backend, text, spans[i], cut, ends)
            return encodings, spans
        heads = [text[:cut] for text in texts]
        encodings = backend.encode_batch(heads, add_special_tokens=special)
        long = [i for i, text in enumerate(texts) if len(text) > cut]
        whole = [i for i in long if len(encodings[i].ids) < self.max_seq_length + CUT_MARGIN]
        if whole:
            again = backend.encode_batch([texts[i] for i in whole], add_special_tokens=special)
            for i, enc in zip(whole, again, strict=True):
                encodings[i] = enc
        spans = list(spans)
        for i in set(long) - set(whole):  # clipped: no character past the cut is looked up
            spans[i] = [(min(a, cut), min(b, cut)) for a, b in spans[i]]
        return encodings, spans

    def render(
        self, batch: dict[str, list[Any]]
    ) -> tuple[list[str], list[list[Span]], list[str], list[str | None]]:
        """Texts, trained character spans, the masking rule used for each row, and why the chat
        template refused a row (None for every row it rendered)."""
        n = len(next(iter(batch.values()), []))
        refused: list[str | None] = [None] * n
        if self.renders != self.kind:  # instruction rows, as conversations
            batch = {"messages": as_turns(batch, n)}
        if self.renders == "instruction":
            texts, spans, styles = [], [], []
            n = len(batch["instruction"])
            inputs = batch.get("input") or [None] * n
            systems = batch.get("system") or [None] * n
            lead = COMPLETION_PREFIX.get(self.prompt_template, "")
            for ins, inp, sys_, resp in zip(
                batch["instruction"], inputs, systems, batch["response"], strict=True
            ):
                prompt, suffix = render_instruction(self.prompt_template, str(ins), inp, sys_)
                texts.append(prompt + lead + str(resp) + suffix)
                spans.append([(len(prompt), len(texts[-1]))])
                styles.append("template" if str(resp).strip() else "empty")
            return texts, spans, styles, refused
        if self.renders == "messages":
            conversations = [conversation(m) for m in batch["messages"]]
            tools = batch.get("tools") or [None] * n  # each with its tool definitions, if any
            toks = [with_tools(self.tokenizer, parsed_tools(t)[0]) for t in tools]
            rendered = [render_conversation(t, m) for t, m in zip(toks, conversations, strict=True)]
            texts = [text for text, _ in rendered]
            refused = [why for _, why in rendered]
            if self.layout is None:
                self.layout = turn_layout(self.tokenizer)
            # what is tokenized of a text: all of it to be split
            limit = None if self.overlong == "split" else self.max_seq_length * CUT_CHARS_PER_TOKEN
            found = [
                conversation_spans(tok, m, t, self.response_template, self.layout, limit)
                if why is None
                else ([], "refused")
                for tok, m, t, why in zip(toks, conversations, texts, refused, strict=True)
            ]
            for i, (_, style) in enumerate(found):
                refused[i] = refused[i] or unanswered(style, conversations[i])
        else:
            texts = [str(t) for t in batch["text"]]
            found = [assistant_spans(t, self.response_template) for t in texts]
        ends = self.layout.ends if self.layout is not None else ()  # Gemma's <end_of_turn>
        styles = [
            "refused"
            if why is not None
            else style
            if has_content(t, row_spans, self.tokenizer.eos_token, ends)
            else "empty"
            for t, (row_spans, style), why in zip(texts, found, refused, strict=True)
        ]
        return texts, [f[0] for f in found], styles, refused

    def encode(
        self, texts: list[str], encodings: list[Any], spans: list[list[Span]], styles: list[str]
    ) -> pa.Table:
        """Labels from spans, EOS, overlong handling; one Arrow table for the batch."""

        eos, eos_text = self.tokenizer.eos_token_id, self.tokenizer.eos_token
        ids_out, labels_out, status, trained, no_marker = [], [], [], [], []
        for text, enc, row_spans, style in zip(texts, encodings, spans, styles, strict=True):
            if isinstance(enc, Joined):  # tokenized in blocks, its spans already marked
                ids, mask = enc.ids, enc.mask
            else:
                ids = np.asarray(enc.ids, dtype=np.int32)
                mask = span_mask(text, enc, len(ids), row_spans)
            ids, mask = _once(ids, mask, enc)
            ends = runs_to_end(text, row_spans, eos_text)
            if len(ids) and ids[-1] == eos:  # the text's own, or one its tokenizer adds
                mask[-1] = mask[-1] or ends
            elif not text.rstrip().endswith(eos_text):
                ids = np.append(ids, np.int32(eos))
                mask = np.append(mask, ends)
            elif len(at := np.flatnonzero(ids == eos)):  # the text's own, whitespace after it
                mask[at[-1]] = mask[at[-1]] or ends
            mask[:1] = False  # an example's first token is never a prediction target
            code = KEPT
            if style == "refused":
                code = DROPPED_TEMPLATE
            elif style == "missing":
                code = DROPPED_NO_MARKER
            elif style == "empty":  # an empty answer would train only its end-of-turn tokens
                code = DROPPED_NO_COMPLETION
            elif len(ids) > self.max_seq_length and self.overlong == "split":
                code = SPLIT
            elif len(ids) > self.max_seq_length:
                code = TRUNCATED if self.overlong == "truncate" else DROPPED_OVERLONG
                ids, mask = ids[: self.max_seq_length], mask[: self.max_seq_length]
            if code in KEPT_CODES and not mask.any():  # an answer with content, cut away
                code = DROPPED_ANSWER_CUT if code == TRUNCATED else DROPPED_NO_COMPLETION
            if code not in KEPT_CODES:
                ids, mask = ids[:0], mask[:0]
            ids_out.append(ids)
            labels_out.append(np.where(mask, ids, np.int32(IGNORE)).astype(np.int32))
            status.append(code)
            trained.append(int(mask.sum()))
            no_marker.append(style == "none")
        return pa.table(
            {
                "input_ids": _list_array(ids_out),
                "labels": _list_array(labels_out),
                "status": pa.array(status, pa.int8()),
                "trained": pa.array(trained, pa.int32()),
                "no_marker": pa.array(no_marker, pa.bool_()),
                "style": pa.array(styles, pa.string()),
            }
        )


def _once(ids: Any, mask: Any, enc: Any) -> tuple[Any, Any]:
    """The ids without a BOS or EOS the tokenizer adds to a text that already holds it
    (`text` rendered by a chat template that writes `{{ bos_token }}`, under a tokenizer
    whose post-processor adds `<s>` too): the model sees one, as from `messages`. The
    encoding's special-token mask (a list built on each access) is read only where the ids
    repeat at an end; the result is a view of the ids."""
    lo, hi = 0, len(ids)
    if hi > 1 and ids[0] == ids[1] and enc.special_tokens_mask[0]:
        lo = 1
    if hi - lo > 1 and ids[-1] == ids[-2] and enc.special_tokens_mask[-1]:
        hi -= 1
    return ids[lo:hi], mask[lo:hi]


def _list_array(rows: list[Any]) -> pa.Array:
    """A list<int32> Arrow array from numpy rows, without a Python loop per token."""

    lengths = np.fromiter((len(r) for r in rows), dtype=np.int32, count=len(rows))
    offsets = np.zeros(len(rows) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    values = np.concatenate(rows) if rows else np.zeros(0, dtype=np.int32)
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values.astype(np.int32)))
