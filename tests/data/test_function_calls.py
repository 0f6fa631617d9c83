"""ShareGPT's `function_call` turns (LLaMA-Factory's and APIGen-MT's tool-calling data) are the
assistant's tool calls. Before, the call's JSON was trained as the answer's text, so a model
learned the dataset's JSON instead of the call format its chat template writes (Qwen3's
`<tool_call>` blocks), which its serving stack parses."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import pytest
from test_tools import TOOL, _built_text, _tool_expert
from train_helpers import run_here

from expert_cli.data.calls import tool_calls
from expert_cli.data.checks import check_manifest
from expert_cli.data.conversations import form_note, standard_turns
from expert_cli.data.formatting import DROPPED_TEMPLATE, IGNORE, KEPT, Formatter
from expert_cli.data.values import _value_problem
from expert_cli.errors import UserError

# writes each call with its arguments as JSON, as Qwen3's template does
CALLS = (
    "{%- if tools %}{{ '<|im_start|>system\\n# Tools\\n' }}{%- for t in tools %}"
    "{{ (t.function or t).name + '\\n' }}{%- endfor %}{{ '<|im_end|>\\n' }}{%- endif %}"
    "{%- for m in messages %}{{ '<|im_start|>' + m.role + '\\n' }}{{ m.content or '' }}"
    "{%- for c in m.tool_calls or [] %}<call {{ c.function.name }} "
    "{{ c.function.arguments | tojson }}>{%- endfor %}{{ '<|im_end|>\\n' }}{%- endfor %}"
)
CALL_TEXT = json.dumps({"name": "lookup_order", "arguments": {"order": 7}})
SHAREGPT = [
    {"from": "human", "value": "Where is order 7?"},
    {"from": "function_call", "value": CALL_TEXT},
    {"from": "observation", "value": '{"status": "shipped"}'},
    {"from": "gpt", "value": "It has shipped."},
]

SHAREGPT_READ = [
    {"role": "user", "content": "Where is order 7?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"type": "function", "function": {"name": "lookup_order", "arguments": {"order": 7}}}
        ],
    },
    {"role": "tool", "content": '{"status": "shipped"}'},
    {"role": "assistant", "content": "It has shipped."},
]


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (CALL_TEXT, [("lookup_order", {"order": 7})]),
        ('{"name": "f", "arguments": "{\\"a\\": [1]}"}', [("f", {"a": [1]})]),  # JSON text
        ('{"name": "f", "parameters": {"a": 1}}', [("f", {"a": 1})]),  # Llama's word
        ('{"name": "now"}', [("now", {})]),  # a call of no arguments
        ('{"name": "now", "arguments": null}', [("now", {})]),
        (
            '[{"name": "f", "arguments": {}}, {"name": "g", "arguments": {"x": 1}}]',
            [("f", {}), ("g", {"x": 1})],
        ),  # fmt: skip
        ({"name": "f", "arguments": {"a": 1}}, [("f", {"a": 1})]),  # an object in a JSON file
        ("<functioncall> f", None),  # Glaive's own text
        (
            '{"name": "f", "arguments": \'{"a": "it\'s"}\'}',
            [("f", {"a": "it's"})],
        ),  # Glaive's quotes
        ("[]", None),
        ('{"arguments": {}}', None),  # no name
        ('{"name": " ", "arguments": {}}', None),
        ('{"name": "f", "arguments": [1]}', None),
        ('{"name": "f", "arguments": "not json"}', None),
        ('{"name": "f", "arguments": {}, "parameters": {}}', None),  # which one is unclear
        ('{"name": "f", "arguments": {}, "thought": "..."}', None),  # not kept silently
        ('[{"name": "f"}, "g"]', None),
        ("[" * 5000 + "]" * 5000, None),  # nested past the JSON reader's depth: no traceback
        ('{"name": "f", "arguments": "' + "[" * 5000 + '"}', None),
        (None, None),
    ],
)
def test_a_function_calls_value_is_read_as_calls(value, expected) -> None:
    calls = tool_calls(value)
    if expected is None:
        assert calls is None
        return
    assert calls == [
        {"type": "function", "function": {"name": n, "arguments": a}} for n, a in expected
    ]


def test_a_call_keeps_its_id() -> None:
    (call,) = tool_calls('{"name": "f", "arguments": {}, "id": "call_1"}')
    assert call == {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": {}}}
    assert tool_calls('{"name": "f", "id": 7}')[0]["id"] == "7"  # a number as its text


def test_the_call_is_trained_in_the_templates_format_and_its_result_is_context(
    tiny_tokenizer,
) -> None:
    tok = copy.deepcopy(tiny_tokenizer)
    tok.chat_template = CALLS
    fmt = Formatter(tokenizer=tok, kind="messages", max_seq_length=512, overlong="truncate")
    (row,) = fmt({"messages": [json.dumps(SHAREGPT_READ)]}).to_pylist()
    assert row["status"] == KEPT
    ids, labels = row["input_ids"], row["labels"]
    trained = tok.decode([i for i, lab in zip(ids, labels, strict=True) if lab != IGNORE])
    assert '<call lookup_order {"order": 7}>' in trained
    assert CALL_TEXT not in tok.decode(ids)  # the dataset's JSON is not the answer's text
    assert "shipped" not in trained.replace("It has shipped.", "")  # the result: context
    assert "It has shipped." in trained


def _expert(tmp_path: Path, tiny_model_dir: Path, rows: list[dict]) -> Path:
    manifest = _tool_expert(tmp_path, tiny_model_dir, rows)
    (tmp_path / "model" / "chat_template.jinja").write_text(CALLS)
    return manifest


def test_llama_factorys_tool_calling_file_trains_its_calls(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    """LLaMA-Factory's layout (`conversations` of ShareGPT turns, `tools` as JSON text): the
    calls and the definitions reach the template; a value that is not a call is exit 2
    naming the file, line and turn, without quoting it."""
    rows = [{"conversations": SHAREGPT, "tools": json.dumps([TOOL])}] * 4
    manifest = _expert(tmp_path, tiny_model_dir, rows)
    assert check_manifest(manifest).problems == []
    text = _built_text(manifest, tmp_path / "model")
    assert text.count('<call lookup_order {"order": 7}>') == 4
    assert text.count("# Tools\nlookup_order") == 4
    secret = "<functioncall> lookup_order secret-7f3"
    bad = copy.deepcopy(SHAREGPT)
    bad[1]["value"] = secret
    (manifest.parent / "data" / "train.jsonl").write_text(
        json.dumps(rows[0]) + "\n" + json.dumps({"conversations": bad}) + "\n"
    )
    for command in ("check", "train"):
        done = run_here(command, "--manifest", str(manifest))
        said = " ".join((done.stdout + done.stderr).split())
        assert done.returncode == 2, said
        assert "train.jsonl:2: field 'conversations'" in said
        assert "item 1 is a function_call turn whose value is not a call, expected JSON" in said
        assert "secret-7f3" not in said and "Traceback" not in said


def test_a_saved_datasets_typed_turns_are_read_as_calls_and_checked(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    """A hub or saved dataset's ShareGPT turns are Arrow structs: its calls are read the same
    way, and a value that is not a call is named by row and turn before anything is built."""
    import datasets

    manifest = _expert(tmp_path, tiny_model_dir, [{"conversations": SHAREGPT}])
    data = json.loads(manifest.read_text())
    data["training"]["dataset"]["path"] = "data/saved"
    manifest.write_text(json.dumps(data))
    rows = [{"conversations": SHAREGPT, "tools": json.dumps([TOOL])}] * 3
    datasets.Dataset.from_list(rows).save_to_disk(str(manifest.parent / "data" / "saved"))
    assert check_manifest(manifest).problems == []
    assert _built_text(manifest, tmp_path / "model").count('<call lookup_order {"order": 7}>') == 3
    bad = copy.deepcopy(SHAREGPT)
    bad[1]["value"] = '{"name": "lookup_order", "arguments": "{"}'
    datasets.Dataset.from_list([*rows, {"conversations": bad, "tools": None}]).save_to_disk(
        str(manifest.parent / "data" / "bad")
    )
    data["training"]["dataset"]["path"] = "data/bad"
    manifest.write_text(json.dumps(data))
    (problem,) = check_manifest(manifest).problems
    assert "row 4: field 'conversations'" in problem
    assert "item 1 is a function_call turn whose value is not a call" in problem


# writes the roles it knows and skips any other, as Qwen3's template does
KNOWN_ROLES = (
    "{%- for m in messages %}{%- if m.role in ['system', 'user', 'assistant', 'tool'] %}"
    "{{ '<|im_start|>' + m.role + '\\n' }}{{ m.content or '' }}"
    "{%- for c in m.tool_calls or [] %}<call {{ c.function.name }} "
    "{{ c.function.arguments | tojson }}>{%- endfor %}{{ '<|im_end|>\\n' }}"
    "{%- endif %}{%- endfor %}"
)


def _rows(tok, conversations: list[list[dict]]) -> list[dict]:
    fmt = Formatter(tokenizer=tok, kind="messages", max_seq_length=512, overlong="truncate")
    return fmt({"messages": [json.dumps(standard_turns(c)) for c in conversations]}).to_pylist()


def _trained(tok, row: dict) -> str:
    ids, labels = row["input_ids"], row["labels"]
    return tok.decode([i for i, lab in zip(ids, labels, strict=True) if lab != IGNORE])


def test_locutusques_turns_and_glaives_quoted_arguments_are_calls(tiny_tokenizer) -> None:
    """Locutusque's `function-call`/`function-response` turns (Glaive's data, its arguments'
    JSON in single quotes) were kept in roles Qwen3's template skips: the call and its
    result vanished and the answer after them trained alone."""
    tok = copy.deepcopy(tiny_tokenizer)
    tok.chat_template = KNOWN_ROLES
    turns = [
        {"from": "human", "value": "Weather in Paris?"},
        {
            "from": "function-call",
            "value": '{"name": "weather", "arguments": \'{"city": "Paris"}\'}',
        },
        {"from": "function-response", "value": '{"sunny": true}'},
        {"from": "gpt", "value": "Sunny."},
    ]
    (row,) = _rows(tok, [turns])
    assert row["status"] == KEPT
    assert _trained(tok, row).startswith('<call weather {"city": "Paris"}>')
    assert '<|im_start|>tool\n{"sunny": true}' in tok.decode(row["input_ids"])


def test_openais_earlier_function_calling_is_read_as_tool_calls(tiny_tokenizer) -> None:
    """Toucan's and OpenAI's earlier form: an answer's `function_call` object with empty
    content trained the model to end its turn; the `function` result vanished."""
    tok = copy.deepcopy(tiny_tokenizer)
    tok.chat_template = KNOWN_ROLES
    call = {"name": "search", "arguments": '{"q": "rust"}'}
    turns = [
        {"role": "user", "content": "Find rust."},
        {"role": "assistant", "content": "", "function_call": call},
        {"role": "function", "name": "search", "content": "three hits"},
        {"role": "assistant", "content": "Found three."},
    ]
    (row,) = _rows(tok, [turns])
    assert _trained(tok, row).startswith('<call search {"q": "rust"}>')
    assert "<|im_start|>tool\nthree hits" in tok.decode(row["input_ids"])
    assert standard_turns(turns)[2] == {"role": "tool", "name": "search", "content": "three hits"}
    turns[1]["function_call"] = {"name": "search", "arguments": "not json"}
    problem = _value_problem("messages", standard_turns(turns)) + form_note(turns)
    assert problem.startswith("item 1 is a function_call turn whose value is not a call")
    assert "OpenAI's function_call and function turns as tool_calls and tool turns" in problem


def test_a_turn_in_a_role_the_template_skips_refuses_its_conversation(tiny_tokenizer) -> None:
    tok = copy.deepcopy(tiny_tokenizer)
    tok.chat_template = KNOWN_ROLES
    odd = [
        {"role": "user", "content": "q"},
        {"role": "api-result", "content": "r"},
        {"role": "assistant", "content": "a"},
    ]
    rows = _rows(tok, [odd, [odd[0], odd[2]]])
    assert [r["status"] for r in rows] == [DROPPED_TEMPLATE, KEPT]
    assert rows[0]["refused"] == (
        "its api-result turns are not rendered, roles user, api-result, assistant"
    )
    tok.chat_template = CALLS  # a template that writes every role: kept, the turn as context
    assert [r["status"] for r in _rows(tok, [odd])] == [KEPT]


def test_a_conversation_kept_as_json_text_is_read(tmp_path: Path, tiny_model_dir: Path) -> None:
    """Toucan-1.5M keeps each conversation (and its tools) as JSON text: "is a string,
    expected a list" in a file, and a saved dataset's text column was refused by its type.
    Both are read as the turns they hold; text that is not such JSON is named by row."""
    import datasets

    rows = [{"messages": json.dumps(SHAREGPT), "tools": json.dumps([TOOL])}] * 3
    manifest = _expert(tmp_path, tiny_model_dir, rows)
    assert check_manifest(manifest).problems == []
    text = _built_text(manifest, tmp_path / "model")
    assert text.count('<call lookup_order {"order": 7}>') == 3
    (manifest.parent / "data" / "train.jsonl").write_text(
        json.dumps({"messages": "Where is order 7?"}) + "\n"
    )
    (problem,) = check_manifest(manifest).problems
    assert problem.endswith(
        "train.jsonl:1: field 'messages' (field_mapping.messages) is text that is not JSON of a "
        'list of turns, expected a list of {"role": "...", "content": "..."} objects (content '
        "may be a list of text parts, or null in a turn with tool_calls)"
    ), problem
    data = json.loads(manifest.read_text())
    data["training"]["dataset"]["path"] = "data/saved"
    manifest.write_text(json.dumps(data))
    saved = manifest.parent / "data" / "saved"
    datasets.Dataset.from_list(rows).save_to_disk(str(saved))
    assert check_manifest(manifest).problems == []
    shutil.rmtree(manifest.parent / ".cache")
    built = _built_text(manifest, tmp_path / "model")
    assert built.count('<call lookup_order {"order": 7}>') == 3
    bad = [*rows, {"messages": "{not a list", "tools": None}]
    datasets.Dataset.from_list(bad).save_to_disk(str(manifest.parent / "data" / "bad"))
    data["training"]["dataset"]["path"] = "data/bad"
    manifest.write_text(json.dumps(data))
    (problem,) = check_manifest(manifest).problems
    assert "row 4: field 'messages'" in problem
    assert "is text that is not JSON of a list of turns" in problem


def test_xlams_query_answers_and_tools_train_the_calls(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    """Salesforce xlam-function-calling-60k: `query`, `answers` (JSON text of the calls) and
    `tools` (JSON text of bare definitions). It was "cannot tell which column ... (no response
    column was found)", and mapped as instruction data its calls trained as text without their
    definitions. Now the query is the user's turn and the answers the assistant's tool_calls,
    in files and saved datasets; `[]` (xlam-irrelevance: no call, and no answer given) leaves
    nothing to train, and an answer naming no tool of the row is its text."""
    import datasets

    tools = json.dumps([{"name": "lookup_order", "description": "Finds an order by its id."}])
    answers = json.dumps([{"name": "lookup_order", "arguments": {"order": 7}}] * 2)
    rows = [{"id": n, "query": "Where are orders 7?", "answers": answers, "tools": tools}
            for n in range(3)]  # fmt: skip
    none = {"id": 3, "query": "Sing.", "answers": "[]", "tools": tools}
    other = {"id": 4, "query": "Hi", "answers": '[{"name": "greet", "arguments": {}}]'}
    manifest = _expert(tmp_path, tiny_model_dir, [*rows, none, {**other, "tools": tools}])
    report = check_manifest(manifest)
    assert report.problems == []
    assert any('read as {"messages": "query", "response": "answers"}' in n for n in report.notes)
    text = _built_text(manifest, tmp_path / "model")
    assert text.count('<call lookup_order {"order": 7}><call lookup_order {"order": 7}>') == 3
    assert text.count("# Tools\nlookup_order") == 4  # the `[]` row dropped
    assert '<|im_start|>assistant\n[{"name": "greet"' in text  # not a call of its tools
    assert "Sing." not in text
    data = json.loads(manifest.read_text())
    data["training"]["dataset"]["path"] = "data/saved"
    manifest.write_text(json.dumps(data))
    datasets.Dataset.from_list(rows).save_to_disk(str(manifest.parent / "data" / "saved"))
    assert check_manifest(manifest).problems == []
    shutil.rmtree(manifest.parent / ".cache")
    built = _built_text(manifest, tmp_path / "model")
    assert built.count('<call lookup_order {"order": 7}><call lookup_order {"order": 7}>') == 3


def test_xlams_layout_is_read_beside_other_columns_as_before() -> None:
    """The xlam rule came before the conversation columns: a `messages` column beside
    question/answers/tools was left unread."""
    from expert_cli.data.fields import field_spec

    turns = frozenset({"messages"})
    spec = field_spec(None, ["messages", "question", "answers", "tools"], "f", turns)
    assert spec.mapping["messages"] == "messages" and "response" not in spec.mapping


def test_a_prompts_text_is_a_users_turn_even_when_it_looks_like_json() -> None:
    """A prompt beside a response that is JSON of a list of words was read as turns (and
    `[]` dropped the prompt); a tool named by an object crashed the row."""
    from expert_cli.data.fields import field_spec
    from expert_cli.data.values import check_row

    spec = field_spec(None, ["query", "answers", "tools"], "f")
    calls = '[{"name": "f", "arguments": {}}]'
    for query in ('["NYC", "LA"]', "[]", "[1, 2]"):
        row = check_row({"query": query, "answers": "x", "tools": None}, spec, "f:1")
        assert row["messages"][0] == {"role": "user", "content": query}
    odd = {"query": "q", "answers": calls, "tools": '[{"name": {"x": "f"}}]'}
    assert check_row(odd, spec, "f:1")["messages"][1] == {"role": "assistant", "content": calls}
    with pytest.raises(UserError, match="where a prompt's text or a list of messages is expected"):
        check_row({"query": None, "answers": "x"}, spec, "f:1")


def test_a_saved_datasets_bad_calls_of_every_form_are_named(tmp_path: Path) -> None:
    """Typed turns checked only ShareGPT's `function_call`: Locutusque's `function-call` and
    OpenAI's earlier `function_call` object passed, and the build dropped the turn."""
    import datasets

    from expert_cli.data.values import messages_problem

    bad = {"from": "function-call", "value": "not a call"}
    rows = [{"c": SHAREGPT}, {"c": None}, {"c": [SHAREGPT[0], bad, SHAREGPT[3]]}]
    assert messages_problem(datasets.Dataset.from_list(rows), "c") == (
        2,
        "item 1 is a function_call turn whose value is not a call, expected JSON text of "
        '{"name": "...", "arguments": {...}}, or of a list of such calls (arguments may be '
        "JSON text of an object)",
    )
    call = {"name": "f", "arguments": "{bad"}
    legacy = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "", "function_call": call},
    ]
    found = messages_problem(datasets.Dataset.from_list([{"m": legacy}]), "m")
    assert found is not None and found[0] == 0 and found[1].startswith("item 1 is a function_call")


