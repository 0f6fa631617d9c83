"""Completion-only masking: labels cover exactly the completion tokens, for every format."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from expert_cli.data.formatting import (
    COMPLETION_PREFIX,
    DROPPED_ANSWER_CUT,
    DROPPED_NO_COMPLETION,
    DROPPED_NO_MARKER,
    DROPPED_OVERLONG,
    DROPPED_TEMPLATE,
    IGNORE,
    KEPT,
    TRUNCATED,
    Formatter,
    assistant_spans,
    check_chat_template,
    render_instruction,
)
from expert_cli.errors import UserError

ROOT = Path(__file__).resolve().parents[2]
CHATML = (
    "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhi there<|im_end|>\n"
    "<|im_start|>assistant\nHello world<|im_end|>\n<|im_start|>user\nmore<|im_end|>\n"
    "<|im_start|>assistant\nOK then<|im_end|>\n"
)
MARKERS = "<|system|>\nsys\n<|end|>\n<|user|>\nq\n<|end|>\n<|assistant|>\nSELECT 1;\n<|end|>\n"


def run(
    tok,
    kind: str,
    rows: dict,
    max_len: int = 512,
    overlong: str = "truncate",
    template: str = "chatml",
    response_template: str | None = None,
) -> list[dict]:
    fmt = Formatter(
        tokenizer=tok,
        kind=kind,
        max_seq_length=max_len,
        overlong=overlong,
        prompt_template=template,
        response_template=response_template,
    )
    return fmt(rows).to_pylist()


def split(tok, row: dict) -> tuple[str, str]:
    """(decoded trained tokens, decoded masked tokens) of one formatted row."""
    ids, labels = row["input_ids"], row["labels"]
    assert all(lab in (IGNORE, i) for i, lab in zip(ids, labels, strict=True))
    trained = [i for i, lab in zip(ids, labels, strict=True) if lab != IGNORE]
    masked = [i for i, lab in zip(ids, labels, strict=True) if lab == IGNORE]
    return tok.decode(trained), tok.decode(masked)


def expected_mask(tok, pieces: list[tuple[str, bool]]) -> list[bool]:
    """Token-level mask when each piece tokenizes on its own (special-token boundaries)."""
    out: list[bool] = []
    for text, trained in pieces:
        out += [trained] * len(tok(text, add_special_tokens=False)["input_ids"])
    return out


def test_chatml_trains_every_assistant_turn_and_masks_the_rest(tiny_tokenizer) -> None:
    row = run(tiny_tokenizer, "text", {"text": [CHATML]})[0]
    trained, masked = split(tiny_tokenizer, row)
    assert trained == "Hello world<|im_end|>OK then<|im_end|><|endoftext|>"
    assert masked == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhi there"
        "<|im_end|>\n<|im_start|>assistant\n\n<|im_start|>user\nmore<|im_end|>\n"
        "<|im_start|>assistant\n\n"
    )
    pieces = [
        (
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhi there<|im_end|>\n"
            "<|im_start|>assistant\n",
            False,
        ),
        ("Hello world<|im_end|>", True),
        ("\n<|im_start|>user\nmore<|im_end|>\n<|im_start|>assistant\n", False),
        ("OK then<|im_end|>", True),
        ("\n", False),
        ("<|endoftext|>", True),
    ]
    assert [lab != IGNORE for lab in row["labels"]] == expected_mask(tiny_tokenizer, pieces)
    assert row["status"] == KEPT and row["no_marker"] is False
    assert row["trained"] == sum(lab != IGNORE for lab in row["labels"])
    assert row["input_ids"] == tiny_tokenizer(CHATML)["input_ids"] + [tiny_tokenizer.eos_token_id]


def test_assistant_marker_style_trains_through_end_marker(tiny_tokenizer) -> None:
    row = run(tiny_tokenizer, "text", {"text": [MARKERS]})[0]
    trained, masked = split(tiny_tokenizer, row)
    assert trained == "SELECT 1;\n<|end|><|endoftext|>"
    assert masked == "<|system|>\nsys\n<|end|>\n<|user|>\nq\n<|end|>\n<|assistant|>\n\n"


def test_span_rules() -> None:
    assert assistant_spans("abc", None) == ([(0, 3)], "none")
    assert assistant_spans("Q: x A: y", "A:") == ([(7, 9)], "template")
    assert assistant_spans("Q: x", "A:") == ([], "missing")
    text = "<|user|>\na\n<|assistant|>\nb\n<|user|>\nc\n<|assistant|>\nd"
    assert [text[a:b] for a, b in assistant_spans(text, None)[0]] == ["b\n", "d"]


def test_plain_text_without_marker_is_trained_whole_and_counted(tiny_tokenizer) -> None:
    row = run(tiny_tokenizer, "text", {"text": ["just some text"]})[0]
    # all but the first token, which nothing in the example predicts
    assert split(tiny_tokenizer, row) == (" some text<|endoftext|>", "just")
    assert row["no_marker"] is True


def test_no_example_start_is_trained_so_packing_never_links_examples(tiny_tokenizer) -> None:
    """In a packed row the label at an example's start would be predicted from the previous
    example's last token (the loss shifts labels): it must be -100."""
    from expert_cli.data.packing import pack_table

    fmt = Formatter(tokenizer=tiny_tokenizer, kind="text", max_seq_length=64, overlong="truncate")
    table = fmt({"text": ["just some text", "more words here", "x", "", CHATML[:40]]})
    assert all(r["labels"][0] == IGNORE for r in table.to_pylist() if r["input_ids"])
    assert table.to_pylist()[3]["status"] == DROPPED_NO_COMPLETION  # a lone EOS trains nothing
    packed, _ = pack_table(table, 64, True, seed=0)
    starts_per_row = []
    for row in packed.to_pylist():
        starts = [k for k, p in enumerate(row["position_ids"]) if p == 0]
        starts_per_row.append(len(starts))
        assert all(row["labels"][k] == IGNORE for k in starts)
    assert max(starts_per_row) > 1  # a row holds several examples: the check means something


