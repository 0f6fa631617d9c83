"""Reading sources: bad files name the file, line and field; weights and hold-out are seeded."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from expert_cli.config import load_manifest
from expert_cli.config.environment import cpu_environment
from expert_cli.config.resolve import SourceRef, resolve
from expert_cli.data.fields import field_spec
from expert_cli.data.rows import source_files
from expert_cli.data.source_set import load_sources
from expert_cli.data.splits import apply_weight, hold_out
from expert_cli.errors import UserError


def resolved_for(folder: Path, dataset: dict, **config):
    manifest = {
        "name": "t",
        "schema_version": "1.0",
        "base_model": {"name": "model"},
        "training": {"dataset": dataset, "config": config},
    }
    path = folder / "manifest.json"
    path.write_text(json.dumps(manifest))
    return resolve(load_manifest(path), cpu_environment())


def load(folder: Path, dataset: dict, **config):
    return load_sources(resolved_for(folder, dataset, **config), folder / ".ds")


def error_of(folder: Path, dataset: dict) -> str:
    with pytest.raises(UserError) as info:
        load(folder, dataset)
    return "\n".join(info.value.lines)


def test_malformed_json_line_is_named(tmp_path, write_jsonl) -> None:
    path = write_jsonl(tmp_path / "train.jsonl", [{"text": "a"}, {"text": "b"}])
    path.write_text(path.read_text() + '{"text": "c"\n')
    msg = error_of(tmp_path, {"path": "train.jsonl"})
    assert msg.startswith(f"{path}:3: invalid JSON")


def test_missing_field_names_line_and_mapping(tmp_path, write_jsonl) -> None:
    path = write_jsonl(tmp_path / "train.jsonl", [{"body": "a"}, {"other": "b"}])
    msg = error_of(tmp_path, {"path": "train.jsonl", "field_mapping": {"text": "body"}})
    assert msg == f"{path}:2: field 'body' missing (field_mapping.text); this row has 'other'"
    # present but null: it said "missing" of a field the row has
    path = write_jsonl(tmp_path / "train.jsonl", [{"body": "a"}, {"body": None}])
    msg = error_of(tmp_path, {"path": "train.jsonl", "field_mapping": {"text": "body"}})
    assert (
        msg
        == f"{path}:2: field 'body' is empty (null), where text is expected (field_mapping.text)"
    )


def test_a_given_input_or_system_column_that_no_row_holds_is_refused(tmp_path, write_jsonl) -> None:
    """A misspelt `input` or `system` column (optional: a row may lack it) was left out of
    every example in silence; one that some rows hold still trains them as they are."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [{"q": "a", "ctx": "c", "a": "x"}, {"q": "b", "a": "y"}]
    path = write_jsonl(tmp_path / "train.jsonl", rows)
    given = {"instruction": "q", "input": "contxt", "response": "a"}
    msg = error_of(tmp_path, {"path": "train.jsonl", "field_mapping": given})
    assert msg == (
        f"{path}: field 'contxt' (field_mapping.input) is in no row; check the column's name, "
        "or remove it from field_mapping"
    )
    some = {"instruction": "q", "input": "ctx", "response": "a", "system": "sys"}
    assert "field 'sys' (field_mapping.system) is in no row" in error_of(
        tmp_path, {"path": "train.jsonl", "field_mapping": some}
    )
    del some["system"]
    assert load(tmp_path, {"path": "train.jsonl", "field_mapping": some})  # ctx in one row
    pq.write_table(pa.Table.from_pylist([{"q": "a", "a": "x"}]), tmp_path / "t.parquet")
    assert "field 'contxt' (field_mapping.input) is in no row" in error_of(
        tmp_path, {"path": "t.parquet", "field_mapping": given}
    )


def test_field_of_the_wrong_type_names_line_and_mapping(tmp_path, write_jsonl) -> None:
    """A number or a list where text belongs would be str()-ed and trained on silently."""
    path = write_jsonl(tmp_path / "train.jsonl", [{"text": "a"}, {"text": ["b"]}])
    msg = error_of(tmp_path, {"path": "train.jsonl", "field_mapping": {"text": "text"}})
    assert msg == f"{path}:2: field 'text' (field_mapping.text) is a list, expected a string"
    path = write_jsonl(tmp_path / "m.jsonl", [{"messages": "hello"}])
    msg = error_of(tmp_path, {"path": "m.jsonl", "field_mapping": {"messages": "messages"}})
    assert msg.startswith(
        f"{path}:1: field 'messages' (field_mapping.messages) is text that is not JSON of a "
        "list of turns, expected a list of"
    )


def test_a_lone_surrogate_names_line_field_and_place(tmp_path) -> None:
    """JSON's `\\ud800` escape decodes to a string Arrow cannot write as UTF-8: the row check
    (shared by `check` and the build) refuses it, in optional roles and chat turns too; a
    surrogate pair is a character like any other."""
    path = tmp_path / "train.jsonl"
    rows = [
        {"q": "\U0001f600 pair", "a": "\u00e9t\u00e9", "i": "\ud83d\ude00"},
        {"q": "q", "a": "a", "i": "ab\udc80"},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="ascii")
    assert json.loads(path.read_text().splitlines()[0])["i"] == "\U0001f600"
    mapping = {"instruction": "q", "response": "a", "input": "i"}
    msg = error_of(tmp_path, {"path": "train.jsonl", "field_mapping": mapping})
    assert msg == (
        f"{path}:2: field 'i' (field_mapping.input) contains a lone surrogate at character 2 "
        "(a \\ud800-\\udfff escape without its pair); expected valid Unicode text"
    )
    turns = [{"role": "user", "content": "x"}, {"role": "assistant\ud800", "content": "y"}]
    path.write_text(json.dumps({"messages": turns}) + "\n", encoding="ascii")
    msg = error_of(tmp_path, {"path": "train.jsonl"})
    assert msg.startswith(
        f"{path}:1: field 'messages' (field_mapping.messages) item 1: role contains a lone "
        "surrogate at character 9"
    )
    assert not list(tmp_path.glob(".ds/*"))  # nothing written before the row was checked


