"""Assistant turns found by the chat template itself (data/turns.py): multi-turn conversations
under templates without ChatML markers train their answers only, and a template that writes
an earlier answer otherwise than the last one trains the answers as a model writes them."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from conftest import R1_TEMPLATE
from train_helpers import run_here

from expert_cli.data.formatting import (
    DROPPED_ANSWER_CUT,
    DROPPED_NO_COMPLETION,
    IGNORE,
    KEPT,
    Formatter,
    check_chat_template,
)
from expert_cli.data.spans import assistant_spans
from expert_cli.data.stats_words import LAST_TURNS_WHY, masking_words
from expert_cli.data.turns import (
    MAX_ASKED,
    TurnLayout,
    conversation_spans,
    template_turns,
    turn_layout,
)
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
# Qwen3's rules: answers after the last user turn get a reasoning block when they are the last
# message or have reasoning; earlier answers lose theirs, also one written into their text
QWEN3 = (
    "{%- set ns = namespace(last=-1) %}{%- for m in messages %}{%- if m.role == 'user' %}"
    "{%- set ns.last = loop.index0 %}{%- endif %}{%- endfor %}"
    "{%- for m in messages %}{{ '<|im_start|>' + m.role + '\\n' }}"
    "{%- if m.role == 'assistant' and loop.index0 > ns.last and (loop.last or "
    "m.reasoning_content) %}{{ '<think>\\n' + (m.reasoning_content or '') + '\\n</think>\\n\\n' }}"
    "{%- endif %}{%- if m.role == 'assistant' and loop.index0 < ns.last %}"
    "{{ m.content.split('</think>')[-1].lstrip('\\n') }}{%- else %}{{ m.content }}{%- endif %}"
    "{{ '<|im_end|>\\n' }}"
    "{%- endfor %}{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- endif %}"
)
# Phi-3's: an EOS after the whole conversation
PHI3 = (
    "{%- for m in messages %}{{ '<|' + m.role + '|>\\n' + m.content + '<|end|>\\n' }}"
    "{%- endfor %}{%- if add_generation_prompt %}{{ '<|assistant|>\\n' }}"
    "{%- else %}{{ eos_token }}{%- endif %}"
)
# Mistral v0.3's: the system text goes into the last user turn only
MISTRAL_V3 = (
    "{%- set system = messages[0].content if messages[0].role == 'system' else none %}"
    "{%- set talk = messages[1:] if system else messages %}{%- set ns = namespace(last=-1) %}"
    "{%- for m in talk %}{%- if m.role == 'user' %}{%- set ns.last = loop.index0 %}{%- endif %}"
    "{%- endfor %}{{ '<s>' }}{%- for m in talk %}{%- if m.role == 'user' %}{{ '[INST] ' }}"
    "{%- if system and loop.index0 == ns.last %}{{ system + '\\n\\n' }}{%- endif %}"
    "{{ m.content + ' [/INST]' }}{%- else %}{{ m.content + '</s>' }}{%- endif %}{%- endfor %}"
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


def test_a_template_that_drops_earlier_reasoning_trains_those_answers_as_context(
    tiny_tokenizer,
) -> None:
    """Qwen3 leaves the reasoning out of answers before the last user turn: such an answer
    was trained without the reasoning the model writes at inference. Answers that differ only
    by the empty reasoning block written into a last turn are trained as the text holds them,
    a tool call before the tool's reply too."""
    tok = _tok(tiny_tokenizer, QWEN3)
    tok.eos_token = "<|im_end|>"  # as Qwen3's instruct tokenizer says (its turns end with it)
    assert turn_layout(tok) == TurnLayout(
        follows=True, consistent=False, end="<|im_end|>", plain=True
    )
    reasoned = [dict(m) for m in TALK]
    reasoned[2]["reasoning_content"] = "thought one"
    tools = [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": "call weather()"},
        {"role": "tool", "content": "sunny"},
        {"role": "assistant", "content": "It is sunny."},
    ]
    keyed = [dict(m) for m in TALK]
    keyed[2]["reasoning_content"] = ""  # asked turn by turn: the empty block is no difference
    rows = _trained(tok, [reasoned, TALK, tools, TALK[:3], keyed])
    # answers of role and content alone are written alike (the ChatML rule reads them, not
    # asked again: a render of Qwen3's template costs about 0.25 ms)
    assert [r["style"] for r in rows] == ["last_turns", "chatml", "chatml", "chatml", "turns"]
    assert rows[4]["trained_text"] == rows[1]["trained_text"]
    squeezed = [r["trained_text"].replace(" ", "") for r in rows]
    assert squeezed[0] == "<think>\n\n</think>\n\nsecondanswer<|im_end|>"
    assert "thought" not in rows[0]["trained_text"]
    assert squeezed[1].startswith("firstanswer<|im_end|>")  # as the text holds it
    assert squeezed[1].count("<|im_end|>") == 2  # each answer through its end of turn
    assert squeezed[2].startswith("callweather()<|im_end|>") and "sunny." in squeezed[2]
    assert squeezed[3].startswith("<think>")  # one answer, the last message
    words = masking_words({"styles": {"chatml": 1, "last_turns": 1}})
    assert words is not None and "earlier answers left as context 1 (the chat" in words


