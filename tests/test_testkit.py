"""The offline test kit and the demo expert's assets behave like the Qwen pieces they mimic."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO_DIR = Path(__file__).resolve().parents[1]
DEMO_DIR = REPO_DIR / "experts" / "demo"
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CONVERSATION = [
    {"role": "system", "content": "Dialect: postgres"},
    {"role": "user", "content": "How many orders are there?"},
    {"role": "assistant", "content": "SELECT COUNT(*) FROM orders;"},
]
RENDERED = (
    "<|im_start|>system\nDialect: postgres<|im_end|>\n"
    "<|im_start|>user\nHow many orders are there?<|im_end|>\n"
    "<|im_start|>assistant\nSELECT COUNT(*) FROM orders;<|im_end|>\n"
)


@pytest.mark.parametrize(
    "text",
    [
        "SELECT name, price FROM products WHERE price > 100 ORDER BY price DESC;",
        "Hello, world!\n\n  def f(x):\n\treturn x * 2  # ünïcödé, 你好, emoji 🙂",
        "",
    ],
)
def test_tokenizer_round_trips_text(tiny_tokenizer, text: str) -> None:
    ids = tiny_tokenizer(text)["input_ids"]
    assert tiny_tokenizer.decode(ids) == text


def test_tokenizer_adds_no_special_tokens_on_encode(tiny_tokenizer) -> None:
    ids = tiny_tokenizer("SELECT 1;")["input_ids"]
    assert not set(ids) & set(tiny_tokenizer.all_special_ids)


def test_special_tokens_are_single_ids(tiny_tokenizer) -> None:
    ids = tiny_tokenizer.convert_tokens_to_ids(SPECIALS)
    assert ids == [4000, 4001, 4002]
    for token, token_id in zip(SPECIALS, ids, strict=True):
        assert tiny_tokenizer(token)["input_ids"] == [token_id]
    assert tiny_tokenizer.eos_token == tiny_tokenizer.pad_token == "<|endoftext|>"
    assert tiny_tokenizer.bos_token is None
    assert len(tiny_tokenizer) == 4003


def test_other_chat_markers_are_split_like_qwen(tiny_tokenizer) -> None:
    for marker in ["<|system|>", "<|user|>", "<|assistant|>", "<|end|>"]:
        assert len(tiny_tokenizer(marker)["input_ids"]) > 1, marker


def test_digits_are_single_tokens_like_qwen(tiny_tokenizer) -> None:
    assert len(tiny_tokenizer("12345")["input_ids"]) == 5


def test_chat_template_renders_chatml(tiny_tokenizer) -> None:
    rendered = tiny_tokenizer.apply_chat_template(CONVERSATION, tokenize=False)
    assert rendered == RENDERED


def test_chat_template_generation_prompt(tiny_tokenizer) -> None:
    rendered = tiny_tokenizer.apply_chat_template(
        CONVERSATION, tokenize=False, add_generation_prompt=True
    )
    assert rendered == RENDERED + "<|im_start|>assistant\n"


def test_tiny_model_loads_and_runs(tiny_model_dir: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    assert (tiny_model_dir / "model.safetensors").is_file()
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert model.config.model_type == "qwen3"
    assert model.config.vocab_size % 64 == 0 and model.config.vocab_size >= len(tokenizer)
    assert model.config.eos_token_id == model.config.pad_token_id == tokenizer.eos_token_id
    ids = tokenizer.apply_chat_template(CONVERSATION, return_tensors="pt", return_dict=True)[
        "input_ids"
    ]
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    assert logits.shape == (1, ids.shape[1], model.config.vocab_size)
    assert torch.isfinite(logits).all()


def test_demo_expert_copy_is_private(demo_expert_dir: Path) -> None:
    assert demo_expert_dir != DEMO_DIR
    assert (demo_expert_dir / "data" / "train.jsonl").is_file()
    assert (demo_expert_dir / "model" / "config.json").is_file()


def test_write_jsonl(write_jsonl, tmp_path: Path) -> None:
    rows = [{"text": "a"}, {"text": "ü\n"}]
    path = write_jsonl(tmp_path / "sub" / "rows.jsonl", rows)
    assert [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()] == rows


def _texts(split: str) -> list[str]:
    lines = (DEMO_DIR / "data" / f"{split}.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(line)["text"] for line in lines]


def test_demo_data_is_chatml_sql(tiny_tokenizer) -> None:
    train, valid = _texts("train"), _texts("valid")
    assert len(train) == 400 and len(valid) == 40
    assert not set(train) & set(valid)
    for text in train + valid:
        assert text.startswith("<|im_start|>system\nDialect: postgres\nTables:\nCREATE TABLE ")
        assert "<|im_end|>\n<|im_start|>user\n" in text
        assert "<|im_end|>\n<|im_start|>assistant\n" in text
        assert text.endswith(";<|im_end|>\n")
    lengths = [len(ids) for ids in tiny_tokenizer(train + valid)["input_ids"]]
    assert min(lengths) >= 50 and max(lengths) <= 600


def test_demo_model_config_matches_tokenizer(tiny_tokenizer) -> None:
    from transformers import AutoConfig, AutoTokenizer

    config = AutoConfig.from_pretrained(DEMO_DIR / "model")
    tokenizer = AutoTokenizer.from_pretrained(DEMO_DIR / "model")
    assert tokenizer.get_vocab() == tiny_tokenizer.get_vocab()
    assert tokenizer.chat_template == tiny_tokenizer.chat_template
    assert config.model_type == "qwen3" and config.tie_word_embeddings
    assert config.vocab_size == 4032
    assert config.eos_token_id == config.pad_token_id == tokenizer.eos_token_id
    assert not (DEMO_DIR / "model" / "model.safetensors").exists()


def _run(script: str, *args: str) -> None:
    subprocess.run(
        [sys.executable, str(REPO_DIR / "scripts" / script), *args], check=True, capture_output=True
    )


def test_demo_data_script_is_deterministic(tmp_path: Path) -> None:
    _run("make_demo_data.py", "--out", str(tmp_path))
    for split in ["train", "valid"]:
        committed = (DEMO_DIR / "data" / f"{split}.jsonl").read_bytes()
        assert (tmp_path / f"{split}.jsonl").read_bytes() == committed


def test_tokenizer_script_is_deterministic(tmp_path: Path, tiny_tokenizer_dir: Path) -> None:
    _run("make_tiny_tokenizer.py", "--out", str(tmp_path))
    for name in ["tokenizer.json", "tokenizer_config.json", "chat_template.jinja"]:
        assert (tmp_path / name).read_bytes() == (tiny_tokenizer_dir / name).read_bytes()