def test_a_field_given_twice_in_a_row_is_refused(tmp_path) -> None:
    """`{"text": "a", "text": "b"}` (a bad merge of two files, a hand edit) was read as its
    last value without a word, as was a CSV or Parquet file with two columns of one name.
    A field the run trains on, given twice, is now named; a repeated field it does not use,
    or one inside a value, is read as before."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    twice = "is given more than once in this row; expected once (which value to train on"
    path = tmp_path / "train.jsonl"
    path.write_text('{"text": "a", "id": 1, "id": 2}\n{"text": "b", "meta": {"k": 1, "k": 2}}\n')
    assert load(tmp_path, {"path": "train.jsonl"}).read["train"] == 2  # fields it does not use
    path.write_text('{"text": "a"}\n{"text": "b",\n "text": "c"}\n')
    assert error_of(tmp_path, {"path": "train.jsonl"}).startswith(
        f"{path}:2: field 'text' (field_mapping.text) {twice}"
    )
    turn = '{"role": "user", "content": "a", "content": "b"}'
    path.write_text('{"messages": [{"role": "user", "content": "x"}, ' + turn + "]}\n")
    assert error_of(tmp_path, {"path": "train.jsonl"}).startswith(
        f"{path}:1: field 'messages' (field_mapping.messages) item 1: content {twice}"
    )
    turn = '{"role": "assistant", "content": "a", "name": "x", "name": "y"}'
    path.write_text('{"messages": [{"role": "user", "content": "x"}, ' + turn + "]}\n")
    assert f"item 1: name {twice}" in error_of(tmp_path, {"path": "train.jsonl"})
    parts = '[{"type": "text", "text": "a", "text": "b"}]'
    path.write_text('{"messages": [{"role": "user", "content": ' + parts + "}]}\n")
    assert f"item 0: content part 0: text {twice}" in error_of(tmp_path, {"path": "train.jsonl"})
    csv_path = tmp_path / "train.csv"
    csv_path.write_text("text,text,x\na,b,1\n")
    assert error_of(tmp_path, {"path": "train.csv", "field_mapping": {"text": "text"}}).startswith(
        f"{csv_path}: row 1: field 'text' (field_mapping.text) {twice}"
    )
    csv_path.write_text("text,x,x\na,1,2\n")
    assert load(tmp_path, {"path": "train.csv", "field_mapping": {"text": "text"}}).read["train"]
    parquet = tmp_path / "train.parquet"
    table = pa.Table.from_arrays([pa.array(["a"]), pa.array(["b"])], names=["text", "text"])
    pq.write_table(table, parquet)
    assert error_of(tmp_path, {"path": "train.parquet"}).startswith(
        f"{parquet}: row 1: field 'text' (field_mapping.text) {twice}"
    )


def test_column_of_the_wrong_type_in_parquet(tmp_path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "train.parquet"
    pq.write_table(pa.table({"q": ["x", "y"], "a": [1, 2]}), path)
    msg = error_of(
        tmp_path, {"path": "train.parquet", "field_mapping": {"instruction": "q", "response": "a"}}
    )
    assert (
        msg == f"{path}: row 1: field 'a' (field_mapping.response) is a number, expected a string"
    )
    pq.write_table(pa.table({"q": pa.array([b"x", b"y"]), "a": ["y", "z"]}), path)
    msg = error_of(
        tmp_path, {"path": "train.parquet", "field_mapping": {"instruction": "q", "response": "a"}}
    )  # was "is a bytes"
    assert msg == (
        f"{path}: row 1: field 'q' (field_mapping.instruction) is binary data (bytes, not text), "
        "expected a string"
    )
    pq.write_table(pa.table({"q": ["x"], "a": ["y"], "i": pa.array([None], pa.null())}), path)
    mapping = {"instruction": "q", "response": "a", "input": "i"}  # an all-null optional role
    assert len(load(tmp_path, {"path": "train.parquet", "field_mapping": mapping}).train) == 1
    pq.write_table(pa.table({"messages": [[{"role": "user", "content": "x"}]]}), path)
    assert len(load(tmp_path, {"path": "train.parquet"}).train) == 1


def test_null_field_in_csv_names_the_row(tmp_path) -> None:
    path = tmp_path / "train.csv"
    path.write_text("text,x\nhello,1\n,2\n")
    msg = error_of(tmp_path, {"path": "train.csv", "field_mapping": {"text": "text"}})
    expected = "field 'text' is empty (null), where text is expected (field_mapping.text)"
    assert msg == f"{path}: row 2: {expected}"


def test_column_missing_in_parquet(tmp_path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "train.parquet"
    pq.write_table(pa.table({"body": ["x", "y"]}), path)
    msg = error_of(tmp_path, {"path": "train.parquet", "field_mapping": {"text": "text"}})
    assert msg == f"{path}: row 1: field 'text' missing (field_mapping.text); this row has 'body'"


def test_a_column_only_a_later_parquet_file_holds_is_detected(tmp_path) -> None:
    """The mapping was detected from the first file's schema alone: an `input` only a later
    file of the folder holds was taken as lacked by the whole source, so check did not say it
    is read where a row has it."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "data").mkdir()
    plain = [{"instruction": f"q{i}", "output": f"a{i}"} for i in range(3)]
    pq.write_table(pa.Table.from_pylist(plain), tmp_path / "data" / "a.parquet")
    more = [{**row, "input": f"context {i}"} for i, row in enumerate(plain)]
    pq.write_table(pa.Table.from_pylist(more), tmp_path / "data" / "b.parquet")
    loaded = load(tmp_path, {"path": "data", "format": "parquet"})
    assert loaded.fields.mapping["input"] == "input" and "input" in loaded.fields.maybe
    assert loaded.fields.lacked == frozenset({"system"})  # no file holds it
    inputs = list(loaded.train["input"]) + (list(loaded.eval["input"]) if loaded.eval else [])
    assert sorted(t for t in inputs if t) == ["context 0", "context 1", "context 2"]


def test_empty_file_and_missing_file(tmp_path) -> None:
    (tmp_path / "train.jsonl").write_text("\n")
    assert (
        error_of(tmp_path, {"path": "train.jsonl"})
        == f"{tmp_path / 'train.jsonl'}: no examples (the file has no rows)"
    )
    assert (
        error_of(tmp_path, {"path": "nope.jsonl"})
        == f"{tmp_path / 'nope.jsonl'}: not found (training.dataset.path)"
    )
    tasks = {"type": "multi_task", "tasks": {"a": {"train": "train.jsonl", "valid": "v.jsonl"}}}
    (tmp_path / "train.jsonl").write_text('{"text": "x"}\n{"text": "y"}\n')
    assert (
        error_of(tmp_path, tasks)
        == f"{tmp_path / 'v.jsonl'}: not found (training.dataset.tasks.a.valid)"
    )


def test_undetectable_mapping(tmp_path, write_jsonl) -> None:
    write_jsonl(tmp_path / "train.jsonl", [{"a": 1}])
    assert "set training.dataset.field_mapping" in error_of(tmp_path, {"path": "train.jsonl"})


def test_field_mapping_detection_and_validation() -> None:
    assert field_spec(None, ["question", "answer", "output"], "f").mapping == {
        "instruction": "question",
        "response": "output",
        "input": "input",
        "system": "system",
    }
    assert field_spec(None, ["messages"], "f").kind == "messages"
    # GSM8K's question/answer and MetaMathQA's query/response (they asked for a mapping)
    for columns, pair in ((["question", "answer"], ("question", "answer")),
                          (["query", "response", "type"], ("query", "response"))):  # fmt: skip
        mapping = field_spec(None, columns, "f").mapping
        assert (mapping["instruction"], mapping["response"]) == pair
    # Dolly's context is its input (it was left out of every prompt without a word)
    dolly = ["instruction", "context", "response", "category"]
    assert field_spec(None, dolly, "f").mapping["input"] == "context"
    # OpenOrca's system_prompt is its system turn (left out the same way)
    orca = ["id", "system_prompt", "question", "response"]
    assert field_spec(None, orca, "f").mapping["system"] == "system_prompt"
    # tatsu-lab/alpaca's rendered text beside its instruction and output: the pair, whose
    # answers alone are trained (the text trained its prompts too); a conversation likewise
    alpaca = ["instruction", "input", "output", "text"]
    assert field_spec(None, alpaca, "f").mapping["response"] == "output"
    assert field_spec(None, ["text", "messages"], "f").kind == "messages"
    with pytest.raises(UserError) as info:  # half a pair: the mapping to give names it
        field_spec(None, ["prompt", "answers"], "f")
    assert info.value.lines[0].endswith(
        'e.g. {"instruction": "prompt", "response": "<column>"} (no response column was found)'
    )
    with pytest.raises(UserError, match="a `history` column beside 'instruction' and 'output'"):
        field_spec(None, ["instruction", "input", "output", "system", "history"], "f")
    # preference pairs (TRL's DPO data): "cannot tell which column" became how to train them
    with pytest.raises(UserError) as info:
        field_spec(None, ["prompt", "chosen", "rejected"], "f")
    assert info.value.lines == [
        "f: preference pairs (columns 'chosen' and 'rejected', for DPO-style training); "
        "expert-cli trains on answers: set training.dataset.field_mapping to train the preferred "
        'ones, e.g. {"instruction": "prompt", "response": "chosen"}, or {"messages": "chosen"} '
        "where each holds a whole conversation"
    ]
    with pytest.raises(UserError, match=r'e.g. \{"messages": "chosen"\} where'):
        field_spec(None, ["chosen", "rejected"], "f")
    pku = ["prompt", "response_0", "response_1", "safer_response_id", "better_response_id"]
    with pytest.raises(UserError, match="keep the preferred one of each row in one column"):
        field_spec(None, pku, "f")  # "no response column was found" suggested response_0
    # glaive-function-calling-v2: "cannot tell which column", e.g. {"text": ...}, which would
    # train its user turns and function results as well
    with pytest.raises(UserError, match="Glaive's function-calling layout: USER:, ASSISTANT:"):
        field_spec(None, ["system", "chat"], "f")
    # beside a conversation (HuggingFaceH4/ultrafeedback_binarized) or an answer: read as before
    h4 = ["prompt", "prompt_id", "chosen", "rejected", "messages", "score_chosen"]
    assert field_spec(None, h4, "f").mapping == {
        "messages": "messages",
        "tools": "tools",
        "system": "system",
    }
    assert field_spec(None, ["prompt", "response", "chosen", "rejected"], "f").kind == "instruction"
    with pytest.raises(UserError, match="OpenAssistant's message trees"):  # trained whole
        field_spec(None, ["message_id", "parent_id", "text", "role", "lang"], "f")
    with pytest.raises(UserError, match="unknown key"):
        field_spec({"txt": "a"}, ["a"], "f")


