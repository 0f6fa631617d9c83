"""Assistant turns found by the chat template itself (data/turns.py): multi-turn conversations
under templates without ChatML markers train their answers only, and a template that writes
an earlier answer otherwise than the last one trains the answers as a model writes them."""

from __future__ import annotations

import copy

import pytest

from expert_cli.data.build import masking_words
from expert_cli.data.formatting import IGNORE, KEPT, Formatter, check_chat_template
from expert_cli.data.spans import assistant_spans
from expert_cli.data.turns import TurnLayout, conversation_spans, template_turns, turn_layout
from expert_cli.errors import UserError

GEMMA = (
    "{%- for m in messages %}{{ '<start_of_turn>' + ('model' if m.role == 'assistant' else "
    "m.role) + '\\n' + m.content + '<end_of_turn>\\n' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<start_of_turn>model\\n' }}{%- endif %}"
)
MISTRAL = (
    "{{ '<s>' }}{%- for m in messages %}{%- if m.role == 'user' %}"
    "{{ '[INST] ' + m.content + ' [/INST]' }}{%- else %}{{ m.content + '</s>' }}{%- endif %}"
    "{%- endfor %}"
)
# Qwen3's rule: answers after the last user turn get an (empty) reasoning block, earlier ones not
QWEN3 = (
    "{%- set ns = namespace(last=-1) %}{%- for m in messages %}{%- if m.role == 'user' %}"
    "{%- set ns.last = loop.index0 %}{%- endif %}{%- endfor %}"
    "{%- for m in messages %}{{ '<|im_start|>' + m.role + '\\n' }}"
    "{%- if m.role == 'assistant' and loop.index0 > ns.last %}"
    "{{ '<think>\\n\\n</think>\\n\\n' }}{%- endif %}{{ m.content + '<|im_end|>\\n' }}"
    "{%- endfor %}{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- endif %}"
)
PLAIN = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
TALK = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "first question"},
    {"role": "assistant", "content": "first answer"},
    {"role": "user", "content": "second question"},
    {"role": "assistant", "content": "second answer"},
]


def _tok(tiny_tokenizer, template: str | None):
    tok = copy.deepcopy(tiny_tokenizer)
    if template is not None:
        tok.chat_template = template
    return tok


def _trained(tok, conversations: list, response_template: str | None = None) -> list[dict]:
    fmt = Formatter(
        tokenizer=tok,
        kind="messages",
        max_seq_length=512,
        overlong="truncate",
        response_template=response_template,
    )
    rows = fmt({"messages": conversations}).to_pylist()
    for row in rows:
        row["trained_text"] = tok.decode(
            [i for i, lab in zip(row["input_ids"], row["labels"], strict=True) if lab != IGNORE]
        )
    return rows


@pytest.mark.parametrize(
    ("template", "header", "trained"),
    [
        (GEMMA, "<start_of_turn>model\n", "first answer<end_of_turn>second answer<end_of_turn>"),
        (MISTRAL, " [/INST]", "first answer</s>second answer</s>"),
    ],
)
def test_templates_without_chatml_markers_train_every_answer_and_no_question(
    tiny_tokenizer, template: str, header: str, trained: str
) -> None:
    """Gemma's and Mistral's turns needed a response_template, which trained from the first
    answer to the end: the second question too."""
    tok = _tok(tiny_tokenizer, template)
    check_chat_template(tok, None)  # it said: set response_template
    talk = TALK[1:]  # Gemma has no system role
    for response_template in (None, header):  # one given as before is checked, not needed
        (row,) = _trained(tok, [talk], response_template)
        assert row["status"] == KEPT and row["style"] == "turns"
        squeezed = row["trained_text"].replace(" ", "")
        assert squeezed == (trained + "<|endoftext|>").replace(" ", "")


def test_a_template_that_writes_earlier_answers_otherwise_trains_them_as_context(
    tiny_tokenizer,
) -> None:
    """Qwen3 leaves the reasoning block out of answers before the last user turn: the first
    answer was trained without the `<think>` block the model writes at inference, the same
    prompt with two targets."""
    tok = _tok(tiny_tokenizer, QWEN3)
    assert turn_layout(tok) == TurnLayout(follows=True, consistent=False)
    rows = _trained(tok, [TALK, TALK[:3]])
    assert [r["style"] for r in rows] == ["last_turns", "chatml"]
    squeezed = rows[0]["trained_text"].replace(" ", "")
    assert squeezed == "<think>\n\n</think>\n\nsecondanswer<|im_end|><|endoftext|>"
    assert "first answer" not in rows[0]["trained_text"]
    # one answer: the ChatML rule's spans are the template's (not asked twice)
    assert rows[1]["trained_text"].replace(" ", "").startswith("<think>")
    words = masking_words({"styles": {"chatml": 1, "last_turns": 1}})
    assert words is not None and "earlier answers left as context 1 (the chat" in words


def test_templates_that_write_every_turn_alike_keep_the_marker_rules(tiny_tokenizer) -> None:
    tok = _tok(tiny_tokenizer, None)  # the tiny tokenizer's ChatML template
    assert turn_layout(tok) == TurnLayout(follows=True, consistent=True)
    text = tok.apply_chat_template(TALK, tokenize=False)
    assert conversation_spans(tok, TALK, text, None, turn_layout(tok)) == assistant_spans(
        text, None
    )
    found = template_turns(tok, TALK, text)
    assert found is not None and found[1] == 0
    assert [text[a:b] for a, b in found[0]] == [
        "first answer<|im_end|>",
        "second answer<|im_end|>",
    ]


def test_a_template_with_no_generation_prompt_and_a_header_in_the_turn(tiny_tokenizer) -> None:
    """`assistant: ` written inside the turn with no generation prompt would be trained as the
    answer's start: such a template still needs a response_template."""
    tok = _tok(tiny_tokenizer, PLAIN)
    assert turn_layout(tok) == TurnLayout(follows=False, consistent=True)
    with pytest.raises(UserError, match="renders no assistant marker"):
        check_chat_template(tok, None)
