"""A conversation's `tools` column (TRL's and OpenAI's tool definitions): given to the chat
template, which writes them into the prompt. Before, the column was not read: a tool-calling
expert trained its calls without the definitions of the functions it called."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from conftest import write_jsonl
from train_helpers import run_here, write_expert

from expert_cli.data.fields import field_spec
from expert_cli.data.formatting import DROPPED_TEMPLATE, IGNORE, KEPT, Formatter
from expert_cli.data.tools import ONE_TOOL, TOOLS_SHAPE, parsed_tools, tools_text
from expert_cli.errors import UserError

# writes the tools into a system turn, as Qwen's, Llama's and Mistral's templates do
WITH_TOOLS = (
    "{%- if tools %}{{ '<|im_start|>system\\n# Tools\\n' }}{%- for t in tools %}"
    "{{ t.function.name }}: {{ t.function.description + '\\n' }}{%- endfor %}{{ '<|im_end|>\\n' }}"
    "{%- endif %}{%- for m in messages %}{{ '<|im_start|>' + m.role + '\\n' }}"
    "{{ m.content or '' }}{%- for c in m.tool_calls or [] %}<call {{ c.function.name }}>"
    "{%- endfor %}{{ '<|im_end|>\\n' }}{%- endfor %}"
)
# writes calls but no tool definitions
NO_TOOLS = (
    "{%- for m in messages %}{{ '<|im_start|>' + m.role + '\\n' }}{{ m.content or '' }}"
    "{%- for c in m.tool_calls or [] %}<call {{ c.function.name }}>{%- endfor %}"
    "{{ '<|im_end|>\\n' }}{%- endfor %}"
)
TOOL = {
    "type": "function",
    "function": {
        "name": "lookup_order",
        "description": "Finds an order by its id.",
        "parameters": {},
    },
}
USER = {"role": "user", "content": "Where is order 7?"}
CALL = {
    "role": "assistant",
    "content": None,
    "tool_calls": [{"type": "function", "function": {"name": "lookup_order", "arguments": "{}"}}],
}


def _format(tok, rows: dict) -> list[dict]:
    fmt = Formatter(tokenizer=tok, kind="messages", max_seq_length=512, overlong="truncate")
    return fmt(rows).to_pylist()


def _parts(tok, row: dict) -> tuple[str, str]:
    ids, labels = row["input_ids"], row["labels"]
    trained = [i for i, lab in zip(ids, labels, strict=True) if lab != IGNORE]
    return tok.decode(trained), tok.decode(ids)


def test_the_tools_are_in_the_prompt_and_not_trained(tiny_tokenizer) -> None:
    tok = copy.deepcopy(tiny_tokenizer)
    tok.chat_template = WITH_TOOLS
    rows = _format(
        tok, {"messages": [[USER, CALL], [USER, CALL]], "tools": [tools_text([TOOL]), None]}
    )
    assert [r["status"] for r in rows] == [KEPT, KEPT]
    trained, whole = _parts(tok, rows[0])
    assert "lookup_order: Finds an order by its id." in whole  # the definition, as context
    assert "Finds an order" not in trained and trained.startswith("<call lookup_order>")
    assert "# Tools" not in _parts(tok, rows[1])[1]  # a row without tools: none written
    assert _parts(tok, rows[1])[0] == trained  # the same answer trained either way


def test_a_template_that_leaves_the_tools_out_refuses_the_row(tiny_tokenizer) -> None:
    tok = copy.deepcopy(tiny_tokenizer)
    tok.chat_template = NO_TOOLS
    rows = _format(tok, {"messages": [[USER, CALL]] * 2, "tools": [tools_text([TOOL]), None]})
    assert [r["status"] for r in rows] == [DROPPED_TEMPLATE, KEPT]
    assert rows[0]["refused"] == "its tools are not rendered, roles user, assistant"


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ([TOOL], ([TOOL], None)),
        (json.dumps([TOOL]), ([TOOL], None)),  # Salesforce's xlam keeps them as JSON text
        (None, (None, None)),
        ([], (None, None)),
        (" ", (None, None)),
        ("null", (None, None)),
        (
            "[{",
            (
                None,
                f"is text that is not JSON; expected {TOOLS_SHAPE}",
            ),
        ),
        (
            TOOL,
            (
                None,
                f"is an object, expected {TOOLS_SHAPE}",
            ),
        ),
        (["lookup"], (None, f"item 0 is text that is not JSON, expected {ONE_TOOL}")),
        ([json.dumps(TOOL)], ([TOOL], None)),  # each tool's JSON text (When2Call's)
        (["[1]"], (None, f"item 0 is a list, expected {ONE_TOOL}")),
        (5, (None, f"is a number, expected {TOOLS_SHAPE}")),  # "is a int"
        ([2.5], (None, f"item 0 is a number, expected {ONE_TOOL}")),
    ],
)
def test_tools_are_a_list_of_objects_or_its_json_text(value, expected) -> None:
    assert parsed_tools(value) == expected


def test_the_tools_column_is_detected_beside_a_conversation_and_read_with_it_only() -> None:
    spec = field_spec(None, ["messages", "tools"], "f")
    assert spec.mapping == {"messages": "messages", "tools": "tools", "system": "system"}
    assert spec.maybe == {"tools", "system"}
    # a first row without the key (OpenAI's files leave it out): read where a later row has it
    assert field_spec(None, ["conversations"], "f").mapping == {
        "messages": "conversations",
        "tools": "tools",
        "system": "system",
    }
    with pytest.raises(
        UserError, match=r"`tools` .* is read with `messages` only.*\{\"messages\": <prompt>"
    ):
        field_spec({"text": "text", "tools": "tools"}, ["text", "tools"], "f")


def _tool_expert(tmp_path: Path, tiny_model_dir: Path, rows: list[dict]) -> Path:
    model = tmp_path / "model"
    if not model.exists():
        import shutil

        shutil.copytree(tiny_model_dir, model)
        (model / "chat_template.jinja").write_text(WITH_TOOLS)
    manifest = write_expert(tmp_path / "e", model, rows=1)
    data = json.loads(manifest.read_text())
    data["training"]["dataset"].pop("field_mapping")
    manifest.write_text(json.dumps(data))
    write_jsonl(manifest.parent / "data" / "train.jsonl", rows)
    return manifest


def _built_text(manifest: Path, model: Path) -> str:
    """The training split's examples as `pretokenize` built them, decoded."""
    import datasets
    from transformers import AutoTokenizer

    built = run_here("pretokenize", "--manifest", str(manifest))
    assert built.returncode == 0, built.stdout + built.stderr
    tok = AutoTokenizer.from_pretrained(model)
    (train,) = (manifest.parent / ".cache").rglob("train")
    return "".join(tok.decode(r) for r in datasets.load_from_disk(str(train))["input_ids"])


