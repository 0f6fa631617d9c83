"""TRL's conversational prompt and completion (`prompt` and `completion` columns, each a list
of turns): read as one conversation, the completion's answers trained and the prompt's own
answers kept as context. Before, such rows were refused ("is a list, expected a string")."""

from __future__ import annotations

import json
from pathlib import Path

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import write_jsonl
from train_helpers import run_here, write_expert

from expert_cli.data.checks import check_manifest
from expert_cli.data.completions import joined, joined_row
from expert_cli.data.formatting import IGNORE

SYSTEM = {"role": "system", "content": "Answer in SQL."}
ASK = {"role": "user", "content": "How many orders are there?"}
EARLIER = {"role": "assistant", "content": "SELECT 1;"}
AGAIN = {"role": "user", "content": "Count them."}
ANSWER = {"role": "assistant", "content": "SELECT count(*) FROM orders;"}
ROW = {"prompt": [SYSTEM, ASK, EARLIER, AGAIN], "completion": [ANSWER]}


def test_the_prompts_answers_are_context_and_the_completion_is_trained() -> None:
    assert joined([ASK, EARLIER], [ANSWER]) == [ASK, {**EARLIER, "weight": 0}, ANSWER]
    # a completion given as one answer's text; ShareGPT's turns in the prompt
    shared = [{"from": "human", "value": "hi"}]
    assert joined(shared, "SELECT 2;") == [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "SELECT 2;"},
    ]
    row = {"messages": [ASK], "response": [ANSWER], "tools": None}
    assert joined_row(row) == {"messages": [ASK, ANSWER], "tools": None}
    assert joined_row({"messages": [ASK, ANSWER]}) == {"messages": [ASK, ANSWER]}


def _expert(tmp_path: Path, model: Path, rows: list[dict], mapping: dict | None = None) -> Path:
    manifest = write_expert(tmp_path / "e", model, rows=1)
    data = json.loads(manifest.read_text())
    data["training"]["dataset"]["field_mapping"] = mapping
    if mapping is None:
        data["training"]["dataset"].pop("field_mapping")
    manifest.write_text(json.dumps(data))
    write_jsonl(manifest.parent / "data" / "train.jsonl", rows)
    return manifest


def _point_at(manifest: Path, path: str) -> None:
    data = json.loads(manifest.read_text())
    data["training"]["dataset"]["path"] = path
    data["training"]["dataset"].pop("format", None)
    manifest.write_text(json.dumps(data))


def _built(manifest: Path, model: Path) -> tuple[str, str]:
    """(every example's text, the trained tokens' text) as `pretokenize` built them."""
    from transformers import AutoTokenizer

    built = run_here("pretokenize", "--manifest", str(manifest))
    assert built.returncode == 0, built.stdout + built.stderr
    tok = AutoTokenizer.from_pretrained(model)
    train = max((manifest.parent / ".cache").rglob("train"), key=lambda p: p.stat().st_mtime)
    rows = datasets.load_from_disk(str(train))
    whole = "".join(tok.decode(r) for r in rows["input_ids"])
    trained = [
        tok.decode([i for i, lab in zip(ids, labels, strict=True) if lab != IGNORE])
        for ids, labels in zip(rows["input_ids"], rows["labels"], strict=True)
    ]
    return whole, "".join(trained)


def test_a_file_of_turns_trains_the_completion_alone(tmp_path: Path, tiny_model_dir: Path) -> None:
    manifest = _expert(tmp_path, tiny_model_dir, [ROW] * 4)
    report = check_manifest(manifest)
    assert report.problems == []
    assert (
        'training.dataset.field_mapping: none given; read as {"messages": "prompt", "response": '
        "\"completion\"}; tools from 'tools' and system from 'system' where a row has it; the "
        "response's turns trained, "
        "the answers in messages kept as context (set it to read other columns)"
    ) in report.notes
    whole, trained = _built(manifest, tiny_model_dir)
    assert whole.count("Answer in SQL.") == 4 and whole.count("SELECT 1;") == 4  # as context
    assert trained.count("SELECT count(*) FROM orders;") == 4
    assert "SELECT 1;" not in trained and "Count them" not in trained