def test_a_template_that_ends_a_conversation_with_eos_trains_every_answer(tiny_tokenizer) -> None:
    """Phi-3 writes EOS after a whole conversation: an earlier answer rendered last ends with
    it, where the conversation's text goes on."""
    tok = _tok(tiny_tokenizer, PHI3)
    assert turn_layout(tok).consistent
    (row,) = _trained(tok, [TALK[1:4]])  # user, assistant, user: no last answer
    assert row["status"] == KEPT and row["trained_text"].startswith("first answer<|end|>")


def test_an_empty_answer_under_a_template_of_its_own_end_marker_is_dropped(
    tiny_tokenizer,
) -> None:
    """Gemma ends a turn with `<end_of_turn>`, not its EOS: an empty answer's span held only
    that marker, counted as content, and the row trained to say nothing."""
    tok = _tok(tiny_tokenizer, GEMMA)
    assert turn_layout(tok).end == "<end_of_turn>"
    empty = [{"role": "user", "content": "q"}, {"role": "assistant", "content": ""}]
    assert [r["status"] for r in _trained(tok, [empty])] == [DROPPED_NO_COMPLETION]


def test_templates_that_write_every_turn_alike_keep_the_marker_rules(tiny_tokenizer) -> None:
    tok = _tok(tiny_tokenizer, None)  # the tiny tokenizer's ChatML template
    layout = turn_layout(tok)
    assert layout == TurnLayout(follows=True, consistent=True, end="<|im_end|>", plain=True)
    text = tok.apply_chat_template(TALK, tokenize=False)
    assert conversation_spans(tok, TALK, text, None, layout) == assistant_spans(text, None)
    found = template_turns(tok, TALK, text)
    assert found is not None and found[1] == 0
    assert [text[a:b] for a, b in found[0]] == [
        "first answer<|im_end|>",
        "second answer<|im_end|>",
    ]
    assert template_turns(tok, TALK, text, limit=10) == ([], 0)  # past what is tokenized


def test_a_template_with_no_generation_prompt_and_a_header_in_the_turn(tiny_tokenizer) -> None:
    """`assistant: ` written inside the turn with no generation prompt would be trained as the
    answer's start: such a template still needs a response_template."""
    tok = _tok(tiny_tokenizer, PLAIN)
    assert not turn_layout(tok).follows
    with pytest.raises(UserError, match="renders no assistant marker"):
        check_chat_template(tok, None)