def test_input_and_system_are_read_where_the_first_row_lacks_them(tmp_path, write_jsonl) -> None:
    """The mapping was detected from a JSONL file's first row: a later row's `input` or
    `system` was dropped without a word (the Parquet copy of the same rows kept them). A hub
    or saved dataset without those columns reads them as empty."""
    import datasets

    rows = [
        {"instruction": "Say hi", "output": "hi"},
        {"instruction": "Translate", "input": "bonjour", "output": "hello"},
        {"instruction": "Greet", "output": "hey", "system": "Be kind."},
    ]
    write_jsonl(tmp_path / "train.jsonl", rows)
    loaded = load(tmp_path, {"path": "train.jsonl"})
    assert loaded.fields.kind == "instruction"
    read = [*loaded.train, *(loaded.eval or [])]  # wherever the held-out example went
    assert {r["instruction"]: (r["input"], r["system"]) for r in read} == {
        "Say hi": (None, None),
        "Translate": ("bonjour", None),
        "Greet": (None, "Be kind."),
    }
    saved = tmp_path / "saved"
    datasets.Dataset.from_list([{"instruction": "a", "output": "b"}]).save_to_disk(str(saved))
    loaded = load(tmp_path, {"path": "saved"})
    assert loaded.train.column_names == ["instruction", "response", "input", "system"]
    assert loaded.train[0] == {"instruction": "a", "response": "b", "input": None, "system": None}


def test_a_detected_column_of_the_wrong_type_says_how_to_leave_it_out(
    tmp_path, write_jsonl
) -> None:
    """A detected `system` column that holds no text named field_mapping.system, which the
    user never wrote."""
    write_jsonl(tmp_path / "train.jsonl", [{"instruction": "q", "output": "a", "system": 3}])
    said = error_of(tmp_path, {"path": "train.jsonl"})
    assert (
        "field 'system' (read as system: set training.dataset.field_mapping to leave it out)"
        in said
    )


@pytest.mark.parametrize(
    ("mapping", "said"),
    [
        ({"text": "text", "response": "answer"}, "`text` holds the whole example, so `response`"),
        ({"messages": "messages", "input": "sys"}, "holds the whole conversation, so `input`"),
        (  # passed check and built: the answer was its own prompt, trained to be repeated
            {"instruction": "text", "response": "text"},
            "`instruction` and `response` both name the column 'text'; each role reads",
        ),
        ({"instruction": "q", "input": "q", "response": "a"}, "`instruction` and `input` both"),
    ],
)
def test_roles_that_would_not_be_used_are_refused(mapping: dict, said: str) -> None:
    """`text` with `response`: the response was required in every row, then never trained
    (only the text was); `messages` with `input`: the input was dropped (a `system` beside it
    is its system turn: tests/data/test_completions.py)."""
    with pytest.raises(UserError) as info:
        field_spec(mapping, [], "f")
    assert said in info.value.lines[0] and "field_mapping" in info.value.lines[0]


def test_columns_renamed_to_roles_and_seeded_holdout(tmp_path, write_jsonl) -> None:
    write_jsonl(tmp_path / "train.jsonl", [{"q": f"q{i}", "a": f"a{i}"} for i in range(50)])
    dataset = {
        "path": "train.jsonl",
        "field_mapping": {"instruction": "q", "response": "a"},
        "eval_fraction": 0.1,
    }
    first = load(tmp_path, dataset, seed=3)
    again = load(tmp_path, dataset, seed=3)
    assert first.fields.kind == "instruction"
    assert first.train.column_names == ["instruction", "response"]
    assert (len(first.train), len(first.eval)) == (45, 5)
    assert list(first.eval["instruction"]) == list(again.eval["instruction"])
    assert first.read == {"train": 50, "eval": 0}
    # the held-out examples follow eval_seed, not the training seed: a seed sweep is
    # evaluated on the same examples
    assert list(load(tmp_path, dataset, seed=4).eval["instruction"]) == list(
        first.eval["instruction"]
    )
    other = load(tmp_path, {**dataset, "eval_seed": 4}, seed=3)
    assert list(other.eval["instruction"]) != list(first.eval["instruction"])
    every = [*first.train["instruction"], *first.eval["instruction"]]
    assert sorted([*other.train["instruction"], *other.eval["instruction"]]) == sorted(every)


@pytest.mark.parametrize("name", ["eval_fraction", "validation_split"])
def test_nothing_is_held_out_when_nothing_is_evaluated(tmp_path, write_jsonl, name) -> None:
    """evaluation_strategy "no" with a fraction to hold out: those examples were neither
    trained nor evaluated, said only by "20 read (16 to train on)"."""
    write_jsonl(tmp_path / "train.jsonl", [{"text": f"t{i}"} for i in range(20)])
    dataset = {"path": "train.jsonl", name: 0.2}
    resolved = resolved_for(tmp_path, dataset, evaluation_strategy="no")
    assert resolved.eval_fraction == 0.0 and resolved.evaluation_strategy == "no"
    assert any(n.startswith(f"training.dataset.{name}: not used") for n in resolved.notes)
    loaded = load(tmp_path, dataset, evaluation_strategy="no")
    assert (len(loaded.train), loaded.eval) == (20, None)
    assert len(load(tmp_path, dataset).train) == 16  # evaluated: held out as asked