@pytest.mark.parametrize("layout", ["parquet", "saved"])
def test_typed_turns_read_as_a_files_are(tmp_path: Path, tiny_model_dir: Path, layout: str) -> None:
    """A Parquet file's prompt and completion are detected from its schema (lists of
    structs); a saved (or hub) dataset's are joined where its conversations are stored, and
    check reads them joined too."""
    manifest = _expert(tmp_path, tiny_model_dir, [ROW])
    rows = [ROW] * 3 + [{"prompt": [ASK], "completion": [ANSWER]}]
    folder = manifest.parent / "data"
    if layout == "parquet":
        pq.write_table(pa.Table.from_pylist(rows), folder / "turns.parquet")
        _point_at(manifest, "data/turns.parquet")
    else:
        datasets.Dataset.from_list(rows).save_to_disk(str(folder / "saved"))
        _point_at(manifest, "data/saved")
    report = check_manifest(manifest)
    assert report.problems == []
    assert not any("refused" in n or "nothing to train" in n for n in report.notes)
    # its schema has neither tools nor a system prompt: not said to be read "where a row has it"
    assert (
        'training.dataset.field_mapping: none given; read as {"messages": "prompt", "response": '
        '"completion"}; the response\'s turns trained'
    ) in "".join(report.notes)
    assert not any("where a row has it" in n for n in report.notes)
    whole, trained = _built(manifest, tiny_model_dir)
    assert whole.count("SELECT 1;") == 3 and "SELECT 1;" not in trained
    assert trained.count("SELECT count(*) FROM orders;") == 4


def test_a_mapped_completion_may_be_text(tmp_path: Path, tiny_model_dir: Path) -> None:
    rows = [{"chat": [ASK], "answer": "SELECT count(*) FROM orders;"}] * 2
    mapping = {"messages": "chat", "response": "answer"}
    manifest = _expert(tmp_path, tiny_model_dir, rows, mapping)
    assert check_manifest(manifest).problems == []
    whole, trained = _built(manifest, tiny_model_dir)
    assert trained.count("SELECT count(*) FROM orders;") == 2 and "How many" not in trained


def test_a_bad_completion_is_named(tmp_path: Path, tiny_model_dir: Path) -> None:
    """A completion turn without content, and turns mapped as an instruction: the file, line,
    field and what to write."""
    bad = {"prompt": [ASK], "completion": [{"role": "assistant"}]}
    manifest = _expert(tmp_path, tiny_model_dir, [ROW, bad])
    (problem,) = check_manifest(manifest).problems
    assert problem.endswith(
        "train.jsonl:2: field 'completion' (field_mapping.response) item 0: content is missing "
        "(null), expected a string"
    )
    mapping = {"instruction": "prompt", "response": "completion"}
    manifest = _expert(tmp_path, tiny_model_dir, [ROW], mapping)
    (problem,) = check_manifest(manifest).problems
    assert problem.endswith(
        "train.jsonl:1: field 'prompt' (field_mapping.instruction) is a list of objects (turns "
        'of a conversation?), expected a string; map such a pair as {"messages": <prompt>, '
        '"response": <completion>}'
    )


THINK = "Think step by step, then answer."