def test_an_empty_answer_in_an_empty_reasoning_block_is_dropped(tiny_tokenizer) -> None:
    """Qwen3's template renders an empty answer as `<think>\\n\\n</think>\\n\\n<|im_end|>`: the
    row was kept and trained to reply with nothing, where ChatML's empty answer is dropped."""
    head = "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n"
    rows = run(
        tiny_tokenizer,
        "text",
        {
            "text": [
                f"{head}<think>\n\n</think>\n\n<|im_end|>\n",
                f"{head}<think>\nr\n</think>\n\n<|im_end|>\n",
            ]
        },
    )
    assert [r["status"] for r in rows] == [DROPPED_NO_COMPLETION, KEPT]


def test_an_eos_followed_by_a_line_break_is_trained_as_the_end(tiny_tokenizer) -> None:
    """`...<|im_end|>\\n<|endoftext|>\\n`: the EOS was kept but not trained (the same text
    without the last line break trained it)."""
    head = "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\nok<|im_end|>\n<|endoftext|>"
    bare, spaced = run(tiny_tokenizer, "text", {"text": [head, head + "\n"]})
    assert split(tiny_tokenizer, bare)[0] == split(tiny_tokenizer, spaced)[0]
    assert split(tiny_tokenizer, spaced)[0].endswith("<|endoftext|>")


def test_response_template_missing_drops_the_example(tiny_tokenizer) -> None:
    rows = run(
        tiny_tokenizer, "text", {"text": ["Q: a\nA: b", "no answer here"]}, response_template="A:"
    )
    assert split(tiny_tokenizer, rows[0]) == (" b<|endoftext|>", "Q: a\nA:")
    assert rows[1]["status"] == DROPPED_NO_MARKER and rows[1]["input_ids"] == []


def test_existing_eos_is_not_doubled(tiny_tokenizer) -> None:
    row = run(tiny_tokenizer, "text", {"text": ["abc<|endoftext|>"]})[0]
    assert row["input_ids"].count(tiny_tokenizer.eos_token_id) == 1
    assert row["labels"][-1] == tiny_tokenizer.eos_token_id


