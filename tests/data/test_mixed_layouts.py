"""Tasks of two layouts in one run: instruction data beside conversations (an alpaca-style file
beside a ShareGPT one) was exit 2, "one run trains one layout". Under `prompt_template:
chat_template` the instruction rows are trained as conversations of the chat template, token
for token what a conversation file of the same examples trains; under another prompt
template, and for text beside either, check and the build refuse alike."""

from __future__ import annotations

import json
from pathlib import Path

import datasets
import pytest
from conftest import write_jsonl
from train_helpers import run_here, write_expert

from expert_cli.config import load_manifest
from expert_cli.config.environment import cpu_environment
from expert_cli.config.resolve import resolve
from expert_cli.data.checks import check_manifest
from expert_cli.data.source_set import load_sources
from expert_cli.errors import UserError

CHAT = [
    [{"role": "user", "content": f"hello {i}"}, {"role": "assistant", "content": f"hi {i}"}]
    for i in range(10)
]
INSTRUCTIONS = [
    {"instruction": f"Add {i} and 2.", "input": "numbers" if i % 2 else "", "output": str(i + 2)}
    for i in range(10)
]


def _as_conversation(row: dict) -> list[dict[str, str]]:
    """An instruction row written by hand as the conversation it should train as."""
    user = f"{row['instruction']}\n\n{row['input']}" if row["input"] else row["instruction"]
    return [{"role": "user", "content": user}, {"role": "assistant", "content": row["output"]}]


def _expert(folder: Path, model: Path, second: list[dict], chat=CHAT, **config) -> Path:
    """A multi_task expert: conversations, then `second`'s rows (no field_mapping)."""
    manifest = write_expert(folder, model, rows=1, config={"packing": False, **config})
    data = json.loads(manifest.read_text())
    write_jsonl(folder / "data" / "chat.jsonl", [{"messages": m} for m in chat])
    write_jsonl(folder / "data" / "second.jsonl", second)
    data["training"]["dataset"] = {
        "type": "multi_task",
        "tasks": {"chat": {"train": "data/chat.jsonl"}, "more": {"train": "data/second.jsonl"}},
        "eval_fraction": 0.2,
    }
    data["training"]["config"]["evaluation_strategy"] = "steps"
    data["base_models"][0]["prompt_template"] = "chat_template"
    manifest.write_text(json.dumps(data))
    return manifest


def _set_template(manifest: Path, template: str) -> None:
    data = json.loads(manifest.read_text())
    data["base_models"][0]["prompt_template"] = template
    manifest.write_text(json.dumps(data))


def _cache(manifest: Path) -> dict[str, dict[str, list]]:
    built = run_here("pretokenize", "--manifest", str(manifest))
    assert built.returncode == 0, built.stdout + built.stderr
    out = {}
    for split in ("train", "eval"):
        (folder,) = (manifest.parent / ".cache").rglob(split)
        rows = datasets.load_from_disk(str(folder))
        out[split] = {"input_ids": rows["input_ids"], "labels": rows["labels"]}
    return out


def _load_error(manifest: Path) -> str:
    resolved = resolve(load_manifest(manifest), cpu_environment())
    with pytest.raises(UserError) as info:
        load_sources(resolved, manifest.parent / ".ds")
    return "\n".join(info.value.lines)


def test_instruction_beside_conversations_trains_as_conversations(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    mixed = _expert(tmp_path / "mixed", tiny_model_dir, INSTRUCTIONS)
    written = [{"messages": _as_conversation(r)} for r in INSTRUCTIONS]
    by_hand = _expert(tmp_path / "by_hand", tiny_model_dir, written)
    report = check_manifest(mixed)
    assert report.problems == [], report.problems
    got, want = _cache(mixed), _cache(by_hand)
    assert got == want  # every token and label, held-out examples too
    assert len(got["train"]["input_ids"]) == 16 and len(got["eval"]["input_ids"]) == 4
    (stats,) = (mixed.parent / ".cache").rglob("stats.json")
    fields = json.loads(stats.read_text())["fields"]
    assert fields["kind"] == "messages"  # generate prompts by the chat template
    assert [s["mapping"] for s in fields["sources"]][1]["response"] == "output"


def test_instruction_beside_conversations_asks_for_the_chat_template(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    manifest = _expert(tmp_path, tiny_model_dir, INSTRUCTIONS)
    _set_template(manifest, "chatml")
    said = _load_error(manifest)
    folder = tmp_path / "data"
    assert said == (
        f"{folder / 'second.jsonl'}:1: its columns read as instruction data ('instruction', "
        f"'output'), and those of {folder / 'chat.jsonl'}:1 as conversations ('messages'); "
        "instruction data beside conversations is trained as conversations of the tokenizer's "
        "chat template, one prompt layout for the expert: set base_models[0].prompt_template to "
        "\"chat_template\" (it is 'chatml'), or write every source (each task's file) in one "
        "layout"
    )
    assert check_manifest(manifest).problems == [said]  # check says what the build says


def test_text_beside_conversations_is_refused_in_any_template(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    texts = [{"text": f"<|im_start|>user\nq{i}<|im_end|>\n"} for i in range(10)]
    manifest = _expert(tmp_path, tiny_model_dir, texts)
    said = _load_error(manifest)
    assert said.endswith(
        "as text ('text'); text is trained as written, in its own layout, so it shares a run "
        "with text only: write every source (each task's file) in one layout"
    )
    assert check_manifest(manifest).problems == [said]


def test_check_formats_mixed_rows_as_the_build_does(tmp_path: Path, tiny_model_dir: Path) -> None:
    """check formats a small split as the build will: the instruction rows beside
    conversations went to the formatter as instruction rows, which it cannot read as
    conversations. Every example over max_seq_length is dropped in both."""
    long = [{**r, "output": "many words " * 20} for r in INSTRUCTIONS]
    chat = [[m[0], {"role": "assistant", "content": "many words " * 20}] for m in CHAT]
    manifest = _expert(tmp_path, tiny_model_dir, long, chat, max_seq_length=16)
    data = json.loads(manifest.read_text())
    data["training"]["dataset"]["overlong"] = "drop"
    manifest.write_text(json.dumps(data))
    problems = check_manifest(manifest).problems
    assert problems[0] == (
        "training.dataset: no training example is left after formatting (16 read, every one "
        "dropped: 16 over max_seq_length=16 with overlong: drop)"
    ), problems
    built = run_here("pretokenize", "--manifest", str(manifest))
    assert built.returncode == 2
    assert problems[0] in built.stdout + built.stderr


def test_text_among_three_layouts_is_refused_whatever_its_place(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    """Instruction data, conversations, then text: only the first two were compared, check
    said usable and the build was a KeyError traceback."""
    texts = [{"text": f"<|im_start|>user\nq{i}<|im_end|>\n"} for i in range(10)]
    manifest = _expert(tmp_path, tiny_model_dir, INSTRUCTIONS)
    write_jsonl(tmp_path / "data" / "text.jsonl", texts)
    data = json.loads(manifest.read_text())
    data["training"]["dataset"]["tasks"]["text"] = {"train": "data/text.jsonl"}
    manifest.write_text(json.dumps(data))
    said = _load_error(manifest)
    assert said.startswith(f"{tmp_path / 'data' / 'chat.jsonl'}:1: its columns read as ")
    assert f"those of {tmp_path / 'data' / 'text.jsonl'}:1 as text ('text')" in said
    assert check_manifest(manifest).problems == [said]