def test_a_folder_of_split_files_trains_on_its_training_files(tmp_path, write_jsonl) -> None:
    """The folder `hf download --local-dir` makes (data/train-*.parquet beside
    data/test-*.parquet), which the hub error tells users to name: every split was read, so
    the test rows were trained on. The same folder as validation_path reads the test files;
    a validation file in the training folder under another name is noted."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    data = tmp_path / "data"
    data.mkdir()
    for split, n in (("train", 6), ("test", 3)):
        table = pa.table({"text": [f"{split} {i}" for i in range(n)]})
        pq.write_table(table, data / f"{split}-00000-of-00001.parquet")
    dataset = {"path": "data", "eval_fraction": 0.0}
    resolved = resolved_for(tmp_path, dataset)
    assert resolved.notes[0] == (
        "training.dataset.path: 1 file(s) of a held-out split are left out of training "
        "(test-00000-of-00001.parquet)"
    )
    loaded = load(tmp_path, dataset, evaluation_strategy="no")
    assert sorted(loaded.train["text"]) == [f"train {i}" for i in range(6)]
    loaded = load(tmp_path, {"path": "data", "validation_path": "data"})
    assert sorted(loaded.eval["text"]) == [f"test {i}" for i in range(3)]
    assert not any(
        "also read for training" in n
        for n in resolved_for(tmp_path, {"path": "data", "validation_path": "data"}).notes
    )
    write_jsonl(data / "holdout.jsonl", [{"text": "h"}])
    notes = resolved_for(tmp_path, {"path": "data", "validation_path": "data/holdout.jsonl"}).notes
    assert any(
        n.startswith("training.dataset.validation_path: ") and "also read for training" in n
        for n in notes
    )
    (data / "holdout.jsonl").unlink()
    pq.write_table(pa.table({"text": ["v"]}), data / "validation-0.parquet")
    pq.write_table(pa.table({"text": ["e"]}), data / "evaluation-0.parquet")  # the Hub's test
    notes = resolved_for(tmp_path, {"path": "data", "validation_path": "data"}).notes
    assert notes[0].startswith("training.dataset.path: 3 file(s) of a held-out split")
    assert notes[1] == (
        "training.dataset.validation_path: 2 file(s) of another split are left out of "
        "evaluation (evaluation-0.parquet, test-00000-of-00001.parquet)"
    )
    assert list(load(tmp_path, {"path": "data", "validation_path": "data"}).eval["text"]) == ["v"]
    for name in ("train-00000-of-00001.parquet", "validation-0.parquet", "evaluation-0.parquet"):
        (data / name).unlink()
    assert "every data file in it is named for a held-out split" in error_of(tmp_path, dataset)


def test_a_folder_of_saved_splits_names_one_to_choose(tmp_path) -> None:
    """DatasetDict.save_to_disk writes a folder of split folders: it was refused with "cannot
    tell the file format; set training.dataset.format", and that advice failed next."""
    import datasets

    splits = {"train": ["a", "b"], "test": ["c"]}
    datasets.DatasetDict(
        {k: datasets.Dataset.from_dict({"text": v}) for k, v in splits.items()}
    ).save_to_disk(str(tmp_path / "data"))
    said = error_of(tmp_path, {"path": "data"})
    assert said == (
        f"training.dataset.path: {tmp_path / 'data'} holds several saved splits ('test', "
        f"'train'); name one split's folder, e.g. {tmp_path / 'data' / 'train'}"
    )
    assert not any("held-out" in n for n in resolved_for(tmp_path, {"path": "data"}).notes)
    same = {"path": "data/train", "validation_path": "data/train"}  # a saved dataset twice
    assert any("is also read for training" in n for n in resolved_for(tmp_path, same).notes)
    assert sorted(load(tmp_path, {"path": "data/train", "eval_fraction": 0}).train["text"]) == [
        "a",
        "b",
    ]


def test_a_folder_of_several_formats_reads_the_one_named(tmp_path, write_jsonl) -> None:
    """A folder of .jsonl and .csv said "set training.dataset.format", and with `format:
    jsonl` the CSV file was read as JSON (invalid JSON at its first line)."""
    data = tmp_path / "data"
    write_jsonl(data / "a.jsonl", [{"text": "from json"}])
    (data / "b.csv").write_text("text\nfrom csv\n")
    said = error_of(tmp_path, {"path": "data"})
    assert said == (
        f"{data}: holds data files of several formats (csv, json); keep one format in the "
        "folder, or set training.dataset.format to the one to read"
    )
    for fmt, text in (("jsonl", "from json"), ("csv", "from csv")):
        loaded = load(tmp_path, {"path": "data", "format": fmt, "eval_fraction": 0})
        assert list(loaded.train["text"]) == [text]


def test_eval_seed_is_noted_where_a_validation_file_gives_the_examples(
    tmp_path, write_jsonl
) -> None:
    write_jsonl(tmp_path / "t.jsonl", [{"text": f"t{i}"} for i in range(4)])
    write_jsonl(tmp_path / "v.jsonl", [{"text": "v"}])
    dataset = {"path": "t.jsonl", "validation_path": "v.jsonl", "eval_seed": 0}
    notes = resolved_for(tmp_path, dataset).notes
    assert "eval_seed: not applied; validation_path gives the validation examples" in notes


def test_validation_file_and_multi_task_weights(tmp_path, write_jsonl) -> None:
    write_jsonl(tmp_path / "a.jsonl", [{"text": f"a{i}"} for i in range(10)])
    write_jsonl(tmp_path / "b.jsonl", [{"text": f"b{i}"} for i in range(10)])
    write_jsonl(tmp_path / "v.jsonl", [{"text": "v"}])
    dataset = {
        "type": "multi_task",
        "tasks": {
            "a": {"train": "a.jsonl", "valid": "v.jsonl", "weight": 2.0},
            "b": {"train": "b.jsonl", "weight": 0.5},
        },
    }
    loaded = load(tmp_path, dataset)
    texts = list(loaded.train["text"])
    assert len(texts) == 25
    assert sum(t.startswith("a") for t in texts) == 20
    assert len({t for t in texts if t.startswith("b")}) == 5
    assert list(loaded.eval["text"]) == ["v"]


def test_validation_examples_that_are_training_examples_are_counted(tmp_path, write_jsonl) -> None:
    """Nothing removes repeats, so a validation example may be trained on: its eval_loss
    measures memory. The build says how many (it said nothing)."""
    write_jsonl(tmp_path / "t.jsonl", [{"text": f"t{i}"} for i in range(6)] + [{"text": "t1"}])
    write_jsonl(tmp_path / "v.jsonl", [{"text": "t1"}, {"text": "v"}, {"text": "t3"}])
    loaded = load(tmp_path, {"path": "t.jsonl", "validation_path": "v.jsonl"})
    assert loaded.notes == [
        "2 of the 3 validation examples are training examples too (the same text): eval_loss "
        "on them measures what the adapter memorized; remove the repeats from the data"
    ]
    write_jsonl(tmp_path / "v.jsonl", [{"text": "v"}])
    assert load(tmp_path, {"path": "t.jsonl", "validation_path": "v.jsonl"}).notes == []


def test_shared_rows_compare_every_column_of_held_out_rows() -> None:
    from datasets import Dataset

    from expert_cli.data.overlap import shared_rows

    ds = Dataset.from_dict(
        {
            "instruction": ["a", "a", "b", "c", "a"],
            "input": [None, "x", None, None, None],
            "response": ["1", "1", "2", "3", "1"],
        }
    )
    train, held = ds.select([0, 1, 2]), ds.select([3, 4])  # index mappings, as hold_out makes
    assert shared_rows(train, held) == 1  # row 4 repeats row 0; row 1 differs by its input
    assert shared_rows(ds.select([1, 2]), held) == 0
    assert shared_rows(train, None) == 0


def test_weight_and_holdout_helpers() -> None:
    from datasets import Dataset

    ds = Dataset.from_dict({"x": list(range(10))})
    assert len(apply_weight(ds, 1.0, 0)) == 10
    assert list(apply_weight(ds, 2.0, 0)["x"]) == list(range(10)) * 2
    assert len(apply_weight(ds, 1.3, 0)) == 13
    train, held = hold_out(ds, 0.2, 0)
    assert sorted(list(train["x"]) + list(held["x"])) == list(range(10)) and len(held) == 2


def test_a_data_folder_leaves_hidden_files_out(tmp_path: Path) -> None:
    """Notebook checkpoints and caches inside a data folder are not data (a copy of every
    row, or the token cache's own files)."""
    for name in (
        "a.jsonl",
        "sub/b.jsonl",
        ".cache/c.jsonl",
        ".ipynb_checkpoints/a.jsonl",
        ".d.json",
    ):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text('{"text": "x"}\n')
    ref = SourceRef(kind="local", location=str(tmp_path))
    assert source_files(ref) == [tmp_path / "a.jsonl", tmp_path / "sub/b.jsonl"]


def _text_column(values: list[bytes]):
    """A string column holding these bytes as written (Arrow does not check them; a dataset
    generated from a Latin-1 file holds such strings)."""
    import pyarrow as pa

    return pa.array(values, pa.binary()).view(pa.string())