@pytest.mark.parametrize("template", ["chatml", "alpaca", "llama2", "vicuna"])
def test_instruction_templates_train_exactly_the_response(tiny_tokenizer, template) -> None:
    rows = {"instruction": ["Count"], "input": ["1 2"], "response": ["3 4 5"]}
    row = run(tiny_tokenizer, "instruction", rows, max_len=2048, template=template)[0]
    prompt, suffix = render_instruction(template, "Count", "1 2", None)
    lead = COMPLETION_PREFIX.get(template, "")
    trained, masked = split(tiny_tokenizer, row)
    assert trained == lead + "3 4 5" + suffix + "<|endoftext|>"
    assert masked == prompt and not prompt.endswith(" ")
    expected = tiny_tokenizer(prompt + lead + "3 4 5" + suffix)["input_ids"]
    assert row["input_ids"] == expected + [tiny_tokenizer.eos_token_id]


@pytest.mark.parametrize("template", ["llama2", "vicuna"])
def test_an_answers_first_word_is_trained(template: str) -> None:
    """With a tokenizer that joins the space before a word to it (" Yes", as Qwen's and
    Llama's do), llama2 and vicuna left the answer's first token on the prompt side: a yes/no
    dataset trained only the end-of-text. Likewise a response_template ending in a space."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(ROOT / "experts" / "demo" / "model")
    assert tok.tokenize(" Yes")[0].endswith("Y")  # one token holds the space and the Y
    rows = {"instruction": ["Is 7 prime?"], "response": ["Yes"]}
    row = run(tok, "instruction", rows, template=template)[0]
    trained, _ = split(tok, row)
    assert trained == " Yes<|endoftext|>"
    text = {"text": ["Q: Is 7 prime?\n### Answer: Yes"]}
    row = run(tok, "text", text, response_template="### Answer: ")[0]
    assert split(tok, row)[0] == " Yes<|endoftext|>"  # the straddling token counts as answer


def test_alpaca_without_input_and_custom_template(tiny_tokenizer) -> None:
    prompt, suffix = render_instruction("alpaca", "Do", None, None)
    assert prompt.endswith("### Instruction:\nDo\n\n### Response:\n") and suffix == ""
    assert "### Input" not in prompt
    with pytest.raises(UserError, match="custom"):
        render_instruction("custom", "Do", None, None)


def test_messages_use_the_chat_template(tiny_tokenizer) -> None:
    convo = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "b c"},
        {"role": "user", "content": "d"},
        {"role": "assistant", "content": "e"},
    ]
    row = run(tiny_tokenizer, "messages", {"messages": [convo]})[0]
    trained, _ = split(tiny_tokenizer, row)
    assert trained == "b c<|im_end|>e<|im_end|><|endoftext|>"
    check_chat_template(tiny_tokenizer, None)


ALTERNATING = (
    "{%- for m in messages %}{%- if (m['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('SECRET roles must alternate') }}{%- endif %}"
    "{{- '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{%- endfor %}"
)


def test_a_conversation_the_chat_template_refuses_is_dropped(tiny_tokenizer) -> None:
    """A template's raise_exception on one conversation (roles that do not alternate) was a
    jinja traceback that stopped the build; that row alone is dropped, with the error's kind and
    the conversation's roles, never the template's message."""
    tok = copy.deepcopy(tiny_tokenizer)
    tok.chat_template = ALTERNATING
    good = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b c"}]
    bad = [{"role": "system", "content": "s"}, *good]
    rows = run(tok, "messages", {"messages": [good, bad, good]})
    assert [r["status"] for r in rows] == [KEPT, DROPPED_TEMPLATE, KEPT]
    assert rows[1]["input_ids"] == rows[1]["labels"] == [] and rows[1]["trained"] == 0
    assert rows[1]["refused"] == "TemplateError, roles system, user, assistant"
    assert rows[0]["refused"] is None and rows[0] == {**rows[2]}
    assert split(tok, rows[0])[0] == "b c<|im_end|><|endoftext|>"


def test_keys_arrow_adds_as_null_are_not_shown_to_the_template(tiny_tokenizer, tmp_path) -> None:
    """In Arrow every message has every key some message has: a template asking whether
    `tool_calls` is defined saw a null one in the row without tool calls, iterated it and
    refused the row. A hub or saved dataset's conversations become JSON text without those
    fill-ins (content stays, null or not), in the build's work folder."""
    import datasets

    from expert_cli.data.dataset_rows import as_text

    tok = copy.deepcopy(tiny_tokenizer)
    tok.chat_template = (
        "{%- for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' }}"
        "{%- if m['content'] is not none %}{{ m['content'] }}{% endif %}"
        "{%- if m.tool_calls is defined %}{% for t in m.tool_calls %}<call {{ t.name }}>"
        "{% endfor %}{% endif %}{{ '<|im_end|>\\n' }}{%- endfor %}"
    )
    user = {"role": "user", "content": "q"}
    calls = {"role": "assistant", "content": None, "tool_calls": [{"name": "f"}]}
    plain = {"role": "assistant", "content": "b"}
    rows = datasets.Dataset.from_list([{"messages": [user, calls]}, {"messages": [user, plain]}])
    assert rows[1]["messages"][1]["tool_calls"] is None  # Arrow's fill-in
    holed = datasets.Dataset.from_list([{"messages": [user, calls]}, {"messages": [user, None]}])
    assert (
        as_text(holed, tmp_path / "holed")[1]["messages"]
        == '[{"role": "user", "content": "q"}, null]'
    )
    text = as_text(rows, tmp_path / "work")
    assert [p.parent for p in (tmp_path / "work").glob("*.arrow")] == [tmp_path / "work"]
    out = run(tok, "messages", text[:2])
    assert [r["status"] for r in out] == [KEPT, KEPT]
    assert split(tok, out[0])[0] == "<call f><|im_end|><|endoftext|>"
    assert split(tok, out[1])[0] == "b<|im_end|><|endoftext|>"