def test_a_system_column_beside_a_conversation_is_its_system_turn(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    """Bespoke-Stratos' and OpenThoughts' `system` beside ShareGPT turns was dropped without a
    word, and mapping it was refused; a conversation's own system turn is kept (no second)."""
    shared = [{"from": "user", "value": "Count the orders."}, {"from": "assistant", "value": "42"}]
    own = [{"from": "system", "value": "Be brief."}, *shared]
    rows = [{"system": THINK, "conversations": shared}] * 3 + [
        {"system": THINK, "conversations": own}
    ]
    manifest = _expert(tmp_path, tiny_model_dir, rows)
    assert check_manifest(manifest).problems == []
    whole, trained = _built(manifest, tiny_model_dir)
    assert whole.count(THINK) == 3 and whole.count("Be brief.") == 1
    assert trained.count("42") == 4 and THINK not in trained
    mapped = _expert(
        tmp_path / "m", tiny_model_dir, rows, {"messages": "conversations", "system": "system"}
    )
    assert check_manifest(mapped).problems == []
    assert _built(mapped, tiny_model_dir)[0].count(THINK) == 3


def test_nemotrons_turns_answer_and_system_prompt_are_detected(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    """Llama-Nemotron's post-training rows: the turns in `input`, the answer's text in
    `output`, `system_prompt` ("detailed thinking on") read as the system turn; as a saved
    dataset too."""
    row = {"input": [ASK], "output": "SELECT count(*) FROM orders;", "system_prompt": THINK}
    manifest = _expert(tmp_path, tiny_model_dir, [row] * 2)
    report = check_manifest(manifest)
    assert report.problems == []
    said = (
        'read as {"messages": "input", "response": "output"}; tools from '
        "'tools' and system from 'system_prompt'"
    )
    assert any(said in n for n in report.notes)
    whole, trained = _built(manifest, tiny_model_dir)
    assert whole.count(THINK) == 2 and trained.count("SELECT count(*) FROM orders;") == 2
    assert THINK not in trained and "How many" not in trained
    datasets.Dataset.from_list([row] * 3).save_to_disk(str(manifest.parent / "data" / "saved"))
    _point_at(manifest, "data/saved")
    assert check_manifest(manifest).problems == []
    whole, trained = _built(manifest, tiny_model_dir)
    assert whole.count(THINK) == 3 and trained.count("SELECT count(*) FROM orders;") == 3


def test_detection_reads_what_the_rows_hold() -> None:
    """A first row's prompt of no turns, as a Parquet schema would say; an instruction's text
    beside turns in `input` (not Nemotron's layout: the instruction would be dropped); KTO's
    labelled completions, which would train the undesirable ones too; a developer turn is a
    conversation's own system prompt."""
    from expert_cli.data.completions import with_system
    from expert_cli.data.fields import field_spec, turn_lists
    from expert_cli.errors import UserError

    first = {"prompt": [], "completion": [ANSWER]}
    spec = field_spec(None, list(first), "f", turn_lists(first))
    assert spec.kind == "messages" and spec.mapping["messages"] == "prompt"
    row = {"instruction": "Be terse", "input": [ASK], "output": "a"}
    assert field_spec(None, list(row), "f", turn_lists(row)).kind == "instruction"
    kto = {"prompt": [ASK], "completion": [ANSWER], "label": False}
    with pytest.raises(UserError, match="unpaired preference data, for KTO"):
        field_spec(None, list(kto), "f", turn_lists(kto))
    developer = [{"role": "developer", "content": "Be brief."}, ASK]
    assert with_system(developer, THINK) == developer
    assert with_system([ASK], THINK) == [{"role": "system", "content": THINK}, ASK]


def test_limas_list_of_texts_is_a_conversation(tmp_path: Path, tiny_model_dir: Path) -> None:
    """LIMA's `conversations` are a list of texts (question, answer, question, answer): exit
    2 ("item 0 is a string"); now a user's and the assistant's turns in turn, in a file and a
    saved dataset alike."""
    rows = [{"conversations": ["Count them.", "42", "And now?", "43"], "source": "lima"}] * 2
    manifest = _expert(tmp_path, tiny_model_dir, rows)
    assert check_manifest(manifest).problems == []
    whole, trained = _built(manifest, tiny_model_dir)
    assert trained.count("42") == 2 and trained.count("43") == 2 and "Count" not in trained
    assert whole.count("Count them.") == 2
    datasets.Dataset.from_list(rows).save_to_disk(str(manifest.parent / "data" / "saved"))
    _point_at(manifest, "data/saved")
    assert check_manifest(manifest).problems == []
    assert _built(manifest, tiny_model_dir)[1] == trained
    write_jsonl(manifest.parent / "data" / "train.jsonl", [{"conversations": ["q", 7]}])
    _point_at(manifest, "data/train.jsonl")
    (problem,) = check_manifest(manifest).problems
    assert problem.endswith("item 0 is a string, expected an object with role and content")


def test_texts_are_a_conversation_only_where_a_conversation_is_read(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    """After LIMA's lists of texts were read as turns, a completion of texts trained as
    user/assistant/user turns, and a saved dataset's prompt of texts was detected as turns
    where a file's was not; a null among LIMA's texts blamed the first text."""
    bad = {"prompt": [{"role": "user", "content": "q"}], "completion": ["answer", "more"]}
    manifest = _expert(tmp_path, tiny_model_dir, [bad])
    (problem,) = check_manifest(manifest).problems
    assert problem.endswith(
        "train.jsonl:1: field 'completion' (field_mapping.response) item 0 is a string, "
        "expected an object with role and content"
    )
    datasets.Dataset.from_list([bad] * 2).save_to_disk(str(manifest.parent / "data" / "s1"))
    _point_at(manifest, "data/s1")
    (problem,) = check_manifest(manifest).problems
    assert "field 'completion'" in problem and "holds lists of text" in problem
    texts = [{"prompt": ["question"], "completion": "answer"}] * 2
    datasets.Dataset.from_list(texts).save_to_disk(str(manifest.parent / "data" / "s2"))
    _point_at(manifest, "data/s2")
    (problem,) = check_manifest(manifest).problems
    assert "field 'prompt' (field_mapping.instruction) holds lists of text" in problem
    lima = [{"conversations": ["q", None]}] * 2
    write_jsonl(manifest.parent / "data" / "train.jsonl", lima)
    _point_at(manifest, "data/train.jsonl")
    (problem,) = check_manifest(manifest).problems
    assert "item 1: content is missing (null), expected a string (read as messages: a list" in (
        problem
    )
    datasets.Dataset.from_list(lima).save_to_disk(str(manifest.parent / "data" / "s3"))
    _point_at(manifest, "data/s3")
    (problem,) = check_manifest(manifest).problems
    assert "row 1: field 'conversations'" in problem and "item 1: content is missing" in problem