def test_a_tool_calling_file_trains_with_its_definitions(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    """`check` names the detected column; the cache's examples hold the definitions; a row
    whose tools are not a list is exit 2 naming the file, line and field."""
    from expert_cli.data.checks import check_manifest

    rows = [{"messages": [USER, CALL], "tools": [TOOL]}] * 6 + [{"messages": [USER, CALL]}] * 2
    manifest = _tool_expert(tmp_path, tiny_model_dir, rows)
    report = check_manifest(manifest)
    assert report.problems == []
    assert (
        'training.dataset.field_mapping: none given; read as {"messages": "messages"}; tools from '
        "'tools' and system from 'system' where a row has it (set it to read other columns)"
    ) in report.notes
    text = _built_text(manifest, tmp_path / "model")
    assert text.count("lookup_order: Finds an order by its id.") == 6
    (manifest.parent / "data" / "train.jsonl").write_text(
        json.dumps({"messages": [USER, CALL], "tools": {"name": "x"}}) + "\n"
    )
    bad = run_here("check", "--manifest", str(manifest))
    assert bad.returncode == 2
    assert "train.jsonl:1: field 'tools' (read as tools: set training.dataset.field_mapping" in (
        " ".join(bad.stdout.split())
    )


def test_a_saved_dataset_of_typed_tools_trains_with_them(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    """A hub or saved dataset holds its tools as Arrow structs (or JSON text): each row's
    become JSON text beside its conversation; check reads them row by row."""
    import datasets

    from expert_cli.data.checks import check_manifest

    manifest = _tool_expert(tmp_path, tiny_model_dir, [{"messages": [USER, CALL]}])
    saved = manifest.parent / "data" / "saved"
    rows = [{"messages": [USER, CALL], "tools": [TOOL]}] * 5
    datasets.Dataset.from_list(rows).save_to_disk(str(saved))
    data = json.loads(manifest.read_text())
    data["training"]["dataset"]["path"] = "data/saved"
    manifest.write_text(json.dumps(data))
    assert check_manifest(manifest).problems == []
    text = _built_text(manifest, tmp_path / "model")
    assert text.count("lookup_order: Finds an order by its id.") == 5
    # JSON text that is not tools: the row named, before anything is built
    bad = [{"messages": [USER, CALL], "tools": "[{"}]
    datasets.Dataset.from_list(bad * 3).save_to_disk(str(manifest.parent / "data" / "bad"))
    data["training"]["dataset"]["path"] = "data/bad"
    manifest.write_text(json.dumps(data))
    assert (
        check_manifest(manifest)
        .problems[0]
        .endswith(
            "row 1: field 'tools' (read as tools: set training.dataset.field_mapping to leave it "
            "out) is text that is not JSON; expected "
            f"{TOOLS_SHAPE}"
        )
    )


def test_arrows_fill_ins_are_not_part_of_a_tool(tmp_path: Path) -> None:
    """Arrow gives each tool of a typed column every key any tool has, null where it has
    none: a template writing `tool | tojson` showed the model parameters of other tools."""
    import datasets

    from expert_cli.data.dataset_rows import as_text

    def tool(name: str, parameter: str) -> dict:
        return {"type": "function", "function": {"name": name, "parameters": {parameter: 1}}}

    rows = [
        {"messages": [USER, CALL], "tools": [tool("lookup_order", "order_id")]},
        {"messages": [USER, CALL], "tools": [tool("cancel_order", "reason")]},
    ]
    ds = datasets.Dataset.from_list(rows)
    assert ds[0]["tools"][0]["function"]["parameters"] == {"order_id": 1, "reason": None}
    stored = as_text(ds, tmp_path / "work")
    assert [json.loads(t) for t in stored["tools"]] == [r["tools"] for r in rows]
    assert parsed_tools([{"name": "f", "strict": None}], typed=True) == ([{"name": "f"}], None)


def test_a_tools_own_null_is_kept_where_no_fill_in_can_be(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    """A parameter's `"default": null` was dropped with Arrow's fill-ins from every source:
    a JSON file's tools and JSON text (xlam's) hold no fill-ins, so they keep it as written."""
    default = {"type": "string", "default": None}
    own = {**TOOL, "function": {**TOOL["function"], "parameters": {"note": default}}}
    assert parsed_tools([own]) == ([own], None)
    assert parsed_tools(json.dumps([own]), typed=True) == ([own], None)  # text: as written
    rows = [{"messages": [USER, CALL], "tools": [own]}] * 2
    manifest = _tool_expert(tmp_path, tiny_model_dir, rows)
    (tmp_path / "model" / "chat_template.jinja").write_text(
        WITH_TOOLS.replace("{{ t.function.description + '\\n' }}", "{{ t | tojson }}")
    )
    text = _built_text(manifest, tmp_path / "model")
    assert text.count('"default": null') == 2


BARE = {"name": "lookup_order", "parameters": {}}  # xlam's and Glaive's layout: no `function`


def test_check_and_the_build_agree_on_tools_of_one_count_and_two_layouts(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    """check remembered a template's verdict by the number of tools: rows of bare tools after
    rows of OpenAI's were called usable (the build dropped them), and the other way round
    every row was called refused (the build kept most)."""
    from expert_cli.data.checks import check_manifest

    good = {"messages": [USER, CALL], "tools": [TOOL]}
    bare = {"messages": [USER, CALL], "tools": [BARE]}
    manifest = _tool_expert(tmp_path, tiny_model_dir, [good] * 5 + [bare] * 5)
    report = check_manifest(manifest)
    assert report.problems == []
    (refused,) = [n for n in report.notes if "refused by the tokenizer's chat template" in n]
    assert "5 of 10 conversations are refused and train drops them" in refused
    (manifest.parent / "data" / "train.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in [bare] + [good] * 9)
    )
    report = check_manifest(manifest)
    assert report.problems == []
    assert any("1 of 10 conversations are refused" in n for n in report.notes)


def test_tools_after_a_first_row_without_them_are_read(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    """OpenAI's files leave `tools` out of a row without any: detected from a first row of
    plain chat, no later row's tools were read."""

    rows = [{"messages": [USER, CALL]}] + [{"messages": [USER, CALL], "tools": [TOOL]}] * 4
    manifest = _tool_expert(tmp_path, tiny_model_dir, rows)
    text = _built_text(manifest, tmp_path / "model")
    assert text.count("lookup_order: Finds an order by its id.") == 4


def test_each_tools_json_text_in_a_list_is_read(tmp_path: Path, tiny_model_dir: Path) -> None:
    """When2Call's tools: a list holding each tool's JSON text. It was exit 2 from a file
    ("item 0 is text") and from a saved dataset (a typed list of strings); each is now read,
    and a text that is not JSON is named by row and item."""
    import datasets

    from expert_cli.data.checks import check_manifest

    rows = [{"messages": [USER, CALL], "tools": [json.dumps(TOOL)]}] * 3
    manifest = _tool_expert(tmp_path, tiny_model_dir, rows)
    assert check_manifest(manifest).problems == []
    text = _built_text(manifest, tmp_path / "model")
    assert text.count("lookup_order: Finds an order by its id.") == 3
    datasets.Dataset.from_list(rows).save_to_disk(str(manifest.parent / "data" / "saved"))
    data = json.loads(manifest.read_text())
    data["training"]["dataset"]["path"] = "data/saved"
    manifest.write_text(json.dumps(data))
    assert check_manifest(manifest).problems == []
    bad = [*rows, {"messages": [USER, CALL], "tools": ["lookup_order(id)"]}]
    datasets.Dataset.from_list(bad).save_to_disk(str(manifest.parent / "data" / "bad"))
    data["training"]["dataset"]["path"] = "data/bad"
    manifest.write_text(json.dumps(data))
    (problem,) = check_manifest(manifest).problems
    assert problem.endswith(
        "row 4: field 'tools' (read as tools: set training.dataset.field_mapping to leave it out) "
        "item 0 is text that is not JSON, expected an object (a tool's definition) or its JSON "
        "text"
    )
    assert parsed_tools([json.dumps(TOOL), TOOL]) == ([TOOL, TOOL], None)


def test_a_mapping_that_leaves_the_tools_out_says_so(tmp_path: Path, tiny_model_dir: Path) -> None:
    """A manifest's own `{"messages": "messages"}` reads no `tools`: the tool calls trained
    without their definitions, and nothing said so. Now check and the build note it, from a
    JSON file's first row and from a Parquet file's schema (which the mapped columns alone
    are read of); mapping `tools` reads them, and says nothing."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from expert_cli.data.checks import check_manifest
    from expert_cli.data.fields import unread_words

    rows = [{"messages": [USER, CALL], "tools": [TOOL]}] * 3
    manifest = _tool_expert(tmp_path, tiny_model_dir, rows)
    data = json.loads(manifest.read_text())
    data["training"]["dataset"]["field_mapping"] = {"messages": "messages"}
    manifest.write_text(json.dumps(data))
    note = (
        "training.dataset.field_mapping: the data's `tools` column (tool definitions) is not "
        'mapped, so the chat template is not given them; add "tools": "tools" to train the '
        "tool calls with their definitions"
    )
    assert unread_words(field_spec({"messages": "messages"}, ["messages", "tools"], "")) == note
    assert note in check_manifest(manifest).notes
    # OpenAI's files leave the key out of a row without tools: seen in a later row too
    write_jsonl(manifest.parent / "data" / "train.jsonl", [{"messages": [USER, CALL]}, *rows])
    assert note in check_manifest(manifest).notes
    built = run_here("pretokenize", "--manifest", str(manifest))
    assert built.returncode == 0 and note in " ".join(built.stdout.split())
    typed = [{"messages": [USER, CALL], "tools": json.dumps([TOOL])}] * 3  # as xlam's
    pq.write_table(pa.Table.from_pylist(typed), manifest.parent / "data" / "train.parquet")
    data["training"]["dataset"].update(path="data/train.parquet", format="parquet")
    manifest.write_text(json.dumps(data))
    assert note in check_manifest(manifest).notes
    data["training"]["dataset"]["field_mapping"]["tools"] = "tools"
    manifest.write_text(json.dumps(data))
    report = check_manifest(manifest)
    assert report.problems == [] and note not in report.notes


def test_tools_beside_instruction_data_are_noted_unread() -> None:
    """Salesforce's xlam rows (`query`, `answers`, `tools` as JSON text) mapped as instruction
    data: the tools cannot be given to a prompt template, and nothing said so."""
    from expert_cli.data.fields import unread_words

    mapping = {"instruction": "query", "response": "answers"}
    note = unread_words(field_spec(mapping, ["query", "answers", "tools"], "f"))
    assert note == (
        "training.dataset.field_mapping: the data's `tools` column (tool definitions) is not "
        "read: instruction data is not laid out by a chat template, which is what writes tools "
        "into a prompt; to train tool calls with their definitions, write each row as "
        "`messages` (a call as an assistant turn's `tool_calls`) with `tools` beside it"
    )
    assert unread_words(field_spec(mapping, ["query", "answers"], "f")) is None


def test_tools_left_unread_in_any_source_are_noted(tmp_path: Path) -> None:
    """The note came from the last source alone: a multi_task expert whose first task held
    xlam's tools and whose second did not said nothing (the other order did)."""
    from expert_cli.config import load_manifest
    from expert_cli.config.environment import cpu_environment
    from expert_cli.config.resolve import resolve
    from expert_cli.data.source_set import load_sources

    write_jsonl(tmp_path / "a.jsonl", [{"question": "q", "answer": "a", "tools": "[]"}] * 4)
    write_jsonl(tmp_path / "b.jsonl", [{"question": "q", "answer": "a"}] * 4)
    for order in (("a", "b"), ("b", "a")):
        tasks = {name: {"train": f"{name}.jsonl"} for name in order}
        manifest = {
            "name": "t",
            "schema_version": "1.0",
            "base_model": {"name": "model"},
            "training": {"dataset": {"type": "multi_task", "tasks": tasks}},
        }
        (tmp_path / "manifest.json").write_text(json.dumps(manifest))
        resolved = resolve(load_manifest(tmp_path / "manifest.json"), cpu_environment())
        notes = load_sources(resolved, tmp_path / f".ds-{order[0]}").notes
        assert sum("`tools` column (tool definitions) is not read" in n for n in notes) == 1


def test_check_says_what_to_do_where_the_template_writes_no_tools(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    """Under a template that writes no tools at all (the demo's ChatML one), check asked to
    "fix the tools' layout", which no layout can."""
    from expert_cli.data.checks import check_manifest

    rows = [{"messages": [USER, CALL], "tools": [TOOL]}] * 3
    manifest = _tool_expert(tmp_path, tiny_model_dir, rows)
    (tmp_path / "model" / "chat_template.jinja").write_text(NO_TOOLS)
    (problem,) = check_manifest(manifest).problems
    assert problem.endswith(
        "(its tools are not rendered, roles user, assistant); it refuses every one of the 3 "
        "training conversations, so train would have nothing to train on: fix the tools' "
        "layout (or leave the tools unmapped, where the template writes none), or use a base "
        "model whose template takes them"
    ), problem