def test_a_template_that_leaves_tool_calls_out_refuses_the_turn(tiny_tokenizer) -> None:
    """A turn that only calls a tool, through a template that ignores tool_calls, rendered as
    an empty reply, which was trained."""
    user = {"role": "user", "content": "q"}
    calls = {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"type": "function", "function": {"name": "lookup", "arguments": "{}"}}],
    }
    tok = copy.deepcopy(tiny_tokenizer)
    tok.chat_template = (
        "{%- for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' }}"
        "{{ m['content'] or '' }}{{ '<|im_end|>\\n' }}{%- endfor %}"
    )
    (row,) = run(tok, "messages", {"messages": [[user, calls, user, {**calls, "content": "x"}]]})
    assert row["status"] == DROPPED_TEMPLATE
    # the tool named elsewhere (a system prompt listing it) does not make the turn rendered
    system = {"role": "system", "content": "tools: lookup"}
    (named,) = run(tok, "messages", {"messages": [[system, user, calls]]})
    assert named["status"] == DROPPED_TEMPLATE
    # a template that renders a call's arguments only, no name: rendered, kept
    tok.chat_template = (
        "{%- for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' }}{{ m['content'] or '' }}"
        "{%- for t in m.tool_calls or [] %}<args {{ t.function.arguments }}>{% endfor %}"
        "{{ '<|im_end|>\\n' }}{%- endfor %}"
    )
    nameless = {**calls, "tool_calls": [{"function": {"arguments": "{}"}}]}
    (kept,) = run(tok, "messages", {"messages": [[user, nameless]]})
    assert kept["status"] == KEPT and split(tok, kept)[0] == "<args {}><|im_end|><|endoftext|>"
    roles = "roles user, assistant, user, assistant"
    assert row["refused"] == f"its tool_calls are not rendered, {roles}"