def test_what_the_second_review_found(tiny_tokenizer) -> None:
    """Reasoning written into an earlier answer's text is no plain answer (Qwen3 leaves it out
    of the conversation); Mistral v0.3 writes the system text into the last user turn only,
    so only the last answer follows its prompt (every such conversation was dropped as having
    no assistant turn); Phi-3's EOS after a conversation is no end of an answer (an empty
    answer trained `<|end|>`); answers past the tokenized text are dropped as cut away."""
    qwen = _tok(tiny_tokenizer, QWEN3)
    qwen.eos_token = "<|im_end|>"
    inline = [dict(m) for m in TALK]
    inline[2]["content"] = "<think>\nthought\n</think>\n\nfirst answer"
    (row,) = _trained(qwen, [inline])
    assert row["style"] == "last_turns" and "first answer" not in row["trained_text"]

    mistral = _tok(tiny_tokenizer, MISTRAL_V3)
    (row,) = _trained(mistral, [TALK])
    assert row["status"] == KEPT and row["style"] == "last_turns"
    assert row["trained_text"].replace(" ", "") == "secondanswer</s><|endoftext|>"

    phi = _tok(tiny_tokenizer, PHI3)
    assert turn_layout(phi).end == "<|end|>"
    empty = [{"role": "user", "content": "q"}, {"role": "assistant", "content": ""}]
    assert [r["status"] for r in _trained(phi, [empty])] == [DROPPED_NO_COMPLETION]

    gemma = _tok(tiny_tokenizer, GEMMA)
    long_question = [{"role": "user", "content": "word " * 400}, TALK[2]]
    fmt = Formatter(tokenizer=gemma, kind="messages", max_seq_length=16, overlong="truncate")
    (row,) = fmt({"messages": [long_question]}).to_pylist()
    assert row["status"] == DROPPED_ANSWER_CUT and row["style"] == "turns"


# QwQ's: ChatML whose generation prompt opens a reasoning block
QWQ = (
    "{%- for m in messages %}{%- if m.role == 'assistant' %}"
    "{%- set content = m.content.split('</think>')[-1].lstrip('\\n') %}{%- else %}"
    "{%- set content = m.content %}{%- endif %}"
    "{{ '<|im_start|>' + m.role + '\\n' + content + '<|im_end|>\\n' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n<think>\\n' }}{%- endif %}"
)


@pytest.mark.parametrize(
    ("template", "style", "trained"),
    [
        (R1_TEMPLATE, "turns", "first answer<|endoftext|>second answer<|endoftext|>"),
        # its answers as the ChatML marker rules read them: the template is not asked
        (QWQ, "chatml", "first answer<|im_end|>second answer<|im_end|><|endoftext|>"),
    ],
)
def test_a_generation_prompt_that_opens_reasoning_reads_every_answer(
    tiny_tokenizer, template: str, style: str, trained: str
) -> None:
    """R1 distills' generation prompt ends with `<think>\\n`, which no answer of a rendered
    conversation follows: no turn was found, and the marker rules trained R1's whole text,
    questions included (or check asked for a response_template, which trained from the first
    answer on). Each answer is read after the header now, and the notes say what the template
    does: the opening, and the reasoning it cuts out of answers."""
    tok = _tok(tiny_tokenizer, template)
    layout = turn_layout(tok)
    assert (layout.follows, layout.opening, layout.drops_reasoning) == (True, "<think>\n", True)
    notes = check_chat_template(tok, None)
    assert len(notes) == 2 and "ends with <think>" in notes[0] and "</think>" in notes[1]
    talk = TALK[1:3] + [TALK[3], {"role": "assistant", "content": "why</think>second answer"}]
    (row,) = _trained(tok, [talk])
    assert row["status"] == KEPT and row["style"] == style
    assert row["trained_text"].replace(" ", "") == trained.replace(" ", "")