def test_a_saved_dataset_with_bytes_that_are_not_utf8(cli, tmp_path: Path) -> None:
    """Loads (Arrow keeps the bytes) and used to end in a traceback when the build read the
    row; now the row and field are named, by load_sources and by check, and the bytes are not
    shown."""
    import datasets
    import pyarrow as pa

    good = [f"example {i}".encode() for i in range(300)]
    texts = good[:200] + [b"caf\xe9 SECRET"] + good[200:]
    datasets.Dataset(pa.table({"body": _text_column(texts)})).save_to_disk(tmp_path / "saved")
    dataset = {"path": "saved", "field_mapping": {"text": "body"}}
    expected = (
        f"{tmp_path / 'saved'}: row 201: field 'body' (field_mapping.text) holds bytes that are "
        "not UTF-8 text; expected UTF-8 strings"
    )
    assert error_of(tmp_path, dataset) == expected
    out = cli("check", "-m", str(tmp_path / "manifest.json"), "--json")
    assert out.returncode == 2
    assert expected in json.loads(out.stdout)["problems"]
    assert "SECRET" not in out.stdout + out.stderr
    datasets.Dataset(pa.table({"body": pa.array(good)})).save_to_disk(tmp_path / "raw")
    assert error_of(tmp_path, {**dataset, "path": "raw"}) == (  # was "holds Value('binary')"
        f"{tmp_path / 'raw'}: field 'body' (field_mapping.text) holds binary data (bytes, not "
        "text), expected a string in every row"
    )


def test_chat_messages_with_bytes_that_are_not_utf8(tmp_path: Path) -> None:
    import datasets
    import pyarrow as pa

    contents = _text_column([b"hello", b"fine", b"\xff\xfe"])
    roles = pa.array(["user", "assistant", "user"])
    turns = pa.StructArray.from_arrays([roles, contents], names=["role", "content"])
    messages = pa.ListArray.from_arrays(pa.array([0, 2, 3]), turns)  # rows of 2 and 1 turns
    datasets.Dataset(pa.table({"messages": messages})).save_to_disk(tmp_path / "chat")
    msg = error_of(tmp_path, {"path": "chat"})
    assert msg.startswith(f"{tmp_path / 'chat'}: row 2: field 'messages' (field_mapping.messages)")


def test_the_first_row_not_utf8_is_found_across_chunks() -> None:
    import pyarrow as pa

    from expert_cli.data.column_checks import first_not_utf8

    chunks = [_text_column([b"a"] * 5), _text_column([b"b"] * 3 + [b"\xc3"] + [b"\xff"])]
    assert first_not_utf8(pa.chunked_array(chunks)) == 8
    assert first_not_utf8(pa.chunked_array([_text_column([b"\xff"] + [b"a"] * 6)])) == 0
    assert first_not_utf8(pa.chunked_array([_text_column([b"a"] * 7)])) is None
    assert first_not_utf8(pa.chunked_array([], pa.string())) is None
    # a null list row keeps items behind it that flatten() leaves out: rows still line up
    items = _text_column([b"a", b"b", b"c", b"\xff"])
    lists = pa.ListArray.from_arrays(
        pa.array([0, 2, 3, 4], pa.int32()), items, mask=pa.array([False, True, False])
    )
    assert first_not_utf8(pa.chunked_array([lists])) == 2
    assert first_not_utf8(pa.chunked_array([lists.slice(1)])) == 1


@pytest.mark.parametrize(
    ("files", "why"),
    [
        ({"a.csv": b"text\nok\ncaf\xe9 SECRET\n"}, "a file is not UTF-8 text"),
        ({"a.csv": b"text\nok\nSECRET,SECRET\n"}, "ParserError while parsing"),
        (
            {"a.jsonl": b'{"text": "x"}\n', "b.jsonl": b'{"body": "SECRET"}\n'},
            "its files do not all have the same columns",
        ),
    ],
)
def test_hub_files_that_cannot_be_read(monkeypatch, tmp_path: Path, files, why) -> None:
    """A hub dataset whose files fail in the datasets library's generation step: said by the
    kind of failure (the library's messages quote rows), with the way to our own reader. The
    same generation runs here on a local folder given to load_dataset, as a hub snapshot is."""
    import datasets

    from expert_cli.data.sources import load_hub

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "cache"))
    (tmp_path / "repo").mkdir()
    for name, data in files.items():
        (tmp_path / "repo" / name).write_bytes(data)
    with pytest.raises(UserError) as info:
        load_hub(SourceRef(kind="hub", location=str(tmp_path / "repo")))
    message = "\n".join(info.value.lines)
    assert f"{tmp_path / 'repo'}: its data files could not be read into a dataset ({why})" in (
        message
    )
    assert "set training.dataset.path to that folder" in message and "SECRET" not in message


@pytest.mark.parametrize(
    ("files", "split", "said"),
    [
        ({"a.jsonl": b""}, None, "its data files hold no rows"),
        (
            {"a.jsonl": b'{"text": "SECRET"}\n'},
            "validation",
            "cannot be read from the hub or its cache (ValueError: Unknown split",
        ),
    ],
)
def test_hub_datasets_without_the_rows_asked_for(
    monkeypatch, tmp_path: Path, files, split, said
) -> None:
    """An empty file was `(StopIteration: )`; a missing split keeps the library's first line,
    which names the splits there are, never a row."""
    import datasets

    from expert_cli.data.sources import load_hub

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "cache"))
    (tmp_path / "repo").mkdir()
    for name, data in files.items():
        (tmp_path / "repo" / name).write_bytes(data)
    with pytest.raises(UserError) as info:
        load_hub(SourceRef(kind="hub", location=str(tmp_path / "repo"), split=split))
    message = "\n".join(info.value.lines)
    assert said in message and "SECRET" not in message and len(info.value.lines) == 1