def test_the_roles_of_a_refused_conversation_are_bounded(tiny_tokenizer) -> None:
    tok = copy.deepcopy(tiny_tokenizer)
    tok.chat_template = ALTERNATING
    long = [{"role": "user", "content": "q"}] * 20 + [{"role": "x" * 300, "content": "a"}]
    why = run(tok, "messages", {"messages": [long]})[0]["refused"]
    assert why == "TemplateError, roles " + ", ".join(["user"] * 8) + " and 13 more"
    odd = [{"role": "x" * 300, "content": "a"}]
    assert run(tok, "messages", {"messages": [odd]})[0]["refused"] == (
        "TemplateError, roles <a 300-character name>"
    )


def test_overlong_truncate_and_drop(tiny_tokenizer) -> None:
    text = "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n" + "word " * 40
    full = run(tiny_tokenizer, "text", {"text": [text]}, max_len=4096)[0]
    cut = run(tiny_tokenizer, "text", {"text": [text]}, max_len=20)[0]
    assert cut["status"] == TRUNCATED
    assert cut["input_ids"] == full["input_ids"][:20]
    assert cut["labels"] == full["labels"][:20]
    dropped = run(tiny_tokenizer, "text", {"text": [text]}, max_len=20, overlong="drop")[0]
    assert dropped["status"] == DROPPED_OVERLONG and dropped["input_ids"] == []
    # cut inside the prompt: counted apart from empty answers (it was "no completion tokens",
    # with no word of max_seq_length)
    prompt_only = run(tiny_tokenizer, "text", {"text": [text]}, max_len=5)[0]
    assert prompt_only["status"] == DROPPED_ANSWER_CUT and prompt_only["trained"] == 0
    assert prompt_only["input_ids"] == []
    from expert_cli.data.stats_words import drop_reasons

    said = drop_reasons({"dropped_answer_cut": 2, "dropped_no_completion": 1}, 5)
    assert said == "1 with no completion tokens; 2 with the answer past max_seq_length=5"


def test_eos_that_ends_the_text_already_is_not_appended(tiny_tokenizer) -> None:
    import copy

    tok = copy.deepcopy(tiny_tokenizer)
    tok.eos_token = "<|im_end|>"
    row = run(tok, "text", {"text": [CHATML]})[0]
    assert row["input_ids"] == tok(CHATML)["input_ids"]
    assert split(tok, row)[0] == "Hello world<|im_end|>OK then<|im_end|>"


def test_a_lone_surrogate_however_deep_is_named_without_a_traceback() -> None:
    """The walk of a message's other keys recursed: 600 levels, which the JSON reader takes,
    were a RecursionError traceback. A key of the user's own is not shown."""
    from expert_cli.data.values import _value_problem

    deep: dict = {}
    inner = deep
    for _ in range(3000):
        inner["a"] = {}
        inner = inner["a"]
    inner["b"] = "\ud800"
    said = _value_problem("messages", [{"role": "user", "content": "q", "extra": deep}])
    assert said is not None and said.startswith("item 0: a value contains a lone surrogate")
    args = {"role": "assistant", "content": "a", "tool_calls": [{"arguments": {"sk-1": "\ud800"}}]}
    said = _value_problem("messages", [args])
    assert said is not None and said.startswith("item 0: tool_calls[0].arguments.<key> contains")
    assert "sk-1" not in said


