"""An answer's reasoning given in its own key (`reasoning_content`, Qwen3's and DeepSeek's;
`thinking`; `reasoning`): a chat template that does not write it trained the answers without
their reasoning, and nothing said so. Now check and the build note it."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

from conftest import write_jsonl
from train_helpers import run_here, write_expert

from expert_cli.data.answer_notes import reasoning_in, unwritten_reasoning
from expert_cli.data.checks import check_manifest

# writes an answer's reasoning_content in a <think> block, as Qwen3's template does
WRITES_REASONING = (
    "{%- for m in messages %}{{ '<|im_start|>' + m.role + '\\n' }}"
    "{%- if m.reasoning_content %}{{ '<think>' + m.reasoning_content + '</think>' }}{%- endif %}"
    "{{ m.content + '<|im_end|>\\n' }}{%- endfor %}"
)
ASK = {"role": "user", "content": "Count the orders."}
ANSWER = {"role": "assistant", "content": "42", "reasoning_content": "There are 42 rows."}


def test_the_keys_a_template_leaves_out_are_found(tiny_tokenizer) -> None:
    assert reasoning_in([ASK, ANSWER]) == {"reasoning_content"}
    assert reasoning_in([ASK, {**ANSWER, "reasoning_content": " "}]) == set()  # no text
    assert reasoning_in([{**ASK, "thinking": "x"}]) == set()  # a user's: never trained
    keys = {"reasoning_content", "thinking"}
    assert unwritten_reasoning(tiny_tokenizer, keys) == ["reasoning_content", "thinking"]
    tok = copy.deepcopy(tiny_tokenizer)
    tok.chat_template = WRITES_REASONING
    assert unwritten_reasoning(tok, keys) == []  # transformers gives `thinking` as both


def _expert(tmp_path: Path, model: Path, rows: list[dict]) -> Path:
    manifest = write_expert(tmp_path / "e", model, rows=1)
    data = json.loads(manifest.read_text())
    data["training"]["dataset"]["field_mapping"] = {"messages": "messages"}
    manifest.write_text(json.dumps(data))
    write_jsonl(manifest.parent / "data" / "train.jsonl", rows)
    return manifest


def _noted_by_check_and_build(manifest: Path, note: str) -> None:
    assert note in check_manifest(manifest).notes
    built = run_here("pretokenize", "--manifest", str(manifest))
    assert built.returncode == 0 and note in " ".join(built.stdout.split())


def test_check_and_the_build_note_reasoning_the_template_does_not_write(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    rows = [{"messages": [ASK, ANSWER]}] * 3 + [{"messages": [ASK, {**ANSWER, "content": "7"}]}]
    rows[3]["messages"][1].pop("reasoning_content")
    manifest = _expert(tmp_path, tiny_model_dir, rows)
    note = (
        "3 of 4 conversations give an answer's reasoning in `reasoning_content`, which the chat "
        "template does not write: the reasoning is not trained; put it in the content "
        "(<think>...</think> before the answer), or use a base model whose template writes it "
        "(Qwen3's writes reasoning_content)"
    )
    _noted_by_check_and_build(manifest, note)
    # a template that writes it: no note, and the reasoning is in the examples
    shutil.copytree(tiny_model_dir, tmp_path / "model")
    (tmp_path / "model" / "chat_template.jinja").write_text(WRITES_REASONING)
    manifest = _expert(tmp_path / "writes", tmp_path / "model", rows)
    report = check_manifest(manifest)
    assert report.problems == [] and not any("reasoning" in n for n in report.notes)
    built = run_here("pretokenize", "--manifest", str(manifest))
    assert built.returncode == 0 and "reasoning is not trained" not in built.stdout


def test_an_empty_conversation_is_not_blamed_on_the_template(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    """ShareGPT dumps hold `"conversations": []`: check said the template refused it and
    advised fixing roles or keys, or another base model."""
    rows = [{"messages": [ASK, {"role": "assistant", "content": "42"}]}] * 3 + [{"messages": []}]
    report = check_manifest(_expert(tmp_path, tiny_model_dir, rows))
    (line,) = [n for n in report.notes if "conversation" in n and "train.jsonl:4" in n]
    assert line.endswith(
        "train.jsonl:4: this conversation is empty (no messages); 1 of 4 conversations are "
        "refused and train drops them"
    )


def test_the_builds_count_is_of_the_rows_it_trains(tiny_tokenizer) -> None:
    """The build counted the whole source's rows (held-out ones too) over the training
    split's count: "50 of 80" where 39 of the 80 training rows held reasoning."""
    import datasets

    from expert_cli.data.answer_notes import conversation_notes
    from expert_cli.data.conversations import conversation_text

    plain = {"role": "assistant", "content": "42"}
    rows = [conversation_text([ASK, ANSWER if i % 2 else plain]) for i in range(100)]
    ds = datasets.Dataset.from_dict({"messages": rows})
    picked = ds.select(range(1, 80))  # 40 rows with reasoning of 79
    (note,) = conversation_notes(picked, tiny_tokenizer)
    assert note.startswith("40 of 79 conversations give an answer's reasoning")
    assert conversation_notes(ds.select(range(0, 100, 2)), tiny_tokenizer) == []


def test_an_empty_answer_beside_others_is_noted(tmp_path: Path, tiny_model_dir: Path) -> None:
    """An empty answer inside a conversation trains just its end marker (the model ending its
    turn at once), which no count said (the Qwen3 audit). A weight of 0, a tool call or a
    conversation of empty answers alone (dropped) is not counted."""
    from expert_cli.data.answer_notes import empty_answer

    blank = {"role": "assistant", "content": " \n"}
    done = {"role": "assistant", "content": "42"}
    call = {"role": "assistant", "content": None, "tool_calls": [{"function": {"name": "f"}}]}
    assert empty_answer([ASK, blank, ASK, done])
    assert not empty_answer([ASK, {**blank, "weight": 0}, ASK, done])
    assert not empty_answer([ASK, call, ASK, done]) and not empty_answer([ASK, blank])
    rows = [{"messages": [ASK, blank, ASK, done]}] * 2 + [{"messages": [ASK, done]}] * 2
    manifest = _expert(tmp_path, tiny_model_dir, rows)
    note = (
        "2 of 4 conversations hold an empty answer beside answers with text (no text, "
        "reasoning or tool call): it is trained, as the model ending its turn at once; remove "
        'such turns, or give them "weight": 0'
    )
    _noted_by_check_and_build(manifest, note)