@pytest.mark.parametrize(
    ("damage", "why"),
    [
        ("state", "its state.json or dataset_info.json is not JSON"),
        ("cut", "an Arrow file in it is damaged or cut short"),
        ("gone", "data-00000-of-00001.arrow is missing"),
        ("retyped", "its dataset_info.json gives 'text' a type other than its Arrow files hold"),
    ],
)
def test_a_damaged_saved_dataset(cli, tmp_path: Path, damage: str, why: str) -> None:
    """state.json not JSON, an Arrow file cut short or gone: exit 2 naming the folder, in
    load_sources and in check (both were tracebacks)."""
    import datasets

    folder = tmp_path / "saved"
    datasets.Dataset.from_dict({"text": ["a", "b", "c"]}).save_to_disk(folder)
    arrow = folder / "data-00000-of-00001.arrow"
    if damage == "state":
        (folder / "state.json").write_text("{not json")
    elif damage == "cut":
        arrow.write_bytes(arrow.read_bytes()[: arrow.stat().st_size // 2])
    elif damage == "retyped":  # a hand edit: was "an Arrow file in it is damaged"
        info = json.loads((folder / "dataset_info.json").read_text())
        info["features"]["text"] = {"dtype": "int64", "_type": "Value"}
        (folder / "dataset_info.json").write_text(json.dumps(info))
    else:
        arrow.unlink()
    message = error_of(tmp_path, {"path": "saved"})
    assert message.startswith(f"{folder}: not a readable saved dataset (") and why in message
    assert "save it again with Dataset.save_to_disk" in message
    out = cli("check", "-m", str(tmp_path / "manifest.json"), "--json")
    assert out.returncode == 2 and message in json.loads(out.stdout)["problems"]


def test_a_weight_other_than_0_or_1_or_on_a_turn_never_trained_is_refused(
    tmp_path, write_jsonl
) -> None:
    """OpenAI's per-message weight is 0 or 1, on an answer: `2`, `0.5`, `NaN`, `"0"` or
    `false` were trained as weight 1, and a user turn's 1 as nothing, without a word."""
    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq

    def talk(answer: dict, user: dict | None = None) -> dict:
        return {"messages": [{"role": "user", "content": "q", **(user or {})}, answer]}

    fine = [
        talk({"role": "assistant", "content": "a", "weight": w}, {"weight": u})
        for w, u in ((1, 0), (0, None), (1.0, 0.0), (None, None))
    ]
    expected = "0 (an answer left as context) or 1 (trained), as in OpenAI's fine-tuning format"
    never = 'a "weight" of 1 on a turn that is never trained (only assistant answers are)'
    cases = [
        (
            {"weight": 2},
            None,
            f'item 1: "weight" is a number other than 0 and 1, expected {expected}',
        ),
        ({"weight": float("nan")}, None, 'item 1: "weight" is a number other than 0 and 1'),
        ({"weight": "0"}, None, 'item 1: "weight" is not a number (str), expected'),
        ({"weight": False}, None, 'item 1: "weight" is a boolean, expected'),
        ({}, {"weight": 1}, f"item 0: {never}; remove it, or give 0"),
    ]
    for answer, user, said in cases:
        rows = [*fine, talk({"role": "assistant", "content": "a", **answer}, user)]
        path = write_jsonl(tmp_path / "train.jsonl", rows)
        msg = error_of(tmp_path, {"path": "train.jsonl"})
        assert msg.startswith(f"{path}:5: field 'messages' (field_mapping.messages) {said}"), msg
    path = write_jsonl(tmp_path / "train.jsonl", fine)
    assert load(tmp_path, {"path": "train.jsonl"}).read["train"] == 4
    # Parquet: every message has the field, null where the row had none
    table = pa.Table.from_pylist([*fine, talk({"role": "assistant", "content": "a", "weight": 3})])
    pq.write_table(table, tmp_path / "train.parquet")
    msg = error_of(tmp_path, {"path": "train.parquet"})
    assert msg.startswith(f"{tmp_path / 'train.parquet'}: row 5: field 'messages'"), msg
    assert 'item 1: "weight" is a number other than 0 and 1' in msg
    (tmp_path / "train.parquet").unlink()
    # a saved dataset (as a hub one) is checked by column: the row is named
    for last, said in (
        (
            talk({"role": "assistant", "content": "a", "weight": 0.5}),
            'item 1: "weight" is a number',
        ),
        (talk({"role": "assistant", "content": "a"}, {"weight": 1}), f"item 0: {never}"),
    ):
        saved = tmp_path / "saved"
        datasets.Dataset.from_list([*fine[:3], last]).save_to_disk(saved)
        msg = error_of(tmp_path, {"path": "saved"})
        assert msg.startswith(f"{saved}: row 4: field 'messages' (field_mapping.messages) item"), (
            msg
        )
        assert said in msg
        datasets.Dataset.from_list(fine[:3]).save_to_disk(tmp_path / "ok")
    assert load(tmp_path, {"path": "ok"}).read["train"] == 3
    # a half-float weight (no comparison kernel: a traceback), and messages of a fixed number
    # (Arrow's fixed-size list, whose weights went unchecked), checked alike
    message = {"role": datasets.Value("string"), "content": datasets.Value("string")}
    for weight, length, rows, said in (
        ("float16", -1, [*fine[:3]], None),
        ("float16", -1, [*fine[:3], talk({"role": "assistant", "content": "a", "weight": 2})], 4),
        ("int64", 2, [*fine[:3], talk({"role": "assistant", "content": "a"}, {"weight": 1})], 4),
    ):
        features = datasets.Features(
            {"messages": datasets.List({**message, "weight": datasets.Value(weight)}, length)}
        )
        saved = tmp_path / f"typed-{weight}-{len(rows)}"
        datasets.Dataset.from_list(rows, features=features).save_to_disk(saved)
        if said is None:
            assert load(tmp_path, {"path": saved.name}).read["train"] == 3
        else:
            msg = error_of(tmp_path, {"path": saved.name})
            assert msg.startswith(f"{saved}: row {said}: field 'messages'"), msg


def test_hub_messages_whose_turns_have_different_keys_are_read(tmp_path, write_jsonl) -> None:
    """The datasets library types messages whose turns' keys differ (a weight or tool_calls on
    some) as JSON: such a hub dataset was refused as `holds List(Json(decode=True)), expected
    a list of {"role": ..., "content": ...} objects`. It is read, each row checked as a file's
    rows are (a user turn's weight 1 was not seen)."""
    import datasets

    calls = [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]
    rows = [
        {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]},
        {
            "messages": [
                {"role": "user", "content": "q"},
                {"role": "assistant", "content": None, "tool_calls": calls},
                {"role": "tool", "content": "1", "tool_call_id": "c"},
                {"role": "assistant", "content": "b", "weight": 0},
                {"role": "user", "content": "q"},
                {"role": "assistant", "content": "c", "weight": 1},
            ]
        },
    ]
    write_jsonl(tmp_path / "raw" / "train.jsonl", rows)
    cache = str(tmp_path / "hf")
    typed = datasets.load_dataset("json", data_dir=str(tmp_path / "raw"), cache_dir=cache)
    assert isinstance(typed["train"].features["messages"].feature, datasets.Json)
    typed["train"].save_to_disk(tmp_path / "saved")  # read as a hub dataset is, by column
    loaded = load(tmp_path, {"path": "saved"})
    stored = [json.loads(m) for part in (loaded.train, loaded.eval) for m in part["messages"]]
    assert sorted(stored, key=len) == [r["messages"] for r in rows]
    rows[1]["messages"][4]["weight"] = 1  # a user turn: refused, naming row and item
    write_jsonl(tmp_path / "raw" / "train.jsonl", rows)
    typed = datasets.load_dataset("json", data_dir=str(tmp_path / "raw"), cache_dir=cache)
    typed["train"].save_to_disk(tmp_path / "bad")
    msg = error_of(tmp_path, {"path": "bad"})
    assert msg.startswith(
        f"{tmp_path / 'bad'}: row 2: field 'messages' (field_mapping.messages) item 4: a "
        '"weight" of 1 on a turn that is never trained'
    ), msg


def _stored_messages(loaded, by: int) -> list:
    """Every conversation a load stored, training and held-out, sorted by turn `by`'s text."""
    parts = [loaded.train, *([loaded.eval] if loaded.eval is not None else [])]
    found = [json.loads(m) for part in parts for m in part["messages"]]
    return sorted(found, key=lambda m: m[by]["content"])


def _read_in_three_forms(folder: Path, rows: list, column: str, expected: list, by: int) -> None:
    """`rows` written as JSON Lines, Parquet and a saved dataset, each loaded with no mapping:
    `column` is found as the messages and `expected` stored (sorted by turn `by`'s text)."""
    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder.joinpath("train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    loaded = load(folder, {"path": "train.jsonl"})
    assert loaded.fields.mapping == {"messages": column, "tools": "tools", "system": "system"}
    assert _stored_messages(loaded, by) == expected
    pq.write_table(pa.Table.from_pylist(rows), folder / "train.parquet")
    assert _stored_messages(load(folder, {"path": "train.parquet"}), by) == expected
    datasets.Dataset.from_list(rows).save_to_disk(folder / "saved")
    assert _stored_messages(load(folder, {"path": "saved"}), by) == expected


def test_sharegpt_conversations_are_read_as_messages(tmp_path, write_jsonl) -> None:
    """ShareGPT's form (`conversations` of `{"from": "human", "value": ...}`, the common form
    of chat data on the hub) was "cannot tell which column holds the data", and with a
    mapping "role is missing": it is read as role/content messages, from a file, a Parquet
    file or a saved dataset alike, a turn's other keys kept."""
    import datasets

    from expert_cli.data.conversations import standard_turns

    rows = [
        {
            "conversations": [
                {"from": "system", "value": "be brief"},
                {"from": "human", "value": f"q{i}"},
                {"from": "gpt", "value": f"a{i}", "weight": 1},
            ]
        }
        for i in range(3)
    ]
    expected = [
        [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": f"q{i}"},
            {"role": "assistant", "content": f"a{i}", "weight": 1},
        ]
        for i in range(3)
    ]

    _read_in_three_forms(tmp_path, rows, "conversations", expected, 1)  # found by its name
    for speaker in ("chatgpt", "bing", "bard"):  # FastChat's other answers (they were dropped)
        assert standard_turns([{"from": speaker, "value": "a"}]) == [
            {"role": "assistant", "content": "a"}
        ]
    rows[0]["conversations"][2]["weight"] = 2  # checked as any message is
    write_jsonl(tmp_path / "train.jsonl", rows)
    said = error_of(tmp_path, {"path": "train.jsonl"})
    assert 'item 2: "weight" is a number other than 0 and 1' in said
    assert said.endswith("(read as messages: ShareGPT's `from` as role, `value` as content)")
    rows[0]["conversations"][2]["weight"] = 1  # a human turn's 1, in an Arrow column
    rows[1]["conversations"][1]["weight"] = 1
    datasets.Dataset.from_list(rows).save_to_disk(tmp_path / "weighed")
    assert "row 2: field 'conversations' (field_mapping.messages) item 1: a \"weight\" of 1" in (
        error_of(tmp_path, {"path": "weighed"})
    )


def test_capybara_exchanges_are_read_as_messages(tmp_path, write_jsonl) -> None:
    """Capybara's `conversation` of `{"input": question, "output": answer}` items could not
    be mapped at all ("role is missing"): each item is a user turn and an assistant turn,
    from a file, a Parquet file or a saved dataset alike."""
    import datasets

    rows = [
        {"source": "x", "conversation": [{"input": f"q{i}", "output": f"a{i}"}] * 2}
        for i in range(3)
    ]
    turn = [{"role": "user", "content": "q{}"}, {"role": "assistant", "content": "a{}"}]
    expected = [[{**m, "content": m["content"].format(i)} for m in turn * 2] for i in range(3)]

    _read_in_three_forms(tmp_path, rows, "conversation", expected, 0)
    mixed = [{"role": "system", "content": "s"}, {"input": "q", "output": "a"}]
    datasets.Dataset.from_list([{"messages": mixed}] * 2).save_to_disk(tmp_path / "mixed")
    # Arrow's struct gives every item every key, null where it had none: the answer's
    # role was the fill-in's null
    assert _stored_messages(load(tmp_path, {"path": "mixed"}), 0)[0] == [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "a"},
    ]
    rows[1]["conversation"] = [{"input": "q", "output": 7}]  # checked as any message is
    write_jsonl(tmp_path / "train.jsonl", rows)
    said = error_of(tmp_path, {"path": "train.jsonl"})
    assert said.endswith(
        "train.jsonl:2: field 'conversation' (field_mapping.messages) item 1: content is a "
        "number, expected a string (read as messages: Capybara's items as two turns each, "
        "its `input` a user's, its `output` the assistant's; turns count from 0, as read)"
    ), said
    rows[1]["conversation"] = [{"input": "q"}]  # half an exchange: the answer is missing
    write_jsonl(tmp_path / "train.jsonl", rows)
    assert "item 1: content is missing" in error_of(tmp_path, {"path": "train.jsonl"})


def test_json_of_columns_or_wrapped_examples_is_trained(tmp_path) -> None:
    """`{"instruction": [...], "output": [...]}` was one row ("is a list, expected a
    string"); `{"version": ..., "data": [...]}` was one row with no column to read."""
    rows = [{"instruction": f"q{i}", "output": f"a{i}"} for i in range(5)]
    columns = {
        "instruction": [r["instruction"] for r in rows],
        "output": [r["output"] for r in rows],
    }
    (tmp_path / "columns.json").write_text(json.dumps(columns))
    (tmp_path / "wrapped.json").write_text(json.dumps({"version": 2, "data": rows}))
    for name in ("columns.json", "wrapped.json"):
        loaded = load(tmp_path, {"path": name, "eval_fraction": 0.2})
        assert loaded.fields.kind == "instruction", name
        read = loaded.train.to_list() + loaded.eval.to_list()
        assert sorted(r["response"] for r in read) == [f"a{i}" for i in range(5)]
    rows[3]["output"] = 7
    (tmp_path / "wrapped.json").write_text(json.dumps({"version": 2, "data": rows}))
    assert error_of(tmp_path, {"path": "wrapped.json"}).startswith(
        f"{tmp_path / 'wrapped.json'}: row 4 of 'data': field 'output' (field_mapping.response) "
        "is a number"
    )


def test_a_split_named_on_a_local_path_is_refused(tmp_path, write_jsonl) -> None:
    """`data/ultrachat::train_sft` read every file of the folder, the split dropped without a
    word: `::split` picks a hub dataset's split (on a local folder, one its README.md lists:
    test_a_local_download_of_several_training_splits_names_one)."""
    write_jsonl(tmp_path / "data" / "train_sft.jsonl", [{"text": "a"}] * 3)
    for spec in ("data::train_sft", "data::train::main"):
        with pytest.raises(UserError, match="picks a split of a hub dataset, and .* is local"):
            resolved_for(tmp_path, {"path": spec})


def test_a_local_download_of_several_configurations_is_refused(tmp_path, write_jsonl) -> None:
    """`hf download openai/gsm8k --local-dir data/gsm8k` named as a folder: its main and
    socratic files were all trained together (the hub id is refused for want of a config)."""
    for config in ("main", "socratic"):
        write_jsonl(tmp_path / "gsm8k" / config / "train.jsonl", [{"text": "a"}] * 3)
    card = "---\nconfigs:\n" + "".join(
        f"- config_name: {c}\n  data_files:\n  - split: train\n    path: {c}/train-*\n"
        for c in ("main", "socratic")
    )
    (tmp_path / "gsm8k" / "README.md").write_text(card + "---\n# GSM8K\n")
    with pytest.raises(UserError) as info:
        resolved_for(tmp_path, {"path": "gsm8k"})
    assert info.value.lines == [
        f"training.dataset.path: {tmp_path / 'gsm8k'} holds a hub dataset's 2 configurations "
        "('main', 'socratic', as its README.md lists them), whose files would all be read "
        f"together; name one configuration's files or folder, e.g. {tmp_path / 'gsm8k' / 'main'}"
    ]
    assert resolved_for(tmp_path, {"path": "gsm8k/main"}).train_sources[0].kind == "local"
    (tmp_path / "gsm8k" / "README.md").write_text("---\nconfigs: [1, {x: 2}\n---\n")  # bad YAML
    assert resolved_for(tmp_path, {"path": "gsm8k"}).train_sources[0].kind == "local"


def test_turns_in_a_text_column_say_how_to_read_them(tmp_path, write_jsonl) -> None:
    """A list of turns where text is read: "is a list, expected a string" became what they
    look like and how to train them (TRL's prompt and completion: tests/data/test_completions)."""
    user = {"role": "user", "content": "q"}
    path = write_jsonl(tmp_path / "train.jsonl", [{"text": [user]}])
    assert error_of(tmp_path, {"path": "train.jsonl"}) == (
        f"{path}:1: field 'text' (field_mapping.text) is a list of objects (turns of a "
        "conversation?), expected a string; map the column as `messages`"
    )
    write_jsonl(tmp_path / "train.jsonl", [{"prompt": ["q"], "completion": "a"}])
    assert error_of(tmp_path, {"path": "train.jsonl"}).endswith("is a list, expected a string")


def test_a_local_download_of_several_training_splits_names_one(tmp_path, write_jsonl) -> None:
    """UltraChat-200k's folder (train_sft, test_sft, train_gen, test_gen) trained its SFT and
    generation splits together (the test ones left out); `::split` on a local folder was
    refused. Now the folder asks for a split, and `folder::split` reads the files its
    README.md gives that split."""
    folder = tmp_path / "ultrachat"
    for split in ("train_sft", "test_sft", "train_gen", "test_gen"):
        write_jsonl(folder / "data" / f"{split}-00000-of-00001.jsonl", [{"text": split}] * 2)
    entries = "".join(
        f"  - split: {s}\n    path: data/{s}-*\n"
        for s in ("train_sft", "test_sft", "train_gen", "test_gen")
    )
    _card(folder, entries)
    with pytest.raises(UserError) as info:
        resolved_for(tmp_path, {"path": "ultrachat"})
    assert info.value.lines == [
        f"training.dataset.path: {folder} holds a hub dataset's splits 'train_sft', 'train_gen' "
        "(as its README.md lists them), whose files would all be read together; name one, e.g. "
        f"{folder}::train_sft"
    ]
    loaded = load(
        tmp_path, {"path": "ultrachat::train_sft", "validation_path": "ultrachat::test_sft"}
    )
    assert loaded.train["text"] == ["train_sft"] * 2 and loaded.eval["text"] == ["test_sft"] * 2
    with pytest.raises(UserError) as info:
        resolved_for(tmp_path, {"path": "ultrachat::train"})
    assert info.value.lines == [
        f"training.dataset.path: ::'train' picks a split of a hub dataset, and {folder} is a "
        "local folder whose README.md lists 'train_sft', 'test_sft', 'train_gen', 'test_gen': "
        "name the files to read (a split's file or folder)"
    ]
    (folder / "README.md").unlink()
    assert f"and {folder} is local: name the files" in error_of(tmp_path, {"path": "ultrachat::x"})
    # a card of one training split and its test split: read as before
    _card(folder, entries.replace("train_gen", "test_x"))
    assert resolved_for(tmp_path, {"path": "ultrachat"}).train_sources[0].split is None


def test_math_and_capitalised_columns_are_detected() -> None:
    """competition_math's `problem`/`solution`, OpenMathInstruct-2's `generated_solution`, a
    worked `solution` before a bare `answer` (MATH-500), and SVAMP's `Question`/`Answer` were
    "cannot tell which column", suggesting `{"text": ...}` (one column trained whole)."""
    cases = {
        ("problem", "level", "type", "solution"): ("problem", "solution"),
        ("problem", "generated_solution", "expected_answer"): ("problem", "generated_solution"),
        ("problem", "solution", "answer", "unique_id"): ("problem", "solution"),
        ("question", "answer"): ("question", "answer"),  # GSM8K, as before
        ("Body", "Question", "Answer", "Equation"): ("Question", "Answer"),
        ("Question", "question", "answer"): ("question", "answer"),  # lower case first
        ("inputs", "targets", "language"): ("inputs", "targets"),  # Aya's, FLAN's
        ("definition", "inputs", "targets"): ("inputs", "targets"),  # Natural Instructions'
    }
    for columns, (asked, answer) in cases.items():
        spec = field_spec(None, list(columns), "f")
        assert (spec.mapping["instruction"], spec.mapping["response"]) == (asked, answer)
    # Natural Instructions' task definition is the system prompt (it was left unread)
    assert field_spec(None, ["definition", "inputs", "targets"], "f").mapping["system"] == (
        "definition"
    )
    with pytest.raises(UserError) as info:
        field_spec(None, ["Prompt", "meta"], "f")
    assert info.value.lines[0].endswith(
        "(columns: 'Prompt', 'meta'); set training.dataset.field_mapping, e.g. "
        '{"instruction": "Prompt", "response": "<column>"} (no response column was found)'
    )


def _card(folder: Path, entries: str) -> None:
    header = "---\nconfigs:\n- config_name: default\n  data_files:\n" + entries + "---\n"
    (folder / "README.md").write_text(header)


def test_a_cards_splits_decide_which_files_are_held_out(tmp_path, write_jsonl) -> None:
    """A card whose files' names say no split (train: part_a/*, test: part_b/*) trained its
    test split; its patterns are matched as the hub matches them (`**` over no folder too,
    a leading `./`, `*` within a folder); odd split names are a line, not a traceback."""
    folder = tmp_path / "d"
    write_jsonl(folder / "part_a" / "x.jsonl", [{"text": "train"}] * 3)
    write_jsonl(folder / "part_b" / "x.jsonl", [{"text": "test"}] * 2)
    _card(folder, "  - split: train\n    path: ./part_a/*\n  - split: test\n    path: part_b/**\n")
    loaded = load(tmp_path, {"path": "d", "validation_path": "d"})
    assert loaded.train["text"] == ["train"] * 3 and loaded.eval["text"] == ["test"] * 2
    write_jsonl(folder / "data" / "train-0.jsonl", [{"text": "nested"}])
    _card(folder, "  - split: train\n    path: data/**/train-*.jsonl\n")
    assert load(tmp_path, {"path": "d::train"}).train["text"] == ["nested"]
    _card(folder, "  - split: train\n    path: '*.jsonl'\n")  # `*` stays in its folder
    assert "no data file matches the paths its README.md gives split 'train'" in error_of(
        tmp_path, {"path": "d::train"}
    )
    for odd in ('""', '"."', '"/etc"', '"a/b"'):
        _card(folder, f"  - split: {odd}\n    path: part_a/*\n  - split: x\n    path: part_b/*\n")
        said = error_of(tmp_path, {"path": "d"})
        assert said.startswith(f"training.dataset.path: {folder} holds a hub dataset's splits")


def test_each_task_is_detected_from_its_own_columns(tmp_path, write_jsonl) -> None:
    """A multi_task expert's tasks detected from the first task's columns: a second task of
    question/answer was "field 'instruction' missing (field_mapping.instruction)", where no
    mapping was given; tasks of two layouts were the same line. Now each source is detected
    from its own columns, and two layouts are one line naming both."""
    write_jsonl(tmp_path / "a.jsonl", [{"instruction": f"i{n}", "output": "o"} for n in range(4)])
    write_jsonl(tmp_path / "b.jsonl", [{"question": f"q{n}", "answer": "a"} for n in range(4)])
    tasks = {"a": {"train": "a.jsonl"}, "b": {"train": "b.jsonl"}}
    loaded = load(tmp_path, {"type": "multi_task", "tasks": tasks, "eval_fraction": 0.25})
    read = loaded.train.to_list() + loaded.eval.to_list()
    assert sorted(r["instruction"] for r in read) == [f"{c}{n}" for c in "iq" for n in range(4)]
    # each source's columns as read, for the cache's stats (it recorded the last source's)
    assert [(m["source"], m["mapping"]["instruction"]) for m in loaded.mappings] == [
        ("training.dataset.tasks.a.train", "instruction"),
        ("training.dataset.tasks.b.train", "question"),
    ]
    chat = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    write_jsonl(tmp_path / "b.jsonl", [{"messages": chat}] * 4)
    said = error_of(tmp_path, {"type": "multi_task", "tasks": tasks})
    assert said.startswith(  # under chat_template they join (tests/data/test_mixed_layouts.py)
        f"{tmp_path / 'b.jsonl'}:1: its columns read as conversations ('messages'), and those "
        f"of {tmp_path / 'a.jsonl'}:1 as instruction data ('instruction', 'output'); "
        "instruction data beside conversations is trained as conversations of the tokenizer's "
        "chat template"
    )


def test_check_names_each_sources_columns_where_they_differ(tmp_path, write_jsonl) -> None:
    from expert_cli.data.checks import check_manifest

    write_jsonl(tmp_path / "a.jsonl", [{"instruction": "i", "output": "o"}] * 4)
    write_jsonl(tmp_path / "b.jsonl", [{"question": "q", "answer": "a"}] * 4)
    tasks = {"a": {"train": "a.jsonl"}, "b": {"train": "b.jsonl"}}
    resolved_for(tmp_path, {"type": "multi_task", "tasks": tasks})  # writes the manifest
    notes = [n for n in check_manifest(tmp_path / "manifest.json").notes if "read as" in n]
    assert [n.split(": training.dataset.field_mapping")[0] for n in notes] == [
        str(tmp_path / "a.jsonl"),
        str(tmp_path / "b.jsonl"),
    ]
    assert '{"instruction": "question", "response": "answer"}' in notes[1]


def test_a_tasks_weight_rounds_its_sample_and_keeps_at_least_one_row() -> None:
    """weight 1.27 of 10 rows trains 13 (12 with the fraction cut down); 0.01 of 10 still
    trains one row (an empty task trained nothing in silence); evaluation is held out where
    any source has two rows to spare one."""
    from types import SimpleNamespace

    from expert_cli.data.splits import holds_nothing_out, weighted_rows

    assert len(weighted_rows(10, 1.27, 0)) == 13
    assert weighted_rows(10, 0.01, 0).tolist() == [0]
    resolved = SimpleNamespace(evaluation_strategy="steps", validation_sources=[])
    assert not holds_nothing_out(resolved, [1, 5])  # the second source spares one
    assert holds_nothing_out(resolved, [1, 1])