@pytest.mark.parametrize("overlong", ["truncate", "drop"])
def test_a_huge_example_is_tokenized_from_its_start_with_the_same_result(
    tiny_tokenizer, monkeypatch: pytest.MonkeyPatch, overlong: str
) -> None:
    """A 40 MB example took 10 GB and two minutes to keep 512 tokens. Texts past 32 characters
    per token of the limit are tokenized from their start: the rows (ids, labels, fate) equal
    those of tokenizing every text whole, including a long answer whose trained span runs past
    the cut, and a text whose start is too short to decide falls back to the whole text."""
    import expert_cli.data.formatting as formatting

    tok = tiny_tokenizer

    words = " ".join(f"w{i % 97}" for i in range(4000))  # ~20k characters
    rows = {
        "instruction": ["Short question?", "Long question " + words, "q"],
        "response": [words, "short answer", "a " * 200],
    }
    texts = {"text": [words, "tiny", "x" * 3000]}
    seen: list[int] = []
    real = tok.backend_tokenizer.encode_batch

    class Counting:  # the tokenizer's own work, counted in characters
        def __getattr__(self, name: str):
            return getattr(tok.backend_tokenizer, name)

        def encode_batch(self, batch: list[str], **kwargs):
            seen.append(sum(len(t) for t in batch))
            return real(batch, **kwargs)

    got = {}
    real_cut = formatting.CUT_CHARS_PER_TOKEN
    for cut in (real_cut, 1, 10**9):  # 1: every start too short to decide
        monkeypatch.setattr(formatting, "CUT_CHARS_PER_TOKEN", cut)
        monkeypatch.setattr(type(tok), "backend_tokenizer", property(lambda self: Counting()))
        seen.clear()
        got[cut] = (
            run(tok, "instruction", rows, max_len=64, overlong=overlong),
            run(tok, "text", texts, max_len=64, overlong=overlong),
            sum(seen),
        )
    cut_rows, whole_rows = got[real_cut], got[10**9]
    assert cut_rows[:2] == whole_rows[:2]
    assert cut_rows[2] < whole_rows[2] / 4  # the long texts were read to their cut only
    assert got[1][:2] == whole_rows[:2] and got[1][2] > whole_rows[2]  # read again, whole
    assert [r["status"] for r in cut_rows[1]] == (
        [TRUNCATED, KEPT, TRUNCATED]
        if overlong == "truncate"
        else [DROPPED_OVERLONG, KEPT, DROPPED_OVERLONG]
    )


def _with_post_processor(tok, single: str):
    """The tokenizer with a post-processor that adds special tokens (`single`, in the
    tokenizers library's template form), as Llama-style tokenizers add `<s>` or EOS."""
    from tokenizers.processors import TemplateProcessing

    tok = copy.deepcopy(tok)
    names = [t for t in ("<|im_start|>", "<|endoftext|>") if t in single]
    tok.backend_tokenizer.post_processor = TemplateProcessing(
        single=single, special_tokens=[(t, tok.convert_tokens_to_ids(t)) for t in names]
    )
    return tok


@pytest.mark.parametrize("template", ["alpaca", "llama2", "chatml"])
def test_an_answers_last_character_is_trained_whole(tiny_tokenizer, template: str) -> None:
    """A character of several byte tokens (é is two, an emoji four) that ends the answer had
    only its first token trained: the model learnt the first byte, then EOS."""
    rows = {"instruction": ["Say it", "Smile"], "response": ["café", "ok 🙂"]}
    for row, answer in zip(
        run(tiny_tokenizer, "instruction", rows, template=template), rows["response"], strict=True
    ):
        trained, masked = split(tiny_tokenizer, row)
        assert answer in trained and "\ufffd" not in trained + masked
        assert trained.endswith("<|endoftext|>") or trained.endswith("<|im_end|><|endoftext|>")
    row = run(tiny_tokenizer, "text", {"text": ["Q: x\nA: naïve é"]}, response_template="A:")[0]
    assert split(tiny_tokenizer, row)[0] == " naïve é<|endoftext|>"


def test_a_line_break_after_a_marker_is_not_trained_as_the_answer(tiny_tokenizer) -> None:
    """Text from a spreadsheet keeps \\r\\n: every answer began with a trained \\r\\n."""
    text = "<|im_start|>user\r\nq<|im_end|>\r\n<|im_start|>assistant\r\nSELECT 1<|im_end|>\r\n"
    trained, _ = split(tiny_tokenizer, run(tiny_tokenizer, "text", {"text": [text]})[0])
    assert trained.startswith("SELECT 1<|im_end|>")
    marker = "<|user|>\r\nq\r\n<|end|>\r\n<|assistant|>\r\nSELECT 2\r\n<|end|>"
    assert split(tiny_tokenizer, run(tiny_tokenizer, "text", {"text": [marker]})[0])[0].startswith(
        "SELECT 2"
    )