def test_templates_that_keep_reasoning_say_nothing(tiny_tokenizer) -> None:
    """Qwen3 writes a last answer's reasoning and opens no block in its generation prompt;
    Gemma writes a content as it is: no notes."""
    for template in (QWEN3, GEMMA):
        layout = turn_layout(_tok(tiny_tokenizer, template))
        assert (layout.opening, layout.drops_reasoning) == ("", False)
        assert check_chat_template(_tok(tiny_tokenizer, template), None) == []


def _expert(tmp_path: Path, tok, rows: list[dict]) -> Path:
    """A manifest on a random model of `tok` (saved beside it), trained on `rows`."""
    folder = tmp_path / "tokenizer"
    tok.save_pretrained(folder)
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    manifest = {
        "name": "e",
        "schema_version": "2.0",
        "base_models": [{"name": str(folder), "init": "random"}],
        "training": {
            "dataset": {"path": "train.jsonl", "eval_fraction": 0.0},
            "config": {"evaluation_strategy": "no", "max_seq_length": 128},
        },
    }
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    return tmp_path / "manifest.json"


def test_pretokenize_says_what_a_reasoning_template_does(tmp_path, tiny_tokenizer) -> None:
    """The notes reach the user: the build keeps them in stats.json, `pretokenize` shows them."""
    _expert(tmp_path, _tok(tiny_tokenizer, R1_TEMPLATE), [{"messages": TALK[1:]}] * 4)
    done = run_here("pretokenize", "-m", str(tmp_path / "manifest.json"))
    assert done.returncode == 0, done.stdout + done.stderr
    shown = " ".join(done.stdout.split())
    assert "generation prompt ends with <think>" in shown and "is not trained" in shown
    checked = run_here("check", "-m", str(tmp_path / "manifest.json"))
    assert "generation prompt ends with <think>" in " ".join(checked.stdout.split())


@pytest.mark.parametrize("template", [GEMMA, QWEN3])
def test_a_conversation_of_many_answers_asks_the_template_for_some(
    tiny_tokenizer, template: str
) -> None:
    """Each answer asked costs two renders as long as the conversation up to it: 1,000
    exchanges under Qwen3's template took 54 s for one row. Past MAX_ASKED answers the first
    MAX_ASKED - 1 and the last are asked and trained, the others are context, and the row is
    counted apart with the reason."""
    tok = _tok(tiny_tokenizer, template)
    layout = turn_layout(tok)
    talk = []
    for i in range(MAX_ASKED + 6):
        answer = {"role": "assistant", "content": f"answer {i}", "reasoning_content": "r"}
        talk += [{"role": "user", "content": f"question {i}"}, answer]
    text = tok.apply_chat_template(talk, tokenize=False)
    spans, style = conversation_spans(tok, talk, text, None, layout)
    assert style == "many_turns"
    trained = [text[a:b] for a, b in spans]
    assert trained[-1].lstrip().split("</think>")[-1].strip().startswith(f"answer {MAX_ASKED + 5}")
    if template == GEMMA:  # every answer is written alike: the first 63 and the last
        assert [t.split("<")[0] for t in trained] == [
            f"answer {i}" for i in [*range(MAX_ASKED - 1), MAX_ASKED + 5]
        ]
    fmt = Formatter(tokenizer=tok, kind="messages", max_seq_length=8192, overlong="truncate")
    (row,) = fmt({"messages": [talk]}).to_pylist()  # as the build formats it
    assert row["status"] == KEPT and row["style"] == "many_turns"
    words = masking_words({"styles": {"turns": 3, "many_turns": 1}})
    assert (
        f"conversations of over {MAX_ASKED} answers 1 (at most their first {MAX_ASKED - 1}" in words
    )