def test_a_function_call_turn_left_is_refused_by_the_build(tiny_tokenizer) -> None:
    """A turn still of role function_call (a call that is not one, past the checks) is
    refused, never rendered without it by a template that skips the role."""
    tok = copy.deepcopy(tiny_tokenizer)
    tok.chat_template = KNOWN_ROLES
    left = [
        {"role": "user", "content": "q"},
        {"role": "function_call", "content": None},
        {"role": "assistant", "content": "a"},
    ]
    fmt = Formatter(tokenizer=tok, kind="messages", max_seq_length=512, overlong="truncate")
    (row,) = fmt({"messages": [json.dumps(left)]}).to_pylist()
    assert row["status"] == DROPPED_TEMPLATE
    assert row["refused"].startswith("its function_call turn is not a call")


def test_calls_written_as_text_that_is_not_json_are_noted(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    """Hermes' function-calling data writes each call as `<tool_call>` text of Python's quotes:
    trained as written, the model writes calls a JSON parser cannot read, without a word."""
    from expert_cli.data.answer_notes import text_calls_not_json

    hermes = "<tool_call>\n{'arguments': {'id': 7}, 'name': 'lookup_order'}\n</tool_call>"
    qwen = '<tool_call>\n{"name": "lookup_order", "arguments": {"id": 7}}\n</tool_call>'
    turns = [{"from": "human", "value": "Where is order 7?"}, {"from": "gpt", "value": hermes}]
    assert text_calls_not_json(standard_turns(turns))
    assert not text_calls_not_json([{"role": "assistant", "content": qwen}])
    assert not text_calls_not_json([{"role": "user", "content": hermes}])  # not an answer
    good = [{"conversations": [turns[0], {"from": "gpt", "value": qwen}]}] * 2
    manifest = _expert(tmp_path, tiny_model_dir, [{"conversations": turns}] * 3 + good)
    note = (
        "3 of 5 conversations hold an answer whose <tool_call> text is not JSON (Python's "
        "quotes, as Hermes' data writes them)"
    )
    assert any(n.startswith(note) for n in check_manifest(manifest).notes)
    built = run_here("pretokenize", "--manifest", str(manifest))
    assert built.returncode == 0 and note in " ".join(built.stdout.split()), built.stdout


# writes a tool's result inside its own tags, as Qwen3's template does
WRAPS_RESULTS = (
    "{%- for m in messages %}{%- if m.role == 'tool' %}"
    "{{ '<|im_start|>user\\n<tool_response>\\n' + m.content + '\\n</tool_response><|im_end|>\\n' }}"
    "{%- else %}{{ '<|im_start|>' + m.role + '\\n' + (m.content or '') + '<|im_end|>\\n' }}"
    "{%- endif %}{%- endfor %}"
)


def test_tool_results_in_the_templates_own_tags_are_noted(
    tmp_path: Path, tiny_model_dir: Path, tiny_tokenizer
) -> None:
    """Hermes' tool results come wrapped in <tool_response>, which Qwen3's template writes
    around each result again: prompts unlike those the model is given, without a word."""
    from expert_cli.data.answer_notes import result_wrapper

    tok = copy.deepcopy(tiny_tokenizer)
    tok.chat_template = WRAPS_RESULTS
    assert result_wrapper(tok) == "<tool_response>"
    tok.chat_template = CALLS  # writes a result as it is given
    assert result_wrapper(tok) is None
    wrapped = '<tool_response>\n{"status": "shipped"}\n</tool_response>'
    turns = [
        {"from": "human", "value": "Where is order 7?"},
        {"from": "gpt", "value": "Looking."},
        {"from": "tool", "value": wrapped},
        {"from": "gpt", "value": "Shipped."},
    ]
    plain = [*turns[:2], {**turns[2], "value": '{"status": "shipped"}'}, turns[3]]
    rows = [{"conversations": turns}] * 3 + [{"conversations": plain}] * 2
    manifest = _expert(tmp_path, tiny_model_dir, rows)
    (tmp_path / "model" / "chat_template.jinja").write_text(WRAPS_RESULTS)
    note = "3 of 5 conversations give tool results that open with <tool_response>, which the"
    assert any(n.startswith(note) for n in check_manifest(manifest).notes)
    built = run_here("pretokenize", "--manifest", str(manifest))
    assert built.returncode == 0 and note in " ".join(built.stdout.split()), built.stdout


@pytest.mark.parametrize("said", [[], {"a": 1}])
def test_a_turns_from_that_is_not_text_is_named_not_a_traceback(said) -> None:
    """Found by the data fuzzer: a `from` of a list was a TypeError (unhashable) where the
    turn's `from` was looked up among the call roles."""
    from expert_cli.data.fields import field_spec
    from expert_cli.data.values import check_row

    spec = field_spec(None, ["messages"], "f")
    with pytest.raises(UserError, match="item 0: role is an? (list|object), expected a string"):
        check_row({"messages": [{"from": said, "value": "x"}]}, spec, "f:1")


def test_a_saved_datasets_turns_whose_role_is_not_text_are_refused_by_type(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    """Typed turns whose `from` (or `role`) is a list or a number passed the column's check
    and were a traceback in check (a list in a turn's shape)."""
    import datasets

    manifest = _expert(tmp_path, tiny_model_dir, [{"conversations": SHAREGPT}])
    data = json.loads(manifest.read_text())
    data["training"]["dataset"]["path"] = "data/saved"
    manifest.write_text(json.dumps(data))
    turns = [{"from": ["human"], "value": "q"}, {"from": ["gpt"], "value": "a"}]
    datasets.Dataset.from_list([{"conversations": turns}] * 4).save_to_disk(
        str(manifest.parent / "data" / "saved")
    )
    (problem,) = check_manifest(manifest).problems
    assert (
        "field 'conversations' (field_mapping.messages) holds lists of objects with 'from' "
        "(lists of text), 'value' (text), expected" in problem
    )
    assert problem.endswith("in every row")


@pytest.mark.parametrize(
    ("calls", "kind"), [("call f", "a string"), ({"function": {"name": "f"}}, "an object")]
)
def test_tool_calls_that_are_not_a_list_are_named(calls, kind) -> None:
    """A turn's tool_calls given as text (or one call's object) was said as its content:
    "content is missing (null)"."""
    from expert_cli.data.values import _value_problem

    turns = [{"role": "user", "content": "q"}, {"role": "assistant", "content": None}]
    turns[1]["tool_calls"] = calls
    assert _value_problem("messages", turns) == (
        f"item 1: tool_calls is {kind}, expected a list of calls"
    )
    turns[1]["tool_calls"] = [{"type": "function", "function": {"name": "f", "arguments": {}}}]
    assert _value_problem("messages", turns) is None