def test_a_bos_the_tokenizer_adds_to_a_rendered_text_is_not_doubled(tiny_tokenizer) -> None:
    """A text rendered with the chat template's `{{ bos_token }}`, under a tokenizer whose
    post-processor adds it too, began with two: `messages` data gives one."""
    tok = _with_post_processor(tiny_tokenizer, "<|im_start|> $A")
    start = tok.convert_tokens_to_ids("<|im_start|>")
    row = run(tok, "text", {"text": ["<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\na"]})[0]
    assert row["input_ids"][:2] == [start, tok.convert_tokens_to_ids("user")]
    plain = run(tok, "text", {"text": ["plain words"]})[0]  # the added one stays where alone
    assert plain["input_ids"][0] == start and plain["input_ids"].count(start) == 1


def test_an_eos_the_tokenizer_adds_is_trained_once(tiny_tokenizer) -> None:
    """A post-processor that appends EOS (Llama's add_eos_token): that EOS was never trained
    (it has no character, so no span covered it) and a text ending in EOS got two."""
    tok = _with_post_processor(tiny_tokenizer, "$A <|endoftext|>")
    eos = tok.eos_token_id
    rows = run(
        tok, "instruction", {"instruction": ["q"], "response": ["hi there"]}, template="alpaca"
    )
    assert split(tok, rows[0])[0] == "hi there<|endoftext|>"
    for text in ("a whole document", "a document<|endoftext|>"):
        row = run(tok, "text", {"text": [text]})[0]
        assert row["input_ids"].count(eos) == 1 and row["labels"][-1] == eos, text


def test_an_eos_after_a_prompt_is_not_trained(tiny_tokenizer) -> None:
    """A ChatML text ending with a user turn: the EOS appended after it would teach the model
    to stop after a question. After an answer (its <|im_end|> and a newline between) it is."""
    asked = CHATML + "<|im_start|>user\nand?<|im_end|>\n"
    trained = split(tiny_tokenizer, run(tiny_tokenizer, "text", {"text": [asked]})[0])[0]
    assert trained == "Hello world<|im_end|>OK then<|im_end|>"
    trained = split(tiny_tokenizer, run(tiny_tokenizer, "text", {"text": [CHATML]})[0])[0]
    assert trained == "Hello world<|im_end|>OK then<|im_end|><|endoftext|>"
    ended = CHATML + "<|endoftext|>"  # the text's own EOS right after the answer: trained
    row = run(tiny_tokenizer, "text", {"text": [ended]})[0]
    assert row["labels"][-1] == tiny_tokenizer.eos_token_id


def test_a_conversation_without_an_assistant_turn_is_dropped(tiny_tokenizer) -> None:
    """ShareGPT's "gpt" role, Gemma's "model", or only a user turn: the template renders no
    assistant marker, and the whole conversation (prompts too) was trained as plain text."""
    conversations = [
        [{"role": "user", "content": "What is 2+2?"}, {"role": "gpt", "content": "4"}],
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}],
        [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}],
    ]
    rows = run(tiny_tokenizer, "messages", {"messages": conversations})
    assert [r["status"] for r in rows] == [DROPPED_TEMPLATE, DROPPED_TEMPLATE, KEPT]
    assert rows[0]["refused"] == "no assistant turn, roles user, gpt"
    assert rows[1]["refused"] == "no assistant turn, roles system, user"
    assert rows[0]["input_ids"] == [] and split(tiny_tokenizer, rows[2])[0].startswith("a")


