"""Instruction data and the base model's chat template. Without a prompt_template it is laid
out in ChatML, which on a base whose chat template writes another layout (Llama 3's headers)
trained the adapter on prompts that merge and package then ship another template for: check
and the build now say so. `prompt_template: chat_template` lays each example out as a
conversation of the tokenizer's own template, and generate prompts the same way."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import datasets
from conftest import write_jsonl
from train_helpers import run_here, without_chat_template, write_expert
from transformers import AutoTokenizer

from expert_cli.config import load_manifest
from expert_cli.config.environment import cpu_environment
from expert_cli.config.resolve import resolve
from expert_cli.data.checks import check_manifest
from expert_cli.data.formatting import IGNORE
from expert_cli.train.prompt_format import prompt_format

# Llama 3's layout, written small: a header per turn, <|eot_id|> ending each
HEADERS = (
    "{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
    "{{ m['content'] }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)
ROWS = [{"instruction": f"Add {i} and 2.", "input": "", "output": str(i + 2)} for i in range(6)]
CHATML_NOTE = "base_models[0].prompt_template: instruction data is laid out in ChatML, while"


def _headers_model(tmp_path: Path, tiny_model_dir: Path) -> Path:
    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    (model / "chat_template.jinja").write_text(HEADERS)
    return model


def _expert(tmp_path: Path, model: Path, template: str | None) -> Path:
    manifest = write_expert(tmp_path / "e", model, rows=1)
    data = json.loads(manifest.read_text())
    mapping = {"instruction": "instruction", "input": "input", "response": "output"}
    data["training"]["dataset"]["field_mapping"] = mapping
    data["base_models"][0]["prompt_template"] = template
    if template is None:
        data["base_models"][0].pop("prompt_template")
    manifest.write_text(json.dumps(data))
    write_jsonl(manifest.parent / "data" / "train.jsonl", ROWS)
    return manifest


def _built(manifest: Path, model: Path) -> tuple[list[str], list[str]]:
    """Each example's text and its trained tokens' text, as `pretokenize` built them."""
    built = run_here("pretokenize", "--manifest", str(manifest))
    assert built.returncode == 0, built.stdout + built.stderr
    tok = AutoTokenizer.from_pretrained(model)
    (train,) = (manifest.parent / ".cache").rglob("train")
    rows = datasets.load_from_disk(str(train))
    whole = [tok.decode(r) for r in rows["input_ids"]]
    trained = [
        tok.decode([i for i, lab in zip(ids, labels, strict=True) if lab != IGNORE])
        for ids, labels in zip(rows["input_ids"], rows["labels"], strict=True)
    ]
    return whole, trained


def test_chatml_on_a_base_of_another_chat_layout_is_said(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    model = _headers_model(tmp_path, tiny_model_dir)
    for template in (None, "chatml"):
        report = check_manifest(_expert(tmp_path / str(template), model, template))
        assert report.problems == []
        assert any(n.startswith(CHATML_NOTE) for n in report.notes), report.notes
        assert any('set it to "chat_template"' in n for n in report.notes)
    # the base's own template is ChatML (Qwen's): nothing to say
    report = check_manifest(_expert(tmp_path / "qwen", tiny_model_dir, None))
    assert report.problems == [] and not any(n.startswith(CHATML_NOTE) for n in report.notes)


def test_chat_template_lays_instruction_data_out_in_the_bases_own_layout(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    model = _headers_model(tmp_path, tiny_model_dir)
    manifest = _expert(tmp_path, model, "chat_template")
    report = check_manifest(manifest)
    assert report.problems == [] and not any(n.startswith(CHATML_NOTE) for n in report.notes)
    whole, trained = _built(manifest, model)
    tok = AutoTokenizer.from_pretrained(model)
    for i, row in enumerate(ROWS):  # examples packed several a row: each found whole
        turns = [{"role": "user", "content": row["instruction"]},
                 {"role": "assistant", "content": row["output"]}]  # fmt: skip
        assert tok.apply_chat_template(turns, tokenize=False) in "".join(whole), i
    assert "<|im_start|>" not in "".join(whole)
    answers = "".join(trained)
    assert all(f"{i + 2}<|eot_id|>" in answers for i in range(6))  # each answer, its turn's end
    assert "Add" not in answers and "<|start_header_id|>" not in answers
    # generate asks as training did: the chat template's user turn and generation prompt
    resolved = resolve(load_manifest(manifest), cpu_environment())
    layout, notes = prompt_format(resolved, tok, {"stats": {"fields": {"mapping": {
        "instruction": "instruction", "response": "output"}}}})  # fmt: skip
    assert layout.style == "messages" and notes == []
    ids = layout.render(tok, "Add 9 and 2.")
    assert tok.decode(ids) == tok.apply_chat_template(
        [{"role": "user", "content": "Add 9 and 2."}], tokenize=False, add_generation_prompt=True
    )


def test_chat_template_without_one_is_refused(tmp_path: Path, tiny_model_dir: Path) -> None:
    model = without_chat_template(tiny_model_dir, tmp_path)
    manifest = _expert(tmp_path, model, "chat_template")
    proc = run_here("check", "--manifest", str(manifest))
    said = " ".join((proc.stdout + proc.stderr).split())
    assert proc.returncode == 2, said
    assert "base_models[0].prompt_template: the tokenizer has no chat template" in said
    assert "Traceback" not in said


def test_chat_template_answers_found_by_the_response_template(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    """A template of one exchange whose answers expert-cli cannot find by its own turns (it
    refuses two): as `messages` data, `response_template` finds them; instruction data under
    `chat_template` was refused, and the response_template was said to be unread."""
    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    (model / "chat_template.jinja").write_text(
        "{% if messages|length > 3 %}{{ raise_exception('one exchange only') }}{% endif %}"
        "{% for m in messages %}{% if m['role'] == 'user' %}### Question:\n{{ m['content'] }}"
        "\n\n{% elif m['role'] == 'assistant' %}### Response:\n{{ m['content'] }}"
        "<|endoftext|>{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}### Response:\n{% endif %}"
    )
    manifest = _expert(tmp_path, model, "chat_template")
    data = json.loads(manifest.read_text())
    data["training"]["dataset"]["response_template"] = "### Response:\n"
    manifest.write_text(json.dumps(data))
    report = check_manifest(manifest)
    assert report.problems == []
    assert not any("not read with instruction data" in n for n in report.notes)
    _, trained = _built(manifest, model)
    assert all(f"{i + 2}<|endoftext|>" in "".join(trained) for i in range(6))
    assert "Question" not in "".join(trained) and "Add" not in "".join(trained)