def test_an_answer_of_weight_zero_is_context(tiny_tokenizer) -> None:
    """OpenAI's fine-tuning format leaves an assistant message of `"weight": 0` out of the
    loss; it was trained like any other. It is context now; every answer of weight 0 leaves
    nothing to train (dropped); any other weight trains; a template that cannot be asked for
    the other answers (no generation prompt before its answers) refuses the row."""
    tok = _tok(tiny_tokenizer, None)
    weighed = copy.deepcopy(TALK)
    weighed[2]["weight"] = 0
    (row,) = _trained(tok, [weighed])
    assert (row["status"], row["style"]) == (KEPT, "weighted")
    assert row["trained_text"] == "second answer<|im_end|><|endoftext|>"
    said = masking_words({"styles": {"chatml": 3, "weighted": 1}}) or ""  # said alone too
    assert 'conversations with answers of "weight": 0 left as context 1' in said
    every = copy.deepcopy(weighed)
    every[4]["weight"] = 0.0
    (row,) = _trained(tok, [every])
    assert row["status"] == DROPPED_NO_COMPLETION and row["trained_text"] == ""
    for weight in (1, "0", False, None):  # only the number 0 leaves an answer out
        talk = copy.deepcopy(TALK)
        talk[2]["weight"] = weight
        (row,) = _trained(tok, [talk])
        assert row["trained_text"] == "first answer<|im_end|>second answer<|im_end|><|endoftext|>"
    (row,) = _trained(_tok(tiny_tokenizer, PLAIN), [weighed], "assistant: ")
    assert (row["style"], row["trained"]) == ("refused", 0)
    assert (
        row["refused"] == 'an answer of "weight": 0 that its chat template cannot leave untrained'
    )


def test_an_empty_conversation_is_named_as_one(tiny_tokenizer) -> None:
    """`{"messages": []}` was dropped as "refused by the chat template (ValueError, roles
    none)": the template refused nothing."""
    from expert_cli.data.conversations import render_conversation

    tok = _tok(tiny_tokenizer, None)
    assert render_conversation(tok, []) == ("", "an empty conversation (no messages)")
    assert render_conversation(tok, "[]") == ("", "an empty conversation (no messages)")
    (row,) = _trained(tok, [[]])
    assert (row["style"], row["refused"]) == ("refused", "an empty conversation (no messages)")


def test_check_says_which_conversations_keep_earlier_answers_as_context(
    tmp_path, tiny_tokenizer
) -> None:
    """Only the build said that Qwen3's template leaves reasoned earlier answers as context;
    check said nothing of it (the helper's audit under Qwen3's own template)."""
    from expert_cli.data.checks import check_manifest

    tok = _tok(tiny_tokenizer, QWEN3)
    tok.eos_token = "<|im_end|>"
    reasoned = [
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": "one", "reasoning_content": "think one"},
        {"role": "user", "content": "second"},
        {"role": "assistant", "content": "two", "reasoning_content": "think two"},
    ]
    _expert(tmp_path, tok, [{"messages": reasoned}] * 3 + [{"messages": reasoned[:2]}] * 2)
    report = check_manifest(tmp_path / "manifest.json")
    (note,) = [n for n in report.notes if "left as context" in n]
    said = "3 of the 5 training sources' conversations have earlier answers left as context"
    assert note == f"{said}: {LAST_TURNS_WHY}"
    # reasoning written into an earlier answer's text (which the template cuts) is part of
    # the shape: the count was of the first row's verdict, whichever came first
    plain = [reasoned[0], {"role": "assistant", "content": "one"}, *reasoned[2:3], TALK[4]]
    inline = [reasoned[0], {"role": "assistant", "content": "<think>x</think>one"}, *plain[2:]]
    for rows in ([plain] + [inline] * 3, [inline] * 3 + [plain]):
        lines = [json.dumps({"messages": m}) + "\n" for m in rows]
        (tmp_path / "train.jsonl").write_text("".join(lines))
        report = check_manifest(tmp_path / "manifest.json")
        (note,) = [n for n in report.notes if "left as context" in n]
        assert note.startswith("3 of the 4 training sources' conversations"), note