def test_pretokenize_says_when_examples_are_trained_whole(tmp_path: Path, tiny_model_dir) -> None:
    """Text without an assistant marker (alpaca's `text` column, detected before its
    instruction/output pair) trains the prompt too: it was counted in stats.json only."""
    import json

    from train_helpers import run_here, write_expert

    manifest = write_expert(tmp_path / "e", tiny_model_dir, rows=6)
    train = manifest.parent / "data" / "train.jsonl"
    plain = {"text": "### Instruction:\nSay hi\n\n### Response:\nhi"}
    train.write_text(train.read_text() + json.dumps(plain) + "\n")
    out = run_here("pretokenize", "--manifest", str(manifest))
    said = " ".join(out.stdout.split())
    assert out.returncode == 0, out.stdout + out.stderr
    assert (
        "loss on: ChatML assistant turns 6, whole text 1 (no assistant marker: the prompt" in said
    )
    assert "set training.dataset.response_template" in said
    train.write_text("".join(train.read_text().splitlines(keepends=True)[:6]))
    out = run_here("pretokenize", "--manifest", str(manifest))
    assert out.returncode == 0 and "loss on" not in out.stdout  # answers only: nothing to say


def test_a_template_without_text_names_no_field_that_is_not_there() -> None:
    """The message named `base_model.prompt_template`, which a schema 2.0 manifest has not
    (its field is base_models[0].prompt_template)."""
    with pytest.raises(UserError) as info:
        render_instruction("custom", "q", None, None)
    assert info.value.lines[0].startswith("the base model's prompt_template 'custom' needs")


def test_a_response_template_beside_instruction_data_is_noted_as_unread(
    capsys, monkeypatch, tmp_path, tiny_model_dir
) -> None:
    """Instruction rows are trained on their response field: a response_template beside them
    was never read, and nothing said so (with `messages` it is checked against the chat
    template)."""
    from train_helpers import prompt_heavy_expert, run_main

    from expert_cli.data.formatting import TEMPLATE_UNREAD

    manifest = prompt_heavy_expert(tmp_path / "e", tiny_model_dir)
    data = json.loads(manifest.read_text())
    data["training"]["dataset"]["response_template"] = "### Answer:"
    manifest.write_text(json.dumps(data))
    code, out, err = run_main(capsys, monkeypatch, "check", "--manifest", str(manifest), "--json")
    assert code == 0, out + err
    assert json.loads(out)["notes"].count(TEMPLATE_UNREAD) == 1
    code, out, err = run_main(capsys, monkeypatch, "pretokenize", "--manifest", str(manifest))
    assert code == 0, out + err
    assert "response_template: not read with instruction data" in " ".join(out.split())
    del data["training"]["dataset"]["response_template"]
    manifest.write_text(json.dumps(data))
    code, out, _ = run_main(capsys, monkeypatch, "check", "--manifest", str(manifest), "--json")
    assert code == 0 and TEMPLATE_UNREAD not in json.loads(out)["notes"]


def test_a_prompt_token_straddling_the_response_template_is_not_trained() -> None:
    """A response template ending inside a token (`### A` of `### Answer`): the token that
    holds the template's end (` An`) stays the prompt's, its following tokens are trained."""
    from transformers import AutoTokenizer

    from expert_cli.data.spans import assistant_spans, span_mask

    tok = AutoTokenizer.from_pretrained(Path(__file__).parents[2] / "experts" / "demo" / "model")
    text = "Q: hi\n### Answer"
    enc = tok(text, return_offsets_mapping=True)
    spans, _ = assistant_spans(text, "### A")
    mask = span_mask(text, enc, len(enc["input_ids"]), spans)
    tokens = tok.convert_ids_to_tokens(enc["input_ids"])
    assert [t for t, m in zip(tokens, mask, strict=True) if m] == ["s", "w", "er"]


def test_an_answer_of_the_tokenizers_own_end_alone_has_no_content() -> None:
    """Llama 3's `<|eot_id|>` (no marker of the known ones): an answer holding only it is
    empty, and a span before it runs to the text's end."""
    from expert_cli.data.spans import has_content, runs_to_end

    text = "<|user|>hi<|assistant|><|eot_id|>"
    start = text.index("<|assistant|>") + len("<|assistant|>")
    assert not has_content(text, [(start, len(text))], "<|eot_id|>")
    assert has_content("<|assistant|>A<|eot_id|>", [(13, 24)], "<|eot_id|>")
    assert runs_to_end("A<|eot_id|>", [(0, 1)], "<|eot_id|>")
